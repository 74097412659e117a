"""Which submodules a capture records: glob patterns over the names a library gives its
submodules (``blocks.3.mlp``, ``Block_3/MLP_0``), or a predicate; and the error that lists
the names there are when a pattern selects nothing.

A pattern is split on the library's separator (``.`` for Flax NNX and Equinox, ``/`` for
Flax Linen) and matched part by part: ``*``, ``?`` and ``[...]`` within one part (as
:func:`fnmatch.fnmatchcase`), ``**`` for any number of parts (none included).
"""
from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Union

__all__ = ["Selector", "Select", "name_of", "key_name", "listed"]

#: What ``hostfeed.capture(model, rec, select)`` takes as ``select``.
Select = Union[str, Sequence[str], Callable[[str, Any], bool]]

#: How many names an error lists before it says how many more there are.
_LISTED = 200


def key_name(key: Any) -> str:
    """One part of a name from a JAX key path entry (``GetAttrKey``, ``SequenceKey``,
    ``DictKey``, ``FlattenedIndexKey``) or a plain path part (a str or an int).

    Example:
        >>> import jax
        >>> [key_name(k) for k in (jax.tree_util.GetAttrKey("mlp"),
        ...                        jax.tree_util.SequenceKey(3), "up", 0)]
        ['mlp', '3', 'up', '0']
    """
    for attr in ("name", "idx", "key"):
        if hasattr(key, attr) and not isinstance(key, (str, int)):
            return str(getattr(key, attr))
    return str(key)


def name_of(path: Iterable[Any], sep: str) -> str:
    """A submodule's name from its path parts.

    Example:
        >>> name_of(("blocks", 3, "mlp"), ".")
        'blocks.3.mlp'
    """
    return sep.join(key_name(k) for k in path)


def listed(names: Sequence[str], most: int = 20) -> str:
    """``names`` for an error message: the first ``most``, and how many more.

    Example:
        >>> listed(["a", "b", "c"], most=2)
        'a, b and 1 more'
    """
    more = f" and {len(names) - most} more" if len(names) > most else ""
    return ", ".join(names[:most]) + more


def _match_parts(pattern: Sequence[str], name: Sequence[str]) -> bool:
    """Whether ``name``'s parts match ``pattern``'s (``**``: any number of parts)."""
    if not pattern:
        return not name
    head, rest = pattern[0], pattern[1:]
    if head == "**":
        return any(_match_parts(rest, name[i:]) for i in range(len(name) + 1))
    return bool(name) and fnmatch.fnmatchcase(name[0], head) and _match_parts(rest, name[1:])


class Selector:
    """The submodules ``select`` chooses among a model's, by name (library separator
    ``sep``); remembers which patterns chose something, for :meth:`check`.

    Example:
        >>> s = Selector("blocks.*.mlp", ".", "a Flax NNX model")
        >>> [s.matches(n, None) for n in ("blocks.0.mlp", "blocks.0.mlp.up", "head")]
        [True, False, False]
        >>> Selector(["**.up", "head"], ".", "m").matches("blocks.1.mlp.up", None)
        True
    """

    def __init__(self, select: Select, sep: str, what: str):
        self.sep = sep
        self.what = what
        self.predicate: Callable[[str, Any], bool] | None = None
        self.patterns: tuple[str, ...] = ()
        if isinstance(select, str):
            self.patterns = (select,)
        elif callable(select):
            self.predicate = select
        elif isinstance(select, Sequence) and select and all(
                isinstance(p, str) for p in select):
            self.patterns = tuple(select)
        else:
            raise TypeError(
                f"hostfeed.capture: select must be a glob pattern (str), a non-empty list of "
                f"them, or a predicate (name, module) -> bool; got {select!r}")
        for p in self.patterns:
            if not p or any(not part for part in p.split(sep)):
                raise ValueError(
                    f"hostfeed.capture: the pattern {p!r} has an empty part; the names of "
                    f"{what} are {sep!r}-separated (e.g. {_example(sep)!r})")
        self._split = [p.split(sep) for p in self.patterns]
        self._fine = [re.split(r"[/.]", p) for p in self.patterns]
        self.used: set[int] = set()
        self.chose_any = False

    def matches(self, name: str, module: Any) -> bool:
        """Whether the submodule ``name`` (``module``) is selected."""
        if self.predicate is not None:
            chosen = bool(self.predicate(name, module))
            self.chose_any = self.chose_any or chosen
            return chosen
        parts = name.split(self.sep)
        chosen = False
        for i, pattern in enumerate(self._split):
            if _match_parts(pattern, parts):
                self.used.add(i)
                chosen = True
        self.chose_any = self.chose_any or chosen
        return chosen

    def matches_parts(self, name: str, module: Any, parts: Sequence[str]) -> bool:
        """Whether the submodule ``name`` (``module``) is selected, its name given as
        ``parts`` and each pattern split on both ``/`` and ``.``: an NNX submodule of a
        Linen wrapper, named by the wrapper's Linen path and its NNX name."""
        if self.predicate is not None:
            return self.matches(name, module)
        chosen = False
        for i, pattern in enumerate(self._fine):
            if _match_parts(pattern, list(parts)):
                self.used.add(i)
                chosen = True
        self.chose_any = self.chose_any or chosen
        return chosen

    def choose(self, named: Sequence[tuple[str, Any]]) -> list[tuple[str, Any]]:
        """The selected (name, module) pairs among ``named``; raises :meth:`check`'s error
        when a pattern (or the predicate) selects nothing."""
        chosen = [(n, m) for n, m in named if self.matches(n, m)]
        self.check([n for n, _ in named])
        return chosen

    def check(self, names: Sequence[str]) -> None:
        """Raises a ``ValueError`` naming each pattern that selected nothing (or the
        predicate, if it selected nothing) and listing ``names``, the names there are."""
        if self.predicate is not None:
            if not self.chose_any:
                raise ValueError(f"hostfeed.capture: the predicate selected no submodule of "
                                 f"{self.what}; {_listing(names)}")
            return
        unused = [p for i, p in enumerate(self.patterns) if i not in self.used]
        if unused:
            which = ", ".join(repr(p) for p in unused)
            raise ValueError(
                f"hostfeed.capture: {'the pattern' if len(unused) == 1 else 'the patterns'} "
                f"{which} {'selects' if len(unused) == 1 else 'select'} no submodule of "
                f"{self.what} ('*' matches within one {self.sep!r}-separated part, '**' any "
                f"number of parts); {_listing(names)}")


def _example(sep: str) -> str:
    return "blocks.*.mlp" if sep == "." else "Block_*/MLP_0"


def _natural(name: str) -> list:
    """Sorts ``blocks.2`` before ``blocks.10``."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def _listing(names: Sequence[str]) -> str:
    unique = sorted(set(names), key=_natural)
    if not unique:
        return "it has no submodule that was called"
    shown = ", ".join(unique[:_LISTED])
    more = f" ... and {len(unique) - _LISTED} more" if len(unique) > _LISTED else ""
    return f"its submodules are: {shown}{more}"
