"""Selective recording: ``every=``, ``start=`` and ``stop=`` of ``Recorder.record``, decided
on the device (a ``cond`` on the step) or, for a concrete step, at the call; and
:func:`selective`, which wraps a recorder's plain record into one that records a value or
its summary (:func:`hostfeed._src.record.summaries.summarize`) at the selected steps only."""
from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any, Optional, Protocol

import jax
import jax.numpy as jnp
import numpy as np
from jax.interpreters import ad, batching, mlir

from .. import compat, reductions, transports
from . import cotangents
from ..primitives import get_ad_taps
from .inputs import check_fits
from .summaries import check_int, summarize

__all__ = ["Record", "SelectiveRecord", "selective", "selection", "selected",
           "selected_step_p"]


class Record(Protocol):
    """A recorder's plain record: one row of ``value`` (no selection, no summary)."""

    def __call__(self, name: str, value: Any, *, step: Any = None, result: Any = None,
                 ad_taps: Optional[str] = None) -> Any: ...


class SelectiveRecord(Protocol):
    """A plain :class:`Record` that also takes ``every=``, ``start=``, ``stop=``,
    ``reduce=`` and ``axis=`` (see :func:`selective`)."""

    def __call__(self, name: str, value: Any, *, step: Any = None, result: Any = None,
                 every: Any = None, start: Any = None, stop: Any = None, reduce: Any = None,
                 axis: Any = None, ad_taps: Optional[str] = None) -> Any: ...


def selective(record: Record, describe: Callable[[str, str], None]) -> SelectiveRecord:
    """``record`` wrapped to record at the selected steps only (``every=``, ``start=``,
    ``stop=``) and, with ``reduce=`` (over ``axis=``), a summary of the value instead of it
    (``describe(name, json)`` is told what the summary is). Without any of them, the
    wrapper is ``record`` itself.

    Example:
        >>> rows = []
        >>> def record(name, value, *, step=None, result=None, ad_taps=None):
        ...     rows.append((name, value, step))
        ...     return value
        >>> recorded = selective(record, lambda name, desc: None)
        >>> [recorded("h", k * 10, step=k, every=2) for k in range(4)]
        [0, 10, 20, 30]
        >>> rows
        [('h', 0, 0), ('h', 20, 2)]
    """
    def recorded(name: str, value: Any, *, step: Any = None, result: Any = None,
                 every: Any = None, start: Any = None, stop: Any = None, reduce: Any = None,
                 axis: Any = None, ad_taps: Optional[str] = None) -> Any:
        if every is None and start is None and stop is None and reduce is None \
                and axis is None:
            return record(name, value, step=step, result=result, ad_taps=ad_taps)
        check_fits(value, name)
        through = (ad_taps or get_ad_taps()) != "primals"
        backward = None
        if reduce is not None and through and result is None:
            backward = _cotangent_plan(record, describe, name, every, start, stop, reduce,
                                       axis)
        return _record_selected(functools.partial(record, ad_taps=ad_taps), describe, name,
                                value, step, result, every, start, stop, reduce, axis,
                                through=through, backward=backward)
    return recorded


def _cotangent_plan(record: Record, describe: Callable[[str, str], None], name: str,
                    every: Any, start: Any, stop: Any, reduce: Any,
                    axis: Any) -> cotangents.Plan:
    """How the backward pass records the summary of a summarised value's cotangent: the
    same reduction at the same steps, under :func:`cotangents.cotangent_name` (no
    cotangent of that record in turn)."""
    ct_name = cotangents.cotangent_name(name, reduce)
    plain = functools.partial(record, ad_taps="primals")

    def take(ct: Any, step: Any) -> None:
        _record_selected(plain, describe, ct_name, ct, step, None, every, start, stop,
                         reduce, axis, through=False)
    return cotangents.Plan(take, ct_name)


def selection(step: Any, every: Any, start: Any, stop: Any, name: str) -> Any:
    """Whether ``step`` is selected: a Python bool for a concrete step, else a traced one."""
    every = check_int(every, "every", name, least=1)
    start, stop = check_int(start, "start", name), check_int(stop, "stop", name)
    if step is None:
        raise ValueError(f"hostfeed: Recorder.record({name!r}): every=, start= and stop= "
                         f"select steps: pass the step too (step=...)")
    if not compat.is_tracer(step):
        return selected(np.asarray(step), every, start, stop)
    s = jnp.asarray(step)
    chosen = jnp.bool_(True)
    if start is not None:
        chosen = chosen & (s >= start)
    if stop is not None:
        chosen = chosen & (s < stop)
    if every is not None:
        chosen = chosen & ((s - (start or 0)) % every == 0)
    return chosen


