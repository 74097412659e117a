"""A recorded step: ``Recorder.step(fn)``, a jitted ``fn`` whose records leave the
computation as outputs instead of as host callbacks inside it.

Each call dispatches the computation (:mod:`hostfeed._src.record.hoist` turned its records
into extra outputs), starts the device-to-host copies of what it recorded at once, and
hands them to the recorder's *pipeline*: one thread that, in call order, waits for each
step's copies and appends the rows (the bytes go to the recorder's writers from the host
copies, without a Python copy). The computation itself waits for nothing: the copies of
one step overlap the next steps, and on an accelerator the step keeps the cost of the copy
alone (no host transfer inside it, no Python callback).

Memory: at most ``in_flight`` steps' records wait on the device; a call that would make
one more waits first (back-pressure), so device memory held for records stays within
``in_flight`` times a step's recorded bytes. On the host, rows wait within the queue's
byte bound like every record (the pipeline waits for room).

Flush, close, ``barrier_wait`` and exit wait for the pipelines first (a recorder's flush
and close for every open recorder's: a step may record to other recorders), so nothing
recorded by a step that was called is lost.
"""
from __future__ import annotations

import collections
import functools
import logging
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Optional

import jax
import numpy as np

from .. import compat, transports
from .layout import declare
from .selection import selected
from . import hoist

if TYPE_CHECKING:
    from .catalogue import Catalogue

logger = logging.getLogger("hostfeed")

__all__ = ["RecordedStep", "Pipeline", "DEFAULT_IN_FLIGHT"]

#: Steps whose records may wait on the device at once (``Recorder.step(in_flight=)``).
DEFAULT_IN_FLIGHT = 4


