"""numpy's (and ml_dtypes') answer for a row of ``reduce="stats"`` /
``hostfeed.Stats(dtype=...)``: the reference the statistics tests compare with."""
from __future__ import annotations

from typing import Any, Optional

import ml_dtypes
import numpy as np


def stats_of(v: Any, dtype: Optional[Any] = None) -> list[float]:
    """The statistics of the values ``v`` as ``hostfeed.STATS`` orders them (float64, from
    the values as they are): count of every value; mean, std, min, max, absmax, l2 and l1
    of the finite ones (NaN, l2 and l1 0 when none is); NaN, infinity and zero counts; the
    least non-zero finite magnitude (NaN when none). With ``dtype``, then the finite
    non-zero values ``v.astype(dtype)`` makes zero and the finite values it makes an
    infinity or NaN (``ml_dtypes``' casts: round to nearest, ties to even)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return _stats_of(np.asarray(v).ravel(), dtype)


def _stats_of(v: np.ndarray, dtype: Optional[Any]) -> list[float]:
    w = v.astype(np.float64)
    finite = np.isfinite(w)
    f = w[finite]
    nz = np.abs(f[f != 0])
    counts = [np.isnan(w).sum(), np.isinf(w).sum()]
    tail = [np.abs(f).sum(), (w == 0).sum(), nz.min() if nz.size else np.nan]
    if f.size == 0:
        out = [v.size, np.nan, np.nan, np.nan, np.nan, np.nan, 0.0, *counts, *tail]
    else:
        out = [v.size, f.mean(), f.std(), f.min(), f.max(), np.abs(f).max(),
               np.sqrt((f ** 2).sum()), *counts, *tail]
    if dtype is not None:
        c = v.astype(getattr(ml_dtypes, str(dtype), dtype)).astype(np.float64)
        out += [(finite & (w != 0) & (c == 0)).sum(), (finite & ~np.isfinite(c)).sum()]
    return [float(x) for x in out]
