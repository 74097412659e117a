"""The header, terminal tables and figure of ``python -m hostfeed bench``."""
from __future__ import annotations

import datetime
import math
import os
import platform
import sys
from typing import Any

import jax
import jaxlib
import numpy as np

from .. import __version__ as hostfeed_version
from . import _portable

#: Environment variables that change what the benchmark measures.
ENV_PREFIXES = ("JAX_", "XLA_", "HOSTFEED_", "OPENBLAS_", "OMP_", "CUDA_")


def header(quick: bool) -> dict[str, Any]:
    """What a reader needs to compare runs: versions, backend, machine, environment."""
    return {
        "hostfeed": hostfeed_version, "jax": jax.__version__,
        "jaxlib": getattr(jaxlib, "__version__", "?"), "numpy": np.__version__,
        "python": sys.version.split()[0], "platform": platform.platform(),
        "backend": jax.default_backend(),
        "devices": [str(d) for d in jax.devices()], "device_count": jax.device_count(),
        "cpu": _cpu_model(), "cores": os.cpu_count(),
        "load_average": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)},
        "quick": quick,
        "started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _fmt(v: float | None, digits: int = 2) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v:.{digits}f}"


def _best_jax(values: dict[str, float]) -> tuple[str, float]:
    """The JAX callback with the smallest value (hostfeed's rows are compared with it)."""
    jax_only = {k: v for k, v in values.items() if not k.startswith("hostfeed") and v}
    name = min(jax_only, key=jax_only.__getitem__)
    return name, jax_only[name]


def text(result: dict[str, Any]) -> str:
    """The whole report as terminal text, each section with ratios to the best JAX
    callback measured in the same run."""
    h = result["header"]
    lines = [f"hostfeed {h['hostfeed']} bench ({'quick' if h['quick'] else 'full'}): jax "
             f"{h['jax']}, jaxlib {h['jaxlib']}, numpy {h['numpy']}, Python {h['python']}",
             f"backend {h['backend']} ({h['device_count']} device(s)), {h['cpu']}, "
             f"{h['cores']} cores, load {_fmt(h['load_average'])}, {h['started']}"]
    if h["env"]:
        lines.append("env: " + " ".join(f"{k}={v}" for k, v in h["env"].items()))
    for name, render in (("latency", _latency), ("sweep", _sweep), ("call", _call),
                         ("backpressure", _backpressure), ("eager", _eager),
                         ("compile", _compile), ("barrier", _barrier),
                         ("timing", _timing), ("portable", _portable.render)):
        if name in result:
            lines += ["", *render(result[name])]
    return "\n".join(lines)


def _latency(r: dict) -> list[str]:
    methods = r["methods"]
    best, best_v = _best_jax({k: m["device_us"]["p50"] for k, m in methods.items()})
    out = [f"per-tap latency, {r['taps']} taps of {r['payload']} in a loop (us; device side: "
           f"what the computation spends per tap; hand-over: queued -> host takes it)",
           f"  {'method':<22}{'p50':>9}{'p99':>9}{'p99.9':>9}{'max':>10}  {'hand-over p50':>13}"
           f"{'p99':>9}  {'per tap':>8}  {'p50 vs ' + best:>26}"]
    for k, m in methods.items():
        if k == "hostfeed (spaced taps)":  # device work between taps: only hand-over counts
            hv = m["handover_us"]
            out.append(f"  {k:<22}{'':>37}  {_fmt(hv['p50']):>13}{_fmt(hv['p99']):>9}")
            continue
        d, hv = m["device_us"], m["handover_us"] or {}
        out.append(f"  {k:<22}{_fmt(d['p50']):>9}{_fmt(d['p99']):>9}{_fmt(d['p999']):>9}"
                   f"{_fmt(d['max']):>10}  {_fmt(hv.get('p50')):>13}{_fmt(hv.get('p99')):>9}"
                   f"  {_fmt(m['device_side_per_tap_us']):>8}  {best_v / d['p50']:>25.1f}x")
    return out


def _sweep(r: dict) -> list[str]:
    methods = r["methods"]
    out = ["payload sweep: GB/s (taps/s), end to end; ratio of hostfeed to the best JAX "
           "callback and to a numpy copy of the same bytes",
           f"  {'bytes':>10}" + "".join(f"{m:>22}" for m in methods)
           + f"{'hostfeed/best JAX':>19}{'hostfeed/numpy':>16}"]
    for i, size in enumerate(r["sizes"]):
        row = {m: methods[m][i] for m in methods}
        gbs = {m: v["gb_per_s"] for m, v in row.items()}
        best = max(v for m, v in gbs.items() if m not in ("hostfeed", "numpy copy"))
        out.append(f"  {size:>10}" + "".join(
            f"{_fmt(v['gb_per_s'], 3):>10} ({v['taps_per_s']:>8.0f})" for v in row.values())
            + f"{gbs['hostfeed'] / best:>18.1f}x{gbs['hostfeed'] / gbs['numpy copy']:>15.2f}x")
    return out


