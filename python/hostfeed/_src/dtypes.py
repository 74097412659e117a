"""The dtypes hostfeed transfers: the XLA FFI data type codes the Rust side reports, their
numpy dtypes, the checks of a value's dtype (byte order) and size, and the one extended
dtype a tap carries, typed PRNG keys (their section below)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

import jax
import ml_dtypes
import numpy as np

from .. import _receiver
from . import compat


def _numpy_dtype(name: str) -> np.dtype | None:
    for module in (np, ml_dtypes):
        if hasattr(module, name):
            return np.dtype(getattr(module, name))
    return None


# XLA_FFI_DataType code -> numpy dtype, for every dtype hostfeed transfers (the codes come
# from the Rust side; dtypes this numpy/ml_dtypes lacks are left out).
XLA_DTYPES: dict[int, np.dtype] = {
    code: dt for name, code in _receiver.host.DTYPE_CODES.items()
    if (dt := _numpy_dtype(name)) is not None}

#: numpy dtype name -> XLA_FFI_DataType code.
DTYPE_CODES: dict[str, int] = dict(_receiver.host.DTYPE_CODES)

#: numpy dtypes that taps can carry.
SUPPORTED_DTYPES: frozenset[np.dtype] = frozenset(XLA_DTYPES.values())


def byte_order_problem(dtype: Any) -> Optional[str]:
    """What is wrong with a dtype that hostfeed supports in native byte order but that is
    byte-swapped (``>f4`` on a little-endian host), and how to fix it; None otherwise.

    Example:
        >>> byte_order_problem(np.dtype(">f4") if np.little_endian else np.dtype("<f4"))[:36]
        'dtype >f4, whose byte order is not t'
        >>> byte_order_problem(np.float32) is None
        True
    """
    dt = np.dtype(dtype)
    if dt.isnative or dt.newbyteorder("=") not in SUPPORTED_DTYPES:
        return None
    order = "big" if dt.byteorder == ">" else "little"
    return (f"dtype {dt.str}, whose byte order is not the host's ({order}-endian; this host "
            f"is {'little' if np.little_endian else 'big'}-endian): convert it first, e.g. "
            f"x.astype(x.dtype.newbyteorder('=')) (numpy), which gives {dt.newbyteorder('=')}")


#: Most bytes one transferred value may have: 2**47 (128 TiB), more than any host's memory
#: and any user address space; larger shapes would overflow XLA's size arithmetic (which
#: aborts the process) long before.
MAX_VALUE_BYTES = 1 << 47


def check_size(shape: Sequence[int], dtype: Any, api: str, what: str) -> None:
    """Raises ValueError when a value of ``shape`` and ``dtype`` has more bytes than any
    host can hold (:data:`MAX_VALUE_BYTES`); computed with Python's integers, so it never
    overflows.

    Example:
        >>> try:
        ...     check_size((2**62,), np.float32, "hcb.call", "leaf 0 of `result_shape`")
        ... except ValueError as e:
        ...     print(str(e)[:71])
        hcb.call: leaf 0 of `result_shape` has shape (4611686018427387904,) and
    """
    nbytes = np.dtype(dtype).itemsize
    for d in shape:
        nbytes *= int(d)
    if nbytes > MAX_VALUE_BYTES:
        raise ValueError(f"{api}: {what} has shape {tuple(int(d) for d in shape)} and dtype "
                         f"{np.dtype(dtype)}: {nbytes} bytes, more than any host can hold "
                         f"(at most {MAX_VALUE_BYTES} bytes, 128 TiB); check the shape")


# ---- Typed PRNG keys --------------------------------------------------------------------
# hostfeed's primitives carry plain arrays only. A leaf that is a typed PRNG key
# (``jax.random.key``, or ``jax.random.PRNGKey`` under ``jax.enable_custom_prng()``) is
# replaced by its key data (``jax.random.key_data``) before the primitive is bound, and the
# primitive's identity outputs are wrapped back (``jax.random.wrap_key_data``) with the
# leaf's key dtype, which names its implementation. So the host receives the key data as a
# numpy array, the computation gets its typed keys back, and no transformation rule (vmap,
# autodiff, control flow) has to know about keys. Other extended dtypes cannot be sent and
# are refused with a ``TypeError``.


def _dtype_of(x: Any) -> Any:
    return getattr(x, "dtype", None)


def is_extended(dtype: Any) -> bool:
    """Whether ``dtype`` is a JAX extended dtype (typed keys and others), not a numpy one.

    Example:
        >>> is_extended(jax.random.key(0).dtype), is_extended(np.dtype("uint32"))
        (True, False)
    """
    if dtype is None or isinstance(dtype, np.dtype):
        return False
    try:
        return bool(jax.dtypes.issubdtype(dtype, jax.dtypes.extended))
    except TypeError:
        return False


def is_key(dtype: Any) -> bool:
    """Whether ``dtype`` is the dtype of typed PRNG keys (of any implementation)."""
    return is_extended(dtype) and bool(jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key))


def refuse_extended(api: str, where: str, dtype: Any) -> TypeError:
    """The error for an extended dtype that is not a key (``where``: e.g. "leaf 2 of `arg`")."""
    return TypeError(
        f"{api}: {where} has the extended dtype {dtype}, which hostfeed cannot transfer to "
        f"the host. Typed PRNG keys are sent as their key data; for other extended dtypes "
        f"send a plain array that represents the value instead")


def unwrap_keys(leaves: Sequence[Any], api: str, what: str) -> tuple[list, tuple]:
    """Replaces typed-key leaves by their key data.

    Returns ``(leaves, key_dtypes)``: ``key_dtypes[i]`` is the key dtype of leaf ``i`` if it
    was a key, else None. Raises ``TypeError`` naming the leaf for other extended dtypes.

    Example:
        >>> k = jax.random.key(1)
        >>> data, kinds = unwrap_keys([k, 2.0], "id_tap", "arg")
        >>> data[0].dtype, kinds == (k.dtype, None)
        (dtype('uint32'), True)
    """
    out, key_dtypes = [], []
    for i, x in enumerate(leaves):
        dtype = _dtype_of(x)
        if is_extended(dtype):
            if not is_key(dtype):
                raise refuse_extended(api, f"leaf {i} of `{what}`", dtype)
            out.append(jax.random.key_data(x))
            key_dtypes.append(dtype)
        else:
            out.append(x)
            key_dtypes.append(None)
    return out, tuple(key_dtypes)


def rewrap_keys(leaves: Sequence[Any], key_dtypes: Sequence[Optional[Any]]) -> list:
    """Wraps key data back into typed keys where ``key_dtypes`` (from :func:`unwrap_keys`)
    says a leaf was a key; other leaves are returned as they are."""
    return [x if d is None else compat.wrap_key_data(x, d)
            for x, d in zip(leaves, key_dtypes)]


def key_data_shape(shape: tuple, dtype: Any) -> tuple[tuple, np.dtype]:
    """Shape and dtype of the key data of keys of ``shape`` and key dtype ``dtype``.

    Example:
        >>> key_data_shape((3,), jax.random.key(0).dtype)
        ((3, 2), dtype('uint32'))
    """
    data = jax.eval_shape(jax.random.key_data, jax.ShapeDtypeStruct(shape, dtype))
    return tuple(data.shape), np.dtype(data.dtype)
