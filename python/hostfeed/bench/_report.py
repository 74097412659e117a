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


def _grid(header: list[str], rows: list[list[str]], first_left: bool = True) -> list[str]:
    """Rows of cells as aligned columns (each as wide as its widest cell, two spaces
    apart), so that no header runs into the next."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return "  " + "  ".join(c.ljust(w) if i == 0 and first_left else c.rjust(w)
                                for i, (c, w) in enumerate(zip(cells, widths)))
    return [line(header), *[line(r) for r in rows]]


def text(result: dict[str, Any]) -> str:
    """The whole report as terminal text, each section with time ratios to the best JAX
    callback measured in the same run."""
    h = result["header"]
    lines = [f"hostfeed {h['hostfeed']} bench ({'quick' if h['quick'] else 'full'}): jax "
             f"{h['jax']}, jaxlib {h['jaxlib']}, numpy {h['numpy']}, Python {h['python']}",
             f"backend {h['backend']} ({h['device_count']} device(s)), {h['cpu']}, "
             f"{h['cores']} cores, load {_fmt(h['load_average'])}, {h['started']}"]
    if h["env"]:
        lines.append("env: " + " ".join(f"{k}={v}" for k, v in h["env"].items()))
    lines.append(CONVENTION)
    for name, render in (("latency", _latency), ("sweep", _sweep), ("call", _call),
                         ("dispatch", _dispatch), ("backpressure", _backpressure),
                         ("eager", _eager), ("compile", _compile), ("barrier", _barrier),
                         ("timing", _timing), ("portable", _portable.render)):
        if name in result:
            lines += ["", *render(result[name])]
    return "\n".join(lines)


def _latency(r: dict) -> list[str]:
    methods = r["methods"]
    best, best_v = _best_jax({k: m["device_us"]["p50"] for k, m in methods.items()
                              if k != "hostfeed (spaced taps)"})
    rows = []
    for k, m in methods.items():
        hv = m["handover_us"] or {}
        if k == "hostfeed (spaced taps)":  # device work between taps: only hand-over counts
            rows.append([k, "", "", "", "", _fmt(hv.get("p50")), _fmt(hv.get("p99")), "", "",
                         ""])
            continue
        d = m["device_us"]
        rows.append([k, _fmt(d["p50"]), _fmt(d["p99"]), _fmt(d["p999"]), _fmt(d["max"]),
                     _fmt(hv.get("p50")), _fmt(hv.get("p99")),
                     _fmt(m["device_side_per_tap_us"]), _fmt(m["end_to_end_per_tap_us"]),
                     _x(d["p50"] / best_v)])
    return [f"per-tap latency, {r['taps']} taps of {r['payload']} in a loop (us). device: "
            f"what the computation spends per tap; hand-over: queued -> host function "
            f"starts (behind the taps queued before it, except spaced taps); per tap: the "
            f"loop's time / taps, until it returns and until every callback ran. best JAX: "
            f"{best}",
            *_grid(["method", "device p50", "p99", "p99.9", "max", "hand-over p50", "p99",
                    "per tap", "end to end", "p50 / best JAX"], rows),
            *_tap_floors(r)]


def _tap_floors(r: dict) -> list[str]:
    floors = r.get("floors")
    hf = r["methods"].get("hostfeed")
    if not floors or not hf:
        return []
    e2e, xla, npy = hf["end_to_end_per_tap_us"], floors["xla_custom_call"], floors["numpy"]
    return [f"  floors per tap: XLA calling a custom call that does nothing, in the same "
            f"loop {xla:.2f} us; numpy (copy the bytes, call the function) {npy:.2f} us. "
            f"hostfeed end to end {e2e:.2f} us = {_x(e2e / npy)} the numpy floor; "
            f"without XLA's own share {_x(max(e2e - xla, 0.0) / npy)}"]


def _sweep(r: dict) -> list[str]:
    methods = r["methods"]
    rows = []
    for i, size in enumerate(r["sizes"]):
        row = {m: methods[m][i] for m in methods}
        gbs = {m: v["gb_per_s"] for m, v in row.items()}
        best, best_v = _best_jax({m: 1 / v for m, v in gbs.items() if not m.startswith("numpy")})
        two = gbs.get("numpy copy, 2 buffers")  # absent from runs before it was measured
        rows.append([str(size), *[f"{v['gb_per_s']:.3g}" for v in row.values()], best,
                     _x(1 / (gbs["hostfeed"] * best_v)),
                     _x(gbs["numpy copy"] / gbs["hostfeed"]),
                     *([_x(two / gbs["hostfeed"])] if two else [])])
    two_col = ["hostfeed / 2 buffers"] if "numpy copy, 2 buffers" in methods else []
    return ["payload sweep: GB/s end to end (taps of each size in a loop until every "
            "callback ran); hostfeed's time per byte over the best JAX callback's and over "
            "the floor (a numpy copy of the same bytes passed to the same Python function; "
            "'2 buffers': copying alternately into two, the fewest an asynchronous tap "
            "can use: one is filled while the previous one's function runs)",
            *_grid(["bytes", *methods, "best JAX", "hostfeed / best JAX",
                    "hostfeed / numpy copy", *two_col], rows)]


def _call_rows(methods: dict) -> tuple[str, list[list[str]]]:
    best, best_v = _best_jax({k: m["round_trip_us"]["p50"] for k, m in methods.items()})
    rows = [[k, _fmt(m["round_trip_us"]["p50"]), _fmt(m["round_trip_us"]["p99"]),
             _fmt(m["round_trip_us"]["p999"]), _fmt(m["round_trip_us"]["max"]),
             _fmt(m["per_call_us"]), _x(m["round_trip_us"]["p50"] / best_v)]
            for k, m in methods.items()]
    return best, rows


def _call(r: dict) -> list[str]:
    header = ["method", "p50", "p99", "p99.9", "max", "per call", "p50 / best JAX"]
    best, rows = _call_rows(r["methods"])
    out = [f"call round trip, {r['calls']} calls float32[4] -> float32[4] in a loop (us; "
           f"between host function starts); host function alone: the floor. best JAX: "
           f"{best}", *_grid(header, rows)]
    if "loaded" in r:
        lr = r["loaded"]
        best, rows = _call_rows(lr["methods"])
        out += [f"  with the machine loaded ({lr['busy_processes']} busy processes, "
                f"{lr['calls']} calls). best JAX: {best}", *_grid(header, rows)]
    return out


def _dispatch(r: dict) -> list[str]:
    methods = {k: v for k, v in r.items() if k != "calls"}
    best, best_v = _best_jax({k: v["us"] for k, v in methods.items()})
    none = methods["no callback"]["us"]
    rows = [[k, _fmt(v["us"]), _x(v["us"] / none), _x(v["us"] / best_v)]
            for k, v in methods.items()]
    return [f"dispatch of a small jitted function (v + 1 on float32[4]) with one callback, "
            f"waited for, {r['calls']} calls (us per call). best JAX: {best}",
            *_grid(["function", "per call", "/ no callback", "/ best JAX"], rows)]


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
    per = {k: v["per_tap_us"] for k, v in r.items() if isinstance(v, dict)}
    best, best_v = _best_jax({k: v for k, v in per.items() if "fresh" not in k})
    hff, dbgf = per["hostfeed, fresh function"], per["debug.callback, fresh function"]
    return [f"eager tap until its host function ran, {r['taps']} per repeat (us per tap)",
            *_grid(["method", "per tap", "/ best JAX"],
                   [[k, _fmt(v), _x(v / best_v) if "fresh" not in k else _x(v / dbgf)]
                    for k, v in per.items()]),
            f"  best JAX: {best}; fresh function each call: hostfeed / debug.callback "
            f"{_x(hff / dbgf)}; RSS grew {r['rss_growth_mb']:.1f} MB, registered consumers "
            f"{r['registered_consumers_growth']:+d}"]


def _compile(r: dict) -> list[str]:
    secs = {k: v["seconds"] for k, v in r.items() if k != "taps"}
    best, best_v = _best_jax({k: v for k, v in secs.items() if k != "no callbacks"})
    used = secs.get("hostfeed")
    ignored = secs.get("hostfeed, result ignored")
    tail = (f"; result ignored / used: {_x(ignored / used)}" if used and ignored else "")
    return [f"compile a function with {r['taps']} taps separated by arithmetic (s; trace + "
            f"lower + compile). best JAX: {best}{tail}",
            *_grid(["function", "seconds", "/ best JAX"],
                   [[k, _fmt(v), _x(v / best_v)] for k, v in secs.items()])]


def _barrier(r: dict) -> list[str]:
    hf, jx = r["hostfeed barrier_wait"]["us"], r["jax.effects_barrier"]["us"]
    lines = [f"idle barrier ({r['calls']} calls): hostfeed barrier_wait {hf:.2f} us, "
             f"jax.effects_barrier {jx:.2f} us ({_x(hf / jx)})"]
    bare = r.get("hostfeed barrier_wait, no device to mark")
    if bare is not None:
        lines[0] += f"; marking {r.get('marked devices', 0)} fast-dispatch device(s)"
        lines.append(f"  with no fast-dispatch device to mark (as HOSTFEED_FAST_DISPATCH=0): "
                     f"{bare['us']:.2f} us ({_x(bare['us'] / jx)} jax.effects_barrier)")
    return lines


def _timing(r: dict) -> list[str]:
    return [f"cost of the timing histograms (small taps, device side): on "
            f"{r['per_tap_us_timing_on']:.3f} us, off {r['per_tap_us_timing_off']:.3f} us "
            f"per tap ({r['cost_us_per_tap']:+.3f} us); not tracing with jax.profiler: "
            f"{r.get('profiler_check_us_per_batch', float('nan')) * 1e3:.0f} ns per batch "
            f"(one check; while tracing, one trace event per callback)"]


#: One colour per method, the same in every panel of the figure.
COLOURS = {"hostfeed": "#d62728", "hostfeed call": "#d62728", "hostfeed id_tap": "#d62728",
           "hostfeed (spaced taps)": "#ff9896", "buffer_callback": "#1f77b4",
           "io_callback(ordered)": "#2ca02c", "io_callback": "#98df8a",
           "debug.callback": "#9467bd", "pure_callback": "#8c564b", "numpy copy": "#7f7f7f",
           "numpy copy, 2 buffers": "#bcbd22",
           "no callback": "#7f7f7f", "hostfeed id_tap, compiled ahead of time": "#ff7f0e"}


def _colour(name: str) -> str:
    return COLOURS.get(name, "#17becf")


def plot(result: dict[str, Any], path: str) -> None:
    """One figure: per-tap latency CDFs (log x), GB/s against payload size (log-log) and
    the dispatch cost per method; a method has one colour in every panel, and the legends
    sit below the panels."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("--plot needs matplotlib: pip install matplotlib") from None
    fig, axes = plt.subplots(1, 3, figsize=(19, 7.5))
    h = result["header"]
    fig.suptitle(f"hostfeed {h['hostfeed']} vs JAX callbacks (jax {h['jax']}, "
                 f"{h['backend']}, {h['cores']} cores)")
    ax = axes[0]
    for k, m in result.get("latency", {}).get("methods", {}).items():
        pts = m["device_cdf_us"]
        if k != "hostfeed (spaced taps)":
            ax.plot([p[0] for p in pts], [p[1] for p in pts], color=_colour(k),
                    label=f"{k}: device side per tap", drawstyle="steps-post")
        if m.get("handover_cdf_us"):
            pts = m["handover_cdf_us"]
            what = ("hand-over, idle receiver" if k == "hostfeed (spaced taps)" else
                    "hand-over under backlog (waits behind the taps queued before it; "
                    "the device does not wait)")
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "--", color=_colour(k),
                    label=f"{k}: {what}", drawstyle="steps-post")
    ax.set_xscale("log")
    ax.set(title="per-tap latency (CDF)", xlabel="microseconds", ylabel="fraction of taps")
    _legend_below(ax)
    ax = axes[1]
    sw = result.get("sweep")
    if sw:
        for k, pts in sw["methods"].items():
            ax.plot([p["bytes"] for p in pts], [p["gb_per_s"] for p in pts], marker="o",
                    color=_colour(k), label=k, ls=":" if k.startswith("numpy") else "-")
        ax.set_xscale("log")
        ax.set_yscale("log")
    ax.set(title="throughput by payload, end to end", xlabel="bytes per tap", ylabel="GB/s")
    _legend_below(ax)
    ax = axes[2]
    disp = {k: v["us"] for k, v in result.get("dispatch", {}).items() if k != "calls"}
    if disp:
        names = list(disp)
        ax.barh(range(len(names)), [disp[k] for k in names],
                color=[_colour(k) for k in names])
        ax.set_yticks(range(len(names)), names, fontsize=8)
        ax.invert_yaxis()
        ax.set_xscale("log")
        ax.set(title="dispatch: small jitted function, one callback, waited for",
               xlabel="microseconds per call")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _legend_below(ax: Any) -> None:
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=1,
              frameon=False)
