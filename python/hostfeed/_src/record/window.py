"""The flight recorder's Python side: a recorder's *window* (``Recorder(..., window=N)``:
the rows of the last ``N`` steps of the arrays recorded with ``keep="window"`` kept in host
memory by the Rust core, ``crates/hostfeed-core/src/record/window/``) and its *triggers*
(which write the window to the store): the options checked at the call, ``keep=`` checked
per name, what a recorder does when it notices a trigger (``on_trigger``: log it, raise
:class:`Triggered` at the next ``rec.step`` call or ``barrier_wait``, or call a function),
and the arrays' traits handed to the core (windowed or not; a summary's columns that count
non-finite values).

Rows reach the window without Python: a windowed row is kept where every row reaches its
recorder (the consumer thread routes it in Rust). The non-finite trigger fires there too;
a watched value's predicate (:mod:`.watch`) and ``rec.keep`` fire from Python. With many
processes, :mod:`.triggers` passes each trigger to the others.
"""
from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any, NamedTuple, Optional, Union

import numpy as np

from .. import lifecycle, reductions

logger = logging.getLogger("hostfeed")

__all__ = ["KEEPS", "DEFAULT_WINDOW_BYTES", "Triggered", "WindowConfig", "config", "Flight",
           "counting_columns"]

#: What ``keep=`` takes: ``"always"`` (every row to the store) or ``"window"`` (the last
#: steps kept in memory, written when a trigger fires).
KEEPS = ("always", "window")
#: ``window_bytes`` when not given: 1 GiB.
DEFAULT_WINDOW_BYTES = 1 << 30
#: What the core counts for a row kept in the window besides its bytes.
ROW_OVERHEAD = 128

OnTrigger = Union[None, str, Callable[[dict], Any]]


class Triggered(RuntimeError):
    """Raised by the next ``rec.step`` call or ``barrier_wait`` after a trigger of a
    recorder made with ``on_trigger="raise"`` fired, once its window is written to the
    store (flushed and announced): a training loop stops with the evidence on disk.

    Attributes:
      step: the step the trigger fired at.
      reason: why (``"non-finite value nan in 'blocks.3/output' at step 100 ..."``).
      name: the array (or watched value) that fired it; None for ``rec.keep``.
      trigger: its whole description, as ``open_recording(path).triggers`` lists it
        (``kind``, ``first_step``, ``last_step``, ``kept``, ``process``, ...).
      path: the recorder's store.

    Example:
        >>> try:                                                  # doctest: +SKIP
        ...     for s in range(steps):
        ...         state = train_step(state, batch, s)           # a rec.step
        ... except hostfeed.Triggered as t:
        ...     print(t.step, t.reason)
    """

    def __init__(self, trigger: dict, path: str):
        self.trigger = dict(trigger)
        self.step = trigger.get("step")
        self.reason = trigger.get("reason")
        self.name = trigger.get("name")
        self.path = path
        super().__init__(
            f"hostfeed: a trigger fired at step {self.step}: {self.reason}; the window "
            f"(steps {trigger.get('first_step')}..{trigger.get('last_step')}) is written to "
            f"{path} (hostfeed.open_recording(path).triggers lists it)")

    def __reduce__(self) -> tuple:
        return (Triggered, (self.trigger, self.path))


class WindowConfig(NamedTuple):
    """A recorder's window, checked: ``steps`` kept (0: no window, triggers only),
    ``bytes`` at most, ``after`` steps also written, ``nonfinite``, ``on_trigger``."""

    steps: int
    bytes: int
    after: int
    nonfinite: bool
    on_trigger: OnTrigger


def _count(value: Any, what: str, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"hostfeed.Recorder: {what} must be an int, got {value!r}")
    if value < least:
        raise ValueError(f"hostfeed.Recorder: {what} must be >= {least}, got {value}")
    return int(value)


