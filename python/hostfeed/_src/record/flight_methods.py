"""The Recorder's flight-recorder methods (``watch``, ``keep``, ``triggers``): what a
:class:`~.recorder.Recorder` with a window or triggers (``Recorder(window=N,
on_trigger=...)``) adds, over its :class:`~.window.Flight` (see docs, "Debugging a run")."""
from __future__ import annotations

from typing import Any, Optional, Protocol
from collections.abc import Callable

from ... import _receiver
from .. import lifecycle
from . import watch as _watch, window as _window

__all__ = ["FlightMethods"]


class _Recorder(Protocol):
    """What the methods below use of the :class:`~.recorder.Recorder` they are mixed into."""

    _flight: Optional[_window.Flight]
    _watches: dict[str, _watch.WatchTap]

    @property
    def path(self) -> str: ...

    @property
    def closed(self) -> bool: ...

    def record(self, name: str, value: Any, *, step: Any = None, keep: str = "always",
               reduce: Any = None, axis: Any = None, cotangents: Optional[bool] = None
               ) -> Any: ...

    def _drain_all_steps(self) -> None: ...

    def _flight_for(self: _Recorder, call: str) -> _window.Flight: ...


class FlightMethods:
    """Mixed into :class:`~.recorder.Recorder`: the methods over its window and triggers."""

    def watch(self: _Recorder, name: str, value: Any, *, step: Any, when: Callable[[Any], Any],
              keep: str = "always", reduce: Any = None, axis: Any = None) -> Any:
        """Records ``value`` like :meth:`record` and runs ``when`` on each row on the host:
        a true answer fires a trigger at that step (the window is written; see
        ``Recorder(window=, on_trigger=)``). Returns ``value``.

        Args:
          name, value, step, keep, reduce, axis: as for :meth:`record` (``when`` sees the
            row recorded: with ``reduce=``, the summary's row).
          when: a predicate of one row (a numpy array), e.g. :func:`hostfeed.spike`. It runs
            on the receiver's thread after the rows recorded before the watch arrived (an
            eager value: at the call); an exception it raises is raised by the next
            ``barrier_wait``.

        Raises:
          TypeError: ``when`` is not a function of one value. And as :meth:`record`.

        Example:
            >>> loss = rec.watch("loss", loss, step=s, when=hostfeed.spike())  # doctest: +SKIP
        """
        when = _watch.check_predicate(when, name)
        flight = self._flight_for(f"watch({name!r})")
        tap = self._watches.get(name)
        if tap is None or tap.when is not when:
            tap = self._watches[name] = _watch.WatchTap(name, when, flight.fire_watch)
        return self.record(name, value, step=step, keep=keep, reduce=reduce, axis=axis,
                           cotangents=False)

    def keep(self: _Recorder, reason: str = "rec.keep()") -> dict:
        """Writes the window as it stands to the store (every step it holds, once what the
        computations dispatched so far recorded reached it): from an ``except`` block, or a
        SIGTERM handler before preemption. Returns the trigger's description (as
        :attr:`triggers` lists it).

        Raises:
          ValueError: the recorder has no window nor triggers, or is closed.

        Example:
            >>> except Exception:                                   # doctest: +SKIP
            ...     rec.keep("the step raised"); raise
        """
        flight, reason = self._flight_for(f"keep({reason!r})"), _window.keep_reason(reason)
        if not _receiver.host.in_callback_thread():  # (a host function cannot wait)
            self._drain_all_steps()
            lifecycle.drain_dispatched()
        return flight.keep(reason)

    def _flight_for(self: _Recorder, call: str) -> _window.Flight:
        if self._flight is None or self.closed:
            raise ValueError(f"hostfeed: Recorder.{call}: {self!r} has no window nor triggers "
                             f"(hostfeed.Recorder(path, window=N) or on_trigger=...)"
                             if self._flight is None else f"hostfeed: Recorder.{call} on a "
                             f"closed recorder ({self.path})")
        return self._flight

    @property
    def triggers(self: _Recorder) -> list[dict]:
        """Every trigger so far (an appended recording's first), as
        ``hostfeed.open_recording(path).triggers`` lists them: ``step``, ``reason``,
        ``name``, ``kind``, ``first_step``, ``last_step``, ``kept``, ``state``, ..."""
        if self._flight is None:
            return []
        self._flight.notice()
        return self._flight.triggers()
