"""The checks of what ``Recorder.record`` is given: one JAX value of a recordable dtype, an
integer scalar step, and what to do instead with a pytree."""
from __future__ import annotations

from typing import Any

import jax
import numpy as np

from . import compat, dtypes


def describe_pytree(value: Any, n_leaves: int, name: str) -> str:
    """What ``Recorder.record`` got instead of one array, and how to record it."""
    leaves = f"{n_leaves} leaf" if n_leaves == 1 else f"{n_leaves} leaves"
    if isinstance(value, dict) and value:
        key = next(iter(value))
        return (f"a dict with {leaves} (keys {list(value)[:8]}); record each entry under its "
                f"own name, e.g. rec.record({f'{name}/{key}'!r}, value[{key!r}])")
    if isinstance(value, (tuple, list)) and value:
        return (f"a {type(value).__name__} of {len(value)} elements ({leaves}); record each "
                f"under its own name, e.g. rec.record({f'{name}/0'!r}, value[0])")
    return f"a {type(value).__name__} with {leaves}; record each leaf under its own name"


def as_value(x: Any, name: str) -> Any:
    """``x`` as a JAX value ``Recorder.record(name, ...)`` can record, or the error saying
    why not (not a JAX value, byte-swapped, a sub-byte dtype, too large)."""
    if not (compat.is_tracer(x) or isinstance(x, (jax.Array, np.ndarray, np.generic))):
        if isinstance(x, (bool, int, float, complex)) or hasattr(x, "__jax_array__"):
            x = jax.numpy.asarray(x)
        else:
            raise TypeError(f"hostfeed: Recorder.record({name!r}) got a {type(x).__name__}, "
                            f"which is not a JAX value")
    swapped = dtypes.byte_order_problem(x.dtype)
    if swapped is not None:
        raise TypeError(f"hostfeed: Recorder.record({name!r}) got a value of {swapped}")
    if np.dtype(x.dtype) not in dtypes.SUPPORTED_DTYPES:
        raise TypeError(
            f"hostfeed: Recorder.record({name!r}) got dtype {x.dtype}, which cannot be "
            f"recorded (sub-byte types have no Zarr encoding that readers share); cast "
            f"first, e.g. x.astype(jnp.int8) or a float8 type")
    dtypes.check_size(np.shape(x), x.dtype, "hostfeed", f"Recorder.record({name!r})'s value")
    return x


def as_step(step: Any, name: str) -> Any:
    """``step`` as an integer scalar JAX value, or a ``TypeError``."""
    s = step if compat.is_tracer(step) or isinstance(step, jax.Array) \
        else jax.numpy.asarray(step)
    if s.shape != () or not jax.numpy.issubdtype(s.dtype, jax.numpy.integer):
        raise TypeError(f"hostfeed: Recorder.record({name!r}, step=...) needs an integer "
                        f"scalar, got {s.dtype}{list(s.shape)}")
    return s
