"""The dispatcher the Rust consumer thread calls with each batch of messages: runs them in
queue order, keeping each device's messages in its program order around joined
(global-view, shard by shard) taps and calls."""
from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

import jax
import numpy as np

from .. import _receiver
from .._receiver.messages import FLAG_EAGER, FLAG_SYNC_TAP, Message
from .._receiver.batch import BatchIter, DispatcherState
from . import compat
from .consumers import ConsumerKind, registry
from .errors import record_exception
from .stall_watch import StallWatch

logger = logging.getLogger("hostfeed")

TAP, CALL = ConsumerKind.TAP, ConsumerKind.CALL


def _tap_failed(exc: BaseException, consumer: Any) -> None:
    """Records the exception a tap function raised (``BatchIter.run_taps`` calls this)."""
    record_exception(exc, f"host callback {consumer.name}")


#: The run of every message of the portable transport, which knows no execution ids.
UNKNOWN_RUN = 0


class _Held(NamedTuple):
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


class Dispatcher:
    """Runs batches of messages, in queue order, on the consumer thread.

    Each device's messages must reach the host in that device's program order, and a
    joined tap (a global-view tap whose devices each send a part) counts as happening at
    its position on every device that sent a part. So once a device has sent a part whose
    set is incomplete, the device is *held*: its later messages, of whatever execution,
    wait here until the set completes (then they run, in order). Messages of other devices
    go on. A barrier waits for messages held back as for any other (the receiver counts
    each as not run until it ran, by its sequence number, ``Message.seq``), even when the
    set's other parts come from an execution dispatched after the barrier started: the
    device ran that execution's part first. Messages held back count against the queue's
    byte bound (up to half of it,
    so that the pushes that complete the sets always find room; past that they are kept
    uncharged, with a warning), and a push is admitted whenever nothing but held-back
    messages is charged. A device going on to other executions is normal (a multi-device
    execution is not ordered against single-device ones, nor are executions dispatched by
    different threads), so it never drops a set.

    Two devices can run two multi-device executions in opposite orders (executions
    dispatched by different threads): then each holds back the part the other waits for.
    Such a crossing (a circle of held devices, each holding back a part of the set the
    next waits for) is found as soon as it forms, and one of those parts runs out of its
    device's order, with a warning, rather than wait for ever. A held device that holds
    back a ``call`` (or a synchronous tap) waits for it and sends nothing more, so it keeps
    back too the parts of the sets it has not sent a part of (on CPU its later executions
    wait behind the call): in a circle of such devices, one device's messages up to that
    call run out of its order. A circle can also run through the runtime (:mod:`.stall_watch`
    establishes it); a device that is only busy is in none, and its later messages wait.

    A set is dropped only when its execution is known to have failed, never because
    time passed or because a barrier ran meanwhile:

    - a ``call`` of that execution failed (its host function raised, or it timed out), so
      the device it ran on sends nothing more of that execution: the run's incomplete sets
      are dropped and its later parts are not waited for;
    - a barrier (``barrier_wait``, ``stop_outfeed_receiver``) that finds a device held
      sends a *mark* before it waits for the dispatched computations; if that wait reports
      a failed computation, it sends a *sweep* after a second mark and wait: a set that
      was already incomplete at that mark belongs to an execution that has finished, so
      if it is still incomplete at the sweep, the failure left it so. Exit sweeps every
      set once everything finished.

    A dropped set's waiting ``call`` replies are failed, with a warning, and parts of its
    run that come later are dropped too (they could never form a set).

    The portable transport knows no execution ids: its messages all carry run
    :data:`UNKNOWN_RUN`. A failure of that "run" is kept only until a barrier's sweep (by
    then every execution dispatched before the failure has sent its parts): global-view
    callbacks dispatched after a failed call fail until the next ``barrier_wait()``,
    rather than for the rest of the process. Only a call lowered into a computation on
    several devices counts (:meth:`_call_ended`): one on a single device ends no
    execution that global-view callbacks take part in.

    Only the consumer thread runs the dispatcher, so it takes no lock: state changes and
    callbacks interleave freely. The one exception is a consumer that was abandoned while
    stuck in a callback and comes back later: it notices that it no longer owns the
    dispatcher and leaves the messages it was releasing to the current consumer
    (``orphans``), which runs them first, in order.
    """

    def __init__(self, charge: bool = False, watch: bool = False) -> None:
        # device ordinal -> the joined set it waits for, and its messages held back
        self.held: dict[int, _Held] = {}
        # Whether held-back messages are charged against the receiver's bound (the
        # receiver's own dispatcher; the unit tests' are not), and how many bytes are.
        self.charge = charge
        self.charged = 0
        self.over_cap_warned = False
        # device ordinal -> messages an abandoned consumer left to be run, in order
        self.orphans: dict[int, collections.deque] = {}
        self.owner = 0  # thread id of the consumer running the dispatcher
        self.epoch = 0  # the newest barrier mark run
        # runs a failed call ended on some device (bounded: the newest 1024), each with
        # the epoch in which it failed
        self.failed_runs: collections.OrderedDict[int, int] = collections.OrderedDict()
        # The receiver's: runs a held call out of order when everything stalls behind it.
        self.stall = StallWatch(lambda: bool(self.held), self._unstall) if watch else None

    def __call__(self, batch: BatchIter | Iterable[Message]) -> None:
        """Runs ``batch``: the receiver's ``BatchIter``, whose runs of plain taps and calls
        run in Rust (``BatchIter.run_taps``, with the :meth:`state` the receiver holds)
        and every other message here; or (the unit tests') any iterable of messages, each
        run here."""
        consumers = registry.consumers
        self.owner = threading.get_ident()
        if self.orphans:
            for ordinal in list(self.orphans):
                self._run_orphans(consumers, ordinal)
        if compat.host_tracing():  # jax.profiler is tracing: one event per callback
            self._traced(consumers, batch)
            return
        run_taps = batch.run_taps if isinstance(batch, BatchIter) else None
        messages = iter(batch)
        while True:
            # The plain taps and calls at the batch's head run in Rust whenever no device is
            # held (run_taps checks); whatever stops them (another kind of message) runs here.
            if run_taps is not None:
                run_taps()
            msg = next(messages, None)
            if msg is None:
                return
            self._offer(consumers, msg)

    def state(self) -> DispatcherState:
        """What the receiver holds of this dispatcher (handed to ``_receiver.host.start``): the
        dispatcher itself, the dicts it reads (never rebound), and where failures of the
        taps and calls it runs go."""
        return DispatcherState(self, held=self.held, orphans=self.orphans,
                               consumers=registry.consumers, tap_failed=_tap_failed,
                               call_failed=self._call_failed)

    def _traced(self, consumers: dict, batch: Iterable[Message]) -> None:
        """The batch while ``jax.profiler`` traces: each message runs inside a trace event
        named after its callback (``hostfeed tap: NAME``, ``hostfeed call: NAME``) on the
        consumer thread, so a trace shows when each callback ran."""
        trace_me = compat.TraceMe
        for msg in batch:
            c = msg.consumer if msg.flags & FLAG_EAGER else consumers.get(msg.consumer_id)
            name = getattr(c, "name", None) or "callback"
            with trace_me(f"hostfeed {getattr(c, 'kind', 'tap')}: {name}"):
                self._offer(consumers, msg)

    def _run_orphans(self, consumers: dict, ordinal: int) -> None:
        waiting = self.orphans.pop(ordinal, None)
        while waiting:
            self._run_held(waiting.popleft(), lambda msg: self._offer(consumers, msg))

    def _run_held(self, entry: tuple[Message, int], run: Callable[[Message], None]) -> None:
        """Runs a message that was held back (``run(msg)``: offered again, which may hold
        it again), freeing the bytes it charged first; only then ends its hold, so that a
        barrier waiting for it returns once it ran."""
        msg, n = entry
        self._let_go(n)
        try:
            run(msg)
        finally:
            if self.charge:
                _receiver.host.let_go(msg.seq, 0)

    def _offer(self, consumers: dict, msg: Message) -> None:
        if msg.consumer_id == 0:  # control message: every execution has finished
            self.sweep(None)
            return
        if self.orphans and msg.device in self.orphans:
            self._run_orphans(consumers, msg.device)
        held = self.held
        if held:
            h = held.get(msg.device)
            if h is not None:
                h.waiting.append((msg, self._hold_back(msg)))
                key = self._joined_key(consumers, msg)
                if key is not None:
                    h.parts[key] += 1
                    self._resolve_crossings(consumers)
                elif msg.reply is not None:  # its device now waits for it: maybe a circle
                    self._resolve_crossings(consumers)
                    if self.stall is not None:
                        self.stall.note()
                return
        self._deliver_and_release(consumers, msg)

    def _deliver_and_release(self, consumers: dict, msg: Message) -> None:
        done = self._deliver(consumers, msg)
        if done:
            self._release(consumers, *done)

    @staticmethod
    def _joined_key(consumers: dict, msg: Message) -> tuple[int, int] | None:
        """The (joiner, run) a message is a part of, or None if it is no joined part."""
        if msg.flags & FLAG_EAGER or msg.consumer_id == 0:
            return None
        c = consumers.get(msg.consumer_id)
        if c is None or c.kind is not ConsumerKind.JOINED:
            return None
        return id(c.invoke), msg.run_id

    def _deliver(self, consumers: dict, msg: Message
                 ) -> tuple[tuple[int, int], tuple[int, ...]] | None:
        """Runs one message; for the part that completes a joined set, returns the set's
        (joiner, run) and the devices that took part (to be released)."""
        # An eager tap's message carries its consumer (no device is involved: its device
        # ordinal is -1, never held).
        consumer = msg.consumer if msg.flags & FLAG_EAGER else consumers.get(msg.consumer_id)
        ordinal, reply = msg.device, msg.reply
        try:
            if consumer is None:
                raise LookupError(
                    f"hostfeed: no host callback is registered under consumer id "
                    f"{msg.consumer_id} in this process: the executable was compiled elsewhere "
                    f"and not lowered here (hostfeed registers callbacks when JAX lowers a "
                    f"computation)")
            kind = consumer.kind
            if kind is TAP:
                if reply is None:
                    consumer.invoke(msg.arrays, ordinal)
                else:
                    run_sync_tap(consumer.invoke, consumer.name, msg.arrays, ordinal, [reply])
            elif kind is CALL:
                # A call nobody waits for any more (timed out, cancelled) is not run; like
                # a failing one, it ends its execution on this device.
                assert reply is not None  # (a call's message always has one)
                if not reply.pending or consumer.invoke(msg.arrays, ordinal, reply):
                    self._call_ended(consumer, msg.run_id, ordinal)
            else:
                run = msg.run_id
                if run in self.failed_runs:  # the set can never complete
                    if reply is not None:
                        reply.fail(f"hostfeed: {consumer.name}: another device's part of "
                                   f"execution {run} never came (a call there failed)")
                    return None
                done = consumer.invoke.add(run, msg.arrays, ordinal, reply)
                if done is None:
                    if reply is not None and not reply.pending:
                        # A synchronous tap's part other than its source's, answered as it
                        # arrived: the tap belongs to its source device's order only (as
                        # the legacy module ran such a tap on that device), so this device
                        # goes on and is not held.
                        return None
                    # (A device already held here is running a crossed part out of its
                    # order: it stays held where it was.)
                    if ordinal not in self.held:
                        self.held[ordinal] = _Held(consumer.invoke, run, collections.deque(),
                                                   self.epoch, collections.Counter())
                        self._resolve_crossings(consumers)
                    if reply is not None and reply.pending and self.stall is not None:
                        self.stall.note()  # its device waits for the set: maybe a circle
                    return None
                return (id(consumer.invoke), run), done
        except BaseException as exc:  # noqa: BLE001 - recorded and re-raised by barrier_wait
            name = getattr(consumer, "name", msg.consumer_id)
            record_exception(exc, f"host callback {name}")
            if reply is not None:
                reply.fail(f"hostfeed: host callback {name} failed: "
                           f"{type(exc).__name__}: {exc}")
                if consumer is not None and consumer.kind is CALL:
                    self._call_ended(consumer, msg.run_id, ordinal)
        return None

    def _release(self, consumers: dict, key: tuple[int, int] | None,
                 ordinals: Sequence[int]) -> None:
        """Runs the messages held back for those of ``ordinals`` held on set ``key``
        (joiner, run; None: whatever holds them), in each device's order (a device that
        sends another incomplete part on the way is held again). A device held on another
        set sent its part of this one out of its order (a crossing) and stays held."""
        me = threading.get_ident()
        for ordinal in ordinals:
            h = self.held.get(ordinal)
            if h is None or (key is not None and h.key != key):
                continue
            del self.held[ordinal]
            waiting = h.waiting
            while waiting:
                if self.owner != me:  # abandoned meanwhile: leave the rest to the owner
                    left = self.orphans.setdefault(ordinal, collections.deque())
                    while waiting:  # (still held back: barriers wait until they ran)
                        left.append(waiting.popleft())
                    break
                self._run_held(waiting.popleft(), lambda msg: self._offer(consumers, msg))

    def _hold_back(self, msg: Message) -> int:
        """Holds a message back in the receiver: barriers count it as not run until it ran
        (:meth:`_run_held`), and it is charged against the bound; returns the bytes
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

    def _let_go(self, n: int) -> None:
        """Frees the ``n`` bytes a held-back message charged (its hold lasts until it ran:
        :meth:`_run_held`)."""
        if n:
            self.charged -= n
            _receiver.host.let_go(None, n)
            if not self.charged:
                self.over_cap_warned = False

    def _call_failed(self, exc: BaseException | None, consumer: Any, run: int, ordinal: int,
                     reply: Any) -> None:
        """A call that the receiver ran (``BatchIter.run_taps``, or inline on its device's
        thread) failed (its reply already says why), or was not run (nobody waits for it),
        or its ``invoke`` raised ``exc``: as in :meth:`_deliver`."""
        if exc is not None:
            record_exception(exc, f"host callback {consumer.name}")
            reply.fail(f"hostfeed: host callback {consumer.name} failed: "
                       f"{type(exc).__name__}: {exc}")
        self._call_ended(consumer, run, ordinal)

    def _call_ended(self, consumer: Any, run: int, ordinal: int) -> None:
        """A call of ``consumer`` failed, or was not run, on device ``ordinal``: that device
        sends nothing more of execution ``run``. Without an execution id (the portable
        transport), only a call lowered into a computation on several devices can end an
        execution with global-view parts (a computation on one device has none): the
        failure of any other leaves the global-view callbacks alone, as the native
        transport's execution ids do."""
        if run == UNKNOWN_RUN and (not registry.joined
                                   or consumer not in registry.several_devices):
            return
        self._run_failed(run, f"a call of execution {run} failed on device {ordinal}")

    def _run_failed(self, run: int, why: str) -> None:
        """Execution ``run`` failed on some device: drops its incomplete sets (that device
        sends no more parts) and does not wait for its later ones."""
        self._forget_run(run)
        for h in list(self.held.values()):
            if h.run == run:
                self._abandon(h.joiner, run, why)

    @property
    def awaits_sweep(self) -> bool:
        """Whether a failure of :data:`UNKNOWN_RUN` waits for a barrier's sweep to end."""
        return UNKNOWN_RUN in self.failed_runs

    def _forget_run(self, run: int) -> None:
        self.failed_runs[run] = self.epoch
        while len(self.failed_runs) > 1024:
            self.failed_runs.popitem(last=False)

    def mark(self, epoch: int) -> None:
        """A barrier's mark (run in queue order): sets held from now on are newer."""
        self.epoch = max(self.epoch, epoch)

    def sweep(self, epoch: int | None) -> None:
        """A sweep (run in queue order, after a barrier that saw a computation fail waited
        for everything dispatched before its mark; or at exit, ``None``): drops the sets
        held since before mark ``epoch`` (``None``: every set), whose executions finished
        without sending every part."""
        while True:
            stale = [(o, h) for o, h in self.held.items() if epoch is None or h.epoch < epoch]
            if not stale:
                break
            ordinal, h = stale[0]
            if h.run != UNKNOWN_RUN:  # (its later parts, if any, came before this sweep)
                self._forget_run(h.run)
            self._abandon(h.joiner, h.run, "its execution finished without sending it")
            if self.held.get(ordinal) is h:  # its part was not among the set's (never so)
                self._release(registry.consumers, None, [ordinal])
        # The executions that failed before the mark have sent every part by now.
        at = self.failed_runs.get(UNKNOWN_RUN)
        if at is not None and (epoch is None or at < epoch):
            del self.failed_runs[UNKNOWN_RUN]

    def _resolve_crossings(self, consumers: dict) -> None:
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
            edge = self._find_crossing(consumers)
            if edge is None:
                return
            waiter, holder = edge
            key = self.held[waiter].key
            h = self.held[holder]
            if key not in h.parts:  # the holder waits for a message it holds back
                self._run_through_blocker(consumers, holder, h,
                                          "whose other devices wait in turn for it")
                continue
            for i, entry in enumerate(h.waiting):
                waiting_msg, _ = entry
                if self._joined_key(consumers, waiting_msg) == key:
                    del h.waiting[i]
                    break
            else:  # the count said it was there
                raise AssertionError("hostfeed: a held-back part went missing")
            h.parts[key] -= 1
            if not h.parts[key]:
                del h.parts[key]
            msg = entry[0]
            c = consumers.get(msg.consumer_id)
            logger.warning("hostfeed: device %s ran two multi-device executions in another "
                           "order than its peers; its part of %s runs out of its order",
                           holder, getattr(c, "name", msg.consumer_id))
            self._run_held(entry, lambda msg: self._deliver_and_release(consumers, msg))

    def _blocker(self, consumers: dict, h: _Held) -> int | None:
        """The position among ``h.waiting`` of the first message its device waits for (its
        reply pending): a ``call`` or a synchronous tap, which can run out of order; None
        if there is none, or if it is a part of a global-view call (which needs its set)."""
        for i, (msg, _) in enumerate(h.waiting):
            reply = msg.reply
            if reply is not None and reply.pending:
                return None if self._joined_key(consumers, msg) is not None else i
        return None

    def _run_through_blocker(self, consumers: dict, ordinal: int, h: _Held, why: str) -> None:
        """Runs the messages device ``ordinal`` holds back, in its order, up to and
        including the first one it waits for (:meth:`_blocker`), before its own joined set
        completes: the device goes on and sends the parts the other held devices wait for.
        The device stays held on its set. Where that message is a synchronous tap, only
        its reply is sent: the device goes on and nothing runs out of its order."""
        stop = self._blocker(consumers, h)
        assert stop is not None  # (what made it a holder)
        blocker = h.waiting[stop][0]
        c = consumers.get(blocker.consumer_id)
        if blocker.flags & FLAG_SYNC_TAP and getattr(c, "kind", None) is TAP:
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
            key = self._joined_key(consumers, entry[0])
            if key is not None:
                h.parts[key] -= 1
                if not h.parts[key]:
                    del h.parts[key]
            self._run_held(entry, lambda msg: self._deliver_and_release(consumers, msg))

    def _unstall(self, expected: int) -> None:
        """(A check of the stall watch, in queue order, once it saw the whole process wait:
        a circle through the runtime.) If still no message reached the receiver since the
        watch pushed it (``expected``: the count of messages enqueued with it), runs the
        held messages of the longest held CPU device that waits for one of them
        (:meth:`_blocker`) up to that one: everything stalled behind it. Not on other
        devices, nor with several processes: a device that waits for an accelerator or
        for another process also leaves this process idle, and its part does come."""
        if (_receiver.host.stats()["messages_enqueued"] != expected
                or jax.process_count() > 1):
            return
        consumers = registry.consumers
        cpu = [(o, h) for o, h in self.held.items() if o >= 0]
        for ordinal, h in cpu:
            if self._blocker(consumers, h) is not None:
                self._run_through_blocker(
                    consumers, ordinal, h,
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

    def _find_crossing(self, consumers: dict) -> tuple[int, int] | None:
        """An edge (waiter, holder) of a circle of held devices, where ``holder`` holds
        back a part of the set ``waiter`` is held on, or has sent no part of that set and
        holds back a message it waits for (:meth:`_blocker`); None if there is no circle."""
        held = self.held
        if len(held) < 2:
            return None
        holders: dict[tuple[int, int], list[int]] = {}
        for ordinal, h in held.items():
            for key in h.parts:
                holders.setdefault(key, []).append(ordinal)
        blocked = [o for o, h in held.items() if self._blocker(consumers, h) is not None]
        if not holders and len(blocked) < 2:
            return None
        # Each held device's successors: the held devices that keep a part of its set.
        succ: dict[int, list[int]] = {}
        for o, h in held.items():
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

    def _abandon(self, joiner: Any, run: int, why: str) -> None:
        dropped = joiner.abandon(run, f"hostfeed: a part of a global-view host call never "
                                      f"arrived ({why}); the call was failed")
        logger.warning("hostfeed: dropped an incomplete global-view host callback of "
                       "execution %s (%s)", run, why)
        self._release(registry.consumers, (id(joiner), run), dropped)


#: The dispatcher of the receiver's consumer thread (held messages charged to the bound).
dispatcher = Dispatcher(charge=True, watch=True)


def run_sync_tap(invoke: Callable[..., None], name: str, arrays: Sequence[np.ndarray],
                 ordinal: int, replies: Sequence[Any]) -> None:
    """Runs a synchronous tap (``invoke(arrays, ordinal)``), then lets the devices waiting
    for it go on (``replies``: their calls without results). A failing tap function is
    recorded for ``barrier_wait`` like any tap; the computation goes on regardless."""
    try:
        invoke(arrays, ordinal)
    except BaseException as exc:  # noqa: BLE001 - recorded for barrier_wait
        record_exception(exc, f"host callback {name}")
    finally:
        for reply in replies:
            if reply.pending:
                reply.send([])

