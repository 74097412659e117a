"""zarr-python data types for the machine-learning floats JAX uses (``bfloat16`` and the
``float8`` types), backed by ``ml_dtypes``.

zarr-python (3.1 and later) does not know these Zarr extension data types and refuses to
open such arrays ("No Zarr data type found that matches 'bfloat16'"). :func:`register`
teaches it. ``import hostfeed`` does so as soon as zarr is imported (before or after
hostfeed), so ``zarr.open_group(path)["layer1/h"][:]`` returns a ``bfloat16`` array.

Names are those hostfeed's recorder writes: the zarr-extensions names, and tensorstore's
``float8_e4m3fn`` (not yet in zarr-extensions). One-byte types carry no endianness (the
``bytes`` codec has no ``endian`` for them, as tensorstore writes them) and read their fill
value as raw bits (``"0x00"``).

Nothing here imports JAX; zarr is imported only by :func:`register`.
"""
from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import logging
import sys
import threading
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

__all__ = ["ZARR_NAMES", "register", "register_when_zarr_is_imported"]

#: Zarr ``data_type`` name -> ml_dtypes attribute.
ZARR_NAMES = {
    "bfloat16": "bfloat16",
    "float8_e4m3fn": "float8_e4m3fn",
    "float8_e5m2": "float8_e5m2",
    "float8_e4m3": "float8_e4m3",
    "float8_e3m4": "float8_e3m4",
    "float8_e4m3fnuz": "float8_e4m3fnuz",
    "float8_e5m2fnuz": "float8_e5m2fnuz",
    "float8_e4m3b11fnuz": "float8_e4m3b11fnuz",
    "float8_e8m0fnu": "float8_e8m0fnu",
}

_lock = threading.Lock()
_registered: list[str] = []


def _validation_error() -> type[Exception]:
    """zarr-python's ``DataTypeValidationError`` (in ``zarr.errors`` from zarr 3.2, in
    ``zarr.core.dtype.common`` in zarr 3.1)."""
    for module in ("zarr.errors", "zarr.core.dtype.common"):
        try:
            found = getattr(importlib.import_module(module), "DataTypeValidationError", None)
        except ImportError:
            continue
        if isinstance(found, type) and issubclass(found, Exception):
            return found
    raise ImportError("this zarr-python has no DataTypeValidationError; hostfeed needs "
                      "zarr >= 3.1")


def _make_zdtype(zarr_name: str, np_dtype: np.dtype) -> type:
    """A zarr-python ``ZDType`` class for one ml_dtypes float type.

    Multi-byte types reuse zarr-python's float base class (with endianness); one-byte types
    must not carry endianness, so they borrow the same methods without that mixin.
    """
    from zarr.core.dtype.common import HasItemSize
    from zarr.core.dtype.npy.float import BaseFloat
    from zarr.core.dtype.wrapper import ZDType
    validation_error = _validation_error()

    def _check_native_dtype(cls: Any, dtype: Any) -> bool:
        return isinstance(dtype, np.dtype) and dtype == np_dtype

    def from_native_dtype(cls: Any, dtype: Any) -> Any:
        if cls._check_native_dtype(dtype):
            return cls(endianness="little") if np_dtype.itemsize > 1 else cls()
        # "Not mine": zarr asks every registered data type when it infers one.
        raise validation_error(f"expected {np_dtype}, got {dtype}")

    def from_json_scalar(self: Any, data: Any, *, zarr_format: int) -> Any:
        # Raw bits "0x.." of this type's own width (zarr-python parses only 2, 4, 8 bytes).
        if (isinstance(data, str) and data.startswith("0x")
                and len(data) - 2 == 2 * np_dtype.itemsize):
            return np.frombuffer(bytes.fromhex(data[2:])[::-1], dtype=np_dtype)[0]
        if isinstance(data, str):
            data = {"Infinity": "inf", "-Infinity": "-inf"}.get(data, data)
        return np_dtype.type(float(data))

    ns: dict[str, Any] = {
        "dtype_cls": type(np_dtype),
        "_zarr_v3_name": zarr_name,
        "_zarr_v2_names": (),
        "_check_native_dtype": classmethod(_check_native_dtype),
        "from_native_dtype": classmethod(from_native_dtype),
        "to_native_dtype": lambda self: np_dtype,
        "item_size": property(lambda self: np_dtype.itemsize),
        "from_json_scalar": from_json_scalar,
        "__annotations__": {},
        "__module__": __name__,
    }
    bases: tuple[type, ...]
    if np_dtype.itemsize > 1:
        bases = (BaseFloat,)
    else:
        bases = (ZDType, HasItemSize)
        for k in ("_check_json_v2", "_check_json_v3", "_from_json_v2", "_from_json_v3",
                  "to_json", "_check_scalar", "_cast_scalar_unchecked", "cast_scalar",
                  "default_scalar", "to_json_scalar"):
            ns.setdefault(k, BaseFloat.__dict__[k])
    cls = type("ML_" + zarr_name, bases, ns)
    return dataclass(frozen=True, kw_only=True)(cls)


def register() -> list[str]:
    """Registers the data types with zarr-python (once); returns their Zarr names.

    Raises ImportError if zarr-python is not installed.

    Example:
        >>> "bfloat16" in register()
        True
    """
    from zarr.core.dtype import data_type_registry

    with _lock:
        if not _registered:
            for zarr_name, attr in ZARR_NAMES.items():
                if hasattr(ml_dtypes, attr):
                    data_type_registry.register(
                        zarr_name, _make_zdtype(zarr_name, np.dtype(getattr(ml_dtypes, attr))))
                    _registered.append(zarr_name)
        return list(_registered)


class _RegisterAfterImport(importlib.abc.MetaPathFinder):
    """Registers the data types right after ``zarr`` is first imported (then removes
    itself), so that neither import order nor an unused zarr costs anything."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != "zarr":
            return None
        with _lock:
            if self in sys.meta_path:
                sys.meta_path.remove(self)
        spec = importlib.util.find_spec("zarr")
        loader = getattr(spec, "loader", None)
        if spec is None or loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module = loader.exec_module

        def exec_and_register(module: Any) -> None:
            exec_module(module)
            try:
                register()
            except Exception as exc:  # noqa: BLE001 - a zarr we cannot extend still works
                logging.getLogger("hostfeed").warning(
                    "hostfeed: could not register bfloat16/float8 with zarr-python: %s", exc)

        loader.exec_module = exec_and_register  # type: ignore[method-assign]
        return spec


def register_when_zarr_is_imported() -> None:
    """Registers the data types now if zarr is imported already, else right after zarr is
    imported (what ``import hostfeed`` does)."""
    if "zarr" in sys.modules:
        with contextlib.suppress(ImportError):
            register()
        return
    with _lock:
        if not any(isinstance(f, _RegisterAfterImport) for f in sys.meta_path):
            sys.meta_path.insert(0, _RegisterAfterImport())
