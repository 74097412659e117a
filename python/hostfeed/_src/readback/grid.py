"""A whole recording at a glance, the data side (``python -m hostfeed show STORE
[PATTERN ...]``; :mod:`.draw` draws it): each chosen array read into a :class:`Panel`
(statistics per row, read from a ``reduce="stats"`` array or computed on the host from raw
rows; what another reduction's ``plot_rows`` gives: a histogram's counts, ...),
the title, and the grid's layout: one row per module
(the arrays' groups, in natural order: ``blocks.2`` before ``blocks.10``), one column per
kind of array a module holds (``output``, its ``output.cotangent`` beside it, ...).
"""
from __future__ import annotations

import concurrent.futures
import datetime
from dataclasses import dataclass
from typing import Optional

import numpy as np

from . import series
from ..reductions import of_kind
from .opened import READERS, Recording

__all__ = ["Panel", "load", "header", "layout"]

C = series.COLUMN


@dataclass
class Panel:
    """One array's data, ready to draw."""
    name: str
    kind: str                       # a reduction's kind ("stats", "histogram", ...) or "raw"
    steps: np.ndarray               # [n] the recorded step of each row (row index if none)
    stats: Optional[np.ndarray]     # [n, columns] series.COLUMN per row (plot "stats")
    values: Optional[np.ndarray]    # [n, columns]: the reduction's plot_rows (other plots)
    reduce: dict                    # the array's hostfeed.reduce attributes
    times: tuple[int, int]          # time_ns of its first and last rows (0, 0 without rows)

    @property
    def counts(self) -> Optional[np.ndarray]:
        """A histogram's counts per row (``[n, bins + 2]``, summed over the kept axes)."""
        return self.values if self.plot == "heatmap" else None

    @property
    def plot(self) -> str:
        """How it is drawn: ``"stats"``, ``"heatmap"`` or ``"lines"``."""
        return series.plot_of(self.kind)

    @property
    def module(self) -> str:
        return series.module_of(self.name)

    @property
    def leaf(self) -> str:
        return self.name.rpartition("/")[2]

    @property
    def bad_steps(self) -> np.ndarray:
        """The steps with a NaN or an infinity (stats and raw arrays)."""
        if self.stats is None:
            return np.zeros(0, np.int64)
        bad = self.stats[:, C["nan_count"]] + self.stats[:, C["inf_count"]] > 0
        return self.steps[bad]


def _panel(rec: Recording, name: str) -> Panel:
    arr = rec[name]
    n = len(arr)
    kind = series.kind_of(arr.attrs)
    reduce = dict(arr.attrs.get("reduce", {}))
    r = of_kind(kind)
    stats = series.plot_of(kind) == "stats"
    if n == 0:
        width = len(series.COLUMN) if stats else int(arr.shape[-1])
        empty = np.zeros((0, width))
        return Panel(name, kind, np.zeros(0, np.int64), empty if stats else None,
                     None if stats else empty, reduce, (0, 0))
    steps = arr.steps
    steps = np.where(steps >= 0, steps, np.arange(n))
    t = arr.meta("time_ns")
    parts = []
    row_bytes = int(np.prod(arr.shape[1:], dtype=np.int64)) * arr.dtype.itemsize
    for lo, hi in series.blocks(n, row_bytes):  # raw rows can be large: a block at a time
        rows = arr._read(lo, hi)
        if stats or r is None:
            parts.append(series.stats_rows(kind, rows, reduce))
        else:
            parts.append(r.plot_rows(rows, reduce))
    data = np.concatenate(parts)
    return Panel(name, kind, steps, data if stats else None, None if stats else data,
                 reduce, (int(t[0]), int(t[-1])))


def load(rec: Recording, names: list[str]) -> list[Panel]:
    """Reads ``names`` of ``rec`` into panels (raw rows summarized on the host), several
    arrays at a time (a read mostly waits on the store and on decoding)."""
    with concurrent.futures.ThreadPoolExecutor(READERS) as pool:
        return list(pool.map(lambda name: _panel(rec, name), names))


def header(path: str, panels: list[Panel]) -> str:
    """The title: the store, its arrays, steps and when its rows were written (UTC)."""
    filled = [p for p in panels if len(p.steps)]
    text = f"{path}: {len(panels)} arrays"
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


def layout(panels: list[Panel]) -> tuple[list[tuple[str, list[tuple[int, Panel]]]], int]:
    """The grid: one row per module in natural order, each cell ``(column, panel)``; the
    columns are the kinds of array the modules hold (``output``, ``output.cotangent``,
    ...) in natural order (a cotangent right after its array), the same in every row. The
    arrays at the top of the store (no module) fill the first row from the left. Returns
    the rows and the number of columns."""
    top = [p for p in panels if not p.module]
    inner = [p for p in panels if p.module]
    leaves = sorted({p.leaf for p in inner}, key=series.natural_key)
    column = {leaf: c for c, leaf in enumerate(leaves)}
    rows: list[tuple[str, list[tuple[int, Panel]]]] = []
    if top:
        rows.append(("", list(enumerate(sorted(top, key=lambda p: series.natural_key(p.name))))))
    for module in sorted({p.module for p in inner}, key=series.natural_key):
        cells = sorted((column[p.leaf], p) for p in inner if p.module == module)
        rows.append((module, [(c, p) for c, p in cells]))
    width = max([len(leaves), len(top)])
    return rows, width
