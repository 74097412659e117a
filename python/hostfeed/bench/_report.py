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
from . import _portable, _readme, _tpu
from ._markdown import call_p50, load
from ._text import fit, grid as _grid

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


def text(result: dict[str, Any]) -> str:
    """The whole report as terminal text, each section with time ratios to the best JAX
    callback measured in the same run."""
    h = result["header"]
    lines = [f"hostfeed {h['hostfeed']} bench ({'quick' if h['quick'] else 'full'}): jax "
             f"{h['jax']}, jaxlib {h['jaxlib']}, numpy {h['numpy']}, Python {h['python']}",
             f"backend {h['backend']} ({h['device_count']} device(s)), {h['cpu']}, "
             f"{h['cores']} cores, {load(result)}, {h['started']}"]
    if h["env"]:
        lines.append("env: " + " ".join(f"{k}={v}" for k, v in h["env"].items()))
    lines.append(CONVENTION)
    if h.get("suite") == "tpu":
        return "\n".join(fit(lines + _tpu.text(result)))
    for name, render in (("latency", _latency), ("sweep", _sweep), ("call", _call),
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
                   "each tap p50 / best JAX", "computation per tap / best JAX", "range",
                   "until every function ran / best JAX", "range"]


def _latency(r: dict) -> list[str]:
    methods = r["methods"]
    taps = {k: m for k, m in methods.items() if k != "hostfeed (spaced taps)"}
    best, best_v = _best_jax({k: m["device_us"]["p50"] for k, m in taps.items()})
    best_tap, best_tap_v = _best_jax({k: m["device_side_per_tap_us"] for k, m in taps.items()})
    best_e2e, best_e2e_v = _best_jax({k: m["end_to_end_per_tap_us"] for k, m in taps.items()})
    rows = []
    for k, m in methods.items():
        hv = m["handover_us"] or {}
        if k == "hostfeed (spaced taps)":  # device work between taps: only hand-over counts
            rows.append([k, "", "", "", "", _fmt(hv.get("p50")), _fmt(hv.get("p99")),
                         *[""] * 7])
            continue
        d = m["device_us"]
        e2e = m["end_to_end_per_tap_us"]
        rows.append([k, _fmt(d["p50"]), _fmt(d["p99"]), _fmt(d["p999"]), _fmt(d["max"]),
                     _fmt(hv.get("p50")), _fmt(hv.get("p99")),
                     _fmt(m["device_side_per_tap_us"]), _fmt(e2e),
                     _x(d["p50"] / best_v), _x(m["device_side_per_tap_us"] / best_tap_v),
                     _spread(round_ratios(m, taps[best_tap], "rounds_device_us")),
                     _x(e2e / best_e2e_v),
                     _spread(round_ratios(m, taps[best_e2e], "rounds_end_to_end_us"))])
    rounds = r.get("rounds")
    return [f"per-tap latency, {r['taps']} taps of {r['payload']} in a loop (us). each tap: "
            f"what the computation spends on each tap; hand-over: queued -> host function "
            f"starts (behind the taps queued before it, except spaced taps); computation per "
            f"tap: the loop's time until it returns / taps; until every function ran: the "
            f"loop's time until every tap's function ran / taps (the fastest of "
            f"{rounds or 'the'} rounds, and the ratio's range over them). best JAX: {best} "
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
                     *([_x(two / gbs["hostfeed"]), _spread(two_rounds)] if two else [])])
    two_col = (["hostfeed / 2 buffers", "range"] if "numpy copy, 2 buffers" in methods
               else [])
    return ["payload sweep: GB/s until every function ran (taps of each size in a loop); "
            "hostfeed's time per byte over the best JAX callback's and over "
            "the floor (a numpy copy of the same bytes passed to the same Python function; "
            "'2 buffers': copying alternately into two, the fewest an asynchronous tap "
            "can use: one is filled while the previous one's function runs; the fastest "
            f"of {len(methods['hostfeed'][0].get('rounds_gb_per_s') or [1])} rounds, and "
            "that ratio's range over them)",
            *_grid(["bytes", *methods, "best JAX", "hostfeed / best JAX",
                    "hostfeed / numpy copy", *two_col], rows)]


