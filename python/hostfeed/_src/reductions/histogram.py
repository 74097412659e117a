"""``reduce=hostfeed.Histogram(...)``: counts of a value's elements in bins, computed on
the device (the JAX operations, or the core's one-pass kernel ``hostfeed_histogram`` on a
CPU device where the transport uses native kernels)."""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Optional, Union

import jax
import jax.numpy as jnp
import numpy as np

from .base import Board, Reduction, keys as _keys, ordered_keys, per_shard_sum

__all__ = ["Histogram", "histogram_buckets"]


class Histogram(Reduction):
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

    kind: ClassVar[str] = "histogram"
    suffix: ClassVar[str] = ".hist"
    native_kernel: ClassVar[Optional[str]] = "hostfeed_histogram"
    plot: ClassVar[str] = "heatmap"

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

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(np.int32)

    def row_shape(self) -> tuple[int, ...]:
        return (self.bins + 2,)

    def describe(self) -> dict[str, Any]:
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
        """:meth:`compute` (kept for callers of the earlier spelling)."""
        return self.compute(v, axes)

    def kernel_operands(self) -> list[np.ndarray]:
        """A histogram's binning for the core, as the JAX operations compute it:
        ``[0, lo, 0, scale]`` (float32) or, for powers of two, ``[1, lo_exp, 0, 0]``, then
        the edges' exact comparisons (:meth:`Histogram.thresholds`)."""
        if self.log:
            params = np.array([1.0, self.lo_exp, 0.0, 0.0], np.float32)
        else:
            lo, hi = self.range
            params = np.array([0.0, lo, 0.0, np.float32(self.bins / (hi - lo))], np.float32)
        return [params, self.thresholds()]

    def sharded(self, v: jax.Array, axes: tuple[int, ...],
                fn: Callable[[jax.Array, tuple[int, ...]], jax.Array]) -> jax.Array:
        """Each device's slice counted (``fn``: the kernel where it applies), the counts
        summed over the devices: JAX refuses a scatter with sharded indices."""
        return per_shard_sum(fn, v, axes)

    @classmethod
    def plot_rows(cls, rows: np.ndarray, attrs: dict[str, Any]) -> np.ndarray:
        """The counts of each row, summed over the kept positions."""
        n = rows.shape[0]
        return np.asarray(rows).reshape(n, -1, rows.shape[-1]).sum(1).astype(np.float64)

    @classmethod
    def heatmap_edges(cls, attrs: dict[str, Any]) -> Optional[tuple[list[float], bool]]:
        """The bin edges (stored as ``hostfeed.reduce.edges``), of ``|x|`` on a log scale
        for a ``"log"`` histogram."""
        edges = attrs.get("edges")
        return (list(edges), "log" in str(attrs.get("scale", ""))) if edges else None

    @classmethod
    def board(cls, rows: np.ndarray, attrs: dict[str, Any]) -> Board:
        """A TensorBoard histogram per row with hostfeed's bin edges
        (:func:`histogram_buckets`; kept axes summed)."""
        counts = cls.plot_rows(rows, attrs)
        edges, log = cls.heatmap_edges(attrs) or ([], False)
        return Board(histograms=[(*histogram_buckets(c, edges, log), 0.0, 0.0)
                                 for c in counts])

    def compute(self, v: jax.Array, axes: tuple[int, ...]) -> jax.Array:
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


def histogram_buckets(counts: np.ndarray, edges: Sequence[float], log: bool
                      ) -> tuple[float, float, list[float], list[float]]:
    """A ``reduce=Histogram(...)`` row as TensorBoard's buckets: ``(min, max,
    bucket_limit, bucket)``. The bins keep hostfeed's edges; the values below the first
    edge are a bucket that ends there and starts one bin's width lower (at 0 for a
    ``"log"`` histogram of ``|x|``), those above the last edge one that starts there and
    ends one bin's width higher (at twice the edge for ``"log"``). TensorBoard's bucket
    ``i`` runs from ``bucket_limit[i - 1]`` to ``bucket_limit[i]``, and its dashboard draws
    the buckets from the first to the last that is not empty, the first starting at
    ``min`` and the last ending at ``max``: they are those buckets' outer edges.

    Example:
        >>> histogram_buckets(np.array([1, 2, 3, 4]), [0.0, 1.0, 2.0], log=False)
        (-1.0, 3.0, [0.0, 1.0, 2.0, 3.0], [1.0, 2.0, 3.0, 4.0])
        >>> histogram_buckets(np.array([0, 2, 0, 0]), [0.0, 1.0, 2.0], log=False)[:2]
        (0.0, 1.0)
    """
    e = [float(x) for x in edges]
    if log:
        lo, hi = 0.0, 2 * e[-1]
    else:
        lo, hi = e[0] - (e[1] - e[0]), e[-1] + (e[-1] - e[-2])
    limits = e + [hi]
    lefts = [lo] + e
    full = np.nonzero(np.asarray(counts))[0]
    first, last = (int(full[0]), int(full[-1])) if full.size else (0, len(limits) - 1)
    return lefts[first], limits[last], limits, [float(c) for c in counts]
