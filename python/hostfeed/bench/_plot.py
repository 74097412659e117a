"""The figure of ``python -m hostfeed bench`` (``--plot FILE.png``): one panel per
section it draws (:data:`PLOTTED`), every method in the same colour and marker in each."""
from __future__ import annotations

import math
from typing import Any

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
