"""Exceptions of the user's host functions: recorded where they are raised (the receiver
thread, or an eager callback), logged in one line that names the line of user code, and
raised by the next ``barrier_wait`` as :class:`CallbackException`."""
from __future__ import annotations

import logging
import pathlib
import traceback
import types

logger = logging.getLogger("hostfeed")


class CallbackException(Exception):
    """Signals that some host callback raised; raised by ``barrier_wait``.

    The message includes the text and traceback of the last exception, which is also
    chained as ``__cause__``.

    Example:
        >>> issubclass(CallbackException, Exception)
        True
    """


_last_exception: list[tuple[BaseException, str]] = []
# The last exception that nothing has shown the user's code yet (a tap function's, not a
# failed call's, whose computation fails with it): what interpreter exit reports when no
# barrier_wait did.
_last_unsurfaced: list[tuple[BaseException, str]] = []


#: The installed package's folder: a frame of a file under it is hostfeed's own (wherever
#: the user's files live, even in a checkout folder named ``hostfeed``).
PACKAGE_DIR = pathlib.Path(__file__).resolve().parents[1]


def _is_hostfeed_file(filename: str) -> bool:
    return pathlib.Path(filename).resolve().is_relative_to(PACKAGE_DIR)


def _is_hostfeed_frame(tb: types.TracebackType) -> bool:
    return _is_hostfeed_file(tb.tb_frame.f_code.co_filename)


def _user_traceback(exc: BaseException) -> types.TracebackType | None:
    """``exc``'s traceback without hostfeed's own frames at its head (the dispatcher and
    invokers that called the user's function), so that it starts at the user's frame."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None and _is_hostfeed_frame(tb):
        tb = tb.tb_next
    return tb


def user_frame(exc: BaseException) -> str:
    """`` (at FILE:LINE in FUNC)``: the line of the user's function (the first frame
    outside hostfeed) where ``exc`` was raised or passed through, or '' when unknown.

    Example:
        >>> try:
        ...     int("x")
        ... except ValueError as e:
        ...     print(user_frame(e).rsplit(" in ", 1)[1])
        <module>)
    """
    for frame, line in traceback.walk_tb(exc.__traceback__):
        code = frame.f_code
        if not _is_hostfeed_file(code.co_filename):
            return f" (at {code.co_filename}:{line} in {code.co_name})"
    return ""


def record_exception(exc: BaseException, where: str, *, raised_in: str = "") -> None:
    """Keeps ``exc`` for the next ``barrier_wait`` and logs one line that names it and where
    it was raised (its traceback, from the user's frame on, is printed once: as the cause
    of the ``CallbackException`` that ``barrier_wait`` raises). ``raised_in`` says where
    else the user already saw it (a failing ``call``'s computation): such an exception is
    not reported again at interpreter exit (:func:`take_unsurfaced`)."""
    exc.__traceback__ = _user_traceback(exc)
    summary = f"{type(exc).__name__}: {exc}{user_frame(exc)}, in {where}"
    also = f"; {raised_in}" if raised_in else ""
    logger.error("hostfeed: %s%s; the next barrier_wait() raises it with its traceback",
                 summary, also)
    _last_exception[:] = [(exc, summary)]
    if not raised_in:
        _last_unsurfaced[:] = [(exc, summary)]


def take_last_exception() -> tuple[BaseException, str] | None:
    """Returns and clears the recorded callback exception (``barrier_wait`` raises it, so
    nothing is left for exit to report either)."""
    _last_unsurfaced.clear()
    return _last_exception.pop() if _last_exception else None


def take_unsurfaced() -> tuple[BaseException, str] | None:
    """For interpreter exit: the last recorded exception that the user's code has not
    seen (no ``barrier_wait`` raised it, and it did not fail a computation, as a failed
    ``call`` does); clears every recorded exception."""
    _last_exception.clear()
    return _last_unsurfaced.pop() if _last_unsurfaced else None



def pending() -> bool:
    """Whether an exception is recorded for the next ``barrier_wait``."""
    return bool(_last_exception)


def clear() -> None:
    """Forgets the recorded exception (a forked child starts clean)."""
    _last_exception.clear()
    _last_unsurfaced.clear()
