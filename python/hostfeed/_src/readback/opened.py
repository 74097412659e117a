"""Reading a recording back as data: :func:`open_recording` (names, shapes, steps; each
array a random-access source for Grain or PyTorch, and shuffled batches with bounded
memory) and :func:`follow` (the rows a running writer commits, as they come).

Reads go through zarr-python, a chunk at a time: a row asked for alone reads (and keeps,
for the next rows) the whole chunk that holds it (an inner chunk of a shard: zarr-python
reads it from the shard by its index), so reading in order reads each chunk once, and a
batch of indices reads each chunk it touches once.
"""
from __future__ import annotations

import collections
import concurrent.futures
import math
import os
import time
from typing import Any, Optional, TypeVar, Union
from collections.abc import Callable, Iterator, Mapping

import numpy as np

from .. import settings
from ..record import stores
from .reading import diagnose, node, open_root, recorded_names, zarr_module
from ..record.unflushed import warn_if_unflushed
from ..record.roles import ROW_METADATA
from . import triggers as _triggers

__all__ = ["Recording", "RecordedArray", "open_recording", "follow"]

#: Chunks a RecordedArray keeps decoded (the last ones read).
CACHED_CHUNKS = 4
#: Threads reading the next window's chunks in iter_batches (a disk serves several reads
#: at once faster than one).
READERS = 4


