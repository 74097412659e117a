"""The checks of what ``Recorder.record`` is given: one JAX value of a recordable dtype, an
integer scalar step, and what to do instead with a pytree."""
from __future__ import annotations

from typing import Any, Optional

import jax
import numpy as np

from .. import compat, dtypes
from .roles import COTANGENT_SUFFIX, ROW_METADATA, TANGENT_SUFFIX


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
    check_fits(x, name)
    return x


def ad_taps_of(cotangents: Any, name: str) -> Optional[str]:
    """``Recorder.record(..., cotangents=)`` as the record's autodiff mode: None (the
    process's), ``"transforms"`` (True) or ``"primals"`` (False).

    Example:
        >>> ad_taps_of(None, "h"), ad_taps_of(True, "h"), ad_taps_of(False, "h")
        (None, 'transforms', 'primals')
    """
    if cotangents is None:
        return None
    if not isinstance(cotangents, (bool, np.bool_)):
        raise TypeError(f"hostfeed: Recorder.record({name!r}, cotangents=...) must be True, "
                        f"False or None (the process's HOSTFEED_AD_TAPS), got {cotangents!r}")
    return "transforms" if cotangents else "primals"


def check_fits(x: Any, name: str) -> None:
    """Raises ``OverflowError`` if the numpy value ``x`` does not fit the dtype JAX gives it
    (``int64`` becomes ``int32``, ``float64`` ``float32``... while ``jax_enable_x64`` is
    off): an integer out of range, or a finite float or complex part that would become
    infinite. A value that fits is recorded converted, as a computation would convert it
    (the same array under ``jit`` and eagerly); float64 is rounded to float32.

    Example:
        >>> import jax
        >>> check_fits(np.array([2**31 - 1, -2**31]), "ok")
        >>> if not jax.config.jax_enable_x64:
        ...     check_fits(np.array([2**40, 1]), "big")
        Traceback (most recent call last):
        OverflowError: hostfeed: Recorder.record('big') got a numpy int64 value that does not...
    """
    if not isinstance(x, (np.ndarray, np.generic)):
        return
    have = np.dtype(x.dtype)
    want = np.dtype(jax.dtypes.canonicalize_dtype(have))
    if want == have or have.kind not in "iufc":
        return
    a = np.asarray(x)
    with np.errstate(over="ignore", invalid="ignore"):
        converted = a.astype(want)
        if have.kind in "iu":
            bad = converted.astype(have) != a
        else:
            bad = np.zeros(a.shape, bool)
            for part, conv in ((a.real, converted.real), (a.imag, converted.imag)):
                bad |= np.isfinite(part) & ~np.isfinite(conv)
    if not bad.any():
        return
    at = np.unravel_index(int(np.argmax(bad)), a.shape) if a.ndim else ()
    raise OverflowError(
        f"hostfeed: Recorder.record({name!r}) got a numpy {have} value that does not fit "
        f"in {want}, the dtype JAX gives it while 64-bit types are off (jax_enable_x64): "
        f"{a[at].item()!r} would be stored as {converted[at].item()!r}. Enable them "
        f"(jax.config.update('jax_enable_x64', True)) to record {have}, or convert the "
        f"value yourself to a dtype that holds it (scaled, or x.astype(np.float32), which "
        f"holds large integers approximately)")


def as_step(step: Any, name: str) -> Any:
    """``step`` as an integer scalar JAX value, or a ``TypeError``."""
    s = step if compat.is_tracer(step) or isinstance(step, jax.Array) \
        else jax.numpy.asarray(step)
    if s.shape != () or not jax.numpy.issubdtype(s.dtype, jax.numpy.integer):
        raise TypeError(f"hostfeed: Recorder.record({name!r}, step=...) needs an integer "
                        f"scalar, got {s.dtype}{list(s.shape)}")
    return s


def check_name(name: str) -> None:
    """Refuses a name a record may not be given: a reserved suffix (per-row metadata,
    tangents, cotangents) on its last part."""
    if not isinstance(name, str):
        raise TypeError(f"hostfeed: a record name must be a str, got {type(name).__name__}")
    leaf = name.rsplit("/", 1)[-1]
    for suffix in (TANGENT_SUFFIX, COTANGENT_SUFFIX) + tuple("." + s for s in ROW_METADATA):
        if leaf.endswith(suffix):
            raise ValueError(
                f"hostfeed: invalid record name {name!r}: the suffix {suffix!r} is reserved "
                f"(per-row metadata, tangents and cotangents are stored under such names)")
