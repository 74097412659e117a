"""Typed PRNG keys in host callbacks.

hostfeed's primitives carry plain arrays only. A leaf that is a typed PRNG key
(``jax.random.key``, or ``jax.random.PRNGKey`` under ``jax.enable_custom_prng()``) is
replaced by its key data (``jax.random.key_data``) before the primitive is bound, and the
primitive's identity outputs are wrapped back (``jax.random.wrap_key_data``) with the
leaf's key dtype, which names its implementation. So the host receives the key data as a
numpy array, the computation gets its typed keys back, and no transformation rule (vmap,
autodiff, control flow) has to know about keys. Other extended dtypes cannot be sent and
are refused with a ``TypeError``.
"""
from __future__ import annotations

from typing import Any, Optional
from collections.abc import Sequence

import jax
import numpy as np

from . import compat


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
