"""The receiver's lifecycle: lazy start, the barrier (``barrier_wait``), stop, fork and the
``atexit`` drain, and the hooks other modules add to them (the recorder's flush and close,
fast dispatch's waits)."""
from __future__ import annotations

import atexit
import contextlib
import logging
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any, Optional

import numpy as np

from .. import _receiver
from .._receiver.error import CallbackContextError, ReceiverError
from . import compat, errors, settings
from .consumers import Consumer, ConsumerKind, count_dead_leases, registry, release_unleased
from .dispatcher import dispatcher
from .dtypes import XLA_DTYPES
from .errors import CallbackException, take_last_exception

logger = logging.getLogger("hostfeed")


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
    if max_queue_bytes is None and _life.configured and _receiver.host.is_running():
        return
    with _life.lock:
        if not _life.configured:
            if max_queue_bytes is None:
                max_queue_bytes = settings.max_queue_bytes()
            pool = settings.buffer_pool_bytes()
            if pool is not None:
                _receiver.host.set_buffer_pool_bytes(pool)
            _receiver.host.set_inline_calls(settings.call_thread() == "device")
        _receiver.host.start(dispatcher.state(), XLA_DTYPES, compat.TraceMe, max_queue_bytes)
        if threading.current_thread() is threading.main_thread():
            _receiver.host.install_interrupt_watch()  # Ctrl-C/SIGTERM fail a waiting hcb.call
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
    _receiver.host.push_eager(Consumer(invoke, name, ConsumerKind.TAP), arrays, nbytes)


def wait_processed() -> None:
    """Waits until the receiver has processed every message enqueued so far (GIL released;
    raises nothing a callback raised: that is for ``barrier_wait``)."""
    _queue_barrier(None)


def wait_for_dispatched(effect: Any) -> None:
    """Waits until the computations dispatched with ``effect`` have finished, so that every
    message they send is already in the queue.

    Uses the effect's runtime token, which JAX chains through every computation that has
    the (ordered) effect. A computation that failed has finished too: its error reaches its
    caller, and ``barrier_wait`` reports it.
    """
    token = compat.runtime_tokens.current_tokens.get(effect)
    if token is not None:
        # A failure is reported by the computation and by barrier_wait.
        with contextlib.suppress(Exception):
            token.block_until_ready()
    if _dispatch_waits.due and not _receiver.host.in_callback_thread():
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
    return dict(_receiver.host.stats())


def set_max_queue_bytes(bound: int) -> None:
    """Sets the queue's byte bound; blocked devices re-check at once."""
    _receiver.host.set_max_queue_bytes(bound)


def reset_peak() -> None:
    """Resets ``peak_queued_bytes`` to the bytes queued now."""
    _receiver.host.reset_peak()


def histograms() -> dict[str, list[tuple[int, int]]]:
    """The timing histograms, ``{"device_ns": [(upper_ns, count), ...], "handover_ns":
    [...]}``: each tap's device-side cost and each message's hand-over latency."""
    return dict(_receiver.host.histograms())


def reset_histograms() -> None:
    """Empties the timing histograms."""
    _receiver.host.reset_histograms()


def set_timing(enabled: bool) -> bool:
    """Turns the timing histograms on or off; returns the previous setting."""
    return _receiver.host.set_timing(enabled)


def _wait_dispatched() -> tuple[Optional[BaseException], bool]:
    """Waits for the computations dispatched so far, by any thread; returns (not raises)
    the error of one of this thread's that failed, and whether any failed (another
    thread's caller has its error).

    A computation that failed (for example a `call` whose host function raised, which its
    caller has already seen) leaves JAX's chain of effect tokens in the failed state, so
    every later computation with host callbacks would fail with the same stale error. The
    chain of this thread is reset here, once the failure has been waited for.
    """
    failed = None
    if _dispatch_waits.due:
        try:
            _run_dispatch_waits()
        except Exception as exc:  # noqa: BLE001 - returned to barrier_wait
            failed = exc
    # Another thread's computation that failed (seen by fast_dispatch.wait_for_threads): its
    # caller has the error; here it only means that a joined set may never complete.
    elsewhere, _dispatch_waits.failed_elsewhere = _dispatch_waits.failed_elsewhere, False
    tokens = compat.runtime_tokens
    if not tokens.current_tokens and not tokens.output_runtime_tokens:
        return failed, elsewhere  # nothing dispatched here with tokens since the last barrier
    try:
        _jax_effects_barrier()  # the markers ran above
        return failed, elsewhere
    except Exception as exc:  # noqa: BLE001 - returned to barrier_wait
        compat.runtime_tokens.clear()
        return exc, True