def _call_rows(methods: dict) -> tuple[str, list[list[str]]]:
    best, best_v = _best_jax({k: call_p50(m) for k, m in methods.items()})
    rows = [[k, _fmt(call_p50(m)), _fmt(m["round_trip_us"]["p99"]),
             _fmt(m["round_trip_us"]["p999"]), _fmt(m["round_trip_us"]["max"]),
             _fmt(m["per_call_us"]), _x(call_p50(m) / best_v),
             _spread(round_ratios(m, methods[best], "rounds_p50_us"))]
            for k, m in methods.items()]
    return best, rows


def _call(r: dict) -> list[str]:
    header = ["method", "p50", "p99", "p99.9", "max", "per call", "p50 / best JAX",
              "range (each round's p50)"]
    best, rows = _call_rows(r["methods"])
    rounds = len(r["methods"]["hostfeed call"].get("rounds_p50_us") or [])
    out = [f"call round trip, {r['calls']} calls float32[4] -> float32[4] in a loop (us; "
           f"between host function starts; p50: the median of the fastest of "
           f"{rounds or 'the'} rounds, the tail over all); host function alone: the floor. "
           f"best JAX: {best}", *_grid(header, rows)]
    if "loaded" in r:
        lr = r["loaded"]
        best, rows = _call_rows(lr["methods"])
        out += [f"  every core busy ({lr['busy_processes']} busy processes, "
                f"{lr['calls']} calls). best JAX: {best}", *_grid(header, rows)]
    return out


def round_ratios(a: dict, b: dict, key: str = "rounds_us") -> list[float]:
    """``a``'s time over ``b``'s in each round both were measured in (``a[key]``, the
    interleaved repeats of a section), or [] when the result has no rounds.

    Example:
        >>> round_ratios({"rounds_us": [2.0, 3.0]}, {"rounds_us": [1.0, 2.0]})
        [2.0, 1.5]
    """
    ra, rb = a.get(key) or [], b.get(key) or []
    return [x / y for x, y in zip(ra, rb) if y]


def _spread(ratios: list[float]) -> str:
    """The range of a ratio over the rounds (``0.91-1.07x``), or '-' without rounds."""
    return f"{min(ratios):.2f}-{max(ratios):.2f}x" if ratios else "-"


def _dispatch(r: dict) -> list[str]:
    methods = {k: v for k, v in r.items() if k != "calls"}
    best, best_v = _best_jax({k: v["us"] for k, v in methods.items()})
    none = methods["no callback"]
    rows = [[k, _fmt(v["us"]), _x(v["us"] / none["us"]), _spread(round_ratios(v, none)),
             _x(v["us"] / best_v), _spread(round_ratios(v, methods[best]))]
            for k, v in methods.items()]
    rounds = len(none.get("rounds_us") or [])
    return [f"dispatch of a small jitted function (v + 1 on float32[4]) with one callback, "
            f"waited for, {r['calls']} calls (us per call; fastest of {rounds or 'the'} "
            f"rounds, and each ratio's range over them). best JAX: {best}",
            *_grid(["function", "per call", "/ no callback", "range", "/ best JAX", "range"],
                   rows)]


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
            f"{_x(hff / dbgf)}; over those fresh functions the process's memory (RSS) grew "
            f"{r['rss_growth_mb']:.1f} MB and hostfeed's registered consumers changed by "
            f"{r['registered_consumers_growth']:+d} (a fresh function's is released with it)"]


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
    hfr, jxr = r["hostfeed barrier_wait"], r["jax.effects_barrier"]
    hf, jx = hfr["us"], jxr["us"]
    lines = [f"idle barrier ({r['calls']} calls): hostfeed barrier_wait {hf:.2f} us, "
             f"jax.effects_barrier {jx:.2f} us ({_x(hf / jx)}, range "
             f"{_spread(round_ratios(hfr, jxr))})"]
    bare = r.get("hostfeed barrier_wait, no device to mark")
    if bare is not None:
        lines[0] += f"; marking {r.get('marked devices', 0)} fast-dispatch device(s)"
        lines.append(f"  with no fast-dispatch device to mark (as HOSTFEED_FAST_DISPATCH=0): "
                     f"{bare['us']:.2f} us ({_x(bare['us'] / jx)} jax.effects_barrier)")
    trivial = next((v for k, v in r.items() if k.startswith("one dispatch of a trivial")), None)
    if trivial is not None:
        lines.append(f"  one dispatch of a trivial jitted function (the marker's floor): "
                     f"{trivial['us']:.2f} us; barrier_wait {_x(hf / trivial['us'])} of it "
                     f"(range {_spread(round_ratios(hfr, trivial))})")
    return lines


