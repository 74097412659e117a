"""A Recorder's record path: :class:`RecordPath`, the methods of
:class:`~.recorder.Recorder` that record (``record``, ``watch``, ``step``) and act on its
window (``keep``, ``triggers``). ``record`` checks what it is given, then goes down a
straight road: :func:`.selection.selective` picks the steps and the summary, and
:class:`~.plain.PlainRecord` binds the record; nothing on the way calls back here."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, Optional

import numpy as np

from ... import _receiver
from .. import lifecycle
from . import inputs as record_inputs, retrace, selection as _selection, step as _step
from . import watch as _watch, window as _window
from .lifetime import Lifetime
from .options import Options
from .plain import PlainRecord

__all__ = ["RecordPath"]


class RecordPath(Lifetime):
    """What a recorder records through (the base of :class:`~.recorder.Recorder`: see it
    for the options): its plain record (one row, and the watches) and that record wrapped
    to take ``every=``, ``start=``, ``stop=``, ``reduce=``."""

    def __init__(self, opts: Options):
        super().__init__(opts)
        self._plain = PlainRecord(self.catalogue)
        self._selective = _selection.selective(self._plain, self.catalogue.describe_summary)

    def record(self, name: str, value: Any, *, step: Any = None, result: Any = None,
               every: Optional[int] = None, start: Optional[int] = None,
               stop: Optional[int] = None, reduce: Any = None, axis: Any = None,
               cotangents: Optional[bool] = None, keep: str = "always") -> Any:
        """Identity on ``value`` that also appends it (or its summary) as one row of array
        ``name``.

        Args:
          name: the array's name in the store; ``/`` separates groups (``"layer1/h"``).
            Parts use letters, digits, ``_``, ``-`` and ``.`` (not first), at most 200
            bytes each (1024 in all); a part that is ``zarr.json`` or ends in a per-row
            metadata suffix (``.step``, ...), and names ending in ``.tangent``/
            ``.cotangent``, are refused.
          value: a JAX array, numpy array or scalar of any dtype hostfeed transfers (not a
            pytree: record each leaf under its own name).
          step: optional integer scalar (traced or not) stored with the row in
            ``name.step``, to line rows up with training steps.
          result: if given, the return value instead of ``value`` (as for ``id_tap``); the
            row is recorded either way.
          every, start, stop: record only at steps ``start, start + every, ...`` before
            ``stop`` (each optional; ``step`` required). Decided on the device: a step that
            records nothing costs a compare (see Recording, "Selective recording").
          reduce: ``"stats"`` records a row of statistics of ``value`` instead of it
            (``hostfeed.STATS``: count, mean, std, min, max, absmax, l2, nan and inf counts,
            l1, zeros, absmin_nonzero; float32), ``hostfeed.Stats(dtype=...)`` those and a
            narrower float's underflow and overflow counts, ``hostfeed.Histogram(...)`` a
            row of bin counts, ``hostfeed.TopK(k)`` the k largest; computed on the device.
          axis: the axes ``reduce`` reduces over (default: all); the others stay, e.g.
            ``axis=(0, 1)`` of ``[batch, seq, d]`` gives per-channel stats ``[d, 12]``.
          cotangents: under ``grad`` (``vjp``), whether the backward pass also records the
            cotangent as ``name.cotangent``, a row the size of ``value`` (and under
            ``jvp`` the tangent as ``name.tangent``); False records the primal only. None
            (default): the process's autodiff mode (``HOSTFEED_AD_TAPS``, default
            ``transforms``: recorded; ``primals``: not).
          keep: ``"always"`` (default): every row goes to the store; ``"window"``: the rows
            of the last steps wait in the recorder's window, in host memory, and go to the
            store when a trigger fires (``Recorder(..., window=N)``; needs ``step``; not
            with ``reduce=``: summaries always go to the store). One name, one ``keep``.

        Each call that runs appends a row: a name recorded twice in one step (train and
        eval passes) gets two rows with that ``step``, in run order (``name.seq``); give
        each its own name (``"train/h"``, ``"eval/h"``) to tell them apart.

        Returns:
          ``value``, or ``result`` if given.

        Example:
            >>> rec.record("h/stats", h, step=step, every=100, reduce="stats")  # doctest: +SKIP
            >>> rec.record("h", h, step=step, cotangents=False)  # doctest: +SKIP

        Raises:
          ValueError: an invalid name (every part is checked), the recorder is closed, or
            (eagerly, or when the computation is compiled, at the call site) the name was
            recorded before with another shape or dtype.
          TypeError: a pytree, or a dtype that cannot be recorded (sub-byte types).
          OverflowError: a numpy value that does not fit the dtype JAX converts it to
            (``int64`` values beyond int32's range, ``float64`` beyond float32's, while
            ``jax_enable_x64`` is off); one that fits is recorded converted, as ``jit``
            would convert it.
        """
        record_inputs.check_name(name)
        ad_taps = record_inputs.ad_taps_of(cotangents, name)
        retrace.note(self, name, value, step)  # a Python int step retracing the function?
        if keep != "always" or self._flight is not None:  # (nothing to note otherwise)
            windowed = _window.check_keep(keep, name, reduce, _window.config_of(self._flight))
            if windowed and step is None:
                raise ValueError(f"hostfeed: Recorder.record({name!r}, keep=\"window\") "
                                 f"keeps the rows of the last steps: pass step=...")
            self.catalogue.keep(name, windowed)
        return self._selective(name, value, step=step, result=result, every=every,
                               start=start, stop=stop, reduce=reduce, axis=axis,
                               ad_taps=ad_taps)

    def step(self, fn: Callable, *, in_flight: int = _step.DEFAULT_IN_FLIGHT,
             outputs: Optional[bool] = None, **jit_kwargs: Any) -> _step.RecordedStep:
        """``fn`` compiled with ``jax.jit``, its records leaving the computation as outputs:
        the fastest way to record from a step that is called again and again (a training
        step), on an accelerator above all.

        The ``record()`` calls that ``fn`` makes (at its top, in nested ``jit``, ``scan``
        and ``fori_loop`` bodies, in ``cond`` branches and ``every=``/``start=``/``stop=``,
        under ``grad`` and ``vmap``) become extra outputs of the computation instead of
        host callbacks inside it. Each call starts their copies to the host at once and
        returns ``fn``'s outputs; a thread appends the rows while the next steps run, in
        call order. ``every=`` moves no bytes for a step it skips; ``reduce=`` moves only
        the summary. A ``record`` inside a ``while_loop`` (or ``shard_map``, ``pmap``)
        stays in the computation, as without ``step``. By default the records leave as
        outputs where the step runs on a TPU; on a CPU or a GPU, where hostfeed's own
        handlers copy a record inside the computation for less, they stay inside (the
        step is then ``jax.jit(fn)``).

        Args:
          fn: the step function; it may record with this or other recorders.
          in_flight: at most this many calls' records wait on the device: the next call
            waits until the oldest is copied (device memory for records stays within
            ``in_flight`` times one step's recorded bytes).
          outputs: True: the records always leave as outputs; False: never (they are
            host callbacks inside the computation); None: as outputs on a TPU.
          **jit_kwargs: passed to ``jax.jit`` (``static_argnums``, ``donate_argnums``...).

        Returns:
          A callable like ``jax.jit(fn)``. Calling it after this recorder's ``close()`` (or,
          where the records leave as outputs, another recorder's it records to) raises
          ``ValueError`` before the step runs: its rows would be dropped.

        Example:
            >>> train_step = rec.step(train_step)              # doctest: +SKIP
            >>> for i, batch in enumerate(data):               # doctest: +SKIP
            ...     params = train_step(params, batch, i)
        """
        if not callable(fn):
            raise TypeError(f"hostfeed: Recorder.step(fn) needs a callable, got "
                            f"{type(fn).__name__}")
        if isinstance(in_flight, bool) or not isinstance(in_flight, (int, np.integer)) \
                or in_flight < 1:
            raise ValueError(f"hostfeed: Recorder.step: in_flight must be a positive number "
                             f"of steps, got {in_flight!r}")
        if outputs is not None:
            if not isinstance(outputs, (bool, np.bool_)):
                raise TypeError(f"hostfeed: Recorder.step: outputs must be True, False or "
                                f"None, got {outputs!r}")
            outputs = bool(outputs)
        return _step.RecordedStep(self, fn, int(in_flight), jit_kwargs, outputs)

    def watch(self, name: str, value: Any, *, step: Any, when: Callable[[Any], Any],
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
        tap = self._plain.watches.get(name)
        if tap is None or tap.when is not when:
            self._plain.watches[name] = _watch.WatchTap(name, when, flight.fire_watch)
        return self.record(name, value, step=step, keep=keep, reduce=reduce, axis=axis,
                           cotangents=False)

    def keep(self, reason: str = "rec.keep()") -> dict:
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

    def _flight_for(self, call: str) -> _window.Flight:
        if self._flight is None or self.closed:
            raise ValueError(f"hostfeed: Recorder.{call}: {self!r} has no window nor triggers "
                             f"(hostfeed.Recorder(path, window=N) or on_trigger=...)"
                             if self._flight is None else f"hostfeed: Recorder.{call} on a "
                             f"closed recorder ({self.path})")
        return self._flight

    @property
    def triggers(self) -> list[dict]:
        """Every trigger so far (an appended recording's first), as
        ``hostfeed.open_recording(path).triggers`` lists them: ``step``, ``reason``,
        ``name``, ``kind``, ``first_step``, ``last_step``, ``kept``, ``state``, ..."""
        if self._flight is None:
            return []
        self._flight.notice()
        return self._flight.triggers()
