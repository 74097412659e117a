"""A whole recording at a glance, drawn (``python -m hostfeed show``): the grid of
:mod:`.grid` as one PNG, or as one self-contained HTML page.

A panel of statistics is two plots over the steps: the values (mean with a band of one
standard deviation, min and max) and the scale (absmax, l2 and the least non-zero magnitude,
on a log axis where they span decades, with the largest dynamic range in bits; the values on
a symmetric log axis where they do); and, where the rows hold them, a third: the fractions
of zeros and of a cast's underflows and overflows, in percent. A histogram is a heat map
of steps by bins (``log10(1 + count)``), its y axis labelled with the bins' edges; the
rows of another reduction drawn as lines (:attr:`~hostfeed._src.reductions.Reduction.plot`
says which: one line per column of what it gives per step). Steps
with a NaN or an infinity are marked (a red ``x`` above the values, the first such step in
the panel's title); lines get markers where there are few points.

Every panel is drawn on one matplotlib canvas, its lines gathered into one collection per
style and its ticks placed here: matplotlib's own axes cost tens of milliseconds each (most
of it their ticks), and a run of 48 layers has hundreds of plots.
"""
from __future__ import annotations

import base64
import html
import io
import math
from collections import defaultdict
from typing import Any, Optional

import numpy as np

from . import series
from ..reductions import of_kind
from ..reductions.stats import derived
from .grid import Panel, layout

__all__ = ["draw_png", "write_html", "figure"]

#: At most this many points a line: longer runs are drawn as bins of steps (each the mean
#: of its rows, or the min or max of them for the extremes).
MAX_POINTS = 1500
#: Lines with at most this many points get markers.
FEW_POINTS = 60
#: One panel's size (inches), the space above the first row, the resolution.
PANEL_W, PANEL_H, DPI = 3.6, 2.6, 80
#: A panel's insides (inches): title above, tick labels left, step labels below.
PAD_TOP, PAD_LEFT, PAD_RIGHT, PAD_BOTTOM = 0.42, 0.62, 0.2, 0.4
C = series.COLUMN
COLORS = {"mean": "#1f77b4", "min": "#ff7f0e", "max": "#2ca02c", "absmax": "#d62728",
          "l2": "#9467bd", "absmin": "#8c564b", "zero_fraction": "#7f7f7f",
          "underflow_fraction": "#17becf", "overflow_fraction": "#e377c2", "bad": "red",
          "frame": "#555555"}
LEGEND = (("mean", "mean (band: ± std)"), ("min", "min"), ("max", "max"),
          ("absmax", "absmax"), ("l2", "l2"), ("absmin", "absmin≠0"),
          ("zero_fraction", "zeros %"), ("underflow_fraction", "underflow %"),
          ("overflow_fraction", "overflow %"))
#: The fractions a panel of statistics draws in percent (:func:`derived`'s).
FRACTIONS = ("zero_fraction", "underflow_fraction", "overflow_fraction")


def _thin(x: np.ndarray, y: np.ndarray, how: str = "mean") -> tuple[np.ndarray, np.ndarray]:
    """``x``, ``y`` with at most :data:`MAX_POINTS` points: bins of steps, each the
    ``how`` (mean, min, max) of its rows (NaNs left out)."""
    n = len(x)
    y = np.asarray(y, np.float64)
    if n <= MAX_POINTS:
        return x, y
    edges = np.linspace(0, n, MAX_POINTS + 1).astype(np.int64)
    starts = edges[:-1]
    if how == "mean":
        ok = np.isfinite(y)
        k = np.add.reduceat(ok, starts)
        with np.errstate(invalid="ignore", divide="ignore"):
            return x[starts], np.add.reduceat(np.where(ok, y, 0.0), starts) / k
    fn = np.fmin if how == "min" else np.fmax
    return x[starts], fn.reduceat(y, starts)


