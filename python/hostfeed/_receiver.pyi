"""Stubs for ``hostfeed._receiver``, the native (Rust) core of hostfeed.

Imported by hostfeed's internal modules (``hostfeed._src``), each for the part it owns.
"""
from os import PathLike
from typing import Any, ClassVar, Final, final
from collections.abc import Callable, Iterable, Iterator

import numpy as np

__all__ = [
    "DEFAULT_MAX_QUEUE_BYTES", "DEFAULT_STOP_TIMEOUT", "FLAG_STATUS_OUTPUT", "FLAG_SHARD",
    "FLAG_EAGER", "FLAG_SYNC_TAP", "PORTABLE_KEY_BASE", "PORTABLE_ID_BITS", "push_eager",
    "push_host", "call_host", "failure_text",
    "DTYPE_CODES", "ReceiverError", "ReceiverTimeoutError", "CallbackContextError",
    "RecordingError", "MessageData", "Message", "BatchIter", "Reply", "DirectCall",
    "ConsumerKind", "Consumer",
    "Recorder", "after_fork_in_child",
    "write_tracing",
    "start", "stop",
    "finalize", "start_exit_watch", "stop_exit_watch", "push_control", "barrier",
    "is_running", "in_callback_thread", "max_queue_bytes", "set_max_queue_bytes", "stats",
    "reset_peak", "hold_back", "let_go", "histograms", "reset_histograms", "set_timing",
    "set_inline_calls", "set_buffer_pool_bytes", "take_late_drops",
    "DEFAULT_BUFFER_POOL_BYTES", "set_consumer_name",
    "install_interrupt_watch", "registrations", "summary_registrations",
    "GpuPlatform", "GPU_PLATFORMS",
]

#: Default byte bound of the queue (the legacy ``256e6``).
DEFAULT_MAX_QUEUE_BYTES: Final[int]
#: Default most bytes of host buffers kept for reuse when idle.
DEFAULT_BUFFER_POOL_BYTES: Final[int]
#: Default seconds without progress after which stopping abandons a stuck callback.
DEFAULT_STOP_TIMEOUT: Final[float]
#: ``flags`` bit of a ``call`` that reports failures through an int32 status result.
FLAG_STATUS_OUTPUT: Final[int]
#: ``flags`` bit of one part of a global-view callback sent shard by shard.
FLAG_SHARD: Final[int]
#: ``flags`` bit of an eager tap's message (it carries its consumer: ``Message.consumer``).
FLAG_EAGER: Final[int]
#: ``flags`` bit of a synchronous tap (a ``hostfeed_call`` without results).
FLAG_SYNC_TAP: Final[int]
#: Device keys at or below this one name devices of the portable transport.
PORTABLE_KEY_BASE: Final[int]
#: The low bits of a portable key's offset from PORTABLE_KEY_BASE that hold the device id.
PORTABLE_ID_BITS: Final[int]
#: numpy dtype name -> XLA FFI dtype code, for every dtype hostfeed transfers.
DTYPE_CODES: Final[dict[str, int]]

class ReceiverError(RuntimeError):
    """The receiver cannot do what was asked (stopped, shut down, misconfigured)."""

class ReceiverTimeoutError(TimeoutError):
    """A wait on the receiver (barrier, stop) ran past its timeout."""

class CallbackContextError(RuntimeError):
    """A blocking receiver operation was called from inside a host callback."""

class RecordingError(OSError):
    """Recording to a Zarr store failed (a write, a file that cannot be created, a full
    disk); ``errno`` says how when the OS reported it."""

@final
class MessageData:
    """Owner of one message's bytes; numpy arrays handed to callbacks view it."""

@final
class Message:
    """One message as the dispatcher reads it, by name (frozen; the receiver makes them,
    and so can tests)."""

    def __new__(cls, consumer_id: int, device: int, flags: int, arrays: tuple[np.ndarray, ...],
                reply: Any = None, run_id: int = 0,
                consumer: Consumer | None = None, seq: int | None = None) -> Message: ...
    @property
    def consumer_id(self) -> int:
        """The consumer's id (0: a control message; -1: an eager tap, see ``consumer``)."""
    @property
    def device(self) -> int:
        """The device's key: a CPU device's ordinal, a GPU's or the portable transport's."""
    @property
    def flags(self) -> int:
        """The message's ``FLAG_*`` bits."""
    @property
    def arrays(self) -> tuple[np.ndarray, ...]:
        """The operands, as numpy arrays viewing the message's bytes."""
    @property
    def reply(self) -> Reply | None:
        """A call's reply (a synchronous tap's too); None for a tap. (Any object with
        ``pending``, ``send`` and ``fail`` where a test made the message.)"""
    @property
    def run_id(self) -> int:
        """XLA's run id of the execution that sent it (0 when unknown: the portable
        transport)."""
    @property
    def consumer(self) -> Consumer | None:
        """An eager tap's consumer (it is registered nowhere); None otherwise."""
    @property
    def seq(self) -> int | None:
        """Its sequence number in the receiver's queue (None for a message made in
        Python): what the dispatcher names when it holds the message back."""

