"""Reading a recording back: :func:`read_recording`."""
from __future__ import annotations

import asyncio
import contextlib
import difflib
import json
import os
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


def settle() -> None:
    """Waits (a few seconds at most) for the reads zarr-python's event loop still has
    running after one of them failed (a group's members are read together): left pending,
    each is reported at the interpreter's exit ("Task was destroyed but it is pending!")."""
    try:
        from zarr.core.sync import sync
    except ImportError:  # pragma: no cover - another zarr-python layout: nothing to wait on
        return

    async def drain() -> None:
        me = asyncio.current_task()
        pending = [t for t in asyncio.all_tasks() if t is not me]
        if pending:
            await asyncio.wait(pending, timeout=5)

    with contextlib.suppress(Exception):
        sync(drain())


def _metadata(file: str, where: str, who: str) -> dict:
    """A local ``zarr.json``, parsed; one that is no JSON object is a ``ValueError`` saying
    the recording ``where`` is damaged."""
    try:
        with open(file, "rb") as f:
            node = json.loads(f.read().decode("utf-8"))
        if not isinstance(node, dict):
            raise ValueError(f"a JSON {type(node).__name__}, not an object")
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise ValueError(f"{who}: the recording {where} is damaged: {file} is no Zarr "
                         f"metadata ({type(exc).__name__}: {exc}); a Recorder replaces each "
                         f"zarr.json whole, so something else truncated or changed it") from None
    return node


def _store_of(path: str) -> tuple[str, str]:
    """The outermost group above the array at local ``path`` (its folders holding a
    ``zarr.json``) and the array's name in it (``""``, ``""`` where none is)."""
    root, here = "", os.path.abspath(path)
    while True:
        parent = os.path.dirname(here)
        if parent == here or not os.path.isfile(os.path.join(parent, "zarr.json")):
            break
        root = here = parent
    if not root:
        return "", ""
    name = os.path.relpath(os.path.abspath(path), root).replace(os.sep, "/")
    return os.path.relpath(root) if not os.path.isabs(path) else root, name


