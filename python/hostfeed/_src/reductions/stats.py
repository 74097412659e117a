"""``reduce="stats"``: the :data:`STATS` of a value, computed on the device (the JAX
operations, or the core's one-pass kernel ``hostfeed_stats`` on a CPU device where the
transport uses native kernels)."""
from __future__ import annotations

import math
from typing import Any, ClassVar, Optional

import jax
import jax.numpy as jnp
import numpy as np

from .base import Reduction, keys as _keys

__all__ = ["Stats", "STATS"]

#: The statistics of ``reduce="stats"``, in the order of a row's last axis.
STATS = ("count", "mean", "std", "min", "max", "absmax", "l2", "nan_count", "inf_count")


class Stats(Reduction):
    """``reduce="stats"``: a row of :data:`STATS` (float32) per kept position: the count of
    every value; mean, std, min, max, absmax and l2 over the finite values (NaN where none
    is); the counts of NaNs and of infinities.

    Example:
        >>> Stats().describe()["columns"][:3], Stats().row_shape()
        (['count', 'mean', 'std'], (9,))
    """

    kind: ClassVar[str] = "stats"
    suffix: ClassVar[str] = ".stats"
    alias: ClassVar[Optional[str]] = "stats"
    native_kernel: ClassVar[Optional[str]] = "hostfeed_stats"
    plot: ClassVar[str] = "stats"

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(np.float32)

    def row_shape(self) -> tuple[int, ...]:
        return (len(STATS),)

    def describe(self) -> dict[str, Any]:
        return {"kind": "stats", "columns": list(STATS)}

    def compute(self, v: jax.Array, axes: tuple[int, ...]) -> jax.Array:
        return _stats(v, axes)

    @classmethod
    def nonfinite_columns(cls, attrs: dict[str, Any]) -> list[int]:
        # By name: the columns stay whichever others a row has.
        names = list(attrs.get("columns") or ())
        return [names.index(c) for c in ("nan_count", "inf_count") if c in names]

    def __repr__(self) -> str:
        return '"stats"'


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

