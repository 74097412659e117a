"""The header and terminal tables of ``python -m hostfeed bench`` (its figure:
:mod:`hostfeed.bench._plot`)."""
from __future__ import annotations

import datetime
import math
import statistics
import os
import platform
import sys
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jaxlib
import numpy as np

from .. import __version__ as hostfeed_version
from . import _portable, _processor, _readme, _throughput, _tpu
from ._plot import PLOTTED, nothing_to_plot, plot, plottable  # noqa: F401 (the command's)
from ._markdown import call_p50, load, paired_rounds
from ._timing import AGREEMENT, balanced, paired
from ._text import fit, grid as _grid

#: Environment variables that change what the benchmark measures.
ENV_PREFIXES = ("JAX_", "XLA_", "HOSTFEED_", "OPENBLAS_", "OMP_", "CUDA_")


def header(quick: bool) -> dict[str, Any]:
    """What a reader needs to compare runs: versions, backend, machine (the processor,
    :mod:`hostfeed.bench._processor`), environment."""
    processor = _processor.describe()
    return {
        "hostfeed": hostfeed_version, "jax": jax.__version__,
        "jaxlib": getattr(jaxlib, "__version__", "?"), "numpy": np.__version__,
        "python": sys.version.split()[0], "platform": platform.platform(),
        "backend": jax.default_backend(),
        "devices": [str(d) for d in jax.devices()], "device_count": jax.device_count(),
        "cpu": processor["model"], "processor": processor, "cores": os.cpu_count(),
        "load_average": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)},
        "quick": quick,
        "started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }


def _fmt(v: float | None, digits: int = 2) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v:.{digits}f}"


def _x(v: float | None) -> str:
    """A time ratio as text (``0.42x``)."""
    return "-" if v is None or not math.isfinite(v) else f"{v:.2f}x"


#: How every ratio in the report reads (said once, at the top).
CONVENTION = ("Ratios are time ratios: a row's time (per tap, per call, per byte) divided "
              "by the named baseline's; below 1.00x is faster than it. 'best JAX' is the "
              "fastest JAX callback measured on that row.")


def _best_jax(values: dict[str, float]) -> tuple[str, float]:
    """The JAX callback with the smallest value (hostfeed's rows are compared with it)."""
    jax_only = {k: v for k, v in values.items()
                if not k.startswith(("hostfeed", "no callback", "host function")) and v}
    name = min(jax_only, key=jax_only.__getitem__)
    return name, jax_only[name]


def text(result: dict[str, Any]) -> str:
    """The whole report as terminal text, each section with time ratios to the best JAX
    callback measured in the same run."""
    h = result["header"]
    _PAIRED[0] = paired_rounds(result)
    lines = [f"hostfeed {h['hostfeed']} bench ({'quick' if h['quick'] else 'full'}): jax "
             f"{h['jax']}, jaxlib {h['jaxlib']}, numpy {h['numpy']}, Python {h['python']}",
             f"backend {h['backend']} ({h['device_count']} device(s)), "
             f"{_processor.name(h)}, "
             f"{h['cores']} cores, {load(result)}, {h['started']}"]
    if h["env"]:
        lines.append("env: " + " ".join(f"{k}={v}" for k, v in h["env"].items()))
    lines.append(CONVENTION)
    if h.get("suite") == "tpu":
        return "\n".join(fit(lines + _tpu.text(result)))
    for name, render in (("latency", _latency), ("sweep", _sweep),
                         ("throughput", _throughput.render), ("call", _call),
                         ("dispatch", _dispatch), ("backpressure", _backpressure),
                         ("eager", _eager), ("compile", _compile), ("barrier", _barrier),
                         ("timing", _timing), ("portable", _portable.render)):
        if name in result:
            lines += ["", *render(result[name])]
    lines += ["", *_readme.text(result)]
    return "\n".join(fit(lines))


