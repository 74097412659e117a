"""``reduce="stats"`` and ``reduce=hostfeed.Stats(dtype=...)``: the :data:`STATS` of a value
(and, with a narrower float dtype, how many of its values a cast to it would underflow and
overflow), computed on the device: by the JAX operations, or by the core's one-pass kernel
``hostfeed_stats`` on a CPU device where the transport uses native kernels. And the read
side of statistics: a stored row's columns by name (:func:`as_columns`; older stores hold
fewer), rows with kept axes combined (:func:`combine_stats`), the quantities ``show`` and
the TensorBoard export draw (:func:`derived`), and raw rows read back as the statistics
computed on the host (:class:`Raw`, :func:`host_stats`)."""
from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Optional

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from .base import Board, Histo, Pane, Readback, Reduction, keys as _keys

__all__ = ["Stats", "Raw", "STATS", "CAST_STATS", "COLUMNS", "COLUMN", "CASTS", "DERIVED",
           "as_columns", "combine_stats", "derived", "host_stats", "raw_histogram",
           "stored_columns", "thresholds"]

#: The statistics of ``reduce="stats"`` (``hostfeed.Stats()``), in the order of a row's
#: last axis.
STATS = ("count", "mean", "std", "min", "max", "absmax", "l2", "nan_count", "inf_count",
         "l1", "zeros", "absmin_nonzero")
#: The counts ``hostfeed.Stats(dtype=...)`` adds after :data:`STATS`.
CAST_STATS = ("underflow", "overflow")
#: Every column a statistics row may hold, in the order a reader gets them
#: (:func:`as_columns`).
COLUMNS = STATS + CAST_STATS
#: Each statistic's position in a row of statistics as read (:data:`COLUMNS`).
COLUMN = {c: i for i, c in enumerate(COLUMNS)}
#: How many buckets a raw row's histogram has (TensorBoard's own default).
RAW_BUCKETS = 30
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

    # The read side: rows of statistics, their kept axes combined, as COLUMNS orders them.

    @classmethod
    def plot_rows(cls, rows: np.ndarray, attrs: dict[str, Any]) -> np.ndarray:
        """One row of statistics per recorded row (as :data:`COLUMNS` orders them; NaN
        where the array holds none), its kept axes combined (:func:`combine_stats`)."""
        return combine_stats(as_columns(rows, attrs))

    @classmethod
    def held(cls, attrs: dict[str, Any]) -> list[str]:
        """The statistics the array's rows hold (of :data:`COLUMNS`)."""
        return [c for c in stored_columns(attrs) if c in COLUMN]

    @classmethod
    def named(cls, values: np.ndarray) -> dict[str, np.ndarray]:
        """Each column of :meth:`plot_rows`' ``values`` by name, and what they give
        (:func:`derived`; fractions in percent)."""
        out = {c: values[:, j] for c, j in COLUMN.items()}
        for k, v in derived(values).items():
            out[k] = 100 * v if k.endswith("_fraction") else v
        return out

    @classmethod
    def nonfinite_rows(cls, values: np.ndarray, attrs: dict[str, Any]) -> Optional[np.ndarray]:
        return np.asarray(values[:, COLUMN["nan_count"]] + values[:, COLUMN["inf_count"]] > 0)

    @classmethod
    def board(cls, rows: np.ndarray, attrs: dict[str, Any]) -> Board:
        """A scalar per statistic the rows hold (``NAME/count``, ``NAME/mean``, ...) and
        per quantity they give (``NAME/dynamic_range_bits``, the fractions), kept axes
        combined."""
        return _board(cls.plot_rows(rows, attrs), cls.held(attrs))


