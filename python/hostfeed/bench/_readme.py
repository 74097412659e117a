"""The last section of ``python -m hostfeed bench``: the README's table, row by row, with
this run's figure beside the committed runs' (``_committed``, generated from them by
``docs/figures.py``), so that a reader sees which of the README's figures the run
reproduced."""
from __future__ import annotations

import math
import textwrap
from typing import Any

from . import _committed
from ._markdown import SLACK, SUMMARY, load, outside
from ._text import WIDTH

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


def text(result: dict[str, Any]) -> list[str]:
    """The README's rows with ``result``'s figure (its time ratio, or for a row without a
    baseline its own figure) beside the README's (the cited committed run's) and its range
    over the committed runs, each row named as in the README and followed by where this
    report shows its figure (section: method, column).

    Example:
        >>> lines = text({"header": {"quick": True, "load_average": 5.1}})
        >>> lines[0].startswith("the README's table")
        True
        >>> next(ln for ln in lines if "compile a function" in ln).split()[:2]  # not run
        ['-', '...x']
    """
    h = result["header"]
    kind = "a quick run" if h.get("quick") else "a full run"
    lines = [f"the README's table (README.md, docs/performance.md), each row as named there: "
             f"this run ({kind}, {load(result)}) beside the README's ratio (for a row without "
             f"a baseline, its hostfeed figure) and its range over {_committed.RUNS} full runs "
             f"on a quiet machine ({_committed.MACHINE}; load {_committed.LOADS} when each "
             f"started). Load and --quick move these figures (the README shows quick runs on "
             f"a busy machine beside them); '!': more than {SLACK:.0%} outside the committed "
             f"range; '-': not measured in this run. [the section: method, column it comes "
             f"from]",
             _line(["this run", "README", f"over {_committed.RUNS} runs"], "row")[0]]
    committed = {q: (unit, cited, lo, hi) for q, unit, cited, lo, hi in _committed.ROWS}
    for row in SUMMARY:
        if row.question not in committed:
            continue
        unit, cited, lo, hi = committed[row.question]
        figure = row.figure(result)
        mine = None if figure is None else figure.ratio if unit == "x" else figure.value
        if mine is None or not math.isfinite(mine):
            now = "-  "
        else:
            now = _value(unit, mine) + (" !" if outside(mine, [lo, hi]) else "  ")
        lines += _line([now, _value(unit, cited), _range(unit, lo, hi)],
                       f"{row.question} [{row.source}]")
    return lines
