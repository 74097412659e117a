"""The reductions ``Recorder.record(..., reduce=...)`` takes, by kind: recording, capture,
resume, ``python -m hostfeed show`` and the TensorBoard export find a reduction here
(:func:`resolve` for what a user passes, :func:`of_kind` for what a store's attributes
name, :func:`readback` for how an array's rows read back). Adding one: a module with a
:class:`~.base.Reduction` subclass, and its line in :data:`REDUCTIONS`."""
from __future__ import annotations

from typing import Any, Optional

from .base import Board, Pane, Readback, Reduction
from .histogram import Histogram
from .stats import CAST_STATS, STATS, Raw, Stats
from .topk import TopK

__all__ = ["Reduction", "Readback", "Board", "Pane", "REDUCTIONS", "Histogram", "Stats",
           "STATS", "CAST_STATS", "Raw", "TopK", "resolve", "of_kind", "readback", "accepted"]

#: Every reduction, by the kind stored in an array's attributes.
REDUCTIONS: dict[str, type[Reduction]] = {cls.kind: cls for cls in (
    Stats,
    Histogram,
    TopK,
)}


def accepted() -> str:
    """What ``reduce=`` takes, for error messages.

    Example:
        >>> accepted().startswith("'stats' or a hostfeed.Histogram(...)")
        True
    """
    names = [repr(cls.alias) for cls in REDUCTIONS.values() if cls.alias]
    kinds = [f"hostfeed.{cls.__name__}(...)" for cls in REDUCTIONS.values() if not cls.alias]
    kinds += [f"hostfeed.{cls.__name__}(...)" for cls in REDUCTIONS.values() if cls.alias]
    return f"{' or '.join(names)} or a {', '.join(kinds)}"


def resolve(reduce: Any, name: str, what: str = "Recorder.record") -> Reduction:
    """The reduction ``reduce=`` names: an instance of one in :data:`REDUCTIONS`, or the
    string of one (``"stats"``).

    Raises:
      ValueError: anything else.
    """
    if isinstance(reduce, Reduction) and type(reduce) in REDUCTIONS.values():
        return reduce
    if isinstance(reduce, str):
        for cls in REDUCTIONS.values():
            if cls.alias == reduce:
                return cls()
    raise ValueError(f"hostfeed: {what}({name!r}): reduce must be {accepted()}, got "
                     f"{reduce!r}")


def of_kind(kind: Any) -> Optional[type[Reduction]]:
    """The reduction whose rows an array of ``hostfeed.reduce.kind`` ``kind`` holds
    (``None``: raw rows, or a kind this hostfeed does not know)."""
    return REDUCTIONS.get(kind) if isinstance(kind, str) else None


def readback(attrs: dict) -> type[Readback]:
    """How the rows of an array whose ``hostfeed`` attributes are ``attrs`` read back: its
    reduction (by ``reduce.kind``), or :class:`~.stats.Raw` (raw rows, or a kind this
    hostfeed does not know: their statistics computed on the host).

    Example:
        >>> readback({"reduce": {"kind": "histogram"}}).plot, readback({}).kind
        ('heatmap', 'raw')
    """
    return of_kind(attrs.get("reduce", {}).get("kind")) or Raw
