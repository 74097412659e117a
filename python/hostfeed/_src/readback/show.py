"""``python -m hostfeed show STORE [NAME]``: a recording's table (names, rows, steps, dtype,
bytes) and, for one array, a plot over steps (matplotlib, PNG): statistics as lines (mean
with a band of one standard deviation, min and max), a histogram as an image (steps by
bins), a raw array as the mean and spread of each row."""
from __future__ import annotations

import sys
from typing import Any, Optional, TextIO

import numpy as np

from .opened import RecordedArray, open_recording


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)  # pragma: no cover


def table(path: Any, out: TextIO = sys.stdout) -> None:
    """Prints one line per recorded array."""
    rec = open_recording(path)
    rows = rec.table()
    width = max([len(r["name"]) for r in rows] + [4])
    print(f"{rec.path}: {len(rows)} arrays", file=out)
    print(f"  {'name':<{width}}  {'rows':>8}  {'steps':>13}  {'dtype':<9} {'row shape':<16}"
          f"{'bytes':>11}  summary", file=out)
    for r in rows:
        steps = "-" if r["steps"] is None else f"{r['steps'][0]}..{r['steps'][1]}"
        print(f"  {r['name']:<{width}}  {r['rows']:>8}  {steps:>13}  {r['dtype']:<9} "
              f"{list(r['shape'])!s:<16}{_size(r['bytes']):>11}  {r['reduce'] or ''}",
              file=out)


def plot(arr: RecordedArray, png: str) -> None:
    """Draws ``arr`` over its steps into ``png``."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = arr.steps
    x = np.where(steps >= 0, steps, np.arange(len(arr)))
    data = arr[:]
    reduce = arr.attrs.get("reduce", {})
    kind = reduce.get("kind")
    fig, ax = plt.subplots(figsize=(9, 4.5), dpi=100)
    if kind == "stats":
        cols = {c: i for i, c in enumerate(reduce["columns"])}
        v = data.reshape(len(arr), -1, len(cols))
        mean, std = v[..., cols["mean"]].mean(1), v[..., cols["std"]].mean(1)
        ax.plot(x, mean, color="C0", label="mean")
        ax.fill_between(x, mean - std, mean + std, color="C0", alpha=0.2, label="mean ± std")
        ax.plot(x, v[..., cols["min"]].min(1), color="C1", linestyle="--", label="min")
        ax.plot(x, v[..., cols["max"]].max(1), color="C2", linestyle="--", label="max")
        bad = v[..., cols["nan_count"]].sum(1) + v[..., cols["inf_count"]].sum(1)
        if bad.any():
            ax.scatter(x[bad > 0], mean[bad > 0], color="C3", marker="x", label="NaN/inf seen")
        if v.shape[1] > 1:
            ax.set_title(f"{arr.name}: statistics over steps ({v.shape[1]} rows each, averaged)")
        else:
            ax.set_title(f"{arr.name}: statistics over steps")
        ax.legend(loc="best")
    elif kind == "histogram":
        counts = data.reshape(len(arr), -1, data.shape[-1]).sum(1).astype(np.float64)
        edges = np.asarray(reduce["edges"])
        image = ax.imshow(np.log10(1 + counts.T), aspect="auto", origin="lower",
                          extent=(float(x[0]), float(x[-1]) + 1, 0, counts.shape[1]),
                          cmap="viridis")
        ticks = np.linspace(1, len(edges), min(len(edges), 9)).astype(int) - 1
        ax.set_yticks(ticks + 1, [f"{edges[t]:.3g}" for t in ticks])
        ax.set_ylabel(("|x| " if "log" in reduce.get("scale", "") else "") + "bin lower edge")
        fig.colorbar(image, ax=ax, label="log10(1 + count)")
        ax.set_title(f"{arr.name}: histogram over steps (below and above at the ends)")
    else:
        flat = data.reshape(len(arr), -1).astype(np.float64)
        mean, std = flat.mean(1), flat.std(1)
        ax.plot(x, mean, color="C0", label="row mean")
        ax.fill_between(x, mean - std, mean + std, color="C0", alpha=0.2, label="± row std")
        ax.legend(loc="best")
        ax.set_title(f"{arr.name}: each row's mean and spread")
    ax.set_xlabel("step")
    fig.tight_layout()
    fig.savefig(png)
    plt.close(fig)


def main(path: Any, name: Optional[str], png: Optional[str], out: TextIO = sys.stdout) -> int:
    """``python -m hostfeed show``: the table, then the plot of ``name`` if given."""
    table(path, out)
    if name is None:
        return 0
    arr = open_recording(path)[name]
    if len(arr) == 0:
        print(f"{name}: no rows yet", file=out)
        return 1
    png = png or name.replace("/", "_") + ".png"
    plot(arr, png)
    print(f"drew {name} over {len(arr)} rows into {png}", file=out)
    return 0
