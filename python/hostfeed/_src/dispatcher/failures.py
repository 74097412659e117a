"""The dispatcher's failures: :class:`Failures`, the executions known to have failed and
the joined sets they leave incomplete.

A set is dropped only when its execution is known to have failed, never because time
passed or because a barrier ran meanwhile:

- a ``call`` of that execution failed (its host function raised, or it timed out), so
  the device it ran on sends nothing more of that execution: the run's incomplete sets
  are dropped and its later parts are not waited for;
- a barrier (``barrier_wait``, ``stop_outfeed_receiver``) that finds a device held sends
  a *mark* before it waits for the dispatched computations; if that wait reports a
  failed computation, it sends a *sweep* after a second mark and wait: a set that was
  already incomplete at that mark belongs to an execution that has finished, so if it is
  still incomplete at the sweep, the failure left it so. Exit sweeps every set once
  everything finished.

A dropped set's waiting ``call`` replies are failed, with a warning, and parts of its run
that come later are dropped too (they could never form a set).

The portable transport knows no execution ids: its messages all carry run
``UNKNOWN_RUN`` (0). A failure of that "run" is kept only until a barrier's sweep (by then
every execution dispatched before the failure has sent its parts): global-view callbacks
dispatched after a failed call fail until the next ``barrier_wait()``, rather than for the
rest of the process. Only a call lowered into a computation on several devices counts
(:meth:`Failures.call_ended`): one on a single device ends no execution that global-view
callbacks take part in.
"""
from __future__ import annotations

import collections
import logging
from typing import Any

from ..consumers import registry
from ..errors import record_exception
from .holding import Holding

__all__ = ["Failures"]

logger = logging.getLogger("hostfeed")

#: The run of every message of the portable transport, which knows no execution ids.
UNKNOWN_RUN = 0


class Failures:
    """The runs that failed (bounded: the newest 1024, each with the barrier epoch in
    which it failed) and the newest barrier mark run (``epoch``); the sets they leave
    incomplete are dropped and their devices released by ``holding``."""

    def __init__(self, holding: Holding) -> None:
        self.holding = holding
        self.epoch = 0
        self.failed_runs: collections.OrderedDict[int, int] = collections.OrderedDict()

    def call_failed(self, exc: BaseException | None, consumer: Any, run: int, ordinal: int,
                    reply: Any) -> None:
        """A call that the receiver ran (its plain calls, or inline on its device's
        thread) failed (its reply already says why), or was not run (nobody waits for
        it), or its ``invoke`` raised ``exc``: as the dispatcher's own delivery does."""
        if exc is not None:
            record_exception(exc, f"host callback {consumer.name}")
            reply.fail(f"hostfeed: host callback {consumer.name} failed: "
                       f"{type(exc).__name__}: {exc}")
        self.call_ended(consumer, run, ordinal)

    def call_ended(self, consumer: Any, run: int, ordinal: int) -> None:
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
        for _, h in self.holding.held.items():
            if h.run == run:
                self.abandon(h.joiner, run, why)

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
        held = self.holding.held
        while True:
            stale = [(o, h) for o, h in held.items() if epoch is None or h.epoch < epoch]
            if not stale:
                break
            ordinal, h = stale[0]
            if h.run != UNKNOWN_RUN:  # (its later parts, if any, came before this sweep)
                self._forget_run(h.run)
            self.abandon(h.joiner, h.run, "its execution finished without sending it")
            if held.get(ordinal) is h:  # its part was not among the set's (never so)
                self.holding.release(None, [ordinal])
        # The executions that failed before the mark have sent every part by now.
        at = self.failed_runs.get(UNKNOWN_RUN)
        if at is not None and (epoch is None or at < epoch):
            del self.failed_runs[UNKNOWN_RUN]

    def abandon(self, joiner: Any, run: int, why: str) -> None:
        """Drops the incomplete set of ``joiner`` and ``run`` (its waiting calls failed)
        and releases the devices held on it."""
        dropped = joiner.abandon(run, f"hostfeed: a part of a global-view host call never "
                                      f"arrived ({why}); the call was failed")
        logger.warning("hostfeed: dropped an incomplete global-view host callback of "
                       "execution %s (%s)", run, why)
        self.holding.release((id(joiner), run), dropped)
