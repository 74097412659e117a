"""Reading a store that a recorder still writes: :func:`warn_if_unflushed` says so when rows
may not be written yet (the readers of :mod:`hostfeed._src.readback` call it), and
:func:`mark_flushed` is what the recorder tells it when everything it was sent is written
(opened, flushed, after a barrier)."""
from __future__ import annotations

import os
import warnings
import weakref
from typing import TYPE_CHECKING, Optional

from .. import lifecycle
from . import stores
from ..primitives import host_callback_effect

if TYPE_CHECKING:
    from .view import RecorderView

__all__ = ["UnflushedReadWarning", "mark_flushed", "warn_if_unflushed"]


class UnflushedReadWarning(UserWarning):
    """A recording was read while a :class:`Recorder` holds it, with rows that may not be
    written yet: what was read lacks them. ``rec.flush()`` (or ``hcb.barrier_wait()``, or
    ``rec.close()``) in the writer first, or :func:`hostfeed.follow` to read rows as they
    are committed."""


# Per recorder of this process: (messages the receiver had taken in, rows the recorder
# had received) when it was opened or last flushed; anything since may be unwritten.
_flushed: weakref.WeakKeyDictionary[RecorderView, tuple[int, int]] = weakref.WeakKeyDictionary()


def _mark(rec: RecorderView) -> tuple[int, int]:
    return (int(lifecycle.stats()["messages_enqueued"]), int(rec.stats()["rows"]))


def mark_flushed(rec: RecorderView) -> None:
    """Notes that every row ``rec`` was sent so far is written (it was opened or flushed)."""
    _flushed[rec] = _mark(rec)


def _own_recorder(where: stores.Location) -> Optional[RecorderView]:
    """The open recorder of this process that writes the store ``where``, if any."""
    key = where.where if where.url else os.path.realpath(where.where)
    for rec in list(_flushed.keys()):
        if not rec.closed and (rec.path if where.url else os.path.realpath(rec.path)) == key:
            return rec
    return None


def _unflushed(rec: RecorderView) -> bool:
    """Whether rows may have been sent to ``rec`` since it was opened or flushed. The
    computations dispatched so far are waited for first (not the receiver), so that every
    message they send is counted."""
    if not rec.pipeline.idle:
        return True
    lifecycle.wait_for_dispatched(host_callback_effect)
    return _flushed.get(rec) != _mark(rec)


def warn_if_unflushed(where: stores.Location, who: str, rows: Optional[int] = None,
                      stacklevel: int = 3) -> None:
    """Warns (:class:`UnflushedReadWarning`) when a recorder holds the store ``where`` (its
    lock is taken) and may have rows not written yet: always for another process's
    recorder; for one of this process, if anything was recorded since its last flush."""
    if not stores.writer_open(where):
        return
    own = _own_recorder(where)
    if own is not None and not _unflushed(own):
        return
    holder = "a Recorder of this process" if own is not None else "a Recorder"
    got = "" if rows is None else f" ({rows} rows read)"
    warnings.warn(
        f"{who}: {holder} still has {where.where} open ({stores.LOCK_NAME} is held): rows "
        f"recorded since its last flush may not be written yet (a recorder announces each "
        f"row within its commit_interval), and are then missing from what was read{got}. "
        f"Call rec.flush() (or hcb.barrier_wait(), or rec.close()) in the writer before "
        f"reading, or use hostfeed.follow() to read rows as they are committed",
        UnflushedReadWarning, stacklevel=stacklevel)
