"""The last section of ``python -m hostfeed bench``: the README's table, row by row, with
this run's figure beside the committed runs' of the same processor (``_committed``,
generated from them by ``docs/figures.py``), so that a reader sees which of the README's
figures the run reproduced. A run on a processor without committed runs is compared with
none: ratios measured on one processor say little about another."""
from __future__ import annotations

import math
import textwrap
from typing import Any

from . import _committed, _processor
from ._markdown import SLACK, SUMMARY, load, outside
from ._text import WIDTH
from ._timing import AGREEMENT

#: The widths of the columns before the row's name: this run, README, the range.
_WIDTHS = (10, 9, 14)


def _value(unit: str, v: float) -> str:
    if unit == "x":
        return f"{v:.2f}x"
    return f"{v:.3g} us" if v < 100 else f"{v:.0f} us"


def _range(unit: str, lo: float, hi: float) -> str:
    if unit == "x":
        return f"{lo:.2f}-{hi:.2f}x"
    return f"{_value(unit, lo)[:-3]}-{_value(unit, hi)}"


def _line(cells: list[str], row: str) -> list[str]:
    """One row: the figures right-aligned in their columns, then the row's name, wrapped
    under itself."""
    lead = "  " + "".join(c.rjust(w) for c, w in zip(cells, _WIDTHS)) + "  "
    return textwrap.wrap(row, WIDTH, initial_indent=lead,
                         subsequent_indent=" " * (len(lead) + 2), break_on_hyphens=False)


def committed_set(header: dict[str, Any]) -> dict[str, Any] | None:
    """The committed runs of the processor a run's ``header`` names, or None.

    Example:
        >>> committed_set({"processor": {"model": "no such processor"}}) is None
        True
    """
    return next((s for s in _committed.SETS
                 if _processor.same(header, {"processor": s["processor"]})), None)


def text(result: dict[str, Any]) -> list[str]:
    """The README's rows with ``result``'s figure (its time ratio, or for a row without a
    baseline its own figure) beside the README's (the cited committed run of the same
    processor) and its range over those committed runs, each row named as in the README
    and followed by where this report shows its figure (section: method, column); '~'
    after this run's figure where its rounds say two runs may differ by more than 15%.

    Example:
        >>> lines = text({"header": {"quick": True, "load_average": 5.1,
        ...                          "processor": _committed.SETS[0]["processor"]}})
        >>> lines[0].startswith("the README's table")
        True
        >>> next(ln for ln in lines if "compile a function" in ln).split()[:2]  # not run
        ['-', '...x']
    """
    h = result["header"]
    kind = "a quick run" if h.get("quick") else "a full run"
    chosen = committed_set(h)
    if chosen is None:
        return _alone(result, kind)
    runs = chosen["runs"]
    lines = [f"the README's table (README.md, docs/performance.md), each row as named there: "
             f"this run ({kind}, {load(result)}) beside the committed ratio (for a row "
             f"without a baseline, its hostfeed figure) and its range over {runs} full runs "
             f"on a quiet machine with the same processor ({chosen['machine']}; load "
             f"{chosen['loads']} when each started). Load and --quick move these figures "
             f"(the README shows quick runs on a busy machine beside them); '!': more than "
             f"{SLACK:.0%} outside the committed range; '~': noisy in this run (its rounds "
             f"say two runs may differ by more than {AGREEMENT:.0%}); '-': not measured in "
             f"this run. [the section: method, column it comes from]",
             _line(["this run", "README", f"over {runs} runs"], "row")[0]]
    committed = {q: (unit, cited, lo, hi) for q, unit, cited, lo, hi in chosen["rows"]}
    for row in SUMMARY:
        if row.question not in committed:
            continue
        unit, cited, lo, hi = committed[row.question]
        figure = row.figure(result)
        mine = None if figure is None else figure.ratio if unit == "x" else figure.value
        if mine is None or not math.isfinite(mine):
            now = "-  "
        else:
            marks = ((" !" if outside(mine, [lo, hi]) else "")
                     + (" ~" if figure is not None and figure.noisy else ""))
            now = _value(unit, mine) + (marks or "  ")
        lines += _line([now, _value(unit, cited), _range(unit, lo, hi)],
                       f"{row.question} [{row.source}]")
    return lines


def _alone(result: dict[str, Any], kind: str) -> list[str]:
    """The README's rows with this run's figures alone: no committed run is of its
    processor."""
    known = "; ".join(f"{s['name']} ({s['folder'] or 'docs/'})" for s in _committed.SETS)
    lines = [f"the README's table (README.md, docs/performance.md), each row as named there: "
             f"this run ({kind}, {load(result)}) alone. No committed run is of this "
             f"processor ({_processor.name(result['header'])}); the committed runs are of "
             f"{known}, and ratios measured on one processor say little about another. "
             f"'~': noisy in this run (its rounds say two runs may differ by more than "
             f"{AGREEMENT:.0%}); '-': not measured in this run. [the section: method, "
             f"column it comes from]", _line(["this run", "", ""], "row")[0]]
    for row in SUMMARY:
        figure = row.figure(result)
        if figure is None:
            now = "-  "
        else:
            value = figure.ratio if math.isfinite(figure.ratio) else figure.value
            now = _value("x" if math.isfinite(figure.ratio) else "us", value) + (
                " ~" if figure.noisy else "  ")
        lines += _line([now, "", ""], f"{row.question} [{row.source}]")
    return lines
