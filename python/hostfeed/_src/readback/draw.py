"""A whole recording at a glance, drawn (``python -m hostfeed show``): the grid of
:mod:`.grid` as one PNG, or as one self-contained HTML page, on :mod:`.canvas`.

Each array is a panel, drawn as its reduction's :attr:`~hostfeed._src.reductions.Reduction.plot`
says (raw arrays as statistics):

- ``"stats"``: the plots of the reduction's ``panes``, stacked, each on its own y axis
  (``reduce="stats"``: the values, mean with a band of one standard deviation, min and max;
  then ``|x|``, absmax and the least non-zero magnitude, with the largest dynamic range in
  bits; then l2; then, where one is not 0, the fractions of zeros and of a cast's
  underflows and overflows in percent), a log axis for magnitudes that span decades, a
  symmetric log axis for values that do; a line a row lacks (an older store's) is left
  out; a raw array of one value a row (a loss) is that value;
- ``"heatmap"``: steps by columns, ``log10(1 + count)``, with a colour bar in counts and
  the y axis labelled with a histogram's bin edges;
- ``"lines"``: one line per column of its ``plot_rows``, the first darkest.

Steps with a NaN or an infinity are marked (a red ``x`` above the values, how many and the
first in the panel's title); lines get markers where there are few points. The text is
sized to be read at 100% zoom (:data:`.canvas.FONT` at :data:`.canvas.DPI`).
"""
from __future__ import annotations

import base64
import html
import io
from typing import Any, NamedTuple, Optional
from collections.abc import Callable

import numpy as np

from . import series
from ..reductions import Pane, Stats
from .canvas import DPI, FONT, LABEL_X, Canvas, Plot, Scale, thin, tick_labels
from .grid import COLUMNS, Panel, layout

__all__ = ["draw_png", "write_html", "figure"]

#: Lines with at most this many points get markers.
FEW_POINTS = 60
#: One panel's size (inches): a cell of the grid (a row's panels share its width).
PANEL_W, PANEL_H = 4.4, 3.4
#: A panel's insides (inches): its title above, tick labels left, step labels below;
#: a heat map's colour bar takes more on the right.
PAD_TOP, PAD_LEFT, PAD_RIGHT, PAD_BOTTOM, PAD_BAR = 0.5, 1.0, 0.18, 0.5, 0.78
#: The space between the plots of one panel (inches).
GAP = 0.1
#: The margin around the grid (inches).
MARGIN = 0.12
#: The tallest PNG (inches): Agg draws at most 2^16 pixels a side.
MAX_HEIGHT = 640.0
#: The colours of the statistics' lines; a column not named here takes one of EXTRA.
COLORS = {"mean": "#1f77b4", "min": "#ff7f0e", "max": "#2ca02c", "absmax": "#d62728",
          "l2": "#9467bd", "absmin_nonzero": "#8c564b", "zero_fraction": "#7f7f7f",
          "underflow_fraction": "#17becf", "overflow_fraction": "#e377c2", "bad": "#e00000"}
#: What the legend calls a line where its column's name would not say it.
LABELS = {"absmin_nonzero": "absmin≠0", "zero_fraction": "zeros %",
          "underflow_fraction": "underflow %", "overflow_fraction": "overflow %"}
EXTRA = ("#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f")


def _color(column: str) -> str:
    if column in COLORS:
        return COLORS[column]
    others = [c for p in Stats.panes for c in p.lines if c not in COLORS]
    return EXTRA[others.index(column) % len(EXTRA)] if column in others else EXTRA[-1]


def _how(column: str) -> str:
    """How bins of steps summarize a column of statistics: the extremes as such, the mean
    and spread as means, the rest (magnitudes, counts) by their largest."""
    return {"min": "min", "mean": "mean", "std": "mean"}.get(column, "max")


def _bad_marks(cv: Canvas, plot: Plot, bad: np.ndarray) -> None:
    """A red ``x`` at the top of ``plot`` for each step with a NaN or an infinity."""
    if bad.size:
        bx = plot.tx(bad.astype(np.float64))
        cv.marks[(COLORS["bad"], "x", 22)].append(
            np.column_stack([bx, np.full(bad.size, plot.y0 + plot.h - 0.08)]))


def _most_ticks(h: float) -> int:
    return 4 if h >= 1.2 else 3 if h >= 0.55 else 2


def _scalar(p: Panel) -> bool:
    """Rows of one value each (a raw array of a loss): drawn as that value."""
    return bool(len(p.steps)) and p.reader.scalar(p.values)


