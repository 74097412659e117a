"""Several arrays as one byte buffer, on the device and on the host.

A TPU's transfers to and from the host cost about the same fixed time each whatever their
size (about 240 µs on a TPU v5e, against 0.2 µs for a step of a small loop), so the
host-transfer transport sends a callback's operands, and receives a call's results, as
*one* ``uint8`` buffer: :func:`pack` bitcasts each array to bytes and concatenates them on
the device, :func:`unpack` slices them back, and :meth:`Layout.views` gives the host numpy
views of the buffer without copying. Each array starts at a multiple of
:data:`ALIGNMENT` bytes, so the host views are aligned for their dtype.

Only dtypes that bitcast to bytes unchanged on every platform are packed
(:func:`packable`): the integers, float16, float32 and booleans (as ``uint8``). Others
travel as arrays of their own, as JAX's callbacks send them: 64-bit and complex dtypes, the
float8 types, and bfloat16 (a TPU's bitcast of bfloat16 to integers flushes its subnormals
and rewrites its NaN payloads, where sending it as it is keeps its bits).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import lax

__all__ = ["ALIGNMENT", "Layout", "packable", "pack", "unpack"]

#: Each packed array starts at a multiple of this many bytes.
ALIGNMENT = 16

_PACKABLE = frozenset(np.dtype(t) for t in (
    np.bool_, np.int8, np.int16, np.int32, np.uint8, np.uint16, np.uint32, np.float16,
    np.float32))


def packable(dtype: Any) -> bool:
    """Whether arrays of ``dtype`` go into the packed buffer.

    Example:
        >>> packable(np.float32), packable(np.float64), packable(np.complex64)
        (True, False, False)
    """
    return np.dtype(dtype) in _PACKABLE


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where each of several arrays lies in one byte buffer: ``offsets[i]`` bytes in,
    ``shapes[i]`` and ``dtypes[i]``; ``nbytes`` in all (padding included).

    Example:
        >>> lay = Layout.of([((2,), np.float32), ((), np.int8)])
        >>> lay.offsets, lay.nbytes
        ((0, 16), 17)
    """

    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[np.dtype, ...]
    offsets: tuple[int, ...]
    nbytes: int

    @classmethod
    def of(cls, arrays: Sequence[tuple[Sequence[int], Any]]) -> Layout:
        """The layout of arrays given as ``(shape, dtype)``, in order."""
        shapes, dtypes, offsets, end = [], [], [], 0
        for given_shape, given_dtype in arrays:
            start = -(-end // ALIGNMENT) * ALIGNMENT
            shape, dtype = tuple(int(d) for d in given_shape), np.dtype(given_dtype)
            shapes.append(shape)
            dtypes.append(dtype)
            offsets.append(start)
            end = start + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        return cls(tuple(shapes), tuple(dtypes), tuple(offsets), end)

    def views(self, buffer: np.ndarray) -> list[np.ndarray]:
        """Numpy views of each array in ``buffer`` (a ``uint8`` array of ``nbytes``), no copy.

        Example:
            >>> lay = Layout.of([((2,), np.float32)])
            >>> lay.views(np.frombuffer(np.float32([1, 2]).tobytes(), np.uint8))[0]
            array([1., 2.], dtype=float32)
        """
        return [np.ndarray(shape, dtype, buffer=buffer, offset=off)
                for shape, dtype, off in zip(self.shapes, self.dtypes, self.offsets)]


def _bytes_of(x: Any) -> Any:
    if x.dtype == jnp.bool_:
        return x.astype(jnp.uint8).reshape(-1)
    return lax.bitcast_convert_type(x, jnp.uint8).reshape(-1)


def pack(values: Sequence[Any], layout: Layout) -> Any:
    """``values`` (of ``layout``'s shapes and dtypes, all :func:`packable`) as one
    ``uint8[layout.nbytes]`` array, on the device.

    Example:
        >>> lay = Layout.of([((2,), np.float32), ((), np.bool_)])
        >>> buf = pack([jnp.float32([1, 2]), jnp.bool_(True)], lay)
        >>> buf.shape, [v.tolist() for v in lay.views(np.asarray(buf))]
        ((17,), [[1.0, 2.0], True])
    """
    parts, end = [], 0
    for value, off in zip(values, layout.offsets):
        if off > end:
            parts.append(jnp.zeros((off - end,), jnp.uint8))
        part = _bytes_of(jnp.asarray(value))
        parts.append(part)
        end = off + part.shape[0]
    if not parts:
        return jnp.zeros((0,), jnp.uint8)
    return parts[0] if len(parts) == 1 else jnp.concatenate(parts)


def unpack(buffer: Any, layout: Layout) -> list[Any]:
    """The arrays of ``layout`` from ``buffer`` (``uint8[layout.nbytes]``), on the device:
    :func:`pack`'s inverse.

    Example:
        >>> lay = Layout.of([((2,), np.float32), ((), np.bool_)])
        >>> [v.tolist() for v in unpack(pack([jnp.float32([1, 2]), True], lay), lay)]
        [[1.0, 2.0], True]
    """
    out = []
    for shape, dtype, off in zip(layout.shapes, layout.dtypes, layout.offsets):
        n = int(np.prod(shape, dtype=np.int64))
        raw = lax.slice(buffer, (off,), (off + n * dtype.itemsize,))
        if dtype == np.bool_:
            out.append((raw != 0).reshape(shape))
        elif dtype.itemsize == 1:
            out.append(lax.bitcast_convert_type(raw, dtype).reshape(shape))
        else:
            words = raw.reshape((n, dtype.itemsize))
            out.append(lax.bitcast_convert_type(words, dtype).reshape(shape))
    return out


def device_pack(layout: Layout) -> Any:
    """:func:`pack` as a function of a list of values, for ``compat.lower_fun``."""
    return lambda *values: [pack(values, layout)]


def device_unpack(layout: Layout) -> Any:
    """:func:`unpack` as a function of a list of one buffer, for ``compat.lower_fun``."""
    return lambda buffer: unpack(buffer, layout)
