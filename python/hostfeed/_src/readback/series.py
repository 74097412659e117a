"""Which recorded arrays ``show`` draws and the TensorBoard export writes, and in what
order: the arrays chosen by glob patterns (as ``capture`` matches names), in natural order
(a module's arrays together, numbers by value), read in blocks of bounded bytes. What an
array's rows say is its reduction's read side (``hostfeed._src.reductions``:
``readback``).
"""
from __future__ import annotations

import difflib
import fnmatch
import re
from collections.abc import Iterable, Sequence

from ..record.roles import COTANGENT_SUFFIX

__all__ = ["blocks", "select", "natural_key", "module_of", "matches"]

#: The most bytes of rows read at a time (raw rows can be large: read in blocks).
BLOCK_BYTES = 64 << 20
#: How many names an error lists.
_LISTED = 40


def _tokens(text: str) -> tuple:
    return tuple((0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.split(r"(\d+)", text))


def natural_key(name: str) -> tuple:
    """A sort key: by module (the name up to its last ``/``, compared part by part, ``.``
    and ``/`` separating parts, so a module comes before its submodules), then by the
    array's own name; numbers by value (``blocks.2`` before ``blocks.10``); a cotangent
    right after the array it is the cotangent of (a summary's too: ``out.cotangent.stats``
    after ``out.stats``).

    Example:
        >>> sorted(["blocks.10/out", "blocks.2.mlp/out", "blocks.2/out.cotangent",
        ...         "blocks.2/out", "b"], key=natural_key)
        ['b', 'blocks.2/out', 'blocks.2/out.cotangent', 'blocks.2.mlp/out', 'blocks.10/out']
        >>> sorted(["m/out.cotangent.stats", "m/out.stats", "m/out.hist"], key=natural_key)
        ['m/out.hist', 'm/out.stats', 'm/out.cotangent.stats']
    """
    module, _, leaf = name.rpartition("/")
    pieces = leaf.split(".")
    cot = COTANGENT_SUFFIX[1:] in pieces[1:]  # NAME.cotangent, or NAME.cotangent.stats
    base = ".".join(p for i, p in enumerate(pieces) if i == 0 or p != COTANGENT_SUFFIX[1:])
    parts = tuple(_tokens(p) for p in re.split(r"[/.]", module)) if module else ()
    return (parts, _tokens(base), cot)


def module_of(name: str) -> str:
    """The module (group) an array belongs to: its name up to the last ``/`` (``""`` for
    an array at the top of the store).

    Example:
        >>> module_of("blocks.2.mlp/output.cotangent"), module_of("loss")
        ('blocks.2.mlp', '')
    """
    return name.rpartition("/")[0]


def _parts(name: str) -> list[str]:
    return re.split(r"[/.]", name)


def _match_parts(pattern: Sequence[str], name: Sequence[str], prefix: bool) -> bool:
    """Whether ``name``'s parts (or, with ``prefix``, its first parts) match ``pattern``'s
    (``**``: any number of parts), as ``capture`` matches a submodule's name."""
    if not pattern:
        return prefix or not name
    head, rest = pattern[0], pattern[1:]
    if head == "**":
        return any(_match_parts(rest, name[i:], prefix) for i in range(len(name) + 1))
    return bool(name) and fnmatch.fnmatchcase(name[0], head) and \
        _match_parts(rest, name[1:], prefix)


def matches(pattern: str, name: str) -> bool:
    """Whether ``pattern`` chooses the array ``name``: split on ``/`` and ``.`` (the
    separators of a store's groups and of Flax NNX, Flax Linen and Equinox names), ``*``,
    ``?`` and ``[...]`` within a part, ``**`` for any number of parts; a pattern that
    matches the name's first parts chooses the arrays under them (``blocks.2`` chooses
    ``blocks.2.mlp/output``, ``h`` chooses ``h.cotangent``).

    Example:
        >>> [matches("blocks.*", n) for n in ("blocks.2.mlp/output", "head/output")]
        [True, False]
        >>> [matches("**.cotangent", n) for n in ("fc1/output.cotangent", "fc1/output")]
        [True, False]
    """
    return _match_parts(_parts(pattern), _parts(name), prefix=True)


def select(names: Iterable[str], patterns: Sequence[str], where: str) -> list[str]:
    """The names that any of ``patterns`` chooses (every name without a pattern), in
    natural order. A pattern that chooses nothing is a ``KeyError`` listing the names.

    Example:
        >>> select(["blocks.10/h", "blocks.2/h", "loss"], ["blocks.*"], "run.zarr")
        ['blocks.2/h', 'blocks.10/h']
    """
    names = sorted(names, key=natural_key)
    if not patterns:
        return names
    chosen = [n for n in names if any(matches(p, n) for p in patterns)]
    idle = [p for p in patterns if not any(matches(p, n) for n in names)]
    if idle:
        near = difflib.get_close_matches(idle[0], names, n=_LISTED, cutoff=0.0)
        more = f" (and {len(names) - _LISTED} more)" if len(names) > _LISTED else ""
        raise KeyError(f"hostfeed: no array {', '.join(map(repr, idle))} in {where}: no "
                       f"name matches; it has {near or 'none'}{more} (nearest first; a "
                       f"pattern is split on '/' and '.', '*' within a part, '**' for any "
                       f"parts)")
    return chosen


def blocks(n: int, row_bytes: int, most: int = 4096) -> list[tuple[int, int]]:
    """The ranges of ``n`` rows of ``row_bytes`` each read at a time: at most ``most``
    rows and :data:`BLOCK_BYTES` bytes (one row at least).

    Example:
        >>> blocks(10, 30 << 20)
        [(0, 2), (2, 4), (4, 6), (6, 8), (8, 10)]
    """
    k = max(1, min(most, BLOCK_BYTES // max(row_bytes, 1)))
    return [(lo, min(lo + k, n)) for lo in range(0, n, k)]
