"""Percentiles of the native latency histograms (``receiver_stats()``'s ``device_us`` and
``handover_us``): count, mean, percentiles and max from ``(upper bound, count)`` buckets.
Shipped code; the benchmarks (``hostfeed.bench``) use it too.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

PERCENTILES = (("p50", 50.0), ("p90", 90.0), ("p99", 99.0), ("p999", 99.9))


def summary_of_buckets(buckets: Sequence[tuple[int, int]], scale: float = 1.0) -> dict[str, Any]:
    """Like :func:`summary_of_samples` for histogram buckets ``(upper bound, count)``
    (values are bucket upper bounds, times ``scale``).

    Example:
        >>> s = summary_of_buckets([(10, 50), (20, 49), (100, 1)])
        >>> s["count"], s["p50"], s["p99"], s["max"]
        (100, 10.0, 20.0, 100.0)
    """
    total = sum(c for _, c in buckets)
    out: dict[str, Any] = {
        "count": total,
        "mean": (sum(b * c for b, c in buckets) / total * scale) if total else math.nan}
    for name, q in PERCENTILES:
        out[name] = _bucket_quantile(buckets, total, q) * scale if total else math.nan
    out["max"] = buckets[-1][0] * scale if total else math.nan
    return out


def _bucket_quantile(buckets: Sequence[tuple[int, int]], total: int, q: float) -> float:
    rank = max(1, math.ceil(q / 100 * total))
    seen = 0
    for bound, count in buckets:
        seen += count
        if seen >= rank:
            return float(bound)
    return float(buckets[-1][0])
