"""Plain-text layout of the bench's report: tables that fit a terminal, prose wrapped."""
from __future__ import annotations

import textwrap

#: The widest line the report prints (a terminal's width, with room to spare).
WIDTH = 100


def grid(header: list[str], rows: list[list[str]], first_left: bool = True) -> list[str]:
    """Rows of cells as aligned columns (each as wide as its widest cell, two spaces
    apart), so that no header runs into the next. A table wider than :data:`WIDTH` is cut
    into several, each repeating the first column.

    Example:
        >>> for line in grid(["method", "p50"], [["a", "1.00"], ["bb", "2.50"]]):
        ...     print(line)
          method   p50
          a       1.00
          bb      2.50
    """
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    blocks: list[list[int]] = [[]]
    used = 2 + widths[0]
    for i in range(1, len(header)):
        if blocks[-1] and used + 2 + widths[i] > WIDTH:
            blocks.append([])
            used = 2 + widths[0]
        blocks[-1].append(i)
        used += 2 + widths[i]

    def line(cells: list[str], cols: list[int]) -> str:
        return "  " + "  ".join(cells[i].ljust(widths[i]) if i == 0 and first_left
                                else cells[i].rjust(widths[i]) for i in [0, *cols]).rstrip()
    out: list[str] = []
    for cols in blocks:
        out += [line(header, cols), *[line(r, cols) for r in rows]]
    return out


def fit(lines: list[str], width: int = WIDTH) -> list[str]:
    """Lines longer than ``width`` wrapped at spaces, continued two spaces further in.

    Example:
        >>> fit(["  one two three"], width=10)
        ['  one two', '    three']
    """
    out: list[str] = []
    for text in lines:
        if len(text) <= width:
            out.append(text)
            continue
        lead = text[:len(text) - len(text.lstrip())]
        out += textwrap.wrap(text.strip(), width, initial_indent=lead,
                             subsequent_indent=lead + "  ", break_on_hyphens=False)
    return out
