"""A whole recording at a glance, the data side (``python -m hostfeed show STORE
[PATTERN ...]``; :mod:`.draw` draws it): each chosen array read into a :class:`Panel`
(what its reduction's read side draws of its rows: statistics per row for a
``reduce="stats"`` array, or computed on the host from raw rows; a histogram's counts;
another reduction's ``plot_rows``), the title, and the grid's layout (:func:`layout`):
rows of panels, each module's arrays side by side (``output``, its ``output.cotangent``
beside it, ...), the modules in natural order (``blocks.2`` before ``blocks.10``),
wrapping.
"""
from __future__ import annotations

import concurrent.futures
import datetime
from dataclasses import dataclass

import numpy as np

from . import series
from ..reductions import Readback, readback
from .opened import READERS, Recording

__all__ = ["Panel", "load", "header", "layout", "COLUMNS"]


@dataclass
class Panel:
    """One array's data, ready to draw."""
    name: str
    reader: type[Readback]          # how its rows read back (its reduction, or raw rows)
    steps: np.ndarray               # [n] the recorded step of each row (row index if none)
    values: np.ndarray              # [n, columns]: the reader's plot_rows
    reduce: dict                    # the array's hostfeed.reduce attributes
    times: tuple[int, int]          # time_ns of its first and last rows (0, 0 without rows)

    @property
    def kind(self) -> str:
        """Its reduction's kind (``"stats"``, ``"histogram"``, ...) or ``"raw"``."""
        return self.reader.kind

    @property
    def plot(self) -> str:
        """How it is drawn (the reader's ``plot``: ``"stats"``, ``"heatmap"`` or
        ``"lines"``)."""
        return self.reader.plot

    @property
    def module(self) -> str:
        return series.module_of(self.name)

    @property
    def leaf(self) -> str:
        return self.name.rpartition("/")[2]

    @property
    def bad_steps(self) -> np.ndarray:
        """The steps with a NaN or an infinity (where the reader can tell)."""
        bad = self.reader.nonfinite_rows(self.values, self.reduce) if len(self.steps) \
            else None
        return np.zeros(0, np.int64) if bad is None else self.steps[bad]


def _panel(rec: Recording, name: str) -> Panel:
    arr = rec[name]
    n = len(arr)
    reader = readback(arr.attrs)
    reduce = dict(arr.attrs.get("reduce", {}))
    if n == 0:
        return Panel(name, reader, np.zeros(0, np.int64), np.zeros((0, 0)), reduce, (0, 0))
    steps = arr.steps
    steps = np.where(steps >= 0, steps, np.arange(n))
    t = arr.meta("time_ns")
    row_bytes = int(np.prod(arr.shape[1:], dtype=np.int64)) * arr.dtype.itemsize
    # Raw rows can be large: a block at a time.
    data = np.concatenate([reader.plot_rows(arr._read(lo, hi), reduce)
                           for lo, hi in series.blocks(n, row_bytes)])
    return Panel(name, reader, steps, data, reduce, (int(t[0]), int(t[-1])))


def load(rec: Recording, names: list[str]) -> list[Panel]:
    """Reads ``names`` of ``rec`` into panels (raw rows summarized on the host), several
    arrays at a time (a read mostly waits on the store and on decoding)."""
    with concurrent.futures.ThreadPoolExecutor(READERS) as pool:
        return list(pool.map(lambda name: _panel(rec, name), names))


def header(path: str, panels: list[Panel]) -> str:
    """The title: the store, its arrays, steps and when its rows were written (UTC)."""
    filled = [p for p in panels if len(p.steps)]
    text = f"{path}: {len(panels)} array{'' if len(panels) == 1 else 's'}"
    if filled:
        lo = min(int(p.steps.min()) for p in filled)
        hi = max(int(p.steps.max()) for p in filled)
        t0 = min(p.times[0] for p in filled)
        t1 = max(p.times[1] for p in filled)

        def utc(ns: int) -> datetime.datetime:
            return datetime.datetime.fromtimestamp(ns / 1e9, tz=datetime.UTC)

        a, b = utc(t0), utc(t1)
        end = b.strftime("%H:%M:%S" if a.date() == b.date() else "%Y-%m-%d %H:%M:%S")
        text += (f", steps {lo}..{hi}, written {a:%Y-%m-%d %H:%M:%S} to {end} UTC")
    else:
        text += ", no rows yet"
    return text


#: At most this many panels side by side (more where the rows would not fit in one PNG).
COLUMNS = 4


def layout(panels: list[Panel], columns: int = COLUMNS) -> list[list[Panel]]:
    """The grid, row by row: the arrays at the top of the store first (a row of them,
    wrapping after ``columns``), then the modules in natural order (``blocks.2`` before
    ``blocks.10``), each module's arrays side by side in natural order (a cotangent right
    after its array). As many whole modules share a row as fit in ``columns``; a module of
    more arrays wraps onto rows of its own. A row's panels share the figure's width, so no
    cell is empty."""
    top = sorted((p for p in panels if not p.module), key=lambda p: series.natural_key(p.name))
    rows = [top[i:i + columns] for i in range(0, len(top), columns)]
    modules: dict[str, list[Panel]] = {}
    for p in sorted((p for p in panels if p.module), key=lambda p: series.natural_key(p.name)):
        modules.setdefault(p.module, []).append(p)
    row: list[Panel] = []
    for module in sorted(modules, key=series.natural_key):
        group = modules[module]
        if row and len(row) + len(group) > columns:
            rows.append(row)
            row = []
        if len(group) > columns:
            rows += [group[i:i + columns] for i in range(0, len(group), columns)]
        else:
            row += group
    if row:
        rows.append(row)
    return rows
