"""Triggers shared by the processes of a ``jax.distributed`` run: a trigger fired in one
process makes every process write its window for the same steps, through the key-value
store of the coordination service that ``jax.distributed`` runs (the recorder's
coordinator, :mod:`.coordination`; no channel of our own). Keys, under the recorder's
prefix (``hostfeed/recorder/<k>/``):

* ``trigger/<n>``: the ``n``-th trigger of the run (its description, JSON), ``n`` taken by
  the first process to set the key (a key set twice is refused);
* ``kept/<uid>/<process>``: what a process kept for trigger ``uid`` (the arrays' steps,
  and whether they are written), which process 0 lists in the store's document.

Two threads per recorder: one publishes this process's triggers as they fire (it waits
on the core's window with the GIL released), one waits on the next key (the service's
blocking get, GIL released) and has the core write this process's window for it. Every
flush (and the coordinator's periodic commit) also publishes and reads, so that a process
that flushes after another published knows of its trigger. A process that has recorded
more than ``window`` steps past a trigger's first step by the time it learns of it (a
few milliseconds, or its next flush) has lost those steps: its kept steps say which.
"""
from __future__ import annotations

import json
import logging
import threading
from typing import Any, Optional

logger = logging.getLogger("hostfeed")

__all__ = ["Exchange"]

#: How long each blocking wait lasts (a stop is seen within it).
SLICE_MS = 500


class Exchange:
    """One shared recorder's triggers, published and applied (see the module
    documentation)."""

    def __init__(self, native: Any, coord: Any):
        self.native = native
        self.coord = coord
        self.client = coord.client
        self.prefix = coord._key("trigger")
        self.kept_prefix = coord._key("kept")
        self._lock = threading.Lock()
        self._next = 0  # the next trigger key to read
        self._sent_parts: dict[str, str] = {}
        self._stop = threading.Event()
        coord.add_commit_hook(self.sync)
        self._threads = [threading.Thread(target=run, name=name, daemon=True)
                         for run, name in ((self._publish_loop, "hostfeed-triggers-out"),
                                           (self._listen_loop, "hostfeed-triggers-in"))]
        for t in self._threads:
            t.start()

    # ---- publishing -------------------------------------------------------------------

    def publish(self, description: str) -> None:
        """Sets the first free ``trigger/<n>`` key to ``description``."""
        n = self._next
        while True:
            try:
                self.client.key_value_set(f"{self.prefix}/{n}", description)
                return
            except Exception as exc:  # a key taken: the next one; anything else is raised
                if "ALREADY_EXISTS" not in str(exc) and "already exists" not in str(exc):
                    raise
                n += 1

    def _publish_loop(self) -> None:
        while not self._stop.is_set():
            try:
                for description in self.native.take_unpublished_triggers(SLICE_MS / 1000):
                    self.publish(description)
            except Exception as exc:  # noqa: BLE001 - logged; the next flush tries again
                if not self._stop.is_set():
                    logger.warning("hostfeed: publishing a trigger to the other processes: %s",
                                   exc)
                    self._stop.wait(SLICE_MS / 1000)

    def wake(self) -> None:
        """A trigger fired from Python: published at once (not only by the thread)."""
        for description in self.native.take_unpublished_triggers(0.0):
            self.publish(description)

    # ---- applying ---------------------------------------------------------------------

    def _apply(self, n: int, description: str) -> None:
        with self._lock:
            if n < self._next:
                return
            self._next = n + 1
        if self.native.apply_remote_trigger(description):
            trigger = json.loads(description)
            logger.warning("hostfeed: process %s fired a trigger at step %s (%s): this process "
                           "(%s) writes its window of steps %s..%s", trigger.get("process"),
                           trigger.get("step"), trigger.get("reason"), self.coord.process,
                           trigger.get("first_step"), trigger.get("last_step"))

    def _listen_loop(self) -> None:
        while not self._stop.is_set():
            n = self._next
            try:
                description = self.client.blocking_key_value_get(f"{self.prefix}/{n}", SLICE_MS)
            except Exception as exc:  # noqa: BLE001 - not set yet, or the service went away
                if "DEADLINE_EXCEEDED" not in str(exc):
                    self._stop.wait(SLICE_MS / 1000)  # (no busy loop on a service gone)
                continue
            try:
                self._apply(n, description)
            except Exception as exc:  # noqa: BLE001 - logged; the next flush applies it
                logger.warning("hostfeed: applying another process's trigger: %s", exc)

    def _read_new(self) -> None:
        try:
            entries = self.client.key_value_dir_get(self.prefix + "/")
        except Exception:  # noqa: BLE001 - none yet
            return
        found = sorted((int(k.rsplit("/", 1)[1]), v) for k, v in entries
                       if k.rsplit("/", 1)[1].isdigit())
        for n, description in found:
            self._apply(n, description)

    # ---- at every commit --------------------------------------------------------------

    def sync(self) -> None:
        """Publishes this process's triggers and what it kept for each, applies the others'
        triggers; process 0 merges what every process kept (for the store's document)."""
        self.wake()
        self._read_new()
        for uid, part in self.native.trigger_parts():
            if self._sent_parts.get(uid) != part:
                self.client.key_value_set(f"{self.kept_prefix}/{uid}/{self.coord.process}",
                                          part, allow_overwrite=True)
                self._sent_parts[uid] = part
        if not self.coord.leader:
            return
        try:
            entries = self.client.key_value_dir_get(self.kept_prefix + "/")
        except Exception:  # noqa: BLE001 - none yet
            return
        for key, part in entries:
            uid, _, process = key[len(self.kept_prefix) + 1:].rpartition("/")
            if process.isdigit():
                self.native.merge_trigger_part(uid, int(process), part)

    def stop(self, timeout: Optional[float] = None) -> None:
        """Stops the threads (each within :data:`SLICE_MS`)."""
        self._stop.set()
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(timeout)
