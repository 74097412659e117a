"""Shared timing for hostfeed benchmarks: warm-up, repeats, min/median, ratio tables.

Every benchmark measures hostfeed and its alternatives in the same process, one after the
other in each repeat, so machine noise hits all of them alike; only ratios are meaningful.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def timeit(fn: Callable[[], object], *, repeats: int = 5, warmup: int = 1) -> dict:
    """Runs ``fn`` ``warmup`` times untimed, then ``repeats`` times; returns seconds."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return {"min": min(times), "median": statistics.median(times), "all": times}


def interleaved(cases: dict[str, Callable[[], object]], *, repeats: int = 5,
                warmup: int = 1) -> dict[str, dict]:
    """Times each case ``repeats`` times, interleaving cases round-robin."""
    for fn in cases.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(repeats):
        for name, fn in cases.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {k: {"min": min(v), "median": statistics.median(v), "all": v} for k, v in times.items()}


def table(title: str, rows: list[tuple[str, float, str]], baseline: str,
          higher_is_better: bool) -> str:
    """Formats ``(name, value, unit)`` rows with each row's ratio to ``baseline``."""
    base = {r[0]: r[1] for r in rows}[baseline]
    lines = [title, f"  {'case':<34}{'value':>14}  {'unit':<8}{'vs ' + baseline:>24}"]
    for name, value, unit in rows:
        ratio = value / base if higher_is_better else base / value
        lines.append(f"  {name:<34}{value:>14.3f}  {unit:<8}{ratio:>23.2f}x")
    return "\n".join(lines)
