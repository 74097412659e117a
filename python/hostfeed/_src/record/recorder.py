"""Recording activations to a Zarr v3 store at disk speed: :class:`Recorder`.

``rec.record(name, x)`` is a tap whose host side is Rust: the value is copied into the
receiver's byte-bounded queue like any tap, and the consumer thread hands it to the
recorder's writer threads without calling Python (``crates/hostfeed-core/src/record/``).
Each name is one Zarr array ``[rows, *x.shape]``; per-row metadata (step, device, arrival
time, record number, transforms) sits in sibling arrays (``h.step``, ...).

How a record travels: ``record`` (:mod:`.recording`) checks what it is given, selection
(:mod:`.selection`) picks the steps and the summary, and the plain record (:mod:`.plain`)
binds ``outside_call_p`` with a :class:`~hostfeed._src.primitives.RecordSpec` carrying the
recorder's catalogue and the record's name (so every transformation rule, ordering and
placement of taps applies); at lowering, the record's rule (:mod:`.lowering`) declares the
arrays (a clash raises at the call site) and binds the consumer id to a Rust *sink*. Two
paths go through Python instead, calling the spec's :class:`~.target.Target` (which
appends a copy): global-view records of sharded ``jit`` (the shards are joined by
``runtime.Joiner`` first), and inline mode (``JAX_HOST_CALLBACK_INLINE``, or an eager
record inside a host callback).

The class is built in layers, one concern each: :mod:`.options` (the arguments, checked
once), :mod:`.lifetime` (open, flush, close), :mod:`.recording` (record, watch, step, the
window's keep and triggers), and :class:`Recorder` here (what the user constructs).

Operands of a record: the value, then the step if given. Transformations change them as
for taps: ``jvp`` appends the tangents (recorded as ``name.tangent``), the backward pass of
``grad`` sends cotangents (recorded as ``name.cotangent``), ``vmap`` batches them (the
batching rule puts the lanes first, and each lane is one row). :func:`roles` says which
operand is what, :func:`lane_dims` how many leading dimensions are lanes; a record's
:class:`~.layout.Layout` holds both, with the arrays declared.
"""
from __future__ import annotations

from typing import Any, Optional
from collections.abc import Mapping

import jax

from . import window as _window
from .lifetime import RecordingError
from .options import options
from .recording import RecordPath
from .roles import ROW_METADATA

__all__ = ["Recorder", "RecordingError", "ROW_METADATA"]