class RecordedArray:
    """The rows of one recorded array: a random-access source (``len``, ``[i]``,
    ``[a:b]``, ``[[i, j, ...]]``) that reads whole chunks, usable as a Grain data source
    (``grain.MapDataset.source(arr)``) or a PyTorch map-style dataset. Its length is the
    rows committed when it was opened (:meth:`refresh` looks again).

    Example:
        >>> arr = open_recording("run.zarr")["layer1/h"]      # doctest: +SKIP
        >>> len(arr), arr.shape, arr[0].shape, arr[[5, 1]].shape  # doctest: +SKIP
        (100, (100, 64, 32), (64, 32), (2, 64, 32))
    """

    def __init__(self, group: Any, name: str, where: str = "the store"):
        self.name = name
        self._group = group
        self._where = where
        self.refresh()

    def refresh(self) -> int:
        """Reads the array's metadata again (rows a writer committed since); returns the
        number of rows."""
        self._array = node(self._group, self.name, self._where, "hostfeed.RecordedArray")
        self.shape: tuple[int, ...] = tuple(self._array.shape)
        self.dtype = np.dtype(self._array.dtype)
        self.chunk_rows = int(self._array.chunks[0]) or 1
        self._cache: collections.OrderedDict[int, np.ndarray] = collections.OrderedDict()
        self.chunk_reads = 0
        return self.shape[0]

    @property
    def attrs(self) -> dict:
        """hostfeed's attributes of the array (``reduce``: what a summary's columns are)."""
        return dict(self._array.attrs.get("hostfeed", {}))

    def meta(self, field: str, rows: Optional[slice] = None) -> np.ndarray:
        """Per-row metadata ``field`` (one of ``hostfeed.Recorder``'s ``ROW_METADATA``:
        ``step``, ``device``, ``time_ns``, ``seq``, ``transforms``) of these rows (or of
        ``rows``, a slice of them)."""
        if field not in ROW_METADATA:
            raise KeyError(f"hostfeed: no per-row metadata {field!r}; there are "
                           f"{list(ROW_METADATA)}")
        parent, _, leaf = self.name.rpartition("/")
        group = self._group[parent] if parent else self._group
        rows = slice(0, len(self)) if rows is None else slice(*rows.indices(len(self)))
        return stores.read_rows(group[f"{leaf}.{field}"], rows,
                                f"{self.name}.{field}", self._where)

    @property
    def steps(self) -> np.ndarray:
        """The step of each row (-1: recorded without one)."""
        return self.meta("step")

    def __len__(self) -> int:
        return self.shape[0]

    def _chunk(self, k: int) -> np.ndarray:
        got = self._cache.get(k)
        if got is not None:
            self._cache.move_to_end(k)
            return got
        lo = k * self.chunk_rows
        got = stores.read_rows(self._array, slice(lo, min(lo + self.chunk_rows, len(self))),
                               self.name, self._where)
        self.chunk_reads += 1
        self._cache[k] = got
        if len(self._cache) > CACHED_CHUNKS:
            self._cache.popitem(last=False)
        return got

    def _read_runs(self, ks: Any) -> list[tuple[int, int]]:
        """The row ranges holding chunks ``ks``, in increasing order, adjacent chunks
        merged (one zarr-python slice read each)."""
        runs: list[tuple[int, int]] = []
        for k in sorted(int(k) for k in ks):
            lo, hi = k * self.chunk_rows, min((k + 1) * self.chunk_rows, len(self))
            if runs and runs[-1][1] == lo:
                runs[-1] = (runs[-1][0], hi)
            else:
                runs.append((lo, hi))
        self.chunk_reads += len(list(ks))
        return runs

    def _read(self, lo: int, hi: int) -> np.ndarray:
        return stores.read_rows(self._array, slice(lo, hi), self.name, self._where)

    def _rows(self, index: np.ndarray) -> np.ndarray:
        n = len(self)
        if index.size and (index.min() < -n or index.max() >= n):
            bad = index[(index < -n) | (index >= n)][0]
            raise IndexError(f"hostfeed: row {bad} of {self.name!r}, which has {n} rows")
        index = np.where(index < 0, index + n, index)
        out = np.empty((index.size, *self.shape[1:]), self.dtype)
        chunks = index // self.chunk_rows
        for k in np.unique(chunks):
            at = np.nonzero(chunks == k)[0]
            out[at] = self._chunk(int(k))[index[at] - k * self.chunk_rows]
        return out

    def __getitem__(self, key: Union[int, slice, Any]) -> np.ndarray:
        if isinstance(key, (int, np.integer)):
            return self._rows(np.asarray([int(key)]))[0]
        if isinstance(key, slice):
            return self._rows(np.arange(*key.indices(len(self))))
        index = np.asarray(key)
        if index.dtype == bool:
            index = np.nonzero(index)[0]
        if index.dtype.kind not in "iu":
            raise TypeError(f"hostfeed: rows of {self.name!r} are indexed by ints, slices or "
                            f"int arrays, got {key!r}")
        return self._rows(index.ravel().astype(np.int64)).reshape(*index.shape,
                                                                   *self.shape[1:])

    def __getitems__(self, keys: Any) -> list[np.ndarray]:
        """Rows ``keys`` as a list (what Grain's and PyTorch's batching ask for), each chunk
        read once."""
        return list(self._rows(np.asarray(keys, np.int64).ravel()))

    def __repr__(self) -> str:
        return f"hostfeed.RecordedArray({self.name!r}, shape={self.shape}, dtype={self.dtype})"