def config(window: Any, window_bytes: Any, after: Any, on_nonfinite: Any,
           on_trigger: Any) -> Optional[WindowConfig]:
    """The window a recorder was asked for (None: no window and no trigger), checked: errors
    at the call, before the store is opened.

    Example:
        >>> config(8, None, 2, True, "raise").bytes == DEFAULT_WINDOW_BYTES
        True
        >>> config(None, None, 0, False, None) is None
        True
    """
    if not isinstance(on_nonfinite, (bool, np.bool_)):
        raise TypeError(f"hostfeed.Recorder: on_nonfinite must be True or False, got "
                        f"{on_nonfinite!r}")
    if not (on_trigger is None or on_trigger == "raise" or callable(on_trigger)):
        raise ValueError(f"hostfeed.Recorder: on_trigger must be None (log each trigger), "
                         f"\"raise\" (raise hostfeed.Triggered at the next rec.step call or "
                         f"barrier_wait) or a function of the trigger's description, got "
                         f"{on_trigger!r}")
    steps = 0 if window is None else _count(window, "window (steps kept)", 1)
    after = _count(after, "after (steps written after a trigger's)", 0)
    if window is None:
        if window_bytes is not None or after:
            raise ValueError("hostfeed.Recorder: window_bytes= and after= size a window: pass "
                             "window=N (the steps kept) too")
        if not on_nonfinite and on_trigger is None:
            return None
    if window_bytes is None:
        nbytes = DEFAULT_WINDOW_BYTES
    else:
        nbytes = _count(window_bytes, "window_bytes", ROW_OVERHEAD + 1)
    return WindowConfig(steps, nbytes, after, bool(on_nonfinite), on_trigger)


def check_keep(keep: Any, name: str, reduce: Any, config: Optional[WindowConfig]) -> bool:
    """Whether a record of ``name`` with ``keep`` is windowed; raises for a ``keep`` not in
    :data:`KEEPS`, a window asked of a recorder without one, or of a summary (summaries go
    to the store every step)."""
    if keep not in KEEPS:
        raise ValueError(f"hostfeed: Recorder.record({name!r}): keep must be \"always\" (every "
                         f"row to the store) or \"window\" (the last steps kept in memory, "
                         f"written when a trigger fires), got {keep!r}")
    if keep == "always":
        return False
    if config is None or config.steps == 0:
        raise ValueError(f"hostfeed: Recorder.record({name!r}, keep=\"window\"): this recorder "
                         f"has no window; open it with hostfeed.Recorder(path, window=N) (the "
                         f"steps to keep)")
    if reduce is not None:
        raise ValueError(f"hostfeed: Recorder.record({name!r}): a summary (reduce=) is small "
                         f"and always goes to the store; keep=\"window\" is for raw rows (record "
                         f"the value twice: raw with keep=\"window\", and its summary)")
    return True


def config_of(flight: Optional[Flight]) -> Optional[WindowConfig]:
    """A recorder's window, if it has one."""
    return None if flight is None else flight.config


def counting_columns(description: dict) -> Optional[tuple[int, list[int]]]:
    """For a summary's description (``hostfeed.reduce``): its row's width and the columns
    that count non-finite values of what it summarizes (a non-zero count fires the
    non-finite trigger), by their names; None where it has none (then every value of its
    rows is searched).

    Example:
        >>> counting_columns({"kind": "stats", "columns": ["count", "nan_count", "x"]})
        (3, [1])
    """
    cls = reductions.of_kind(description.get("kind"))
    columns = cls.nonfinite_columns(description) if cls is not None else []
    if not columns:
        return None
    return len(description.get("columns") or ()), list(columns)