def _stats_panel(cv: Canvas, p: Panel, box: tuple[float, float, float, float]) -> None:
    """The plots of the reader's ``panes``, stacked (or the value, rows of one value)."""
    x0, y0, w, h = box
    x = p.steps.astype(np.float64)
    steps = (float(np.min(x)), float(np.max(x)))
    few = len(x) <= FEW_POINTS
    values = p.reader.named(p.values)
    if _scalar(p):
        xm, value = thin(x, values["mean"])
        positive = bool((value[np.isfinite(value)] > 0).all())  # a loss: log where it spans
        plot = Plot(cv, box, steps, Scale([value], positive=positive))
        plot.line(xm, value, COLORS["mean"], markers=few)
        plot.yticks("value", _most_ticks(h))
        plot.xticks(labels=True)
        _bad_marks(cv, plot, p.bad_steps)
        return
    panes = _drawn(p, values)
    total = sum(pane.height for pane in panes)
    room = h - GAP * (len(panes) - 1)
    top = y0 + h
    for i, pane in enumerate(panes):
        ph = room * pane.height / total
        wanted = [*pane.lines, *(pane.band or ())]
        data = {c: thin(x, values[c], _how(c)) for c in dict.fromkeys(wanted)}
        xm = data[wanted[0]][0]
        if pane.band:
            mid, spread = data[pane.band[0]][1], data[pane.band[1]][1]
            shown = [data[c][1] for c in pane.lines] + [mid - spread, mid + spread]
        else:
            shown = [data[c][1] for c in pane.lines]
        plot = Plot(cv, (x0, top - ph, w, ph), steps, Scale(shown, positive=pane.positive))
        if pane.band:
            plot.band(xm, mid - spread, mid + spread, _color(pane.band[0]))
        for c in pane.lines:
            dashed = c in pane.dashed
            plot.line(xm, data[c][1], _color(c), 0.9 if dashed else 1.2,
                      "dashed" if dashed else "solid", markers=few)
        alone = len(pane.lines) == 1 and not pane.band  # its label in its line's colour
        plot.yticks(pane.label, _most_ticks(ph), _color(pane.lines[0]) if alone else None)
        plot.xticks(labels=i == len(panes) - 1)
        if i == 0:
            _bad_marks(cv, plot, p.bad_steps)
        bits = values.get("dynamic_range_bits")
        if "absmin_nonzero" in pane.lines and bits is not None and np.isfinite(bits).any():
            cv.text(x0 + w - 0.05, top - 0.05, f"range up to {np.nanmax(bits):.1f} bits",
                    "tick", color=_color("absmin_nonzero"), ha="right", va="top")
        top -= ph + GAP


def _drawn(p: Panel, values: dict[str, np.ndarray]) -> list[Pane]:
    """The panes of ``p``'s reduction that have something to draw, each with the lines
    its rows hold (a column an older store lacks is NaN throughout); an ``optional`` pane
    only where one of its lines is not 0."""
    out = []
    for pane in p.reader.panes:
        lines = tuple(c for c in pane.lines if c in values and np.isfinite(values[c]).any())
        if not lines or (pane.band and pane.band[0] not in lines):
            continue
        if pane.optional and not any(np.nan_to_num(values[c]).any() for c in lines):
            continue
        out.append(Pane(pane.label, lines, tuple(c for c in pane.dashed if c in lines),
                        pane.band, pane.positive, pane.height, pane.optional))
    return out