class Recording:
    """A recording opened for reading (see :func:`open_recording`)."""

    def __init__(self, path: Any, storage_options: Optional[Mapping[str, Any]]):
        who = "hostfeed.open_recording"
        self.where = stores.location(path, storage_options, who="open_recording")
        self.path = self.where.where
        self._root: Any = open_root(self.where, who)
        self.names: list[str] = sorted(recorded_names(self._root, self.where, who))
        warn_if_unflushed(self.where, "hostfeed.open_recording", stacklevel=4)

    def __getitem__(self, name: str) -> RecordedArray:
        if name not in self.names:
            import difflib
            near = difflib.get_close_matches(name, self.names, n=20, cutoff=0.0)
            raise KeyError(f"hostfeed: the recording {self.path} has no array {name!r}; it "
                           f"has {near or 'none'} (nearest first)")
        stores.check_recorded(self._root, self._root[name], name, self.path)
        return RecordedArray(self._root, name, self.path)

    def __contains__(self, name: object) -> bool:
        return name in self.names

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def table(self) -> list[dict[str, Any]]:
        """One entry per array: name, rows, row shape, dtype, bytes (uncompressed), first
        and last step, and what a summary holds (``reduce``)."""
        out = []
        for name in self.names:
            a = self[name]
            steps = a.steps if len(a) else np.zeros(0, np.int64)
            out.append(dict(name=name, rows=len(a), shape=a.shape[1:], dtype=str(a.dtype),
                            bytes=int(math.prod(a.shape) * a.dtype.itemsize),
                            steps=(int(np.min(steps)), int(np.max(steps))) if steps.size else None,
                            reduce=a.attrs.get("reduce", {}).get("kind")))
        return out

    @property
    def triggers(self) -> list[dict]:
        """The triggers the recorders of this store fired (``Recorder(window=...,
        on_nonfinite=..., on_trigger=...)``, ``watch``, ``keep``; an appended run's after
        the earlier ones'), in order: dicts with ``step``, ``reason``, ``name`` (the array
        or watched value that fired it; None for ``keep``), ``kind`` (``nonfinite``,
        ``watch``, ``keep``), ``process``, ``time_ns``, ``first_step``..``last_step`` (the
        steps its window covers), ``kept`` ({array: [steps written]}), ``state``
        (``"written"``; ``"writing"`` where the process ended before the window was
        whole) and ``missing`` ({array: [steps it kept that the array does not hold]}:
        empty but for a window a killed process cut short)."""
        return _triggers.listed(self)

    def iter_batches(self, name: str, batch_size: int, *, shuffle: bool = True,
                     seed: int = 0, flatten_axes: int = 0, window: int = 8,
                     drop_last: bool = False) -> Iterator[np.ndarray]:
        """Batches of ``batch_size`` rows of ``name``, every row once (one epoch).

        With ``shuffle``, the chunks are taken in a random order, ``window`` at a time (read
        in one call), and the rows of a window shuffled together (those left over go into
        the next window's first batch), so memory holds about ``window`` chunks and reads
        stay whole chunks.
        ``flatten_axes=k`` first merges the row axis with the next ``k`` axes (``1`` for
        rows of ``[sequence, d]``: batches of tokens, shuffled across sequences).

        Example:
            >>> rec = open_recording("run.zarr")                       # doctest: +SKIP
            >>> for batch in rec.iter_batches("layer1/h", 4096, flatten_axes=1, seed=0):
            ...     train_step(batch)                                 # doctest: +SKIP
        """
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) \
                or batch_size < 1:
            raise ValueError(f"hostfeed: iter_batches: batch_size must be a positive int, "
                             f"got {batch_size!r}")
        shuffle = settings.flag(shuffle, "hostfeed: iter_batches: shuffle")
        drop_last = settings.flag(drop_last, "hostfeed: iter_batches: drop_last")
        arr = self[name]
        if not 0 <= flatten_axes < len(arr.shape):
            raise ValueError(f"hostfeed: iter_batches: flatten_axes must be from 0 to "
                             f"{len(arr.shape) - 1} for rows of shape {arr.shape[1:]}, got "
                             f"{flatten_axes!r}")
        if window < 1:
            raise ValueError(f"hostfeed: iter_batches: window must be >= 1, got {window!r}")
        # Checked above, at the call; the batches come from a generator.
        return self._epoch(arr, batch_size, shuffle, seed, flatten_axes, window, drop_last)

    def _epoch(self, arr: RecordedArray, batch_size: int, shuffle: bool, seed: int,
               flatten_axes: int, window: int, drop_last: bool) -> Iterator[np.ndarray]:
        """The batches of :meth:`iter_batches` (its arguments checked)."""
        rng = np.random.default_rng(seed)
        chunks = np.arange(math.ceil(len(arr) / arr.chunk_rows))
        if shuffle:
            rng.shuffle(chunks)
        item = arr.shape[1 + flatten_axes:]
        windows = [chunks[w:w + window] for w in range(0, len(chunks), window)]
        # The next window is read on threads (a read per run of adjacent chunks) while this
        # one's batches are gathered (file reads and numpy's copies release the GIL): memory
        # holds two windows.
        pool = concurrent.futures.ThreadPoolExecutor(READERS, thread_name_prefix="hostfeed-read")

        def submit(ws: Any) -> list:
            return [pool.submit(arr._read, lo, hi) for lo, hi in arr._read_runs(ws)]

        ahead = [submit(windows[0])] if windows else []
        try:
            yield from self._batches(windows, ahead, submit, item, batch_size, shuffle, rng,
                                     drop_last)
        finally:
            for futures in ahead:
                for f in futures:
                    f.cancel()
            pool.shutdown(wait=True)

    @staticmethod
    def _batches(windows: list, ahead: list, submit: Any, item: tuple, batch_size: int,
                 shuffle: bool, rng: Any, drop_last: bool) -> Iterator[np.ndarray]:
        carry: Optional[np.ndarray] = None
        for w in range(len(windows)):
            parts = [f.result() for f in ahead.pop(0)]
            if w + 1 < len(windows):
                ahead.append(submit(windows[w + 1]))
            rows = (parts[0] if len(parts) == 1 else np.concatenate(parts)).reshape(-1, *item)
            order = rng.permutation(len(rows)) if shuffle else np.arange(len(rows))
            pos = 0
            if carry is not None:  # the last window's rows that did not fill a batch
                pos = min(batch_size - len(carry), len(rows))
                carry = np.concatenate([carry, rows[order[:pos]]])
                if len(carry) < batch_size:
                    continue
                yield carry
                carry = None
            full = pos + (len(rows) - pos) // batch_size * batch_size
            for b in range(pos, full, batch_size):
                yield rows[order[b:b + batch_size]] if shuffle else rows[b:b + batch_size]
            carry = rows[order[full:]] if full < len(rows) else None
        if carry is not None and not drop_last:
            yield carry

    def __repr__(self) -> str:
        return f"hostfeed.Recording({self.path!r}, {len(self.names)} arrays)"


