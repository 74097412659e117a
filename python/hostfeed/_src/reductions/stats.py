"""``reduce="stats"`` and ``reduce=hostfeed.Stats(dtype=...)``: the :data:`STATS` of a value
(and, with a narrower float dtype, how many of its values a cast to it would underflow and
overflow), computed on the device: by the JAX operations, or by the core's one-pass kernel
``hostfeed_stats`` on a CPU device where the transport uses native kernels. And what a
reader needs of a stored row: its columns by name (:func:`as_columns`; older stores hold
fewer) and the quantities ``show`` and the TensorBoard export draw (:func:`derived`)."""
from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Optional

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from .base import Pane, Reduction, keys as _keys

__all__ = ["Stats", "STATS", "CAST_STATS", "COLUMNS", "CASTS", "DERIVED", "as_columns",
           "derived", "stored_columns", "thresholds"]

#: The statistics of ``reduce="stats"`` (``hostfeed.Stats()``), in the order of a row's
#: last axis.
STATS = ("count", "mean", "std", "min", "max", "absmax", "l2", "nan_count", "inf_count",
         "l1", "zeros", "absmin_nonzero")
#: The counts ``hostfeed.Stats(dtype=...)`` adds after :data:`STATS`.
CAST_STATS = ("underflow", "overflow")
#: Every column a statistics row may hold, in the order a reader gets them
#: (:func:`as_columns`).
COLUMNS = STATS + CAST_STATS
#: The columns of the rows hostfeed wrote before ``l1``, ``zeros`` and ``absmin_nonzero``.
_FIRST = STATS[:9]
#: The dtypes ``Stats(dtype=...)`` counts under- and overflows of.
CASTS = ("float8_e4m3fn", "float8_e5m2", "bfloat16", "float16")


def _cast_dtype(dtype: Any) -> Optional[np.dtype]:
    """``dtype`` as one of :data:`CASTS` (``None`` stays ``None``).

    Raises:
      ValueError: anything else, naming what is accepted.
    """
    if dtype is None:
        return None
    try:
        d = _named(dtype) if isinstance(dtype, str) else np.dtype(dtype)
    except TypeError:
        d = None
    if d is None or d.name not in CASTS:
        raise ValueError(f"hostfeed.Stats: dtype must be one of {', '.join(CASTS)} (a float "
                         f"dtype narrower than float32 whose underflows and overflows it "
                         f"counts: jnp.float8_e4m3fn, ...), or None; got {dtype!r}")
    return d


def _named(name: str) -> np.dtype:
    """The dtype named ``name`` (numpy's, or ``ml_dtypes``' such as ``"float8_e4m3fn"``)."""
    return np.dtype(getattr(ml_dtypes, name, name))


@functools.cache
def thresholds(target: str, source: str = "float32") -> tuple[int, int]:
    """Where a cast from ``source`` (float32 or float64) to ``target`` (one of
    :data:`CASTS`) underflows and overflows, as the bits of ``source`` magnitudes (which
    order as the magnitudes do): ``(under, over)``, a non-zero magnitude at most ``under``
    rounds to zero and a finite one from ``over`` on to an infinity or NaN (the bits of
    ``source``'s infinity: none does). Found by bisection over ``ml_dtypes``' own casts
    (round to nearest, ties to even), so the counts are theirs.

    Example:
        >>> [np.uint32(b).view(np.float32) for b in thresholds("float8_e4m3fn")]
        [np.float32(0.0009765625), np.float32(464.00003)]
    """
    src = np.dtype(source)
    uint = np.dtype(f"uint{8 * src.itemsize}")
    dst = _named(target)
    top = int(np.array(np.finfo(src).max, src).view(uint))
    inf = int(np.array(np.inf, src).view(uint))

    def cast(b: int) -> float:
        return float(np.array([b], uint).view(src).astype(dst)[0])

    def bisect(low: int, high: int, below: Any) -> int:
        """The greatest bits in ``[low, high)`` where ``below`` holds (it holds at
        ``low``, not at ``high``)."""
        while high - low > 1:
            mid = (low + high) // 2
            low, high = (mid, high) if below(cast(mid)) else (low, mid)
        return low

    with np.errstate(over="ignore", invalid="ignore"):
        under = bisect(0, top, lambda v: v == 0.0)
        over = inf if math.isfinite(cast(top)) else bisect(0, top, math.isfinite) + 1
    return under, over