def _timing(r: dict) -> list[str]:
    return [f"cost of the timing histograms (small taps, device side): on "
            f"{r['per_tap_us_timing_on']:.3f} us, off {r['per_tap_us_timing_off']:.3f} us "
            f"per tap ({r['cost_us_per_tap']:+.3f} us); not tracing with jax.profiler: "
            f"{r.get('profiler_check_us_per_batch', float('nan')) * 1e3:.0f} ns per batch "
            f"(one check; while tracing, one trace event per callback)"]


#: How each method is drawn, the same in every panel: (colour, marker). Colours alone do
#: not tell nine curves apart (nor in grey), so every method also has its own marker.
STYLES: dict[str, tuple[str, str]] = {
    "hostfeed": ("#d62728", "o"), "hostfeed (sync)": ("#ff7f0e", "s"),
    "hostfeed (spaced taps)": ("#e377c2", "P"), "buffer_callback": ("#1f77b4", "^"),
    "io_callback(ordered)": ("#2ca02c", "v"), "io_callback": ("#17becf", "D"),
    "debug.callback": ("#9467bd", "X"), "pure_callback": ("#8c564b", "<"),
    "numpy copy": ("#555555", "x"), "numpy copy, 2 buffers": ("#bcbd22", "+"),
    "host function alone": ("#555555", "x"), "no callback": ("#555555", "x"),
    "hostfeed call, receiver thread": ("#ff9896", "d"),
}
#: Methods drawn like another: hostfeed's tap and call are "hostfeed" in every panel.
_SAME_AS = {"hostfeed call": "hostfeed", "hostfeed id_tap": "hostfeed"}
#: Labels shortened to fit beside a bar (the JSON keeps the full names).
_SHORT = {"hostfeed id_tap, compiled ahead of time": "hostfeed id_tap, AOT-compiled"}

#: The sections the figure draws, one panel each, in this order.
PLOTTED = ("latency", "sweep", "dispatch", "call")


def _style(name: str) -> tuple[str, str]:
    """(colour, marker) of a method; a variant (``"hostfeed id_tap, token chain"``) is drawn
    like its method."""
    name = _SAME_AS.get(name, name)
    if name in STYLES:
        return STYLES[name]
    base = name.split(",")[0]
    return STYLES.get(_SAME_AS.get(base, base), ("#000000", "*"))


def plottable(result: dict[str, Any]) -> list[str]:
    """The sections of ``result`` that have a panel in the figure, in the figure's order."""
    return [s for s in PLOTTED if _has_data(result, s)]


def nothing_to_plot(sections: list[str]) -> str:
    """The error for a figure of ``sections`` (none of them in ``PLOTTED``): one line."""
    return (f"--plot: nothing to draw from {', '.join(sections) or 'no section'}; the "
            f"figure plots the sections {', '.join(PLOTTED)}")


def _has_data(result: dict[str, Any], section: str) -> bool:
    r = result.get(section)
    if not isinstance(r, dict):
        return False
    if section == "dispatch":
        return any(isinstance(v, dict) for v in r.values())
    return bool(r.get("methods"))


