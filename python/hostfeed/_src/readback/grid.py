"""A whole recording at a glance, the data side (``python -m hostfeed show STORE
[PATTERN ...]``; :mod:`.draw` draws it): each chosen array read into a :class:`Panel`
(statistics per row, read from a ``reduce="stats"`` array or computed on the host from raw
rows; a histogram's counts per row), the title, and the grid's layout: one row per module
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
from .opened import READERS, Recording

__all__ = ["Panel", "load", "header", "layout"]

C = series.COLUMN


@dataclass
class Panel:
    """One array's data, ready to draw."""
    name: str
    kind: str                       # "stats", "histogram" or "raw"
    steps: np.ndarray               # [n] the recorded step of each row (row index if none)
    stats: Optional[np.ndarray]     # [n, 9] STATS per row (stats and raw arrays)
    counts: Optional[np.ndarray]    # [n, bins + 2] (histograms)
    reduce: dict                    # the array's hostfeed.reduce attributes
    times: tuple[int, int]          # time_ns of its first and last rows (0, 0 without rows)

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
    if n == 0:
        width = len(series.COLUMN) if kind != "histogram" else int(arr.shape[-1])
        empty = np.zeros((0, width))
        return Panel(name, kind, np.zeros(0, np.int64), None if kind == "histogram" else empty,
                     empty if kind == "histogram" else None, reduce, (0, 0))
    steps = arr.steps
    steps = np.where(steps >= 0, steps, np.arange(n))
    t = arr.meta("time_ns")
    parts = []
    row_bytes = int(np.prod(arr.shape[1:], dtype=np.int64)) * arr.dtype.itemsize
    for lo, hi in series.blocks(n, row_bytes):  # raw rows can be large: a block at a time
        rows = arr._read(lo, hi)
        if kind == "histogram":
            parts.append(rows.reshape(hi - lo, -1, rows.shape[-1]).sum(1).astype(np.float64))
        else:
            parts.append(series.stats_rows(kind, rows))
    data = np.concatenate(parts)
    return Panel(name, kind, steps, None if kind == "histogram" else data,
                 data if kind == "histogram" else None, reduce, (int(t[0]), int(t[-1])))


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