class Stats(Reduction):
    """``reduce="stats"``, or ``reduce=hostfeed.Stats(dtype=...)``: a row of :data:`STATS`
    (float32) per kept position: the count of every value; mean, std, min, max, absmax,
    l2 and l1 over the finite values; the counts of NaNs, of infinities and of zeros
    (``-0.0`` too); ``absmin_nonzero``, the least non-zero finite magnitude (the dynamic
    range is ``log2(absmax / absmin_nonzero)``). Where no value is finite, mean to absmax
    are NaN (l2 and l1 0); where none is finite and non-zero, ``absmin_nonzero`` is NaN.

    With ``dtype`` (``jnp.float8_e4m3fn``, ``jnp.float8_e5m2``, ``jnp.bfloat16`` or
    ``jnp.float16``, or its name), two counts follow (:data:`CAST_STATS`):
    ``underflow``, the finite non-zero values that round to zero in ``dtype``, and
    ``overflow``, the finite values whose magnitude, rounded to ``dtype``, is beyond its
    largest finite value (they become an infinity, or NaN in ``float8_e4m3fn``): what
    ``x.astype(dtype)`` does, rounding to nearest even as ``ml_dtypes`` does.
    ``hostfeed.Stats()`` is ``"stats"``.

    Args:
      dtype: the narrower float dtype to count under- and overflows against, or ``None``.

    Raises:
      ValueError: a ``dtype`` other than these four, at the call.

    Example:
        >>> import jax.numpy as jnp
        >>> Stats().describe()["columns"][-3:], Stats().row_shape()
        (['l1', 'zeros', 'absmin_nonzero'], (12,))
        >>> Stats(dtype=jnp.float8_e4m3fn).describe()["columns"][-2:]
        ['underflow', 'overflow']
    """

    kind: ClassVar[str] = "stats"
    suffix: ClassVar[str] = ".stats"
    alias: ClassVar[Optional[str]] = "stats"
    native_kernel: ClassVar[Optional[str]] = "hostfeed_stats"
    plot: ClassVar[str] = "stats"
    #: The values (mean with a band of one standard deviation, min and max), then the
    #: scale: absmax and l2 apart (an l2 grows with the value's size, an absmax does not).
    panes: ClassVar[tuple[Pane, ...]] = (
        Pane("value", ("mean", "min", "max"), dashed=("min", "max"), band=("mean", "std"),
             height=2.0),
        Pane("|x|", ("absmax", "absmin_nonzero"), dashed=("absmin_nonzero",), positive=True),
        Pane("l2", ("l2",), positive=True),
        Pane("%", ("zero_fraction", "underflow_fraction", "overflow_fraction"), height=0.8,
             optional=True),
    )
    #: The count does not change for an array of one shape, and the NaN, infinity,
    #: underflow and overflow counts and fractions are mostly 0: flat lines, unless they
    #: change.
    quiet: ClassVar[Mapping[str, Optional[float]]] = {
        "count": None, "nan_count": 0.0, "inf_count": 0.0, "zeros": 0.0, "underflow": 0.0,
        "overflow": 0.0, "zero_fraction": 0.0, "underflow_fraction": 0.0,
        "overflow_fraction": 0.0}

    def __init__(self, dtype: Any = None):
        self.cast = _cast_dtype(dtype)

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(np.float32)

    @property
    def columns(self) -> tuple[str, ...]:
        """The names of a row's values: :data:`STATS`, then with a ``dtype``
        :data:`CAST_STATS`."""
        return STATS + (CAST_STATS if self.cast is not None else ())

    def row_shape(self) -> tuple[int, ...]:
        return (len(self.columns),)

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": "stats", "columns": list(self.columns)}
        if self.cast is not None:
            out["dtype"] = self.cast.name
        return out

    def value_dtype(self, dtype: np.dtype) -> np.dtype:
        # float64 (with x64) is summarized as it is, as numpy does; the rest as float32.
        return np.dtype(np.float64 if dtype == np.float64 else np.float32)

    def kernel_operands(self) -> list[np.ndarray]:
        if self.cast is None:
            return []
        return [np.array(thresholds(self.cast.name), np.int32)]

    def compute(self, v: jax.Array, axes: tuple[int, ...]) -> jax.Array:
        cast = None if self.cast is None else thresholds(self.cast.name, v.dtype.name)
        return _stats(v, axes, cast)

    @classmethod
    def plot_title(cls, attrs: dict[str, Any]) -> str:
        dtype = attrs.get("dtype")
        return f"stats vs {dtype}" if dtype else "stats"

    @classmethod
    def nonfinite_columns(cls, attrs: dict[str, Any]) -> list[int]:
        # By name: the columns stay whichever others a row has.
        names = list(attrs.get("columns") or ())
        return [names.index(c) for c in ("nan_count", "inf_count") if c in names]

    def __repr__(self) -> str:
        return '"stats"' if self.cast is None else f"hostfeed.Stats(dtype={self.cast.name})"


