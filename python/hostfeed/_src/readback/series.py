"""What a recorded array says over its steps, as ``show`` draws it and the TensorBoard export
writes it: the arrays chosen by glob patterns (as ``capture`` matches names), in natural
order; each array's statistics per row (read from a ``reduce="stats"`` array, by its columns'
names, its kept axes combined, or computed on the host from raw rows); a raw row's histogram.
"""
from __future__ import annotations

import difflib
import fnmatch
import re
from collections.abc import Iterable, Sequence
from typing import Any, Optional

import numpy as np

from ..reductions import of_kind
from ..reductions.stats import COLUMNS, STATS, as_columns, stored_columns
from ..record.roles import COTANGENT_SUFFIX

__all__ = ["blocks", "select", "natural_key", "module_of", "host_stats", "combine_stats",
           "stats_rows", "stats_columns", "kind_of", "plot_of", "raw_histogram", "COLUMN"]

#: Each statistic's column in a row of statistics as read (every one a statistics array may
#: hold, :data:`~hostfeed._src.reductions.stats.COLUMNS`; NaN where an array holds none).
COLUMN = {c: i for i, c in enumerate(COLUMNS)}
#: How many buckets a raw row's histogram has (TensorBoard's own default).
RAW_BUCKETS = 30
#: The most bytes of rows read at a time (raw rows can be large: read in blocks).
BLOCK_BYTES = 64 << 20
#: How many names an error lists.
_LISTED = 40


