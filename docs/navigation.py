"""The site's navigation, written as plain links on the front page (``index.md``): a
paragraph of Markdown links after a ``<!-- toctree: CAPTION, maxdepth N -->`` line is, on
a code host, a list of links, and on the docs site also a hidden toctree of the same pages
in the same order (``conf.py`` adds it when Sphinx reads the page: no directive is
visible where the page is read raw).

Example:
    >>> text = "<!-- toctree: User guide, maxdepth 2 -->\\nSee [A](a.md) · [B](b.md).\\n"
    >>> toctrees(text)
    [('User guide', 2, ['a', 'b'])]
    >>> print(expand(text).split("\\n\\n", 1)[1].strip())
    ```{toctree}
    :hidden:
    :caption: User guide
    :maxdepth: 2
    <BLANKLINE>
    a
    b
    ```
"""
from __future__ import annotations

import re

__all__ = ["toctrees", "expand"]

_MARK = re.compile(r"<!-- toctree: (?P<caption>[^,>]+), maxdepth (?P<depth>\d+) -->\n"
                   r"(?P<links>.*?)(?=\n\n|\n*\Z)", re.S)


def toctrees(text: str) -> list[tuple[str, int, list[str]]]:
    """Each marked paragraph's caption, depth and the pages it links (names without
    ``.md``), in order."""
    return [(m["caption"].strip(), int(m["depth"]), re.findall(r"\]\(([\w-]+)\.md\)", m["links"]))
            for m in _MARK.finditer(text)]


def expand(text: str) -> str:
    """``text`` with a hidden toctree after each marked paragraph."""
    def tree(m: re.Match) -> str:
        (caption, depth, pages), = toctrees(m.group(0))
        return (f"{m.group(0)}\n\n```{{toctree}}\n:hidden:\n:caption: {caption}\n"
                f":maxdepth: {depth}\n\n" + "\n".join(pages) + "\n```\n")
    return _MARK.sub(tree, text)
