"""``hostfeed._receiver.batch``: what the receiver and the Python dispatcher share (the
binding's ``host/consumer.rs``): ``Holds``, the devices the dispatcher holds and the
messages an abandoned consumer left; ``DispatcherState``, what the receiver holds of the
dispatcher. The receiver runs each batch's plain taps and calls itself while nothing is
held, and hands every other message to ``DispatcherState.dispatch``.
"""
from typing import Any, final
from collections.abc import Callable, Iterator

from .messages import Message, Reply
from .consumers import Consumer, ConsumerTable

__all__ = [
    "Holds", "DispatcherState",
]

@final
class Holds:
    """The devices the dispatcher holds (each with what holds it), in the order they were
    held, and the messages an abandoned consumer left to run first, per device. While
    either is non-empty the receiver runs no tap or call itself."""

    def __new__(cls) -> Holds: ...
    def is_empty(self) -> bool:
        """Whether no device is held and no orphan waits."""
    def get(self, device: int) -> Any | None:
        """What holds ``device``, or None."""
    def hold(self, device: int, entry: Any) -> None:
        """Holds ``device`` on ``entry``; ``ValueError`` if it is held already."""
    def release(self, device: int) -> Any | None:
        """Lets ``device`` go; returns what held it (None if it was not held)."""
    def items(self) -> list[tuple[int, Any]]:
        """The held devices with what holds each, in the order they were held."""
    def leave(self, device: int, message: Any) -> None:
        """Leaves ``message`` to run first, after the others left for ``device``."""
    def take_orphans(self, device: int) -> list[Any]:
        """Takes the messages left for ``device``, in order."""
    def orphaned(self) -> list[int]:
        """The devices that have messages left."""
    def __contains__(self, device: int, /) -> bool: ...
    def __len__(self) -> int: ...
    def __iter__(self) -> Iterator[int]: ...

@final
class DispatcherState:
    """What the receiver holds of the Python dispatcher (handed to ``start``):
    ``dispatch(message)`` run with each message it does not run itself; the dispatcher's
    ``holds`` (while anything is held, every message goes to ``dispatch``); the
    ``consumers`` table; ``tap_failed(exception, consumer)`` and
    ``call_failed(exception_or_None, consumer, run_id, device, reply)`` for the taps and
    calls it runs itself."""

    def __new__(cls, dispatch: Callable[[Message], object], *, holds: Holds,
                consumers: ConsumerTable,
                tap_failed: Callable[[BaseException, Consumer], object],
                call_failed: Callable[[BaseException | None, Consumer, int, int, Reply],
                                      object]) -> DispatcherState: ...
    @property
    def holds(self) -> Holds:
        """The dispatcher's holds."""
    @property
    def consumers(self) -> ConsumerTable:
        """The consumer table."""
