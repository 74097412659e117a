"""What a barrier and interpreter exit do with the open recorders (the hooks of
``hostfeed._src.lifecycle``): ``barrier_wait`` writes what every open recorder received
(and raises the first error, a trigger's :class:`~.window.Triggered` among them); exit
closes them, after the receiver drained."""
from __future__ import annotations

import logging
from typing import Optional

from .. import errors, lifecycle
from . import late, recorder as _recorder, unflushed as _unflushed

logger = logging.getLogger("hostfeed")

__all__ = ["flush_open", "close_open"]


def flush_open() -> Optional[BaseException]:
    """After a barrier: writes what every open recorder received; returns the first error
    (rows that reached a closed recorder come last)."""
    if not _recorder._open:  # no recorder open: nothing to write (checked without the lock)
        return None if errors.pending() else late.raised()
    with _recorder.open_lock:
        recorders = list(_recorder._open)
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
    with _recorder.open_lock:
        recorders = list(_recorder._open)
        _recorder._open.clear()
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
    late.report_at_exit()


lifecycle.add_barrier_hook(flush_open)
lifecycle.add_exit_hook(close_open)
