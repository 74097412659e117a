"""A recording as TensorBoard event files (:func:`to_tensorboard`, ``python -m hostfeed
tensorboard STORE LOGDIR [PATTERN ...] [--follow]``): each array as its reduction's read
side says (``Readback.board``: statistics as scalars, histograms as TensorBoard's
histograms with hostfeed's bin edges, raw arrays as both, another reduction's columns as
scalars); each event at its row's recorded step and time. ``follow=True`` tails a store a
recorder is still writing and appends the rows as they are committed, until the recorder
closes it.

The events are the ``tensorboard`` package's protobufs (``pip install tensorboard``, or
``pip install '.[tensorboard]'`` in hostfeed's checkout; no TensorFlow), written by
:class:`_EventFile`.
"""
from __future__ import annotations

import os
import socket
import struct
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any, Optional, TextIO

import numpy as np

from ..record import stores
from ..reductions import Readback, readback
from . import series
from .opened import follow_store, open_recording
from .reading import _recorded_names

__all__ = ["to_tensorboard"]

#: Rows read (and written) at a time: bounds the memory an export holds.
BLOCK_ROWS = 4096


def _tb() -> tuple[Any, Any, Any]:
    """The ``tensorboard`` package's ``Event``, ``Summary`` and ``HistogramProto``."""
    try:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import HistogramProto, Summary
    except ImportError as exc:
        raise ImportError("hostfeed.to_tensorboard needs the tensorboard package: pip install "
                          "tensorboard (or, in hostfeed's checkout, pip install "
                          "'.[tensorboard]')") from exc
    return Event, Summary, HistogramProto


def _masked_crc() -> Any:
    """TFRecord's masked CRC-32C of bytes: google-crc32c's (C) where it is installed, else
    the tensorboard package's own (pure Python: a few times slower an event)."""
    try:
        import google_crc32c
        if google_crc32c.implementation != "c":
            raise ImportError
        crc = google_crc32c.value

        def masked(data: bytes) -> int:
            x = crc(data)
            return (((x >> 15) | (x << 17)) + 0xA282EAD8) & 0xFFFFFFFF
        return masked
    except ImportError:
        from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c
        return masked_crc32c


class _EventFile:
    """An event file as TensorBoard reads it (TFRecord: each event's length, its masked
    CRC-32C, the event, its CRC), written in this thread: the tensorboard package's
    ``EventFileWriter`` hands each event to a thread through a queue of 10 and checksums it
    in pure Python, a few thousand events a second (``benches/show.py``)."""

    def __init__(self, logdir: str, event_cls: Any):
        name = (f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}."
                f"{os.getpid()}.hostfeed")
        self.path = os.path.join(logdir, name)
        self._file = open(self.path, "wb")  # noqa: SIM115 - closed by close()
        self._crc = _masked_crc()
        self.add(event_cls(wall_time=time.time(), file_version="brain.Event:2"))

    def add(self, event: Any) -> None:
        data = event.SerializeToString()
        head = struct.pack("<Q", len(data))
        self._file.write(head + struct.pack("<I", self._crc(head)) + data +
                         struct.pack("<I", self._crc(data)))

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class _Quiet:
    """A column written only once it leaves its quiet value (:attr:`Reduction.quiet`):
    the value (``None`` until the first row gives it), the first and last ``(step,
    time_ns)`` of the quiet stretch, and whether the column has left it."""

    __slots__ = ("value", "first", "last", "loud")

    def __init__(self, value: Optional[float]):
        self.value = value
        self.first: Optional[tuple[int, int]] = None
        self.last: Optional[tuple[int, int]] = None
        self.loud = False


