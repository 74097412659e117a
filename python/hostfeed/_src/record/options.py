"""A Recorder's options, checked once: :func:`options` turns what ``hostfeed.Recorder(...)``
is given into :class:`Options` (a clear ``ValueError`` or ``TypeError`` at the call,
before anything is opened or written), with each store kind's defaults applied; the
binding's recorder takes them as they are (:meth:`Options.native`) and checks nothing
again."""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from .. import settings
from . import stores, window as _window

__all__ = ["Options", "options", "MODES", "COMPRESSIONS", "SEPARATORS"]

#: ``mode=``: create (fail if the path exists and is not empty), replace an earlier
#: recording, append to one; ``"x"`` is ``"w-"`` (zarr's spelling).
MODES = {"w-": "create", "x": "create", "w": "overwrite", "a": "append"}
#: ``compression=``: none (also ``"none"``, ``"raw"``) or zstd.
COMPRESSIONS = (None, "zstd")
#: ``compression_level=`` of zstd.
ZSTD_LEVELS = range(-7, 23)
#: ``separator=``: chunk keys in nested directories or flat.
SEPARATORS = ("/", ".")
#: The most seconds an interval or a lease may be (beyond: ``inf``, never).
MAX_SECONDS = 1e9
#: Shards of an object store's arrays unless ``shard_bytes`` says otherwise.
DEFAULT_OBJECT_SHARD_BYTES = 256 << 20
#: Writer threads of a recorder in an object store, unless told otherwise.
OBJECT_STORE_WRITERS = 4


@dataclass(frozen=True)
class Options:
    """A recorder's options, checked (see ``hostfeed.Recorder`` for each): where the store
    is (``where``), ``mode`` (``"create"``, ``"overwrite"``, ``"append"``), the zstd level
    (None: uncompressed), the store kind's defaults applied (``writers``,
    ``commit_interval``, ``shard_bytes``), and the window (None: none)."""

    where: stores.Location
    mode: str
    zstd_level: Optional[int]
    chunk_bytes: int
    writers: int
    durable: bool
    commit_interval: float
    separator: str
    coordination_timeout: float
    lease: float
    resume_after_step: Optional[int]
    shard_bytes: Optional[int]
    window: Optional[_window.WindowConfig]

    def native(self) -> dict[str, Any]:
        """The keyword arguments of the binding's ``Recorder`` (but ``shared``, ``leader``)."""
        return dict(mode=self.mode, zstd_level=self.zstd_level, chunk_bytes=self.chunk_bytes,
                    writers=self.writers, durable=self.durable,
                    commit_interval=(None if math.isinf(self.commit_interval)
                                     else self.commit_interval),
                    separator=self.separator, url=self.where.url,
                    storage_options=self.where.options, lease=self.lease,
                    resume_after_step=self.resume_after_step, shard_bytes=self.shard_bytes)


def _int(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, np.integer))


def _seconds(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float, np.integer,
                                                               np.floating))


