"""Watched values: ``rec.watch(name, value, step=s, when=predicate)`` records ``value`` (a
scalar, or a summary's row) and runs ``predicate`` on it on the host, each step; a true
answer fires a trigger (the recorder's window is written). :func:`spike` makes the
predicate for loss spikes.

The predicate runs on the receiver's consumer thread (an eager watch: at the call), after
the rows recorded before the watch in program order reached the recorder; an exception it
raises is logged, and raised by the next ``barrier_wait`` (as a tap function's is). Its
message is a tap whose operands are the watched row and the step: under ``grad`` only the
primal is watched, under ``vmap`` each lane is.
"""
from __future__ import annotations

import collections
import inspect
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from .. import compat
from ..primitives import CallbackKind, CallbackSpec, outside_call_p, outside_call_params

__all__ = ["Spike", "spike", "check_predicate", "watched", "WatchTap"]


class Spike:
    """A predicate for :meth:`hostfeed.Recorder.watch`: true when a value exceeds ``factor``
    times the median of the last ``over`` finite values watched before it (once
    ``warmup`` of them were seen). Non-finite values are left out of the history (the
    non-finite trigger, ``on_nonfinite=True``, is the one for those). Its state is its
    own: one ``Spike`` per watched value.

    Example:
        >>> s = Spike(factor=3.0, over=4, warmup=2)
        >>> [s(v) for v in (1.0, 1.2, 0.9, 5.0, 1.1)]
        [False, False, False, True, False]
    """

    def __init__(self, factor: float = 3.0, over: int = 100, warmup: int = 10):
        if isinstance(factor, bool) or not isinstance(factor, (int, float, np.floating)) \
                or not math.isfinite(factor) or factor <= 0:
            raise ValueError(f"hostfeed.spike: factor must be a positive number, got {factor!r}")
        for what, v in (("over", over), ("warmup", warmup)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"hostfeed.spike: {what} must be a positive int, got {v!r}")
        self.factor = float(factor)
        self.over = int(over)
        self.warmup = min(int(warmup), int(over))
        self.history: collections.deque[float] = collections.deque(maxlen=self.over)

    def __call__(self, value: Any) -> bool:
        v = np.asarray(value)
        if v.size != 1:
            raise ValueError(f"hostfeed.spike: watches a scalar (a loss), got a value of shape "
                             f"{v.shape}; watch one number (x.mean(), a column of a summary's "
                             f"row) or pass your own predicate")
        x = float(v.reshape(()))
        if not math.isfinite(x):
            return False
        fired = len(self.history) >= self.warmup and x > self.factor * float(
            np.median(np.fromiter(self.history, np.float64)))
        self.history.append(x)
        return bool(fired)

    def __repr__(self) -> str:
        return f"hostfeed.spike(factor={self.factor:g}, over={self.over}, warmup={self.warmup})"


def spike(factor: float = 3.0, over: int = 100, *, warmup: int = 10) -> Spike:
    """A predicate for :meth:`hostfeed.Recorder.watch` that fires on a spike: the value above
    ``factor`` times its running median over the last ``over`` steps (once ``warmup``
    steps were seen).

    Args:
      factor: how many times the median a value must exceed.
      over: the steps the median is taken over.
      warmup: the steps seen before it may fire (at most ``over``).

    Returns:
      A :class:`Spike` (a callable with its own history: one per watched value).

    Example:
        >>> import hostfeed
        >>> is_spike = hostfeed.spike(factor=3.0, over=100)
        >>> [is_spike(v) for v in [2.0] * 10 + [7.0]][-1]
        True
    """
    return Spike(factor, over, warmup)


def check_predicate(when: Any, name: str) -> Callable[[Any], Any]:
    """``when``, checked at the call: a callable that takes the watched value."""
    if not callable(when):
        raise TypeError(f"hostfeed: Recorder.watch({name!r}): when must be a predicate, a "
                        f"function of the watched value that returns a bool (e.g. "
                        f"hostfeed.spike()), got {type(when).__name__}")
    try:
        inspect.signature(when).bind(0.0)
    except TypeError as exc:
        raise TypeError(f"hostfeed: Recorder.watch({name!r}): when must take the watched value "
                        f"as its one argument: {exc}") from None
    except ValueError:
        pass  # no signature to inspect (a builtin): called as it is
    return when  # type: ignore[no-any-return]


class WatchTap:
    """The host side of a watched value: ``fire(step, reason, name)`` when ``when`` holds
    (a tap function, ``(arg, transforms, device=...)``, on the consumer thread)."""

    def __init__(self, name: str, when: Callable[[Any], Any],
                 fire: Callable[[int, str, str], None]):
        self.name = name
        self.when = when
        self.fire = fire
        self.__name__ = f"watch({name!r})"

    def __call__(self, arg: Any, transforms: Sequence = (), *, device: Any = None) -> None:
        value, step = (arg[0], arg[1]) if len(arg) > 1 else (arg[0], None)
        value = np.asarray(value)
        batched = any(t[0] == "batch" for t in transforms)
        if not batched:
            self.check(value, step)
            return
        steps = np.asarray(step).reshape(-1) if step is not None else None
        for k in range(value.shape[0]):
            s = None if steps is None else steps[min(k, steps.size - 1)]
            self.check(value[k], s)

    def check(self, value: np.ndarray, step: Any) -> None:
        """Runs the predicate on one watched value; fires when it holds."""
        s = -1 if step is None else int(np.asarray(step).reshape(()))
        if bool(self.when(value)):
            shown = value.reshape(()).item() if value.size == 1 else f"a row of shape {value.shape}"
            self.fire(s, f"{self.name!r} = {shown!r} at step {s}: {self.when!r} holds",
                      self.name)


def watched(tap: WatchTap, row: Any, step: Any) -> None:
    """Binds the watch ``tap`` of ``row`` (the watched value as recorded) and ``step`` (or
    None) into the computation (a side effect: under ``grad`` only the primal is watched);
    an eager value is watched at once, in the caller's thread (the predicate's exception
    raises here)."""
    operands: list = [row] if step is None else [row, step]
    if not any(compat.is_tracer(o) for o in operands):
        tap.check(np.asarray(row), None if step is None else np.asarray(step))
        return
    spec = CallbackSpec(tap, jax.tree_util.tree_structure(tuple(operands)), True,
                        CallbackKind.TAP, "primals")
    outside_call_p.bind(*operands, **outside_call_params(spec, len(operands)))