class _Exporter:
    """Turns blocks of rows into events and writes them."""

    def __init__(self, logdir: str):
        self.Event, self.Summary, self.Histogram = _tb()
        _check_logdir(logdir)
        self.writer = _EventFile(logdir, self.Event)
        self.rows: dict[str, int] = {}
        self.events = 0
        self.quiet: dict[tuple[str, str], _Quiet] = {}  # (name, column): its quiet stretch

    def _histo(self, lo: float, hi: float, limits: list[float], counts: list[float],
               total: float = 0.0, squares: float = 0.0) -> Any:
        return self.Histogram(
            min=lo, max=hi, num=float(sum(counts)), sum=total, sum_squares=squares,
            bucket_limit=limits, bucket=counts)

    def _event(self, step: int, time_ns: int, values: list[Any]) -> None:
        self.writer.add(self.Event(wall_time=int(time_ns) / 1e9, step=int(step),
                                   summary=self.Summary(value=values)))
        self.events += 1

    def _scalar(self, name: str, column: str, quiet: Optional[_Quiet], value: float,
                step: int, time_ns: int) -> Optional[Any]:
        """The scalar ``NAME/column`` of one row, or ``None`` where the column is quiet;
        a column that leaves its quiet value first gets its quiet stretch written (two
        events, at its first and last rows: TensorBoard draws the same line)."""
        tag = f"{name}/{column}"
        if quiet is None or quiet.loud:
            return self.Summary.Value(tag=tag, simple_value=value)
        if quiet.value is None:
            quiet.value = value
        if value == quiet.value:
            quiet.first = quiet.first or (step, time_ns)
            quiet.last = (step, time_ns)
            return None
        quiet.loud = True
        for at in dict.fromkeys(x for x in (quiet.first, quiet.last) if x is not None):
            self._event(at[0], at[1], [self.Summary.Value(tag=tag,
                                                          simple_value=quiet.value)])
        return self.Summary.Value(tag=tag, simple_value=value)

    def write(self, name: str, reader: type[Readback], reduce: dict, rows: np.ndarray,
              steps: np.ndarray, times: np.ndarray) -> None:
        """Writes rows ``rows`` of ``name`` (recorded at ``steps``, ``times`` in ns) as
        their reduction's read side says (``reader.board``: scalars, histograms, or the
        value itself), each column of ``reader.quiet`` only where it changes."""
        n = rows.shape[0]
        self.rows[name] = self.rows.get(name, 0) + n
        if not n:
            return
        board = reader.board(rows, reduce)
        Value = self.Summary.Value
        quiet = {c: self.quiet.setdefault((name, c), _Quiet(reader.quiet[c]))
                 for c in board.scalars if c in reader.quiet}
        for i in range(n):
            step, time_ns = int(steps[i]), int(times[i])
            values = []
            if board.value is not None:
                values.append(Value(tag=name, simple_value=float(board.value[i])))
            for c, column in board.scalars.items():
                v = self._scalar(name, c, quiet.get(c), float(column[i]), step, time_ns)
                if v is not None:
                    values.append(v)
            histo = board.histograms[i] if board.histograms is not None else None
            if histo is not None:
                values.append(Value(tag=name, histo=self._histo(*histo)))
            self._event(step, time_ns, values)

    def close(self) -> None:
        self.writer.close()


def _check_logdir(logdir: str) -> None:
    """The log directory made if missing, writable, and without event files already (a
    second export would show every point twice)."""
    try:
        os.makedirs(logdir, exist_ok=True)
    except OSError as exc:
        raise type(exc)(exc.errno, f"hostfeed.to_tensorboard: cannot make the log directory "
                        f"{logdir!r} ({type(exc).__name__}: {exc})") from exc
    if not os.access(logdir, os.W_OK | os.X_OK):
        raise PermissionError(f"hostfeed.to_tensorboard: cannot write into the log directory "
                              f"{logdir!r}: choose one you can write")
    held = sorted(f for f in os.listdir(logdir) if f.startswith("events.out.tfevents."))
    if held:
        raise FileExistsError(f"hostfeed.to_tensorboard: the log directory {logdir!r} holds "
                              f"event files already ({held[0]}, ...): TensorBoard would show "
                              f"their points and these; export into a new directory (a "
                              f"directory per run: LOGDIR/run2) or delete them")


def _steps(steps: np.ndarray, first: int) -> np.ndarray:
    """The recorded steps, a row's index where it was recorded without one."""
    return np.where(steps >= 0, steps, np.arange(first, first + len(steps)))