#: The latency section's columns, named as the README's rows name them: "each tap" (what
#: the computation spends on each tap, p50 to max), "hand-over", "computation per tap"
#: (the loop's time until it returns, over its taps), "until every function ran".
LATENCY_COLUMNS = ["method", "each tap p50", "p99", "p99.9", "max", "hand-over p50", "p99",
                   "computation per tap", "until every function ran",
                   "each tap p50 / best JAX", "interval", "computation per tap / best JAX",
                   "interval", "until every function ran / best JAX", "interval"]


def _latency(r: dict) -> list[str]:
    methods = r["methods"]
    taps = {k: m for k, m in methods.items() if k != "hostfeed (spaced taps)"}
    # The fastest JAX callback by its median round (by its single figure in runs without).
    best, best_v = _best_jax({k: _median_of(m, "rounds_device_p50_us", "device_us")
                              if m.get("rounds_device_p50_us") else m["device_us"]["p50"]
                              for k, m in taps.items()})
    best_tap, best_tap_v = _best_jax({k: _median_of(m, "rounds_device_us",
                                                    "device_side_per_tap_us")
                                      for k, m in taps.items()})
    best_e2e, best_e2e_v = _best_jax({k: _median_of(m, "rounds_end_to_end_us",
                                                    "end_to_end_per_tap_us")
                                      for k, m in taps.items()})
    rows = []
    for k, m in methods.items():
        hv = m["handover_us"] or {}
        if k == "hostfeed (spaced taps)":  # device work between taps: only hand-over counts
            rows.append([k, "", "", "", "", _fmt(hv.get("p50")), _fmt(hv.get("p99")),
                         *[""] * 8])
            continue
        d = m["device_us"]
        e2e = m["end_to_end_per_tap_us"]
        rows.append([k, _fmt(d["p50"]), _fmt(d["p99"]), _fmt(d["p999"]), _fmt(d["max"]),
                     _fmt(hv.get("p50")), _fmt(hv.get("p99")),
                     _fmt(m["device_side_per_tap_us"]), _fmt(e2e),
                     *_vs(m, taps[best], "rounds_device_p50_us", d["p50"] / best_v),
                     *_vs(m, taps[best_tap], "rounds_device_us",
                          m["device_side_per_tap_us"] / best_tap_v),
                     *_vs(m, taps[best_e2e], "rounds_end_to_end_us", e2e / best_e2e_v)])
    rounds = r.get("rounds")
    return [f"per-tap latency, {r['taps']} taps of {r['payload']} in a loop (us). each tap: "
            f"what the computation spends on each tap; hand-over: queued -> host function "
            f"starts (behind the taps queued before it, except spaced taps); computation per "
            f"tap: the loop's time until it returns / taps; until every function ran: the "
            f"loop's time until every tap's function ran / taps (the fastest of "
            f"{rounds or 'the'} rounds; ratios: {_rounds_note()}). best JAX: {best} "
            f"(each tap p50), {best_tap} (computation per tap), {best_e2e} (until every "
            f"function ran)",
            *_grid(LATENCY_COLUMNS, rows),
            *_tap_floors(r)]


def _tap_floors(r: dict) -> list[str]:
    floors = r.get("floors")
    hf = r["methods"].get("hostfeed")
    if not floors or not hf:
        return []
    e2e, xla, npy = hf["end_to_end_per_tap_us"], floors["xla_custom_call"], floors["numpy"]
    return [f"  floors per tap: XLA calling a custom call that does nothing, in the same "
            f"loop {xla:.2f} us; numpy (copy the bytes, call the function) {npy:.2f} us. "
            f"hostfeed until every function ran {e2e:.2f} us = {_x(e2e / npy)} the numpy "
            f"floor; without XLA's own share {_x(max(e2e - xla, 0.0) / npy)}"]


