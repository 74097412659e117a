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
import functools
import logging
import threading
import traceback
from typing import Any, Optional
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
registrations = _receiver.registrations
in_callback_thread = _receiver.in_callback_thread
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


# ----------------------------------------------------------------------------------------
# Consumers and the dispatcher.


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


class _Registry:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        # Index = consumer id; id 0 is reserved. Entries live for the whole process because
        # compiled executables embed their ids.
        self.consumers: list[Consumer | None] = [None]
        self.ids: dict[Any, int] = {}


_registry = _Registry()


def register(key: Any, make: Callable[[], Consumer]) -> int:
    """Returns the consumer id for ``key``, registering ``make()`` under it if new."""
    with _registry.lock:
        cid = _registry.ids.get(key)
        if cid is None:
            consumer = make()
            cid = len(_registry.consumers)
            _registry.consumers.append(consumer)
            _registry.ids[key] = cid
            _receiver.set_consumer_name(cid, consumer.name)
        return cid


_last_exception: list[tuple[BaseException, str]] = []


def record_exception(exc: BaseException, where: str) -> None:
    """Logs ``exc`` with its traceback and keeps it for the next ``barrier_wait``."""
    formatted = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    logger.error("hostfeed: postponing exception raised in %s:\n%s", where, formatted)
    _last_exception[:] = [(exc, formatted)]


def take_last_exception() -> tuple[BaseException, str] | None:
    """Returns and clears the recorded callback exception."""
    return _last_exception.pop() if _last_exception else None


Message = tuple  # (consumer_id, device_ordinal, flags, arrays, reply_or_None, run_id)