def _export_all(exp: _Exporter, path: Any, patterns: Sequence[str],
                storage_options: Optional[Mapping[str, Any]]) -> None:
    rec = open_recording(path, storage_options=storage_options)
    for name in series.select(rec.names, patterns, rec.path):
        arr = rec[name]
        reader = readback(arr.attrs)
        reduce = dict(arr.attrs.get("reduce", {}))
        row_bytes = int(np.prod(arr.shape[1:], dtype=np.int64)) * arr.dtype.itemsize
        for lo, hi in series.blocks(len(arr), row_bytes, BLOCK_ROWS):
            exp.write(name, reader, reduce, arr._read(lo, hi),
                      _steps(arr.meta("step", slice(lo, hi)), lo),
                      arr.meta("time_ns", slice(lo, hi)))
        exp.rows.setdefault(name, 0)


def _follow(exp: _Exporter, path: Any, patterns: Sequence[str], poll: float,
            timeout: Optional[float], storage_options: Optional[Mapping[str, Any]]) -> None:
    """Exports the rows of a store a recorder writes, as they are committed, until it
    closes the store (:func:`hostfeed.follow`'s loop: ``opened.follow_store``)."""
    where = stores.location(path, storage_options, who="to_tensorboard")
    last: dict[str, Any] = {}  # the root group of the last look

    def take(root: Any) -> list[int]:
        last["root"] = root
        chosen = [n for n in sorted(_recorded_names(root), key=series.natural_key)
                  if not patterns or any(series.matches(p, n) for p in patterns)]
        new = sum(_follow_array(exp, root, name, where.where) for name in chosen)
        return [new] if new else []

    for _ in follow_store(where, take, who=f"hostfeed.to_tensorboard({where.where!r})",
                          poll=poll, timeout=timeout,
                          progress=lambda: f"{sum(exp.rows.values())} rows exported"):
        exp.writer.flush()
    if patterns and "root" in last:
        series.select(_recorded_names(last["root"]), patterns, where.where)  # said, if idle


def _follow_array(exp: _Exporter, root: Any, name: str, where: str) -> int:
    """Writes the rows of ``name`` committed since the last look; returns how many."""
    arr = root[name]
    done = exp.rows.get(name, 0)
    n = int(arr.shape[0])
    if n <= done:
        exp.rows.setdefault(name, done)
        return 0
    stores.check_recorded(root, arr, name, where)
    parent, _, leaf = name.rpartition("/")
    group = root[parent] if parent else root
    row_bytes = int(np.prod(arr.shape[1:], dtype=np.int64)) * np.dtype(arr.dtype).itemsize
    hi = done + series.blocks(n - done, row_bytes, BLOCK_ROWS)[0][1]
    rows = stores.read_rows(arr, slice(done, hi), name, where)
    steps = stores.read_rows(group[f"{leaf}.step"], slice(done, hi), f"{name}.step", where)
    times = stores.read_rows(group[f"{leaf}.time_ns"], slice(done, hi), f"{name}.time_ns",
                             where)
    attrs = dict(arr.attrs.get("hostfeed", {}))
    exp.write(name, readback(attrs), dict(attrs.get("reduce", {})), rows,
              _steps(steps, done), times)
    return hi - done


