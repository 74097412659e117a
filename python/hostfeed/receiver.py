"""The Python side of the native receiver (``hostfeed._receiver``), and its only importer.

Owns: the consumer registry (which Python callable a custom call's ``consumer_id`` names),
the dispatcher that the Rust consumer thread calls with batches of messages (keeping each
device's messages in program order around joined taps), the record of the last callback
exception and :class:`CallbackException`, the barrier, stop, lazy start and the
``atexit`` drain.
"""
from __future__ import annotations

import atexit
import collections
import contextlib
import functools
import hashlib
import logging
import os
import pathlib
import re
import threading
import traceback
import types
import weakref
from typing import Any, NamedTuple, Optional
from collections.abc import Callable, Iterable, Sequence

import jax
import ml_dtypes
import numpy as np

from . import _compat, _receiver, settings

logger = logging.getLogger("hostfeed")

# Re-exported from the native module (the Rust side defines them once).
ReceiverError = _receiver.ReceiverError
ReceiverTimeoutError = _receiver.ReceiverTimeoutError
CallbackContextError = _receiver.CallbackContextError
RecordingError = _receiver.RecordingError
NativeRecorder = _receiver.Recorder
FLAG_STATUS_OUTPUT: int = _receiver.FLAG_STATUS_OUTPUT
FLAG_SHARD: int = _receiver.FLAG_SHARD
FLAG_EAGER: int = _receiver.FLAG_EAGER
FLAG_SYNC_TAP: int = _receiver.FLAG_SYNC_TAP
registrations = _receiver.registrations
# The CUDA platform: handlers, the driver (loaded at run time), pinned memory.
cuda_registrations = _receiver.cuda_registrations
cuda_driver_error = _receiver.cuda_driver_error
cuda_driver_version = _receiver.cuda_driver_version
cuda_driver_path = _receiver.cuda_driver_path
cuda_pool_stats = _receiver.cuda_pool_stats
rocm_registrations = _receiver.rocm_registrations
rocm_driver_error = _receiver.rocm_driver_error
rocm_driver_version = _receiver.rocm_driver_version
rocm_driver_path = _receiver.rocm_driver_path
rocm_pool_stats = _receiver.rocm_pool_stats
in_callback_thread = _receiver.in_callback_thread
# The portable transport's way into the queue (see hostfeed.portable).
push_host = _receiver.push_host
call_host = _receiver.call_host
failure_text = _receiver.failure_text
is_running = _receiver.is_running


class CallbackException(Exception):
    """Signals that some host callback raised; raised by ``barrier_wait``.

    The message includes the text and traceback of the last exception, which is also
    chained as ``__cause__``.

    Example:
        >>> issubclass(CallbackException, Exception)
        True
    """


def _numpy_dtype(name: str) -> np.dtype | None:
    for module in (np, ml_dtypes):
        if hasattr(module, name):
            return np.dtype(getattr(module, name))
    return None


# XLA_FFI_DataType code -> numpy dtype, for every dtype hostfeed transfers (the codes come
# from the Rust side; dtypes this numpy/ml_dtypes lacks are left out).
XLA_DTYPES: dict[int, np.dtype] = {
    code: dt for name, code in _receiver.DTYPE_CODES.items()
    if (dt := _numpy_dtype(name)) is not None}

#: numpy dtype name -> XLA_FFI_DataType code.
DTYPE_CODES: dict[str, int] = dict(_receiver.DTYPE_CODES)

#: numpy dtypes that taps can carry.
SUPPORTED_DTYPES: frozenset[np.dtype] = frozenset(XLA_DTYPES.values())


def byte_order_problem(dtype: Any) -> Optional[str]:
    """What is wrong with a dtype that hostfeed supports in native byte order but that is
    byte-swapped (``>f4`` on a little-endian host), and how to fix it; None otherwise.

    Example:
        >>> byte_order_problem(np.dtype(">f4") if np.little_endian else np.dtype("<f4"))[:36]
        'dtype >f4, whose byte order is not t'
        >>> byte_order_problem(np.float32) is None
        True
    """
    dt = np.dtype(dtype)
    if dt.isnative or dt.newbyteorder("=") not in SUPPORTED_DTYPES:
        return None
    order = "big" if dt.byteorder == ">" else "little"
    return (f"dtype {dt.str}, whose byte order is not the host's ({order}-endian; this host "
            f"is {'little' if np.little_endian else 'big'}-endian): convert it first, e.g. "
            f"x.astype(x.dtype.newbyteorder('=')) (numpy), which gives {dt.newbyteorder('=')}")


# ----------------------------------------------------------------------------------------
# Consumers and the dispatcher.


#: Most bytes one transferred value may have: 2**47 (128 TiB), more than any host's memory
#: and any user address space; larger shapes would overflow XLA's size arithmetic (which
#: aborts the process) long before.
MAX_VALUE_BYTES = 1 << 47


def check_size(shape: Sequence[int], dtype: Any, api: str, what: str) -> None:
    """Raises ValueError when a value of ``shape`` and ``dtype`` has more bytes than any
    host can hold (:data:`MAX_VALUE_BYTES`); computed with Python's integers, so it never
    overflows.

    Example:
        >>> try:
        ...     check_size((2**62,), np.float32, "hcb.call", "leaf 0 of `result_shape`")
        ... except ValueError as e:
        ...     print(str(e)[:71])
        hcb.call: leaf 0 of `result_shape` has shape (4611686018427387904,) and
    """
    nbytes = np.dtype(dtype).itemsize
    for d in shape:
        nbytes *= int(d)
    if nbytes > MAX_VALUE_BYTES:
        raise ValueError(f"{api}: {what} has shape {tuple(int(d) for d in shape)} and dtype "
                         f"{np.dtype(dtype)}: {nbytes} bytes, more than any host can hold "
                         f"(at most {MAX_VALUE_BYTES} bytes, 128 TiB); check the shape")