class RecordedStep:
    """``fn`` compiled with ``jax.jit`` (``jit_kwargs``), its records taken out as outputs
    and written by ``recorder``'s pipeline. See :meth:`hostfeed.Recorder.step`."""

    def __init__(self, recorder: Any, fn: Callable, in_flight: int, jit_kwargs: dict,
                 outputs: Optional[bool] = None):
        self.recorder = recorder
        self.fn = fn
        self.in_flight = in_flight
        self.outputs = outputs
        # The platform the step runs on, from its first call's arguments.
        self._platform = ""
        self._inside = jax.jit(fn, **jit_kwargs)
        static = jit_kwargs.get("static_argnums", ())
        self._static = (static,) if isinstance(static, int) else tuple(static)
        names = jit_kwargs.get("static_argnames", ())
        self._static_names = (names,) if isinstance(names, str) else tuple(names)
        # The selections (every=, start=, stop=) of records whose step is an argument, in
        # the order the last trace met them: a call whose step is a host value passes
        # their outcome as a static argument, compiling the computation with the chosen
        # branch only (a skipped step computes and returns nothing for the record).
        self._host_conds: tuple = ()
        # The recorders the last trace records to (as outputs), besides ``recorder``.
        self._recorders: tuple = ()
        self._jitted = jax.jit(self._traced, **{
            **jit_kwargs, "static_argnames": (*self._static_names, "_choices")})
        self.__wrapped__ = fn
        self.__name__ = getattr(fn, "__name__", "step")
        self.__doc__ = getattr(fn, "__doc__", None)

    def __repr__(self) -> str:
        return f"{self.recorder!r}.step({self.__name__})"

    def _traced(self, *args: Any, _choices: Optional[tuple] = None, **kwargs: Any
                ) -> tuple[Any, hoist.Collected]:
        """What ``jit`` traces: ``fn`` traced to a jaxpr, evaluated again with its records
        collected as outputs (``_choices``: the host's outcome of selections, see
        :attr:`_host_conds`)."""
        n = len(args)
        static = {i % n if n else i for i in self._static}
        dyn = {i: a for i, a in enumerate(args) if i not in static}
        dyn_kw = {k: v for k, v in kwargs.items() if k not in self._static_names}
        leaves, tree = jax.tree_util.tree_flatten((dyn, dyn_kw))

        def flat(*ls: Any) -> Any:
            d, dk = jax.tree_util.tree_unflatten(tree, ls)
            full = [d[i] if i in d else args[i] for i in range(n)]
            kw = {**{k: v for k, v in kwargs.items() if k in self._static_names}, **dk}
            return self.fn(*full, **kw)

        # So that JAX's messages about what was traced (a result that is not an array...)
        # name the user's function and its line, as jax.jit's do, not this wrapper.
        named = functools.wraps(self.fn, updated=())(flat)
        jaxpr, consts, shape = compat.jaxprs.traced(named, *leaves)
        outs, nodes, arrays, met = hoist.evaluate(jaxpr, consts, leaves,
                                                  self._platform or transports.canonical(
                                                      jax.default_backend()),
                                                  _choices)
        if _choices is None:
            self._host_conds = met
        self._recorders = _declare(nodes, arrays)[1]
        result = jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(shape), outs)
        return result, hoist.Collected(nodes, arrays)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not compat.eval_trace_active():
            # Called inside another trace (a jit, grad, vmap of its own): there is no
            # dispatch to hang the records on, so they stay in that computation.
            return self.fn(*args, **kwargs)
        self._check_open()
        flight = self.recorder._flight
        if flight is not None and flight.raises:  # on_trigger="raise": stop at a trigger
            flight.before_step(self.recorder)
        if not self._platform:
            self._platform = _platform_of(args, kwargs)
        if not self.takes_outputs():
            return self._inside(*args, **kwargs)
        choices = self._choices(args, kwargs) if self._host_conds else None
        result, collected = self._jitted(*args, _choices=choices, **kwargs)
        if collected.nodes:
            pipeline = self.recorder.pipeline
            plan = pipeline.plan(collected.nodes)
            chosen = self._chosen(plan, args, kwargs) if plan.host else {}
            pipeline.submit(collected, self.in_flight, chosen)
        return result

    def _check_open(self) -> None:
        """Refuses a call, before it runs, when the step's recorder is closed, or (records
        leaving as outputs) one its last trace records to: its rows would be dropped."""
        closed = next((r for r in (self.recorder, *self._recorders) if r.closed), None)
        if closed is not None:
            raise ValueError(
                f"hostfeed: {self!r} was called after {closed!r} was closed: its records "
                f"would be dropped. Call a recorder's steps before its close() (or record "
                f"with a recorder that is open)")

    def _leaves(self, args: tuple, kwargs: dict) -> list:
        """The dynamic arguments, flat, in the order :meth:`_traced` numbers them."""
        n = len(args)
        static = {i % n if n else i for i in self._static}
        return jax.tree_util.tree_leaves(
            ({i: a for i, a in enumerate(args) if i not in static},
             {k: v for k, v in kwargs.items() if k not in self._static_names}))

    def _choices(self, args: tuple, kwargs: dict) -> Optional[tuple]:
        """The host's outcome of each selection of :attr:`_host_conds` whose step argument
        is a host value (None for the others), or None if there is none."""
        leaves = self._leaves(args, kwargs)
        out = tuple((sel, _selected_at(leaves, sel)) for sel in self._host_conds)
        return out if any(c is not None for _, c in out) else None

    def _chosen(self, plan: _Plan, args: tuple, kwargs: dict) -> dict[int, bool]:
        """The records whose ``every=``/``start=``/``stop=`` selection the host decides from
        a step argument passed as a host value: {their first array's index: selected}."""
        leaves = self._leaves(args, kwargs)
        out = {}
        for start, site in plan.host:
            chosen = _selected_at(leaves, site.selection)
            if chosen is not None:
                out[start] = chosen
        return out

    def takes_outputs(self) -> bool:
        """Whether the records leave as outputs: as ``outputs=`` says, else as the
        transport of the platform the step runs on prefers (its first call's arguments'
        platform, or JAX's default backend's; ``records_as_outputs``: a TPU's records
        would be host transfers inside the computation, which cost far more than a copy of
        an output; on a CPU or a GPU hostfeed's own handlers copy a record inside the
        computation for less than a copy of an output costs). The choice shapes the whole
        computation (its outputs), so it is taken at the first call, not when lowering."""
        if self.outputs is None:
            self.outputs = transports.for_platform(self._platform or None).records_as_outputs
        return self.outputs

    def lower(self, *args: Any, **kwargs: Any) -> Any:
        """The computation lowered for ``args`` (``jax.jit(...).lower``); where the records
        leave as outputs, its outputs are ``(fn's outputs, what it records)``."""
        if not self._platform:
            self._platform = _platform_of(args, kwargs)
        if self.takes_outputs():
            return self._jitted.lower(*args, **kwargs)
        return self._inside.lower(*args, **kwargs)