def _check_local(path: str, who: str) -> None:
    """Refuses, with what is there instead, a local ``path`` that holds no recording:
    ``FileNotFoundError`` where nothing is (no zarr.json), ``ValueError`` for a file, an
    array's folder or a root ``zarr.json`` that cannot be read. Zarr v2 stores pass (their
    arrays are refused one by one, saying so)."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"{who}: no recording at {path}: nothing is there")
    if not os.path.isdir(path):
        raise ValueError(f"{who}: {path} is a file, not a recording (a recording is a "
                         f"directory with a zarr.json)")
    meta = os.path.join(path, "zarr.json")
    if not os.path.isfile(meta):
        entries = set(os.listdir(path)) - {stores.LOCK_NAME}
        if entries & {".zgroup", ".zarray"}:
            return
        listed = ", ".join(sorted(entries)[:3]) + (", ..." if len(entries) > 3 else "")
        what = (f"a directory of {len(entries)} {'entry' if len(entries) == 1 else 'entries'}"
                f" ({listed})" if entries else "an empty directory")
        raise FileNotFoundError(f"{who}: no recording at {path}: {what} without a zarr.json "
                                f"(a recording has one at its root from when its Recorder "
                                f"opens it)")
    node = _metadata(meta, path, who)
    if node.get("node_type") == "array":
        root, name = _store_of(path)
        raise ValueError(f"{who}: {path} is the array {name!r} of the recording {root}, not a "
                         f"recording: open {root} and read {name!r} in it" if root else
                         f"{who}: {path} is a Zarr array, not a recording")


def _damaged(path: str, who: str) -> Optional[Exception]:
    """The error of the first ``zarr.json`` under the local recording ``path`` (its groups,
    in order) that cannot be read; ``None`` if every one can."""
    for folder, subfolders, files in os.walk(path):
        subfolders.sort()
        if "zarr.json" not in files:
            subfolders[:] = []
            continue
        try:
            node = _metadata(os.path.join(folder, "zarr.json"), path, who)
        except ValueError as exc:
            return exc
        if node.get("node_type") != "group":
            subfolders[:] = []  # an array's chunks
    return None


def diagnose(path: str, who: str) -> Optional[Exception]:
    """What is wrong with the local recording ``path`` that zarr-python could not read (an
    array's folder, damaged metadata), as :func:`open_root` says it; ``None`` when nothing
    is found."""
    try:
        _check_local(path, who)
    except (ValueError, FileNotFoundError) as exc:
        return exc
    return _damaged(path, who)


def open_root(where: stores.Location, who: str) -> Any:
    """The root group of the recording at ``where``, opened for reading with zarr-python.
    What is no recording is hostfeed's error naming the path and what is there instead
    (:func:`_check_local` for a local path); what zarr-python refuses is said as such.

    Raises:
      FileNotFoundError: no recording there.
      ValueError: a file, an array's folder, damaged metadata.
    """
    zarr = zarr_module(who)
    if not where.url:
        _check_local(where.where, who)
    try:
        return zarr.open_group(stores.zarr_store(where), mode="r")
    except FileNotFoundError as exc:
        raise FileNotFoundError(f"{who}: no recording at {where.where} ({exc})") from exc
    except (ValueError, KeyError) as exc:
        settle()
        kind = type(exc).__name__
        why = {"GroupNotFoundError": "no recording there (no zarr.json at its root)",
               "ContainsArrayError": "an array, not a recording: open the recording that "
                                     "holds it"}.get(kind, f"{kind}: {exc}")
        if kind == "GroupNotFoundError":
            raise FileNotFoundError(f"{who}: no recording at {where.where}: {why}") from exc
        raise ValueError(f"{who}: {where.where} cannot be read as a recording: {why}") from exc


def recorded_names(root: Any, where: stores.Location, who: str) -> list[str]:
    """:func:`_recorded_names` of a recording's root; metadata that cannot be read is a
    ``ValueError`` naming the recording and (on a local disk) the damaged file."""
    try:
        return _recorded_names(root)
    except (ValueError, KeyError) as exc:
        found = None if where.url else _damaged(where.where, who)
        if found is not None:
            raise found from exc
        raise ValueError(f"{who}: the recording {where.where} cannot be listed: metadata "
                         f"that cannot be read ({type(exc).__name__}: {exc})") from exc


def node(group: Any, key: str, where: str, who: str) -> Any:
    """``group[key]``, metadata that cannot be read a ``ValueError`` naming it and the
    recording (a missing key stays a ``KeyError``)."""
    try:
        return group[key]
    except KeyError:
        raise
    except ValueError as exc:
        settle()
        raise ValueError(f"{who}: {key!r} in the recording {where} cannot be read: its "
                         f"metadata is damaged ({type(exc).__name__}: {exc})") from exc


def _recorded_names(group: Any, prefix: str = "") -> list[str]:
    """The recorded arrays under ``group`` (full names; per-row metadata left out). The
    lock file of a store a recorder holds is not a Zarr node: zarr-python's warning about
    it, and only that one, is silenced. A member that cannot be read raises what
    zarr-python raised, once its other reads ended (:func:`settle`)."""
    names = []
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_LOCK_WARNING)
        try:
            members = list(group.members())
        except Exception:
            settle()
            raise
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
    who = "hostfeed.read_recording"
    where = stores.location(path, storage_options, who="read_recording")
    root: Any = open_root(where, who)
    try:
        data = node(root, name, where.where, who)
    except KeyError:
        names = recorded_names(root, where, who)
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
        values = stores.read_rows(node(group, f"{leaf}.{field}", where.where, who),
                                  slice(0, n), f"{name}.{field}", where.where)
        meta["transform_index" if field == "transforms" else field] = values
    meta["transforms"] = list(data.attrs.get("hostfeed", {}).get("transforms", []))
    return rows, meta
