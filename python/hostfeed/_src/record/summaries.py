"""Recording what matters: the steps a record is taken at (``every``, ``start``, ``stop``)
and summaries computed on the device instead of the value (``reduce=``: a
:class:`~hostfeed._src.reductions.Reduction` of the registry: ``"stats"``,
``Histogram(...)``, ...), for :meth:`hostfeed.Recorder.record`.

The selection is decided on the device: with a traced ``step``, the record sits in a
``lax.cond`` whose false branch does nothing, so a step that records nothing costs a
compare and a branch (no copy, no host work); with a concrete step it is decided here and
an unselected record binds nothing at all. A summary is computed on the device before the
record: on a CPU device in one pass by a custom call of the Rust core where the reduction
has one (:attr:`Reduction.native_kernel`); elsewhere by its JAX operations, so that under
``jit`` of a sharded value each device reduces its own slice and XLA combines the partial
results (a few numbers per device move, never the value). The row recorded is the summary.
"""
from __future__ import annotations

import math
import operator
from typing import Any, Optional
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.interpreters import ad, batching, mlir

from .. import compat, transports
from ..reductions import STATS, Histogram, Reduction, resolve

__all__ = ["Histogram", "STATS", "summarize"]


# A summary over a value's trailing axes (all of them, by default) is one primitive. Where
# the CPU computes it per device (one device; pmap or a shard_map over every mesh axis) it
# lowers to a custom call of the Rust core, which reads the value once (XLA:CPU has no
# single-pass way to take several reductions: four plain ones read it four times, the
# switch to the finite values is a ``cond``, and a histogram is a scatter-add); elsewhere
# (GPU, ``jit`` over values sharded on several devices, where XLA partitions the
# reductions) to the JAX operations of the reduction's ``compute``, as
# they do where JAX's lowering is asked for (``HOSTFEED_TRANSPORT=jax``: a transport
# without ``native_kernels``). The native transport registers the kernels and their rule
# (``transports.register_kernel``).


def _per_device(ctx: Any) -> bool:
    """Whether a lowering rule runs on one device's own values."""
    ac = ctx.module_context.axis_context
    if isinstance(ac, compat.SPMDAxisContext):
        return frozenset(compat.manual_axes(ac)) == frozenset(ac.mesh.axis_names)
    if isinstance(ac, compat.ShardingContext):
        return ac.num_devices == 1
    return True  # pmap's per-replica context


def _summary_primitive(name: str, row_shape: Callable[..., tuple[int, ...]],
                       dtype: Callable[..., Any],
                       of_trailing: Callable[..., jax.Array],
                       constants: Callable[..., list[np.ndarray]]) -> Any:
    """The primitive ``name(v, reduced=k, **params)``: the kept axes, then ``row_shape``
    values of ``dtype`` (each given the parameters); lowered on a CPU device to the core's
    custom call ``name`` (with the operands ``constants(**params)`` after the value) where
    the transport uses native kernels, elsewhere to ``of_trailing``."""
    prim = compat.Primitive(name)
    prim.def_impl(lambda v, **params: compat.apply_primitive(prim, v, **params))
    prim.def_abstract_eval(lambda v, *, reduced, **params: jax.core.ShapedArray(
        v.shape[:v.ndim - reduced] + row_shape(**params), np.dtype(dtype(**params))))
    portable = mlir.lower_fun(of_trailing, multiple_results=False)

    mlir.register_lowering(prim, portable)
    transports.register_kernel(
        prim, name, portable, where=_per_device,
        constants=lambda **params: constants(**{k: p for k, p in params.items()
                                                 if k != "reduced"}))

    def jvp(primals: Any, tangents: Any, **params: Any) -> Any:
        # A summary is of stop_gradient(x): no tangent flows.
        out = prim.bind(*primals, **params)
        return out, ad.Zero(jax.typeof(out).to_tangent_aval())

    def batched(args: Any, dims: Any, **params: Any) -> Any:
        # The batch axis goes first, among the kept axes: the reduced ones stay trailing.
        return prim.bind(jnp.moveaxis(args[0], dims[0], 0), **params), 0

    ad.primitive_jvps[prim] = jvp
    batching.primitive_batchers[prim] = batched
    return prim


_PRIMITIVES: dict[str, Any] = {}


