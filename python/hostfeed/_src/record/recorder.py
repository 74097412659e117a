"""Recording activations to a Zarr v3 store at disk speed: :class:`Recorder`.

``rec.record(name, x)`` is a tap whose host side is Rust: the value is copied into the
receiver's byte-bounded queue like any tap, and the consumer thread hands it to the
recorder's writer threads without calling Python (``crates/hostfeed-core/src/record/``).
Each name is one Zarr array ``[rows, *x.shape]``; per-row metadata (step, device, arrival
time, record number, transforms) sits in sibling arrays (``h.step``, ...).

How a record travels: ``record`` binds ``outside_call_p`` with a :class:`CallbackSpec`
of kind ``"record"`` (so every transformation rule, ordering and placement of taps
applies); at lowering, :func:`.lowering.consumer_lease` declares the arrays (a clash
raises at the call site) and binds the consumer id to a Rust *sink*. Two paths go through
Python instead, calling :class:`Target` (which appends a copy): global-view records of
sharded ``jit`` (the shards are joined by ``runtime.Joiner`` first), and inline mode
(``JAX_HOST_CALLBACK_INLINE``, or an eager record inside a host callback).

Operands of a record: the value, then the step if given. Transformations change them as
for taps: ``jvp`` appends the tangents (recorded as ``name.tangent``), the backward pass of
``grad`` sends cotangents (recorded as ``name.cotangent``), ``vmap`` batches them (the
batching rule puts the lanes first, and each lane is one row). :func:`roles` says which
operand is what, :func:`lane_dims` how many leading dimensions are lanes; a record's
:class:`~.layout.Layout` holds both, with the arrays declared.
"""
from __future__ import annotations

import json
import logging
import os
import threading
from typing import Any, Optional
from collections.abc import Callable, Mapping

import jax
import numpy as np

from ... import _receiver
from .. import compat, keys, lifecycle, settings
from ..primitives import outside_call_p, outside_call_params
from . import (coordination, flight_methods as _flight_methods, inputs as record_inputs,
               retrace, selection as _selection, step as _step, stores,
               triggers as _triggers, unflushed as _unflushed, watch as _watch,
               window as _window)
from .catalogue import Catalogue
from .target import Target
from ..spec import CallbackSpec
from .roles import (COTANGENT_SUFFIX, KIND, KIND_WITH_STEP, ROW_METADATA, STEP,  # noqa: F401
                           TANGENT_SUFFIX, lane_dims, roles, transforms_json)

logger = logging.getLogger("hostfeed")

__all__ = ["Recorder", "RecordingError", "ROW_METADATA"]

RecordingError = _receiver.error.RecordingError

# Recorders not closed yet: barrier_wait flushes them, interpreter exit closes them (after
# the receiver has drained). Strong references, so that an open recorder dropped by the
# program still gets its rows written.
_open: set[Recorder] = set()
open_lock = threading.Lock()


