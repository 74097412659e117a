"""Rows that reached a closed recorder: code compiled while a recorder was open still runs
after its ``close()``, and the native side drops (and counts, per store and array) the rows
it sends. None is lost without a word: the next ``barrier_wait()`` raises a
``RecordingError`` that counts them (:func:`raised`, a barrier hook of the recorder), and
what no barrier raised is printed at interpreter exit (:func:`report_at_exit`)."""
from __future__ import annotations

import sys
from typing import Optional

from ... import _receiver

__all__ = ["raised", "report_at_exit", "message"]


def raised() -> Optional[BaseException]:
    """The error that counts the rows which reached a closed recorder since the last one
    was returned, or None (the native side answers without a lock when there are none)."""
    taken = _receiver.record.take_late_drops()
    return _receiver.error.RecordingError(message(taken)) if taken else None


def report_at_exit() -> None:
    """At exit, after the recorders closed: prints (on stderr) the rows that reached a
    closed recorder which no ``barrier_wait`` raised."""
    exc = raised()
    if exc is not None:
        sys.stderr.write(f"{exc} (reported at exit: no barrier_wait() raised it)\n")
        sys.stderr.flush()


def message(late: list[tuple[str, str, int]]) -> str:
    """What ``barrier_wait`` (or the exit report) says of rows that reached closed
    recorders: per store, each array's rows, and why.

    Example:
        >>> print(message([("run.zarr", "x", 3), ("run.zarr", "y", 1)]))
        ... # doctest: +NORMALIZE_WHITESPACE
        hostfeed: 3 rows of 'x', 1 row of 'y' reached the recorder of run.zarr after it was
        closed and were dropped (a computation compiled while it was open ran after its
        close()): close a recorder after the last computation that records to it
    """
    by_store: dict[str, dict[str, int]] = {}
    for store, array, rows in late:
        arrays = by_store.setdefault(store, {})
        arrays[array] = arrays.get(array, 0) + int(rows)
    parts = []
    for store, arrays in by_store.items():
        what = ", ".join(f"{n} row{'s' if n != 1 else ''} of {a!r}"
                         for a, n in sorted(arrays.items()))
        parts.append(f"{what} reached the recorder of {store} after it was closed and "
                     f"{'were' if sum(arrays.values()) != 1 else 'was'} dropped")
    return (f"hostfeed: {'; '.join(parts)} (a computation compiled while it was open ran "
            f"after its close()): close a recorder after the last computation that records "
            f"to it")
