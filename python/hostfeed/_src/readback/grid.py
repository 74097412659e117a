"""A whole recording at a glance, the data side (``python -m hostfeed show STORE
[PATTERN ...]``; :mod:`.draw` draws it): each chosen array read into a :class:`Panel`
(statistics per row, read from a ``reduce="stats"`` array or computed on the host from raw
rows; what another reduction's ``plot_rows`` gives: a histogram's counts, ...),
the title, and the grid's layout (:func:`layout`): rows of panels, each module's arrays
side by side (``output``, its ``output.cotangent`` beside it, ...), the modules in
natural order (``blocks.2`` before ``blocks.10``), wrapping.
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

__all__ = ["Panel", "load", "header", "layout", "COLUMNS"]

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
