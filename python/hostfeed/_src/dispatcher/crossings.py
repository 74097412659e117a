"""Circles of held devices: :class:`Crossings`.

Two devices can run two multi-device executions in opposite orders (executions
dispatched by different threads): then each holds back the part the other waits for.
Such a crossing (a circle of held devices, each holding back a part of the set the next
waits for) is found as soon as it forms, and one of those parts runs out of its device's
order, with a warning, rather than wait for ever. A held device that holds back a
``call`` (or a synchronous tap) waits for it and sends nothing more, so it keeps back too
the parts of the sets it has not sent a part of (on CPU its later executions wait behind
the call): in a circle of such devices, one device's messages up to that call run out of
its order. A circle can also run through the runtime (:mod:`..stall_watch` establishes
it: :meth:`Crossings.unstall`); a device that is only busy is in none, and its later
messages wait.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import jax

from ... import _receiver
from ..._receiver.messages import FLAG_SYNC_TAP, Message
from ..consumers import ConsumerKind
from .holding import Held, Holding, joined_key

__all__ = ["Crossings"]

logger = logging.getLogger("hostfeed")


class Crossings:
    """Finds circles of the devices ``holding`` holds and runs a message out of its order
    to break each (see the module's documentation), through ``deliver`` (which runs a
    message and releases the set it completes); ``consumers``: the consumer table."""

    def __init__(self, holding: Holding, consumers: Any,
                 deliver: Callable[[Message], None]) -> None:
        self.holding = holding
        self.consumers = consumers
        self.deliver = deliver

    def _held(self, ordinal: int) -> Held:
        """What holds device ``ordinal`` (held: a circle is made of held devices)."""
        h = self.holding.held.get(ordinal)
        assert h is not None
        return h  # type: ignore[no-any-return]

    def resolve(self) -> None:
        """Runs messages out of their device's order while held devices wait for each
        other in a circle, found by following, from each held device, the devices that
        keep the part its set waits for:

        - a held device that holds back a part of that set (two devices ran two
          multi-device executions in opposite orders): that part runs out of its order;
        - a held device that has not sent its part of that set and holds back a message
          it waits for (a ``call``, or a synchronous tap, of a computation it ran after its
          own part): it sends nothing more until that message has run, so the part cannot
          come while the message waits for the set. Its held messages up to that one run
          before its own set completes (on CPU its later executions, the other part's
          among them, wait behind the call).
        """
        while True:
            edge = self._find()
            if edge is None:
                return
            waiter, holder = edge
            key = self._held(waiter).key
            h = self._held(holder)
            if key not in h.parts:  # the holder waits for a message it holds back
                self._run_through_blocker(holder, h, "whose other devices wait in turn for it")
                continue
            for i, entry in enumerate(h.waiting):
                if joined_key(self.consumers, entry[0]) == key:
                    del h.waiting[i]
                    break
            else:  # the count said it was there
                raise AssertionError("hostfeed: a held-back part went missing")
            h.parts[key] -= 1
            if not h.parts[key]:
                del h.parts[key]
            msg = entry[0]
            c = self.consumers.get(msg.consumer_id)
            logger.warning("hostfeed: device %s ran two multi-device executions in another "
                           "order than its peers; its part of %s runs out of its order",
                           holder, getattr(c, "name", msg.consumer_id))
            self.holding.run_held(entry, self.deliver)

    def blocker(self, h: Held) -> int | None:
        """The position among ``h.waiting`` of the first message its device waits for (its
        reply pending): a ``call`` or a synchronous tap, which can run out of order; None
        if there is none, or if it is a part of a global-view call (which needs its set)."""
        for i, (msg, _) in enumerate(h.waiting):
            reply = msg.reply
            if reply is not None and reply.pending:
                return None if joined_key(self.consumers, msg) is not None else i
        return None

    def _run_through_blocker(self, ordinal: int, h: Held, why: str) -> None:
        """Runs the messages device ``ordinal`` holds back, in its order, up to and
        including the first one it waits for (:meth:`blocker`), before its own joined set
        completes: the device goes on and sends the parts the other held devices wait for.
        The device stays held on its set. Where that message is a synchronous tap, only
        its reply is sent: the device goes on and nothing runs out of its order."""
        stop = self.blocker(h)
        assert stop is not None  # (what made it a holder)
        blocker = h.waiting[stop][0]
        c = self.consumers.get(blocker.consumer_id)
        if blocker.flags & FLAG_SYNC_TAP and getattr(c, "kind", None) is ConsumerKind.TAP:
            # A synchronous tap needs no result: its device goes on now, and the tap (with
            # everything held back) still runs in the device's order.
            blocker.reply.send([])
            logger.warning("hostfeed: device %s goes on before its synchronous tap %s ran, "
                           "held back behind a multi-device execution %s; the tap runs in "
                           "the device's order once that execution's global-view callback "
                           "has run. Asynchronous taps (HOSTFEED_SYNC_TAPS=0) never wait so",
                           ordinal, getattr(c, "name", blocker.consumer_id), why)
            return
        logger.warning("hostfeed: device %s waits for its host callback %s, held back behind "
                       "a multi-device execution %s; it runs before that execution's "
                       "global-view callback, out of its order", ordinal,
                       getattr(c, "name", blocker.consumer_id), why)
        for _ in range(stop + 1):
            entry = h.waiting.popleft()
            key = joined_key(self.consumers, entry[0])
            if key is not None:
                h.parts[key] -= 1
                if not h.parts[key]:
                    del h.parts[key]
            self.holding.run_held(entry, self.deliver)

    def unstall(self, expected: int) -> None:
        """(A check of the stall watch, in queue order, once it saw the whole process wait:
        a circle through the runtime.) If still no message reached the receiver since the
        watch pushed it (``expected``: the count of messages enqueued with it), runs the
        held messages of the longest held CPU device that waits for one of them
        (:meth:`blocker`) up to that one: everything stalled behind it. Not on other
        devices, nor with several processes: a device that waits for an accelerator or
        for another process also leaves this process idle, and its part does come."""
        if (_receiver.host.stats()["messages_enqueued"] != expected
                or jax.process_count() > 1):
            return
        cpu = [(o, h) for o, h in self.holding.held.items() if o >= 0]
        for ordinal, h in cpu:
            if self.blocker(h) is not None:
                self._run_through_blocker(
                    ordinal, h,
                    "whose other parts cannot come: every thread of the process waits, for "
                    "calls held back behind joined callbacks (a circle through the runtime)")
                return
        # No call held back: a device that waits for its own synchronous joined tap (its
        # part is the tap's source) holds the thread the others' parts need. It goes on
        # before the tap ran; the tap runs once its set is complete, in every device's
        # order.
        for ordinal, h in cpu:
            if h.joiner.let_go(h.run, ordinal):
                logger.warning("hostfeed: device %s goes on before its synchronous "
                               "global-view tap %s ran: the other devices' parts cannot "
                               "come while it waits (every thread of the process waits: a "
                               "circle through the runtime); the tap runs once they come. "
                               "Asynchronous taps (HOSTFEED_SYNC_TAPS=0) never wait so",
                               ordinal, h.joiner.name)
                return

    def _find(self) -> tuple[int, int] | None:
        """An edge (waiter, holder) of a circle of held devices, where ``holder`` holds
        back a part of the set ``waiter`` is held on, or has sent no part of that set and
        holds back a message it waits for (:meth:`blocker`); None if there is no circle."""
        held = self.holding.held.items()
        if len(held) < 2:
            return None
        holders: dict[tuple[int, int], list[int]] = {}
        for ordinal, h in held:
            for key in h.parts:
                holders.setdefault(key, []).append(ordinal)
        blocked = [o for o, h in held if self.blocker(h) is not None]
        if not holders and len(blocked) < 2:
            return None
        # Each held device's successors: the held devices that keep a part of its set.
        succ: dict[int, list[int]] = {}
        for o, h in held:
            keep = [x for x in holders.get(h.key, ()) if x != o]
            if blocked:
                sent = h.joiner.senders(h.run, o)
                keep += [x for x in blocked if x != o and x not in sent and x not in keep]
            succ[o] = keep
        state: dict[int, int] = {}  # 1: on the path, 2: done
        for start, first in succ.items():
            if start in state:
                continue
            path = [(start, iter(first))]
            state[start] = 1
            while path:
                node, it = path[-1]
                nxt = next(it, None)
                if nxt is None:
                    state[node] = 2
                    path.pop()
                elif state.get(nxt) == 1:
                    return node, nxt
                elif nxt not in state:
                    state[nxt] = 1
                    path.append((nxt, iter(succ[nxt])))
        return None
