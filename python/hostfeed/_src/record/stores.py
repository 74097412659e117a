"""Where a recording lives: a local or shared file system (a path, ``str``, ``bytes`` or
``os.PathLike``, or a ``file://`` URL on this host), or a store that a URL names (an object
store: ``s3://``, ``gs://``, ``az://`` and the aliases the ``object_store`` crate knows; or
``memory://``, in this process's memory), written from Rust. The schemes are the storage
back-ends' own list (the binding's ``STORE_SCHEMES``): every message that lists them takes
it from there. A URL of any other scheme is refused at the call rather than taken for a
local folder name."""
from __future__ import annotations

import math
import os
import re
import urllib.parse
import urllib.request
from typing import Any, NamedTuple, Optional
from collections.abc import Mapping

from ... import _receiver

_URL = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")
# A scheme followed by ":" but not "//" ("s3:/bucket", "gs:bucket"); Windows drive letters
# ("C:/data") have one letter and are no scheme hostfeed knows.
_NEAR_URL = re.compile(r"([A-Za-z][A-Za-z0-9+.-]+):/?")

#: The URL schemes of the stores that URLs name (S3, Google Cloud Storage, Azure Blob
#: Storage, and ``memory://``, a store in the recording process's memory): the storage
#: back-ends' own list (the core's ``record/backend.rs``).
OBJECT_SCHEMES: tuple[str, ...] = tuple(_receiver.storage.STORE_SCHEMES)


def _schemes() -> str:
    """The URL schemes of the stores, as messages list them (``memory://, s3://, ...``)."""
    return ", ".join(f"{s}://" for s in OBJECT_SCHEMES)


class Location(NamedTuple):
    """A store's place: ``where`` is a local path, or an object store's URL when ``url``."""
    where: str
    url: bool
    options: list[tuple[str, str]]


def _text(path: Any, who: str) -> str:
    try:
        p = os.fspath(path)
    except TypeError:
        raise TypeError(f"hostfeed: {who}(path) needs a str, bytes or os.PathLike, got "
                        f"{type(path).__name__}") from None
    return os.fsdecode(p) if isinstance(p, bytes) else p


def _options(storage_options: Optional[Mapping[str, Any]], text: str,
             who: str) -> list[tuple[str, str]]:
    if storage_options is None:
        return []
    if not isinstance(storage_options, Mapping):
        raise TypeError(f"hostfeed: {who}: storage_options must be a dict of option names "
                        f"to values, got {type(storage_options).__name__}")
    out = []
    for k, v in storage_options.items():
        if not isinstance(k, str):
            raise TypeError(f"hostfeed: {who}: storage_options keys must be str, got {k!r}")
        if isinstance(v, bool):
            out.append((k, "true" if v else "false"))
        elif isinstance(v, (str, int, float)) and not (isinstance(v, float) and math.isnan(v)):
            out.append((k, str(v)))
        else:
            raise TypeError(f"hostfeed: {who}: storage_options[{k!r}] must be a str, int, "
                            f"float or bool, got {v!r}")
    return out


def location(path: Any, storage_options: Optional[Mapping[str, Any]] = None, *,
             who: str = "Recorder") -> Location:
    """Where ``path`` puts a store: a local path (``os.fspath``; a ``file://`` URL as its
    path) or an object store's URL, with ``storage_options`` as (name, value) pairs.

    Example:
        >>> location("file:///tmp/run.zarr")
        Location(where='/tmp/run.zarr', url=False, options=[])
        >>> location("s3://bucket/run.zarr", {"aws_region": "eu-west-1"})
        Location(where='s3://bucket/run.zarr', url=True, options=[('aws_region', 'eu-west-1')])
        >>> location("ftp://host/run.zarr")
        Traceback (most recent call last):
        ...
        ValueError: hostfeed: Recorder('ftp://host/run.zarr'): ftp:// stores are not supported...
    """
    text = _text(path, who)
    url = _URL.match(text)
    near = _NEAR_URL.match(text) if url is None else None
    if near is not None and near.group(1).lower() in OBJECT_SCHEMES + ("file",):
        # "s3:/bucket/run" or "s3:bucket/run" would make a local folder named "s3:".
        fixed = f"{near.group(1)}://{text[near.end():].lstrip('/')}"
        raise ValueError(f"hostfeed: {who}({text!r}) looks like a URL missing a slash; "
                         f"write {fixed!r} (or './{text}' for a local folder of that name)")
    if url is not None and url.group(1).lower() in OBJECT_SCHEMES:
        return Location(text, True, _options(storage_options, text, who))
    if storage_options:
        raise ValueError(f"hostfeed: {who}({text!r}): storage_options apply to the stores "
                         f"that URLs name ({_schemes()}), not to a local path")
    if url is None:
        return Location(text, False, [])
    scheme = url.group(1).lower()
    parsed = urllib.parse.urlparse(text)
    if scheme == "file" and parsed.netloc in ("", "localhost"):
        return Location(urllib.request.url2pathname(parsed.path), False, [])
    raise ValueError(
        f"hostfeed: {who}({text!r}): {scheme}:// stores are not supported; hostfeed writes to "
        f"a local or shared file system (a path, or a file:// URL on this host) and to the "
        f"stores that URLs name ({_schemes()}). For a local folder whose name looks like a "
        f"URL, write './{text}'.")


