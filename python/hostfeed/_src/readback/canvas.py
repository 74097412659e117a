"""What ``show``'s pictures are drawn with (:mod:`.draw` lays them out): one matplotlib
canvas whose coordinates are inches from its bottom left, plots placed on it as boxes
with their own y scale (linear, log or symmetric log) and ticks, lines and bands gathered
by style and drawn as a few collections at the end.

matplotlib's own axes cost tens of milliseconds each (most of it their ticks), and a run
of 48 layers has hundreds of plots: the ticks are placed here, and labelled plainly (no
offset, no exponent between 0.001 and 100,000, no ``-1e-13`` for a zero that rounding
moved).
"""
from __future__ import annotations

import math
from collections import defaultdict
from typing import Any, Optional

import numpy as np

__all__ = ["Canvas", "Plot", "Scale", "thin", "tick_labels", "DPI", "FONT"]

#: Pixels an inch of the PNG: text of :data:`FONT` points is about 12 pixels high, read
#: at 100% zoom.
DPI = 100
#: Font sizes (points): tick labels, axis labels and panel titles, the figure's title.
FONT = {"tick": 8.5, "label": 9.0, "title": 10.0, "head": 13.0}
#: At most this many points a line: longer runs are drawn as bins of steps (each the mean
#: of its rows, or the min or max of them for the extremes).
MAX_POINTS = 1500
#: The colour of frames, ticks and text.
FRAME = "#444444"
#: How far left of a plot its y axis' label is (inches): room for tick labels of 9
#: characters.
LABEL_X = 0.82


def thin(x: np.ndarray, y: np.ndarray, how: str = "mean") -> tuple[np.ndarray, np.ndarray]:
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


def _one(t: float) -> str:
    """One tick of a log or symmetric log axis (a power of ten or two, or 0)."""
    if t == 0:
        return "0"
    if 1e-3 <= abs(t) < 1e5:
        return f"{t:.10f}".rstrip("0").rstrip(".")
    return _exponent(t)


def _exponent(t: float) -> str:
    """``t`` as a mantissa of at most 3 digits and an exponent: ``2.5e-7``, ``1e5``."""
    mantissa, exp = f"{t:.2e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exp)}"


def tick_labels(ticks: list[float], log: bool = False) -> list[str]:
    """Plain labels for the ticks of one axis: one number of decimals for all of them,
    as few as tell them apart, and no exponent between 0.001 and 100,000 (outside it,
    ``2.5e-7``); a tick within a billionth of the axis' span of zero is ``0``.

    Example:
        >>> tick_labels([-1.3e-13, 0.003, 0.006, 0.009])
        ['0', '0.003', '0.006', '0.009']
        >>> tick_labels([0.5, 1.0, 1.5]), tick_labels([2e-7, 4e-7])
        (['0.5', '1.0', '1.5'], ['2e-7', '4e-7'])
        >>> tick_labels([0.001, 0.125, 1.0, 1000.0, 2.0 ** -30, 1e-4], log=True)
        ['0.001', '0.125', '1', '1000', '9.31e-10', '1e-4']
    """
    if not ticks:
        return []
    if log:
        return [_one(t) for t in ticks]
    span = max(ticks) - min(ticks)
    ticks = [0.0 if abs(t) <= 1e-9 * span else t for t in ticks]
    big = max(abs(t) for t in ticks)
    if big == 0:
        return ["0"] * len(ticks)
    if not 1e-3 <= big < 1e5:
        return ["0" if t == 0 else _exponent(t) for t in ticks]
    for decimals in range(10):
        if all(abs(round(t, decimals) - t) <= 1e-6 * max(span, big) for t in ticks):
            break
    return ["0" if t == 0 else f"{t:.{decimals}f}" for t in ticks]


class Scale:
    """A plot's y axis: linear, log or symlog, from ``lo`` to ``hi``. ``positive`` values
    (magnitudes) take a log axis where they span more than two decades, others a
    symmetric log axis where they span more than three."""

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

    def ticks(self, most: int = 4) -> list[float]:
        """At most about ``most`` ticks inside the axis (values, not positions)."""
        from matplotlib.ticker import MaxNLocator
        if self.kind == "linear":
            return [float(t) for t in MaxNLocator(most).tick_values(self.lo, self.hi)
                    if self.lo <= t <= self.hi]
        if self.kind == "log":
            decades = list(range(math.ceil(self.lo), math.floor(self.hi) + 1))
            step = max(1, math.ceil(len(decades) / most))
            return [10.0 ** d for d in decades[::step]]
        out = [0.0]
        top = max(abs(self.lo), abs(self.hi))
        d = math.floor(math.log10(self.t))
        while self.f(10.0 ** d) <= top and len(out) < 40:
            out += [10.0 ** d, -10.0 ** d]
            d += 1
        inside = sorted((t for t in out if self.lo <= self.f(t) <= self.hi),
                        key=lambda t: (t != 0, -abs(t)))  # 0 first, then the largest
        room = (self.hi - self.lo) / (most + 1)  # the least distance between two ticks
        kept: list[float] = []
        for t in inside:
            if all(abs(self.f(t) - self.f(k)) >= room for k in kept):
                kept.append(t)
        return sorted(kept)

    def labels(self, ticks: list[float]) -> list[str]:
        return tick_labels(ticks, log=self.kind != "linear")


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


