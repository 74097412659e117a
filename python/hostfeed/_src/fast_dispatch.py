"""Fast dispatch: computations that tap on one device take JAX's C++ dispatch path.

JAX dispatches a jitted function through its C++ fast path only when the executable has
no effect at all; any other computation goes through JAX's Python dispatch on every call,
which is most of what calling a small jitted function with one tap costs (docs/performance.md
says which benchmark shows it). hostfeed's effect is ordered so that JAX threads a
token through the taps *inside* a computation (program order, through control flow) and,
between computations, passes the token of one to the next.

On one device the second is not needed: a device runs the computations dispatched to it in
the order they were dispatched (XLA's CPU client chains each execution on a device to the
previous one; GPU and TPU computations run in stream order), which is the order the legacy
module promised ("for each device in the order in which the send operations were
performed"). So, where a computation runs on a single device, hostfeed lowers it with its
taps nested in a *token scope*: a primitive that creates the token inside the computation
and threads it through the taps exactly as JAX would, while the computation itself no
longer has hostfeed's effect, takes no token argument and returns none, and dispatches
through the C++ path.

What JAX's token chain did besides ordering, hostfeed does itself: ``barrier_wait`` (and
everything that waits for dispatched computations) runs a marker computation on every
device that such a computation ran on and waits for it, so every computation dispatched
there before has finished and sent its taps. Computations on several devices keep JAX's
token chain (their devices do not order them against single-device ones on CPU). JAX keeps
that chain per thread (``jax.effects_barrier()`` waits for the calling thread's
computations only), so hostfeed's waits also wait for the newest such computation of every
other thread (:func:`wait_for_threads`).

``HOSTFEED_FAST_DISPATCH=0`` (read when hostfeed is imported) lowers every computation
with JAX's token chain, as before.
"""
from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Callable, Iterator
from typing import Any, Optional

import jax
import numpy as np

from . import compat, lifecycle, lowering, settings, transports
from .primitives import HostCallbackEffect

__all__ = ["token_scope_p", "enabled", "token_chain_lowering", "scoped_devices",
           "devices_set_aside", "wait_for_devices", "wait_for_threads", "forget_devices"]


class _Mode:
    """Whether computations on one device are lowered in a token scope
    (``HOSTFEED_FAST_DISPATCH``; off inside :func:`token_chain_lowering`)."""

    enabled = settings.fast_dispatch()


_mode = _Mode()


def enabled() -> bool:
    """Whether fast dispatch is on (``HOSTFEED_FAST_DISPATCH``, read at import; default on).

    Example:
        >>> isinstance(enabled(), bool)
        True
    """
    return _mode.enabled


@contextlib.contextmanager
def token_chain_lowering() -> Iterator[None]:
    """Computations lowered (compiled) within the block keep JAX's token chain, as with
    ``HOSTFEED_FAST_DISPATCH=0``; for comparing the two (the bench's dispatch section).

    Example:
        >>> with token_chain_lowering():
        ...     enabled()
        False
    """
    saved, _mode.enabled = _mode.enabled, False
    try:
        yield
    finally:
        _mode.enabled = saved


# ---- The token scope ---------------------------------------------------------------------
token_scope_p = compat.Primitive("hostfeed_token_scope")
token_scope_p.multiple_results = True


def _scope_abstract_eval(*avals: Any, jaxpr: Any, outer_effects: Any) -> tuple:
    del avals
    inner, _ = compat.open_jaxpr(jaxpr)
    return [v.aval for v in inner.outvars], set(outer_effects)


token_scope_p.def_effectful_abstract_eval(_scope_abstract_eval)


def _scope_impl(*args: Any, jaxpr: Any, outer_effects: Any) -> Any:
    raise RuntimeError("hostfeed: the token scope exists only in computations being lowered")


token_scope_p.def_impl(_scope_impl)


def _scope_dce(used_outputs: list, eqn: Any) -> tuple:
    # Only ever built after JAX's last dead-code elimination; should another one run, the
    # scope (whose taps are the point) stays whole.
    del used_outputs
    return [True] * len(eqn.invars), eqn


compat.register_dce_rule(token_scope_p, _scope_dce)