def _effects_barrier() -> Optional[BaseException]:
    """Waits for the computations dispatched so far, by any thread (:func:`_wait_dispatched`);
    returns (not raises) the error of one of this thread's that failed."""
    return _wait_dispatched()[0]


class _DispatchWaits:
    """Waits for computations that JAX's token chain does not cover (fast_dispatch's
    markers), run wherever dispatched computations are waited for. ``due`` (a plain
    attribute: barriers read it on their fast path) turns true once one has something to
    wait for."""

    def __init__(self) -> None:
        self.waits: list[Callable[[], None]] = []
        self.due = False
        # A wait saw a computation of another thread fail (see note_failed_elsewhere).
        self.failed_elsewhere = False


_dispatch_waits = _DispatchWaits()


def note_failed_elsewhere() -> None:
    """Notes that a wait saw a computation fail that it leaves to another thread to report:
    the next barrier that waits for held messages sweeps (:func:`_queue_barrier`)."""
    _dispatch_waits.failed_elsewhere = True


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
    if _dispatch_waits.due and not _receiver.host.in_callback_thread():
        with contextlib.suppress(Exception):
            _run_dispatch_waits()


_jax_effects_barrier = compat.install_effects_barrier_hook(_dispatch_waits_for_jax)


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
    _receiver.record.after_fork_in_child()
    errors.clear()
    # Computations of the parent: their tokens mean nothing here (waiting would hang).
    compat.runtime_tokens.clear()
    _life.lock = threading.Lock()
    registry.lock = threading.Lock()
    for hook in _fork_hooks:
        hook()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def check_not_in_callback(what: str) -> None:
    """Raises CallbackContextError on the consumer thread, where ``what`` would wait for
    the thread itself."""
    if _receiver.host.in_callback_thread():
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


_marks = _Marks()


def _push_marker(name: str, action: Callable[[], None]) -> bool:
    """Pushes an eager message that runs ``action()`` in queue order on the consumer
    thread; False if the receiver has shut down (interpreter exit: nothing is held any
    more, the exit swept every set)."""
    try:
        _receiver.host.push_eager(
            Consumer(lambda arrays, ordinal: action(), name, ConsumerKind.TAP), (), 0)
    except ReceiverError:
        return False
    return True


def _push_mark() -> int | None:
    """Pushes a barrier mark (see :class:`hostfeed._src.dispatcher.Dispatcher`); returns
    its number (None: no joined consumer exists, or the receiver has shut down)."""
    if not registry.joined:
        return None
    with _marks.lock:
        _marks.last += 1
        epoch = _marks.last
    return epoch if _push_marker("barrier mark", lambda: dispatcher.mark(epoch)) else None


def _wait_and_sweep(sweep: bool = False) -> Optional[BaseException]:
    """Waits for the computations dispatched so far, by any thread (:func:`_wait_dispatched`);
    returns the error of one of this thread's that failed. Only when one (of any thread)
    failed can a joined set be incomplete for good (its execution failed on some device
    before sending its part), so only then, and
    only if a joined consumer exists, a mark, a second wait and a sweep follow: every set held
    before that mark belongs to a computation that has finished by the end of the second
    wait, so the consumer drops those still incomplete when it reaches the sweep. Without
    a failure nothing is dropped, whatever other threads dispatch meanwhile (a set whose
    execution is still running completes when its last part comes). A failed call of the
    portable transport (no execution ids) is forgotten by that sweep too, reported or not
    (``Dispatcher.awaits_sweep``). ``sweep``: a mark, a wait and a sweep follow anyway (a
    host function failed: a part it should have joined may never come)."""
    failed_run, failed = _wait_dispatched()
    if failed or failed_run is not None or dispatcher.awaits_sweep or sweep:
        epoch = _push_mark()
        again = _effects_barrier()
        failed_run = failed_run if again is None else again
        if epoch is not None:
            _push_marker("barrier sweep", lambda: dispatcher.sweep(epoch))
    return failed_run