def plot(result: dict[str, Any], path: str) -> list[str]:
    """Writes the figure to ``path`` and returns the titles of its panels.

    One panel per question, only for the sections ``result`` has (see ``PLOTTED``): what a
    tap costs the device (latency CDFs), throughput by payload size, the dispatch cost of a
    jitted function with one callback, and the ``call`` round trip. A method has one colour
    and one marker in every panel; one legend, below the panels (in the free fourth cell of
    three), names them and says what line styles and marker fills mean. Sized to be read
    at about 900 px wide. Raises SystemExit when ``result`` has none of those sections."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.layout_engine import ConstrainedLayoutEngine
    except ImportError:
        raise SystemExit("--plot needs matplotlib: pip install matplotlib") from None
    sections = plottable(result)
    if not sections:
        raise SystemExit(nothing_to_plot([k for k in result if k not in ("schema", "header")]))
    draw = {"latency": _latency_panel, "sweep": _sweep_panel,
            "dispatch": _dispatch_panel, "call": _call_panel}
    n = len(sections)
    rows, cols = (1, n) if n <= 2 else (2, 2)
    # Sized to be read at about 900 px wide (a README): 10 inches (7.5 for one panel),
    # every font 10 pt or more.
    width, panel_height = (7.5, 5.0) if n == 1 else (10.0, 4.4)
    with plt.rc_context({"font.size": 11, "axes.titlesize": 12.5, "axes.titleweight": "bold",
                         "axes.labelsize": 11, "xtick.labelsize": 10, "ytick.labelsize": 10,
                         "legend.fontsize": 10, "axes.spines.top": False,
                         "axes.spines.right": False, "axes.grid": True, "grid.alpha": 0.3}):
        fig = plt.figure(figsize=(width, rows * panel_height + 0.6),
                         layout=ConstrainedLayoutEngine(h_pad=0.1, w_pad=0.1, hspace=0.05,
                                                        wspace=0.05))
        grid = fig.add_gridspec(rows, cols)
        # One legend for every panel: each method's colour and marker; beside it, what the
        # line styles and marker fills mean.
        handles: dict[str, Any] = {}
        keys: dict[str, Any] = {}
        for i, name in enumerate(sections):
            ax = fig.add_subplot(grid[i // cols, i % cols])
            draw[name](ax, result[name], handles, keys)
        h = result.get("header", {})
        fig.suptitle(f"hostfeed {h.get('hostfeed', '?')} against JAX's callbacks "
                     f"(jax {h.get('jax', '?')}, {h.get('backend', '?')}, "
                     f"{h.get('cores', '?')} cores)", fontsize=13.5, fontweight="bold")
        if n == 3 and (handles or keys):  # the free fourth cell holds the legend
            holder = fig.add_subplot(grid[1, 1])
            holder.axis("off")
            holder.legend(*_legend_entries(handles, keys, 1), loc="center", frameon=False)
        elif handles or keys:
            # Below the panels, in as many columns as the figure's width holds.
            for ncols in range(4 if n > 1 else 3, 0, -1):
                legend = fig.legend(*_legend_entries(handles, keys, ncols), ncols=ncols,
                                    loc="outside lower center", frameon=False,
                                    handlelength=2.4, columnspacing=1.4)
                width_px = legend.get_window_extent().width
                if width_px <= 0.98 * fig.bbox.width or ncols == 1:
                    break
                legend.remove()
        fig.savefig(path, dpi=150)
        plt.close(fig)
    # The panels as saved (the legend's cell, when there is one, has no axis).
    return [ax.get_title() for ax in fig.axes if ax.axison]


_GREY = "#444444"


def _legend_entries(handles: dict[str, Any], keys: dict[str, Any],
                    ncols: int) -> tuple[list[Any], list[str]]:
    """The legend's entries in the order a legend of ``ncols`` columns fills them (column
    by column): the methods in the rows above, the key to line styles and marker fills
    in the rows below them (blank entries pad the grid)."""
    from matplotlib.lines import Line2D

    methods = [(h, label) for label, h in handles.items()]
    key = [(h, label) for label, h in keys.items()]
    m_rows, k_rows = -(-len(methods) // ncols), -(-len(key) // ncols)
    if methods and key:
        k_rows += 1  # a blank row between them
    first_key_row = m_rows + (1 if methods and key else 0)
    blank = (Line2D([], [], alpha=0), "")
    cells = [[blank] * ncols for _ in range(m_rows + k_rows)]
    for i, entry in enumerate(methods):
        cells[i % m_rows][i // m_rows] = entry
    for i, entry in enumerate(key):
        cells[first_key_row + i // ncols][i % ncols] = entry
    order = [cells[r][c] for c in range(ncols) for r in range(m_rows + k_rows)]
    return [h for h, _ in order], [label for _, label in order]


def _curve_handle(handles: dict[str, Any], name: str, ls: str = "-") -> None:
    """Adds ``name``'s legend entry (its colour and marker) once."""
    from matplotlib.lines import Line2D

    colour, marker = _style(name)
    handles.setdefault(name, Line2D([], [], color=colour, marker=marker, ls=ls, lw=1.8,
                                    markersize=7))


