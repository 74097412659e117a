"""A Recorder's lifetime: :class:`Lifetime`, the base of :class:`~.recorder.Recorder` that
opens its store (from its checked :class:`~.options.Options`: the binding's recorder, a
store shared by the processes of a ``jax.distributed`` run, the flight recorder's
window), flushes it (``flush``, ``barrier_wait``), closes it (``close``, leaving a
``with`` block, interpreter exit), and keeps the errors of rows recorded through Python
until one of those raises them. The open recorders (:data:`open_recorders`) and the hooks
run at each close are here too."""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, Optional, Self

from ... import _receiver
from .. import lifecycle
from . import coordination, step as _step, triggers as _triggers, unflushed as _unflushed
from . import window as _window
from .catalogue import Catalogue
from .options import Options

logger = logging.getLogger("hostfeed")

__all__ = ["Lifetime", "RecordingError", "open_recorders", "open_lock", "add_close_hook",
           "run_close_hooks"]

RecordingError = _receiver.error.RecordingError

# Recorders not closed yet: barrier_wait flushes them, interpreter exit closes them (after
# the receiver has drained). Strong references, so that an open recorder dropped by the
# program still gets its rows written.
open_recorders: set[Lifetime] = set()
open_lock = threading.Lock()


class Lifetime:
    """A recorder's store from its opening to its close (the base of
    :class:`~.recorder.Recorder`: see it for the options)."""

    def __init__(self, opts: Options):
        # The receiver (and its exit handler, which closes recorders after draining) must
        # exist before any row can be recorded.
        lifecycle.ensure_started()
        fspath = opts.where.where
        coord = coordination.Coordinator(fspath, opts.coordination_timeout)
        native = opts.native()
        if not coord.shared:
            self._native = _receiver.record.Recorder(fspath, **native)
        elif coord.leader:
            group = coord.new_group()
            try:
                self._native = _receiver.record.Recorder(fspath, **native, shared=group,
                                                         leader=True)
            except Exception as exc:
                coord.announce(None, str(exc))
                raise
            coord.announce(group)
        else:
            self._native = _receiver.record.Recorder(fspath, **native, shared=coord.join(),
                                                     leader=False)
        self._coord = coord
        self._flight = None if opts.window is None else _window.Flight(
            self._native, opts.window, fspath, coord.process, coord.leader,
            opts.resume_after_step)
        if self._flight is not None and coord.shared:
            self._flight.exchange = _triggers.Exchange(self._native, coord)
        coord.start(self._native, opts.commit_interval)
        self._lock = threading.Lock()
        #: What the lowering, the records' specs and recorded steps ask of this recorder.
        self.catalogue = Catalogue(self._native, coord, self._keep_error, self._flight)
        # Errors of rows recorded through Python (eager records), not raised yet.
        self._unseen: list[BaseException] = []
        #: What this recorder's steps (``step``) hand their records to.
        self.pipeline = _step.Pipeline(self.catalogue)
        with open_lock:
            open_recorders.add(self)
        _unflushed.mark_flushed(self)

    @property
    def path(self) -> str:
        """The store's directory."""
        return str(self._native.path)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return bool(self._native.closed)

    def _drain_all_steps(self) -> None:
        """Waits until every row of the steps called so far is appended: this recorder's
        and every open recorder's (a step of another recorder may record to this one)."""
        with open_lock:
            recorders = [self, *(r for r in open_recorders if r is not self)]
        for rec in recorders:
            rec.pipeline.drain()

    def flush(self, timeout: Optional[float] = None) -> None:
        """Waits until every row recorded by the computations dispatched so far is written
        and announced in the store's metadata.

        Raises:
          RecordingError: a write failed since the last flush (disk full, ...), naming
            every array concerned; later flushes raise it again for the rows dropped since.
          ValueError: (or what else it was) a row recorded eagerly could not be appended,
            and no flush, close or ``barrier_wait`` has raised that yet.
          TimeoutError: not done within ``timeout`` seconds (what was written is announced).
        """
        lifecycle.check_not_in_callback("Recorder.flush")
        self._drain_all_steps()
        failed_run = lifecycle.drain_dispatched(timeout)
        if not self._native.flush(timeout):
            raise _receiver.error.ReceiverTimeoutError(
                f"hostfeed: Recorder.flush timed out after {timeout} s with rows of "
                f"{self.path} still being written")
        self._coord.commit(self._native)
        _unflushed.mark_flushed(self)
        if self._flight is not None and self._flight.fired():
            self._flight.notice()
        self._raise_unseen()
        if failed_run is not None:
            raise failed_run

    def close(self) -> None:
        """Flushes, then stops the writer threads. Recording afterwards raises, and so
        does calling a step of this recorder (:meth:`step`); rows that code compiled
        before sends later are dropped, and the next ``barrier_wait()`` raises a
        ``RecordingError`` that counts them per array (if none does, the report at
        interpreter exit says so). Closing twice does nothing."""
        if self.closed:
            return
        lifecycle.check_not_in_callback("Recorder.close")
        try:
            self._drain_all_steps()
            lifecycle.drain_dispatched()
        finally:
            with open_lock:
                open_recorders.discard(self)
            self._close_native()
        self._raise_unseen()
        failed = run_close_hooks(self)
        if failed is not None:
            raise failed

    def _close_native(self) -> None:
        """Writes every row, agrees with the other processes (a shared store), closes."""
        try:
            self._native.flush(None)
            self._coord.close(self._native)
        finally:
            self._coord.stop()
            if self._flight is not None:
                self._flight.close()
            self._native.close()

    def stats(self) -> dict[str, int]:
        """Counters: rows received, bytes and chunks written, spills (partial chunks written
        early to free the queue), commits, rows dropped; with a window, its bytes and steps
        held (``window_bytes_held``, ``window_steps_held``)."""
        return {**self._native.stats(), **(self._flight.held() if self._flight else {})}

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        if exc_info[0] is None:
            self.close()
            return
        try:  # leaving on an exception: that one propagates, a recording error is logged
            self.close()
        except Exception as exc:  # noqa: BLE001 - logged: the exception in flight wins
            logger.error("hostfeed: closing %r while an exception propagates: %s", self, exc)

    def __repr__(self) -> str:
        return f"hostfeed.Recorder({self.path!r}{', closed' if self.closed else ''})"

    # ---- the errors of rows recorded through Python -----------------------------------

    def _keep_error(self, exc: BaseException) -> None:
        with self._lock:
            self._unseen.append(exc)

    def _take_unseen(self) -> Optional[BaseException]:
        """The first error of this recorder's Python-side appends nobody has raised yet
        (the others are logged already); forgets them all."""
        with self._lock:
            unseen, self._unseen = self._unseen, []
        return unseen[0] if unseen else None

    def _raise_unseen(self) -> None:
        exc = self._take_unseen()
        if exc is not None:
            raise exc


# ---- closing -----------------------------------------------------------------------------

_close_hooks: list[Callable[[Any], Optional[BaseException]]] = []


def add_close_hook(hook: Callable[[Any], Optional[BaseException]]) -> None:
    """Runs ``hook(recorder)`` once ``recorder`` is closed (by ``close``, or at exit); an
    exception it returns is raised by ``close`` (logged at exit)."""
    _close_hooks.append(hook)


def run_close_hooks(rec: Lifetime) -> Optional[BaseException]:
    """The close hooks run for ``rec``; the first exception one returned."""
    first: Optional[BaseException] = None
    for hook in _close_hooks:
        first = first or hook(rec)
    return first