class Canvas:
    """One figure whose data coordinates are inches from its bottom left; lines, bands and
    marks gathered by style, drawn as a few collections at the end. ``cells`` records the
    box (inches) of each panel drawn, by array name: what the tests read back."""

    def __init__(self, w: float, h: float):
        import matplotlib
        matplotlib.use("Agg")
        from matplotlib.figure import Figure
        self.fig = Figure(figsize=(w, h), dpi=DPI)
        self.ax = self.fig.add_axes((0, 0, 1, 1))
        self.ax.set_axis_off()
        self.w, self.h = w, h
        self.lines: dict[tuple, list[np.ndarray]] = defaultdict(list)
        self.bands: dict[str, list[np.ndarray]] = defaultdict(list)
        self.marks: dict[tuple, list[np.ndarray]] = defaultdict(list)
        self.cells: dict[str, tuple[float, float, float, float]] = {}

    def text(self, x: float, y: float, s: str, size: str = "label", **kw: Any) -> None:
        kw.setdefault("color", FRAME)
        self.ax.text(x, y, s, fontsize=FONT[size], **kw)

    def frame(self, points: np.ndarray) -> None:
        self.lines[(FRAME, 0.7, "solid")].append(points)

    def image(self, data: np.ndarray, box: tuple[float, float, float, float],
              vmax: float) -> None:
        x0, y0, w, h = box
        self.ax.imshow(data, origin="lower", aspect="auto", interpolation="nearest",
                       cmap="viridis", extent=(x0, x0 + w, y0, y0 + h), vmin=0,
                       vmax=max(vmax, 1e-9))

    def finish(self) -> Any:
        from matplotlib.collections import LineCollection, PolyCollection
        for (color, width, style), segs in self.lines.items():
            self.ax.add_collection(LineCollection(segs, colors=color, linewidths=width,
                                                  linestyles=style))
        for color, polys in self.bands.items():
            self.ax.add_collection(PolyCollection(polys, facecolors=color, alpha=0.22,
                                                  linewidths=0))
        for (color, marker, size), pts in self.marks.items():
            xy = np.concatenate(pts)
            self.ax.scatter(xy[:, 0], xy[:, 1], s=size, c=color, marker=marker,
                            linewidths=1.0 if marker == "x" else 0, zorder=5)
        self.ax.set_xlim(0, self.w)
        self.ax.set_ylim(0, self.h)
        self.fig.hostfeed_cells = dict(self.cells)  # type: ignore[attr-defined]
        return self.fig


class Plot:
    """One plot's box on the canvas: ``x0, y0`` its bottom left, ``w, h`` (inches), its
    steps from ``steps[0]`` to ``steps[1]`` across, its ``scale`` up."""

    def __init__(self, cv: Canvas, box: tuple[float, float, float, float],
                 steps: tuple[float, float], scale: Scale):
        self.cv, self.scale = cv, scale
        self.x0, self.y0, self.w, self.h = box
        lo, hi = steps
        self.xlo, self.xhi = (lo - 0.5, hi + 0.5) if lo == hi else (lo, hi)
        x0, y0, w, h = box
        cv.frame(np.array([[x0, y0], [x0 + w, y0], [x0 + w, y0 + h], [x0, y0 + h], [x0, y0]]))

    def tx(self, x: Any) -> Any:
        return self.x0 + (np.asarray(x, np.float64) - self.xlo) / (self.xhi - self.xlo) * self.w

    def ty(self, y: Any) -> Any:
        return self.y0 + self.scale.unit(y) * self.h

    def line(self, x: np.ndarray, y: np.ndarray, color: str, width: float = 1.1,
             style: str = "solid", markers: bool = False) -> None:
        X, Y = self.tx(x), self.ty(y)
        self.cv.lines[(color, width, style)].extend(_runs(X, Y))
        if markers:
            ok = np.isfinite(Y)
            self.cv.marks[(color, "o", 10)].append(np.column_stack([X[ok], Y[ok]]))

    def band(self, x: np.ndarray, lo: np.ndarray, hi: np.ndarray, color: str) -> None:
        X, L, H = self.tx(x), self.ty(lo), self.ty(hi)
        for run in _runs(X, L + H):
            k = np.isin(X, run[:, 0])
            self.cv.bands[color].append(np.concatenate([np.column_stack([X[k], L[k]]),
                                                        np.column_stack([X[k], H[k]])[::-1]]))

    def yticks(self, label: str, most: int = 4, color: Optional[str] = None) -> None:
        """Ticks and their labels on the left; ``label`` beside them, turned (in
        ``color``)."""
        ticks = self.scale.ticks(most)
        for t, text in zip(ticks, self.scale.labels(ticks)):
            y = float(self.ty(t))
            self.cv.frame(np.array([[self.x0 - 0.05, y], [self.x0, y]]))
            self.cv.text(self.x0 - 0.07, y, text, "tick", ha="right", va="center")
        self.cv.text(self.x0 - LABEL_X, self.y0 + self.h / 2, label, rotation=90,
                     ha="center", va="center", color=color or FRAME)

    def xticks(self, labels: bool) -> None:
        """Step ticks below; with ``labels``, their numbers and ``step``."""
        from matplotlib.ticker import MaxNLocator
        most = max(2, min(6, int(self.w / 0.75)))
        for t in MaxNLocator(most, integer=True).tick_values(self.xlo, self.xhi):
            if not self.xlo <= t <= self.xhi:
                continue
            x = float(self.tx(t))
            self.cv.frame(np.array([[x, self.y0 - 0.05], [x, self.y0]]))
            if labels:
                self.cv.text(x, self.y0 - 0.08, f"{int(t)}", "tick", ha="center", va="top")
        if labels:
            self.cv.text(self.x0 + self.w / 2, self.y0 - 0.27, "step", ha="center", va="top")