class Recorder(_flight_methods.FlightMethods):
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
        record_inputs.check_seconds(coordination_timeout, lease)
        flight = _window.config(window, window_bytes, after, on_nonfinite, on_trigger)
        # The receiver (and its exit handler, which closes recorders after draining) must
        # exist before any row can be recorded.
        lifecycle.ensure_started()
        durable = settings.flag(durable, "hostfeed.Recorder: durable")
        where = stores.location(path, storage_options)
        fspath = where.where
        commit_interval = stores.commit_interval(commit_interval, where)
        coord = coordination.Coordinator(fspath, coordination_timeout)
        options: dict[str, Any] = dict(mode=mode, compression=compression, level=compression_level,
                       chunk_bytes=chunk_bytes, writers=record_inputs.writers(writers, where.url),
                       durable=durable,
                       commit_interval=commit_interval, separator=separator,
                       shard_bytes=record_inputs.shard_bytes(shard_bytes, where.url))
        if resume_after_step is not None:
            if isinstance(resume_after_step, bool) or not isinstance(
                    resume_after_step, (int, np.integer)):
                raise TypeError(f"hostfeed.Recorder: resume_after_step must be an int (a step), "
                                f"got {resume_after_step!r}")
            options["resume_after_step"] = int(resume_after_step)
        if where.url:
            options.update(url=True, storage_options=where.options, lease=lease)
        if not coord.shared:
            self._native = _receiver.record.Recorder(fspath, **options)
        elif coord.leader:
            group = coord.new_group()
            try:
                self._native = _receiver.record.Recorder(fspath, **options, shared=group,
                                                         leader=True)
            except Exception as exc:
                coord.announce(None, str(exc))
                raise
            coord.announce(group)
        else:
            self._native = _receiver.record.Recorder(fspath, **options, shared=coord.join(),
                                                     leader=False)
        self._coord = coord
        self._flight = None if flight is None else _window.Flight(
            self._native, flight, fspath, coord.process, coord.leader, resume_after_step)
        if self._flight is not None and coord.shared:
            self._flight.exchange = _triggers.Exchange(self._native, coord)
        coord.start(self._native, commit_interval)
        self._lock = threading.Lock()
        self._targets: dict[tuple[str, str], Target] = {}
        self._watches: dict[str, _watch.WatchTap] = {}
        #: What the lowering, the records' targets and recorded steps ask of this recorder.
        self.catalogue = Catalogue(self._native, coord, self._keep_error, self._flight)
        # Errors of rows recorded through Python (eager records), not raised yet.
        self._unseen: list[BaseException] = []
        #: What this recorder's steps (:meth:`step`) hand their records to.
        self.pipeline = _step.Pipeline(self.catalogue)
        # ``record``: the plain record, wrapped to take every=, start=, stop=, reduce=.
        self._selective = _selection.selective(self._record, self._describe_summary)
        self._pid = os.getpid()
        with open_lock:
            _open.add(self)
        _unflushed.mark_flushed(self)

    # ---- public API ---------------------------------------------------------------------

    @property
    def path(self) -> str:
        """The store's directory."""
        return str(self._native.path)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return bool(self._native.closed)

    def record(self, name: str, value: Any, *, step: Any = None, result: Any = None,
               every: Optional[int] = None, start: Optional[int] = None,
               stop: Optional[int] = None, reduce: Any = None, axis: Any = None,
               cotangents: Optional[bool] = None, keep: str = "always") -> Any:
        """Identity on ``value`` that also appends it (or its summary) as one row of array
        ``name``.

        Args:
          name: the array's name in the store; ``/`` separates groups (``"layer1/h"``).
            Parts use letters, digits, ``_``, ``-`` and ``.`` (not first), at most 200
            bytes each (1024 in all); a part that is ``zarr.json`` or ends in a per-row
            metadata suffix (``.step``, ...), and names ending in ``.tangent``/
            ``.cotangent``, are refused.
          value: a JAX array, numpy array or scalar of any dtype hostfeed transfers (not a
            pytree: record each leaf under its own name).
          step: optional integer scalar (traced or not) stored with the row in
            ``name.step``, to line rows up with training steps.
          result: if given, the return value instead of ``value`` (as for ``id_tap``); the
            row is recorded either way.
          every, start, stop: record only at steps ``start, start + every, ...`` before
            ``stop`` (each optional; ``step`` required). Decided on the device: a step that
            records nothing costs a compare (see Recording, "Selective recording").
          reduce: ``"stats"`` records a row of statistics of ``value`` instead of it
            (``hostfeed.STATS``: count, mean, std, min, max, absmax, l2, nan and inf counts,
            l1, zeros, absmin_nonzero; float32), ``hostfeed.Stats(dtype=...)`` those and a
            narrower float's underflow and overflow counts, ``hostfeed.Histogram(...)`` a
            row of bin counts, ``hostfeed.TopK(k)`` the k largest; computed on the device.
          axis: the axes ``reduce`` reduces over (default: all); the others stay, e.g.
            ``axis=(0, 1)`` of ``[batch, seq, d]`` gives per-channel stats ``[d, 12]``.
          cotangents: under ``grad`` (``vjp``), whether the backward pass also records the
            cotangent as ``name.cotangent``, a row the size of ``value`` (and under
            ``jvp`` the tangent as ``name.tangent``); False records the primal only. None
            (default): the process's autodiff mode (``HOSTFEED_AD_TAPS``, default
            ``transforms``: recorded; ``primals``: not).
          keep: ``"always"`` (default): every row goes to the store; ``"window"``: the rows
            of the last steps wait in the recorder's window, in host memory, and go to the
            store when a trigger fires (``Recorder(..., window=N)``; needs ``step``; not
            with ``reduce=``: summaries always go to the store). One name, one ``keep``.

        Each call that runs appends a row: a name recorded twice in one step (train and
        eval passes) gets two rows with that ``step``, in run order (``name.seq``); give
        each its own name (``"train/h"``, ``"eval/h"``) to tell them apart.

        Returns:
          ``value``, or ``result`` if given.

        Example:
            >>> rec.record("h/stats", h, step=step, every=100, reduce="stats")  # doctest: +SKIP
            >>> rec.record("h", h, step=step, cotangents=False)  # doctest: +SKIP

        Raises:
          ValueError: an invalid name (every part is checked), the recorder is closed, or
            (eagerly, or when the computation is compiled, at the call site) the name was
            recorded before with another shape or dtype.
          TypeError: a pytree, or a dtype that cannot be recorded (sub-byte types).
          OverflowError: a numpy value that does not fit the dtype JAX converts it to
            (``int64`` values beyond int32's range, ``float64`` beyond float32's, while
            ``jax_enable_x64`` is off); one that fits is recorded converted, as ``jit``
            would convert it.
        """
        record_inputs.check_name(name)
        ad_taps = record_inputs.ad_taps_of(cotangents, name)
        retrace.note(self, name, value, step)  # a Python int step retracing the function?
        if keep != "always" or self._flight is not None:  # (nothing to note otherwise)
            windowed = _window.check_keep(keep, name, reduce, _window.config_of(self._flight))
            if windowed and step is None:
                raise ValueError(f"hostfeed: Recorder.record({name!r}, keep=\"window\") "
                                 f"keeps the rows of the last steps: pass step=...")
            self.catalogue.keep(name, windowed)
        return self._selective(name, value, step=step, result=result, every=every,
                               start=start, stop=stop, reduce=reduce, axis=axis,
                               ad_taps=ad_taps)

    def _record(self, name: str, value: Any, *, step: Any = None, result: Any = None,
                ad_taps: Optional[str] = None) -> Any:
        if self.closed:
            if os.getpid() != self._pid:
                raise ValueError(
                    f"hostfeed: Recorder.record({name!r}): this recorder ({self.path}) was "
                    f"opened by the parent of this forked process; open a new one here")
            raise ValueError(f"hostfeed: Recorder.record({name!r}) on a closed recorder "
                             f"({self.path})")
        treedef: Any
        leaves, treedef = jax.tree_util.tree_flatten(value)
        if treedef.num_leaves != 1 or treedef.num_nodes != 1:
            raise TypeError(f"hostfeed: Recorder.record({name!r}) records one array, got "
                            f"{record_inputs.describe_pytree(value, treedef.num_leaves, name)}")
        leaves, value_keys = keys.unwrap_keys(leaves, "Recorder.record", "value")
        operands = [record_inputs.as_value(leaves[0], name)]
        self._native.check_name(name, np.ndim(operands[0]))
        if not compat.is_tracer(operands[0]):
            # An eager record: its row is appended later, on the consumer thread; a shape or
            # dtype clash is raised here, at the call, as under jit (and, for a shared
            # store, an array another process writes).
            self.catalogue.claim(name)
            self.catalogue.declare(name, jax.dtypes.canonicalize_dtype(operands[0].dtype),
                          np.shape(operands[0]))
        if step is not None:
            operands.append(record_inputs.as_step(step, name))
        kind = KIND if step is None else KIND_WITH_STEP
        spec = CallbackSpec(self._target(name, kind),
                            jax.tree_util.tree_structure(tuple(operands)), True, kind, ad_taps)
        flat_results: list = []
        result_keys: Any = None
        result_treedef: Any = None
        if result is not None:
            flat_results, result_treedef = jax.tree_util.tree_flatten(result)
            flat_results, result_keys = keys.unwrap_keys(flat_results, "Recorder.record",
                                                         "result")
            flat_results = [r if compat.is_tracer(r) or isinstance(r, jax.Array)
                            else jax.numpy.asarray(r) for r in flat_results]
        outs = outside_call_p.bind(*operands, *flat_results,
                                   **outside_call_params(spec, len(operands)))
        watching = self._watches.get(name)
        if watching is not None:  # after the record: its row reaches the recorder first
            _watch.watched(watching, outs[0], None if step is None else outs[1])
        if result_treedef is not None:
            return result_treedef.unflatten(
                keys.rewrap_keys(outs[len(operands):], result_keys))
        return treedef.unflatten(keys.rewrap_keys(outs[:1], value_keys))

    def step(self, fn: Callable, *, in_flight: int = _step.DEFAULT_IN_FLIGHT,
             outputs: Optional[bool] = None, **jit_kwargs: Any) -> _step.RecordedStep:
        """``fn`` compiled with ``jax.jit``, its records leaving the computation as outputs:
        the fastest way to record from a step that is called again and again (a training
        step), on an accelerator above all.

        The ``record()`` calls that ``fn`` makes (at its top, in nested ``jit``, ``scan``
        and ``fori_loop`` bodies, in ``cond`` branches and ``every=``/``start=``/``stop=``,
        under ``grad`` and ``vmap``) become extra outputs of the computation instead of
        host callbacks inside it. Each call starts their copies to the host at once and
        returns ``fn``'s outputs; a thread appends the rows while the next steps run, in
        call order. ``every=`` moves no bytes for a step it skips; ``reduce=`` moves only
        the summary. A ``record`` inside a ``while_loop`` (or ``shard_map``, ``pmap``)
        stays in the computation, as without ``step``. By default the records leave as
        outputs where the step runs on a TPU; on a CPU or a GPU, where hostfeed's own
        handlers copy a record inside the computation for less, they stay inside (the
        step is then ``jax.jit(fn)``).

        Args:
          fn: the step function; it may record with this or other recorders.
          in_flight: at most this many calls' records wait on the device: the next call
            waits until the oldest is copied (device memory for records stays within
            ``in_flight`` times one step's recorded bytes).
          outputs: True: the records always leave as outputs; False: never (they are
            host callbacks inside the computation); None: as outputs on a TPU.
          **jit_kwargs: passed to ``jax.jit`` (``static_argnums``, ``donate_argnums``...).

        Returns:
          A callable like ``jax.jit(fn)``. Calling it after this recorder's ``close()`` (or,
          where the records leave as outputs, another recorder's it records to) raises
          ``ValueError`` before the step runs: its rows would be dropped.

        Example:
            >>> train_step = rec.step(train_step)              # doctest: +SKIP
            >>> for i, batch in enumerate(data):               # doctest: +SKIP
            ...     params = train_step(params, batch, i)
        """
        if not callable(fn):
            raise TypeError(f"hostfeed: Recorder.step(fn) needs a callable, got "
                            f"{type(fn).__name__}")
        if isinstance(in_flight, bool) or not isinstance(in_flight, (int, np.integer)) \
                or in_flight < 1:
            raise ValueError(f"hostfeed: Recorder.step: in_flight must be a positive number "
                             f"of steps, got {in_flight!r}")
        if outputs is not None:
            if not isinstance(outputs, (bool, np.bool_)):
                raise TypeError(f"hostfeed: Recorder.step: outputs must be True, False or "
                                f"None, got {outputs!r}")
            outputs = bool(outputs)
        return _step.RecordedStep(self, fn, int(in_flight), jit_kwargs, outputs)

    def _drain_all_steps(self) -> None:
        """Waits until every row of the steps called so far is appended: this recorder's
        and every open recorder's (a step of another recorder may record to this one)."""
        with open_lock:
            recorders = [self, *(r for r in _open if r is not self)]
        for rec in recorders:
            rec.pipeline.drain()

    def flush(self, timeout: Optional[float] = None) -> None:
        """Waits until every row recorded by the computations dispatched so far is written
        and announced in the store's metadata.

        Raises:
          RecordingError: a write failed since the last flush (disk full, ...), naming
            every array concerned; later flushes raise it again for the rows dropped since.
          ValueError: (or what else it was) a row recorded eagerly could not be appended,
            and no flush, close or ``barrier_wait`` has raised that yet.
          TimeoutError: not done within ``timeout`` seconds (what was written is announced).
        """
        lifecycle.check_not_in_callback("Recorder.flush")
        self._drain_all_steps()
        failed_run = lifecycle.drain_dispatched(timeout)
        if not self._native.flush(timeout):
            raise _receiver.error.ReceiverTimeoutError(
                f"hostfeed: Recorder.flush timed out after {timeout} s with rows of "
                f"{self.path} still being written")
        self._coord.commit(self._native)
        _unflushed.mark_flushed(self)
        if self._flight is not None and self._flight.fired():
            self._flight.notice()
        self._raise_unseen()
        if failed_run is not None:
            raise failed_run

    def close(self) -> None:
        """Flushes, then stops the writer threads. Recording afterwards raises, and so
        does calling a step of this recorder (:meth:`step`); rows that code compiled
        before sends later are dropped, and the next ``barrier_wait()`` raises a
        ``RecordingError`` that counts them per array (if none does, the report at
        interpreter exit says so). Closing twice does nothing."""
        if self.closed:
            return
        lifecycle.check_not_in_callback("Recorder.close")
        try:
            self._drain_all_steps()
            lifecycle.drain_dispatched()
        finally:
            with open_lock:
                _open.discard(self)
            self._close_native()
        self._raise_unseen()
        failed = run_close_hooks(self)
        if failed is not None:
            raise failed

    def _close_native(self) -> None:
        """Writes every row, agrees with the other processes (a shared store), closes."""
        try:
            self._native.flush(None)
            self._coord.close(self._native)
        finally:
            self._coord.stop()
            if self._flight is not None:
                self._flight.close()
            self._native.close()

    def stats(self) -> dict[str, int]:
        """Counters: rows received, bytes and chunks written, spills (partial chunks written
        early to free the queue), commits, rows dropped; with a window, its bytes and steps
        held (``window_bytes_held``, ``window_steps_held``)."""
        return {**self._native.stats(), **(self._flight.held() if self._flight else {})}

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        if exc_info[0] is None:
            self.close()
            return
        try:  # leaving on an exception: that one propagates, a recording error is logged
            self.close()
        except Exception as exc:  # noqa: BLE001 - logged: the exception in flight wins
            logger.error("hostfeed: closing %r while an exception propagates: %s",
                                  self, exc)

    def __repr__(self) -> str:
        return f"hostfeed.Recorder({self.path!r}{', closed' if self.closed else ''})"

    # ---- internals ----------------------------------------------------------------------

    def _keep_error(self, exc: BaseException) -> None:
        with self._lock:
            self._unseen.append(exc)

    def _take_unseen(self) -> Optional[BaseException]:
        """The first error of this recorder's Python-side appends nobody has raised yet
        (the others are logged already); forgets them all."""
        with self._lock:
            unseen, self._unseen = self._unseen, []
        return unseen[0] if unseen else None

    def _raise_unseen(self) -> None:
        exc = self._take_unseen()
        if exc is not None:
            raise exc

    def _describe_axes(self, name: str, axes: list) -> None:
        """Names the axes of array ``name``'s rows (``hostfeed.axes`` in its attributes)."""
        self._native.describe_axes(name, json.dumps(axes))

    def _describe_summary(self, name: str, description: str) -> None:
        self._native.describe_summary(name, description)
        self.catalogue.counting(name, _window.counting_columns(json.loads(description)))

    def _target(self, name: str, kind: str) -> Target:
        with self._lock:
            t = self._targets.get((name, kind))
            if t is None:
                t = self._targets[(name, kind)] = Target(self, name, kind)
            return t


# ---- barrier and exit --------------------------------------------------------------------


_close_hooks: list[Callable[[Recorder], Optional[BaseException]]] = []


def add_close_hook(hook: Callable[[Recorder], Optional[BaseException]]) -> None:
    """Runs ``hook(recorder)`` once ``recorder`` is closed (by ``close``, or at exit); an
    exception it returns is raised by ``close`` (logged at exit)."""
    _close_hooks.append(hook)


def run_close_hooks(rec: Recorder) -> Optional[BaseException]:
    """The close hooks run for ``rec``; the first exception one returned."""
    first: Optional[BaseException] = None
    for hook in _close_hooks:
        first = first or hook(rec)
    return first


# A Recorder is static: a pytree with no leaves, itself the node's data (compared and
# hashed by identity), so that it can be an argument of a jitted function, a field of an
# Equinox module or part of any pytree, and a new recorder retraces.
jax.tree_util.register_pytree_node(Recorder, lambda rec: ((), rec), lambda rec, _: rec)

# (The barrier, exit and fork hooks, which flush, close and forget the open recorders,
# are ``barrier.py``'s.)