class Raw(Readback):
    """How raw rows (no reduction) read back: as the :data:`STATS` of each row, computed
    on the host (:func:`host_stats`), drawn as ``reduce="stats"`` is; a row of one value
    (a loss) as that value. The TensorBoard export writes those statistics and each row's
    histogram (:func:`raw_histogram`), or the value itself."""

    kind: ClassVar[str] = "raw"
    plot: ClassVar[str] = "stats"
    panes: ClassVar[tuple[Pane, ...]] = Stats.panes
    quiet: ClassVar[Mapping[str, Optional[float]]] = Stats.quiet

    @classmethod
    def plot_rows(cls, rows: np.ndarray, attrs: dict[str, Any]) -> np.ndarray:
        return host_stats(rows)

    @classmethod
    def plot_title(cls, attrs: dict[str, Any]) -> str:
        return "raw, per row"

    @classmethod
    def named(cls, values: np.ndarray) -> dict[str, np.ndarray]:
        return Stats.named(values)

    @classmethod
    def scalar(cls, values: np.ndarray) -> bool:
        return bool((values[:, COLUMN["count"]] == 1).all())

    @classmethod
    def nonfinite_rows(cls, values: np.ndarray, attrs: dict[str, Any]) -> Optional[np.ndarray]:
        return Stats.nonfinite_rows(values, attrs)

    @classmethod
    def board(cls, rows: np.ndarray, attrs: dict[str, Any]) -> Board:
        n = rows.shape[0]
        if n and rows[0].size == 1:  # a raw scalar: itself, no summary
            return Board(value=np.asarray(rows, np.float64).reshape(n))
        histograms: list[Optional[Histo]] = []
        for i in range(n):
            e, k = raw_histogram(rows[i])
            if not k.size:
                histograms.append(None)
                continue
            v = np.asarray(rows[i], np.float64).ravel()
            v = v[np.isfinite(v)]
            histograms.append((float(e[0]), float(e[-1]), [float(x) for x in e[1:]],
                               [float(x) for x in k], float(v.sum()), float((v * v).sum())))
        board = _board(cls.plot_rows(rows, attrs), list(STATS)) if n else Board()
        return Board(board.scalars, histograms)


def _board(stats: np.ndarray, held: Sequence[str]) -> Board:
    """The TensorBoard scalars of statistics rows (:data:`COLUMNS`' order): the columns
    ``held`` (an older store's rows hold fewer), then what they give (:func:`derived`)."""
    scalars = {c: stats[:, COLUMN[c]] for c in held}
    scalars.update(derived(stats, held))
    return Board(scalars=scalars)


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


def host_stats(rows: np.ndarray) -> np.ndarray:
    """The statistics of each row of ``rows`` (``[n, ...]``, as :data:`COLUMN` orders
    them), computed as ``reduce="stats"`` computes :data:`STATS`: count of every value,
    mean to l2 and l1 over the finite values (float64, then float32; NaN where no value is
    finite), NaN, infinity and zero counts, the least non-zero finite magnitude; no cast's
    counts (NaN).

    Example:
        >>> host_stats(np.array([[3.0, -4.0, np.nan, 0.0]]))[0, :12].tolist()
        [4.0, -0.3333333432674408, 2.8674416542053223, -4.0, 3.0, 4.0, 5.0, 1.0, 0.0, 7.0, 1.0, 3.0]
    """
    n = rows.shape[0]
    v = np.asarray(rows).reshape(n, -1)
    if v.dtype.kind == "c":
        v = np.abs(v)
    v = v.astype(np.float64)
    finite = np.isfinite(v)
    k = finite.sum(1)
    z = np.where(finite, v, 0.0)
    safe = np.maximum(k, 1)
    mean = z.sum(1) / safe
    var = np.where(finite, (z - mean[:, None]) ** 2, 0.0).sum(1) / safe
    with np.errstate(invalid="ignore"):
        lo = np.where(finite, v, np.inf).min(1, initial=np.inf)
        hi = np.where(finite, v, -np.inf).max(1, initial=-np.inf)
    out = np.full((n, len(COLUMNS)), np.nan)
    out[:, COLUMN["count"]] = v.shape[1]
    out[:, COLUMN["mean"]] = mean
    out[:, COLUMN["std"]] = np.sqrt(var)
    out[:, COLUMN["min"]] = lo
    out[:, COLUMN["max"]] = hi
    out[:, COLUMN["absmax"]] = np.maximum(np.abs(lo), np.abs(hi))
    out[:, COLUMN["l2"]] = np.sqrt((z * z).sum(1))
    out[:, COLUMN["nan_count"]] = np.isnan(v).sum(1)
    out[:, COLUMN["inf_count"]] = np.isinf(v).sum(1)
    out[:, COLUMN["l1"]] = np.abs(z).sum(1)
    out[:, COLUMN["zeros"]] = (v == 0).sum(1)
    with np.errstate(invalid="ignore"):
        least = np.where(finite & (v != 0), np.abs(v), np.inf).min(1, initial=np.inf)
    out[:, COLUMN["absmin_nonzero"]] = np.where(np.isinf(least), np.nan, least)
    none = k == 0
    for c in ("mean", "std", "min", "max", "absmax"):
        out[none, COLUMN[c]] = np.nan
    return out.astype(np.float32)