def _platform_of(args: tuple, kwargs: dict) -> str:
    """The platform computations lower for of the first JAX array among a call's arguments
    (``cuda``, not a CUDA device's ``gpu``; "" if there is none: the computation runs on
    JAX's default backend)."""
    for leaf in jax.tree_util.tree_leaves((args, kwargs)):
        if isinstance(leaf, jax.Array) and not isinstance(leaf, jax.core.Tracer):
            device: Any = next(iter(leaf.sharding.device_set))
            return transports.canonical(str(device.platform))
    return ""


def _declare(nodes: Sequence[hoist.Node], arrays: Sequence[Any], depth: int = 0
             ) -> tuple[int, tuple]:
    """Declares the arrays every collected record writes (as lowering does for a record
    left in the computation), so that a name recorded with another dtype or shape, or to a
    closed recorder, is an error here, at the call; returns how many arrays it went
    through, and the recorders recorded to."""
    at = 0
    catalogues: dict[int, Any] = {}
    for node in nodes:
        if isinstance(node, hoist.Loop):
            n, inner = _declare(node.children, arrays[at:], depth + 1)
            at += n
            catalogues.update((id(c), c) for c in inner)
            continue
        at += int(node.flagged)
        avals = [jax.typeof(a) if hasattr(jax, "typeof") else a.aval
                 for a in arrays[at:at + node.operands]]
        at += node.operands
        spec = node.callback
        catalogue = spec.catalogue
        catalogues[id(catalogue)] = catalogue
        if catalogue.closed:
            raise ValueError(f"hostfeed: a step records {spec.array!r} to a closed "
                             f"recorder ({catalogue.path})")
        # (An instance's operands: without the leading dimensions of its loops.)
        declare(catalogue, spec.array, spec.kind, node.transforms,
                [jax.ShapeDtypeStruct(a.shape[depth:], a.dtype) for a in avals])
    return at, tuple(catalogues.values())


class _Plan:
    """For one structure of collected nodes: which arrays to copy at once (operands of
    records without a flag, and the flags), the record instances in program order, and the
    records whose selection the host may decide (``host``: (first array's index, site))."""

    __slots__ = ("prefetch", "instances", "host")

    def __init__(self, nodes: tuple):
        always, flags = hoist.site_arrays(nodes)
        self.prefetch = always + flags
        self.instances = list(hoist.order(nodes))
        self.host = [(start, site) for start, site, index in self.instances
                     if site.selection is not None and index == ()]