def open_recording(path: Any, *, storage_options: Optional[Mapping[str, Any]] = None
                   ) -> Recording:
    """Opens a recording (a directory, or an object store's URL with ``storage_options``
    as :class:`Recorder` takes them) for reading: ``rec.names``, ``rec.table()``,
    ``rec[name]`` (a :class:`RecordedArray`: ``len``, indexing, a Grain or PyTorch data
    source) and ``rec.iter_batches(name, batch_size, ...)``. Needs zarr-python.

    Example:
        >>> import pathlib, tempfile, numpy as np, hostfeed
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "run.zarr"
        >>> with hostfeed.Recorder(path, mode="w") as rec:
        ...     for step in range(5):
        ...         _ = rec.record("h", np.full(3, step, np.float32), step=step)
        >>> r = hostfeed.open_recording(path)
        >>> r.names, len(r["h"]), r["h"][[4, 0]][:, 0].tolist()
        (['h'], 5, [4.0, 0.0])
    """
    return Recording(path, storage_options)


#: Whether a recorder holds a store (``stores.writer_open``; a name here, for the tests).
_writer_open = stores.writer_open


def follow(path: Any, name: str, *, poll: float = 0.5, timeout: Optional[float] = None,
           storage_options: Optional[Mapping[str, Any]] = None) -> Iterator[np.ndarray]:
    """The rows of ``name`` as a running recorder commits them: yields each new block of
    rows (``[k, *shape]``) once, polling the array's ``zarr.json`` every ``poll`` seconds,
    and ends when the writer closes the store (after yielding its last rows). Waits for the
    store and the array to appear. ``timeout``: at most that many seconds in all, then
    ``TimeoutError``. A store that cannot be read twice in a row, a directory that is no
    recording, or a store deleted while it is followed is an error at once.

    Example:
        >>> for rows in hostfeed.follow("run.zarr", "loss"):        # doctest: +SKIP
        ...     plot(rows)
    """
    where = stores.location(path, storage_options, who="follow")
    done = 0

    def take(root: Any) -> Optional[list[np.ndarray]]:
        nonlocal done
        try:
            arr = root[name]
        except KeyError:  # not there yet
            return None
        n = int(arr.shape[0])
        if n <= done:
            return []
        rows = stores.read_rows(arr, slice(done, n), name, where.where)
        done = n
        return [rows]

    yield from follow_store(where, take, who=f"hostfeed.follow({where.where!r}, {name!r})",
                            poll=poll, timeout=timeout, progress=lambda: f"{done} rows seen")