class Recorder(RecordPath):
    """Records values from inside JAX computations to a Zarr v3 store, written by Rust
    threads at disk speed, with no Python per record.

    ``rec.record("layer1/h", h)`` is the identity on ``h`` (like ``id_tap``) and appends
    ``h`` as one row of the array ``layer1/h`` of the store: shape ``[rows, *h.shape]``,
    dtype preserved (bfloat16 and the float8 types as the Zarr extensions name them),
    chunked along the rows. It works eagerly and under ``jit``, ``scan``/``while_loop``/
    ``fori_loop``, ``vmap`` (one row per lane, in lane order), ``grad``/``jvp`` (tangents and
    cotangents go to ``name.tangent`` / ``name.cotangent`` in the default autodiff mode,
    not at all in the ``'primals'`` mode), ``pmap``/``shard_map`` (one row per device) and
    ``jit`` over sharded arrays (the whole value, once).

    Per-row metadata lives in sibling arrays ``name.step`` (the ``step=`` given, or -1),
    ``name.device``, ``name.time_ns`` (host arrival time), ``name.seq`` (record number
    across the recorder) and ``name.transforms`` (index into the array's
    ``attrs["hostfeed"]["transforms"]``). :func:`read_recording` returns rows and metadata.

    Rows reach the disk asynchronously. ``flush()`` (and ``hcb.barrier_wait()``, ``close()``,
    leaving a ``with`` block, interpreter exit) returns once every row recorded by the
    computations dispatched so far is written and announced in the store's metadata. A
    killed process leaves a store that opens and holds every row flushed before the kill
    (and those announced by the live cycles: every row within ``commit_interval`` seconds,
    which is also when readers such as :func:`follow` see it).

    The bytes of a row stay charged against the receiver's queue bound
    (``JAX_HOST_CALLBACK_MAX_QUEUE_BYTE_SIZE``) until they are written, so a slow disk
    pauses the devices instead of growing memory.

    Args:
      path: directory of the store (``str``, ``bytes`` or ``os.PathLike``, or a ``file://``
        URL), or the URL of a store in an object store: ``s3://bucket/prefix/run.zarr``,
        ``gs://…``, ``az://container/…`` (see docs, "Recording", "Object stores").
      mode: ``"w-"`` (default): create, fail if ``path`` exists and is not empty;
        ``"w"``: replace an earlier hostfeed recording at ``path`` (nothing else); ``"a"``:
        append to the hostfeed recording at ``path`` (created if there is none), every
        array going on after its last announced row; a record under an existing name must
        have the array's dtype and row shape.
      resume_after_step: with ``mode="a"``, first drop the rows from the first one whose
        ``step`` is greater than this, in every array: a job restarted from its checkpoint
        of step N passes N, and records steps N+1, ... exactly once.
      compression: None (default) or ``"zstd"``, with ``compression_level`` (default 1).
        zstd costs CPU (about 0.2 GB/s per writer thread on activations); use it when the
        disk is slower than that, or for space.
      chunk_bytes: target chunk size (default 16 MiB; at most a quarter of the queue
        bound): rows per chunk = max(1, chunk_bytes // row bytes).
      shard_bytes: shard the arrays (Zarr's ``sharding_indexed``): each object (file) holds
        this many bytes of rows, in chunks of ``chunk_bytes``, with an index at its end; 0:
        a chunk is an object. Default (None): 256 MiB shards in an object store, none on a
        file system. In an object store an object (shard or chunk) holds at most 256 rows (16
        of 1 KiB or more while ``commit_interval`` is finite) and a shard's chunks an eighth
        of that, so that a flush or a live cycle, which puts the object holding the last rows
        again, costs bytes in proportion to the rows. A compressed shard on a file system is
        put whole, its rows waiting in memory, so it is at most a quarter of the queue bound.
      writers: writer threads (they write different chunks at the same time). Default
        (None): 2 on a file system; 4 in an object store, where a writer mostly waits for
        the network (each puts a shard in one request, up to ``single_put_bytes`` held).
      durable: fsync every chunk and metadata write, so rows also survive an OS crash or
        power loss (default False: a killed process loses nothing flushed either way).
      commit_interval: every row is readable within this many seconds of reaching the
        recorder, with no flush (a partial chunk written, then announced): default (None) 1
        on a file system, 30 in an object store (bytes sent stay under twice the rows');
        ``inf``: at flushes only.
      separator: chunk key separator, ``"/"`` (nested directories) or ``"."`` (flat).
      coordination_timeout: under ``jax.distributed`` (every process opens the same
        path and together they write one store; see README, "Many processes"), the
        seconds ``close()`` (and a process opening the store) waits for the others
        before raising ``RecordingError``.
      storage_options: for an object store URL, the ``object_store`` crate's config keys of
        its provider (``aws_endpoint``, ``aws_region``, ``aws_allow_http``,
        ``google_service_account``, ``azure_storage_account_name``, ...), over the provider's
        environment variables (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``,
        ``GOOGLE_APPLICATION_CREDENTIALS``, ...); plus ``retry_timeout`` (seconds, default
        180) and ``max_retries`` (default 10) for transient errors, and
        ``single_put_bytes`` (default 1 GiB and 1 MiB, four default shards: the shards held in
        memory together to be put in one request each; beyond, a shard goes up as a
        multipart upload as it fills; 0 streams every shard). Secret values never appear
        in a message, a ``repr`` or the store.
      lease: an object store's lock is an object with a lease that the recorder renews
        while it is open; after a crash, the store opens again once ``lease`` seconds have
        passed (default 60).
      window: keep the rows of the last ``window`` steps of the arrays recorded with
        ``keep="window"`` in host memory (no disk I/O), and write them to the store when
        a trigger fires (see docs, "Debugging a run"); at most ``window_bytes`` bytes
        (default 1 GiB: each row's buffer and 128 bytes; older steps go first, and a step
        larger than it is refused).
      after: a trigger at step ``t`` writes steps ``t - window + 1 .. t + after``.
      on_nonfinite: the first NaN or infinity in any recorded row (raw or summary,
        windowed or not) fires a trigger naming the value, the array and the step.
      on_trigger: None (default: each trigger is logged when noticed), ``"raise"`` (the
        next ``rec.step`` call or ``barrier_wait`` raises :class:`hostfeed.Triggered` once
        the window is written), or a function called with each trigger's description.

    Raises:
      RecordingError: (an ``OSError``) the path cannot be created, or exists, or another
        recorder (of this process or another, named by its pid) has it open: an open
        store is locked (``flock``; in an object store, a lock object with a lease) until
        ``close()`` or its process ends. For an object store also: the bucket cannot be
        reached (missing, wrong credentials or endpoint), checked before anything is
        written.

    Example:
        >>> import tempfile, os, jax, jax.numpy as jnp
        >>> import hostfeed
        >>> path = os.path.join(tempfile.mkdtemp(), "run1.zarr")
        >>> with hostfeed.Recorder(path) as rec:
        ...     f = jax.jit(lambda x, s: rec.record("layer1/h", x * 2, step=s).sum())
        ...     for s in range(3):
        ...         _ = f(jnp.ones(4), s)
        >>> rows, meta = hostfeed.read_recording(path, "layer1/h")
        >>> rows.shape, meta["step"].tolist()
        ((3, 4), [0, 1, 2])
    """


    def __init__(self, path: Any, *, mode: str = "w-", compression: Optional[str] = None,
                 compression_level: int = 1, chunk_bytes: int = 16 << 20,
                 writers: Optional[int] = None,
                 durable: bool = False, commit_interval: Optional[float] = None,
                 separator: str = "/", coordination_timeout: float = 60.0,
                 storage_options: Optional[Mapping[str, Any]] = None, lease: float = 60.0,
                 resume_after_step: Optional[int] = None, shard_bytes: Optional[int] = None,
                 window: Optional[int] = None, window_bytes: Optional[int] = None,
                 after: int = 0, on_nonfinite: bool = False,
                 on_trigger: _window.OnTrigger = None):
        super().__init__(options(
            path, mode=mode, compression=compression, compression_level=compression_level,
            chunk_bytes=chunk_bytes, writers=writers, durable=durable,
            commit_interval=commit_interval, separator=separator,
            coordination_timeout=coordination_timeout, storage_options=storage_options,
            lease=lease, resume_after_step=resume_after_step, shard_bytes=shard_bytes,
            window=window, window_bytes=window_bytes, after=after, on_nonfinite=on_nonfinite,
            on_trigger=on_trigger))


# A Recorder is static: a pytree with no leaves, itself the node's data (compared and
# hashed by identity), so that it can be an argument of a jitted function, a field of an
# Equinox module or part of any pytree, and a new recorder retraces.
jax.tree_util.register_pytree_node(Recorder, lambda rec: ((), rec), lambda rec, _: rec)

# (The barrier, exit and fork hooks, which flush, close and forget the open recorders,
# are ``barrier.py``'s; the open recorders and the close hooks, ``lifetime.py``'s.)