# At the end of a token scope, after its last callback, the ``end_scope`` of the transport
# kept for the lowering context, the one its callbacks' rules were lowered with (a TPU's
# fence: its callbacks may run after the computation finished, see
# ``transports.tpu.end_scope``).
def _scope_lowering(ctx: Any, *args: Any, jaxpr: Any, outer_effects: Any) -> Any:
    del outer_effects
    inner, _ = compat.open_jaxpr(jaxpr)
    outer = ctx.tokens_in
    ours = [e for e in compat.ordered_effects.filter_in(inner.effects)
            if isinstance(e, HostCallbackEffect)]
    tokens = compat.TokenSet({**dict(outer.items()),
                               **{e: compat.create_token() for e in ours}})
    with lowering.later_uses_at_scope_end():
        outs, tokens_out = compat.lower_jaxpr_inline(ctx, inner, tokens, *args)
    if ours:  # what the transport does at the end of a scope (a TPU's fence)
        end_scope = transports.for_context(ctx).end_scope
        for e in ours:
            end_scope(ctx, tokens_out.get(e))
    ctx.set_tokens_out(compat.TokenSet({e: tokens_out.get(e) for e, _ in outer.items()}))
    return outs


compat.mlir.register_lowering(token_scope_p, _scope_lowering)


def _in_token_scope(jaxpr: Any) -> Any:
    """``jaxpr`` (a ClosedJaxpr, or a Jaxpr from jax 0.12) as one token-scope equation with
    the same inputs, outputs and effects less hostfeed's."""
    j, rewrap = compat.open_jaxpr(jaxpr)
    outer_effects = frozenset(e for e in j.effects if not isinstance(e, HostCallbackEffect))
    inner = compat.param_jaxpr(compat.convert_constvars_jaxpr(j))
    outvars = [compat.Var(v.aval) for v in j.outvars]
    eqn = compat.new_jaxpr_eqn([*j.constvars, *j.invars], outvars, token_scope_p,
                                {"jaxpr": inner, "outer_effects": outer_effects},
                                set(outer_effects))
    return rewrap(j.replace(outvars=outvars, eqns=[eqn], effects=set(outer_effects)))


# ---- Which computations, on which devices -------------------------------------------------
class _Devices:
    """The devices that token-scoped computations were compiled for, each with its marker."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.markers: dict[Any, Any] = {}  # device -> its marker (waits), or None until used
        # Every device's marker, in order, once all are compiled (None: to be made again);
        # what an idle barrier runs, without taking the lock.
        self.ready: Optional[tuple[Callable[[], None], ...]] = None


_devices = _Devices()


def _rewrite(jaxpr: Any, num_devices: int, assignment: Any) -> Any:
    if not _mode.enabled or num_devices != 1 or not assignment or len(assignment) != 1:
        return None
    j, _ = compat.open_jaxpr(jaxpr)
    if not any(isinstance(e, HostCallbackEffect) for e in j.effects):
        return None
    device = assignment[0]
    if getattr(device, "process_index", 0) != jax.process_index():
        return None  # another process's device: nothing here can wait for it
    with _devices.lock:
        if device not in _devices.markers:
            _devices.markers[device] = None
            _devices.ready = None
    lifecycle.dispatch_waits_due()
    return _in_token_scope(jaxpr)


HOOKED = compat.install_lowering_rewrite(_rewrite)


def scoped_devices() -> tuple:
    """The devices that computations in a token scope were compiled for so far.

    Example:
        >>> isinstance(scoped_devices(), tuple)
        True
    """
    with _devices.lock:
        return tuple(_devices.markers)


def _marker(device: Any) -> Callable[[], None]:
    """The device's marker: runs a tiny computation there and waits until it finished."""
    with _devices.lock:
        m = _devices.markers.get(device)
    if m is None:
        m = _compile_marker(device)
        with _devices.lock:
            _devices.markers[device] = m
    return m


def _compile_marker(device: Any) -> Callable[[], None]:
    operand = jax.device_put(np.zeros((), np.int32), device)
    compiled = jax.jit(lambda v: v + 1).lower(operand).compile()

    def through_jax() -> None:
        compiled(operand).block_until_ready()

    # Straight through the runtime's executable, waiting on the execution's completion
    # token: no output array is built and blocked on, which is most of what the Compiled's
    # call costs for so small a computation. The token is what jax.effects_barrier waits
    # on for computations with unordered effects.
    executable = compiled.runtime_executable()
    if executable is None:
        return through_jax
    try:
        def through_runtime() -> None:
            executable.execute_sharded([operand], with_tokens=True) \
                .consume_token().block_until_ready()

        through_runtime()
        return through_runtime
    except Exception:  # noqa: BLE001 - a runtime without that API: the Compiled's call
        return through_jax


