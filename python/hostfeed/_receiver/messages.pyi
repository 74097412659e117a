"""``hostfeed._receiver.messages``: a message as the dispatcher reads it, its arrays' owner
and a call's ``Reply`` (the binding's ``consumers.rs``); the ``FLAG_*`` bits a message
carries and the portable transport's device keys.
"""
from typing import Any, Final, final

import numpy as np

from .consumers import Consumer

__all__ = [
    "FLAG_STATUS_OUTPUT", "FLAG_SHARD", "FLAG_EAGER", "FLAG_SYNC_TAP", "PORTABLE_KEY_BASE",
    "PORTABLE_ID_BITS", "MessageData", "Message", "Reply",
]

#: ``flags`` bit of a ``call`` that reports failures through an int32 status result.
FLAG_STATUS_OUTPUT: Final[int]

#: ``flags`` bit of one part of a global-view callback sent shard by shard.
FLAG_SHARD: Final[int]

#: ``flags`` bit of an eager tap's message (it carries its consumer: ``Message.consumer``).
FLAG_EAGER: Final[int]

#: ``flags`` bit of a synchronous tap (a ``hostfeed_call`` without results).
FLAG_SYNC_TAP: Final[int]

#: Device keys at or below this one name devices of the portable transport.
PORTABLE_KEY_BASE: Final[int]

#: The low bits of a portable key's offset from PORTABLE_KEY_BASE that hold the device id.
PORTABLE_ID_BITS: Final[int]

@final
class MessageData:
    """Owner of one message's bytes; numpy arrays handed to callbacks view it."""

@final
class Message:
    """One message as the dispatcher reads it, by name (frozen; the receiver makes them,
    and so can tests)."""

    def __new__(cls, consumer_id: int, device: int, flags: int, arrays: tuple[np.ndarray, ...],
                reply: Any = None, run_id: int = 0,
                consumer: Consumer | None = None, seq: int | None = None) -> Message: ...
    @property
    def consumer_id(self) -> int:
        """The consumer's id (0: a control message; -1: an eager tap, see ``consumer``)."""
    @property
    def device(self) -> int:
        """The device's key: a CPU device's ordinal, a GPU's or the portable transport's."""
    @property
    def flags(self) -> int:
        """The message's ``FLAG_*`` bits."""
    @property
    def arrays(self) -> tuple[np.ndarray, ...]:
        """The operands, as numpy arrays viewing the message's bytes."""
    @property
    def reply(self) -> Reply | None:
        """A call's reply (a synchronous tap's too); None for a tap. (Any object with
        ``pending``, ``send`` and ``fail`` where a test made the message.)"""
    @property
    def run_id(self) -> int:
        """XLA's run id of the execution that sent it (0 when unknown: the portable
        transport)."""
    @property
    def consumer(self) -> Consumer | None:
        """An eager tap's consumer (it is registered nowhere); None otherwise."""
    @property
    def seq(self) -> int | None:
        """Its sequence number in the receiver's queue (None for a message made in
        Python): what the dispatcher names when it holds the message back."""

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
