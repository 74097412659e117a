"""``hostfeed._receiver.portable``: the portable transport's functions (``portable.rs``).
"""

import numpy as np

__all__ = [
    "push_host", "call_host", "failure_text",
]

def push_host(consumer_id: int, arrays: list[np.ndarray], codes: list[int], device: int,
              flags: int = 0) -> None:
    """A tap of the portable transport: copies ``arrays`` (C-contiguous, XLA dtype codes
    ``codes``) into a message for consumer ``consumer_id`` from device key ``device`` and
    enqueues it (waits for space with the GIL released)."""

def call_host(consumer_id: int, arrays: list[np.ndarray], codes: list[int],
              outputs: list[np.ndarray], device: int, flags: int, timeout_ms: int,
              name: str) -> int:
    """A call of the portable transport: enqueues like ``push_host`` and waits (GIL
    released) for the reply, written into ``outputs``. Returns 0, or with
    ``FLAG_STATUS_OUTPUT`` the failure's ticket; without it a failure raises."""

def failure_text(ticket: int) -> str:
    """The message of the failed call recorded under ``ticket``."""