def stored_columns(attrs: dict[str, Any]) -> list[str]:
    """The columns of a statistics array's rows, by its ``hostfeed.reduce`` attributes
    (what an older hostfeed wrote included).

    Example:
        >>> stored_columns({"kind": "stats", "columns": list(STATS[:9])})[-1]
        'inf_count'
    """
    return [str(c) for c in attrs.get("columns", _FIRST)]


def as_columns(rows: np.ndarray, attrs: dict[str, Any]) -> np.ndarray:
    """Stored statistics rows (``[..., k]``, their columns :func:`stored_columns`) with
    their last axis as :data:`COLUMNS` (float32): a column the array does not hold (the
    rows of an older hostfeed, or ``"stats"`` without a cast's counts) is NaN.

    Example:
        >>> row = np.arange(9, dtype=np.float32)[None]
        >>> as_columns(row, {"columns": list(STATS[:9])})[0, 8:].tolist()
        [8.0, nan, nan, nan, nan, nan]
    """
    rows = np.asarray(rows, np.float32)
    names = stored_columns(attrs)
    if rows.shape[-1] != len(names):
        raise ValueError(f"hostfeed: statistics rows of {rows.shape[-1]} values, but their "
                         f"attributes name {len(names)} columns ({names})")
    out = np.full(rows.shape[:-1] + (len(COLUMNS),), np.nan, np.float32)
    for j, name in enumerate(names):
        if name in COLUMNS:
            out[..., COLUMNS.index(name)] = rows[..., j]
    return out


#: What :func:`derived` gives, and the columns each needs.
DERIVED = {"dynamic_range_bits": ("absmax", "absmin_nonzero"), "zero_fraction": ("zeros",),
           "underflow_fraction": ("underflow",), "overflow_fraction": ("overflow",)}


