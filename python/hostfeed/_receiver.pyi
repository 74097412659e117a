"""Stubs for ``hostfeed._receiver``, the native (Rust) core of hostfeed."""
from typing import Any, Callable, Final, final

import numpy as np

__all__ = [
    "DEFAULT_MAX_QUEUE_BYTES", "ReceiverError", "ReceiverTimeoutError", "CallbackContextError",
    "MessageData", "Reply", "start", "stop", "finalize", "barrier", "is_running", "in_callback_thread",
    "max_queue_bytes", "set_max_queue_bytes", "stats", "reset_peak", "registrations",
]

DEFAULT_MAX_QUEUE_BYTES: Final[int]

class ReceiverError(RuntimeError):
    """The receiver cannot do what was asked (stopped, shut down, misconfigured)."""

class ReceiverTimeoutError(TimeoutError):
    """A wait on the receiver (barrier, stop) ran past its timeout."""

class CallbackContextError(RuntimeError):
    """A blocking receiver operation was called from inside a host callback."""

@final
class MessageData:
    """Owner of one message's bytes; numpy arrays handed to callbacks view it."""

@final
class Reply:
    """The consumer's handle on a waiting ``call``: answer it once."""

    @property
    def pending(self) -> bool:
        """Whether the call still waits (not replied, timed out or cancelled)."""

    def send(self, results: list[np.ndarray]) -> bool:
        """Copies C-contiguous results of the expected dtypes and shapes into the call's
        result buffers; returns False if the call no longer waits."""

    def fail(self, message: str) -> bool:
        """Fails the call with ``message``; returns False if the call no longer waits."""

def start(
    dispatcher: Callable[
        [list[tuple[int, int, int, tuple[np.ndarray, ...], Reply | None, int]]], Any],
    dtypes: dict[int, np.dtype],
    max_queue_bytes: int | None = None,
) -> bool:
    """Configures and starts the receiver; returns whether a consumer thread was started."""

def stop(stall_timeout: float | None = None) -> bool:
    """Drains the queue, then stops and joins the consumer thread (GIL released). If a
    callback makes no progress for ``stall_timeout`` seconds (default 10), waiting calls
    are failed and the thread is abandoned; returns whether the thread was joined."""

def finalize(stall_timeout: float | None = None) -> None:
    """Stops the receiver for good; later taps fail with an error (interpreter exit)."""

def barrier(timeout: float | None = None) -> None:
    """Waits until every message enqueued before the call is processed."""

def is_running() -> bool:
    """Whether the consumer thread is running."""

def in_callback_thread() -> bool:
    """Whether the caller runs on the consumer thread (inside a host callback)."""

def max_queue_bytes() -> int:
    """The queue's byte bound."""

def set_max_queue_bytes(bound: int) -> None:
    """Sets the queue's byte bound (takes effect at once, also for blocked producers)."""

def stats() -> dict[str, int]:
    """The receiver's counters."""

def reset_peak() -> None:
    """Resets ``peak_queued_bytes`` to the current queued bytes."""

def registrations() -> dict[str, Any]:
    """``{target_name: PyCapsule}`` for ``jax.ffi.register_ffi_target(..., platform="cpu")``."""
