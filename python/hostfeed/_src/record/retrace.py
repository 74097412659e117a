"""The warning for a function that records with a Python int ``step`` and is traced again
and again for it: a step that is a static value (an ``int`` argument of ``eqx.filter_jit``,
or one in ``static_argnums``) is baked into the computation, so each new step traces and
compiles the whole function again. After :data:`LIMIT` traces of one function with a
different concrete step each, a ``UserWarning`` names the function, the record and its
recorder, and says to pass ``jnp.int32(step)`` (once per function and recorder).

A function traced once that records several concrete steps (a Python loop unrolled in it)
is one trace: only traces are counted, told apart by the outermost trace the recorded value
belongs to (``compat.outer_trace``)."""
from __future__ import annotations

import sys
import threading
import types
import warnings
import weakref
from typing import Any, Optional

import numpy as np

from .. import compat, errors

__all__ = ["LIMIT", "note"]

#: Traces of one function with a different concrete step each, before the warning.
LIMIT = 3


class _Seen:
    """One function's traces that recorded with a concrete step."""

    def __init__(self) -> None:
        self.last: Optional[weakref.ref[Any]] = None  # the trace of the last record seen
        self.steps: set[int] = set()  # the first concrete step of each trace
        self.warned = False


# Per recorder (weakly held), per traced function (or record name): what was seen.
_seen: weakref.WeakKeyDictionary[Any, dict[str, _Seen]] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def _concrete_int(step: Any) -> Optional[int]:
    """``step`` as an int when it is a concrete integer (a Python or numpy one), else None."""
    if isinstance(step, bool) or compat.is_tracer(step):
        return None
    if isinstance(step, (int, np.integer)):
        return int(step)
    if isinstance(step, np.ndarray) and step.shape == () and step.dtype.kind in "iu":
        return int(step)
    return None


def note(rec: Any, name: str, value: Any, step: Any) -> None:
    """At ``rec.record(name, value, step=step)``: counts a trace whose ``step`` is a
    concrete integer while ``value`` is traced, and warns once when one function has been
    traced more than :data:`LIMIT` times with a different such step each time.

    Example:
        >>> note(object(), "loss", 1.0, 3)  # not traced: nothing to count
    """
    concrete = _concrete_int(step)
    if concrete is None or not compat.is_tracer(value):
        return
    trace, function = compat.outer_trace(value)
    with _lock:
        seen = _seen.setdefault(rec, {}).setdefault(function or name, _Seen())
        if seen.warned or (seen.last is not None and seen.last() is trace):
            return  # warned already, or another record of a trace counted
        try:
            seen.last = weakref.ref(trace)
        except TypeError:  # a trace that takes no weak reference: counted by its record
            seen.last = None
        seen.steps.add(concrete)
        if len(seen.steps) <= LIMIT:
            return
        seen.warned = True
        steps = sorted(seen.steps)
    # Its name: where it is comes with the warning (a wrapper's file, under eqx.filter_jit).
    what = (f"the function {function.split(' at ')[0]}" if function
            else "the function that records it")
    warnings.warn(
        f"hostfeed: {what} was traced {len(steps)} times for {rec!r}.record({name!r}, "
        f"step=...), with a Python int step each time ({', '.join(map(str, steps[:5]))}"
        f"{', ...' if len(steps) > 5 else ''}): the step is a static value there (an int "
        f"argument of eqx.filter_jit, or one in static_argnums), so every new step traces "
        f"and compiles the function again. Pass jnp.int32(step) instead (a traced value: "
        f"one compilation for every step)", UserWarning, stacklevel=_user_level())


def _user_level() -> int:
    """The ``stacklevel`` of the first caller outside hostfeed (the user's line that
    records, or the model's that a capture records around)."""
    frame: Optional[types.FrameType] = sys._getframe(2)  # warnings.warn's caller's caller
    level = 2
    while frame is not None and errors._is_hostfeed_file(frame.f_code.co_filename):
        frame, level = frame.f_back, level + 1
    return level