def _heatmap_panel(cv: Canvas, p: Panel, box: tuple[float, float, float, float]) -> None:
    """Steps by columns (a histogram's bins), ``log10(1 + count)``, with a colour bar on
    the right labelled in counts; the y axis labelled with the reader's
    ``heatmap_edges``, where it has them."""
    counts = p.values
    x0, y0, w, h = box
    x = p.steps.astype(np.float64)
    if len(x) > 1500:  # bins of steps, their counts summed
        starts = np.linspace(0, len(x), 1501).astype(np.int64)[:-1]
        counts = np.add.reduceat(counts, starts, axis=0)
        x = x[starts]
    right = float(x[-1]) + (float(x[-1] - x[-2]) if len(x) > 1 else 1.0)
    nb = counts.shape[1]
    plot = Plot(cv, box, (float(x[0]), right), Scale([np.array([0.0, nb])], positive=False))
    plot.scale.lo, plot.scale.hi = 0.0, float(nb)
    image = np.log10(1 + np.asarray(counts, np.float64).T)
    vmax = max(float(image.max()), 1e-9)
    cv.image(image, box, vmax)
    edges_and_log = p.reader.heatmap_edges(p.reduce)
    edges = np.asarray(edges_and_log[0] if edges_and_log else [], np.float64)
    log = bool(edges_and_log and edges_and_log[1])
    if edges.size:  # edge i is the bottom of row i + 1 (row 0: the values below)
        at = np.unique(np.linspace(0, len(edges) - 1, min(len(edges), _most_ticks(h) + 1))
                       .astype(int))
        for i, text in zip(at, tick_labels([float(edges[i]) for i in at], log=log)):
            y = y0 + (i + 1) / nb * h
            cv.frame(np.array([[x0 - 0.05, y], [x0, y]]))
            cv.text(x0 - 0.07, y, text, "tick", ha="right", va="center")
    cv.text(x0 - LABEL_X, y0 + h / 2, ("|x|" if log else "x") + ", bin edges", rotation=90,
            ha="center", va="center")
    plot.xticks(labels=True)
    # The colour bar: counts 0, 1, 10, 100, ... where log10(1 + count) is.
    bx, bw = x0 + w + 0.1, 0.13
    cv.image(np.linspace(0, vmax, 64)[:, None], (bx, y0, bw, h), vmax)
    cv.frame(np.array([[bx, y0], [bx + bw, y0], [bx + bw, y0 + h], [bx, y0 + h], [bx, y0]]))
    ticks = [0.0] + [10.0 ** k for k in range(12) if np.log10(1 + 10.0 ** k) <= vmax]
    step = max(1, -(-len(ticks) // _most_ticks(h)))
    ticks = ticks[::step]
    for t, text in zip(ticks, tick_labels(ticks, log=True)):
        y = y0 + np.log10(1 + t) / vmax * h
        cv.frame(np.array([[bx + bw, y], [bx + bw + 0.05, y]]))
        cv.text(bx + bw + 0.07, y, text, "tick", ha="left", va="center")
    cv.text(bx + bw / 2, y0 + h + 0.06, "count", "tick", ha="center", va="bottom")


def _lines_panel(cv: Canvas, p: Panel, box: tuple[float, float, float, float]) -> None:
    """One line per column of the reduction's :meth:`plot_rows`, the first darkest."""
    import matplotlib
    values = p.values
    x0, y0, w, h = box
    x = p.steps.astype(np.float64)
    few = len(x) <= FEW_POINTS
    ys = [thin(x, values[:, j], "max") for j in range(values.shape[1])]
    plot = Plot(cv, box, (float(np.min(x)), float(np.max(x))),
                Scale([y for _, y in ys] or [np.zeros(1)], positive=False))
    cmap = matplotlib.colormaps["viridis"]
    n = len(ys)
    labels = p.reader.plot_labels(p.reduce, n)
    for j, (xm, y) in enumerate(ys):
        color = matplotlib.colors.to_hex(cmap(0.85 * j / max(n - 1, 1)))
        plot.line(xm, y, color, markers=few)
        if j in (0, n - 1):
            cv.text(x0 + w - 0.05, y0 + h - 0.08 - (0.17 if j else 0.0), labels[j], "tick",
                    color=color, ha="right", va="top")
    plot.yticks("value", _most_ticks(h))
    plot.xticks(labels=True)


class Painter(NamedTuple):
    """How one style of :attr:`Readback.plot` is drawn: ``paint`` into a panel's box, the
    room it takes on the box's right (``pad``: a colour bar's), and what the legend says
    of it where a panel is drawn so (None: nothing)."""
    paint: Callable[[Canvas, Panel, tuple[float, float, float, float]], None]
    pad: float = PAD_RIGHT
    legend: Optional[str] = None


#: How each :attr:`Readback.plot` is drawn.
PAINTERS: dict[str, Painter] = {
    "stats": Painter(_stats_panel),
    "heatmap": Painter(_heatmap_panel, PAD_BAR,
                       "heat maps: log10(1 + count), the colour bar in counts"),
    "lines": Painter(_lines_panel)}


def _painter(p: Panel) -> Painter:
    return PAINTERS.get(p.plot, PAINTERS["lines"])


def _what(p: Panel) -> str:
    return "scalar" if _scalar(p) else p.reader.plot_title(p.reduce)


def _title(cv: Canvas, p: Panel, x: float, top: float, w: float) -> None:
    """The panel's name, what it shows and its rows on one line (the name shortened from
    the left where the line would not fit), and its NaN or infinity steps in red."""
    tail = f"  ({_what(p)}, {len(p.steps)} rows)"
    fits = int((w - 0.2) / (FONT["title"] * 0.56 / 72))  # characters of the title's font
    name = p.name if len(p.name) + len(tail) <= fits else \
        "…" + p.name[-max(8, fits - len(tail) - 1):]
    cv.text(x + 0.08, top - 0.06, name + tail, "title", va="top", ha="left")
    bad = p.bad_steps
    if bad.size:
        many = f"{bad.size} steps, the first" if bad.size > 1 else "step"
        cv.text(x + 0.08, top - 0.27, f"NaN or infinity at {many} {int(bad[0])}", "tick",
                color=COLORS["bad"], va="top", ha="left")


def _wrap(text: str, width: float, points: float) -> list[str]:
    """``text`` in lines of at most ``width`` inches of a font of ``points``, broken after
    its commas (a word longer than a line stays whole)."""
    fits = max(10, int(width / (points * 0.62 / 72)))
    out = [""]
    for word in text.split(", "):
        if out[-1] and len(out[-1]) + len(word) + 1 > fits:
            out[-1] += ","
            out.append(word)
        else:
            out[-1] += f", {word}" if out[-1] else word
    return out


def _legend_items(panels: list[Panel]) -> list[tuple[str, str, str]]:
    """What the legend shows, as ``(style, colour, text)``: the lines of the statistics'
    plots, the NaN mark, what the heat maps' colours are."""
    stats = [p for p in panels if p.reader.panes]
    items: list[tuple[str, str, str]] = []
    drawn = {c: c in pane.dashed for p in stats if len(p.steps) and not _scalar(p)
             for pane in _drawn(p, p.reader.named(p.values)) for c in pane.lines}
    every = [(c, pane) for p in stats for pane in p.reader.panes for c in pane.lines]
    for c, pane in dict.fromkeys(every):
        if c in drawn:
            items.append(("dashed" if drawn[c] else "solid", _color(c), LABELS.get(c, c)))
            if pane.band and pane.band[0] == c:
                items.append(("band", _color(c), f"{c} ± {pane.band[1]}"))
    if stats:
        items.append(("x", COLORS["bad"], "a step with a NaN or an infinity"))
    for text in dict.fromkeys(_painter(p).legend for p in panels):
        if text is not None:
            items.append(("text", "", text))
    return items


def _legend_width(item: tuple[str, str, str]) -> float:
    return (0.0 if item[0] == "text" else 0.42) + 0.075 * len(item[2]) + 0.3


def _legend_lines(items: list[tuple[str, str, str]], width: float) -> list[list[tuple]]:
    """The legend's items, line by line, within ``width`` inches."""
    lines: list[list[tuple]] = [[]]
    used = 0.0
    for item in items:
        need = _legend_width(item)
        if lines[-1] and used + need > width:
            lines.append([])
            used = 0.0
        lines[-1].append(item)
        used += need
    return lines if lines[0] else []


def _legend(cv: Canvas, y: float, lines: list[list[tuple]]) -> None:
    for line in lines:
        x = MARGIN + 0.05
        for style, color, text in line:
            if style == "band":
                cv.bands[color].append(np.array([[x, y - 0.07], [x + 0.32, y - 0.07],
                                                 [x + 0.32, y + 0.07], [x, y + 0.07]]))
            elif style == "x":
                cv.marks[(color, "x", 22)].append(np.array([[x + 0.16, y]]))
            elif style != "text":
                cv.lines[(color, 1.6, style)].append(np.array([[x, y], [x + 0.32, y]]))
            cv.text(x + (0.0 if style == "text" else 0.42), y, text, "label", va="center")
            x += _legend_width((style, color, text))
        y -= LEGEND_LINE


#: The height of one line of the legend (inches).
LEGEND_LINE = 0.27


def _grid(panels: list[Panel]) -> list[list[Panel]]:
    """:func:`.grid.layout` with more columns where the rows would not fit in one PNG."""
    for columns in (COLUMNS, 6, 8, 12, 16):
        rows = layout(panels, columns)
        if len(rows) * PANEL_H <= MAX_HEIGHT - 1:
            return rows
    raise ValueError(f"hostfeed: {len(panels)} arrays are too many for one picture "
                     f"({len(rows)} rows of {columns}): choose some with patterns "
                     f"(blocks.1*), or write an HTML page (-o FILE.html), a picture per "
                     f"module")


def figure(panels: list[Panel], title: Optional[str], legend: bool) -> Any:
    """The grid of ``panels`` as one matplotlib figure; ``fig.hostfeed_cells`` maps each
    array's name to its cell's box (inches from the bottom left: x, y, width, height)."""
    rows = _grid(panels)
    ncols = max([len(r) for r in rows] + [1])
    w = 2 * MARGIN + PANEL_W * ncols
    lines = _legend_lines(_legend_items(panels), w - 2 * MARGIN) if legend else []
    heads = _wrap(title, w - 2 * MARGIN, FONT["head"]) if title else []
    above = 0.26 * len(heads) + (0.16 if heads else 0.0)
    head = MARGIN + above + LEGEND_LINE * len(lines) + 0.05
    h = head + PANEL_H * len(rows) + MARGIN
    cv = Canvas(w, h)
    for i, text in enumerate(heads):
        cv.text(MARGIN + 0.05, h - MARGIN - 0.26 * i, text, "head", va="top", ha="left")
    _legend(cv, h - MARGIN - above - LEGEND_LINE / 2, lines)
    for r, row in enumerate(rows):
        cell_w = (w - 2 * MARGIN) / len(row)
        top = h - head - r * PANEL_H
        for c, p in enumerate(row):
            left = MARGIN + c * cell_w
            cv.cells[p.name] = (left, top - PANEL_H, cell_w, PANEL_H)
            _title(cv, p, left, top, cell_w)
            painter = _painter(p)
            box = (left + PAD_LEFT, top - PANEL_H + PAD_BOTTOM,
                   cell_w - PAD_LEFT - painter.pad, PANEL_H - PAD_TOP - PAD_BOTTOM)
            if len(p.steps) == 0:
                cv.text(box[0] + box[2] / 2, box[1] + box[3] / 2, "no rows yet", "title",
                        ha="center", va="center")
            else:
                painter.paint(cv, p, box)
    return cv.finish()


def draw_png(panels: list[Panel], title: str, out: Any) -> Any:
    """The grid of every panel, under ``title``, into ``out`` (a path or a binary file);
    returns the figure."""
    fig = figure(panels, title, legend=True)
    fig.savefig(out, format="png", dpi=DPI)
    return fig


def write_html(panels: list[Panel], title: str, table: list[dict], out: str) -> None:
    """One self-contained HTML page: the title, the arrays' table, and each module's
    panels as an embedded PNG (nothing is fetched from anywhere when it opens)."""
    modules: dict[str, list[Panel]] = {}
    for row in layout(panels):
        for p in row:
            modules.setdefault(p.module, []).append(p)
    key = "".join(f"<span class='k' style='background:{_color(c)}'></span>"
                  f"{html.escape(LABELS.get(c, c))}" for pane in Stats.panes for c in pane.lines)
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title>",
        "<style>body{font-family:sans-serif;margin:1em}table{border-collapse:collapse;"
        "font-size:13px}td,th{padding:2px 8px;text-align:left;border-bottom:1px solid #ddd}"
        "img{display:block;max-width:100%}h2{font-size:15px;margin:1.2em 0 .2em}"
        ".k{display:inline-block;width:1.2em;height:.3em;margin:0 .3em .2em 1em}</style>",
        "</head><body>", f"<h1 style='font-size:18px'>{html.escape(title)}</h1>",
        f"<p>{key} (the mean with a band of ± one standard deviation) &nbsp; "
        f"<b style='color:red'>x</b>: a step with a NaN or an infinity; heat maps: "
        f"log10(1 + count) per step and bin, the colour bar in counts</p>",
        "<table><tr><th>array</th><th>rows</th><th>steps</th><th>dtype</th>"
        "<th>row shape</th><th>summary</th></tr>"]
    for r in table:
        steps = "-" if r["steps"] is None else f"{r['steps'][0]}..{r['steps'][1]}"
        anchor = html.escape(series.module_of(r["name"]) or "(top level)", quote=True)
        parts.append(f"<tr><td><a href='#{anchor}'>{html.escape(r['name'])}</a></td>"
                     f"<td>{r['rows']}</td><td>{steps}</td><td>{r['dtype']}</td>"
                     f"<td>{list(r['shape'])}</td><td>{r['reduce'] or ''}</td></tr>")
    parts.append("</table>")
    for module, cells in modules.items():
        fig = figure(cells, None, legend=False)
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=DPI)
        data = base64.b64encode(buf.getvalue()).decode("ascii")
        label = html.escape(module or "(top level)", quote=True)
        parts.append(f"<h2 id='{label}'>{label}</h2>"
                     f"<img alt='{label}' src='data:image/png;base64,{data}'>")
    parts.append("</body></html>")
    with open(out, "w", encoding="utf-8") as f:
        f.write("\n".join(parts))
