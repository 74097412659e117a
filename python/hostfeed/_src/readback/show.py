"""``python -m hostfeed show STORE [PATTERN ...] [-o FILE.png|FILE.html]``: a recording's
table (names, rows, steps, dtype, bytes), its triggers (and where a non-finite value first
appeared), then a picture of it (:mod:`.grid`): every array
(or those the glob patterns choose, as ``capture`` matches names), one row per module, into
a PNG or a self-contained HTML file. An exact array's name draws that array alone (into
``NAME.png`` by default, ``/`` as ``_``)."""
from __future__ import annotations

import os
import sys
import time
from typing import Any, Optional, TextIO
from collections.abc import Sequence

from . import draw, grid, series, triggers
from .opened import Recording, open_recording


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)  # pragma: no cover


def table(path: Any, out: Optional[TextIO] = None) -> list[dict[str, Any]]:
    """Prints one line per recorded array of ``path`` (a store or a :class:`Recording`) on
    ``out`` (``sys.stdout`` as it is at the call); returns :meth:`Recording.table`."""
    out = sys.stdout if out is None else out
    rec = path if isinstance(path, Recording) else open_recording(path)
    rows = rec.table()
    width = max([len(r["name"]) for r in rows] + [4])
    print(f"{rec.path}: {len(rows)} array{'' if len(rows) == 1 else 's'}", file=out)
    print(f"  {'name':<{width}}  {'rows':>8}  {'steps':>13}  {'dtype':<9} {'row shape':<16}"
          f"{'bytes':>11}  summary", file=out)
    for r in rows:
        steps = "-" if r["steps"] is None else f"{r['steps'][0]}..{r['steps'][1]}"
        print(f"  {r['name']:<{width}}  {r['rows']:>8}  {steps:>13}  {r['dtype']:<9} "
              f"{list(r['shape'])!s:<16}{_size(r['bytes']):>11}  {r['reduce'] or ''}",
              file=out)
    return rows


def default_output(path: Any, patterns: Sequence[str]) -> str:
    """Where ``show`` draws without ``-o``: ``NAME.png`` for one array's exact name, else
    the store's name with ``.png`` (``run.zarr`` -> ``run.png``), in the current directory."""
    if len(patterns) == 1:
        return patterns[0].replace("/", "_") + ".png"
    base = os.path.basename(str(path).rstrip("/")) or "recording"
    return os.path.splitext(base)[0] + ".png"


def main(path: Any, patterns: Sequence[str], output: Optional[str],
         out: Optional[TextIO] = None) -> int:
    """``python -m hostfeed show``: the table, then the picture of the arrays ``patterns``
    choose (every one without a pattern) into ``output`` (``.png`` or ``.html``); prints on
    ``out`` (``sys.stdout`` as it is at the call)."""
    out = sys.stdout if out is None else out
    if output is not None and os.path.splitext(output)[1].lower() not in (".png", ".html",
                                                                         ".htm"):
        raise ValueError(f"-o {output!r}: draws into a .png or an .html file")
    rec = open_recording(path)
    info = {r["name"]: r for r in table(rec, out)}
    for line in triggers.lines(rec):
        print(line, file=out)
    if len(patterns) == 1 and patterns[0] in rec.names:
        names = list(patterns)  # an exact name: that array alone, whatever else it prefixes
    else:
        names = series.select(rec.names, patterns, rec.path)
    if not names:
        print("no arrays to draw", file=out)
        return 1
    if len(names) == 1 and len(rec[names[0]]) == 0:
        print(f"{names[0]}: no rows yet", file=out)
        return 1
    chosen = output is not None
    output = output or default_output(path, patterns if names == list(patterns) else ())
    replaced = os.path.exists(output)
    start = time.perf_counter()
    panels = grid.load(rec, names)
    title = grid.header(rec.path, panels)
    if output.lower().endswith((".html", ".htm")):
        draw.write_html(panels, title, [info[n] for n in names], output)
    else:
        draw.draw_png(panels, title, output)
    rows = sum(len(p.steps) for p in panels)
    what = names[0] if len(names) == 1 else f"{len(names)} arrays"
    took = time.perf_counter() - start
    print(f"drew {what} over {rows} rows into {os.path.abspath(output)} ({took:.1f} s"
          f"{'; the file that was there replaced' if replaced else ''})", file=out)
    if not chosen:
        print("(the default without -o: the store's name, or the array's, in the current "
              "directory; -o FILE.png or -o FILE.html draws elsewhere)", file=out)
    return 0