@final
class ConsumerKind:
    """How a consumer's messages run. Each kind is one object: compare with ``is``;
    ``str(kind)`` is its word (``tap``, ``call``, ``joined``)."""

    #: ``invoke(arrays, device)``; a synchronous tap's message also has a reply, answered
    #: with no results once it ran.
    TAP: ClassVar[ConsumerKind]
    #: ``invoke(arrays, device, reply) -> failed``, which answers ``reply``.
    CALL: ClassVar[ConsumerKind]
    #: One part of a global-view tap or call sent shard by shard: ``invoke`` is the
    #: ``Joiner`` (``invoke.add(run, arrays, device, reply)``).
    JOINED: ClassVar[ConsumerKind]

@final
class Consumer:
    """A registered consumer (or an eager tap's): how the receiver runs the user's callable
    for one message. The receiver reads its fields itself. ``direct`` (a ``CALL`` one's
    only) runs the host function without ``invoke``'s Python frames."""

    def __new__(cls, invoke: Any, name: str, kind: ConsumerKind,
                direct: DirectCall | None = None) -> Consumer: ...
    @property
    def invoke(self) -> Any:
        """What runs a message (see ``ConsumerKind``)."""
    @property
    def name(self) -> str:
        """The callback's name, for messages about it."""
    @property
    def kind(self) -> ConsumerKind:
        """How its messages run."""
    @property
    def direct(self) -> DirectCall | None:
        """A call's ``DirectCall``, or None."""

@final
class BatchIter:
    """A batch of messages for the dispatcher: an iterator of ``Message``s (those for
    recorders are routed on the way, in Rust)."""

    def __iter__(self) -> Iterator[Message]: ...
    def __next__(self) -> Message: ...
    def run_taps(self, consumers: dict[int, Consumer],
                 failed: Callable[[BaseException, Consumer], object],
                 call_failed: Callable[[BaseException | None, Consumer, int, int, Reply], object]
                 | None = None) -> int:
        """Runs the plain taps at the head of the batch (``consumer.invoke(arrays,
        device)`` for each ``ConsumerKind.TAP`` consumer, exceptions to ``failed(exception,
        consumer)``) and, with ``call_failed``, the plain calls of ``ConsumerKind.CALL``
        consumers (with their ``DirectCall``, or ``consumer.invoke(arrays, device,
        reply)``, true when it failed; failed, unwaited or raising calls to
        ``call_failed(exception_or_None, consumer, run_id, device, reply)``); stops at the
        first other message. Returns how many ran."""

@final
class Reply:
    """The consumer's handle on a waiting ``call``: answer it once."""

    @property
    def pending(self) -> bool:
        """Whether the call still waits (not replied, timed out or cancelled)."""

    def send(self, results: list[np.ndarray]) -> bool:
        """Copies C-contiguous results of the expected dtypes and shapes into the call's
        result buffers; returns False if the call no longer waits."""

    def fail(self, message: str) -> bool:
        """Fails the call with ``message``; returns False if the call no longer waits."""

@final
class DirectCall:
    """A ``call``'s host function as the receiver runs it without hostfeed's Python frames
    around it: ``func`` gets the one array (``treedef`` None) or ``treedef.unflatten`` of
    the arrays; one result of exactly ``shape`` and ``dtype`` is copied straight into the
    call's results; an exception goes to ``raised(exc) -> message``, any other results to
    ``results(res) -> (flat, None) | (None, message)``."""

    def __new__(cls, func: Callable[[Any], Any], treedef: Any | None,
                shape: tuple[int, ...] | None, dtype: np.dtype | None,
                raised: Callable[[BaseException], str],
                results: Callable[[Any], tuple[list | None, str | None]]) -> DirectCall: ...