def _primitive(r: Reduction) -> Any:
    """The primitive of ``r``'s kind (named after its native kernel)."""
    name = r.native_kernel
    assert name is not None
    if name not in _PRIMITIVES:
        _PRIMITIVES[name] = _summary_primitive(
            name, lambda reduction: reduction.row_shape(),
            lambda reduction: reduction.dtype,
            lambda v, *, reduced, reduction: reduction.compute(
                v, tuple(range(v.ndim - reduced, v.ndim))),
            lambda reduction: reduction.kernel_operands())
    return _PRIMITIVES[name]


def _trailing(axes: tuple[int, ...], ndim: int) -> bool:
    return axes == tuple(range(ndim - len(axes), ndim))


def _kernel_or_ops(r: Reduction) -> Callable[[jax.Array, tuple[int, ...]], jax.Array]:
    """``r.compute(v, axes)``, through the primitive of ``r``'s native kernel where it has
    one, ``axes`` are trailing and ``v`` is float32 (the kernels' dtype)."""
    def reduce(v: jax.Array, axes: tuple[int, ...]) -> jax.Array:
        if r.native_kernel is not None and _trailing(axes, v.ndim) and v.dtype == jnp.float32:
            return _primitive(r).bind(v, reduced=len(axes), reduction=r)
        return r.compute(v, axes)
    return reduce


# Created here, as they were registered before: the primitives of the built-in kernels.
stats_p = _primitive(resolve("stats", ""))
histogram_p = _primitive(Histogram(1, (0.0, 1.0)))


def _sharded_in_type(v: jax.Array) -> bool:
    """Whether ``v``'s sharding is in its type (explicit sharding over a non-trivial
    mesh)."""
    sharding = getattr(jax.typeof(v), "sharding", None)
    spec, mesh = getattr(sharding, "spec", None), getattr(sharding, "mesh", None)
    return not (spec is None or mesh is None or getattr(mesh, "empty", True)
                or all(p is None for p in spec))


def _axes(axis: Any, ndim: int, name: str) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(ndim))
    items = axis if isinstance(axis, (tuple, list)) else (axis,)
    out = []
    for a in items:
        try:
            i = operator.index(a)
        except TypeError:
            raise TypeError(f"hostfeed: Recorder.record({name!r}): axis must be an int or a "
                            f"tuple of ints, got {axis!r}") from None
        if not -ndim <= i < ndim:
            raise ValueError(f"hostfeed: Recorder.record({name!r}): axis {i} is out of range "
                             f"for a value of {ndim} dimensions")
        out.append(i % ndim)
    if len(set(out)) != len(out):
        raise ValueError(f"hostfeed: Recorder.record({name!r}): axis {axis!r} repeats an axis")
    return tuple(sorted(out))


def summarize(value: Any, reduce: Any, axis: Any, name: str) -> tuple[jax.Array, dict]:
    """The row that ``reduce`` makes of ``value`` (reduced over ``axis``, all by default)
    and the description stored in the array's attributes."""
    r = resolve(reduce, name)
    desc: dict = r.describe()
    x = jnp.asarray(value)
    if jnp.issubdtype(x.dtype, jnp.complexfloating):
        raise TypeError(f"hostfeed: Recorder.record({name!r}): reduce= summarizes real "
                        f"values, got {x.dtype}: record jnp.abs(x) or x.real")
    axes = _axes(axis, x.ndim, name)
    size = math.prod(x.shape[d] for d in axes)
    if size >= 1 << 31:
        raise ValueError(f"hostfeed: Recorder.record({name!r}): reduce= over {size} elements "
                         f"a row; at most 2**31 - 1 (reduce over fewer axes)")
    r.check(tuple(x.shape), axes, name)
    desc["axis"] = list(axes)
    # The reductions read the value as it is in memory: fused into its producer, each would
    # compute it again (a gelu's tanh, once per statistic).
    x = jax.lax.optimization_barrier(x)
    v = x.astype(r.value_dtype(np.dtype(x.dtype)))
    fn = _kernel_or_ops(r)
    if _sharded_in_type(v):
        return r.sharded(v, axes, fn), desc
    return fn(v, axes), desc


def check_int(v: Any, what: str, name: str, least: Optional[int] = None) -> Optional[int]:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"hostfeed: Recorder.record({name!r}): {what} must be an int (a step), "
                        f"got {v!r}")
    if least is not None and v < least:
        raise ValueError(f"hostfeed: Recorder.record({name!r}): {what} must be >= {least}, "
                         f"got {v}")
    return int(v)