class _Scale:
    """A plot's y axis: linear, log or symlog, from ``lo`` to ``hi``."""

    def __init__(self, values: list[np.ndarray], positive: bool):
        v = np.concatenate([np.asarray(a, np.float64).ravel() for a in values])
        v = v[np.isfinite(v)]
        self.kind = "linear"
        self.t = 1.0
        mags = np.abs(v[v != 0])
        if positive and v.size and (v > 0).any():
            p = v[v > 0]
            if p.max() / p.min() > 1e2:
                self.kind = "log"
        elif mags.size and mags.max() / max(float(np.percentile(mags, 5)), 1e-300) > 1e3:
            self.kind, self.t = "symlog", float(np.percentile(mags, 5))
        if self.kind == "log":
            v = v[v > 0]
        lo, hi = (float(v.min()), float(v.max())) if v.size else (0.0, 1.0)
        if lo == hi:
            pad = abs(lo) * 0.1 or 0.5
            lo, hi = (lo / 2, hi * 2) if self.kind == "log" else (lo - pad, hi + pad)
        self.lo, self.hi = self.f(lo), self.f(hi)
        margin = (self.hi - self.lo) * 0.06
        self.lo, self.hi = self.lo - margin, self.hi + margin

    def f(self, y: Any) -> Any:
        y = np.asarray(y, np.float64)
        if self.kind == "log":
            with np.errstate(invalid="ignore", divide="ignore"):
                return np.where(y > 0, np.log10(np.where(y > 0, y, 1.0)), np.nan)
        if self.kind == "symlog":
            return np.sign(y) * np.log10(1 + np.abs(y) / self.t)
        return y

    def unit(self, y: Any) -> Any:
        """``y`` in the plot's height, 0 at the bottom, 1 at the top."""
        return (self.f(y) - self.lo) / (self.hi - self.lo)

    def ticks(self) -> list[float]:
        from matplotlib.ticker import MaxNLocator
        if self.kind == "linear":
            return [float(t) for t in MaxNLocator(4).tick_values(self.lo, self.hi)
                    if self.lo <= t <= self.hi]
        if self.kind == "log":
            decades = list(range(math.ceil(self.lo), math.floor(self.hi) + 1))
            step = max(1, math.ceil(len(decades) / 4))
            return [10.0 ** d for d in decades[::step]]
        out = [0.0]
        top = max(abs(self.lo), abs(self.hi))
        d = math.floor(math.log10(self.t))
        while self.f(10.0 ** d) <= top and len(out) < 40:
            out += [10.0 ** d, -10.0 ** d]
            d += 1
        inside = sorted(t for t in out if self.lo <= self.f(t) <= self.hi)
        step = max(1, math.ceil(len(inside) / 5))
        return inside[::step]


def _runs(x: np.ndarray, y: np.ndarray) -> list[np.ndarray]:
    """The finite stretches of a line, as (k, 2) arrays."""
    ok = np.isfinite(y)
    if ok.all():
        return [np.column_stack([x, y])]
    out = []
    idx = np.nonzero(ok)[0]
    if idx.size:
        for run in np.split(idx, np.nonzero(np.diff(idx) > 1)[0] + 1):
            out.append(np.column_stack([x[run], y[run]]))
    return out


class _Canvas:
    """One figure whose data coordinates are inches from its bottom left; lines, bands and
    marks gathered by style, drawn as a few collections at the end."""

    def __init__(self, w: float, h: float):
        import matplotlib
        matplotlib.use("Agg")
        from matplotlib.figure import Figure
        self.fig = Figure(figsize=(w, h), dpi=DPI)
        self.ax = self.fig.add_axes((0, 0, 1, 1))
        self.ax.set_axis_off()
        self.w, self.h = w, h
        self.lines: dict[tuple, list[np.ndarray]] = defaultdict(list)
        self.bands: list[np.ndarray] = []
        self.marks: dict[tuple, list[np.ndarray]] = defaultdict(list)

    def text(self, x: float, y: float, s: str, **kw: Any) -> None:
        self.ax.text(x, y, s, fontsize=kw.pop("fontsize", 6.5), **kw)

    def finish(self) -> Any:
        from matplotlib.collections import LineCollection, PolyCollection
        for (color, width, style), segs in self.lines.items():
            self.ax.add_collection(LineCollection(segs, colors=color, linewidths=width,
                                                  linestyles=style))
        if self.bands:
            self.ax.add_collection(PolyCollection(self.bands, facecolors=COLORS["mean"],
                                                  alpha=0.22, linewidths=0))
        for (color, marker, size), pts in self.marks.items():
            xy = np.concatenate(pts)
            self.ax.scatter(xy[:, 0], xy[:, 1], s=size, c=color, marker=marker,
                            linewidths=0.8 if marker == "x" else 0, zorder=5)
        self.ax.set_xlim(0, self.w)
        self.ax.set_ylim(0, self.h)
        return self.fig