def _sweep(r: dict) -> list[str]:
    methods = r["methods"]
    rows = []
    for i, size in enumerate(r["sizes"]):
        row = {m: methods[m][i] for m in methods}
        gbs = {m: v["gb_per_s"] for m, v in row.items()}
        best, best_v = _best_jax({m: 1 / v for m, v in gbs.items() if not m.startswith("numpy")})
        two = gbs.get("numpy copy, 2 buffers")  # absent from runs before it was measured
        # Time ratios per round: the floor's GB/s over hostfeed's.
        two_rounds = (round_ratios(row["numpy copy, 2 buffers"], row["hostfeed"],
                                   "rounds_gb_per_s") if two else [])
        rows.append([str(size), *[f"{v['gb_per_s']:.3g}" for v in row.values()], best,
                     _x(1 / (gbs["hostfeed"] * best_v)),
                     _x(gbs["numpy copy"] / gbs["hostfeed"]),
                     *(_cells(two_rounds, two / gbs["hostfeed"]) if two else ())])
    two_col = (["hostfeed / 2 buffers", "interval"] if "numpy copy, 2 buffers" in methods
               else [])
    return ["payload sweep: GB/s until every function ran (taps of each size in a loop); "
            "hostfeed's time per byte over the best JAX callback's and over "
            "the floor (a numpy copy of the same bytes passed to the same Python function; "
            "'2 buffers': copying alternately into two, the fewest an asynchronous tap "
            "can use: one is filled while the previous one's function runs; the fastest "
            f"of {len(methods['hostfeed'][0].get('rounds_gb_per_s') or [1])} rounds; "
            f"against 2 buffers, {_rounds_note()})",
            *_grid(["bytes", *methods, "best JAX", "hostfeed / best JAX",
                    "hostfeed / numpy copy", *two_col], rows)]


def _call_rows(methods: dict) -> tuple[str, list[list[str]]]:
    best, best_v = _best_jax({k: _median_of(m, "rounds_p50_us", "p50_us")
                              if m.get("rounds_p50_us") else call_p50(m)
                              for k, m in methods.items()})
    rows = [[k, _fmt(call_p50(m)), _fmt(m["round_trip_us"]["p99"]),
             _fmt(m["round_trip_us"]["p999"]), _fmt(m["round_trip_us"]["max"]),
             _fmt(m["per_call_us"]),
             *_vs(m, methods[best], "rounds_p50_us", call_p50(m) / best_v)]
            for k, m in methods.items()]
    return best, rows


def _call(r: dict) -> list[str]:
    header = ["method", "p50", "p99", "p99.9", "max", "per call", "p50 / best JAX",
              "interval (each round's p50)"]
    best, rows = _call_rows(r["methods"])
    rounds = len(r["methods"]["hostfeed call"].get("rounds_p50_us") or [])
    out = [f"call round trip, {r['calls']} calls float32[4] -> float32[4] in a loop (us; "
           f"between host function starts; p50: the median of the fastest of "
           f"{rounds or 'the'} rounds, the tail over all; ratios: {_rounds_note()}); host "
           f"function alone: the floor. best JAX: {best}", *_grid(header, rows)]
    if "loaded" in r:
        lr = r["loaded"]
        best, rows = _call_rows(lr["methods"])
        out += [f"  every core busy ({lr['busy_processes']} busy processes, "
                f"{lr['calls']} calls). best JAX: {best}", *_grid(header, rows)]
    return out


#: Whether the result being rendered pairs its rounds (:func:`_markdown.paired_rounds`):
#: set by :func:`text` for each result (a run from before keeps its published figures:
#: each method's fastest round, and a ratio's range over the rounds).
_PAIRED = [True]


def _median_of(m: dict, key: str, single: str) -> float:
    """A method's median over its rounds (``m[key]``), or its single figure ``m[single]``
    (also for a run from before the rounds were paired)."""
    rounds = m.get(key)
    return statistics.median(rounds) if rounds and _PAIRED[0] else m[single]


def _vs(a: dict, b: dict, key: str, fallback: float,
        center: Callable[[Sequence[float]], float] | None = None) -> tuple[str, str]:
    """``a``'s time over ``b``'s: the median of the rounds' ratios (``key``: each round's
    figure) and the interval it lies in ('~' after it: noisy), or without rounds the ratio
    ``fallback`` and '-'; for a run from before the rounds were paired, ``fallback`` and
    the ratio's range over the rounds. ``center``: the ratio of the rounds' ratios
    instead of their median (:func:`~hostfeed.bench._timing.balanced` for rounds whose
    order alternates)."""
    return _cells(round_ratios(a, b, key), fallback, center)


