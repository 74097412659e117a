"""``hostfeed._receiver.error``: the exception types (``error.rs``); the public ones are
re-exported by ``hostfeed``.
"""

__all__ = [
    "ReceiverError", "ReceiverTimeoutError", "CallbackContextError", "RecordingError",
]

class ReceiverError(RuntimeError):
    """The receiver cannot do what was asked (stopped, shut down, misconfigured)."""

class ReceiverTimeoutError(TimeoutError):
    """A wait on the receiver (barrier, stop) ran past its timeout."""

class CallbackContextError(RuntimeError):
    """A blocking receiver operation was called from inside a host callback."""

class RecordingError(OSError):
    """Recording to a Zarr store failed (a write, a file that cannot be created, a full
    disk); ``errno`` says how when the OS reported it."""