def combine_stats(v: np.ndarray) -> np.ndarray:
    """Rows of statistics with kept axes (``[n, ..., len(COLUMN)]``, ``reduce="stats"``
    with ``axis=``, as :data:`COLUMN` orders them) as one row of statistics each: counts
    (and l1) summed, the means and spreads pooled by their finite counts, min, max, absmax
    and the least non-zero magnitude over the parts, l2 as the norm of the parts' l2 (a
    column the array does not hold stays NaN). Rows without kept axes come back as they
    are.

    Example:
        >>> parts = np.stack([host_stats(np.array([[1.0, 3.0]])),
        ...                   host_stats(np.array([[5.0, 7.0]]))], axis=1)
        >>> whole = host_stats(np.array([[1.0, 3, 5, 7]]))
        >>> np.array_equal(combine_stats(parts), whole, equal_nan=True)
        True
    """
    n = v.shape[0]
    if v.ndim == 2:
        return v
    p = v.reshape(n, -1, len(COLUMNS)).astype(np.float64)
    c = {name: p[..., i] for name, i in COLUMN.items()}
    k = c["count"] - c["nan_count"] - c["inf_count"]  # the finite values of each part
    k = np.where(np.isnan(c["mean"]), 0.0, k)
    total = k.sum(1)
    safe = np.maximum(total, 1)
    mean_p = np.where(k > 0, c["mean"], 0.0)
    mean = (k * mean_p).sum(1) / safe
    var = (k * (np.where(k > 0, c["std"], 0.0) ** 2 + (mean_p - mean[:, None]) ** 2)).sum(1) / safe
    out = np.empty((n, len(COLUMNS)), np.float64)
    out[:, COLUMN["count"]] = c["count"].sum(1)
    out[:, COLUMN["mean"]] = mean
    out[:, COLUMN["std"]] = np.sqrt(var)
    with np.errstate(invalid="ignore"):
        out[:, COLUMN["min"]] = np.nanmin(np.where(k > 0, c["min"], np.inf), 1)
        out[:, COLUMN["max"]] = np.nanmax(np.where(k > 0, c["max"], -np.inf), 1)
        out[:, COLUMN["absmax"]] = np.nanmax(np.where(k > 0, c["absmax"], -np.inf), 1)
    out[:, COLUMN["l2"]] = np.sqrt((c["l2"] ** 2).sum(1))
    out[:, COLUMN["nan_count"]] = c["nan_count"].sum(1)
    out[:, COLUMN["inf_count"]] = c["inf_count"].sum(1)
    for name in ("l1", "zeros", "underflow", "overflow"):  # NaN: not held
        out[:, COLUMN[name]] = c[name].sum(1)
    least = np.where(np.isnan(c["absmin_nonzero"]), np.inf, c["absmin_nonzero"]).min(1)
    out[:, COLUMN["absmin_nonzero"]] = np.where(np.isinf(least), np.nan, least)
    for name in ("mean", "std", "min", "max", "absmax"):
        out[total == 0, COLUMN[name]] = np.nan
    return out.astype(np.float32)


def raw_histogram(row: Any) -> tuple[np.ndarray, np.ndarray]:
    """The histogram of one raw row's finite values as TensorBoard draws a tensor's:
    :data:`RAW_BUCKETS` equal buckets from its minimum to its maximum (one bucket from
    ``v - 0.5`` to ``v + 0.5`` when every value is ``v``; none when no value is finite).
    Returns ``(edges, counts)``, ``len(edges) == len(counts) + 1``.

    Example:
        >>> edges, counts = raw_histogram(np.array([0.0, 1.0, 1.0, np.nan]))
        >>> len(edges), counts.tolist()[0], counts.tolist()[-1], int(counts.sum())
        (31, 1, 2, 3)
    """
    v = np.asarray(row)
    if v.dtype.kind == "c":
        v = np.abs(v)
    v = v.astype(np.float64).ravel()
    v = v[np.isfinite(v)]
    if v.size == 0:
        return np.zeros(1), np.zeros(0, np.int64)
    lo, hi = float(np.min(v)), float(np.max(v))
    if lo == hi:
        return np.array([lo - 0.5, hi + 0.5]), np.array([v.size], np.int64)
    edges = np.linspace(lo, hi, RAW_BUCKETS + 1)
    counts, _ = np.histogram(v, bins=edges)
    return edges, counts.astype(np.int64)
