"""Agreement between the processes of a ``jax.distributed`` run that record one store
through the key-value store and barriers of the coordination service that
``jax.distributed`` already runs (no files used as locks, no server of our own).

Under ``jax.distributed`` every process opens ``Recorder(path)`` on the same path. Process
0 (the *leader*) prepares the directory and takes the store's lock (shared, naming the
run); the others (*members*) join that lock once the leader published the run's id. Each
process writes the chunks of the parts (shards) its own devices hold (the core crate's
``record/recorder/parts.rs``) and publishes, per part, how many rows of each parted array
it has committed (data and per-row metadata on disk). The leader announces in
``zarr.json`` the rows that every part has committed (the minimum), so a reader never
sees a row some process has not
written. Keys, under ``hostfeed/recorder/<k>/`` (``k`` counts the shared recorders this
process opened; every process of the run opens them in the same order):

* ``run``: the leader's ``{"group": ..., "path": ...}`` (or ``{"error": ...}`` when it
  could not open the store, so that the members fail at once instead of waiting);
* ``decl/<name>``: the first declaration of an array (dtype, shape, layout); a process
  declaring it otherwise gets the clash error at its call site;
* ``writer/<name>``: the process that writes an unparted array (one writer per array);
* ``rows/<name>/<part>``: rows committed by the part's process.

``close()`` waits at two barriers (every process has flushed and published; the leader has
committed), each with a time limit: a process that died or raised mid-run makes the
others' ``close`` raise :class:`~hostfeed.RecordingError` after at most
``coordination_timeout`` seconds, with every row all processes committed in the store.

With one process the same code runs without the service (the counts are local).
"""
from __future__ import annotations

import logging
import itertools
import json
import os
import threading
import uuid
from typing import Any, Optional
from collections.abc import Callable

import jax

from ... import _receiver
from .. import compat

logger = logging.getLogger("hostfeed")

_opens = itertools.count()


def _err(message: str) -> _receiver.error.RecordingError:
    return _receiver.error.RecordingError(message)


