"""Reading a recording back: :func:`read_recording`."""
from __future__ import annotations

import difflib
import warnings
from typing import Any, Optional
from collections.abc import Mapping

import numpy as np

from ..record import stores
from ..record.unflushed import warn_if_unflushed
from ..record.roles import ROW_METADATA

#: zarr-python's warning about the lock file (not a Zarr node) of a store being written.
_LOCK_WARNING = rf"Object at {stores.LOCK_NAME.replace('.', '[.]')} is not recognized"


def zarr_module(who: str) -> Any:
    """zarr-python, with hostfeed's data types registered (bfloat16, the float8 types); an
    ``ImportError`` that says what to install where it is missing. ``who``: the public
    function that needs it, for the message (``"hostfeed.read_recording"``)."""
    try:
        import zarr
    except ImportError as exc:
        raise ImportError(f"{who} needs zarr-python: pip install 'zarr>=3.1' (or read the "
                          f"store with any Zarr v3 reader)") from exc
    from ... import zarr_dtypes
    zarr_dtypes.register()
    return zarr


def _recorded_names(group: Any, prefix: str = "") -> list[str]:
    """The recorded arrays under ``group`` (full names; per-row metadata left out). The
    lock file of a store a recorder holds is not a Zarr node: zarr-python's warning about
    it, and only that one, is silenced."""
    names = []
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_LOCK_WARNING)
        members = list(group.members())
    for key, member in members:
        full = f"{prefix}{key}"
        if hasattr(member, "members"):
            names += _recorded_names(member, full + "/")
        elif not any(full.endswith(f".{m}") for m in ROW_METADATA):
            names.append(full)
    return names


def read_recording(path: Any, name: str, *, storage_options: Optional[Mapping[str, Any]] = None
                   ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The rows recorded under ``name`` and their per-row metadata, as numpy arrays.

    Returns ``(rows, meta)``: ``rows`` has shape ``[n, *value.shape]`` and the value's
    dtype; ``meta`` maps ``"step"``, ``"device"``, ``"time_ns"``, ``"seq"`` and
    ``"transforms"`` (a list of the transforms descriptions, indexed by
    ``meta["transform_index"]``) to arrays of ``n`` entries. ``path`` is a store's
    directory or an object store's URL (``s3://…``, read with ``storage_options`` as
    :class:`Recorder` takes them). Needs zarr-python (``pip install 'zarr>=3.1'``), and
    for an object store obstore (``pip install obstore``).

    A store that a :class:`Recorder` still has open holds the rows written so far (up to
    its last ``flush()``, or its periodic commit): reading it while rows may be missing
    (another process's recorder, or one of this process that recorded since its last
    ``flush()``) warns with an ``UnflushedReadWarning`` that says so. Flush (or close)
    the recorder first, or read rows as they are committed with :func:`follow`.

    Example:
        >>> import pathlib, tempfile, jax.numpy as jnp, hostfeed
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "run.zarr"
        >>> with hostfeed.Recorder(path, mode="w") as rec:
        ...     for step in range(3):
        ...         _ = rec.record("loss", jnp.float32(step) / 2, step=step)
        >>> rows, meta = hostfeed.read_recording(path, "loss")
        >>> rows.tolist(), meta["step"].tolist()
        ([0.0, 0.5, 1.0], [0, 1, 2])
    """
    zarr = zarr_module("hostfeed.read_recording")
    where = stores.location(path, storage_options, who="read_recording")
    root: Any = zarr.open_group(stores.zarr_store(where), mode="r")
    try:
        data = root[name]
    except KeyError:
        names = _recorded_names(root)
        if not names:
            raise KeyError(f"hostfeed.read_recording: the store {where.where} holds no array, "
                           f"so no {name!r}: nothing was recorded to it (no record ran, or "
                           f"each selected none of the steps run; a hostfeed.capture that "
                           f"recorded nothing says why with a CaptureWarning)") from None
        near = difflib.get_close_matches(name, names, n=len(names), cutoff=0.0)[:20]
        raise KeyError(f"hostfeed.read_recording: the store {where.where} has no array "
                       f"{name!r}; it has {near or 'none'} (nearest first)") from None
    stores.check_recorded(root, data, name, where.where)
    rows = stores.read_rows(data, slice(None), name, where.where)
    n = rows.shape[0]
    warn_if_unflushed(where, "hostfeed.read_recording", n)
    parent, _, leaf = name.rpartition("/")
    group = root[parent] if parent else root
    meta: dict[str, Any] = {}
    for field in ROW_METADATA:
        values = stores.read_rows(group[f"{leaf}.{field}"], slice(0, n), f"{name}.{field}",
                                  where.where)
        meta["transform_index" if field == "transforms" else field] = values
    meta["transforms"] = list(data.attrs.get("hostfeed", {}).get("transforms", []))
    return rows, meta
