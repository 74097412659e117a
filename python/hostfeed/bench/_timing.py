"""Timing helpers shared by every hostfeed benchmark: interleaved repeats, distributions,
percentiles, ratio tables.

Every benchmark measures hostfeed and its alternatives in the same process, one after the
other in each repeat, so machine noise hits all of them alike; only ratios are meaningful.
"""
from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

#: The percentiles every distribution reports.
from .._src.measuring import PERCENTILES, summary_of_buckets  # noqa: F401  (re-exported)


def rounds(cases: dict[str, Callable[[], float]], n: int) -> dict[str, list[float]]:
    """Each case (a function returning the seconds it measured) once per round, ``n``
    rounds, interleaved, after one untimed run each; the seconds of each round."""
    for go in cases.values():
        go()
    out: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(n):
        for name, go in cases.items():
            out[name].append(go())
    return out


def timeit(fn: Callable[[], object], *, repeats: int = 5, warmup: int = 1) -> dict:
    """Runs ``fn`` ``warmup`` times untimed, then ``repeats`` times; returns seconds.

    Example:
        >>> sorted(timeit(lambda: None, repeats=2))
        ['all', 'median', 'min']
    """
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return {"min": min(times), "median": statistics.median(times), "all": times}


def interleaved(cases: dict[str, Callable[[], object]], *, repeats: int = 5,
                warmup: int = 1, alternate: bool = False,
                before: Callable[[], object] | None = None) -> dict[str, dict]:
    """Times each case ``repeats`` times, interleaving the cases round-robin (seconds);
    with ``alternate``, every other round runs them in reverse order (ABC CBA ABC ...), so
    that no case always runs first or right after the same other one. ``before`` runs,
    untimed, before each timed case (say, a garbage collection).

    Example:
        >>> sorted(interleaved({"a": lambda: None, "b": lambda: None}, repeats=1))
        ['a', 'b']
        >>> order = []
        >>> _ = interleaved({k: (lambda k=k: order.append(k)) for k in "ab"}, repeats=2,
        ...                 warmup=0, alternate=True)
        >>> "".join(order)
        'abba'
    """
    for fn in cases.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {k: [] for k in cases}
    names = list(cases)
    for r in range(repeats):
        for name in (names[::-1] if alternate and r % 2 else names):
            if before is not None:
                before()
            t0 = time.perf_counter()
            cases[name]()
            times[name].append(time.perf_counter() - t0)
    return {k: {"min": min(v), "median": statistics.median(v), "all": v}
            for k, v in times.items()}


#: Two runs of a figure on a quiet machine should agree within this (relative). A figure
#: measured round by round whose median lies in an interval wider than this is *noisy*:
#: two runs may give figures further apart.
AGREEMENT = 0.15
#: The confidence of that interval.
CONFIDENCE = 0.90


def _median_rank(n: int) -> int:
    """The largest ``k`` such that the ``k``-th smallest and ``k``-th largest of ``n``
    values bracket their distribution's median with :data:`CONFIDENCE` (order statistics:
    each value lies below the median with probability one half); 1 for few values."""
    k, below = 1, 0.0  # below: P(fewer than k of n values lie below the median)
    while True:
        below += math.comb(n, k - 1) / 2 ** n
        if 2 * k > n or 1 - 2 * (below + math.comb(n, k) / 2 ** n) < CONFIDENCE:
            return k
        k += 1


class Paired(NamedTuple):
    """A figure measured round by round (a ratio of two methods in the same round, or one
    method's figure): its median over the rounds and the interval that holds the true
    median with :data:`CONFIDENCE` (order statistics; the whole range for few rounds)."""

    median: float
    low: float
    high: float
    rounds: int

    @property
    def noise(self) -> float:
        """The interval's width relative to the median."""
        return (self.high - self.low) / self.median if self.median else math.inf

    @property
    def noisy(self) -> bool:
        """Whether two runs may differ by more than :data:`AGREEMENT`."""
        return self.noise > AGREEMENT

    def spread(self, unit: str = "x") -> str:
        """The interval as text, ``~`` after it when noisy (``0.91-1.07x ~``)."""
        return f"{self.low:.2f}-{self.high:.2f}{unit}" + (" ~" if self.noisy else "")


