"""The dtypes hostfeed transfers: the XLA FFI data type codes the Rust side reports, their
numpy dtypes, and the checks of a value's dtype (byte order) and size."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

import ml_dtypes
import numpy as np

from .. import _receiver


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