def _tokens(text: str) -> tuple:
    return tuple((0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.split(r"(\d+)", text))


def natural_key(name: str) -> tuple:
    """A sort key: by module (the name up to its last ``/``, compared part by part, ``.``
    and ``/`` separating parts, so a module comes before its submodules), then by the
    array's own name; numbers by value (``blocks.2`` before ``blocks.10``); a cotangent
    right after the array it is the cotangent of (a summary's too: ``out.cotangent.stats``
    after ``out.stats``).

    Example:
        >>> sorted(["blocks.10/out", "blocks.2.mlp/out", "blocks.2/out.cotangent",
        ...         "blocks.2/out", "b"], key=natural_key)
        ['b', 'blocks.2/out', 'blocks.2/out.cotangent', 'blocks.2.mlp/out', 'blocks.10/out']
        >>> sorted(["m/out.cotangent.stats", "m/out.stats", "m/out.hist"], key=natural_key)
        ['m/out.hist', 'm/out.stats', 'm/out.cotangent.stats']
    """
    module, _, leaf = name.rpartition("/")
    pieces = leaf.split(".")
    cot = COTANGENT_SUFFIX[1:] in pieces[1:]  # NAME.cotangent, or NAME.cotangent.stats
    base = ".".join(p for i, p in enumerate(pieces) if i == 0 or p != COTANGENT_SUFFIX[1:])
    parts = tuple(_tokens(p) for p in re.split(r"[/.]", module)) if module else ()
    return (parts, _tokens(base), cot)


def module_of(name: str) -> str:
    """The module (group) an array belongs to: its name up to the last ``/`` (``""`` for
    an array at the top of the store).

    Example:
        >>> module_of("blocks.2.mlp/output.cotangent"), module_of("loss")
        ('blocks.2.mlp', '')
    """
    return name.rpartition("/")[0]


def _parts(name: str) -> list[str]:
    return re.split(r"[/.]", name)


def _match_parts(pattern: Sequence[str], name: Sequence[str], prefix: bool) -> bool:
    """Whether ``name``'s parts (or, with ``prefix``, its first parts) match ``pattern``'s
    (``**``: any number of parts), as ``capture`` matches a submodule's name."""
    if not pattern:
        return prefix or not name
    head, rest = pattern[0], pattern[1:]
    if head == "**":
        return any(_match_parts(rest, name[i:], prefix) for i in range(len(name) + 1))
    return bool(name) and fnmatch.fnmatchcase(name[0], head) and \
        _match_parts(rest, name[1:], prefix)


def matches(pattern: str, name: str) -> bool:
    """Whether ``pattern`` chooses the array ``name``: split on ``/`` and ``.`` (the
    separators of a store's groups and of Flax NNX, Flax Linen and Equinox names), ``*``,
    ``?`` and ``[...]`` within a part, ``**`` for any number of parts; a pattern that
    matches the name's first parts chooses the arrays under them (``blocks.2`` chooses
    ``blocks.2.mlp/output``, ``h`` chooses ``h.cotangent``).

    Example:
        >>> [matches("blocks.*", n) for n in ("blocks.2.mlp/output", "head/output")]
        [True, False]
        >>> [matches("**.cotangent", n) for n in ("fc1/output.cotangent", "fc1/output")]
        [True, False]
    """
    return _match_parts(_parts(pattern), _parts(name), prefix=True)


def select(names: Iterable[str], patterns: Sequence[str], where: str) -> list[str]:
    """The names that any of ``patterns`` chooses (every name without a pattern), in
    natural order. A pattern that chooses nothing is a ``KeyError`` listing the names.

    Example:
        >>> select(["blocks.10/h", "blocks.2/h", "loss"], ["blocks.*"], "run.zarr")
        ['blocks.2/h', 'blocks.10/h']
    """
    names = sorted(names, key=natural_key)
    if not patterns:
        return names
    chosen = [n for n in names if any(matches(p, n) for p in patterns)]
    idle = [p for p in patterns if not any(matches(p, n) for n in names)]
    if idle:
        near = difflib.get_close_matches(idle[0], names, n=_LISTED, cutoff=0.0)
        more = f" (and {len(names) - _LISTED} more)" if len(names) > _LISTED else ""
        raise KeyError(f"hostfeed: no array {', '.join(map(repr, idle))} in {where}: no "
                       f"name matches; it has {near or 'none'}{more} (nearest first; a "
                       f"pattern is split on '/' and '.', '*' within a part, '**' for any "
                       f"parts)")
    return chosen


def blocks(n: int, row_bytes: int, most: int = 4096) -> list[tuple[int, int]]:
    """The ranges of ``n`` rows of ``row_bytes`` each read at a time: at most ``most``
    rows and :data:`BLOCK_BYTES` bytes (one row at least).

    Example:
        >>> blocks(10, 30 << 20)
        [(0, 2), (2, 4), (4, 6), (6, 8), (8, 10)]
    """
    k = max(1, min(most, BLOCK_BYTES // max(row_bytes, 1)))
    return [(lo, min(lo + k, n)) for lo in range(0, n, k)]


def kind_of(attrs: dict) -> str:
    """What an array's rows hold: the kind of its reduction (``"stats"``,
    ``"histogram"``, ...: one in :data:`~hostfeed._src.reductions.REDUCTIONS`) or
    ``"raw"``."""
    kind = attrs.get("reduce", {}).get("kind")
    return kind if of_kind(kind) is not None else "raw"


def plot_of(kind: str) -> str:
    """How ``show`` draws rows of ``kind``: ``"stats"`` (raw rows too), ``"heatmap"`` or
    ``"lines"`` (:attr:`~hostfeed._src.reductions.Reduction.plot`)."""
    r = of_kind(kind)
    return "stats" if r is None else r.plot


def host_stats(rows: np.ndarray) -> np.ndarray:
    """The statistics of each row of ``rows`` (``[n, ...]``, as :data:`COLUMN` orders
    them), computed as ``reduce="stats"`` computes :data:`STATS`: count of every value,
    mean to l2 and l1 over the finite values (float64, then float32; NaN where no value is
    finite), NaN, infinity and zero counts, the least non-zero finite magnitude; no cast's
    counts (NaN).

    Example:
        >>> host_stats(np.array([[3.0, -4.0, np.nan, 0.0]]))[0, :12].tolist()
        [4.0, -0.3333333432674408, 2.8674416542053223, -4.0, 3.0, 4.0, 5.0, 1.0, 0.0, 7.0, 1.0, 3.0]
    """
    n = rows.shape[0]
    v = np.asarray(rows).reshape(n, -1)
    if v.dtype.kind == "c":
        v = np.abs(v)
    v = v.astype(np.float64)
    finite = np.isfinite(v)
    k = finite.sum(1)
    z = np.where(finite, v, 0.0)
    safe = np.maximum(k, 1)
    mean = z.sum(1) / safe
    var = np.where(finite, (z - mean[:, None]) ** 2, 0.0).sum(1) / safe
    with np.errstate(invalid="ignore"):
        lo = np.where(finite, v, np.inf).min(1, initial=np.inf)
        hi = np.where(finite, v, -np.inf).max(1, initial=-np.inf)
    out = np.full((n, len(COLUMNS)), np.nan)
    out[:, COLUMN["count"]] = v.shape[1]
    out[:, COLUMN["mean"]] = mean
    out[:, COLUMN["std"]] = np.sqrt(var)
    out[:, COLUMN["min"]] = lo
    out[:, COLUMN["max"]] = hi
    out[:, COLUMN["absmax"]] = np.maximum(np.abs(lo), np.abs(hi))
    out[:, COLUMN["l2"]] = np.sqrt((z * z).sum(1))
    out[:, COLUMN["nan_count"]] = np.isnan(v).sum(1)
    out[:, COLUMN["inf_count"]] = np.isinf(v).sum(1)
    out[:, COLUMN["l1"]] = np.abs(z).sum(1)
    out[:, COLUMN["zeros"]] = (v == 0).sum(1)
    with np.errstate(invalid="ignore"):
        least = np.where(finite & (v != 0), np.abs(v), np.inf).min(1, initial=np.inf)
    out[:, COLUMN["absmin_nonzero"]] = np.where(np.isinf(least), np.nan, least)
    none = k == 0
    for c in ("mean", "std", "min", "max", "absmax"):
        out[none, COLUMN[c]] = np.nan
    return out.astype(np.float32)


def combine_stats(v: np.ndarray) -> np.ndarray:
    """Rows of statistics with kept axes (``[n, ..., len(COLUMN)]``, ``reduce="stats"``
    with ``axis=``, as :data:`COLUMN` orders them) as one row of statistics each: counts
    (and l1) summed, the means and spreads pooled by their finite counts, min, max, absmax
    and the least non-zero magnitude over the parts, l2 as the norm of the parts' l2 (a
    column the array does not hold stays NaN). Rows without kept axes come back as they
    are.

    Example:
        >>> parts = np.stack([host_stats(np.array([[1.0, 3.0]])),
        ...                   host_stats(np.array([[5.0, 7.0]]))], axis=1)
        >>> whole = host_stats(np.array([[1.0, 3, 5, 7]]))
        >>> np.array_equal(combine_stats(parts), whole, equal_nan=True)
        True
    """
    n = v.shape[0]
    if v.ndim == 2:
        return v
    p = v.reshape(n, -1, len(COLUMNS)).astype(np.float64)
    c = {name: p[..., i] for name, i in COLUMN.items()}
    k = c["count"] - c["nan_count"] - c["inf_count"]  # the finite values of each part
    k = np.where(np.isnan(c["mean"]), 0.0, k)
    total = k.sum(1)
    safe = np.maximum(total, 1)
    mean_p = np.where(k > 0, c["mean"], 0.0)
    mean = (k * mean_p).sum(1) / safe
    var = (k * (np.where(k > 0, c["std"], 0.0) ** 2 + (mean_p - mean[:, None]) ** 2)).sum(1) / safe
    out = np.empty((n, len(COLUMNS)), np.float64)
    out[:, COLUMN["count"]] = c["count"].sum(1)
    out[:, COLUMN["mean"]] = mean
    out[:, COLUMN["std"]] = np.sqrt(var)
    with np.errstate(invalid="ignore"):
        out[:, COLUMN["min"]] = np.nanmin(np.where(k > 0, c["min"], np.inf), 1)
        out[:, COLUMN["max"]] = np.nanmax(np.where(k > 0, c["max"], -np.inf), 1)
        out[:, COLUMN["absmax"]] = np.nanmax(np.where(k > 0, c["absmax"], -np.inf), 1)
    out[:, COLUMN["l2"]] = np.sqrt((c["l2"] ** 2).sum(1))
    out[:, COLUMN["nan_count"]] = c["nan_count"].sum(1)
    out[:, COLUMN["inf_count"]] = c["inf_count"].sum(1)
    for name in ("l1", "zeros", "underflow", "overflow"):  # NaN: not held
        out[:, COLUMN[name]] = c[name].sum(1)
    least = np.where(np.isnan(c["absmin_nonzero"]), np.inf, c["absmin_nonzero"]).min(1)
    out[:, COLUMN["absmin_nonzero"]] = np.where(np.isinf(least), np.nan, least)
    for name in ("mean", "std", "min", "max", "absmax"):
        out[total == 0, COLUMN[name]] = np.nan
    return out.astype(np.float32)


def stats_rows(kind: str, rows: np.ndarray, reduce: Optional[dict] = None) -> np.ndarray:
    """One row of statistics (as :data:`COLUMN` orders them) per recorded row of a
    ``"stats"`` array (its columns named in ``reduce``, its ``hostfeed.reduce``
    attributes) or a ``"raw"`` one."""
    if kind == "stats":
        return combine_stats(as_columns(rows, reduce or {}))
    if kind == "raw":
        return host_stats(rows)
    raise ValueError(f"hostfeed: no statistics of {kind} rows")


def stats_columns(kind: str, reduce: Optional[dict] = None) -> list[str]:
    """The statistics an array's rows hold (of :data:`COLUMN`): a raw array's, computed
    on the host, are :data:`STATS`; a statistics array's, its stored columns.

    Example:
        >>> stats_columns("stats", {"columns": list(STATS[:9])})[-2:]
        ['nan_count', 'inf_count']
    """
    if kind == "raw":
        return list(STATS)
    return [c for c in stored_columns(reduce or {}) if c in COLUMN]


def raw_histogram(row: Any) -> tuple[np.ndarray, np.ndarray]:
    """The histogram of one raw row's finite values as TensorBoard draws a tensor's:
    :data:`RAW_BUCKETS` equal buckets from its minimum to its maximum (one bucket from
    ``v - 0.5`` to ``v + 0.5`` when every value is ``v``; none when no value is finite).
    Returns ``(edges, counts)``, ``len(edges) == len(counts) + 1``.

    Example:
        >>> edges, counts = raw_histogram(np.array([0.0, 1.0, 1.0, np.nan]))
        >>> len(edges), counts.tolist()[0], counts.tolist()[-1], int(counts.sum())
        (31, 1, 2, 3)
    """
    v = np.asarray(row)
    if v.dtype.kind == "c":
        v = np.abs(v)
    v = v.astype(np.float64).ravel()
    v = v[np.isfinite(v)]
    if v.size == 0:
        return np.zeros(1), np.zeros(0, np.int64)
    lo, hi = float(np.min(v)), float(np.max(v))
    if lo == hi:
        return np.array([lo - 0.5, hi + 0.5]), np.array([v.size], np.int64)
    edges = np.linspace(lo, hi, RAW_BUCKETS + 1)
    counts, _ = np.histogram(v, bins=edges)
    return edges, counts.astype(np.int64)
