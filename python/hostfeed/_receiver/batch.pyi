"""``hostfeed._receiver.batch``: a batch as the dispatcher sees it (``batch.rs``):
``BatchIter`` and its ``run_taps``; ``DispatcherState``, what the receiver holds of the
dispatcher.
"""
from typing import Any, final
from collections.abc import Callable, Iterator

from .messages import Message, Reply
from .consumers import Consumer

__all__ = [
    "DispatcherState", "BatchIter",
]

@final
class DispatcherState:
    """What the receiver holds of the Python dispatcher (handed to ``start``):
    ``dispatch(batch)`` run with each ``BatchIter``; the dicts it reads, mutated in place
    and never rebound (``held`` and ``orphans``: while either is non-empty, taps and calls
    run in Python; ``consumers``: consumer id -> ``Consumer``); ``tap_failed(exception,
    consumer)`` and ``call_failed(exception_or_None, consumer, run_id, device, reply)``
    for the taps and calls it runs itself."""

    def __new__(cls, dispatch: Callable[[BatchIter], object], *, held: dict[int, Any],
                orphans: dict[int, Any], consumers: dict[int, Consumer],
                tap_failed: Callable[[BaseException, Consumer], object],
                call_failed: Callable[[BaseException | None, Consumer, int, int, Reply],
                                      object]) -> DispatcherState: ...

@final
class BatchIter:
    """A batch of messages for the dispatcher: an iterator of ``Message``s (those for
    recorders are routed on the way, in Rust)."""

    def __iter__(self) -> Iterator[Message]: ...
    def __next__(self) -> Message: ...
    def run_taps(self) -> int:
        """Runs the plain taps at the head of the batch (``consumer.invoke(arrays,
        device)`` for each ``ConsumerKind.TAP`` consumer of the dispatcher state's
        ``consumers``, exceptions to its ``tap_failed(exception, consumer)``) and the plain
        calls of ``ConsumerKind.CALL`` consumers (with their ``DirectCall``, or
        ``consumer.invoke(arrays, device, reply)``, true when it failed; failed, unwaited
        or raising calls to its ``call_failed(exception_or_None, consumer, run_id, device,
        reply)``); none while the state's ``held`` or ``orphans`` is non-empty; stops at
        the first other message. Returns how many ran."""