class _Dispatcher:
    """Runs batches of messages, in queue order, on the consumer thread.

    Each device's messages must reach the host in that device's program order, and a
    joined tap (a global-view tap whose devices each send a part) counts as happening at
    its position on every device that sent a part. So once a device has sent a part whose
    set is incomplete, the device is *held*: its later messages wait here until the set
    completes (then they run, in order) or is abandoned. Messages of other devices go on.

    A held device whose next message comes from another execution (XLA run id) has
    finished the execution of the held part; if the set is still incomplete, another
    device failed before sending its part, so the set is dropped (with a warning; the
    execution's failure reached its caller) and the device released.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        # device ordinal -> (joiner, run of its pending part, messages held back)
        self.held: dict[int, tuple[Any, int, collections.deque]] = {}

    def __call__(self, batch: Iterable[Message]) -> None:
        consumers = _registry.consumers
        with self.lock:
            for msg in batch:
                self._offer(consumers, msg)

    def _offer(self, consumers: list, msg: Message) -> None:
        held = self.held
        if held:
            h = held.get(msg[1])
            if h is not None:
                if msg[5] != h[1]:
                    self._abandon(h[0], h[1], f"device {msg[1]} went on to another execution")
                    h = held.get(msg[1])
                if h is not None:
                    h[2].append(msg)
                    return
        done = self._deliver(consumers, msg)
        if done:
            self._release(consumers, done)

    def _deliver(self, consumers: list, msg: Message) -> tuple[int, ...] | None:
        """Runs one message; for the part that completes a joined set, returns the devices
        that took part (to be released)."""
        cid, ordinal, _flags, arrays, reply, run = msg
        consumer = consumers[cid]
        try:
            if consumer.kind == "tap":
                consumer.invoke(arrays, ordinal)
            elif consumer.kind == "call":
                if reply.pending:  # a call nobody waits for any more is not run
                    consumer.invoke(arrays, ordinal, reply)
            else:
                done = consumer.invoke.add(run, arrays, ordinal, reply)
                if done is None:
                    self.held[ordinal] = (consumer.invoke, run, collections.deque())
                return done
        except BaseException as exc:  # noqa: BLE001 - recorded and re-raised by barrier_wait
            name = consumer.name if consumer else cid
            record_exception(exc, f"host callback {name}")
            if reply is not None:
                reply.fail(f"hostfeed: host callback {name} failed: "
                           f"{type(exc).__name__}: {exc}")
        return None

    def _release(self, consumers: list, ordinals: Sequence[int]) -> None:
        """Runs the messages held back for ``ordinals``, in each device's order (a device
        that sends another incomplete part on the way is held again)."""
        for ordinal in ordinals:
            h = self.held.pop(ordinal, None)
            if h is not None:
                for msg in h[2]:
                    self._offer(consumers, msg)

    def _abandon(self, joiner: Any, run: int, why: str) -> None:
        dropped = joiner.abandon(run, f"hostfeed: a part of a global-view host call never "
                                      f"arrived ({why}); the call was failed")
        logger.warning("hostfeed: dropped an incomplete global-view host callback of "
                       "execution %s (%s); its execution failed on another device",
                       run, why)
        self._release(_registry.consumers, dropped)

    def abandon_incomplete(self, why: str) -> None:
        """Drops every incomplete set and releases the devices it holds (after a failed
        execution, once everything dispatched has finished)."""
        with self.lock:
            while self.held:
                ordinal, (joiner, run, _) = next(iter(self.held.items()))
                self._abandon(joiner, run, why)
                self._release(_registry.consumers, [ordinal])  # in case it was not dropped


_dispatch = _Dispatcher()


@functools.cache
def device_for_ordinal(ordinal: int) -> jax.Device:
    """The local ``jax.Device`` whose XLA device ordinal is ``ordinal``."""
    for d in jax.local_devices():
        hw = getattr(d, "local_hardware_id", None)
        if (hw if hw is not None else d.id) == ordinal:
            return d
    return jax.local_devices()[ordinal]


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
        if max_queue_bytes is None and not _life.configured:
            max_queue_bytes = settings.max_queue_bytes()
        _receiver.start(_dispatch, XLA_DTYPES, max_queue_bytes)
        if threading.current_thread() is threading.main_thread():
            _receiver.install_interrupt_watch()  # Ctrl-C fails a waiting hcb.call
        _life.configured = True
        if not _life.atexit_registered:
            atexit.register(_at_exit)
            _life.atexit_registered = True


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


def _effects_barrier() -> Optional[BaseException]:
    """Waits for dispatched computations; returns (not raises) the error of one that failed.

    A computation that failed (for example a `call` whose host function raised, which its
    caller has already seen) leaves JAX's chain of effect tokens in the failed state, so
    every later computation with host callbacks would fail with the same stale error. The
    chain is reset here, once the failure has been waited for.
    """
    try:
        jax.effects_barrier()
        return None
    except Exception as exc:  # noqa: BLE001 - returned to barrier_wait
        _compat.runtime_tokens.clear()
        return exc


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


def check_not_in_callback(what: str) -> None:
    """Raises CallbackContextError on the consumer thread, where ``what`` would wait for
    the thread itself."""
    if _receiver.in_callback_thread():
        raise CallbackContextError(
            f"hostfeed: {what} was called from inside a host callback; it waits for the "
            f"callback thread itself and would deadlock. Call it from the main program instead")


def drain_dispatched(timeout: Optional[float] = None) -> Optional[BaseException]:
    """Waits for the computations dispatched so far, then for the receiver to process
    everything they sent; returns (not raises) the error of a computation that failed."""
    failed_run = None
    if _life.configured:
        failed_run = _effects_barrier()
        _receiver.barrier(timeout)
        if failed_run is not None:
            _dispatch.abandon_incomplete("an execution failed")
    return failed_run


def barrier(logging_name: Optional[str] = None, timeout: Optional[float] = None) -> None:
    """``barrier_wait``: waits for the computations dispatched so far, then for the receiver
    to process everything they sent; raises what went wrong meanwhile."""
    check_not_in_callback("barrier_wait")
    if timeout is not None:
        timeout = settings.seconds(timeout, "barrier_wait(timeout)")
    logger.debug("barrier_wait[%s]: start", logging_name or "")
    failed_run = drain_dispatched(timeout)
    hook_errors = [e for e in (hook() for hook in _barrier_hooks) if e is not None]
    logger.debug("barrier_wait[%s]: done", logging_name or "")
    last = take_last_exception()
    if last is not None:
        exc, formatted = last
        for e in hook_errors:
            logger.error("hostfeed: also failed before this barrier_wait: %s", e)
        raise CallbackException(
            "There were exceptions during callback processing. "
            f"Last one was: {formatted}") from exc
    if hook_errors:
        raise hook_errors[0]
    if failed_run is not None:
        raise failed_run


def stop() -> None:
    """``stop_outfeed_receiver``: processes everything already sent, then stops the
    consumer thread (it restarts by itself on the next message)."""
    if _life.configured:
        if not _receiver.in_callback_thread():
            _effects_barrier()  # a failed computation was already reported to its caller
        _receiver.stop(stop_timeout())


def _at_exit() -> None:
    # Drain what computations already sent, then shut down before the interpreter
    # finalises (the consumer thread must not outlive it). Never hangs on a stuck host
    # callback: the computations are waited for in a helper thread while the receiver
    # is kept draining (a callback that makes no progress for HOSTFEED_STOP_TIMEOUT is
    # abandoned), and a pending callback exception is raised here, so it is printed
    # rather than lost.
    stall = stop_timeout()
    finished = threading.Event()

    def wait_computations() -> None:
        try:
            _effects_barrier()
        finally:
            finished.set()

    threading.Thread(target=wait_computations, name="hostfeed-exit", daemon=True).start()
    try:
        while not finished.wait(0.05):
            if not _receiver.drain(stall, 0.05):
                logger.warning("hostfeed: interpreter exit did not wait for computations "
                               "whose host callbacks make no progress")
                break
    finally:
        _receiver.finalize(stall)
        for hook in _exit_hooks:
            try:
                hook()
            except Exception as exc:  # noqa: BLE001 - printed; the other hooks still run
                logger.error("hostfeed: at exit: %s", exc)
    last = take_last_exception()
    if last is not None:
        raise CallbackException("There were exceptions during callback processing. "
                                f"Last one was: {last[1]}") from last[0]