class Flight:
    """One recorder's window and triggers, on the Python side: configures the core's
    window, says which arrays it keeps, notices the triggers fired and acts on them
    (``on_trigger``)."""

    def __init__(self, native: Any, cfg: WindowConfig, path: str, process: int,
                 writes_doc: bool, resume_after_step: Optional[int]):
        self.native = native
        self.config = cfg
        self.path = path
        native.configure_window(cfg.steps, cfg.bytes, cfg.after, cfg.nonfinite, process,
                                writes_doc, resume_after_step)
        self.seen = 0
        #: Whether an array was declared windowed (a window nothing goes to says so).
        self.windowed = False
        self._pending: list[dict] = []
        self._errors: list[BaseException] = []
        #: The multi-process exchange (:mod:`.triggers`), if the store is shared.
        self.exchange: Any = None

    @property
    def raises(self) -> bool:
        return self.config.on_trigger == "raise"

    def traits(self, array_id: int, windowed: bool,
               columns: Optional[tuple[int, list[int]]]) -> None:
        """Hands the core how array ``array_id``'s rows are handled."""
        self.native.window_array(array_id, windowed, columns)
        self.windowed = self.windowed or windowed

    def fired(self) -> bool:
        """Whether a trigger fired that this recorder has not noticed yet (one atomic
        read)."""
        return bool(self.native.trigger_count != self.seen)

    def notice(self) -> list[dict]:
        """Takes the triggers fired since the last call and acts on them: logged (the
        default), kept to raise (``"raise"``), or handed to the function."""
        self.seen = int(self.native.trigger_count)
        fresh = [json.loads(t) for t in self.native.take_triggers()]
        for t in fresh:
            steps = f"steps {t['first_step']}..{t['last_step']}"
            if self.config.steps and not self.windowed:
                steps += " (none: nothing is recorded with keep=\"window\")"
            if self.config.on_trigger is None:
                logger.warning("hostfeed: a trigger fired at step %s: %s; %s of the window go "
                               "to %s", t["step"], t["reason"], steps, self.path)
            elif not callable(self.config.on_trigger):  # "raise"
                self._pending.append(t)
            else:
                try:
                    self.config.on_trigger(t)
                except Exception as exc:  # noqa: BLE001 - raised by the next barrier
                    logger.error("hostfeed: on_trigger raised for the trigger at step %s "
                                 "(raised by the next barrier_wait): %s", t["step"], exc)
                    self._errors.append(exc)
        return fresh

    def take_raised(self) -> Optional[BaseException]:
        """What the next barrier (or ``rec.step`` call) raises: :class:`Triggered` for the
        first trigger noticed since the last (the others are listed in the store), or an
        ``on_trigger`` function's error; None if nothing."""
        if self.fired():
            self.notice()
        if self._errors:
            exc, self._errors = self._errors[0], []
            return exc
        if self._pending:
            first, self._pending = self._pending[0], []
            return Triggered(first, self.path)
        return None

    def before_step(self, recorder: Any) -> None:
        """Before a ``rec.step`` call of a recorder that raises at triggers: waits until the
        records of the calls before reached the recorder (so that a trigger of step ``t``
        stops the loop at the call after ``t``'s), then raises :class:`Triggered` once the
        window is written (flushed)."""
        recorder._drain_all_steps()
        lifecycle.drain_dispatched()  # (a failed computation raises at its own call)
        if self.fired():
            self.notice()
        if self._pending:
            recorder.flush()
            raised = self.take_raised()
            if raised is not None:
                raise raised

    def fire_watch(self, step: int, reason: str, name: str) -> None:
        """Fires a watched value's trigger (its predicate held)."""
        self.native.fire_trigger("watch", step, reason, name)
        self._wake()

    def keep(self, reason: str) -> dict:
        """Fires ``rec.keep``'s trigger; returns its description. Refused where there is
        no window to keep, or nothing was ever recorded into it."""
        if self.config.steps == 0:
            raise ValueError(f"hostfeed: Recorder.keep({reason!r}): {self.path} has no window "
                             f"(it was opened for triggers only); open it with window=N")
        if not self.windowed:
            raise ValueError(f"hostfeed: Recorder.keep({reason!r}): nothing was recorded with "
                             f"keep=\"window\" into {self.path}'s window; record the arrays "
                             f"to keep with rec.record(..., keep=\"window\") (or "
                             f"capture(..., keep=\"window\"))")
        fired = dict(json.loads(self.native.fire_trigger("keep", -1, reason, None)))
        self._wake()
        return fired

    def _wake(self) -> None:
        if self.exchange is not None:
            self.exchange.wake()

    def close(self) -> None:
        """The recorder closes: the triggers not noticed yet are acted on (not raised: a
        closed recorder's loop is over), the exchange stops."""
        if self.exchange is not None:
            self.exchange.stop()
        if self.config.steps and not self.windowed:
            logger.warning("hostfeed: the window of %s (window=%d) kept nothing: no record "
                           "used keep=\"window\"", self.path, self.config.steps)
        pending, self._pending = self._pending, []
        for t in pending + [t for t in self.notice() if self.raises]:
            logger.warning("hostfeed: a trigger fired at step %s: %s (not raised: %s was "
                           "closed first)", t["step"], t["reason"], self.path)
        self._pending = []

    def triggers(self) -> list[dict]:
        """Every trigger's description: an appended recording's, then this one's."""
        return [dict(t) for t in json.loads(self.native.triggers())]

    def held(self) -> dict[str, int]:
        """The window's bytes and steps held now."""
        held = self.native.window_held()
        if held is None:
            return {}
        return {"window_bytes_held": int(held[0]), "window_steps_held": int(held[1])}


def keep_reason(reason: Any) -> str:
    """``rec.keep``'s reason, checked."""
    if not isinstance(reason, str) or not reason:
        raise TypeError(f"hostfeed: Recorder.keep(reason): reason must be a non-empty str, got "
                        f"{reason!r}")
    return reason