def derived(rows: np.ndarray, held: Sequence[str] = COLUMNS) -> dict[str, np.ndarray]:
    """What ``show`` and the TensorBoard export draw of statistics rows
    (``[n, len(COLUMNS)]``, :func:`as_columns`' order; float64), of those that the
    columns ``held`` give (:data:`DERIVED`): ``dynamic_range_bits``,
    ``log2(absmax / absmin_nonzero)``; ``zero_fraction``, ``underflow_fraction`` and
    ``overflow_fraction``, of the count. NaN in a row that lacks what one needs (no
    non-zero finite value, no value).

    Example:
        >>> row = np.full((1, len(COLUMNS)), np.nan)
        >>> row[0, [0, 5, 10, 11, 12]] = [8, 4.0, 2, 0.25, 1]
        >>> {k: float(v[0]) for k, v in derived(row, STATS + ("underflow",)).items()}
        {'dynamic_range_bits': 4.0, 'zero_fraction': 0.25, 'underflow_fraction': 0.125}
    """
    c = {name: np.asarray(rows, np.float64)[:, j] for j, name in enumerate(COLUMNS)}
    count = np.where(c["count"] > 0, c["count"], np.nan)
    out = {}
    with np.errstate(divide="ignore", invalid="ignore"):
        for name, needs in DERIVED.items():
            if all(n in held for n in needs):
                out[name] = (np.log2(c["absmax"] / c["absmin_nonzero"]) if len(needs) == 2
                             else c[needs[0]] / count)
    return out


class _Format:
    """A float dtype's bits: the integer type of its width, the mantissa's bits, the
    exponent's bias, the largest integer (the magnitude's mask) and an infinity's bits."""

    def __init__(self, dtype: Any):
        f = np.finfo(dtype)
        self.float = np.dtype(dtype)
        self.int = np.dtype(f"int{8 * self.float.itemsize}")
        self.mant, self.bias = f.nmant, f.maxexp - 1
        self.mask = int(np.iinfo(self.int).max)
        self.inf = (2 * self.bias + 1) << self.mant


def _extremes(low: jax.Array, high: jax.Array, axes: tuple[int, ...], fmt: _Format
              ) -> tuple[Any, ...]:
    """Min, max and absmax over ``axes`` of the values whose keys (:func:`_keys`) are
    ``low`` and ``high`` (a value left out: the greatest and the least key), moved bit
    for bit (exact for subnormals, which XLA's CPU threads flush to zero in float
    operations); and powers of two ``scale``, ``unscale`` that bring those values to
    magnitudes below 4 and back, exactly: their squares and sums do not overflow (the
    core's kernel sums in float64)."""
    lo = jnp.min(low, axis=axes, keepdims=True)
    hi = jnp.max(high, axis=axes, keepdims=True)
    absmax = jnp.maximum(hi, -lo - 1)  # the key of -v is -key(v) - 1 (v != 0)
    # both powers of two normal numbers
    e = jnp.clip((absmax >> fmt.mant) - fmt.bias, 1 - fmt.bias, fmt.bias - 1)

    def fl(k: jax.Array) -> jax.Array:
        return jax.lax.bitcast_convert_type(jnp.where(k < 0, k ^ fmt.mask, k), fmt.float)
    return (fl(lo), fl(hi), fl(absmax), fl((fmt.bias - e) << fmt.mant),
            fl((fmt.bias + e) << fmt.mant))


def _count(m: jax.Array, axes: tuple[int, ...]) -> jax.Array:
    """How many of ``m`` hold over ``axes`` (exact: in int32, a row is under 2**31)."""
    return jnp.sum(m, axis=axes, dtype=jnp.int32, keepdims=True)


