"""``reduce=hostfeed.TopK(k)``: the ``k`` largest values over the reduced axes for each
kept position, and where they were (the "max-activating examples" of each neuron)."""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from .base import Reduction, keys, reduced_names

__all__ = ["TopK"]

#: The most values a row may reduce: the indices are stored as float32, exact to 2**24.
MOST = 1 << 24


class TopK(Reduction):
    """The ``k`` largest values over the reduced axes (``axis=``, all by default) for each
    kept position, and their indices, as the summary a record keeps
    (``reduce=hostfeed.TopK(k)``). ``axis=(0, 1)`` of a ``[batch, seq, d]`` activation
    keeps ``d``: for each of the ``d`` neurons, the ``k`` largest activations over the
    batch and the sequence and where they were.

    - Order: largest first; equal values by lowest index first: the answer of
      ``numpy.argsort(-x, kind="stable")[:k]`` over the reduced axes flattened.
    - Indices: one flat index per value into the reduced axes in row-major order (the
      axes in increasing order): ``numpy.unravel_index(i, [x.shape[a] for a in axis])``
      gives one index per reduced axis.
    - NaN ranks below every number (``-inf`` included), as in ``numpy.argsort(-x)``: a NaN
      is among the ``k`` only where fewer than ``k`` values are not NaN. ``-0.0`` equals
      ``0.0`` (the lower index first); subnormals are compared exactly.
    - Values are compared and stored as float32 (as every summary reads them).

    A row (float32) holds, per kept position, ``[2, k]``: row ``0`` the values, row ``1``
    the indices (exact integers: a row reduces at most ``2**24`` values).
    :meth:`split` reads them back as values and int64 indices; ``python -m hostfeed show``
    draws the ``k`` values per step (the largest over the kept positions of each rank).

    Args:
      k: how many values (at least 1, at most the number of values a row reduces: more is
        refused when the record is traced).

    Example:
        >>> import numpy as np
        >>> rows = np.float32([[[3.0, 2.0], [4.0, 0.0]]])   # one recorded row, k = 2
        >>> values, indices = TopK.split(rows)
        >>> values.tolist(), indices.tolist()
        ([[3.0, 2.0]], [[4, 0]])
    """

    kind: ClassVar[str] = "topk"
    suffix: ClassVar[str] = ".topk"
    plot: ClassVar[str] = "lines"

    def __init__(self, k: int):
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise ValueError(f"hostfeed.TopK: k must be an int of at least 1, got {k!r}")
        self.k = int(k)

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(np.float32)

    def row_shape(self) -> tuple[int, ...]:
        return (2, self.k)

    def describe(self) -> dict[str, Any]:
        return {"kind": "topk", "k": self.k, "columns": ["value", "index"],
                "index": "flat, row-major over the reduced axes"}

    def __repr__(self) -> str:
        return f"hostfeed.TopK({self.k})"

    def check(self, shape: tuple[int, ...], axes: tuple[int, ...], name: str) -> None:
        n = math.prod(shape[d] for d in axes)
        if self.k > n:
            raise ValueError(f"hostfeed: Recorder.record({name!r}): TopK({self.k}) of "
                             f"{n} values (the reduced axes {list(axes)} of shape "
                             f"{list(shape)}): k must be at most the number of values a "
                             f"row reduces; pass a smaller k or reduce over more axes")
        if n > MOST:
            raise ValueError(f"hostfeed: Recorder.record({name!r}): TopK over {n} values a "
                             f"row; at most 2**24 (its indices are stored as float32): "
                             f"reduce over fewer axes")

    def compute(self, v: jax.Array, axes: tuple[int, ...]) -> jax.Array:
        values, index = _top(v, axes, self.k)
        return jnp.stack([values, index.astype(jnp.float32)], axis=-2)

    def sharded(self, v: jax.Array, axes: tuple[int, ...],
                fn: Callable[[jax.Array, tuple[int, ...]], jax.Array]) -> jax.Array:
        """Each device takes the ``k`` largest of its slice (with their indices in the
        whole value), the candidates of the devices along the reduced axes are gathered
        (``k`` per device and kept position, never the value) and the ``k`` largest of
        them taken, equal values by lowest index."""
        from jax.sharding import PartitionSpec as P
        mesh = jax.typeof(v).sharding.mesh
        spec, names = reduced_names(v, axes)
        if not names:
            return self.compute(v, axes)
        kept = [spec[d] for d in range(v.ndim) if d not in axes]
        whole, k = tuple(v.shape[d] for d in axes), self.k

        def local(part: jax.Array) -> jax.Array:
            sizes = tuple(part.shape[d] for d in axes)
            values, index = _top(part, axes, min(k, math.prod(sizes)))
            # The slice's indices as the whole value's: unravel, shift, ravel again.
            flat = jnp.zeros_like(index)
            rest = index
            coords = []
            for size in reversed(sizes):
                coords.append(rest % size)
                rest = rest // size
            for d, size, coord in zip(axes, whole, reversed(coords)):
                here = spec[d]
                at = 0 if not here else jax.lax.axis_index(
                    here if isinstance(here, str) else tuple(here)) * part.shape[d]
                flat = flat * size + coord + at
            values = jax.lax.all_gather(values, tuple(names), axis=values.ndim - 1,
                                        tiled=True)
            flat = jax.lax.all_gather(flat, tuple(names), axis=flat.ndim - 1, tiled=True)
            # Largest first (~key ascending), equal values by lowest index.
            _, flat, values = jax.lax.sort((~_nan_low_keys(values), flat, values),
                                           dimension=values.ndim - 1, num_keys=2)
            return jnp.stack([values[..., :k], flat[..., :k].astype(jnp.float32)], axis=-2)

        # The merged candidates are the same on every device along the reduced axes (JAX
        # cannot infer it through the sort): check_vma=False.
        return jax.shard_map(local, mesh=mesh, in_specs=P(*spec),
                             out_specs=P(*kept, None, None), check_vma=False)(v)

    @staticmethod
    def split(rows: Any) -> tuple[np.ndarray, np.ndarray]:
        """The values (float32) and indices (int64) of rows read back from a
        ``reduce=TopK(k)`` array (``[..., 2, k]``): each ``[..., k]``."""
        rows = np.asarray(rows)
        if rows.ndim < 2 or rows.shape[-2] != 2:
            raise ValueError(f"hostfeed.TopK.split: rows of a TopK array end in [2, k], got "
                             f"shape {list(rows.shape)}")
        return rows[..., 0, :].astype(np.float32), rows[..., 1, :].astype(np.int64)

    @classmethod
    def plot_rows(cls, rows: np.ndarray, attrs: dict[str, Any]) -> np.ndarray:
        """The ``k`` values of each row, the largest over its kept positions per rank."""
        values, _ = cls.split(rows)
        n = values.shape[0]
        v = values.reshape(n, -1, values.shape[-1]).astype(np.float64)
        with np.errstate(invalid="ignore"):
            return np.where(np.isnan(v).all(1), np.nan, np.nanmax(
                np.where(np.isnan(v), -np.inf, v), axis=1))

    @classmethod
    def plot_labels(cls, attrs: dict[str, Any], columns: int) -> list[str]:
        return [f"top{i + 1}" for i in range(columns)]

    @classmethod
    def plot_title(cls, attrs: dict[str, Any]) -> str:
        return f"top {attrs.get('k', '')}"