class Pipeline:
    """A recorder's pipeline (its ``pipeline``): the steps submitted and not yet appended,
    in order, and the thread that appends them; a failure goes to the recorder's
    ``catalogue``."""

    def __init__(self, catalogue: Catalogue):
        self.catalogue = catalogue
        self.cv = threading.Condition()
        self.pending: collections.deque[tuple[hoist.Collected, dict]] = collections.deque()
        self.busy = False
        self.sleeping = False  # the thread waits for work
        self.waiting = 0  # threads waiting for room (submit) or for the end (drain)
        self.thread: Optional[threading.Thread] = None
        self.plans: dict[tuple, _Plan] = {}

    def plan(self, nodes: tuple) -> _Plan:
        p = self.plans.get(nodes)
        if p is None:
            if len(self.plans) > 256:
                self.plans.clear()
            p = self.plans[nodes] = _Plan(nodes)
        return p

    def submit(self, collected: hoist.Collected, in_flight: int,
               chosen: Optional[dict[int, bool]] = None) -> None:
        """Starts the copies of a step's records and queues it; waits first while
        ``in_flight`` steps are queued or being appended (GIL released). ``chosen``: the
        records whose selection the host decided (no flag fetched: their values are
        copied if selected, nothing otherwise)."""
        arrays = collected.arrays
        chosen = chosen or {}
        plan = self.plan(collected.nodes)
        if chosen and len(chosen) == len(plan.instances) and not any(chosen.values()):
            return  # the host knows this step records nothing: nothing to copy or append
        skip = set()
        for start, site in plan.host:
            if start in chosen:
                skip.add(start)  # its flag
                if chosen[start]:
                    for k in range(site.operands):
                        _copy(arrays[start + 1 + k])
        for i in plan.prefetch:
            if i not in skip:
                _copy(arrays[i])
        with self.cv:
            while len(self.pending) + self.busy >= in_flight:
                self.waiting += 1
                self.cv.wait()
                self.waiting -= 1
            self.pending.append((collected, chosen))
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._run, daemon=True,
                                               name="hostfeed-record-steps")
                self.thread.start()
            elif self.sleeping:
                # (Woken only when asleep: a wake-up is a system call, which a sandboxed
                # host such as a TPU VM's makes slow, and the thread takes what is queued
                # without sleeping while it is busy.)
                self.cv.notify_all()

    @property
    def idle(self) -> bool:
        """Whether every step submitted so far is appended (read without waiting)."""
        return not (self.pending or self.busy)

    def drain(self) -> None:
        """Waits until every step submitted so far is appended."""
        with self.cv:
            self.waiting += 1
            try:
                while self.pending or self.busy:
                    if self.thread is None or not self.thread.is_alive():
                        # (a forked child: the parent's thread is not here)
                        self.pending.clear()
                        return
                    self.cv.wait(0.1)
            finally:
                self.waiting -= 1

    def _run(self) -> None:
        while True:
            with self.cv:
                while not self.pending:
                    self.sleeping = True
                    woken = self.cv.wait(30.0)
                    self.sleeping = False
                    if not woken and not self.pending:
                        self.thread = None  # idle: a later submit starts another
                        return
                collected, chosen = self.pending.popleft()
                self.busy = True
            try:
                self._deliver(collected, chosen)
            except BaseException as exc:  # noqa: BLE001 - kept for the recorder's flush
                logger.error("hostfeed: recording a step's outputs failed (raised by the "
                             "recorder's next flush, close or barrier_wait): %s", exc)
                self.catalogue.failed(exc)
            finally:
                del collected
                with self.cv:
                    self.busy = False
                    if self.waiting:
                        self.cv.notify_all()

    def _deliver(self, collected: hoist.Collected, chosen: dict[int, bool]) -> None:
        arrays = collected.arrays
        host: dict[int, np.ndarray] = {}

        def get(i: int) -> np.ndarray:
            h = host.get(i)
            if h is None:
                h = host[i] = np.asarray(arrays[i])
            return h

        for start, site, index in self.plan(collected.nodes).instances:
            j = start
            if site.flagged:
                known = chosen.get(start) if index == () else None
                if not (get(j)[index] if known is None else known):
                    continue
                j += 1
            values = [get(j + k)[index] for k in range(site.operands)]
            spec = site.callback
            try:
                spec.func.append_rows(values, site.transforms,
                                      _device_of(arrays[j] if site.operands else None))
            except ValueError:
                if not spec.catalogue.closed:
                    raise
                # Closed meanwhile (by another thread): the rows are dropped and counted,
                # and the next barrier_wait raises it; the other records still go.


def _selected_at(leaves: Sequence[Any], selection: tuple) -> Optional[bool]:
    """Whether the step ``leaves[at]`` is selected (``selection``: at, every, start, stop),
    if it is a host integer; None for a device value."""
    at, every, first, stop = selection
    step = leaves[at] if at < len(leaves) else None
    if (isinstance(step, (int, np.integer)) and not isinstance(step, bool)) or (
            isinstance(step, np.ndarray) and step.ndim == 0 and step.dtype.kind in "iu"):
        return selected(step, every, first, stop)
    return None


def _copy(array: Any) -> None:
    """Starts the copy of a device array to the host (nothing for a host value)."""
    copy = getattr(array, "copy_to_host_async", None)
    if copy is not None:
        copy()


def _device_of(array: Any) -> Any:
    """The device a record's row is said to come from: the array's (the first of its
    devices, for a sharded one: the device a global-view record names)."""
    devices: Sequence[Any] = sorted(getattr(array, "devices", lambda: ())(),
                                    key=lambda d: d.id)
    return devices[0] if devices else None