# The step of a selected record, passed through a primitive that also takes the
# selection: when ``vmap`` batches a ``cond`` by its predicate, JAX turns it into a select
# that runs both branches (taking their side effects for granted), so a record would be
# taken at every lane's step. Batching this primitive with a batched selection raises
# instead; with one selection for all lanes, it is the identity on the step.
# Its parameter ``selection`` is ``(every, start, stop)``: a recorded step
# (``Recorder.step``) whose step argument is a host value decides the selection on the host
# from it, without fetching the flag from the device.
selected_step_p = compat.Primitive("hostfeed_selected_step")
selected_step_p.def_impl(lambda step, chosen, selection=(): step)
selected_step_p.def_abstract_eval(lambda step, chosen, selection=(): step)
mlir.register_lowering(selected_step_p,
                       mlir.lower_fun(lambda step, chosen, selection=(): [step],
                                      multiple_results=True))


def selected(step: Any, every: Optional[int], start: Optional[int],
             stop: Optional[int]) -> bool:
    """Whether the integer ``step`` is selected by ``every``, ``start`` and ``stop``.

    Example:
        >>> [k for k in range(12) if selected(k, 5, 1, 11)]
        [1, 6]
    """
    k = int(step)
    return ((start is None or k >= start) and (stop is None or k < stop)
            and (every is None or (k - (start or 0)) % every == 0))


def _selected_step_jvp(primals: Any, tangents: Any, **params: Any) -> Any:
    # An integer step: its tangent is a symbolic zero.
    out = selected_step_p.bind(*primals, **params)
    return out, ad.Zero(jax.typeof(out).to_tangent_aval())


ad.primitive_jvps[selected_step_p] = _selected_step_jvp


def _selected_step_batched(args: Any, dims: Any, **params: Any) -> Any:
    step, chosen = args
    if dims[1] is not None:
        raise ValueError(
            "hostfeed: Recorder.record(..., every=/start=/stop=) under vmap with a step that "
            "differs between the lanes: the selection must be one for all lanes (pass the "
            "step unbatched, in_axes=None), or record without every=/start=/stop= and select "
            "when reading")
    return selected_step_p.bind(step, chosen, **params), dims[0]


batching.primitive_batchers[selected_step_p] = _selected_step_batched


def _marked(step: Any, chosen: Any, sel: tuple) -> Any:
    """``step``, through :data:`selected_step_p` with the selection ``sel``."""
    return selected_step_p.bind(step, chosen, selection=sel)


def _sent_at_selected(record: Callable[..., Any], name: str, row: Any, step: Any,
                      chosen: Any, result: Any, sel: tuple) -> Any:
    """``record(name, row, step=, result=)`` in a ``cond`` on ``chosen``; returns
    ``result`` through it (None without one)."""
    if result is None:
        jax.lax.cond(chosen,
                     lambda r, s, c: (record(name, r, step=_marked(s, c, sel),
                                             result=None), None)[1],
                     lambda r, s, c: None, row, step, chosen)
        return None
    return jax.lax.cond(
        chosen, lambda r, s, c, res: record(name, r, step=_marked(s, c, sel),
                                            result=res),
        lambda r, s, c, res: res, row, step, chosen, result)