def _nan_low_keys(v: jax.Array) -> jax.Array:
    """:func:`keys` of ``v`` with every NaN below ``-inf``'s key."""
    return jnp.where(jnp.isnan(v), jnp.iinfo(jnp.int32).min, keys(v))


def _top(v: jax.Array, axes: tuple[int, ...], k: int) -> tuple[jax.Array, jax.Array]:
    """The ``k`` largest values of ``v`` over ``axes`` for each kept position (the kept
    axes first, then ``k``) and their flat row-major indices into the reduced axes, equal
    values by lowest index (``lax.top_k``'s order, on keys that order NaN lowest)."""
    kept = [d for d in range(v.ndim) if d not in axes]
    n = math.prod(v.shape[d] for d in axes)
    x = jnp.transpose(v, (*kept, *axes)).reshape(*(v.shape[d] for d in kept), n)
    _, index = jax.lax.top_k(_nan_low_keys(x), k)
    # The values are taken as their bits (int32): where XLA partitions this gather over a
    # sharded reduced axis (automatic sharding), each device takes what its slice holds,
    # zero elsewhere, and the devices' takes are summed; a float sum would turn -0.0 into
    # 0.0 (-0.0 + 0.0), an integer sum of the bits keeps every value exactly.
    bits = jnp.take_along_axis(jax.lax.bitcast_convert_type(x, jnp.int32), index, axis=-1)
    return jax.lax.bitcast_convert_type(bits, jnp.float32), index