class Coordinator:
    """The agreement of one recorder's processes (see the module documentation).

    Example:
        >>> c = Coordinator("/tmp/x.zarr", timeout=5.0)  # one process: no service needed
        >>> c.shared, c.leader
        (False, True)
    """

    def __init__(self, path: str, timeout: float):
        client = compat.distributed_client()
        self.processes = jax.process_count() if client is not None else 1
        self.process = jax.process_index() if client is not None else 0
        self.client: Any = client if self.processes > 1 else None
        self.shared = self.client is not None
        self.leader = self.process == 0
        self.path = path
        self.timeout_ms = max(1, int(timeout * 1000))
        self.prefix = f"hostfeed/recorder/{next(_opens)}" if self.shared else ""
        self._lock = threading.Lock()
        self._published: dict[tuple[str, int], int] = {}
        self._committed: dict[str, int] = {}
        self._claims: set[str] = set()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._hooks: list[Callable[[], None]] = []

    # ---- opening ---------------------------------------------------------------------

    def _key(self, *parts: Any) -> str:
        return "/".join([self.prefix, *map(str, parts)])

    def new_group(self) -> str:
        """The leader's id for this run (before it opens the store)."""
        return uuid.uuid4().hex

    def announce(self, group: Optional[str], error: Optional[str] = None) -> None:
        """The leader publishes the run (or why it could not open the store)."""
        if not self.shared:
            return
        value = {"error": error} if error is not None else {
            "group": group, "path": os.path.realpath(self.path)}
        self.client.key_value_set(self._key("run"), json.dumps(value))

    def join(self) -> str:
        """A member waits for the leader's run and returns its group id."""
        try:
            text = self.client.blocking_key_value_get(self._key("run"), self.timeout_ms)
        except Exception as exc:  # noqa: BLE001 - the service's error, reported as ours
            raise _err(f"hostfeed: Recorder({self.path!r}) in process {self.process}: "
                       f"process 0 did not open its recorder within "
                       f"{self.timeout_ms / 1000:g} s ({exc}); under jax.distributed every "
                       f"process opens the same Recorder(path) in the same order") from None
        run = json.loads(text)
        if "error" in run:
            raise _err(f"hostfeed: Recorder({self.path!r}) in process {self.process}: "
                       f"process 0 could not open the store: {run['error']}")
        mine = os.path.realpath(self.path)
        if run["path"] != mine:
            raise _err(f"hostfeed: Recorder({self.path!r}) in process {self.process} "
                       f"({mine}) is not the store process 0 opened ({run['path']}); every "
                       f"process of a jax.distributed run records to the same path")
        return str(run["group"])

    # ---- declarations ----------------------------------------------------------------

    def declare(self, name: str, description: dict) -> None:
        """Agrees on array ``name``'s layout; raises ``ValueError`` when another process
        declared it otherwise."""
        if not self.shared:
            return
        value = json.dumps(description, sort_keys=True)
        key = self._key("decl", name)
        try:
            self.client.key_value_set(key, value)
            return
        except Exception:  # noqa: BLE001 - already set: compare with it below
            pass
        first = self.client.blocking_key_value_get(key, self.timeout_ms)
        if first != value:
            raise ValueError(
                f"hostfeed: record name {name!r} was declared by another process of this "
                f"jax.distributed run as {first}, here (process {self.process}) as {value}; "
                f"every process records a name with one dtype, shape and sharding")

    def claim(self, name: str) -> None:
        """This process writes the unparted array ``name``; raises ``ValueError`` if
        another process of the run does."""
        if not self.shared or name in self._claims:
            return
        key = self._key("writer", name)
        try:
            self.client.key_value_set(key, str(self.process))
        except Exception:  # noqa: BLE001 - already claimed: by whom?
            owner = self.client.blocking_key_value_get(key, self.timeout_ms)
            if owner != str(self.process):
                raise ValueError(
                    f"hostfeed: record name {name!r} is written by process {owner} of this "
                    f"jax.distributed run; a value recorded by each process on its own "
                    f"(eagerly, or under jit on one of its devices) needs a name per "
                    f"process, e.g. f'{name}/p{{jax.process_index()}}' (a sharded value "
                    f"under jit, or a shard_map record, is one array for all processes)"
                ) from None
        self._claims.add(name)

    # ---- commits ---------------------------------------------------------------------

    def _collect(self) -> dict[tuple[str, int], int]:
        prefix = self._key("rows") + "/"
        try:
            entries = self.client.key_value_dir_get(prefix)
        except Exception:  # noqa: BLE001 - nothing published yet
            return {}
        out: dict[tuple[str, int], int] = {}
        for key, value in entries:
            name, _, part = key[len(prefix):].rpartition("/")
            out[(name, int(part))] = int(value)
        return out

    def add_commit_hook(self, hook: Callable[[], None]) -> None:
        """Runs ``hook`` first at every commit (a shared store's triggers, ``triggers.py``)."""
        self._hooks.append(hook)

    def commit(self, native: Any) -> None:
        """Publishes this process's committed rows of every parted array; the leader then
        announces the rows every part has committed. The commit hooks run first."""
        for hook in self._hooks:
            hook()
        with self._lock:
            names = list(native.parted_names())
            local = {name: list(native.parted_rows(name)) for name in names}
            if self.shared:
                for name, rows in local.items():
                    for part, n in enumerate(rows):
                        if n > self._published.get((name, part), 0):
                            self.client.key_value_set(self._key("rows", name, part), str(n),
                                                      allow_overwrite=True)
                            self._published[(name, part)] = n
            if not self.leader:
                return
            published = self._collect() if self.shared else {}
            for name, rows in local.items():
                agreed = min(max(n, published.get((name, p), 0)) for p, n in enumerate(rows))
                if agreed > self._committed.get(name, 0):
                    native.commit_parted(name, agreed)
                    self._committed[name] = agreed

    def start(self, native: Any, interval: float) -> None:
        """For a shared store, commits every ``interval`` seconds on a daemon thread (until
        :meth:`stop`); a store of one process has its parted arrays announced by the
        recorder's own live cycles."""
        if not self.shared or interval <= 0 or interval == float("inf"):
            return

        def run() -> None:
            while not self._stop.wait(interval):
                try:
                    self.commit(native)
                except Exception as exc:  # noqa: BLE001 - logged; close reports the state
                    logger.warning("hostfeed: periodic commit of %s: %s",
                                            self.path, exc)

        self._thread = threading.Thread(target=run, name="hostfeed-coordinator", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    def _barrier(self, what: str, step: str) -> None:
        try:
            self.client.wait_at_barrier(self._key("barrier", step), self.timeout_ms)
        except Exception as exc:  # noqa: BLE001 - reported below with what the store holds
            raise _err(
                f"hostfeed: Recorder({self.path!r}).close() in process {self.process}: not "
                f"every process of the run {what} within {self.timeout_ms / 1000:g} s "
                f"(one died, raised or hangs: {str(exc).splitlines()[0] if str(exc) else exc}"
                f"); the store holds every row all processes committed"
                f"{self._holdings()}") from None

    def _holdings(self) -> str:
        if not self._committed:
            return ""
        return " (" + ", ".join(f"{n}: {r} rows" for n, r in sorted(self._committed.items())) \
            + ")"

    def close(self, native: Any) -> None:
        """After this process's final flush: publishes, waits for every process, lets the
        leader commit, waits again. Raises RecordingError when a process is missing or
        the processes wrote different numbers of rows (the store holds what all wrote)."""
        self.stop()
        self.commit(native)
        if not self.shared:
            return
        try:
            self._barrier("reached close()", "flushed")
        except _receiver.error.RecordingError:
            if self.leader:
                self.commit(native)
            raise
        mismatch = self._mismatch(native)
        self.commit(native)
        self._barrier("finished close()", "committed")
        if mismatch:
            raise _err(f"hostfeed: Recorder({self.path!r}): the processes of the run "
                       f"recorded different numbers of rows ({mismatch}: a process stopped "
                       f"recording early); the store holds the rows every process wrote"
                       f"{self._holdings()}")

    def _mismatch(self, native: Any) -> str:
        published = self._collect()
        out = []
        for name in native.parted_names():
            counts = {p: published.get((name, p), 0)
                      for p in range(len(native.parted_rows(name)))}
            if len(set(counts.values())) > 1:
                out.append(f"{name}: " + ", ".join(f"part {p} {n}" for p, n in counts.items()))
        return "; ".join(out)
