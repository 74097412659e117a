"""Recording what matters: the steps a record is taken at (``every``, ``start``, ``stop``)
and summaries computed on the device instead of the value (``reduce="stats"``,
``reduce=Histogram(...)``), for :meth:`hostfeed.Recorder.record`.

The selection is decided on the device: with a traced ``step``, the record sits in a
``lax.cond`` whose false branch does nothing, so a step that records nothing costs a
compare and a branch (no copy, no host work); with a concrete step it is decided here and
an unselected record binds nothing at all. A summary is computed on the device before the
record: on a CPU device in one pass by a custom call of the Rust core; elsewhere by ordinary
JAX operations, so that under ``jit`` of a sharded value each device reduces its own slice
and XLA combines the partial results (a few numbers per device move, never the value). The
row recorded is the summary.
"""
from __future__ import annotations

import math
import operator
from typing import Any, Optional, Union
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.interpreters import ad, batching, mlir

from ... import _receiver
from .. import compat, transports

__all__ = ["Histogram", "STATS", "summarize"]

#: The statistics of ``reduce="stats"``, in the order of a row's last axis.
STATS = ("count", "mean", "std", "min", "max", "absmax", "l2", "nan_count", "inf_count")


class Histogram:
    """A histogram of a value as the summary a record keeps (``reduce=Histogram(...)``):
    each row holds ``bins + 2`` counts (int32): the values below the first edge (column
    0), one count per bin, the values above the last edge (the last column). The bins
    count what ``numpy.histogram(x, bins=Histogram.edges())`` counts, value for value
    (each comparison with an edge is exact, the float64 edges against the float32 values);
    numpy leaves the values outside the edges uncounted, here they have their columns.
    NaNs are not counted (``reduce="stats"`` counts them).

    Args:
      bins: the number of bins (at least 1; default 64).
      range: ``(lo, hi)``: ``bins`` equal bins from ``lo`` to ``hi`` (the edges are
        ``numpy.linspace(lo, hi, bins + 1)``; a value equal to ``hi`` is in the last bin);
        or ``"log"`` (the default, when ``range`` is not given): the magnitudes ``|x|``
        in bins of one power of two each, from ``2**-(bins // 2)`` to
        ``2**(bins - bins // 2)`` (zeros count as below; the signs are dropped). Pass
        ``range=(lo, hi)`` for bins of the values themselves.

    Raises:
      ValueError: bins or range not as above; a range beyond float32's, or bins too narrow
        for float32 to compute a value's bin (the message says how many bins would do).

    The edges are stored in the array's attributes (``hostfeed.reduce.edges``), and the
    columns' names (``hostfeed.reduce.columns``: ``below``, ``bin0`` ..., ``above``).

    Example:
        >>> h = Histogram(bins=4, range=(0.0, 1.0))
        >>> h.edges().tolist()
        [0.0, 0.25, 0.5, 0.75, 1.0]
        >>> Histogram(bins=4, range="log").edges().tolist()
        [0.25, 0.5, 1.0, 2.0, 4.0]
        >>> Histogram(4).edges().tolist()          # no range: the same "log" bins of |x|
        [0.25, 0.5, 1.0, 2.0, 4.0]
    """

    def __init__(self, bins: int = 64, range: Union[tuple[float, float], str] = "log"):
        if isinstance(bins, bool) or not isinstance(bins, (int, np.integer)) or bins < 1 \
                or bins > 1 << 16:
            raise ValueError(f"hostfeed.Histogram: bins must be an int from 1 to 65536, got "
                             f"{bins!r}")
        self.bins = int(bins)
        if isinstance(range, str):
            if range != "log":
                raise ValueError(f"hostfeed.Histogram: range must be (lo, hi) or 'log', got "
                                 f"{range!r}")
            if self.bins > 2046:  # 2.0 ** (bins - bins // 2) overflows float64
                raise ValueError(f"hostfeed.Histogram: a 'log' histogram has at most 2046 bins "
                                 f"(float32 magnitudes span 278 powers of two), got {bins}")
            self.log = True
            self.lo_exp = -(self.bins // 2)
            self.range: tuple[float, float] = (2.0 ** self.lo_exp,
                                               2.0 ** (self.lo_exp + self.bins))
        else:
            try:
                lo, hi = (float(v) for v in range)
            except (TypeError, ValueError):
                raise ValueError(f"hostfeed.Histogram: range must be (lo, hi) or 'log', got "
                                 f"{range!r}") from None
            _check_linear(self.bins, lo, hi, f"hostfeed.Histogram({self.bins}, {range!r})")
            self.log = False
            self.range = (lo, hi)

    def edges(self) -> np.ndarray:
        """The ``bins + 1`` bin edges (float64)."""
        if self.log:
            return 2.0 ** np.arange(self.lo_exp, self.lo_exp + self.bins + 1, dtype=np.float64)
        return np.linspace(self.range[0], self.range[1], self.bins + 1)

    def thresholds(self) -> np.ndarray:
        """The edges as exact float32 comparisons (``bins + 2`` values): for each edge the
        least float32 at or above it (a float32 ``v`` is below edge ``i`` exactly when
        ``v < t[i]``), then the greatest float32 at or below the last edge (``v`` is above
        it exactly when ``v > t[-1]``). So a value is binned as ``numpy.histogram`` bins it
        against :meth:`edges`.

        Example:
            >>> Histogram(bins=2, range=(0.0, 1.0)).thresholds().tolist()
            [0.0, 0.5, 1.0, 1.0]
            >>> t = Histogram(bins=1, range=(0.0, 0.1)).thresholds()  # 0.1 is no float32
            >>> float(t[1]) > 0.1 > float(t[2])
            True
        """
        edges = self.edges()
        with np.errstate(over="ignore"):
            near = edges.astype(np.float32)
        up = np.where(near.astype(np.float64) < edges,
                      np.nextafter(near, np.float32(np.inf)), near)
        top = near[-1] if float(near[-1]) <= edges[-1] else np.nextafter(
            near[-1], np.float32(-np.inf))
        return np.append(up, top).astype(np.float32)

    def describe(self) -> dict:
        return {"kind": "histogram", "scale": "log2 |x|" if self.log else "linear",
                "bins": self.bins, "edges": self.edges().tolist(),
                "columns": ["below"] + [f"bin{i}" for i in range(self.bins)] + ["above"]}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Histogram) and self.describe() == other.describe()

    def __hash__(self) -> int:
        return hash((self.bins, self.log, self.range))

    def __repr__(self) -> str:
        rng = '"log"' if self.log else repr(self.range)
        return f"hostfeed.Histogram(bins={self.bins}, range={rng})"

    def __call__(self, v: jax.Array, axes: tuple[int, ...]) -> jax.Array:
        """Counts of ``v`` (float32) over ``axes``: the other axes, then ``bins + 2``. Each
        element's bin is computed where it lies (elementwise, no gather) and counted by one
        scatter-add into the small result (under sharding: per device, then summed)."""
        n = self.bins
        # Comparisons on the floats' order as integers (ordered_keys): XLA flushes
        # subnormals to zero in float comparisons, numpy does not.
        t = jnp.asarray(ordered_keys(self.thresholds()))
        if self.log:
            mag = jax.lax.bitcast_convert_type(v, jnp.int32) & 0x7FFFFFFF
            exp = mag >> 23
            # floor(log2 |v|) from the bits, subnormals included.
            log2 = jnp.where(exp == 0, 31 - jax.lax.clz(mag) - 149, exp - 127)
            k = jnp.clip(log2 - self.lo_exp, 0, n - 1)
            key = mag
        else:
            # floor((v - lo) * scale) is off by at most one bin near an edge: corrected
            # by exact comparisons with the two edges of the bin it names.
            key = _keys(v)
            edges = t[:-1]
            q = jnp.floor((v - np.float32(self.range[0]))
                          * np.float32(n / (self.range[1] - self.range[0])))
            k = jnp.clip(jnp.nan_to_num(q, nan=0.0, posinf=n, neginf=0), 0, n - 1)
            k = k.astype(jnp.int32)
            k = jnp.maximum(k - (key < jnp.take(edges, k)).astype(jnp.int32), 0)
            k = k + ((k < n - 1) & (key >= jnp.take(edges, jnp.minimum(k + 1, n)))).astype(
                jnp.int32)
        k = jnp.where(key < t[0], -1, jnp.where(key > t[-1], n, k))
        k = k.astype(jnp.int32) + 1
        kept = [d for d in range(v.ndim) if d not in axes]
        rows = math.prod(v.shape[d] for d in kept)
        # The row of each element: its position along the kept axes.
        row = jnp.zeros((), jnp.int32)
        for d in kept:
            row = row * v.shape[d] + jax.lax.broadcasted_iota(jnp.int32, v.shape, d)
        flat = jnp.where(jnp.isnan(v), rows * (n + 2), row * (n + 2) + k)  # NaN: dropped
        counts = jnp.zeros(rows * (n + 2), jnp.int32).at[flat].add(1, mode="drop")
        return counts.reshape(*(v.shape[d] for d in kept), n + 2)

