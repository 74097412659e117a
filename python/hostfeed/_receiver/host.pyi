"""``hostfeed._receiver.host``: the receiver's life, settings and counters (the binding's
``host/``): start, stop, exit, barriers, eager and control messages, the queue's bound,
statistics, the CPU handlers' registrations.
"""
from typing import Any, Final

import numpy as np

from .consumers import Consumer
from .batch import DispatcherState

__all__ = [
    "DEFAULT_MAX_QUEUE_BYTES", "DEFAULT_BUFFER_POOL_BYTES", "DEFAULT_CPU_SHARE_STEP_BYTES",
    "DEFAULT_CPU_SHARE_STREAM_BYTES", "DEFAULT_STOP_TIMEOUT",
    "DTYPE_CODES", "start", "stop", "finalize", "start_exit_watch", "stop_exit_watch",
    "push_eager", "push_control", "barrier", "is_running", "exit_status_if_clean",
    "in_callback_thread",
    "max_queue_bytes", "set_max_queue_bytes", "stats", "hold_back", "let_go", "reset_peak",
    "histograms", "reset_histograms", "set_buffer_pool_bytes", "set_timing",
    "set_inline_calls", "set_cpu_share_step_bytes", "set_cpu_share_stream_bytes",
    "set_consumer_name",
    "install_interrupt_watch", "registrations", "summary_registrations",
]

#: Default byte bound of the queue (the legacy ``256e6``).
DEFAULT_MAX_QUEUE_BYTES: Final[int]

#: Default most bytes of host buffers kept for reuse when idle.
DEFAULT_BUFFER_POOL_BYTES: Final[int]

#: Default bytes queued for the receiver thread from which a device's thread that shares its
#: CPU yields it (``set_cpu_share_step_bytes``).
DEFAULT_CPU_SHARE_STEP_BYTES: Final[int]

#: The size from which a device's thread apart from the receiver thread copies a tap's
#: operand with non-temporal stores once turned on (``set_cpu_share_stream_bytes``; off by
#: default).
DEFAULT_CPU_SHARE_STREAM_BYTES: Final[int]

#: Default seconds without progress after which stopping abandons a stuck callback.
DEFAULT_STOP_TIMEOUT: Final[float]

#: numpy dtype name -> XLA FFI dtype code, for every dtype hostfeed transfers.
DTYPE_CODES: Final[dict[str, int]]

def start(
    dispatcher: DispatcherState,
    dtypes: dict[int, np.dtype],
    trace_me: Any,
    max_queue_bytes: int | None = None,
) -> bool:
    """Configures and starts the receiver: the consumer thread runs each batch's plain
    taps and calls itself and ``dispatcher.dispatch(message)`` with every other message;
    ``trace_me`` is ``jax.profiler``'s ``TraceMe`` (the recorders' writes and inline calls
    ask ``trace_me.is_enabled()``); returns whether a consumer thread was started."""

def stop(stall_timeout: float | None) -> bool:
    """Drains the queue, then stops and joins the consumer thread (GIL released). If a
    callback makes no progress for ``stall_timeout`` seconds (None: no limit), waiting
    calls are failed and the thread is abandoned; returns whether the thread was joined."""

def finalize(stall_timeout: float | None) -> int:
    """Stops the receiver for good (interpreter exit); returns how many messages could
    not be processed."""

def start_exit_watch(stall_timeout: float | None) -> None:
    """Starts a native watchdog that keeps the receiver draining at interpreter exit,
    abandoning callbacks stuck for ``stall_timeout`` seconds (None: never)."""

def stop_exit_watch() -> None:
    """Stops the exit watchdog and waits for it."""

def push_eager(entry: Consumer, arrays: tuple[np.ndarray, ...], nbytes: int) -> None:
    """Enqueues an eager tap: ``entry`` runs on the consumer thread with ``arrays`` after
    everything already enqueued; ``nbytes`` counts against the bound (waits for space with
    the GIL released)."""

def push_control() -> None:
    """Enqueues a control message (consumer id 0) the dispatcher acts on in queue order."""

