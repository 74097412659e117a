"""The dispatcher's entry and its delivery: :class:`Dispatcher`, called by the consumer
thread with each message the receiver does not run itself (see the package's
documentation), which hands it to :class:`~.holding.Holding` when its device is held and
otherwise delivers it to its consumer: a tap's function, a call's, or a part of a joined
set (whose device is then held until the set completes)."""
from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..._receiver.batch import DispatcherState, Holds
from ..._receiver.messages import FLAG_EAGER, Message
from .. import compat
from ..consumers import ConsumerKind, registry
from ..errors import record_exception
from ..stall_watch import StallWatch
from .crossings import Crossings
from .failures import UNKNOWN_RUN, Failures
from .holding import Holding, joined_key

__all__ = ["Dispatcher", "UNKNOWN_RUN", "run_sync_tap"]

TAP, CALL = ConsumerKind.TAP, ConsumerKind.CALL

def _tap_failed(exc: BaseException, consumer: Any) -> None:
    """Records the exception a tap function raised (the receiver's plain taps)."""
    record_exception(exc, f"host callback {consumer.name}")


class Dispatcher:
    """Runs messages, in queue order, on the consumer thread: ``dispatcher(msg)`` for each
    message the receiver does not run itself (see the package's documentation).

    ``consumers``: the consumer table messages name (the registry's by default);
    ``charge``: whether held-back messages are charged against the receiver's bound (the
    receiver's own dispatcher; the unit tests' are not); ``watch``: whether a stall watch
    runs a held call out of order once the whole process waits (the receiver's).
    """

    def __init__(self, charge: bool = False, watch: bool = False,
                 consumers: Any = None) -> None:
        #: The devices held and the orphans, shared with the receiver (``Holds``).
        self.held = Holds()
        self.consumers = registry.consumers if consumers is None else consumers
        self.holding = Holding(self.held, self.offer, charge)
        self.crossings = Crossings(self.holding, self.consumers, self.deliver_and_release)
        self.failures = Failures(self.holding)
        # The receiver's: runs a held call out of order when everything stalls behind it.
        self.stall = (StallWatch(lambda: bool(self.held), self.crossings.unstall) if watch
                      else None)

    def __call__(self, msg: Message) -> None:
        """Runs ``msg`` (after the messages an abandoned consumer left, if any); while
        ``jax.profiler`` traces, inside a trace event named after its callback (``hostfeed
        tap: NAME``, ``hostfeed call: NAME``), so a trace shows when each callback ran."""
        self.holding.owner = threading.get_ident()
        for ordinal in self.held.orphaned():
            self.holding.run_orphans(ordinal)
        if compat.host_tracing():
            c = msg.consumer if msg.flags & FLAG_EAGER else self.consumers.get(msg.consumer_id)
            name = getattr(c, "name", None) or "callback"
            with compat.TraceMe(f"hostfeed {getattr(c, 'kind', 'tap')}: {name}"):
                self.offer(msg)
            return
        self.offer(msg)

    def state(self) -> DispatcherState:
        """What the receiver holds of this dispatcher (handed to ``_receiver.host.start``):
        the dispatcher itself, its ``Holds``, the consumer table, and where failures of the
        taps and calls the receiver runs go."""
        return DispatcherState(self, holds=self.held, consumers=self.consumers,
                               tap_failed=_tap_failed, call_failed=self.failures.call_failed)

    # Delegated to the parts (what lifecycle, the stall watch and the tests ask).

    @property
    def charged(self) -> int:
        """The bytes held-back messages charge against the bound."""
        return self.holding.charged

    @property
    def failed_runs(self) -> Any:
        """The runs a failed call ended, each with the epoch in which it failed."""
        return self.failures.failed_runs

    @property
    def awaits_sweep(self) -> bool:
        """Whether a failure of :data:`UNKNOWN_RUN` waits for a barrier's sweep to end."""
        return self.failures.awaits_sweep

    def mark(self, epoch: int) -> None:
        """A barrier's mark (run in queue order): see :meth:`Failures.mark`."""
        self.failures.mark(epoch)

    def sweep(self, epoch: int | None) -> None:
        """A barrier's sweep (run in queue order): see :meth:`Failures.sweep`."""
        self.failures.sweep(epoch)

    def _unstall(self, expected: int) -> None:
        """The stall watch's check: see :meth:`Crossings.unstall`."""
        self.crossings.unstall(expected)

    # Delivery.

    def offer(self, msg: Message) -> None:
        """Runs ``msg`` unless its device is held (then it waits for its set, in order)."""
        if msg.consumer_id == 0:  # control message: every execution has finished
            self.failures.sweep(None)
            return
        held = self.held
        if not held.is_empty():
            if msg.device in held.orphaned():
                self.holding.run_orphans(msg.device)
            h = held.get(msg.device)
            if h is not None:
                key = joined_key(self.consumers, msg)
                self.holding.hold_back(h, msg, key)
                if key is not None or msg.reply is not None:
                    # A joined part, or a message its device waits for: maybe a circle.
                    self.crossings.resolve()
                    if key is None and self.stall is not None:
                        self.stall.note()
                return
        self.deliver_and_release(msg)

    def deliver_and_release(self, msg: Message) -> None:
        """Delivers ``msg``; if it completes a joined set, releases the set's devices."""
        done = self.deliver(msg)
        if done:
            self.holding.release(*done)

    def deliver(self, msg: Message) -> tuple[tuple[int, int], tuple[int, ...]] | None:
        """Runs one message; for the part that completes a joined set, returns the set's
        (joiner, run) and the devices that took part (to be released)."""
        # An eager tap's message carries its consumer (no device is involved: its device
        # ordinal is -1, never held).
        consumer = msg.consumer if msg.flags & FLAG_EAGER else self.consumers.get(msg.consumer_id)
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
                    self.failures.call_ended(consumer, msg.run_id, ordinal)
            else:
                return self._add_part(consumer, msg)
        except BaseException as exc:  # noqa: BLE001 - recorded and re-raised by barrier_wait
            name = getattr(consumer, "name", msg.consumer_id)
            record_exception(exc, f"host callback {name}")
            if reply is not None:
                reply.fail(f"hostfeed: host callback {name} failed: "
                           f"{type(exc).__name__}: {exc}")
                if consumer is not None and consumer.kind is CALL:
                    self.failures.call_ended(consumer, msg.run_id, ordinal)
        return None

    def _add_part(self, consumer: Any, msg: Message
                  ) -> tuple[tuple[int, int], tuple[int, ...]] | None:
        """Adds a part of a joined set; holds its device while the set is incomplete."""
        run, ordinal, reply = msg.run_id, msg.device, msg.reply
        if run in self.failures.failed_runs:  # the set can never complete
            if reply is not None:
                reply.fail(f"hostfeed: {consumer.name}: another device's part of "
                           f"execution {run} never came (a call there failed)")
            return None
        done = consumer.invoke.add(run, msg.arrays, ordinal, reply)
        if done is not None:
            return (id(consumer.invoke), run), done
        if reply is not None and not reply.pending:
            # A synchronous tap's part other than its source's, answered as it arrived:
            # the tap belongs to its source device's order only (as the legacy module ran
            # such a tap on that device), so this device goes on and is not held.
            return None
        # (A device already held here is running a crossed part out of its order: it
        # stays held where it was.)
        if ordinal not in self.held:
            self.holding.hold(ordinal, consumer.invoke, run, self.failures.epoch)
            self.crossings.resolve()
        if reply is not None and reply.pending and self.stall is not None:
            self.stall.note()  # its device waits for the set: maybe a circle
        return None


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

