"""What a barrier, interpreter exit and a fork do with the open recorders (the hooks of
``hostfeed._src.lifecycle``): ``barrier_wait`` writes what every open recorder received
(and raises the first error, a trigger's :class:`~.window.Triggered` among them); exit
closes them, after the receiver drained; a forked child starts with none."""
from __future__ import annotations

import logging
import threading
from typing import Optional

from .. import errors, lifecycle
from . import late, lifetime as _lifetime, unflushed as _unflushed

logger = logging.getLogger("hostfeed")

__all__ = ["flush_open", "close_open", "after_fork_in_child"]


def flush_open() -> Optional[BaseException]:
    """After a barrier: writes what every open recorder received; returns the first error
    (rows that reached a closed recorder come last)."""
    if not _lifetime.open_recorders:  # none open: nothing to write (checked without the lock)
        return None if errors.pending() else late.raised()
    with _lifetime.open_lock:
        recorders = list(_lifetime.open_recorders)
    first: Optional[BaseException] = None
    for rec in recorders:  # all first: a step of one recorder may record to another
        try:
            rec.pipeline.drain()
        except Exception as exc:  # noqa: BLE001 - returned to barrier_wait
            first = first or exc
    for rec in recorders:
        try:
            rec._native.flush(None)
            rec._coord.commit(rec._native)
            _unflushed.mark_flushed(rec)
        except Exception as exc:  # noqa: BLE001 - returned to barrier_wait
            first = first or exc
        first = first or rec._take_unseen()
        if rec._flight is not None:  # a trigger's window is written: raise it (on_trigger)
            first = first or rec._flight.take_raised()
    if first is None and not errors.pending():  # else kept for a later barrier
        return late.raised()
    return first


def close_open() -> None:
    """At exit, after the receiver drained: closes every open recorder."""
    with _lifetime.open_lock:
        recorders = list(_lifetime.open_recorders)
        _lifetime.open_recorders.clear()
    for rec in recorders:  # all first: a step of one recorder may record to another
        try:
            rec.pipeline.drain()
        except Exception as exc:  # noqa: BLE001 - logged; the recorders still close
            logger.error("hostfeed: closing %r at exit: %s", rec, exc)
    for rec in recorders:
        try:
            rec._close_native()
        except Exception as exc:  # noqa: BLE001 - logged; the other recorders still close
            logger.error("hostfeed: closing %r at exit: %s", rec, exc)
        failed = _lifetime.run_close_hooks(rec)
        if failed is not None:
            logger.error("hostfeed: closing %r at exit: %s", rec, failed)
    late.report_at_exit()


def after_fork_in_child() -> None:
    """A forked child starts with no open recorder: the parent's are closed here (the
    native side already counts them as closed, without touching their stores)."""
    # A thread of the parent may have held the lock at the fork.
    _lifetime.open_lock = threading.Lock()
    _lifetime.open_recorders.clear()


lifecycle.add_barrier_hook(flush_open)
lifecycle.add_exit_hook(close_open)
lifecycle.add_fork_hook(after_fork_in_child)