def local_path(path: Any) -> str:
    """A local store path as ``str`` (see :func:`location`); an object store URL is refused.

    Example:
        >>> local_path("file:///tmp/run.zarr")
        '/tmp/run.zarr'
    """
    where = location(path)
    if where.url:
        raise ValueError(f"hostfeed: {where.where!r} is an object store URL; a local path is "
                         f"needed here")
    return where.where


def zarr_store(where: Location) -> Any:
    """A zarr-python store reading ``where``: its path, or, for an object store, zarr's
    ``ObjectStore`` over obstore (the same Rust client the recorder writes with), configured
    from the provider's environment variables and the storage options."""
    if not where.url:
        return where.where
    if where.where.lower().startswith("memory://"):
        raise ValueError(f"hostfeed: {where.where!r} lives in the memory of the process that "
                         f"recorded it and cannot be read back with zarr-python; record to a "
                         f"path or an object store to read the recording back")
    try:
        import obstore.store
        from zarr.storage import ObjectStore
    except ImportError as exc:
        raise ImportError("hostfeed: reading an object store needs zarr-python and obstore: "
                          "pip install 'zarr>=3.1' obstore") from exc
    config = dict(where.options)
    client = {}
    for k in list(config):
        bare = re.sub(r"^(aws|google|azure)_", "", k.lower())
        if bare in _CLIENT_KEYS:
            client[bare] = config.pop(k)
    for k in ("retry_timeout", "max_retries", "single_put_bytes"):
        config.pop(k, None)
    options: dict[str, Any] = {"config": config or None, "client_options": client or None}
    store = obstore.store.from_url(where.where, **options)
    return ObjectStore(store, read_only=True)


# obstore takes HTTP client settings apart from the provider's keys.
_CLIENT_KEYS = ("allow_http", "allow_invalid_certificates", "connect_timeout", "timeout",
                "proxy_url", "user_agent", "http1_only", "http2_only")


def check_recorded(root: Any, array: Any, name: str, where: str) -> None:
    """Raises ``ValueError`` saying why array ``name`` of the store at ``where`` is not one
    that a Recorder wrote (a Zarr v2 store, or another writer's array), instead of the
    ``KeyError`` of a missing per-row metadata array."""
    if "hostfeed" in array.attrs:
        return
    version = getattr(getattr(root, "metadata", None), "zarr_format", 3)
    why = (f"the store is Zarr v{version}, and hostfeed writes Zarr v3" if version != 3
           else "it has no 'hostfeed' attributes: another program wrote it")
    raise ValueError(f"hostfeed: the array {name!r} in {where} was not recorded by hostfeed "
                     f"({why}); read it with zarr-python directly")


def read_rows(array: Any, selection: Any, name: str, where: str) -> Any:
    """``array[selection]`` as numpy, a chunk that cannot be decoded (truncated, partly
    written, damaged) reported as a ``ValueError`` naming the array and the store."""
    import numpy as np
    try:
        return np.asarray(array[selection])
    except (ValueError, OSError, RuntimeError) as exc:
        raise ValueError(f"hostfeed: a chunk of {name!r} in {where} cannot be read: it is "
                         f"truncated or damaged ({type(exc).__name__}: {exc})") from exc


#: The file (in an object store, the object) of an open store's lock, in its root.
LOCK_NAME: str = _receiver.storage.LOCK_FILE


def writer_open(where: Location) -> bool:
    """Whether a recorder holds the store now (its lock taken: a file's ``flock``, an
    object store's lock object with a live lease), as its storage back-end says (the
    binding's ``store_held``); a store whose lock cannot be read is not held.

    Example:
        >>> writer_open(location("/tmp/no-such-recording.zarr"))
        False
    """
    return bool(_receiver.storage.store_held(where.where, url=where.url,
                                     storage_options=where.options))


#: Seconds within which a recorder announces every row it receives, on a file system:
#: the partial chunk written in place (only its new rows), then ``zarr.json`` replaced.
FILE_COMMIT_INTERVAL = 1.0
#: The same in an object store, which cannot append to an object: each announcement puts
#: the object holding an array's last rows again whole, with its per-row metadata and its
#: ``zarr.json``. Chosen so that rows of 1 KiB and more recorded at one row a second cost
#: under twice their bytes sent (``benches/object_bytes.py``); also TensorBoard's own
#: reload interval.
OBJECT_COMMIT_INTERVAL = 30.0


def commit_interval(value: Optional[float], where: Location) -> float:
    """A Recorder's ``commit_interval``: as given (seconds; ``None``: the store's default,
    :data:`FILE_COMMIT_INTERVAL` or :data:`OBJECT_COMMIT_INTERVAL`; ``inf``: announce at
    flushes only).

    Example:
        >>> commit_interval(None, location("/tmp/run.zarr")), commit_interval(5, location("/tmp/r"))
        (1.0, 5.0)
    """
    if value is None:
        return OBJECT_COMMIT_INTERVAL if where.url else FILE_COMMIT_INTERVAL
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) \
            or value < 0:
        raise ValueError(f"hostfeed.Recorder: commit_interval must be a number of seconds "
                         f"(>= 0; inf: announce rows at flushes only; None: "
                         f"{FILE_COMMIT_INTERVAL:g} on a file system, "
                         f"{OBJECT_COMMIT_INTERVAL:g} in an object store), got {value!r}")
    return float(value)