def ordered_keys(x: np.ndarray) -> np.ndarray:
    """float32 values as int32 keys in the same order (``-0.0`` as ``0.0``; NaNs aside): a
    float comparison that no flush of subnormals to zero changes.

    Example:
        >>> ordered_keys(np.float32([-2.0, -1e-45, -0.0, 0.0, 1e-45, 2.0])).tolist()
        [-1073741825, -2, 0, 0, 1, 1073741824]
    """
    bits = np.asarray(x, np.float32).view(np.int32)
    keys = np.where(bits < 0, bits ^ np.int32(0x7FFFFFFF), bits)
    return np.where(keys == -1, 0, keys).astype(np.int32)


def _keys(v: jax.Array) -> jax.Array:
    """:func:`ordered_keys` of a float32 JAX value."""
    bits = jax.lax.bitcast_convert_type(v, jnp.int32)
    key = jnp.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    return jnp.where(key == -1, 0, key)  # -0.0 is 0.0


def _check_linear(bins: int, lo: float, hi: float, what: str) -> None:
    """Refuses a range whose bins float32 cannot compute. A value's bin is first guessed as
    ``floor((v - lo) * (bins / (hi - lo)))`` in float32, then moved by one bin at most by
    exact comparisons with the edges: the guess must be off by less than a bin. It is off
    by float32's rounding of ``lo`` and by XLA's flush of subnormal numbers to zero."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise ValueError(f"{what}: the range's ends must be finite numbers")
    if not lo < hi:
        raise ValueError(f"{what}: the range must have lo < hi")
    big, tiny = float(np.finfo(np.float32).max), float(np.finfo(np.float32).tiny)
    with np.errstate(over="ignore"):
        wide = max(abs(lo), abs(hi)) > big or not np.isfinite(np.float32(hi) - np.float32(lo))
    if wide:
        raise ValueError(f"{what}: the values are binned in float32, so lo, hi and hi - lo "
                         f"must be within float32's range (at most {big:.7g}): narrow it")
    scale = bins / (hi - lo)
    if scale < tiny:
        raise ValueError(f"{what}: bins / (hi - lo) = {scale:.3g} is below float32's "
                         f"smallest normal number ({tiny:.3g}, which XLA flushes to zero): "
                         f"use more bins or a narrower range")
    error = abs(lo - float(np.float32(lo))) + 2 * tiny
    if error * scale > 0.5:
        fits = math.floor(0.5 * (hi - lo) / error)
        fewer = f"at most {fits} bins over this range, or " if fits >= 1 else ""
        over = " (bins / (hi - lo) overflows float32)" if scale > big else ""
        least = 2.01 * error  # rounded up in the message
        raise ValueError(f"{what}: bins {1 / scale:.3g} wide are too narrow for float32"
                         f"{over}: a bin is computed in float32, exact to {error:.3g} here "
                         f"(lo rounded to float32, numbers below {tiny:.3g} flushed to zero), "
                         f"so a bin must be at least {least:.3g} wide: use {fewer}a range at "
                         f"least {least * bins:.3g} wide")


def _extremes(low: jax.Array, high: jax.Array, axes: tuple[int, ...]) -> tuple[Any, ...]:
    """Min, max and absmax over ``axes`` of the values whose keys (:func:`_keys`) are
    ``low`` and ``high`` (a value left out: the greatest and the least key), as float32
    moved bit for bit (exact for subnormals, which XLA's CPU threads flush to zero in float
    operations); and powers of two ``scale``, ``unscale`` that bring those values to
    magnitudes below 4 and back, exactly: their squares and sums do not overflow float32
    (the core's kernel sums in float64)."""
    lo = jnp.min(low, axis=axes, keepdims=True)
    hi = jnp.max(high, axis=axes, keepdims=True)
    absmax = jnp.maximum(hi, -lo - 1)  # the key of -v is -key(v) - 1 (v != 0)
    e = jnp.clip((absmax >> 23) - 127, -126, 126)  # both powers of two normal numbers

    def f32(k: jax.Array) -> jax.Array:
        return jax.lax.bitcast_convert_type(jnp.where(k < 0, k ^ 0x7FFFFFFF, k), jnp.float32)
    return f32(lo), f32(hi), f32(absmax), f32((127 - e) << 23), f32((127 + e) << 23)


def _stats(v: jax.Array, axes: tuple[int, ...]) -> jax.Array:
    """The :data:`STATS` of ``v`` (float32) over ``axes``: the other axes, then 9.
    Mean, std, min, max, absmax and l2 are over the finite values (NaN when none is).
    Reductions along the axes, no reshape: under sharding each device reduces its slice.

    When every value is finite (the sum is: a NaN, an infinity or an overflow makes it
    not), the sum, min and max give everything but the squared deviations, taken of the
    values scaled by a power of two (:func:`_extremes`); otherwise (decided on the device)
    the statistics are taken again over the finite values only. Over no value (decided
    at trace time), the row is the core's kernel's: count 0, NaN statistics."""
    n = math.prod(v.shape[a] for a in axes)
    if n == 0:
        kept = tuple(v.shape[d] for d in range(v.ndim) if d not in axes)
        row = np.array([0, np.nan, np.nan, np.nan, np.nan, np.nan, 0, 0, 0], np.float32)
        return jnp.broadcast_to(jnp.asarray(row), (*kept, len(STATS)))
    total = jnp.sum(v, axis=axes, keepdims=True)
    lo, hi, absmax, scale, unscale = _extremes(_keys(v), _keys(v), axes)
    mean = total / n
    dev = jnp.sum((v * scale - mean * scale) ** 2, axis=axes, keepdims=True)
    zero = jnp.zeros_like(total)
    fast = [zero + n, mean, jnp.sqrt(dev / n) * unscale, lo, hi, absmax,
            jnp.sqrt(dev + n * (mean * scale) ** 2) * unscale, zero, zero]
    fast_row = jnp.stack([jnp.squeeze(c, axes) for c in fast], axis=-1)
    finite = jnp.all(jnp.isfinite(total))
    return jax.lax.cond(finite, lambda v: fast_row, lambda v: _finite_stats(v, axes), v)


def _finite_stats(v: jax.Array, axes: tuple[int, ...]) -> jax.Array:
    """:func:`_stats` over the finite values, NaNs and infinities counted apart."""
    finite = jnp.isfinite(v)
    info, keys = np.iinfo(np.int32), _keys(v)
    lo, hi, absmax, scale, unscale = _extremes(
        jnp.where(finite, keys, info.max), jnp.where(finite, keys, info.min), axes)
    vs = jnp.where(finite, v * scale, 0.0)
    n = jnp.sum(finite, axis=axes, dtype=jnp.float32, keepdims=True)
    safe = jnp.maximum(n, 1.0)
    mean_s = jnp.sum(vs, axis=axes, keepdims=True) / safe
    var_s = jnp.sum(jnp.where(finite, (vs - mean_s) ** 2, 0.0), axis=axes,
                    keepdims=True) / safe
    none = n == 0
    nan = jnp.float32(jnp.nan)
    l2 = jnp.sqrt(jnp.sum(vs * vs, axis=axes, keepdims=True)) * unscale
    nans = jnp.sum(jnp.isnan(v), axis=axes, dtype=jnp.float32, keepdims=True)
    infs = jnp.sum(jnp.isinf(v), axis=axes, dtype=jnp.float32, keepdims=True)
    count = jnp.full_like(n, math.prod(v.shape[a] for a in axes))
    cols = [count, mean_s * unscale, jnp.sqrt(var_s) * unscale, lo, hi, absmax, l2, nans,
            infs]
    cols = [c if i in (0, 6, 7, 8) else jnp.where(none, nan, c) for i, c in enumerate(cols)]
    return jnp.stack([jnp.squeeze(c, axes) for c in cols], axis=-1)


# A summary over a value's trailing axes (all of them, by default) is one primitive. Where
# the CPU computes it per device (one device; pmap or a shard_map over every mesh axis) it
# lowers to a custom call of the Rust core, which reads the value once (XLA:CPU has no
# single-pass way to take several reductions: four plain ones read it four times, the
# switch to the finite values is a ``cond``, and a histogram is a scatter-add); elsewhere
# (GPU, ``jit`` over values sharded on several devices, where XLA partitions the
# reductions) to the JAX operations of :func:`_stats` or :meth:`Histogram.__call__`, as
# they do where JAX's lowering is asked for (``HOSTFEED_TRANSPORT=jax``: a transport
# without ``NATIVE_KERNELS``).
for _name, _capsule in _receiver.host.summary_registrations().items():
    jax.ffi.register_ffi_target(_name, _capsule, platform="cpu")


def _per_device(ctx: Any) -> bool:
    """Whether a lowering rule runs on one device's own values."""
    ac = ctx.module_context.axis_context
    if isinstance(ac, compat.SPMDAxisContext):
        return frozenset(compat.manual_axes(ac)) == frozenset(ac.mesh.axis_names)
    if isinstance(ac, compat.ShardingContext):
        return ac.num_devices == 1
    return True  # pmap's per-replica context


def _summary_primitive(name: str, columns: Callable[..., int], dtype: Any,
                       of_trailing: Callable[..., jax.Array],
                       constants: Callable[..., list[np.ndarray]]) -> Any:
    """The primitive ``name(v, reduced=k, **params)``: the kept axes, then ``columns``
    values of ``dtype``; lowered on a CPU device to the core's custom call ``name`` (with
    the operands ``constants(**params)`` after the value) where the transport uses native
    kernels, elsewhere to ``of_trailing``."""
    prim = compat.Primitive(name)
    prim.def_impl(lambda v, **params: compat.apply_primitive(prim, v, **params))
    prim.def_abstract_eval(lambda v, *, reduced, **params: jax.core.ShapedArray(
        v.shape[:v.ndim - reduced] + (columns(**params),), np.dtype(dtype)))
    portable = mlir.lower_fun(of_trailing, multiple_results=False)

    def cpu(ctx: Any, v: Any, **params: Any) -> Any:
        if not _per_device(ctx) or not transports.for_context(ctx).NATIVE_KERNELS:
            return portable(ctx, v, **params)
        extra = constants(**{k: p for k, p in params.items() if k != "reduced"})
        ctx = ctx.replace(avals_in=[*ctx.avals_in,
                                    *(jax.core.ShapedArray(c.shape, c.dtype) for c in extra)])
        return jax.ffi.ffi_lowering(name)(ctx, v, *map(mlir.ir_constant, extra))

    mlir.register_lowering(prim, portable)
    mlir.register_lowering(prim, cpu, platform="cpu")

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


def _binning(hist: Histogram) -> list[np.ndarray]:
    """A histogram's binning for the core, as the JAX operations compute it:
    ``[0, lo, 0, scale]`` (float32) or, for powers of two, ``[1, lo_exp, 0, 0]``, then
    the edges' exact comparisons (:meth:`Histogram.thresholds`)."""
    if hist.log:
        params = np.array([1.0, hist.lo_exp, 0.0, 0.0], np.float32)
    else:
        lo, hi = hist.range
        params = np.array([0.0, lo, 0.0, np.float32(hist.bins / (hi - lo))], np.float32)
    return [params, hist.thresholds()]


stats_p = _summary_primitive(
    "hostfeed_stats", lambda: len(STATS), np.float32,
    lambda v, *, reduced: _stats(v, tuple(range(v.ndim - reduced, v.ndim))),
    list)
histogram_p = _summary_primitive(
    "hostfeed_histogram", lambda hist: hist.bins + 2, np.int32,
    lambda v, *, reduced, hist: hist(v, tuple(range(v.ndim - reduced, v.ndim))),
    _binning)


def _trailing(axes: tuple[int, ...], ndim: int) -> bool:
    return axes == tuple(range(ndim - len(axes), ndim))


def _histogram(hist: Histogram) -> Callable[[jax.Array, tuple[int, ...]], jax.Array]:
    """``hist(v, axes)``, through :data:`histogram_p` where ``axes`` are trailing."""
    def count(v: jax.Array, axes: tuple[int, ...]) -> jax.Array:
        if _trailing(axes, v.ndim):
            return histogram_p.bind(v, reduced=len(axes), hist=hist)
        return hist(v, axes)
    return count


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
    if isinstance(reduce, str) and reduce == "stats":
        fn: Callable[[jax.Array, tuple[int, ...]], jax.Array] = _stats
        desc: dict = {"kind": "stats", "columns": list(STATS)}
    elif isinstance(reduce, Histogram):
        fn, desc = reduce, reduce.describe()
    else:
        raise ValueError(f"hostfeed: Recorder.record({name!r}): reduce must be 'stats' or a "
                         f"hostfeed.Histogram(...), got {reduce!r}")
    x = jnp.asarray(value)
    if jnp.issubdtype(x.dtype, jnp.complexfloating):
        raise TypeError(f"hostfeed: Recorder.record({name!r}): reduce= summarizes real "
                        f"values, got {x.dtype}: record jnp.abs(x) or x.real")
    axes = _axes(axis, x.ndim, name)
    size = math.prod(x.shape[d] for d in axes)
    if size >= 1 << 31:
        raise ValueError(f"hostfeed: Recorder.record({name!r}): reduce= over {size} elements "
                         f"a row; at most 2**31 - 1 (reduce over fewer axes)")
    desc["axis"] = list(axes)
    # The reductions read the value as it is in memory: fused into its producer, each would
    # compute it again (a gelu's tanh, once per statistic).
    x = jax.lax.optimization_barrier(x)
    v = x.astype(jnp.float32)
    if isinstance(reduce, Histogram):
        return _per_shard(_histogram(reduce), v, axes), desc
    if _trailing(axes, v.ndim) and not _sharded_in_type(v):
        return stats_p.bind(v, reduced=len(axes)), desc
    return fn(v, axes), desc


def _per_shard(fn: Callable[[jax.Array, tuple[int, ...]], jax.Array], v: jax.Array,
               axes: tuple[int, ...]) -> jax.Array:
    """``fn(v, axes)``, a sum over ``axes``; for a value sharded in its type (explicit
    sharding), computed on each device's slice and summed over the devices (``psum``) in a
    ``shard_map``: JAX refuses a scatter with sharded indices there. Otherwise XLA
    partitions it (auto sharding) the same way."""
    if not _sharded_in_type(v):
        return fn(v, axes)
    sharding = jax.typeof(v).sharding
    spec, mesh = sharding.spec, sharding.mesh
    from jax.sharding import PartitionSpec as P
    spec = tuple(spec) + (None,) * (v.ndim - len(spec))
    names = [n for d in axes for n in ((spec[d],) if isinstance(spec[d], str) else
                                         (spec[d] or ()))]
    kept = [spec[d] for d in range(v.ndim) if d not in axes]

    def local(part: jax.Array) -> jax.Array:
        out = fn(part, axes)
        return jax.lax.psum(out, tuple(names)) if names else out

    return jax.shard_map(local, mesh=mesh, in_specs=P(*spec), out_specs=P(*kept, None))(v)


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