@final
class Recorder:
    """A Zarr v3 store that recorded values are written to by Rust threads (wrapped by
    ``hostfeed.Recorder``)."""

    def __new__(
        cls,
        path: str | PathLike[str],
        *,
        mode: str = "w-",
        compression: str | None = None,
        level: int = 1,
        chunk_bytes: int = ...,
        writers: int = 2,
        durable: bool = False,
        commit_interval: float = 1.0,
        separator: str = "/",
        shared: str | None = None,
        leader: bool = True,
        url: bool = False,
        storage_options: list[tuple[str, str]] | None = None,
        lease: float = 60.0,
        resume_after_step: int | None = None,
        shard_bytes: int | None = None,
    ) -> Recorder:
        """Creates the store at ``path`` and starts its writer threads. ``shared``: the
        run id of a store shared by the processes of a jax.distributed run (the leader
        prepares it; members join). ``url``: ``path`` is the URL of an object store
        (``s3://``, ``gs://``, ``az://``), opened with ``storage_options`` (the
        object_store crate's config keys) over the provider's environment variables; its
        lock's ``lease`` (seconds) is renewed while the recorder is open."""

    @property
    def path(self) -> str:
        """The store's path, or its URL."""

    @property
    def closed(self) -> bool:
        """Whether ``close`` was called."""

    def describe_summary(self, name: str, summary: str) -> None:
        """Says what the rows of array ``name`` summarize (a JSON object), written as
        ``hostfeed.reduce`` in its attributes; ValueError if it summarized otherwise."""

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

    def stats(self) -> dict[str, int]:
        """Counters of the recorder."""

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

def start(
    dispatcher: Callable[[Iterable[Message]], Any],
    dtypes: dict[int, np.dtype],
    max_queue_bytes: int | None = None,
) -> bool:
    """Configures and starts the receiver; returns whether a consumer thread was started."""

def stop(stall_timeout: float | None) -> bool:
    """Drains the queue, then stops and joins the consumer thread (GIL released). If a
    callback makes no progress for ``stall_timeout`` seconds (None: no limit), waiting
    calls are failed and the thread is abandoned; returns whether the thread was joined."""

def finalize(stall_timeout: float | None) -> int:
    """Stops the receiver for good (interpreter exit); returns how many messages could
    not be processed."""

def start_exit_watch(stall_timeout: float | None) -> None:
    """Starts a native watchdog that keeps the receiver draining at interpreter exit,
    abandoning callbacks stuck for ``stall_timeout`` seconds (None: never)."""

def stop_exit_watch() -> None:
    """Stops the exit watchdog and waits for it."""

def push_eager(entry: Consumer, arrays: tuple[np.ndarray, ...], nbytes: int) -> None:
    """Enqueues an eager tap: ``entry`` runs on the consumer thread with ``arrays`` after
    everything already enqueued; ``nbytes`` counts against the bound (waits for space with
    the GIL released)."""

def push_host(consumer_id: int, arrays: list[np.ndarray], codes: list[int], device: int,
              flags: int = 0) -> None:
    """A tap of the portable transport: copies ``arrays`` (C-contiguous, XLA dtype codes
    ``codes``) into a message for consumer ``consumer_id`` from device key ``device`` and
    enqueues it (waits for space with the GIL released)."""

def call_host(consumer_id: int, arrays: list[np.ndarray], codes: list[int],
              outputs: list[np.ndarray], device: int, flags: int, timeout_ms: int,
              name: str) -> int:
    """A call of the portable transport: enqueues like ``push_host`` and waits (GIL
    released) for the reply, written into ``outputs``. Returns 0, or with
    ``FLAG_STATUS_OUTPUT`` the failure's ticket; without it a failure raises."""

def failure_text(ticket: int) -> str:
    """The message of the failed call recorded under ``ticket``."""

def push_control() -> None:
    """Enqueues a control message (consumer id 0) the dispatcher acts on in queue order."""

def barrier(timeout: float | None = None, patience: float | None = None) -> bool:
    """Waits until every message enqueued before the call has run, those the dispatcher
    holds back included; True. With ``patience``: False once only held-back messages kept
    it waiting for that many seconds."""

def is_running() -> bool:
    """Whether the consumer thread is running."""

def in_callback_thread() -> bool:
    """Whether the caller runs on the consumer thread (inside a host callback)."""

def max_queue_bytes() -> int:
    """The queue's byte bound."""

def set_max_queue_bytes(bound: int) -> None:
    """Sets the queue's byte bound (takes effect at once, also for blocked producers)."""

def stats() -> dict[str, int]:
    """The receiver's counters."""

def hold_back(seq: int | None, bytes: int) -> None:
    """Holds back the message of sequence number ``seq`` (``Message.seq``; None: one made
    in Python) that the dispatcher keeps for a joined tap: barriers wait until
    :func:`let_go` says it ran; its ``bytes`` count against the bound meanwhile (never
    waits; a push is admitted whenever nothing but held-back bytes is charged)."""

def let_go(seq: int | None, bytes: int) -> None:
    """Ends a hold of :func:`hold_back` once its message ran, freeing ``bytes``."""

def reset_peak() -> None:
    """Resets ``peak_queued_bytes`` to the current queued bytes."""

def histograms() -> dict[str, list[tuple[int, int]]]:
    """``{"device_ns": [(upper_ns, count), ...], "handover_ns": [...]}``: the device-side
    cost of each tap and the hand-over latency of each message, as non-empty log-linear
    buckets."""

def reset_histograms() -> None:
    """Empties the timing histograms."""