def _summary_at_selected(take: Callable[..., Any], record: Callable[..., Any], name: str,
                         summary: Callable[[Any], Any], value: Any, step: Any, chosen: Any,
                         result: Any, sel: tuple) -> Any:
    """A summary of ``value`` recorded at the steps ``chosen`` selects (decided on the
    device); returns ``value``, or ``result`` through the record if given. Where the
    transport of the platform lowered for says so (``summarize_every_step``: a TPU's), the
    summary is computed at every step and the ``cond`` only sends it; elsewhere it is
    computed in the ``cond``, at the selected steps only. Traced where JAX's default
    backend computes it in the cond (a CPU, a GPU), JAX takes the choice when it lowers
    (:func:`jax.lax.platform_dependent`), keeping the branch of the platform lowered for
    (a TPU's when a function traced on a CPU host is lowered for a TPU)."""
    def every_step(v: Any, s: Any, c: Any, r: Any) -> Any:
        return _sent_at_selected(record, name, summary(v), s, c, r, sel)

    def in_cond(v: Any, s: Any, c: Any, r: Any) -> Any:
        if r is None:
            jax.lax.cond(c, lambda v, s, c: (take(v, _marked(s, c, sel), None), None)[1],
                         lambda v, s, c: None, v, s, c)
            return None
        return jax.lax.cond(c, lambda v, s, c, r: take(v, _marked(s, c, sel), r),
                            lambda v, s, c, r: r, v, s, c, r)

    on = transports.platforms_where(lambda t: t.summarize_every_step)
    if transports.for_platform().summarize_every_step:
        # JAX's default backend computes it at every step (a TPU): that way, with no
        # platform's cond around it, as the TPU's compiler was checked to take it; on
        # another platform it records the same rows.
        got = every_step(value, step, chosen, result)
    elif on:
        got = jax.lax.platform_dependent(value, step, chosen, result, default=in_cond,
                                         **dict.fromkeys(on, every_step))
    else:
        got = in_cond(value, step, chosen, result)
    return value if result is None else got


def _record_selected(record: Callable[..., Any], describe: Callable[[str, str], None],
                     name: str, value: Any, step: Any, result: Any, every: Any, start: Any,
                     stop: Any, reduce: Any, axis: Any, through: bool = True,
                     backward: Optional[cotangents.Plan] = None) -> Any:
    """``record(name, row, step=, result=)`` of ``value`` (or of its summary), at the
    selected steps only; returns ``value``, or ``result`` if given. ``through``: whether
    a raw value decided on the device passes through the record (for its cotangent to
    be recorded under ``grad``); if not, the record is only a side effect, which leaves
    XLA's fusion of the value's producers and users as without it. ``backward``: how the
    summary of the cotangent of ``value`` is recorded (at the same steps), if it is."""
    selecting = every is not None or start is not None or stop is not None
    chosen = selection(step, every, start, stop, name) if selecting else True
    if reduce is None and axis is not None:
        raise ValueError(f"hostfeed: Recorder.record({name!r}): axis= says what reduce= "
                         f"reduces over; pass reduce={reductions.accepted()}")
    out = value if result is None else result
    if chosen is False:
        return out
    if backward is not None:
        value = cotangents.through(value, step, backward)

    def summary(v: Any) -> Any:
        # A summary is a diagnostic: no gradient flows into it (nor is its cotangent,
        # always zero, recorded).
        row, desc = summarize(jax.lax.stop_gradient(v), reduce, axis, name)
        describe(name, json.dumps(desc))
        return row

    def take(v: Any, s: Any, r: Any) -> Any:
        return record(name, v if reduce is None else summary(v), step=s, result=r)

    if chosen is True:
        # Through the record: the value (a raw record) or a given result, so that it
        # follows the record; a summary's value is returned as it is.
        got = take(value, step, result)
        return got if reduce is None or result is not None else value
    # Decided on the device: nothing but the compare runs at other steps. The value (or a
    # given result) goes through both branches, so that it still follows the record (and
    # under grad, the cotangent recorded is the one flowing into the value).
    s_arr = jnp.asarray(step)
    sel = (check_int(every, "every", name, least=1), check_int(start, "start", name),
           check_int(stop, "stop", name))
    if reduce is not None:
        return _summary_at_selected(take, record, name, summary, value, s_arr, chosen,
                                    result, sel)
    if result is None and not through:  # the record is only a side effect
        jax.lax.cond(chosen,
                     lambda v, s, c: (take(v, _marked(s, c, sel), None), None)[1],
                     lambda v, s, c: None, value, s_arr, chosen)
        return value
    if result is None:
        return jax.lax.cond(chosen, lambda v, s, c: take(v, _marked(s, c, sel), None),
                            lambda v, s, c: v, value, s_arr, chosen)
    return jax.lax.cond(chosen, lambda v, s, c, r: take(v, _marked(s, c, sel), r),
                        lambda v, s, c, r: r, value, s_arr, chosen, result)