class Consumer:
    """A registered consumer: how to run the user's callable for one message.

    ``kind`` is ``"tap"`` (``invoke(arrays, ordinal)``), ``"call"`` (``invoke(arrays,
    ordinal, reply)``, which must answer ``reply``) or ``"joined"`` (a
    :class:`hostfeed.runtime.Joiner`: one part of a global-view tap or call sent shard by
    shard).
    """

    __slots__ = ("invoke", "name", "kind")

    def __init__(self, invoke: Any, name: str, kind: str):
        self.invoke = invoke
        self.name = name
        self.kind = kind
        if kind == "joined":
            _marks.joined = True


class Lease:
    """Keeps consumer ``cid`` registered while it lives. The lowering attaches one to every
    lowered module (JAX keeps a module's keepalives as long as the executables compiled
    from it), so a consumer, and the user's function it holds, is released once no
    compiled computation refers to it any more."""

    __slots__ = ("__weakref__", "cid")

    def __init__(self, cid: int):
        self.cid = cid


class _Registry:
    """Consumers by id (index; id 0 is reserved for control messages), with the number of
    live leases of each. A consumer whose last lease died is released at the next
    ``barrier_wait``, once every computation dispatched before has finished and its
    messages are processed (so no message can name it any more)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        # Consumer id -> consumer (id 0 is reserved for control messages).
        self.consumers: dict[int, Consumer] = {}
        self.ids: dict[Any, int] = {}
        self.keys: dict[int, Any] = {}
        self.leases: dict[int, int] = {}
        # Ids whose leases died (appended from garbage collection, any thread: no lock).
        self.dying: collections.deque[int] = collections.deque()
        # Ids left without leases, to release at the next barrier.
        self.pending_release: list[int] = []


_registry = _Registry()


def _lease_died(cid: int) -> None:
    _registry.dying.append(cid)


# Consumer ids and JAX's persistent compilation cache. The id is an attribute of the custom
# call, so it is part of the lowered module and hence of the cache key: a process that
# gets an executable from the cache has lowered the same module itself, and so registered
# each of its ids for its own functions first. Cache hits therefore always call the
# functions the hitting process wrote. For them to happen at all, a callback must get the
# same id in every process, whatever else was registered before it: the id is a hash of a
# description of the callback that holds no memory addresses (module and qualified name of
# the function, the pytree and transformation records, ...). Callbacks that this
# description cannot tell apart (closures made by one factory) are numbered in the order
# they are first lowered; two processes that lower them in another order may compile
# again, and never call the wrong one.

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _describe(obj: Any, depth: int = 0) -> str:
    """A text naming ``obj`` the same way in every process (no memory addresses).

    Example:
        >>> _describe((len, functools.partial(print, sep=","), None))
        "(builtins.len,partial(builtins.print;();sep=','),None)"
    """
    if depth > 8:
        text = type(obj).__qualname__
    elif obj is None or isinstance(obj, (bool, int, float, complex, str, bytes)):
        text = repr(obj)
    elif isinstance(obj, (tuple, list)):
        text = "(" + ",".join(_describe(o, depth + 1) for o in obj) + ")"
    elif isinstance(obj, functools.partial):
        kws = ";".join(f"{k}={_describe(v, depth + 1)}" for k, v in sorted(obj.keywords.items()))
        text = f"partial({_describe(obj.func, depth + 1)};{_describe(obj.args, depth + 1)};{kws})"
    elif isinstance(obj, types.MethodType):
        text = f"method({_describe(obj.__func__, depth + 1)};{type(obj.__self__).__qualname__})"
    elif isinstance(obj, (types.FunctionType, types.BuiltinFunctionType)):
        text = f"{getattr(obj, '__module__', None)}.{obj.__qualname__}"
    elif isinstance(getattr(type(obj), "__slots__", None), tuple) and type(obj).__slots__:
        # e.g. runtime.CallbackSpec: its fields, described the same way
        fields = ",".join(f"{n}={_describe(getattr(obj, n, None), depth + 1)}"
                          for n in type(obj).__slots__ if not n.startswith("_"))
        text = f"{type(obj).__qualname__}({fields})"
    else:  # pytree definitions, abstract values, callable objects
        try:
            text = _ADDRESS.sub("", repr(obj))
        except Exception:  # noqa: BLE001 - a failing repr only makes the id less stable
            text = type(obj).__qualname__
    return text


def _id_candidate(description: str, attempt: int) -> int:
    digest = hashlib.blake2b(f"{attempt}:{description}".encode(), digest_size=8).digest()
    return (int.from_bytes(digest, "little") >> 2) or 1  # a positive int64, never 0


def register(key: Any, make: Callable[[], Consumer]) -> Lease:
    """A lease on the consumer id for ``key``, registering ``make()`` under it if new.

    The id depends only on what ``key`` describes (see the comment above), not on what
    else this process registered, so compiled code can be shared through JAX's persistent
    compilation cache.
    """
    with _registry.lock:
        _registry.pending_release += _count_dead_leases()
        cid = _registry.ids.get(key)
        if cid is None:
            consumer = make()
            description = _describe(key)
            attempt = 0
            cid = _id_candidate(description, attempt)
            while cid in _registry.consumers:  # another callback with the same description
                attempt += 1
                cid = _id_candidate(description, attempt)
            _registry.consumers[cid] = consumer
            _registry.ids[key] = cid
            _registry.keys[cid] = key
            _receiver.set_consumer_name(cid, consumer.name)
        _registry.leases[cid] = _registry.leases.get(cid, 0) + 1
    lease = Lease(cid)
    weakref.finalize(lease, _lease_died, cid)
    return lease


def _count_dead_leases() -> list[int]:
    """(Under the registry lock.) Counts the leases that died; returns the ids left
    without any."""
    unleased = []
    while _registry.dying:
        cid = _registry.dying.popleft()
        left = _registry.leases.get(cid, 0) - 1
        _registry.leases[cid] = left
        if left <= 0:
            unleased.append(cid)
    return unleased


def _release_unleased(candidates: list[int]) -> int:
    """Releases the consumers among ``candidates`` that still have no lease (a new
    lowering may have leased them again meanwhile); returns how many were released."""
    released = 0
    with _registry.lock:
        for cid in candidates:
            if _registry.leases.get(cid, 0) <= 0 and cid in _registry.consumers:
                del _registry.consumers[cid]
                _registry.ids.pop(_registry.keys.pop(cid), None)
                _registry.leases.pop(cid, None)
                released += 1
    return released


def registered_consumers() -> int:
    """How many consumers are registered now (for tests and diagnostics)."""
    with _registry.lock:
        return len(_registry.consumers)


_last_exception: list[tuple[BaseException, str]] = []


_PACKAGE_DIR = str(pathlib.Path(__file__).resolve().parent)


def _is_hostfeed_frame(tb: types.TracebackType) -> bool:
    return str(pathlib.Path(tb.tb_frame.f_code.co_filename).resolve().parent) == _PACKAGE_DIR


def _user_traceback(exc: BaseException) -> types.TracebackType | None:
    """``exc``'s traceback without hostfeed's own frames at its head (the dispatcher and
    invokers that called the user's function), so that it starts at the user's frame."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None and _is_hostfeed_frame(tb):
        tb = tb.tb_next
    return tb


def user_frame(exc: BaseException) -> str:
    """`` (at FILE:LINE in FUNC)``: the line of the user's function (the first frame
    outside hostfeed) where ``exc`` was raised or passed through, or '' when unknown.

    Example:
        >>> try:
        ...     int("x")
        ... except ValueError as e:
        ...     print(user_frame(e).rsplit(" in ", 1)[1])
        <module>)
    """
    for frame, line in traceback.walk_tb(exc.__traceback__):
        code = frame.f_code
        if str(pathlib.Path(code.co_filename).resolve().parent) != _PACKAGE_DIR:
            return f" (at {code.co_filename}:{line} in {code.co_name})"
    return ""


def record_exception(exc: BaseException, where: str, *, raised_in: str = "") -> None:
    """Keeps ``exc`` for the next ``barrier_wait`` and logs one line that names it and where
    it was raised (its traceback, from the user's frame on, is printed once: as the cause
    of the ``CallbackException`` that ``barrier_wait`` raises). ``raised_in`` says where
    else the user already saw it (a failing ``call``'s computation)."""
    exc.__traceback__ = _user_traceback(exc)
    summary = f"{type(exc).__name__}: {exc}{user_frame(exc)}, in {where}"
    also = f"; {raised_in}" if raised_in else ""
    logger.error("hostfeed: %s%s; the next barrier_wait() raises it with its traceback",
                 summary, also)
    _last_exception[:] = [(exc, summary)]


def take_last_exception() -> tuple[BaseException, str] | None:
    """Returns and clears the recorded callback exception."""
    return _last_exception.pop() if _last_exception else None


Message = tuple  # (consumer_id, device_ordinal, flags, arrays, reply_or_None, run_id)


def _tap_failed(exc: BaseException, consumer: Any) -> None:
    """Records the exception a tap function raised (``BatchIter.run_taps`` calls this)."""
    record_exception(exc, f"host callback {consumer.name}")


class _Held(NamedTuple):
    """A device waiting for its joined tap: the set's joiner and run, the device's later
    messages (in order, each with the bytes it charges against the bound), and the
    barrier epoch in which the device was first held."""

    joiner: Any
    run: int
    waiting: collections.deque
    epoch: int


class _Dispatcher:
    """Runs batches of messages, in queue order, on the consumer thread.

    Each device's messages must reach the host in that device's program order, and a
    joined tap (a global-view tap whose devices each send a part) counts as happening at
    its position on every device that sent a part. So once a device has sent a part whose
    set is incomplete, the device is *held*: its later messages, of whatever execution,
    wait here until the set completes (then they run, in order). Messages of other devices
    go on. Messages held back count against the queue's byte bound (up to half of it,
    so that the pushes that complete the sets always find room; past that they are kept
    uncharged, with a warning), and a push is admitted whenever nothing but held-back
    messages is charged. A device going on to other executions is normal (a multi-device
    execution is not ordered against single-device ones, nor are executions dispatched by
    different threads), so it never drops a set.

    A set is dropped only when its execution has failed:

    - a ``call`` of that execution failed (its host function raised, or it timed out), so
      the device it ran on sends nothing more of that execution: the run's incomplete sets
      are dropped and its later parts are not waited for;
    - every barrier (``barrier_wait``, ``stop_outfeed_receiver``, exit) that finds a device
      held sends a *mark* before it waits for the dispatched computations and a *sweep*
      after: a set that was already incomplete when the mark ran belongs to an execution
      the barrier waited for, so if it is still incomplete at the sweep, some device's
      execution failed before sending its part. Exit sweeps every set once everything
      finished.

    Before dropping a set, a sweep looks for its missing parts among the messages held
    back for other devices (two devices that ran two multi-device executions in opposite
    orders hold each other's parts): such a part runs out of its device's order rather
    than be lost. A dropped set's waiting ``call`` replies are failed, with a warning.

    Only the consumer thread runs the dispatcher, so it takes no lock: state changes and
    callbacks interleave freely. The one exception is a consumer that was abandoned while
    stuck in a callback and comes back later: it notices that it no longer owns the
    dispatcher and leaves the messages it was releasing to the current consumer
    (``orphans``), which runs them first, in order.
    """

    def __init__(self, charge: bool = False) -> None:
        # device ordinal -> the joined set it waits for, and its messages held back
        self.held: dict[int, _Held] = {}
        # Whether held-back messages are charged against the receiver's bound (the
        # receiver's own dispatcher; the unit tests' are not), and how many bytes are.
        self.charge = charge
        self.charged = 0
        self.over_cap_warned = False
        # device ordinal -> messages an abandoned consumer left to be run, in order
        self.orphans: dict[int, collections.deque] = {}
        self.owner = 0  # thread id of the consumer running the dispatcher
        self.epoch = 0  # the newest barrier mark run
        # runs a failed call ended on some device (bounded: the newest 1024)
        self.failed_runs: collections.OrderedDict[int, None] = collections.OrderedDict()

    def __call__(self, batch: Iterable[Message]) -> None:
        consumers = _registry.consumers
        get = consumers.get
        self.owner = threading.get_ident()
        if self.orphans:
            for ordinal in list(self.orphans):
                self._run_orphans(consumers, ordinal)
        if _compat.host_tracing():  # jax.profiler is tracing: one event per callback
            self._traced(consumers, batch)
            return
        held, orphans = self.held, self.orphans  # (mutated in place, never rebound)
        run_taps = getattr(batch, "run_taps", None)
        if run_taps is not None:
            # The receiver's batch: the plain taps at its head run in Rust, whenever no
            # device is held; whatever stops them (another kind of message) runs here.
            while True:
                if not held and not orphans:
                    run_taps(consumers, _tap_failed)
                msg = next(batch, None)  # type: ignore[call-overload]
                if msg is None:
                    return
                self._offer(consumers, msg)
        for msg in batch:
            # The common case first, with nothing else to look at: a plain tap (no flags) of
            # a registered consumer, while no device is held.
            if not msg[2] and not held and not orphans:
                consumer = get(msg[0])
                if consumer is not None and consumer.kind == "tap":
                    try:
                        consumer.invoke(msg[3], msg[1])
                    except BaseException as exc:  # noqa: BLE001 - recorded for barrier_wait
                        record_exception(exc, f"host callback {consumer.name}")
                    continue
            self._offer(consumers, msg)

    def _traced(self, consumers: dict, batch: Iterable[Message]) -> None:
        """The batch while ``jax.profiler`` traces: each message runs inside a trace event
        named after its callback (``hostfeed tap: NAME``, ``hostfeed call: NAME``) on the
        consumer thread, so a trace shows when each callback ran."""
        trace_me = _compat.TraceMe
        for msg in batch:
            c = msg[0] if msg[2] & FLAG_EAGER else consumers.get(msg[0])
            name = getattr(c, "name", None) or "callback"
            with trace_me(f"hostfeed {getattr(c, 'kind', 'tap')}: {name}"):
                self._offer(consumers, msg)

    def _run_orphans(self, consumers: dict, ordinal: int) -> None:
        waiting = self.orphans.pop(ordinal, None)
        while waiting:
            self._offer(consumers, waiting.popleft())

    def _offer(self, consumers: dict, msg: Message) -> None:
        if msg[0] == 0:  # control message: every execution has finished
            self.sweep(None)
            return
        if self.orphans and msg[1] in self.orphans:
            self._run_orphans(consumers, msg[1])
        held = self.held
        if held:
            h = held.get(msg[1])
            if h is not None:
                h.waiting.append((msg, self._hold_back(msg)))
                return
        done = self._deliver(consumers, msg)
        if done:
            self._release(consumers, done)

    def _deliver(self, consumers: dict, msg: Message) -> tuple[int, ...] | None:
        """Runs one message; for the part that completes a joined set, returns the devices
        that took part (to be released)."""
        cid, ordinal, flags, arrays, reply, run = msg
        # An eager tap's message carries its consumer (no device is involved: its device
        # ordinal is -1, never held).
        consumer = cid if flags & FLAG_EAGER else consumers.get(cid)
        try:
            if consumer is None:
                raise LookupError(
                    f"hostfeed: no host callback is registered under consumer id {cid} in "
                    f"this process: the executable was compiled elsewhere and not lowered "
                    f"here (hostfeed registers callbacks when JAX lowers a computation)")
            if consumer.kind == "tap":
                if reply is None:
                    consumer.invoke(arrays, ordinal)
                else:
                    run_sync_tap(consumer.invoke, consumer.name, arrays, ordinal, [reply])
            elif consumer.kind == "call":
                # A call nobody waits for any more (timed out, cancelled) is not run; like
                # a failing one, it ends its execution on this device.
                if not reply.pending or consumer.invoke(arrays, ordinal, reply):
                    self._run_failed(run, f"a call of execution {run} failed on "
                                          f"device {ordinal}")
            else:
                if run in self.failed_runs:  # the set can never complete
                    if reply is not None:
                        reply.fail(f"hostfeed: {consumer.name}: another device's part of "
                                   f"execution {run} never came (a call there failed)")
                    return None
                done = consumer.invoke.add(run, arrays, ordinal, reply)
                if done is None:
                    self.held[ordinal] = _Held(consumer.invoke, run, collections.deque(),
                                               self.epoch)
                return done
        except BaseException as exc:  # noqa: BLE001 - recorded and re-raised by barrier_wait
            name = getattr(consumer, "name", cid)
            record_exception(exc, f"host callback {name}")
            if reply is not None:
                reply.fail(f"hostfeed: host callback {name} failed: "
                           f"{type(exc).__name__}: {exc}")
                if consumer is not None and consumer.kind == "call":
                    self._run_failed(run, f"a call of execution {run} failed on device "
                                          f"{ordinal}")
        return None

    def _release(self, consumers: dict, ordinals: Sequence[int]) -> None:
        """Runs the messages held back for ``ordinals``, in each device's order (a device
        that sends another incomplete part on the way is held again)."""
        me = threading.get_ident()
        for ordinal in ordinals:
            h = self.held.pop(ordinal, None)
            if h is None:
                continue
            waiting = h.waiting
            while waiting:
                if self.owner != me:  # abandoned meanwhile: leave the rest to the owner
                    left = self.orphans.setdefault(ordinal, collections.deque())
                    while waiting:
                        left.append(self._let_go(waiting.popleft()))
                    break
                self._offer(consumers, self._let_go(waiting.popleft()))

    def _hold_back(self, msg: Message) -> int:
        """Charges a message held back against the bound; returns the bytes charged."""
        if not self.charge:
            return 0
        n = 64 + sum(a.nbytes for a in msg[3])  # its arrays and, roughly, the rest
        if self.charged + n > _receiver.max_queue_bytes() // 2:
            if not self.over_cap_warned:
                self.over_cap_warned = True
                logger.warning(
                    "hostfeed: the messages held back behind incomplete joined callbacks "
                    "passed half the queue bound (%d bytes); further ones are kept without "
                    "counting against it until those callbacks complete",
                    _receiver.max_queue_bytes())
            return 0
        self.charged += n
        _receiver.hold_back(n)
        return n

    def _let_go(self, entry: tuple[Message, int]) -> Message:
        """Frees what a held-back message charged; returns the message."""
        msg, n = entry
        if n:
            self.charged -= n
            _receiver.let_go(n)
            if not self.charged:
                self.over_cap_warned = False
        return msg

    def _run_failed(self, run: int, why: str) -> None:
        """Execution ``run`` failed on some device: drops its incomplete sets (that device
        sends no more parts) and does not wait for its later ones."""
        self.failed_runs[run] = None
        while len(self.failed_runs) > 1024:
            self.failed_runs.popitem(last=False)
        for h in list(self.held.values()):
            if h.run == run:
                self._abandon(h.joiner, run, why)

    def mark(self, epoch: int) -> None:
        """A barrier's mark (run in queue order): sets held from now on are newer."""
        self.epoch = max(self.epoch, epoch)

    def sweep(self, epoch: int | None) -> None:
        """A barrier's sweep (run in queue order, after the barrier waited for everything
        dispatched before its mark): drops the sets held since before mark ``epoch``
        (``None``: every set), whose executions finished without sending every part."""
        consumers = _registry.consumers
        while True:
            stale = [(o, h) for o, h in self.held.items() if epoch is None or h.epoch < epoch]
            if not stale:
                return
            if self._unblock_crossed(consumers):
                continue
            ordinal, h = stale[0]
            self._abandon(h.joiner, h.run, "its execution finished without sending it")
            self._release(consumers, [ordinal])  # in case it was not dropped

    def _unblock_crossed(self, consumers: dict) -> bool:
        """Finds a held-back message that is a part some held device waits for, and runs
        it out of its device's order; returns whether it found one."""
        waited = {(id(h.joiner), h.run) for h in self.held.values()}
        for ordinal, h in list(self.held.items()):
            for i, (msg, _) in enumerate(h.waiting):
                c = consumers.get(msg[0]) if not msg[2] & FLAG_EAGER else None
                if c is not None and (id(c.invoke), msg[5]) in waited:
                    self._let_go(h.waiting[i])
                    del h.waiting[i]
                    logger.warning("hostfeed: device %s ran two multi-device executions "
                                   "in another order than its peers; its part of %s runs "
                                   "out of its order", ordinal, c.name)
                    done = self._deliver(consumers, msg)
                    if done:
                        self._release(consumers, done)
                    return True
        return False

    def _abandon(self, joiner: Any, run: int, why: str) -> None:
        dropped = joiner.abandon(run, f"hostfeed: a part of a global-view host call never "
                                      f"arrived ({why}); the call was failed")
        logger.warning("hostfeed: dropped an incomplete global-view host callback of "
                       "execution %s (%s)", run, why)
        self._release(_registry.consumers, dropped)


_dispatch = _Dispatcher(charge=True)


def run_sync_tap(invoke: Callable[..., None], name: str, arrays: Sequence[np.ndarray],
                 ordinal: int, replies: Sequence[Any]) -> None:
    """Runs a synchronous tap (``invoke(arrays, ordinal)``), then lets the devices waiting
    for it go on (``replies``: their calls without results). A failing tap function is
    recorded for ``barrier_wait`` like any tap; the computation goes on regardless."""
    try:
        invoke(arrays, ordinal)
    except BaseException as exc:  # noqa: BLE001 - recorded for barrier_wait
        record_exception(exc, f"host callback {name}")
    finally:
        for reply in replies:
            if reply.pending:
                reply.send([])


@functools.cache
def device_for_ordinal(ordinal: int) -> jax.Device:
    """The ``jax.Device`` of this process that a message's device key ``ordinal`` names.

    A message from a CPU device carries its XLA device ordinal; one from a GPU carries
    ``-2 - ordinal`` (set in Rust for messages of the GPU handlers, so that the keys of a
    CPU and a GPU device never collide, nor with -1, the host's own messages). What
    ``XLA_FFI_DeviceOrdinal_Get`` reports differs by setup: on CPU
    with one process it is the device's id (which equals its ``local_hardware_id``); with
    many processes (``jax.distributed``) it is the *global* device id (e.g. 2048 for the
    first CPU device of process 1), not an index into ``jax.local_devices()``; a GPU's is
    its ordinal on this host. So a local device is matched by ``id`` first, then by
    ``local_hardware_id`` (the ordinal of platforms that number their devices per process).

    Raises:
      LookupError: no device of this process has that ordinal (the tap is then recorded
        as failed for ``barrier_wait``, not lost silently).
    """
    if ordinal <= PORTABLE_KEY_BASE:
        return _portable_devices[PORTABLE_KEY_BASE - ordinal]
    platform = "cpu"
    if ordinal <= -2:
        platform, ordinal = "gpu", -2 - ordinal
    devices = _local_callback_devices(platform)
    for d in devices:
        if d.id == ordinal:
            return d
    for d in devices:
        if getattr(d, "local_hardware_id", None) == ordinal:
            return d
    raise LookupError(
        f"hostfeed: no {platform} device of process {jax.process_index()} has XLA device "
        f"ordinal {ordinal}; its devices are "
        f"{[(d.id, d.local_hardware_id) for d in devices]} as (id, local_hardware_id)")


#: Device keys at or below this one name devices of the portable transport (any platform).
PORTABLE_KEY_BASE = -(1 << 24)
_portable_devices: list[jax.Device] = []
_portable_keys: dict[jax.Device, int] = {}
_portable_lock = threading.Lock()


def portable_device_key(device: jax.Device) -> int:
    """The device key that messages of the portable transport from ``device`` carry, so
    that :func:`device_for_ordinal` gives ``device`` back (a CPU device's is its id, as in
    a native handler's messages).

    Example:
        >>> d = jax.devices("cpu")[0]
        >>> device_for_ordinal(portable_device_key(d)) == d
        True
    """
    if device.platform == "cpu":
        return device.id
    with _portable_lock:
        key = _portable_keys.get(device)
        if key is None:
            key = PORTABLE_KEY_BASE - len(_portable_devices)
            _portable_devices.append(device)
            _portable_keys[device] = key
        return key


def _local_callback_devices(platform: str) -> list:
    """The local devices of ``platform`` (``"cpu"`` or ``"gpu"``) host callbacks run on."""
    try:
        return list(jax.local_devices(backend=platform))
    except RuntimeError:  # no such backend: the default one's
        return list(jax.local_devices())


# ----------------------------------------------------------------------------------------
# Lifecycle.


class _Lifecycle:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.configured = False
        self.atexit_registered = False


_life = _Lifecycle()


def ensure_started(max_queue_bytes: int | None = None) -> None:
    """Starts the receiver if it is not running (lazily, on first use).

    The bound is ``max_queue_bytes`` if given, else ``JAX_HOST_CALLBACK_MAX_QUEUE_BYTE_SIZE``
    on first start, else 256e6 bytes.
    """
    if max_queue_bytes is None and _life.configured and _receiver.is_running():
        return
    with _life.lock:
        if not _life.configured:
            if max_queue_bytes is None:
                max_queue_bytes = settings.max_queue_bytes()
            pool = settings.buffer_pool_bytes()
            if pool is not None:
                _receiver.set_buffer_pool_bytes(pool)
        _receiver.start(_dispatch, XLA_DTYPES, max_queue_bytes)
        if threading.current_thread() is threading.main_thread():
            _receiver.install_interrupt_watch()  # Ctrl-C/SIGTERM fail a waiting hcb.call
        _life.configured = True
        if not _life.atexit_registered:
            atexit.register(_at_exit)
            _life.atexit_registered = True


def push_eager(invoke: Callable[..., None], name: str, arrays: tuple[np.ndarray, ...],
               nbytes: int) -> None:
    """Enqueues an eager tap: ``invoke(arrays, -1)`` runs on the consumer thread after every
    message already in the queue. Nothing is registered: the consumer travels with the
    message and is dropped once it has run."""
    if not _life.configured:
        ensure_started()
    _receiver.push_eager(Consumer(invoke, name, "tap"), arrays, nbytes)


def wait_processed() -> None:
    """Waits until the receiver has processed every message enqueued so far (GIL released;
    raises nothing a callback raised: that is for ``barrier_wait``)."""
    _receiver.barrier(None)


def wait_for_dispatched(effect: Any) -> None:
    """Waits until the computations dispatched with ``effect`` have finished, so that every
    message they send is already in the queue.

    Uses the effect's runtime token, which JAX chains through every computation that has
    the (ordered) effect. A computation that failed has finished too: its error reaches its
    caller, and ``barrier_wait`` reports it.
    """
    token = _compat.runtime_tokens.current_tokens.get(effect)
    if token is not None:
        # A failure is reported by the computation and by barrier_wait.
        with contextlib.suppress(Exception):
            token.block_until_ready()
    if _dispatch_waits.due and not _receiver.in_callback_thread():
        # Not on the consumer thread: a computation still running there may be waiting for
        # it (a call, a full queue); what it sends comes after the running callback anyway.
        with contextlib.suppress(Exception):
            _run_dispatch_waits()


def is_configured() -> bool:
    """Whether the receiver was ever started in this process."""
    return _life.configured


def stop_timeout() -> float | None:
    """``HOSTFEED_STOP_TIMEOUT`` (None: no limit)."""
    return settings.stop_timeout()


def stats() -> dict[str, Any]:
    """The receiver's counters (see ``hostfeed.receiver_stats``)."""
    return dict(_receiver.stats())


def set_max_queue_bytes(bound: int) -> None:
    """Sets the queue's byte bound; blocked devices re-check at once."""
    _receiver.set_max_queue_bytes(bound)


def reset_peak() -> None:
    """Resets ``peak_queued_bytes`` to the bytes queued now."""
    _receiver.reset_peak()


def histograms() -> dict[str, list[tuple[int, int]]]:
    """The timing histograms, ``{"device_ns": [(upper_ns, count), ...], "handover_ns":
    [...]}``: each tap's device-side cost and each message's hand-over latency."""
    return dict(_receiver.histograms())


def reset_histograms() -> None:
    """Empties the timing histograms."""
    _receiver.reset_histograms()


def set_timing(enabled: bool) -> bool:
    """Turns the timing histograms on or off; returns the previous setting."""
    return _receiver.set_timing(enabled)


def _effects_barrier() -> Optional[BaseException]:
    """Waits for dispatched computations; returns (not raises) the error of one that failed.

    A computation that failed (for example a `call` whose host function raised, which its
    caller has already seen) leaves JAX's chain of effect tokens in the failed state, so
    every later computation with host callbacks would fail with the same stale error. The
    chain is reset here, once the failure has been waited for.
    """
    failed = None
    if _dispatch_waits.due:
        try:
            _run_dispatch_waits()
        except Exception as exc:  # noqa: BLE001 - returned to barrier_wait
            failed = exc
    tokens = _compat.runtime_tokens
    if not tokens.current_tokens and not tokens.output_runtime_tokens:
        return failed  # nothing dispatched with tokens since the last barrier
    try:
        _jax_effects_barrier()  # the markers ran above
        return failed
    except Exception as exc:  # noqa: BLE001 - returned to barrier_wait
        _compat.runtime_tokens.clear()
        return exc


class _DispatchWaits:
    """Waits for computations that JAX's token chain does not cover (fast_dispatch's
    markers), run wherever dispatched computations are waited for. ``due`` (a plain
    attribute: barriers read it on their fast path) turns true once one has something to
    wait for."""

    def __init__(self) -> None:
        self.waits: list[Callable[[], None]] = []
        self.due = False


_dispatch_waits = _DispatchWaits()


def add_dispatch_wait(wait: Callable[[], None]) -> None:
    """Runs ``wait()`` wherever hostfeed waits for the computations dispatched so far
    (``barrier_wait``, ``stop_outfeed_receiver``, eager taps, exit), once
    :func:`dispatch_waits_due` was called: for computations whose completion JAX's effect
    tokens do not tell. ``wait`` raises what went wrong."""
    _dispatch_waits.waits.append(wait)


def dispatch_waits_due(due: bool = True) -> None:
    """Says whether the waits added with :func:`add_dispatch_wait` have anything to wait
    for (a forked child, which has no computations, says False)."""
    _dispatch_waits.due = due


def _run_dispatch_waits() -> None:
    for wait in _dispatch_waits.waits:
        wait()


def _dispatch_waits_for_jax() -> None:
    """What ``jax.effects_barrier()`` runs first: the waits, so that it still waits for
    every computation that taps (which the user's code sees as having an effect). Not on
    the consumer thread (a computation may be waiting for it); a wait's failure is left to
    the computations' callers and ``barrier_wait``."""
    if _dispatch_waits.due and not _receiver.in_callback_thread():
        with contextlib.suppress(Exception):
            _run_dispatch_waits()


_jax_effects_barrier = _compat.install_effects_barrier_hook(_dispatch_waits_for_jax)


# Hooks of other modules (the recorder), run by `barrier` after the receiver has processed
# everything (each returns an exception to raise, or None) and at exit after the receiver
# has shut down.
_barrier_hooks: list[Callable[[], Optional[BaseException]]] = []
_exit_hooks: list[Callable[[], None]] = []


def add_barrier_hook(hook: Callable[[], Optional[BaseException]]) -> None:
    """Runs ``hook()`` in every ``barrier_wait`` once everything dispatched is processed;
    an exception it returns is raised (after a callback exception, which comes first)."""
    _barrier_hooks.append(hook)


def add_exit_hook(hook: Callable[[], None]) -> None:
    """Runs ``hook()`` at interpreter exit, after the receiver drained and shut down."""
    _exit_hooks.append(hook)


_fork_hooks: list[Callable[[], None]] = []


def add_fork_hook(hook: Callable[[], None]) -> None:
    """Runs ``hook()`` in a child process created by ``os.fork``, after the receiver was
    reset there (see :func:`_after_fork_in_child`)."""
    _fork_hooks.append(hook)


def _after_fork_in_child() -> None:
    """``os.register_at_fork(after_in_child=...)``: only the forking thread exists in the
    child, so the receiver's consumer thread and the recorders' writer threads are gone.
    The child starts with a fresh, stopped receiver (its queue empty, nothing for a barrier
    to wait for; the next host callback starts a consumer) and no open recorder, and exits
    at once. JAX itself is not fork-safe: the child should not compute with it."""
    _receiver.after_fork_in_child()
    _last_exception.clear()
    # Computations of the parent: their tokens mean nothing here (waiting would hang).
    _compat.runtime_tokens.clear()
    _life.lock = threading.Lock()
    _registry.lock = threading.Lock()
    for hook in _fork_hooks:
        hook()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def check_not_in_callback(what: str) -> None:
    """Raises CallbackContextError on the consumer thread, where ``what`` would wait for
    the thread itself."""
    if _receiver.in_callback_thread():
        raise CallbackContextError(
            f"hostfeed: {what} was called from inside a host callback; it waits for the "
            f"callback thread itself and would deadlock. Call it from the main program instead")


class _Marks:
    """The barriers' marks, numbered in the order they are pushed; ``joined`` turns true
    once a joined (global-view, shard by shard) consumer exists: before, nothing can be
    held and barriers push no marks."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.last = 0
        self.joined = False


_marks = _Marks()


def _push_marker(name: str, action: Callable[[], None]) -> bool:
    """Pushes an eager message that runs ``action()`` in queue order on the consumer
    thread; False if the receiver has shut down (interpreter exit: nothing is held any
    more, the exit swept every set)."""
    try:
        _receiver.push_eager(Consumer(lambda arrays, ordinal: action(), name, "tap"), (), 0)
    except ReceiverError:
        return False
    return True


def _push_mark() -> int | None:
    """Pushes a barrier mark (see :class:`_Dispatcher`); returns its number (None: no
    joined consumer exists, or the receiver has shut down)."""
    if not _marks.joined:
        return None
    with _marks.lock:
        _marks.last += 1
        epoch = _marks.last
    return epoch if _push_marker("barrier mark", lambda: _dispatch.mark(epoch)) else None


def _wait_and_sweep() -> Optional[BaseException]:
    """Waits for the computations dispatched so far (:func:`_effects_barrier`) between a
    mark and a sweep, so that the consumer drops the joined sets those computations left
    incomplete (their executions failed) when it reaches the sweep; returns the error of a
    computation that failed. After a failure, a second mark and wait cover the sets whose
    first part came after the first mark: every set held before the second mark belongs
    to a computation that has finished by then. The first mark is pushed only when some
    device is held (marks are messages, seen in the receiver's counters); a set left by a
    failure that no computation reported is then dropped by the next barrier."""
    epoch = _push_mark() if _dispatch.held else None
    failed_run = _effects_barrier()
    if failed_run is not None:
        epoch = _push_mark()
        again = _effects_barrier()
        failed_run = failed_run if again is None else again
    if epoch is not None:
        swept = epoch
        _push_marker("barrier sweep", lambda: _dispatch.sweep(swept))
    return failed_run


def drain_dispatched(timeout: Optional[float] = None) -> Optional[BaseException]:
    """Waits for the computations dispatched so far, then for the receiver to process
    everything they sent; returns (not raises) the error of a computation that failed.
    Consumers no compiled computation refers to any more are released on the way."""
    unleased: list[int] = []
    if _registry.dying or _registry.pending_release:  # consumers no longer referred to
        with _registry.lock:
            unleased = _count_dead_leases() + _registry.pending_release
            _registry.pending_release = []
    failed_run = None
    try:
        if _life.configured:
            failed_run = _wait_and_sweep()
            _receiver.barrier(timeout)
    except BaseException:
        with _registry.lock:
            _registry.pending_release += unleased
        raise
    # Every computation dispatched before this barrier finished and its messages ran, so
    # none can name these consumers any more.
    if unleased:
        _release_unleased(unleased)
    return failed_run


def barrier(logging_name: Optional[str] = None, timeout: Optional[float] = None) -> None:
    """``barrier_wait``: waits for the computations dispatched so far, then for the receiver
    to process everything they sent; raises what went wrong meanwhile."""
    tokens = _compat.runtime_tokens
    if (timeout is None and _life.configured and not tokens.current_tokens
            and not tokens.output_runtime_tokens and not _registry.dying
            and not _registry.pending_release and not _last_exception
            and not _dispatch.held and not logger.isEnabledFor(logging.DEBUG)):
        # Nothing dispatched with JAX's token chain since the last barrier, nothing to
        # release or report: the fast-dispatch markers, if any device has one, then only
        # the queue's own barrier (two atomic loads when idle; it refuses the consumer
        # thread with the same CallbackContextError) and the hooks (a recorder's returns
        # at once when none is open). Without markers, as cheap as jax.effects_barrier.
        failed = None
        if _dispatch_waits.due:
            check_not_in_callback("barrier_wait")
            try:
                _run_dispatch_waits()
            except Exception as exc:  # noqa: BLE001 - raised below, after the callbacks'
                failed = exc
        _receiver.barrier(None)
        errors = None
        for hook in _barrier_hooks:
            e = hook()
            if e is not None:
                errors = [*(errors or []), e]
        if not _last_exception and errors is None and failed is None:
            return
        _raise_pending(failed, errors or [])
        return
    check_not_in_callback("barrier_wait")
    if timeout is not None:
        timeout = settings.seconds(timeout, "barrier_wait(timeout)")
    debug = logger.isEnabledFor(logging.DEBUG)
    if debug:
        logger.debug("barrier_wait[%s]: start", logging_name or "")
    failed_run = drain_dispatched(timeout)
    hook_errors = ([e for e in (hook() for hook in _barrier_hooks) if e is not None]
                   if _barrier_hooks else [])
    if debug:
        logger.debug("barrier_wait[%s]: done", logging_name or "")
    if not _last_exception and failed_run is None and not hook_errors:
        return
    _raise_pending(failed_run, hook_errors)


def _raise_pending(failed_run: Optional[BaseException],
                   hook_errors: list[BaseException]) -> None:
    """Raises, for ``barrier``: the last callback exception, else a hook's error, else the
    failure of a dispatched computation."""
    last = take_last_exception()
    if last is not None:
        exc, formatted = last
        for e in hook_errors:
            logger.error("hostfeed: also failed before this barrier_wait: %s", e)
        raise CallbackException(
            "There were exceptions during callback processing. "
            f"Last one was: {formatted} (its traceback is above)") from exc
    if hook_errors:
        raise hook_errors[0]
    if failed_run is not None:
        raise failed_run


def stop() -> None:
    """``stop_outfeed_receiver``: processes everything already sent, then stops the
    consumer thread (it restarts by itself on the next message)."""
    if _life.configured:
        if not _receiver.in_callback_thread():
            _wait_and_sweep()  # a failed computation was already reported to its caller
        _receiver.stop(stop_timeout())


def _at_exit() -> None:
    # Drain what computations already sent, then shut down before the interpreter
    # finalises (the consumer thread must not outlive it). Never hangs on a stuck host
    # callback: while this thread waits for the computations, a native watchdog keeps the
    # receiver draining and abandons a callback that makes no progress for
    # HOSTFEED_STOP_TIMEOUT (so computations blocked on a full queue, or calls waiting for
    # it, finish). Each step runs whatever happened to the one before (an error is
    # logged), so the queue is drained and the recorders closed in any case. A pending
    # callback exception is raised here, so it is printed rather than lost.
    try:
        stall = stop_timeout()
    except ValueError as exc:  # validated at import; changed since
        logger.error("hostfeed: at exit: %s; using %s s", exc, settings.DEFAULT_STOP_TIMEOUT)
        stall = settings.DEFAULT_STOP_TIMEOUT
    steps: list[tuple[str, Callable[[], Any]]] = [
        ("starting the exit watchdog", lambda: _receiver.start_exit_watch(stall)),
        ("waiting for the dispatched computations", _effects_barrier),
        # Everything has finished: a joined set still incomplete never will be.
        ("releasing devices held by incomplete joined callbacks", _receiver.push_control),
        ("stopping the exit watchdog", _receiver.stop_exit_watch),
        ("draining the receiver", lambda: _receiver.finalize(stall)),
    ]
    steps += [(f"exit hook {getattr(h, '__qualname__', h)}", h) for h in _exit_hooks]
    for what, step in steps:
        try:
            step()
        except BaseException as exc:  # noqa: BLE001 - logged; the next steps still run
            logger.error("hostfeed: at exit, %s failed: %s: %s", what,
                         type(exc).__name__, exc)
    last = take_last_exception()
    if last is not None:
        raise CallbackException("There were exceptions during callback processing. "
                                f"Last one was: {last[1]} (its traceback is above)"
                                ) from last[0]