def _cells(ratios: list[float], fallback: float,
           center: Callable[[Sequence[float]], float] | None = None) -> tuple[str, str]:
    """A ratio and its interval from each round's ratio (see :func:`_vs`)."""
    if not ratios:
        return _x(fallback), "-"
    if not _PAIRED[0]:
        return _x(fallback), f"{min(ratios):.2f}-{max(ratios):.2f}x"
    p = paired(ratios)
    return _x(center(ratios) if center else p.median), p.spread()


def _rounds_note() -> str:
    """How a ratio beside its interval reads (in each section's title)."""
    if not _PAIRED[0]:
        return "the fastest rounds' ratio, and its range over the rounds"
    return (f"the median of the rounds' ratios, and the interval it lies in ('~': wider than "
            f"{AGREEMENT:.0%}, two runs may differ by more)")


def round_ratios(a: dict, b: dict, key: str = "rounds_us") -> list[float]:
    """``a``'s time over ``b``'s in each round both were measured in (``a[key]``, the
    interleaved repeats of a section), or [] when the result has no rounds.

    Example:
        >>> round_ratios({"rounds_us": [2.0, 3.0]}, {"rounds_us": [1.0, 2.0]})
        [2.0, 1.5]
    """
    ra, rb = a.get(key) or [], b.get(key) or []
    return [x / y for x, y in zip(ra, rb) if y]


def _dispatch(r: dict) -> list[str]:
    methods = {k: v for k, v in r.items() if k != "calls"}
    med = {k: _median_of(v, "rounds_us", "us") for k, v in methods.items()}
    best, best_v = _best_jax(med)
    none = methods["no callback"]
    rows = [[k, _fmt(med[k]), *_vs(v, none, "rounds_us", med[k] / med["no callback"]),
             *_vs(v, methods[best], "rounds_us", med[k] / best_v)]
            for k, v in methods.items()]
    rounds = len(none.get("rounds_us") or [])
    return [f"dispatch of a small jitted function (v + 1 on float32[4]) with one callback, "
            f"waited for, {r['calls']} calls a round (us per call: the median of "
            f"{rounds or 'the'} rounds; ratios: {_rounds_note()}). best JAX: {best}",
            *_grid(["function", "per call", "/ no callback", "interval", "/ best JAX",
                    "interval"], rows)]


def _backpressure(r: dict) -> list[str]:
    out = [f"back-pressure: {r['taps']} taps of {r['tap_bytes']} B, host function busy "
           f"{r['host_us_per_tap']:.0f} us each (s; MiB)",
           f"  {'method, bound':<34}{'device':>9}{'end to end':>12}{'blocked':>9}"
           f"{'peak queued':>13}"]
    for run in r["runs"]:
        bound = "" if run["bound_bytes"] is None else f", bound {run['bound_bytes']} B"
        peak = (None if run["peak_queued_bytes"] is None
                else run["peak_queued_bytes"] / 2**20)
        out.append(f"  {run['method'] + bound:<34}{_fmt(run['device_s'], 3):>9}"
                   f"{_fmt(run['end_to_end_s'], 3):>12}{_fmt(run['blocked_s'], 3):>9}"
                   f"{_fmt(peak, 3):>13}")
    return out