def options(path: Any, *, mode: Any = "w-", compression: Any = None,
            compression_level: Any = 1, chunk_bytes: Any = 16 << 20, writers: Any = None,
            durable: Any = False, commit_interval: Any = None, separator: Any = "/",
            coordination_timeout: Any = 60.0,
            storage_options: Optional[Mapping[str, Any]] = None, lease: Any = 60.0,
            resume_after_step: Any = None, shard_bytes: Any = None, window: Any = None,
            window_bytes: Any = None, after: Any = 0, on_nonfinite: Any = False,
            on_trigger: Any = None) -> Options:
    """``hostfeed.Recorder``'s arguments, checked, as :class:`Options`.

    Example:
        >>> o = options("/tmp/run.zarr", compression="zstd", compression_level=3)
        >>> o.mode, o.zstd_level, o.writers, o.commit_interval, o.shard_bytes
        ('create', 3, 2, 1.0, None)
        >>> options("/tmp/run.zarr", separator=":")
        Traceback (most recent call last):
        ...
        ValueError: hostfeed.Recorder: separator must be "/" (chunk keys in nested...
    """
    flight = _window.config(window, window_bytes, after, on_nonfinite, on_trigger)
    if not _seconds(coordination_timeout) or not math.isfinite(coordination_timeout) \
            or coordination_timeout <= 0:
        raise ValueError(f"hostfeed.Recorder: coordination_timeout must be a positive, "
                         f"finite number of seconds, got {coordination_timeout!r}")
    # Checked wherever the store is (it matters only in an object store), so that a
    # wrong value is not found out only when the same code first writes to one.
    if not _seconds(lease) or not 0.1 <= lease <= MAX_SECONDS:
        raise ValueError(f"hostfeed.Recorder: lease must be a finite number of seconds, "
                         f"at least 0.1; got {lease!r}")
    if not isinstance(mode, str) or mode not in MODES:
        raise ValueError(f"hostfeed.Recorder: mode must be \"w-\" (create; fail if the path "
                         f"exists), \"w\" (replace an earlier recording) or \"a\" (append to "
                         f"one), got {mode!r}")
    if resume_after_step is not None:
        if not _int(resume_after_step):
            raise TypeError(f"hostfeed.Recorder: resume_after_step must be an int (a step), "
                            f"got {resume_after_step!r}")
        if MODES[mode] != "append":
            raise ValueError("hostfeed.Recorder: resume_after_step goes with mode=\"a\" (it "
                             "drops rows of the recording appended to)")
    level = _compression(compression, compression_level)
    if not isinstance(separator, str) or separator not in SEPARATORS:
        raise ValueError(f"hostfeed.Recorder: separator must be \"/\" (chunk keys in nested "
                         f"directories) or \".\" (flat), got {separator!r}")
    if not _int(chunk_bytes) or chunk_bytes < 1:
        raise ValueError(f"hostfeed.Recorder: chunk_bytes must be a positive number of "
                         f"bytes, got {chunk_bytes!r}")
    where = stores.location(path, storage_options)
    interval = stores.commit_interval(commit_interval, where)
    if interval > MAX_SECONDS and not math.isinf(interval):
        raise ValueError(f"hostfeed.Recorder: commit_interval must be at most "
                         f"{MAX_SECONDS:.0e} seconds, or inf (announce rows at flushes "
                         f"only), got {commit_interval!r}")
    return Options(where, MODES[mode], level, int(chunk_bytes), _writers(writers, where.url),
                   settings.flag(durable, "hostfeed.Recorder: durable"), interval, separator,
                   float(coordination_timeout), float(lease),
                   None if resume_after_step is None else int(resume_after_step),
                   _shard_bytes(shard_bytes, where.url), flight)


def _compression(compression: Any, level: Any) -> Optional[int]:
    """The zstd level ``compression`` and ``compression_level`` say; None: uncompressed."""
    if compression in (None, "none", "raw"):
        return None
    if compression != "zstd":
        raise ValueError(f"hostfeed.Recorder: compression must be None or \"zstd\", got "
                         f"{compression!r}")
    if not _int(level) or level not in ZSTD_LEVELS:
        raise ValueError(f"hostfeed.Recorder: compression_level must be an int from "
                         f"{ZSTD_LEVELS.start} to {ZSTD_LEVELS.stop - 1} (zstd's levels), got "
                         f"{level!r}")
    return int(level)


def _shard_bytes(shard_bytes: Any, url: bool) -> Optional[int]:
    """The shard size, or None for a chunk per object."""
    if shard_bytes is None:
        return DEFAULT_OBJECT_SHARD_BYTES if url else None
    if not _int(shard_bytes) or shard_bytes < 0:
        raise ValueError(f"hostfeed.Recorder: shard_bytes must be a number of bytes (0: no "
                         f"shards), got {shard_bytes!r}")
    return int(shard_bytes) or None


def _writers(writers: Any, url: bool) -> int:
    """Writer threads: as given, else 4 for an object store (they wait on the network) and
    2 for a file system."""
    if writers is None:
        return OBJECT_STORE_WRITERS if url else 2
    if not _int(writers) or writers < 1:
        raise ValueError(f"hostfeed.Recorder: writers must be a positive number of threads, "
                         f"got {writers!r}")
    return int(writers)