def wait_for_devices() -> None:
    """Waits until every computation dispatched so far to a device that a token-scoped
    computation was compiled for has finished: runs a marker computation there (after all
    of them, in the device's order) and waits for it to finish. A marker never fails on
    account of an earlier computation's failure (that reaches the earlier one's caller)."""
    ready = _devices.ready
    if ready is None:
        with _devices.lock:
            devices = tuple(_devices.markers)
        ready = tuple(_marker(device) for device in devices)
        with _devices.lock:
            if tuple(_devices.markers) == devices:
                _devices.ready = ready
    for marker in ready:
        marker()


@contextlib.contextmanager
def devices_set_aside() -> Iterator[None]:
    """For measuring (the bench): within the block, hostfeed waits as if no token-scoped
    computation had been compiled (as in a process with ``HOSTFEED_FAST_DISPATCH=0``);
    the devices are back afterwards. Dispatch nothing that taps on one device inside it.

    Example:
        >>> with devices_set_aside():
        ...     scoped_devices()
        ()
    """
    with _devices.lock:
        saved, _devices.markers = _devices.markers, {}
        _devices.ready = None
    lifecycle.dispatch_waits_due(False)
    try:
        yield
    finally:
        with _devices.lock:
            _devices.markers = {**saved, **_devices.markers}
            _devices.ready = None
        lifecycle.dispatch_waits_due(bool(_devices.markers) or bool(_threads.newest))


# ---- Other threads' computations in JAX's token chain ------------------------------------
class _Threads:
    """The token of the newest computation with hostfeed's effect that each thread
    dispatched through JAX's token chain (on several devices, or with fast dispatch off),
    by the thread's slot, until a wait saw it finish. A slot, not the thread's id: an id is
    reused once its thread has ended, and the token of an ended thread's computation must
    not be replaced by that of another thread's chain."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.local = threading.local()
        self.slots = itertools.count(1)
        self.newest: dict[int, Any] = {}


_threads = _Threads()


def _dispatched_with_token(token: Any) -> None:
    """(JAX's dispatch, on the dispatching thread.) Notes the thread's newest token."""
    slot = getattr(_threads.local, "slot", None)
    if slot is None:
        slot = _threads.local.slot = next(_threads.slots)
    with _threads.lock:
        _threads.newest[slot] = token
    lifecycle.dispatch_waits_due()


TOKENS_HOOKED = compat.install_token_result_hook(HostCallbackEffect, _dispatched_with_token)


def wait_for_threads() -> None:
    """Waits until the newest computation that each thread dispatched through JAX's token
    chain has finished, so that a barrier in one thread waits for what the others
    dispatched before it (JAX's own barrier waits for the calling thread's chain only).
    Each thread's computations run in its chain's order, so the newest one finishing means
    the earlier ones did. A failed one is left to its caller and to its thread's barriers
    (the chain reports it there); it is only noted for the barriers that wait for held
    messages (``lifecycle.note_failed_elsewhere``)."""
    with _threads.lock:
        newest = list(_threads.newest.items())
    for slot, token in newest:
        try:
            token.block_until_ready()
        except Exception:  # noqa: BLE001 - reported to that thread (see above)
            lifecycle.note_failed_elsewhere()
        with _threads.lock:
            if _threads.newest.get(slot) is token:
                del _threads.newest[slot]


def forget_devices() -> None:
    """Forgets the devices and their markers, and the threads' tokens (a forked child: its
    parent's computations and compiled markers mean nothing there)."""
    _devices.lock = threading.Lock()
    _devices.markers = {}
    _devices.ready = None
    _threads.lock = threading.Lock()
    _threads.newest = {}
    lifecycle.dispatch_waits_due(False)


lifecycle.add_dispatch_wait(wait_for_devices)
lifecycle.add_dispatch_wait(wait_for_threads)
lifecycle.add_fork_hook(forget_devices)