def _eager(r: dict) -> list[str]:
    rows_in = {k: v for k, v in r.items() if isinstance(v, dict)}
    per = {k: v["per_tap_us"] for k, v in rows_in.items()}
    best, best_v = _best_jax({k: v for k, v in per.items() if "fresh" not in k})
    hff, dbgf = per["hostfeed, fresh function"], per["debug.callback, fresh function"]
    base = {k: rows_in[best] if "fresh" not in k else rows_in["debug.callback, fresh function"]
            for k in rows_in}
    rounds = len(rows_in["hostfeed"].get("rounds_us") or [])
    return [f"eager tap until its host function ran, {r['taps']} a round (us per tap: the "
            f"median of {rounds or 'the'} rounds; ratios: {_rounds_note()}, but the ratio "
            f"the geometric mean of the medians of the two orders' rounds; a fresh "
            f"function's against debug.callback's with a fresh function)",
            *_grid(["method", "per tap", "/ best JAX", "interval"],
                   [[k, _fmt(v), *_vs(rows_in[k], base[k], "rounds_us",
                                      v / (best_v if "fresh" not in k else dbgf), balanced)]
                    for k, v in per.items()]),
            f"  best JAX: {best}; fresh function each call: hostfeed / debug.callback "
            f"{_x(hff / dbgf)}; over those fresh functions the process's memory (RSS) grew "
            f"{r['rss_growth_mb']:.1f} MB and hostfeed's registered consumers changed by "
            f"{r['registered_consumers_growth']:+d} (a fresh function's is released with it)"]


def _compile(r: dict) -> list[str]:
    rows_in = {k: v for k, v in r.items() if k != "taps"}
    secs = {k: _median_of(v, "rounds_seconds", "seconds") for k, v in rows_in.items()}
    best, best_v = _best_jax({k: v for k, v in secs.items() if k != "no callbacks"})
    used = secs.get("hostfeed")
    ignored = secs.get("hostfeed, result ignored")
    tail = (f"; result ignored / used: {_x(ignored / used)}" if used and ignored else "")
    return [f"compile a function with {r['taps']} taps separated by arithmetic (s; trace + "
            f"lower + compile; the median round; ratios: {_rounds_note()}). best JAX: "
            f"{best}{tail}",
            *_grid(["function", "seconds", "/ best JAX", "interval"],
                   [[k, _fmt(v), *_vs(rows_in[k], rows_in[best], "rounds_seconds",
                                      v / best_v)] for k, v in secs.items()])]


def _barrier(r: dict) -> list[str]:
    hfr, jxr = r["hostfeed barrier_wait"], r["jax.effects_barrier"]
    hf, jx = _median_of(hfr, "rounds_us", "us"), _median_of(jxr, "rounds_us", "us")
    ratio, interval = _vs(hfr, jxr, "rounds_us", hf / jx)
    lines = [f"idle barrier ({r['calls']} calls a round, the median round): hostfeed "
             f"barrier_wait {hf:.2f} us, jax.effects_barrier {jx:.2f} us ({ratio}, interval "
             f"{interval})"]
    bare = r.get("hostfeed barrier_wait, no device to mark")
    if bare is not None:
        lines[0] += f"; marking {r.get('marked devices', 0)} fast-dispatch device(s)"
        lines.append(f"  with no fast-dispatch device to mark (as HOSTFEED_FAST_DISPATCH=0): "
                     f"{bare['us']:.2f} us ({_x(bare['us'] / jx)} jax.effects_barrier)")
    trivial = next((v for k, v in r.items() if k.startswith("one dispatch of a trivial")), None)
    if trivial is not None:
        t = _median_of(trivial, "rounds_us", "us")
        ratio, interval = _vs(hfr, trivial, "rounds_us", hf / t)
        lines.append(f"  one dispatch of a trivial jitted function (the marker's floor): "
                     f"{t:.2f} us; barrier_wait {ratio} of it (interval {interval})")
    return lines


def _timing(r: dict) -> list[str]:
    return [f"cost of the timing histograms (small taps, device side): on "
            f"{r['per_tap_us_timing_on']:.3f} us, off {r['per_tap_us_timing_off']:.3f} us "
            f"per tap ({r['cost_us_per_tap']:+.3f} us); not tracing with jax.profiler: "
            f"{r.get('profiler_check_us_per_batch', float('nan')) * 1e3:.0f} ns per batch "
            f"(one check; while tracing, one trace event per callback)"]