def _call(r: dict) -> list[str]:
    methods = r["methods"]
    best, best_v = _best_jax({k: m["round_trip_us"]["p50"] for k, m in methods.items()})
    out = [f"call round trip, {r['calls']} calls float32[4] -> float32[4] in a loop (us)",
           f"  {'method':<22}{'p50':>9}{'p99':>9}{'p99.9':>9}{'max':>10}{'p50 vs ' + best:>26}"]
    for k, m in methods.items():
        d = m["round_trip_us"]
        out.append(f"  {k:<22}{_fmt(d['p50']):>9}{_fmt(d['p99']):>9}{_fmt(d['p999']):>9}"
                   f"{_fmt(d['max']):>10}{best_v / d['p50']:>25.1f}x")
    return out


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
    hf, dbg = r["hostfeed"]["per_tap_us"], r["debug.callback"]["per_tap_us"]
    hff, dbgf = (r["hostfeed, fresh function"]["per_tap_us"],
                 r["debug.callback, fresh function"]["per_tap_us"])
    return [f"eager tap until its host function ran, {r['taps']} per repeat (us per tap)",
            f"  hostfeed {hf:.1f} vs debug.callback {dbg:.1f}: {hf / dbg:.2f}x; fresh "
            f"function each call {hff:.1f} vs {dbgf:.1f}: {hff / dbgf:.2f}x; RSS grew "
            f"{r['rss_growth_mb']:.1f} MB, registered consumers "
            f"{r['registered_consumers_growth']:+d}"]


def _compile(r: dict) -> list[str]:
    io_s = r["io_callback(ordered)"]["seconds"]
    return [f"compile a function with {r['taps']} taps separated by arithmetic (s)",
            *(f"  {k:<28}{v['seconds']:>8.2f}{v['seconds'] / io_s:>8.2f}x io_callback(ordered)"
              for k, v in r.items() if k != "taps")]


def _barrier(r: dict) -> list[str]:
    hf, jx = r["hostfeed barrier_wait"]["us"], r["jax.effects_barrier"]["us"]
    return [f"idle barrier ({r['calls']} calls): hostfeed barrier_wait {hf:.2f} us, "
            f"jax.effects_barrier {jx:.2f} us ({hf / jx:.2f}x)"]


def _timing(r: dict) -> list[str]:
    return [f"cost of the timing histograms (small taps, device side): on "
            f"{r['per_tap_us_timing_on']:.3f} us, off {r['per_tap_us_timing_off']:.3f} us "
            f"per tap ({r['cost_us_per_tap']:+.3f} us)"]


def plot(result: dict[str, Any], path: str) -> None:
    """One figure: per-tap latency CDFs (log x), GB/s against payload size (log-log) and
    percentiles per method."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("--plot needs matplotlib: pip install 'hostfeed[bench]'") from None
    fig, axes = plt.subplots(1, 3, figsize=(18, 5.5))
    h = result["header"]
    fig.suptitle(f"hostfeed {h['hostfeed']} vs JAX callbacks (jax {h['jax']}, "
                 f"{h['backend']}, {h['cores']} cores)")
    ax = axes[0]
    for k, m in result.get("latency", {}).get("methods", {}).items():
        pts = m["device_cdf_us"]
        if k != "hostfeed (spaced taps)":
            ax.plot([p[0] for p in pts], [p[1] for p in pts], label=f"{k}: device side",
                    drawstyle="steps-post")
        if m.get("handover_cdf_us"):
            pts = m["handover_cdf_us"]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "--", label=f"{k}: hand-over",
                    drawstyle="steps-post")
    ax.set_xscale("log")
    ax.set(title="per-tap latency (CDF)", xlabel="microseconds", ylabel="fraction of taps")
    ax.legend(fontsize=7)
    ax = axes[1]
    sw = result.get("sweep")
    if sw:
        for k, pts in sw["methods"].items():
            ax.plot([p["bytes"] for p in pts], [p["gb_per_s"] for p in pts], "o-", label=k)
        ax.set_xscale("log")
        ax.set_yscale("log")
    ax.set(title="throughput by payload", xlabel="bytes per tap", ylabel="GB/s")
    ax.legend(fontsize=7)
    ax = axes[2]
    lat = {k: v for k, v in result.get("latency", {}).get("methods", {}).items()
           if k != "hostfeed (spaced taps)"}
    names = list(lat)
    for j, q in enumerate(("p50", "p99", "p999")):
        ax.bar([i + (j - 1) * 0.27 for i in range(len(names))],
               [lat[k]["device_us"][q] for k in names], width=0.27, label=q)
    ax.set_xticks(range(len(names)), names, rotation=20, fontsize=8)
    ax.set_yscale("log")
    ax.set(title="per-tap device-side cost", ylabel="microseconds")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
