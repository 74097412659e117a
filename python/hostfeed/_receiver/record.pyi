"""``hostfeed._receiver.record``: the recorder (``record.rs``): the ``Recorder`` that
``hostfeed.Recorder`` wraps, the fork hook, the writes on the profiler's timeline, rows that
reached a closed recorder.
"""
from os import PathLike
from typing import Any, final


__all__ = [
    "Recorder", "after_fork_in_child", "take_late_drops", "write_tracing",
]

@final
class Recorder:
    """A Zarr v3 store that recorded values are written to by Rust threads (wrapped by
    ``hostfeed.Recorder``)."""

    def __new__(
        cls,
        path: str | PathLike[str],
        *,
        mode: str,
        zstd_level: int | None,
        chunk_bytes: int,
        writers: int,
        durable: bool,
        commit_interval: float | None,
        separator: str,
        url: bool,
        storage_options: list[tuple[str, str]],
        lease: float,
        resume_after_step: int | None,
        shard_bytes: int | None,
        shared: str | None = None,
        leader: bool = True,
    ) -> Recorder:
        """Creates the store at ``path`` and starts its writer threads, with
        ``hostfeed.Recorder``'s options as Python checked them (``Options.native()``:
        ``mode`` ``"create"``, ``"overwrite"`` or ``"append"``; ``zstd_level`` None for
        uncompressed chunks; ``commit_interval`` None for commits at flushes only).
        ``shared``: the run id of a store shared by the processes of a jax.distributed
        run (the leader prepares it; members join). ``url``: ``path`` is the URL of an
        object store (``s3://``, ``gs://``, ``az://``), opened with ``storage_options``
        (the object_store crate's config keys) over the provider's environment
        variables; its lock's ``lease`` (seconds) is renewed while the recorder is open."""

    @property
    def path(self) -> str:
        """The store's path, or its URL."""

    @property
    def closed(self) -> bool:
        """Whether ``close`` was called."""

    def describe_summary(self, name: str, summary: str) -> None:
        """Says what the rows of array ``name`` summarize (a JSON object), written as
        ``hostfeed.reduce`` in its attributes; ValueError if it summarized otherwise."""

    def describe_axes(self, name: str, axes: str) -> None:
        """Names the axes of array ``name``'s rows (a JSON array of strings or nulls),
        written as ``hostfeed.axes`` in its attributes; ValueError for anything else."""

    def check_name(self, name: str, ndim: int) -> None:
        """Raises ValueError if ``name`` cannot name an array with rows of ``ndim``
        dimensions (creates nothing)."""

    def declare(self, name: str, dtype_code: int, shape: list[int]) -> int:
        """Declares array ``name`` with rows of ``shape`` and XLA dtype ``dtype_code``;
        returns its id."""

    def bind(
        self,
        consumer_id: int,
        targets: list[int | None],
        step: int | None,
        transforms: str,
        lanes: int = 1,
    ) -> None:
        """Routes the messages of ``consumer_id`` to this recorder, in Rust."""

    def declare_parted(self, name: str, dtype_code: int, part_shape: list[int], count: int,
                       commits: bool) -> list[int]:
        """Declares parted array ``name`` (``count`` slices of ``part_shape`` along the
        rows' first dimension); returns each part's id."""

    def bind_parted(self, consumer_id: int, name: str, step: int | None,
                    transforms: str) -> None:
        """Routes the part-by-part messages of ``consumer_id`` to parted array ``name``."""

    def parted_rows(self, name: str) -> list[int]:
        """Rows each part of parted array ``name`` has committed."""

    def parted_names(self) -> list[str]:
        """The parted arrays, in declaration order."""

    def commit_parted(self, name: str, rows: int) -> None:
        """Announces ``rows`` rows of parted array ``name`` in its ``zarr.json``."""

    def append(self, array_id: int, data: Any, step: int, device: int,
               transforms: str, wait: bool = False, lend: bool = False) -> None:
        """Records one row of ``array_id`` from the C-contiguous bytes ``data``; with
        ``wait``, first waits (GIL released) for room under the byte bound; with ``lend``,
        ``data`` (a numpy array nobody writes) is kept and written as it is, not copied."""

    def flush(self, timeout: float | None = None) -> bool:
        """Writes and announces every row received so far; False if not done in time."""

    def close(self) -> None:
        """Flushes, then stops the writer threads."""

    def rows_received(self, name: str) -> int | None:
        """Rows array ``name`` received (those it held when resumed included), or None if
        no array has that name."""

    def stats(self) -> dict[str, int]:
        """Counters of the recorder."""

    def configure_window(self, steps: int, window_bytes: int, after: int, nonfinite: bool,
                         process: int = 0, writes_doc: bool = True,
                         resume_after_step: int | None = None) -> None:
        """Gives the recorder a window of ``steps`` steps (0: triggers only) and at most
        ``window_bytes`` bytes; ``after`` more steps are written at a trigger;
        ``nonfinite``: the first non-finite value of a recorded row fires one."""

    def window_array(self, array_id: int, windowed: bool,
                     columns: tuple[int, list[int]] | None = None) -> None:
        """Whether ``array_id``'s rows are windowed; a summary's ``(width, columns)`` that
        count non-finite values."""

    def fire_trigger(self, kind: str, step: int, reason: str,
                     name: str | None = None) -> str:
        """Fires a trigger (``"watch"``, ``"keep"``); its description (JSON)."""

    def apply_remote_trigger(self, description: str) -> bool:
        """Applies another process's trigger; whether it was new."""

    @property
    def trigger_count(self) -> int:
        """Triggers fired or applied so far."""

    def take_triggers(self) -> list[str]:
        """The descriptions (JSON) of the triggers not taken before."""

    def take_unpublished_triggers(self, timeout: float) -> list[str]:
        """This process's triggers not taken before (JSON), waiting up to ``timeout``."""

    def trigger_parts(self) -> list[tuple[str, str]]:
        """What this process kept for each trigger: ``(uid, JSON)``."""

    def merge_trigger_part(self, uid: str, process: int, part: str) -> None:
        """Merges what process ``process`` kept for trigger ``uid``."""

    def triggers(self) -> str:
        """Every trigger's description, a JSON list."""

    def window_held(self) -> tuple[int, int] | None:
        """The window's ``(bytes, steps)`` held, or None without a window."""

def after_fork_in_child() -> None:
    """In a forked child: a fresh, stopped receiver; recorders opened before count as
    closed."""

def take_late_drops() -> list[tuple[str, str, int]]:
    """The rows dropped since the last call because they reached a closed recorder
    (compiled code run after ``close``), as ``(store, array, rows)``; ``barrier_wait``
    raises them, interpreter exit reports them."""

def write_tracing() -> bool:
    """Whether the recorders' writer threads put their writes on ``jax.profiler``'s
    timeline now (refreshed at every recorder creation and flush, and every 200 ms while a
    recorder is open)."""