def set_buffer_pool_bytes(bytes: int) -> None:
    """Sets the most bytes of host buffers kept for reuse when idle."""

def set_timing(enabled: bool) -> bool:
    """Turns the timing histograms on or off; returns the previous setting."""

def set_inline_calls(enabled: bool) -> bool:
    """Lets a CPU ``call`` run its host function on the device's thread when nothing else is
    pending (True, the default), or keeps every call on the receiver thread (False);
    returns the previous setting."""

def set_consumer_name(consumer_id: int, name: str) -> None:
    """Remembers the name of a consumer, for error messages about it."""

def install_interrupt_watch() -> bool:
    """Installs the SIGINT and SIGTERM counters that let a waiting ``call`` fail on Ctrl-C
    or SIGTERM (SIGTERM only where a handler, e.g. jax.distributed's, replaced the default)."""

def registrations() -> dict[str, Any]:
    """``{target_name: PyCapsule}`` for ``jax.ffi.register_ffi_target(..., platform="cpu")``."""

def summary_registrations() -> dict[str, Any]:
    """``{target_name: PyCapsule}`` of the CPU's summary handlers (``hostfeed_stats``,
    ``hostfeed_histogram``), for ``jax.ffi.register_ffi_target(..., platform="cpu")``."""

# The GPU platforms, one table (the drivers are loaded at run time; nothing here needs a
# GPU driver to import).

@final
class GpuPlatform:
    """A GPU platform hostfeed has handlers for (the values of ``GPU_PLATFORMS``): its
    names, its handlers' registrations, its driver's state and its pinned pool's
    counters."""

    @property
    def name(self) -> str:
        """hostfeed's (and JAX's) name of the platform: ``"cuda"``, ``"rocm"``."""

    @property
    def xla_platform(self) -> str:
        """The platform name the handlers are registered under: ``"CUDA"``, ``"ROCM"``."""

    def registrations(self) -> dict[str, Any]:
        """``{target_name: PyCapsule}`` of the platform's handlers, for
        ``jax.ffi.register_ffi_target(..., platform=self.xla_platform)`` (the same names as
        on CPU)."""

    def driver_error(self) -> str | None:
        """Why the platform's driver cannot be used (no library, a missing function, ...),
        or None. Loads the driver library if present; does not initialise the driver."""

    def driver_version(self) -> int | None:
        """The driver's version, or None without a usable driver. Initialises the driver."""

    def driver_path(self) -> str | None:
        """The file the driver's functions come from, or None without a driver library."""

    def pool_stats(self) -> dict[str, int]:
        """Counters of the platform's pinned-memory pool: ``allocations``, ``frees``,
        ``allocated_bytes``, ``in_use_bytes``, ``blocks_taken``, ``resets``."""

#: Every GPU platform by hostfeed's name (``"cuda"``, ``"rocm"``).
GPU_PLATFORMS: Final[dict[str, GpuPlatform]]

# ---- storage back-ends (bindings/python/src/storage.rs) ----------------------------------

#: The URL schemes of the stores that URLs name (lowercase, without ``://``).
STORE_SCHEMES: Final[list[str]]
#: The name of an open store's lock (file or object) in its root.
LOCK_FILE: Final[str]

def is_object_url(url: str) -> bool:
    """Whether ``url`` names a store of a back-end that URLs name (``s3://``, ``gs://``,
    ``az://`` and their aliases, ``memory://``)."""

def store_held(path: str, *, url: bool = False,
               storage_options: list[tuple[str, str]] | None = None) -> bool:
    """Whether a recorder holds the store now (read only; unreadable: False)."""

class StorageLock:
    """A lock that ``Storage.lock`` took."""

    def release(self) -> None:
        """Releases the lock (again: nothing)."""

class Storage:
    """A store's back-end opened at a root: objects by key below it, and its lock."""

    def __init__(self, path: str, *, url: bool = False,
                 storage_options: list[tuple[str, str]] | None = None) -> None: ...
    @property
    def root(self) -> str:
        """The store's root (a path, or the URL)."""

    def put(self, key: str, data: bytes) -> None:
        """Stores ``data`` as the whole object ``key``, replacing any object there."""

    def get(self, key: str) -> bytes:
        """The bytes of object ``key``."""

    def get_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes ``start`` to ``end`` (exclusive) of object ``key``, read alone."""

    def list(self, key: str = "") -> list[str]:
        """The names directly below ``key`` (``""``: the root), sorted."""

    def remove(self, key: str) -> None:
        """Removes object ``key``, or everything below it."""

    def lock(self, lease: float = 60.0) -> StorageLock:
        """Takes the store's lock as a recorder does (``RecordingError`` while another
        holds it)."""

    def is_held(self) -> bool:
        """Whether a recorder holds the store now (read only)."""