#: How long a barrier waits while only messages held back behind a joined tap keep it
#: waiting before it waits for the computations dispatched since (:func:`_queue_barrier`).
HELD_PATIENCE = 0.5


def _queue_barrier(timeout: Optional[float]) -> Optional[BaseException]:
    """The receiver's barrier: waits until every message enqueued so far has run, those the
    dispatcher holds back included (a device's later messages behind a joined tap whose
    other parts have not come), ``timeout`` seconds at most; returns (not raises) the error
    of a computation that failed meanwhile.

    A held message runs once its set's other parts come. They may come from an execution
    dispatched after this barrier waited for the computations (by another thread: the
    device ran that execution's part before the message), which completes it without any
    help, unless it failed before sending them. So when only held messages keep the
    receiver's barrier waiting for :data:`HELD_PATIENCE` seconds, this waits for the
    computations dispatched since and sweeps the sets of one that failed
    (:func:`_wait_and_sweep`; also when a host function or another thread's computation
    failed meanwhile, since a set whose part it failed to send or join never completes),
    then waits again.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    failed = None
    while True:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        if _receiver.host.barrier(left, HELD_PATIENCE):
            return failed
        # A batch for the consumer: messages an abandoned consumer left run first.
        _push_marker("barrier nudge", lambda: None)
        failed_elsewhere, _dispatch_waits.failed_elsewhere = _dispatch_waits.failed_elsewhere, False
        again = _wait_and_sweep(sweep=errors.pending() or failed_elsewhere)
        failed = failed if again is None else again


def drain_dispatched(timeout: Optional[float] = None) -> Optional[BaseException]:
    """Waits for the computations dispatched so far, then for the receiver to process
    everything they sent; returns (not raises) the error of a computation that failed.
    Consumers no compiled computation refers to any more are released on the way."""
    unleased: list[int] = []
    if registry.dying or registry.pending_release:  # consumers no longer referred to
        with registry.lock:
            unleased = count_dead_leases() + registry.pending_release
            registry.pending_release = []
    failed_run = None
    try:
        if _life.configured:
            failed_run = _wait_and_sweep()
            again = _queue_barrier(timeout)
            failed_run = failed_run if again is None else again
    except BaseException:
        with registry.lock:
            registry.pending_release += unleased
        raise
    # Every computation dispatched before this barrier finished and its messages ran, so
    # none can name these consumers any more.
    if unleased:
        release_unleased(unleased)
    return failed_run


def barrier(logging_name: Optional[str] = None, timeout: Optional[float] = None) -> None:
    """``barrier_wait``: waits for the computations dispatched so far, then for the receiver
    to process everything they sent; raises what went wrong meanwhile."""
    tokens = compat.runtime_tokens
    if (timeout is None and _life.configured and not tokens.current_tokens
            and not tokens.output_runtime_tokens
            and not dispatcher.awaits_sweep and not registry.dying
            and not registry.pending_release and not errors.pending()
            and not dispatcher.held and not logger.isEnabledFor(logging.DEBUG)):
        # Nothing dispatched with JAX's token chain since the last barrier, nothing to
        # release or report: the fast-dispatch markers, if any device has one, then only
        # the queue's own barrier (two atomic loads when idle; it refuses the consumer
        # thread with the same CallbackContextError) and the hooks (a recorder's returns
        # at once when none is open). Without markers, as cheap as jax.effects_barrier.
        failed: Optional[BaseException] = None
        if _dispatch_waits.due:
            check_not_in_callback("barrier_wait")
            try:
                _run_dispatch_waits()
            except Exception as exc:  # noqa: BLE001 - raised below, after the callbacks'
                failed = exc
        again = _queue_barrier(None)
        failed = failed if again is None else again
        hook_errors = None
        for hook in _barrier_hooks:
            e = hook()
            if e is not None:
                hook_errors = [*(hook_errors or []), e]
        if not errors.pending() and hook_errors is None and failed is None:
            return
        _raise_pending(failed, hook_errors or [])
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
    if not errors.pending() and failed_run is None and not hook_errors:
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
        stall = stop_timeout()
        if not _receiver.host.in_callback_thread():
            # A computation may be waiting for a call whose host function never returns:
            # where a device runs its computations in order (TPUs, GPUs), even the marker
            # that the wait dispatches waits behind it. The watchdog abandons such a host
            # function after the stop timeout (failing its call), as at exit.
            _receiver.host.start_exit_watch(stall)
            try:
                _wait_and_sweep()  # a failed computation was already reported to its caller
            finally:
                _receiver.host.stop_exit_watch()
        _receiver.host.stop(stall)


def _at_exit() -> None:
    # Drain what computations already sent, then shut down before the interpreter
    # finalises (the consumer thread must not outlive it). Never hangs on a stuck host
    # callback: while this thread waits for the computations, a native watchdog keeps the
    # receiver draining and abandons a callback that makes no progress for
    # HOSTFEED_STOP_TIMEOUT (so computations blocked on a full queue, or calls waiting for
    # it, finish). Each step runs whatever happened to the one before (an error is
    # logged), so the queue is drained and the recorders closed in any case. A pending
    # callback exception that the user's code never saw is printed, rather than lost.
    try:
        stall = stop_timeout()
    except ValueError as exc:  # validated at import; changed since
        logger.error("hostfeed: at exit: %s; using %s s", exc, settings.DEFAULT_STOP_TIMEOUT)
        stall = settings.DEFAULT_STOP_TIMEOUT
    steps: list[tuple[str, Callable[[], Any]]] = [
        ("starting the exit watchdog", lambda: _receiver.host.start_exit_watch(stall)),
        ("waiting for the dispatched computations", _effects_barrier),
        # Everything has finished: a joined set still incomplete never will be.
        ("releasing devices held by incomplete joined callbacks", _receiver.host.push_control),
        ("stopping the exit watchdog", _receiver.host.stop_exit_watch),
        ("draining the receiver", lambda: _receiver.host.finalize(stall)),
    ]
    steps += [(f"exit hook {getattr(h, '__qualname__', h)}", h) for h in _exit_hooks]
    for what, step in steps:
        try:
            step()
        except BaseException as exc:  # noqa: BLE001 - logged; the next steps still run
            logger.error("hostfeed: at exit, %s failed: %s: %s", what,
                         type(exc).__name__, exc)
    _report_unsurfaced()


def _report_unsurfaced() -> None:
    """At exit: prints (on stderr, with its traceback) the last exception of a host
    function that no ``barrier_wait`` raised. Not a failed ``call``'s: its computation
    failed with it, so the user's code saw it (and may have caught it). Printed, not
    raised: Python prints an exception raised by an ``atexit`` function without its
    cause, which holds the traceback."""
    last = errors.take_unsurfaced()
    if last is None:
        return
    report = CallbackException("There were exceptions during callback processing that "
                               f"no barrier_wait() raised. Last one was: {last[1]} (its "
                               f"traceback is above)")
    report.__cause__ = last[0]
    sys.stderr.write("".join(traceback.format_exception(report)))
    sys.stderr.write(_exit_status_note())
    sys.stderr.flush()


def _exit_status_note() -> str:
    """Makes a program that would exit with status 0 exit with the status
    ``HOSTFEED_CALLBACK_ERROR_EXIT`` says (1 by default) for an exception no barrier
    raised, as an uncaught exception would (a non-zero status of its own is kept); says
    so in a line for the report."""
    env = settings.CALLBACK_ERROR_EXIT_ENV
    try:
        status = settings.callback_error_exit()
    except ValueError as exc:  # validated at import; changed since
        logger.error("hostfeed: at exit: %s; using 1", exc)
        status = 1
    if status == 0:
        return ""
    if not _receiver.host.exit_status_if_clean(status):
        return (f"hostfeed: the exit status cannot be changed on this platform for it "
                f"(no glibc on_exit); {env} is ignored\n")
    return (f"hostfeed: for it, the program exits with status {status} where it would exit "
            f"with 0, as for an uncaught exception ({env}=0 keeps status 0, as the legacy "
            f"module did)\n")