def to_tensorboard(path: Any, logdir: str, patterns: Sequence[str] = (), *,
                   follow: bool = False, poll: float = 0.5, timeout: Optional[float] = None,
                   storage_options: Optional[Mapping[str, Any]] = None) -> dict[str, int]:
    """Writes a recording as TensorBoard event files into ``logdir`` (made if missing; a
    directory that holds event files already is refused: TensorBoard would show both).

    Each row becomes an event at its recorded step (its index where it was recorded
    without one) and its recorded time:

    - a ``reduce="stats"`` (or ``hostfeed.Stats(dtype=...)``) array ``NAME``: a scalar
      ``NAME/COLUMN`` for each of its columns (``NAME/count``, ``NAME/mean``, ... of
      ``hostfeed.STATS``, then ``NAME/underflow`` and ``NAME/overflow`` with a dtype; an
      older store's rows, the columns they hold) and what they give:
      ``NAME/dynamic_range_bits`` (``log2(absmax / absmin_nonzero)``),
      ``NAME/zero_fraction``, ``NAME/underflow_fraction``, ``NAME/overflow_fraction``
      (of the count); kept axes combined into one row of statistics (counts summed, means
      and spreads pooled);
      the count, NaN, infinity, zero, underflow and overflow columns and fractions
      only where they change (the rows before the first change as a flat line from the
      first to the last): no flat line of zeros per array;
    - a ``reduce=Histogram(...)`` array: a histogram ``NAME`` with hostfeed's bin edges,
      the below and above counts as buckets at its ends (kept axes summed);
    - an array of another reduction: what its read side writes (``board``), by default a
      scalar per column of its ``plot_rows`` (``NAME/LABEL``, its ``plot_labels``);
    - a raw array: the same scalars (but a cast's), computed on the host over each row
      (mean to l1 over the finite values), and a histogram ``NAME`` of each row's finite values
      (30 equal buckets from its min to its max); rows of one value (a loss) are the
      scalar ``NAME`` itself.

    Args:
      path: the store (a directory, or an object store's URL with ``storage_options``).
      logdir: the directory of the event files: point ``tensorboard --logdir`` at it (or at
        its parent, where each subdirectory is a run).
      patterns: the arrays to export: glob patterns as ``python -m hostfeed show`` takes
        them (split on ``/`` and ``.``; ``blocks.*``, ``**.cotangent``); every array when
        empty. A pattern that chooses nothing is a ``KeyError``.
      follow: tail a store a recorder is still writing (waiting for it to appear), writing
        the rows as they are committed, until the recorder closes it.
      poll: with ``follow``, seconds between looks at the store.
      timeout: with ``follow``, at most that many seconds in all, then ``TimeoutError``.

    Returns:
      The rows exported, by array name.

    Raises:
      ImportError: the ``tensorboard`` package is missing.
      KeyError: a pattern chooses no array.
      ValueError: an array hostfeed did not write, or a store that cannot be read.
      FileNotFoundError: no store at ``path``; with ``follow``, the store deleted.
      PermissionError, FileExistsError: ``logdir`` cannot be written, or holds events.

    Example:
        >>> import pathlib, tempfile, numpy as np, hostfeed
        >>> tmp = pathlib.Path(tempfile.mkdtemp())
        >>> with hostfeed.Recorder(tmp / "run.zarr", mode="w") as rec:
        ...     for step in range(3):
        ...         _ = rec.record("h", np.arange(4, dtype=np.float32) * step, step=step)
        >>> hostfeed.to_tensorboard(tmp / "run.zarr", str(tmp / "logs"))
        {'h': 3}
    """
    if not isinstance(patterns, (list, tuple)):
        raise TypeError(f"hostfeed.to_tensorboard: patterns is a list of glob patterns, got "
                        f"{patterns!r}")
    if follow and not poll > 0:
        raise ValueError(f"hostfeed.to_tensorboard: poll must be > 0 seconds, got {poll!r}")
    logdir = os.fspath(logdir)
    if not follow:  # the store checked before anything is written
        open_recording(path, storage_options=storage_options)
    exp = _Exporter(logdir)
    try:
        if follow:
            _follow(exp, path, patterns, poll, timeout, storage_options)
        else:
            _export_all(exp, path, patterns, storage_options)
    finally:
        exp.close()
    return exp.rows


def main(path: str, logdir: str, patterns: Sequence[str], follow: bool, poll: float,
         out: TextIO = sys.stdout) -> int:
    """``python -m hostfeed tensorboard STORE LOGDIR [PATTERN ...] [--follow]``."""
    start = time.perf_counter()
    try:
        if follow:
            print(f"following {path} into {logdir} until its recorder closes it (Ctrl-C "
                  f"stops)", file=out, flush=True)
        rows = to_tensorboard(path, logdir, list(patterns), follow=follow, poll=poll)
    except (KeyError, ValueError, OSError, ImportError, TimeoutError) as exc:
        said = str(exc).strip(chr(34)).removeprefix("hostfeed.open_recording: ")
        print(f"python -m hostfeed tensorboard: {said}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # the events written so far are in the file, closed
        print(f"python -m hostfeed tensorboard: stopped; the rows exported so far are in "
              f"{logdir}", file=sys.stderr)
        return 130
    total = sum(rows.values())
    print(f"wrote {total} rows of {len(rows)} arrays into {logdir} "
          f"({time.perf_counter() - start:.1f} s); look at them with: tensorboard --logdir "
          f"{logdir}", file=out)
    return 0

