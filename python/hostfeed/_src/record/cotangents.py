"""Summaries of cotangents: with ``reduce=`` and cotangents on (the default),
``Recorder.record`` passes the value it returns through :data:`summarized_cotangent_p`,
the identity, whose transpose (the backward pass of ``grad``, ``vjp``) records the same
reduction of the cotangent flowing into the value, at the same selected steps, under
:func:`cotangent_name`. A raw record's cotangent is the record primitive's own
(``rules.py``); a summary's row is of ``stop_gradient(value)``, so its cotangent needs this
path of its own.

The primitive lowers to nothing (its result is its operand): a computation that is not
differentiated is compiled as without it. Under ``jvp`` alone the tangent passes through
unrecorded (a summary records the primal only there). Under ``vmap`` each lane's
cotangent is summarised into a row of its own, as each lane's value is.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Optional

import jax
import jax.numpy as jnp
from jax.interpreters import ad, batching, mlir

from .. import compat
from ..reductions import resolve
from .roles import COTANGENT_SUFFIX

__all__ = ["Plan", "cotangent_name", "summarized_cotangent_p", "through"]


def cotangent_name(name: str, reduce: Any) -> str:
    """Where a summary recorded as ``name`` keeps its cotangent's: ``NAME.cotangent``, or,
    for a name that ends in the reduction's suffix (as ``hostfeed.capture`` names its
    summaries), ``.cotangent`` before it.

    Example:
        >>> cotangent_name("h", "stats"), cotangent_name("mlp/output.stats", "stats")
        ('h.cotangent', 'mlp/output.cotangent.stats')
    """
    suffix = resolve(reduce, name).suffix
    leaf = name.rpartition("/")[2]
    if suffix and leaf.endswith(suffix) and len(leaf) > len(suffix):
        return name[:-len(suffix)] + COTANGENT_SUFFIX + suffix
    return name + COTANGENT_SUFFIX


@dataclasses.dataclass(frozen=True, eq=False)
class Plan:
    """How the backward pass records a cotangent: ``record(cotangent, step)`` records its
    summary (at the selected steps) under ``name``. Hashed by identity (an equation's
    parameter)."""

    record: Callable[[Any, Any], Any]
    name: str

    def __repr__(self) -> str:
        return f"Plan({self.name!r})"


# Operands: the value, then the step if there is one. Parameters: the plan, and ``lanes``:
# for each vmap that batched the primitive (the latest first), whether it batched the step.
summarized_cotangent_p = compat.Primitive("hostfeed_summarized_cotangent")
summarized_cotangent_p.def_impl(lambda x, *step, plan, lanes: x)
summarized_cotangent_p.def_abstract_eval(lambda x, *step, plan, lanes: x)
mlir.register_lowering(summarized_cotangent_p, lambda ctx, x, *step, plan, lanes: [x])


def _jvp(primals: Any, tangents: Any, *, plan: Plan, lanes: tuple) -> Any:
    x, *step = primals
    t = tangents[0]
    if type(t) is compat.Zero:
        return x, t
    return x, summarized_cotangent_p.bind(t, *step, plan=plan, lanes=lanes)


def _transpose(ct: Any, x: Any, *step: Any, plan: Plan, lanes: tuple) -> list:
    aval = x.aval if compat.is_undefined_primal(x) else jax.typeof(x)
    c = jnp.zeros(aval.shape, aval.dtype) if type(ct) is compat.Zero else ct
    record = plan.record
    for step_batched in reversed(lanes):  # the first vmap (the innermost lanes) first
        record = jax.vmap(record, in_axes=(0, 0 if step_batched else None))
    record(c, step[0] if step else None)
    return [ct, *([None] * len(step))]


def _batched(args: Any, dims: Any, *, plan: Plan, lanes: tuple) -> Any:
    x, *step = args
    size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
    x = (jnp.moveaxis(x, dims[0], 0) if dims[0] is not None
         else jnp.broadcast_to(x, (size, *jnp.shape(x))))
    step_batched = bool(step) and dims[1] is not None
    if step_batched:
        step = [jnp.moveaxis(step[0], dims[1], 0)]
    out = summarized_cotangent_p.bind(x, *step, plan=plan, lanes=(step_batched, *lanes))
    return out, 0


ad.primitive_jvps[summarized_cotangent_p] = _jvp
ad.primitive_transposes[summarized_cotangent_p] = _transpose
batching.primitive_batchers[summarized_cotangent_p] = _batched


def through(value: Any, step: Optional[Any], plan: Plan) -> Any:
    """``value``, through :data:`summarized_cotangent_p` when it is traced and of a
    floating type (an eager value, or an integer one, has no cotangent)."""
    if not compat.is_tracer(value) or not jnp.issubdtype(value.dtype, jnp.inexact):
        return value
    operands = [value] if step is None else [value, jnp.asarray(step)]
    return summarized_cotangent_p.bind(*operands, plan=plan, lanes=())