def _stats(v: jax.Array, axes: tuple[int, ...], cast: Optional[tuple[int, int]]
           ) -> jax.Array:
    """The statistics of ``v`` (float32 or float64) over ``axes``: the other axes, then
    :data:`STATS` (and with ``cast``, the :func:`thresholds` of a cast of ``v``'s dtype,
    :data:`CAST_STATS`), float32. Reductions along the axes, no reshape: under sharding
    each device reduces its slice.

    When every value is finite (the sum is: a NaN, an infinity or an overflow makes it
    not), the sum, min and max give everything but the squared deviations, taken of the
    values scaled by a power of two (:func:`_extremes`); otherwise (decided on the device)
    the statistics are taken again over the finite values only. Zeros, the least non-zero
    magnitude and the cast's counts compare the magnitudes' bits as integers (no flush of
    subnormals changes them). Over no value (decided at trace time), the row is the core's
    kernel's: count 0, NaN statistics."""
    n = math.prod(v.shape[a] for a in axes)
    width = len(STATS) + (len(CAST_STATS) if cast is not None else 0)
    if n == 0:
        kept = tuple(v.shape[d] for d in range(v.ndim) if d not in axes)
        empty = np.zeros(width, np.float32)
        empty[[1, 2, 3, 4, 5, 11]] = np.nan
        return jnp.broadcast_to(jnp.asarray(empty), (*kept, width))
    fmt = _Format(v.dtype)
    mag = jax.lax.bitcast_convert_type(v, fmt.int) & fmt.mask
    finite = mag < fmt.inf
    least = jnp.min(jnp.where(finite & (mag > 0), mag, fmt.mask), axis=axes, keepdims=True)
    tail = [_count(mag == 0, axes),
            jnp.where(least == fmt.mask, jnp.nan,
                      jax.lax.bitcast_convert_type(least, fmt.float))]
    if cast is not None:
        under, over = cast
        tail += [_count((mag > 0) & (mag <= under), axes),
                 _count((mag >= over) & finite, axes)]
    total = jnp.sum(v, axis=axes, keepdims=True)
    lo, hi, absmax, scale, unscale = _extremes(_keys(v), _keys(v), axes, fmt)
    mean = total / n
    dev = jnp.sum((v * scale - mean * scale) ** 2, axis=axes, keepdims=True)
    zero = jnp.zeros_like(total)
    fast = [zero + n, mean, jnp.sqrt(dev / n) * unscale, lo, hi, absmax,
            jnp.sqrt(dev + n * (mean * scale) ** 2) * unscale, zero, zero,
            jnp.sum(jnp.abs(v), axis=axes, keepdims=True)]

    def row(cols: list[jax.Array]) -> jax.Array:
        return jnp.stack([jnp.squeeze(c, axes).astype(jnp.float32) for c in cols + tail],
                         axis=-1)
    return _choose(jnp.all(jnp.isfinite(total)), lambda v: row(fast),
                   lambda v: row(_finite_stats(v, axes, fmt)), v)


def _choose(finite: jax.Array, fast: Any, careful: Any, v: jax.Array) -> jax.Array:
    """``fast(v)`` where every value is finite, else ``careful(v)``, decided on the device
    (apart, so that a diagnosis can take the careful way alone)."""
    return jax.lax.cond(finite, fast, careful, v)


def _finite_stats(v: jax.Array, axes: tuple[int, ...], fmt: _Format) -> list[jax.Array]:
    """:func:`_stats`' columns up to l1 over the finite values, NaNs and infinities
    counted apart."""
    finite = jnp.isfinite(v)
    info, keys = np.iinfo(fmt.int), _keys(v)
    lo, hi, absmax, scale, unscale = _extremes(
        jnp.where(finite, keys, info.max), jnp.where(finite, keys, info.min), axes, fmt)
    vs = jnp.where(finite, v * scale, 0.0)
    n = _count(finite, axes)
    safe = jnp.maximum(n, 1).astype(v.dtype)
    mean_s = jnp.sum(vs, axis=axes, keepdims=True) / safe
    var_s = jnp.sum(jnp.where(finite, (vs - mean_s) ** 2, 0.0), axis=axes,
                    keepdims=True) / safe
    none = n == 0
    nan = jnp.asarray(jnp.nan, v.dtype)
    l2 = jnp.sqrt(jnp.sum(vs * vs, axis=axes, keepdims=True)) * unscale
    l1 = jnp.sum(jnp.where(finite, jnp.abs(v), 0.0), axis=axes, keepdims=True)
    nans = _count(jnp.isnan(v), axes)
    infs = _count(jnp.isinf(v), axes)
    count = jnp.full(n.shape, math.prod(v.shape[a] for a in axes), v.dtype)
    cols = [mean_s * unscale, jnp.sqrt(var_s) * unscale, lo, hi, absmax]
    return [count] + [jnp.where(none, nan, c) for c in cols] + [l2, nans, infs, l1]