def barrier(timeout: float | None = None, patience: float | None = None) -> bool:
    """Waits until every message enqueued before the call has run, those the dispatcher
    holds back included; True. With ``patience``: False once only held-back messages kept
    it waiting for that many seconds."""

def is_running() -> bool:
    """Whether the consumer thread is running."""

def exit_status_if_clean(status: int) -> bool:
    """Makes the process exit with ``status`` (1..255) where it would exit with 0, at the C
    library's exit after Python has finalized; whether this platform can (glibc Linux)."""

def in_callback_thread() -> bool:
    """Whether the caller runs on the consumer thread (inside a host callback)."""

def max_queue_bytes() -> int:
    """The queue's byte bound."""

def set_max_queue_bytes(bound: int) -> None:
    """Sets the queue's byte bound (takes effect at once, also for blocked producers)."""

def stats() -> dict[str, int]:
    """The receiver's counters."""

def hold_back(seq: int | None, bytes: int) -> None:
    """Holds back the message of sequence number ``seq`` (``Message.seq``; None: one made
    in Python) that the dispatcher keeps for a joined tap: barriers wait until
    :func:`let_go` says it ran; its ``bytes`` count against the bound meanwhile (never
    waits; a push is admitted whenever nothing but held-back bytes is charged)."""

def let_go(seq: int | None, bytes: int) -> None:
    """Ends a hold of :func:`hold_back` once its message ran, freeing ``bytes``."""

def reset_peak() -> None:
    """Resets ``peak_queued_bytes`` to the current queued bytes."""

def histograms() -> dict[str, list[tuple[int, int]]]:
    """``{"device_ns": [(upper_ns, count), ...], "handover_ns": [...]}``: the device-side
    cost of each tap and the hand-over latency of each message, as non-empty log-linear
    buckets."""

def reset_histograms() -> None:
    """Empties the timing histograms."""

def set_buffer_pool_bytes(bytes: int) -> None:
    """Sets the most bytes of host buffers kept for reuse when idle."""

def set_timing(enabled: bool) -> bool:
    """Turns the timing histograms on or off; returns the previous setting."""

def set_inline_calls(enabled: bool) -> bool:
    """Lets a CPU ``call`` run its host function on the device's thread when nothing else is
    pending (True, the default), or keeps every call on the receiver thread (False);
    returns the previous setting."""

def set_cpu_share_step_bytes(bytes: int) -> int:
    """Sets the bytes queued for the receiver thread from which a device's thread that shares
    its CPU with it yields that CPU after a tap, so that the tap functions run while their
    bytes are in the cache (``DEFAULT_CPU_SHARE_STEP_BYTES`` by default; 0: never yield,
    the device's thread runs on). Returns the previous threshold."""

def set_cpu_share_stream_bytes(bytes: int) -> int:
    """Sets the size from which a device's thread that runs apart from the receiver thread
    copies a tap's operand with non-temporal stores, which do not fetch the buffer's lines
    from the receiver's core first, but send the bytes to memory, where a tap function reads
    them back (0, never, by default; ``DEFAULT_CPU_SHARE_STREAM_BYTES``: the size to turn it
    on with). Returns the previous threshold."""

def set_consumer_name(consumer_id: int, name: str) -> None:
    """Remembers the name of a consumer, for error messages about it."""

def install_interrupt_watch() -> bool:
    """Installs the SIGINT and SIGTERM counters that let a waiting ``call`` fail on Ctrl-C
    or SIGTERM (SIGTERM only where a handler, e.g. jax.distributed's, replaced the default)."""

def registrations() -> dict[str, Any]:
    """``{target_name: PyCapsule}`` for ``jax.ffi.register_ffi_target(..., platform="cpu")``."""

def summary_registrations() -> dict[str, Any]:
    """``{target_name: PyCapsule}`` of the CPU's summary handlers (``hostfeed_stats``,
    ``hostfeed_histogram``), for ``jax.ffi.register_ffi_target(..., platform="cpu")``."""
