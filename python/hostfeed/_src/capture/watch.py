"""No silent capture: each ``hostfeed.capture`` is watched (:class:`Watch`) from the call
that makes it, and one that has recorded no row by the next ``barrier_wait`` (its recorder
open) or by its recorder's ``close`` (interpreter exit included) says so, once, with a
:class:`CaptureWarning` naming the capture, its patterns and what happened: never used
(the original model called in place of what ``capture`` returned), used but no record
taken, records traced but none compiled into a computation that ran, or compiled but no
row arrived (no step selected by ``every=``/``start=``/``stop=``, which is only said at
``close``: a later step may be selected).

Rows are counted per array by the native recorder (``rows_received``), from the count an
array had when the capture first took it (a store appended to keeps its earlier rows).
The same capture made again (the same recorder, model class, selection and arguments: a
function traced again, or a loop that captures at every step) is one watch.
"""
from __future__ import annotations

import os
import sys
import threading
import types
import warnings
from typing import Any, Optional

from .. import lifecycle
from ..record import lifetime as _lifetime, recorder as _recorder
from .selection import listed

__all__ = ["CaptureWarning", "Watch", "enroll", "watch"]


class CaptureWarning(UserWarning):
    """A ``hostfeed.capture`` that recorded no row by a ``barrier_wait`` or its recorder's
    ``close``: the message says which, with what it selected and why nothing came."""


class Watch:
    """One capture's progress: how often its model was used, the arrays its records were
    taken under (with the rows each had then), and whether it was settled (a row seen,
    or the warning given)."""

    def __init__(self, recorder: Any, what: str, selecting: bool):
        self.recorder = recorder
        self.what = what
        self.selecting = selecting
        self.uses = 0
        self.modules: dict[str, None] = {}
        self.taken: dict[str, int] = {}
        self.settled = False

    def used(self) -> None:
        """The captured model was called (or turned on, as a context manager)."""
        self.uses += 1

    def called(self, module: str) -> None:
        """Selected submodule ``module`` was called."""
        self.modules.setdefault(module, None)

    def took(self, name: str) -> None:
        """A record was taken under array ``name`` (traced, or eager)."""
        if name not in self.taken:
            with _LOCK:
                self.taken.setdefault(name, _rows(self.recorder, name) or 0)

    def settle(self) -> None:
        """Nothing more to say: an error about the capture was raised."""
        self.settled = True

    def _rows(self) -> tuple[int, bool]:
        """Rows recorded since the arrays were taken, and whether any of them exists (its
        record was compiled, or recorded eagerly)."""
        rows, declared = 0, False
        for name, before in list(self.taken.items()):
            now = _rows(self.recorder, name)
            if now is not None:
                declared = True
                rows += now - before
        return rows, declared

    def why_silent(self, closing: bool) -> Optional[str]:
        """Why nothing was recorded, or None: a row was, or it is too early to say."""
        rows, declared = self._rows()
        if rows > 0:
            self.settled = True
            return None
        if not self.uses and not self.modules:
            return ("it was never used: the model it returned was never called (a call of "
                    "the original model records nothing). Call what hostfeed.capture returns "
                    "in place of the model (Flax: or turn the capture on around the call, "
                    "`with hostfeed.capture(model, rec, ...): model(x)`)")
        if not self.taken:
            called = ("none of the selected submodules was called" if not self.modules else
                      f"the selected submodules called ({listed(list(self.modules))}) took "
                      f"or returned no array")
            return f"its model was used ({_times(max(self.uses, 1))}) but {called}"
        return self._after_records(declared, closing)

    def _after_records(self, declared: bool, closing: bool) -> Optional[str]:
        """Why records taken wrote no row (``declared``: one of their arrays exists)."""
        arrays = listed(sorted(self.taken), most=4)
        if not declared:
            return (f"its records ({arrays}) were traced but none was compiled into a "
                    f"computation that ran: the function was only traced (jax.eval_shape, "
                    f".trace()), or a transformation dropped the records")
        if self.selecting and not closing:
            return None  # a later step may be selected
        if self.selecting:
            return (f"its records ({arrays}) were compiled, but no step run was selected by "
                    f"its every=/start=/stop=")
        return (f"its records ({arrays}) were compiled, but the computation holding them "
                f"did not run")


def _times(n: int) -> str:
    return "once" if n == 1 else f"{n} times"


def _rows(recorder: Any, name: str) -> Optional[int]:
    """Rows array ``name`` received, None if it has none (or the recorder cannot say)."""
    native = getattr(recorder, "_native", None)
    count = getattr(native, "rows_received", None)
    return None if count is None else count(name)


_LOCK = threading.Lock()
# (id of the recorder, the capture's description) -> its watch; dropped when the recorder
# closes.
_WATCHES: dict[tuple[int, str], Watch] = {}


def watch(recorder: Any, what: str, selecting: bool) -> Watch:
    """The watch of the capture ``what`` recording to ``recorder``: the one it had if it
    was made before, else a new one, watched once :func:`enroll`-ed."""
    with _LOCK:
        w = _WATCHES.get((id(recorder), what))
    if w is not None and w.recorder is recorder:
        return w
    return Watch(recorder, what, selecting)


def enroll(w: Watch) -> None:
    """Watches ``w`` (a capture made: its selection chose submodules) until its recorder
    closes; a recorder other than a :class:`~hostfeed.Recorder` is not watched."""
    if not isinstance(w.recorder, _recorder.Recorder):
        return
    with _LOCK:
        _WATCHES.setdefault((id(w.recorder), w.what), w)


def _check(watches: list[Watch], closing: bool, when: str) -> Optional[BaseException]:
    """Warns about each of ``watches`` that recorded nothing; returns what the warning
    raised (warnings turned into errors), for the caller to raise."""
    first: Optional[BaseException] = None
    for w in watches:
        if w.settled:
            continue
        why = w.why_silent(closing)
        if why is None:
            continue
        w.settled = True
        try:
            warnings.warn(CaptureWarning(
                f"{w.what} recorded no row by {when} ({w.recorder.path}): {why}"),
                stacklevel=_user_level())
        except Exception as exc:  # noqa: BLE001 - a warnings filter that raises: passed on
            first = first or exc
    return first


_PACKAGE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _user_level() -> int:
    """The ``stacklevel`` of the first caller outside hostfeed (whose barrier_wait or
    close it was), for the warning to point at."""
    frame: Optional[types.FrameType] = sys._getframe(1)
    level = 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    return level


def _at_barrier() -> Optional[BaseException]:
    if not _WATCHES:
        return None
    with _LOCK:
        open_ = [w for w in _WATCHES.values() if not w.settled and not w.recorder.closed]
    return _check(open_, False, "barrier_wait")


def _at_close(recorder: Any) -> Optional[BaseException]:
    if not _WATCHES:
        return None
    with _LOCK:
        mine = [(k, w) for k, w in _WATCHES.items() if w.recorder is recorder]
        for k, _ in mine:
            del _WATCHES[k]
    return _check([w for _, w in mine], True, "its recorder's close")


lifecycle.add_barrier_hook(_at_barrier)
_lifetime.add_close_hook(_at_close)