def paired(values: Sequence[float]) -> Paired:
    """The median of ``values`` (one per round) and the interval it lies in.

    Example:
        >>> p = paired([1.0, 1.02, 0.98, 1.01, 0.99, 1.0, 1.03, 0.97, 1.0])
        >>> p.median, p.low, p.high, p.noisy
        (1.0, 0.98, 1.02, False)
        >>> paired([1.0, 2.0, 1.5]).spread()
        '1.00-2.00x ~'
    """
    v = sorted(values)
    n = len(v)
    if not n:
        return Paired(math.nan, math.nan, math.nan, 0)
    k = _median_rank(n)
    return Paired(statistics.median(v), v[k - 1], v[n - k], n)


def balanced(values: Sequence[float]) -> float:
    """The figure of rounds that alternate their order (ABC CBA ABC ...; ``values`` one per
    round, in order): the geometric mean of the median of each order's rounds, so that
    which order holds the middle round does not decide the figure. A method that pays for
    coming right after the others (say, a consumer that stopped spinning while they ran)
    weighs as much as when it comes right after itself: one median flipped between the two
    from run to run (an eager tap at 0.92x or 1.57x of ``jax.debug.callback``; this gives
    1.16-1.22x over the same 15 processes). With fewer than 4 rounds, the median.

    Example:
        >>> balanced([1.0, 4.0, 1.0, 4.0, 1.0])
        2.0
        >>> balanced([1.0, 2.0, 3.0])
        2.0
    """
    if len(values) < 4:
        return statistics.median(values)
    return math.sqrt(statistics.median(values[0::2]) * statistics.median(values[1::2]))


def table(title: str, rows: list[tuple[str, float, str]], baseline: str,
          higher_is_better: bool) -> str:
    """Formats ``(name, value, unit)`` rows with each row's ratio to ``baseline``.

    Example:
        >>> rows = [("a", 2.0, "s"), ("b", 1.0, "s")]
        >>> print(table("t", rows, "b", False))  # doctest: +NORMALIZE_WHITESPACE
        t
          case      value  unit      vs b
          a         2.000  s        0.50x
          b         1.000  s        1.00x
    """
    base = {r[0]: r[1] for r in rows}[baseline]
    width = max(len(r[0]) for r in rows) + 2
    lines = [title, f"  {'case':<{width}}{'value':>10}  {'unit':<8}{'vs ' + baseline:>10}"]
    for name, value, unit in rows:
        ratio = value / base if higher_is_better else base / value
        lines.append(f"  {name:<{width}}{value:>10.3f}  {unit:<8}{ratio:>9.2f}x")
    return "\n".join(lines)


def summary_of_samples(samples: Sequence[float]) -> dict[str, Any]:
    """Count, mean, percentiles and max of raw samples (any unit).

    Example:
        >>> s = summary_of_samples(list(range(1, 101)))
        >>> s["count"], s["p50"], s["max"]
        (100, 50.0, 100.0)
    """
    values = sorted(float(v) for v in samples)
    n = len(values)
    out: dict[str, Any] = {"count": n, "mean": math.fsum(values) / n if n else math.nan}
    for name, q in PERCENTILES:
        out[name] = values[min(n - 1, max(0, math.ceil(q / 100 * n) - 1))] if n else math.nan
    out["max"] = values[-1] if n else math.nan
    return out


def cdf_of_samples(samples: Sequence[float], points: int = 200) -> list[list[float]]:
    """``[[value, fraction <= value], ...]`` at most ``points`` long (for plots and JSON).

    Example:
        >>> cdf_of_samples([3.0, 1.0, 2.0, 4.0], points=2)
        [[2.0, 0.5], [4.0, 1.0]]
    """
    values = sorted(float(v) for v in samples)
    n = len(values)
    if not n:
        return []
    step = max(1, n // points)
    idx = list(range(step - 1, n, step))
    if idx[-1] != n - 1:
        idx.append(n - 1)
    return [[values[i], (i + 1) / n] for i in idx]


def cdf_of_buckets(buckets: Sequence[tuple[int, int]], scale: float = 1.0) -> list[list[float]]:
    """The CDF of histogram buckets, one point per non-empty bucket.

    Example:
        >>> cdf_of_buckets([(10, 1), (20, 3)])
        [[10.0, 0.25], [20.0, 1.0]]
    """
    total = sum(c for _, c in buckets)
    out, seen = [], 0
    for bound, count in buckets:
        seen += count
        out.append([bound * scale, seen / total])
    return out