_T = TypeVar("_T")


def follow_store(where: stores.Location, take: Callable[[Any], Optional[list[_T]]], *,
                 who: str, poll: float, timeout: Optional[float],
                 progress: Callable[[], str]) -> Iterator[_T]:
    """The loop of :func:`follow` and ``to_tensorboard(follow=True)``: looks at the store
    every ``poll`` seconds and yields what ``take(root)`` finds new in its root group (a
    list, empty when nothing is; ``None`` while what is followed is not there yet), until
    the writer has closed the store and a last look found nothing new.

    Raises ``TimeoutError`` after ``timeout`` seconds in all, and at once: ``ValueError``
    where the store cannot be read twice in a row with the same error (a recorder replaces
    each ``zarr.json`` whole, so that is damage, not a write in progress) or where a local
    directory holds files but no store and no recorder is writing it; ``FileNotFoundError``
    where the store is deleted while it is followed. ``who`` begins the messages,
    ``progress()`` says how far it got (``"5 rows seen"``)."""
    zarr = zarr_module(who)
    deadline = None if timeout is None else time.monotonic() + timeout
    seen = False  # the store was there once
    settled = False  # the last read came after a look that found nobody writing
    unreadable: Optional[str] = None  # the error of the last read, if it failed
    while True:
        writing = _writer_open(where)  # before reading: rows committed by then are seen
        found: Optional[list[_T]] = None
        try:
            try:
                root = zarr.open_group(stores.zarr_store(where), mode="r")
            except FileNotFoundError:
                root = None
            if root is not None:
                found = take(root)
            unreadable = None
        except (ValueError, OSError, KeyError) as exc:
            root = None
            if isinstance(exc, (FileNotFoundError, PermissionError)) and seen and \
                    not where.url and not os.path.exists(where.where):
                raise FileNotFoundError(f"{who}: the store was deleted while it was "
                                        f"followed ({progress()}; {exc})") from exc
            if unreadable is not None and str(exc) == unreadable:
                if not where.url:  # what is wrong there, said as open_recording says it
                    why = diagnose(where.where, who)
                    if why is not None:
                        raise why from exc
                raise ValueError(f"{who}: the store cannot be read ({type(exc).__name__}: "
                                 f"{exc})") from exc
            unreadable = str(exc)
        if root is None and unreadable is None:
            if seen:
                raise FileNotFoundError(f"{who}: the store was deleted while it was "
                                        f"followed ({progress()})")
            if not writing and _not_a_store(where):
                raise ValueError(f"{who}: the path is not a recording (a directory with "
                                 f"files but no zarr.json), and no recorder is writing it")
        seen = seen or root is not None
        if found:
            yield from found
            settled = False
            continue
        if not writing and found is not None:
            # Nobody held the store before the read. Ended, unless a writer opened it
            # between that look and the read (a run starting: its array there, its rows to
            # come): then it holds the store now, and is followed. Else one more read after
            # this second look, which sees the rows of a writer that came and went since the
            # first.
            if _writer_open(where):
                settled = False
                continue
            if not settled:
                settled = True
                continue
            return
        settled = False
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"{who}: no writer closed the store within {timeout} s "
                               f"({progress()})")
        time.sleep(poll)


def _not_a_store(where: stores.Location) -> bool:
    """Whether a local path is a directory with files of its own but no store's root: no
    recorder's store, not one about to be (a recorder's lock comes first, then zarr.json)."""
    if where.url or not os.path.isdir(where.where):
        return False
    names = set(os.listdir(where.where)) - {stores.LOCK_NAME}
    return bool(names) and "zarr.json" not in names
