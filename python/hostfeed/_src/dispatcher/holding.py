"""The dispatcher's ordering: :class:`Holding`, the devices held while their joined set is
incomplete (in the ``Holds`` the receiver shares), their later messages held back in
order and charged against the queue's bound, run once the set completes; and the
messages an abandoned consumer left to its successor."""
from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from ... import _receiver
from ..._receiver.batch import Holds
from ..._receiver.messages import FLAG_EAGER, Message
from ..consumers import ConsumerKind

__all__ = ["Held", "Holding", "joined_key"]

logger = logging.getLogger("hostfeed")


def joined_key(consumers: Any, msg: Message) -> tuple[int, int] | None:
    """The (joiner, run) a message is a part of, or None if it is no joined part."""
    if msg.flags & FLAG_EAGER or msg.consumer_id == 0:
        return None
    c = consumers.get(msg.consumer_id)
    if c is None or c.kind is not ConsumerKind.JOINED:
        return None
    return id(c.invoke), msg.run_id


class Held(NamedTuple):
    """A device waiting for its joined tap: the set's joiner and run, the device's later
    messages (in order, each with the bytes it charges against the bound), the barrier
    epoch in which the device was first held, and how many of the waiting messages are
    parts of each other joined set (keyed by joiner and run: what a crossing is made of)."""

    joiner: Any
    run: int
    waiting: collections.deque
    epoch: int
    parts: collections.Counter

    @property
    def key(self) -> tuple[int, int]:
        return id(self.joiner), self.run


class Holding:
    """Holds devices on their joined sets (in ``held``, the ``Holds`` the receiver shares)
    and releases them in order, each released message offered again (``offer``: it may
    be held again). ``charge``: whether held-back messages are charged against the
    receiver's bound, and ``charged`` how many bytes are; ``owner``: the thread id of the
    consumer running the dispatcher (one that no longer owns it leaves what it was
    releasing to the owner)."""

    def __init__(self, held: Holds, offer: Callable[[Message], None], charge: bool) -> None:
        self.held = held
        self.offer = offer
        self.charge = charge
        self.charged = 0
        self.over_cap_warned = False
        self.owner = 0

    def hold(self, ordinal: int, joiner: Any, run: int, epoch: int) -> None:
        """Holds device ``ordinal`` on the set of ``joiner`` and ``run``."""
        self.held.hold(ordinal, Held(joiner, run, collections.deque(), epoch,
                                     collections.Counter()))

    def hold_back(self, h: Held, msg: Message, key: tuple[int, int] | None) -> None:
        """Holds ``msg`` back behind its device's set ``h`` (``key``: the joined set it
        is a part of, if it is one)."""
        h.waiting.append((msg, self._charge(msg)))
        if key is not None:
            h.parts[key] += 1

    def release(self, key: tuple[int, int] | None, ordinals: Sequence[int]) -> None:
        """Runs the messages held back for those of ``ordinals`` held on set ``key``
        (joiner, run; None: whatever holds them), in each device's order (a device that
        sends another incomplete part on the way is held again). A device held on another
        set sent its part of this one out of its order (a crossing) and stays held."""
        me = threading.get_ident()
        for ordinal in ordinals:
            h = self.held.get(ordinal)
            if h is None or (key is not None and h.key != key):
                continue
            self.held.release(ordinal)
            waiting = h.waiting
            while waiting:
                if self.owner != me:  # abandoned meanwhile: leave the rest to the owner
                    while waiting:  # (still held back: barriers wait until they ran)
                        self.held.leave(ordinal, waiting.popleft())
                    break
                self.run_held(waiting.popleft(), self.offer)

    def run_orphans(self, ordinal: int) -> None:
        """Runs the messages an abandoned consumer left for device ``ordinal``."""
        for entry in self.held.take_orphans(ordinal):
            self.run_held(entry, self.offer)

    def run_held(self, entry: tuple[Message, int], run: Callable[[Message], None]) -> None:
        """Runs a message that was held back (``run(msg)``: offered again, which may hold
        it again), freeing the bytes it charged first; only then ends its hold, so that a
        barrier waiting for it returns once it ran."""
        msg, n = entry
        self.let_go(n)
        try:
            run(msg)
        finally:
            if self.charge:
                _receiver.host.let_go(msg.seq, 0)

    def _charge(self, msg: Message) -> int:
        """Holds a message back in the receiver: barriers count it as not run until it ran
        (:meth:`run_held`), and it is charged against the bound; returns the bytes
        charged."""
        if not self.charge:
            return 0
        n = 64 + sum(a.nbytes for a in msg.arrays)  # its arrays and, roughly, the rest
        if self.charged + n > _receiver.host.max_queue_bytes() // 2:
            if not self.over_cap_warned:
                self.over_cap_warned = True
                logger.warning(
                    "hostfeed: the messages held back behind incomplete joined callbacks "
                    "passed half the queue bound (%d bytes); further ones are kept without "
                    "counting against it until those callbacks complete",
                    _receiver.host.max_queue_bytes())
            n = 0
        self.charged += n
        _receiver.host.hold_back(msg.seq, n)
        return n

    def let_go(self, n: int) -> None:
        """Frees the ``n`` bytes a held-back message charged (its hold lasts until it ran:
        :meth:`run_held`)."""
        if n:
            self.charged -= n
            _receiver.host.let_go(None, n)
            if not self.charged:
                self.over_cap_warned = False