class _Plot:
    """One plot's box on the canvas: ``x0, y0`` its bottom left, ``w, h`` (inches)."""

    def __init__(self, cv: _Canvas, box: tuple[float, float, float, float],
                 steps: tuple[float, float], scale: _Scale):
        self.cv, self.scale = cv, scale
        self.x0, self.y0, self.w, self.h = box
        lo, hi = steps
        self.xlo, self.xhi = (lo - 0.5, hi + 0.5) if lo == hi else (lo, hi)
        x0, y0, w, h = box
        cv.lines[(COLORS["frame"], 0.6, "solid")].append(
            np.array([[x0, y0], [x0 + w, y0], [x0 + w, y0 + h], [x0, y0 + h], [x0, y0]]))

    def tx(self, x: Any) -> Any:
        return self.x0 + (np.asarray(x, np.float64) - self.xlo) / (self.xhi - self.xlo) * self.w

    def ty(self, y: Any) -> Any:
        return self.y0 + self.scale.unit(y) * self.h

    def line(self, x: np.ndarray, y: np.ndarray, color: str, width: float = 0.9,
             style: str = "solid", markers: bool = False) -> None:
        X, Y = self.tx(x), self.ty(y)
        self.cv.lines[(color, width, style)].extend(_runs(X, Y))
        if markers:
            ok = np.isfinite(Y)
            self.cv.marks[(color, "o", 9)].append(np.column_stack([X[ok], Y[ok]]))

    def band(self, x: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> None:
        X, L, H = self.tx(x), self.ty(lo), self.ty(hi)
        for run in _runs(X, L + H):
            k = np.isin(X, run[:, 0])
            self.cv.bands.append(np.concatenate([np.column_stack([X[k], L[k]]),
                                                 np.column_stack([X[k], H[k]])[::-1]]))

    def yticks(self, label: str) -> None:
        for t in self.scale.ticks():
            y = float(self.ty(t))
            self.cv.lines[(COLORS["frame"], 0.6, "solid")].append(
                np.array([[self.x0 - 0.04, y], [self.x0, y]]))
            self.cv.text(self.x0 - 0.06, y, f"{t:.3g}", ha="right", va="center", fontsize=6)
        self.cv.text(self.x0 - 0.5, self.y0 + self.h / 2, label, rotation=90, ha="center",
                     va="center")

    def xticks(self, labels: bool) -> None:
        from matplotlib.ticker import MaxNLocator
        for t in MaxNLocator(5, integer=True).tick_values(self.xlo, self.xhi):
            if not self.xlo <= t <= self.xhi:
                continue
            x = float(self.tx(t))
            self.cv.lines[(COLORS["frame"], 0.6, "solid")].append(
                np.array([[x, self.y0 - 0.04], [x, self.y0]]))
            if labels:
                self.cv.text(x, self.y0 - 0.06, f"{int(t)}", ha="center", va="top", fontsize=6)
        if labels:
            self.cv.text(self.x0 + self.w / 2, self.y0 - 0.22, "step", ha="center", va="top")


def _bad_marks(cv: _Canvas, plot: _Plot, bad: np.ndarray) -> None:
    """A red ``x`` at the top of ``plot`` for each step with a NaN or an infinity."""
    if bad.size:
        bx = plot.tx(bad.astype(np.float64))
        cv.marks[(COLORS["bad"], "x", 14)].append(
            np.column_stack([bx, np.full(bad.size, plot.y0 + plot.h - 0.07)]))


def _stats_panel(cv: _Canvas, p: Panel, x0: float, y0: float, w: float, h: float) -> None:
    s = p.stats
    assert s is not None
    x = p.steps.astype(np.float64)
    steps = (float(np.min(x)), float(np.max(x)))
    few = len(x) <= FEW_POINTS
    xm, mean = _thin(x, s[:, C["mean"]])
    _, std = _thin(x, s[:, C["std"]])
    _, lo = _thin(x, s[:, C["min"]], "min")
    _, hi = _thin(x, s[:, C["max"]], "max")
    _, absmax = _thin(x, s[:, C["absmax"]], "max")
    _, l2 = _thin(x, s[:, C["l2"]], "max")
    if p.kind == "raw" and (s[:, C["count"]] == 1).all():  # a scalar (a loss): its value
        plot = _Plot(cv, (x0, y0, w, h), steps, _Scale([mean], positive=False))
        plot.line(xm, mean, COLORS["mean"], markers=few)
        plot.yticks("value")
        plot.xticks(labels=True)
        _bad_marks(cv, plot, p.bad_steps)
        return
    fractions = {k: _thin(x, 100 * v, "max")[1] for k, v in derived(s).items()
                 if k in FRACTIONS and np.isfinite(v).any()}
    fh = h * 0.2 if fractions else 0.0  # the fractions' plot, at the bottom
    vh, sh = (h * 0.44, h * 0.26) if fractions else (h * 0.58, h * 0.36)
    top = _Plot(cv, (x0, y0 + h - vh, w, vh), steps,
                _Scale([lo, hi, mean - std, mean + std], positive=False))
    top.band(xm, mean - std, mean + std)
    top.line(xm, mean, COLORS["mean"], markers=few)
    top.line(xm, lo, COLORS["min"], 0.8, "dashed", markers=few)
    top.line(xm, hi, COLORS["max"], 0.8, "dashed", markers=few)
    top.yticks("value")
    top.xticks(labels=False)
    _bad_marks(cv, top, p.bad_steps)
    _, absmin = _thin(x, s[:, C["absmin_nonzero"]], "min")
    sy = y0 + (fh + 0.06 if fractions else 0.0)
    bottom = _Plot(cv, (x0, sy, w, sh), steps, _Scale([absmax, l2, absmin], positive=True))
    bottom.line(xm, absmax, COLORS["absmax"], markers=few)
    bottom.line(xm, l2, COLORS["l2"], markers=few)
    bottom.line(xm, absmin, COLORS["absmin"], 0.8, "dotted", markers=few)
    bottom.yticks("|x|" if np.isfinite(absmin).any() else "absmax, l2")
    bottom.xticks(labels=not fractions)
    bits = derived(s)["dynamic_range_bits"]
    if np.isfinite(bits).any():
        cv.text(x0 + w - 0.04, sy + sh - 0.04, f"range up to {np.nanmax(bits):.1f} bits",
                ha="right", va="top", fontsize=5.5, color=COLORS["absmin"])
    if fractions:
        low = _Plot(cv, (x0, y0, w, fh), steps, _Scale(list(fractions.values()), positive=True))
        for k, y in fractions.items():
            low.line(xm, y, COLORS[k], 0.8, markers=few)
        low.yticks("%")
        low.xticks(labels=True)


def _histogram_panel(cv: _Canvas, p: Panel, x0: float, y0: float, w: float, h: float
                     ) -> None:
    counts = p.values
    assert counts is not None
    x = p.steps.astype(np.float64)
    if len(x) > MAX_POINTS:  # bins of steps, their counts summed
        starts = np.linspace(0, len(x), MAX_POINTS + 1).astype(np.int64)[:-1]
        counts = np.add.reduceat(counts, starts, axis=0)
        x = x[starts]
    right = float(x[-1]) + (float(x[-1] - x[-2]) if len(x) > 1 else 1.0)
    nb = counts.shape[1]
    plot = _Plot(cv, (x0, y0, w, h), (float(x[0]), right), _Scale([np.array([0.0, nb])],
                                                                  positive=False))
    plot.scale.lo, plot.scale.hi = 0.0, float(nb)
    image = np.log10(1 + counts.T)
    cv.ax.imshow(image, origin="lower", aspect="auto", interpolation="nearest",
                 cmap="viridis", extent=(x0, x0 + w, y0, y0 + h), vmin=0,
                 vmax=max(float(image.max()), 1e-9))
    edges = np.asarray(p.reduce.get("edges", []), np.float64)
    frame = cv.lines[(COLORS["frame"], 0.6, "solid")]
    if edges.size:  # edge i is the bottom of row i + 1 (row 0: the values below)
        for i in np.unique(np.linspace(0, len(edges) - 1, min(len(edges), 5)).astype(int)):
            y = y0 + (i + 1) / nb * h
            frame.append(np.array([[x0 - 0.04, y], [x0, y]]))
            cv.text(x0 - 0.06, y, f"{edges[i]:.3g}", ha="right", va="center", fontsize=6)
    log = "log" in str(p.reduce.get("scale", ""))
    cv.text(x0 - 0.5, y0 + h / 2, ("|x|" if log else "x") + ", bin edges", rotation=90,
            ha="center", va="center")
    plot.xticks(labels=True)


def _lines_panel(cv: _Canvas, p: Panel, x0: float, y0: float, w: float, h: float) -> None:
    """One line per column of the reduction's :meth:`plot_rows`, the
    first darkest."""
    import matplotlib
    values = p.values
    assert values is not None
    r = of_kind(p.kind)
    x = p.steps.astype(np.float64)
    few = len(x) <= FEW_POINTS
    ys = [_thin(x, values[:, j], "max") for j in range(values.shape[1])]
    plot = _Plot(cv, (x0, y0, w, h), (float(np.min(x)), float(np.max(x))),
                 _Scale([y for _, y in ys] or [np.zeros(1)], positive=False))
    cmap = matplotlib.colormaps["viridis"]
    n = len(ys)
    labels = r.plot_labels(p.reduce, n) if r is not None else [str(j) for j in range(n)]
    for j, (xm, y) in enumerate(ys):
        color = matplotlib.colors.to_hex(cmap(0.85 * j / max(n - 1, 1)))
        plot.line(xm, y, color, markers=few)
        if j in (0, n - 1):
            cv.text(x0 + w - 0.04, y0 + h - 0.1 - (0.12 if j else 0.0), labels[j],
                    color=color, ha="right", va="top", fontsize=6)
    plot.yticks("value")
    plot.xticks(labels=True)


def _title(p: Panel) -> str:
    r = of_kind(p.kind)
    what = r.plot_title(p.reduce) if r is not None else "raw, per row"
    if p.kind == "raw" and p.stats is not None and (p.stats[:, C["count"]] == 1).all():
        what = "scalar"
    text = f"{p.name}  ({what}, {len(p.steps)} rows)"
    bad = p.bad_steps
    if bad.size:
        text += f"\nNaN/inf at {bad.size} steps, first {int(bad[0])}"
    return text


def figure(panels: list[Panel], title: Optional[str], legend: bool) -> Any:
    """The grid of ``panels`` as one matplotlib figure."""
    rows, ncols = layout(panels)
    w = 0.2 + PANEL_W * max(ncols, 1)
    # The legend's entries and its note, on as many lines as the width needs.
    note = "a step with a NaN or an infinity;  histograms: log10(1 + count)"
    entries, x, lines = [], 0.15, 1
    for key, label in (*LEGEND, ("bad", note)):
        width = (0.3 if key == "bad" else 0.5) + 0.055 * len(label)
        if x > 0.15 and x + width > w:
            x, lines = 0.15, lines + 1
        entries.append((key, label, x, lines - 1))
        x += width
    head = (0.45 if title else 0.05) + (0.1 + 0.2 * lines if legend else 0.0)
    h = head + PANEL_H * len(rows) + 0.05
    cv = _Canvas(w, h)
    if title:
        cv.text(0.1, h - 0.12, title, fontsize=10, va="top", ha="left")
    for key, label, x, line in entries if legend else []:
        y = h - (0.45 if title else 0.05) - 0.15 - 0.2 * line
        if key == "bad":
            cv.marks[(COLORS["bad"], "x", 14)].append(np.array([[x + 0.1, y]]))
            cv.text(x + 0.2, y, label, va="center", fontsize=7)
            continue
        style = {"min": "dashed", "max": "dashed", "absmin": "dotted"}.get(key, "solid")
        cv.lines[(COLORS[key], 1.2, style)].append(np.array([[x, y], [x + 0.3, y]]))
        cv.text(x + 0.35, y, label, va="center", fontsize=7)
    for r, (_, cells) in enumerate(rows):
        for c, p in cells:
            left = 0.2 + c * PANEL_W
            top_y = h - head - r * PANEL_H
            cv.text(left + 0.05, top_y - 0.05, _title(p), va="top", ha="left", fontsize=7)
            x0, y0 = left + PAD_LEFT, top_y - PANEL_H + PAD_BOTTOM
            pw, ph = PANEL_W - PAD_LEFT - PAD_RIGHT, PANEL_H - PAD_TOP - PAD_BOTTOM
            if len(p.steps) == 0:
                cv.text(x0 + pw / 2, y0 + ph / 2, "no rows yet", ha="center", va="center")
            elif p.plot == "heatmap":
                _histogram_panel(cv, p, x0, y0, pw, ph)
            elif p.plot == "lines":
                _lines_panel(cv, p, x0, y0, pw, ph)
            else:
                _stats_panel(cv, p, x0, y0, pw, ph)
    return cv.finish()


def draw_png(panels: list[Panel], title: str, out: Any) -> None:
    """The grid of every panel, under ``title``, into ``out`` (a path or a binary file);
    a grid of a few panels at twice the resolution."""
    fig = figure(panels, title, legend=any(p.plot == "stats" for p in panels))
    fig.savefig(out, format="png", dpi=DPI * 2 if len(panels) <= 8 else DPI)


def write_html(panels: list[Panel], title: str, table: list[dict], out: str) -> None:
    """One self-contained HTML page: the title, the arrays' table, and each module's row
    of panels as an embedded PNG (nothing is fetched from anywhere when it opens)."""
    rows, _ = layout(panels)
    key = "".join(f"<span class='k' style='background:{COLORS[k]}'></span>{html.escape(t)}"
                  for k, t in LEGEND)
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title>",
        "<style>body{font-family:sans-serif;margin:1em}table{border-collapse:collapse;"
        "font-size:12px}td,th{padding:2px 8px;text-align:left;border-bottom:1px solid #ddd}"
        "img{display:block;max-width:100%}h2{font-size:15px;margin:1.2em 0 .2em}"
        ".k{display:inline-block;width:1.2em;height:.3em;margin:0 .3em .2em 1em}</style>",
        "</head><body>", f"<h1 style='font-size:18px'>{html.escape(title)}</h1>",
        f"<p>{key} &nbsp; <b style='color:red'>x</b>: a step with a NaN or an infinity; "
        "histograms: log10(1 + count) per step and bin</p>",
        "<table><tr><th>array</th><th>rows</th><th>steps</th><th>dtype</th>"
        "<th>row shape</th><th>summary</th></tr>"]
    for r in table:
        steps = "-" if r["steps"] is None else f"{r['steps'][0]}..{r['steps'][1]}"
        anchor = html.escape(series.module_of(r["name"]) or "(top level)", quote=True)
        parts.append(f"<tr><td><a href='#{anchor}'>{html.escape(r['name'])}</a></td>"
                     f"<td>{r['rows']}</td><td>{steps}</td><td>{r['dtype']}</td>"
                     f"<td>{list(r['shape'])}</td><td>{r['reduce'] or ''}</td></tr>")
    parts.append("</table>")
    for module, cells in rows:
        fig = figure([p for _, p in cells], None, legend=False)
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=DPI * 1.4)
        data = base64.b64encode(buf.getvalue()).decode("ascii")
        label = html.escape(module or "(top level)", quote=True)
        parts.append(f"<h2 id='{label}'>{label}</h2>"
                     f"<img alt='{label}' src='data:image/png;base64,{data}'>")
    parts.append("</body></html>")
    with open(out, "w", encoding="utf-8") as f:
        f.write("\n".join(parts))