def _log_axis(axis: Any, fmt: Any = None) -> None:
    """Plain numbers (0.1, 1, 10, 100) on a log axis, not powers of ten."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    axis.set_major_formatter(FuncFormatter(fmt or (lambda v, _: f"{v:g}")))
    axis.set_minor_formatter(NullFormatter())


def _latency_panel(ax: Any, r: dict, handles: dict[str, Any],
                   keys: dict[str, Any]) -> None:
    from matplotlib.lines import Line2D

    methods = r["methods"]
    for i, (k, m) in enumerate(methods.items()):
        colour, marker = _style(k)
        style = dict(color=colour, marker=marker, markersize=6.5, drawstyle="steps-post")
        # Markers on the rising part of each curve, at heights staggered by method, so that
        # curves close together still show each marker.
        heights = [f + 0.05 * (i % 5) for f in (0.04, 0.29, 0.54, 0.79)]
        # Spaced-out taps cost the device what the others do (hostfeed's curve); only their
        # hand-over differs: it is drawn, not the device side.
        if k != "hostfeed (spaced taps)" and m.get("device_cdf_us"):
            pts = m["device_cdf_us"]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], lw=1.8,
                    markevery=_at_fractions(pts, heights), **style)
            _curve_handle(handles, k)
        if m.get("handover_cdf_us"):
            pts = m["handover_cdf_us"]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], ls="--", lw=1.5,
                    markevery=_at_fractions(pts, heights), **style)
            _curve_handle(handles, k, "--" if k == "hostfeed (spaced taps)" else "-")
    ax.set_xscale("log")
    _log_axis(ax.xaxis)
    ax.set_ylim(0, 1.02)
    ax.set(title="What a tap costs the device",
           xlabel=f"µs per {r.get('payload', '')} tap (log)".replace(" ", " ", 1),
           ylabel="fraction of taps (CDF)")
    if any(m.get("handover_cdf_us") for m in methods.values()):
        keys["device side"] = Line2D([], [], color=_GREY, lw=1.8)
        keys["hand-over to the host\n(the device does not wait)"] = Line2D(
            [], [], color=_GREY, lw=1.5, ls="--")


def _at_fractions(cdf: list[list[float]], fractions: list[float]) -> list[int]:
    """The indices of the first points of ``cdf`` that reach each of ``fractions``."""
    return sorted({next((j for j, (_, f) in enumerate(cdf) if f >= q), len(cdf) - 1)
                   for q in fractions})


def _sweep_panel(ax: Any, r: dict, handles: dict[str, Any],
                 keys: dict[str, Any]) -> None:
    for k, pts in r["methods"].items():
        colour, marker = _style(k)
        floor = k.startswith("numpy")
        ax.plot([p["bytes"] for p in pts], [p["gb_per_s"] for p in pts], color=colour,
                marker=marker, markersize=6, lw=1.8, ls=":" if floor else "-")
        _curve_handle(handles, k, ":" if floor else "-")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    sizes = r.get("sizes") or sorted({p["bytes"] for pts in r["methods"].values()
                                      for p in pts})
    ticks = [s for s in sizes if math.log2(s) % 4 == 0] or sizes
    ax.set_xticks(ticks)
    _log_axis(ax.xaxis, lambda v, _: _bytes(v))
    _log_axis(ax.yaxis)
    ax.set(title="Throughput by payload size", xlabel="bytes per tap (log)",
           ylabel="GB/s end to end (log)")


def _bytes(v: float) -> str:
    for unit, size in (("MiB", 2**20), ("KiB", 2**10)):
        if v >= size:
            return f"{v / size:g} {unit}"
    return f"{v:g} B"


def _dispatch_panel(ax: Any, r: dict, handles: dict[str, Any],
                    keys: dict[str, Any]) -> None:
    us = sorted(((k, v["us"]) for k, v in r.items() if isinstance(v, dict)),
                key=lambda kv: kv[1])
    names = [k for k, _ in us]
    y = range(len(us))
    ax.barh(y, [v for _, v in us], color=[_style(k)[0] for k in names], height=0.7,
            hatch=["//" if "," in k else "" for k in names], edgecolor="white", lw=0)
    for i, (_, v) in enumerate(us):
        ax.text(v * 1.08, i, f"{v:.3g}", va="center", fontsize=9.5)
    ax.set_yticks(list(y), [_SHORT.get(k, k) for k in names])
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlim(right=max(v for _, v in us) * 3)
    _log_axis(ax.xaxis)
    ax.grid(axis="y", visible=False)
    ax.set(title="Dispatch with one callback",
           xlabel="µs per small jitted call (log)")


def _quantile(cdf: list[list[float]], q: float) -> float:
    """The smallest value whose fraction reaches ``q`` (the CDF's last value past it)."""
    for v, frac in cdf:
        if frac >= q:
            return v
    return cdf[-1][0]


def _call_panel(ax: Any, r: dict, handles: dict[str, Any],
                keys: dict[str, Any]) -> None:
    from matplotlib.lines import Line2D

    runs = [("quiet", r["methods"], 1.0)]
    loaded = (r.get("loaded") or {}).get("methods")
    if loaded:
        runs.append(("every core busy", loaded, 0.45))
    names = list(r["methods"])
    off = 0.19 if loaded else 0.0
    for j, (_, methods, alpha) in enumerate(runs):
        for i, k in enumerate(names):
            cdf = (methods.get(k) or {}).get("round_trip_cdf_us")
            if not cdf:
                continue
            colour, marker = _style(k)
            y = i + (2 * j - 1) * off if loaded else i
            ax.plot([_quantile(cdf, 0.05), _quantile(cdf, 0.99)], [y, y], color=colour,
                    lw=1.3, alpha=max(alpha, 0.6), solid_capstyle="butt")
            ax.plot([_quantile(cdf, 0.25), _quantile(cdf, 0.75)], [y, y], color=colour,
                    lw=7, alpha=alpha, solid_capstyle="butt")
            ax.plot([_quantile(cdf, 0.5)], [y], marker=marker, markersize=7.5, color=colour,
                    markeredgecolor="black" if j == 0 else colour,
                    markerfacecolor=colour if j == 0 else "white", ls="")
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    ax.set_xscale("log")
    _log_axis(ax.xaxis)
    ax.grid(axis="y", visible=False)
    ax.set(title="Round trip of a call", xlabel="µs per round trip (log)")
    ax.text(0.98, 0.98, "marker: median\nbar: p25-p75\nline: p5-p99", fontsize=10,
            transform=ax.transAxes, ha="right", va="top", color=_GREY,
            bbox=dict(facecolor="white", edgecolor="none", alpha=0.85, pad=1.5))
    keys["call, quiet"] = Line2D([], [], color=_GREY, marker="o", markeredgecolor="black",
                                 lw=6, markersize=7.5)
    if loaded:
        keys["call, every core busy"] = Line2D([], [], color="#aaaaaa", marker="o",
                                               markeredgecolor=_GREY,
                                               markerfacecolor="white", lw=6,
                                               markersize=7.5)
