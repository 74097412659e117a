"""Lowering of hostfeed's primitives: where each callback runs (one device, each device of
a manual region, or a global view placed by :mod:`hostfeed._src.placement`), which
consumer on the host a message names (``consumer_id``, registered with
:mod:`hostfeed._src.consumers` when the callback is lowered), and the rules registered
with JAX for every platform. What is emitted for a tap, a call, a status check or a
failure message is the transport's business (:mod:`hostfeed._src.transports`): native
custom calls, or JAX's own host-callback lowering.
"""
from __future__ import annotations

import contextlib
import functools
import threading
from typing import Any
from collections.abc import Callable, Iterator, Sequence

import jax

from .. import _receiver
from . import compat, consumers, lifecycle, settings, transports
from .record import lowering as record_lowering
from .placement import (Where, check_device_index, lower_global_call, lower_global_tap,
                        lower_per_device_call, where)
from .primitives import (CallbackSpec, RecordSpec, ShardParts, call_check_p, failure_message_p,
                         host_call_p, host_callback_effect, legacy_sync, outside_call_p)
from .consumers import ConsumerKind
from .consumers import make_tap_invoker
from .runtime import make_call_invoker, make_direct_call, make_joined_call, make_joined_tap

def _runs_here(ac: Any, device_index: int) -> bool:
    """Whether device ``device_index`` of a global-view computation is this process's
    (True when that cannot be told)."""
    devices = getattr(ac, "device_assignment", None)
    if not devices or device_index >= len(devices):
        return True
    return bool(devices[device_index].process_index == jax.process_index())


def _consumer_id(ctx: Any, lease: consumers.Lease) -> int:
    # The module keeps the lease (and so the consumer) alive as long as any executable
    # compiled from it lives.
    ctx.module_context.add_keepalive(lease)
    return lease.cid


def _tap_lease(spec: CallbackSpec, transforms: tuple,
               shard_parts: ShardParts | None) -> consumers.Lease:
    def make() -> consumers.Consumer:
        invoke = make_tap_invoker(spec, transforms)
        if shard_parts is None:
            return consumers.Consumer(invoke, spec.name, ConsumerKind.TAP)
        return consumers.Consumer(make_joined_tap(invoke, shard_parts, spec.name), spec.name,
                                 ConsumerKind.JOINED)

    return consumers.register((spec, transforms, shard_parts), make)


def _call_consumer_id(ctx: Any, spec: CallbackSpec, result_treedef: Any, result_avals: tuple,
                      shard_parts: ShardParts | None) -> int:
    def make() -> consumers.Consumer:
        if shard_parts is None:
            return consumers.Consumer(make_call_invoker(spec, result_treedef, result_avals),
                                     spec.name, ConsumerKind.CALL,
                                     make_direct_call(spec, result_treedef, result_avals))
        return consumers.Consumer(make_joined_call(spec, result_treedef, shard_parts),
                                 spec.name, ConsumerKind.JOINED)

    key = (spec, "call", result_treedef, result_avals, shard_parts)
    return _consumer_id(ctx, consumers.register(key, make))


# Later uses of a tapped operand read the tap's output instead (`_depend_later_uses`).
#
# The invariant: no MLIR operation is kept past the lowering rule that meets it. What the
# rule needs of earlier taps it finds in the blocks that enclose the insertion point, up
# to the function being lowered: those are being built right now, so every operation in
# them is alive and belongs to this lowering context. JAX may lower a branch, a loop
# body or a whole sub-jaxpr into a function of its own (jax 0.12.1 lowers `cond` as a
# detached function that is later inlined by cloning, `mlir._emit_lowering_rule_as_fun`);
# an operation kept from one rule to the next could then be one of a function already
# cloned and dropped, and touching it is a use after free (a SIGSEGV while lowering). So
# nothing here is module-wide: each tap's rule looks around itself, or leaves its block to
# the token scope whose rule encloses it (`later_uses_at_scope_end`: a block held on this
# thread while that rule runs, and walked once at its end).
_ADD_DEPENDENCY = "mhlo.add_dependency"
#: Where the walk up from a tap stops: the function being lowered.
_FUNCTION = "func.func"


class _Scope:
    """A token scope being lowered: its block (where its computation is lowered inline)
    and whether a tap of that block left its later uses to the scope's end."""

    __slots__ = ("block", "walk")

    def __init__(self, block: Any) -> None:
        self.block = block
        self.walk = False


class _Scopes(threading.local):
    """The token scopes being lowered on this thread, innermost last
    (:func:`later_uses_at_scope_end`)."""

    def __init__(self) -> None:
        self.stack: list[_Scope] = []


_scopes = _Scopes()


@contextlib.contextmanager
def later_uses_at_scope_end() -> Iterator[None]:
    """Around the inline lowering of a token scope's computation (``fast_dispatch``): the
    taps lowered in the scope's own block leave :func:`_depend_later_uses` there to the end
    of the scope, one walk of the block for all of them, instead of one walk per tap
    (quadratic in the taps of a block: 200 taps along a chain spent 40% of their lowering
    walking). Taps in nested blocks still walk their own blocks, up to the scope's. The
    block is held only while the scope's rule runs, which encloses every rule it walks
    for: the invariant above holds."""
    scope = _Scope(compat.mlir.ir.InsertionPoint.current.block)
    _scopes.stack.append(scope)
    try:
        yield
    finally:
        _scopes.stack.pop()
    if scope.walk:
        for view in scope.block.operations:
            if view.operation.name == _ADD_DEPENDENCY:
                _redirect_uses_after(view.operation)


def _depend_later_uses() -> None:
    """Makes the ops lowered after earlier taps of the blocks that enclose the insertion
    point (up to the function being lowered), which read a tapped operand itself (a tap
    whose result the program ignores, as ``id_print`` is mostly used), read the tap's
    output instead: the same value, ordered after the tap (``mhlo.add_dependency``, the
    one operation of that name hostfeed emits and JAX never does; redirecting a use to it
    is right whoever made it). XLA CPU's fusion otherwise duplicates the chain of
    elementwise ops that produced the operand into each later op and into each later tap's
    operand (N ignored taps along a chain compiled O(N^2) ops, and compiled that much
    slower). Uses lowered after a block's last tap keep the operand (one duplicated chain
    at most); so do the uses inside a region lowered before the tap of an enclosing
    block, once that region's own taps are done (a region's ops are not fused with the
    enclosing computation's). Called by each tap's rule after it emitted its
    dependencies: found, not remembered."""
    scope = _scopes.stack[-1] if _scopes.stack else None
    block = compat.mlir.ir.InsertionPoint.current.block
    while block is not None:
        if scope is not None and block == scope.block:
            scope.walk = True  # the scope's end walks its block once, for every tap in it
            return
        for view in block.operations:
            if view.operation.name == _ADD_DEPENDENCY:
                _redirect_uses_after(view.operation)
        view = block.owner
        if view is None:
            return
        owner = view.operation
        if owner.name == _FUNCTION:
            return
        block = owner.block


def _in_block(op: Any, block: Any) -> Any:
    """``op``, or the op of ``block`` that contains it; None when ``block`` does not
    contain it (the walk stops at the function: a function being lowered on its own, as
    JAX 0.12.1 lowers a ``cond``, is in no block, and asking for its block crashes)."""
    while op.name != _FUNCTION:
        parent = op.parent
        if parent is None:
            return None
        if op.block == block:
            return op
        op = parent.operation
    return None


def _redirect_uses_after(dependency: Any) -> None:
    """Redirects the uses of ``dependency``'s operand by ops after it in its block (or
    nested in such an op) to ``dependency``'s result, but for the tap itself and the tap's
    other dependencies (those on the same token)."""
    value, token = dependency.operands[0], dependency.operands[1]
    block = dependency.block
    tap = token.owner
    own_tap = None if isinstance(tap, compat.mlir.ir.Block) else tap.operation
    out = dependency.results[0]
    for use in list(value.uses):
        user = use.owner.operation
        if user == own_tap or (user.name == _ADD_DEPENDENCY and user.operands[1] == token):
            continue
        anchor = _in_block(user, block)
        if anchor is not None and anchor != own_tap and dependency.is_before_in_block(anchor):
            user.operands[use.operand_number] = out


def _call(ctx: Any, transport: transports.Transport, args: Sequence[Any],
          avals_in: Sequence[Any], avals_out: Sequence[Any], per_device: bool, *,
          consumer_id: int, flags: int, timeout_ms: int, name: str) -> tuple[Any, list]:
    """``transport.call``, refused on the receiver thread where the device runs one
    computation at a time (a TPU): one that waits for the receiver, compiled by a host
    function the receiver runs, would wait for itself."""
    if transport.one_computation_at_a_time:
        lifecycle.check_not_in_callback(
            "a computation with synchronous taps" if flags & _receiver.messages.FLAG_SYNC_TAP
            else "a computation containing hcb.call")
    return transport.call(ctx, args, avals_in, avals_out, per_device, consumer_id=consumer_id,
                          flags=flags, timeout_ms=timeout_ms, name=name)


def _outside_call_lowering(ctx: Any, transport: transports.Transport, *args: Any,
                           callback: CallbackSpec, **params: Any) -> list:
    # A tap or a record, told apart once, by the type of the spec that was bound.
    return _TAP_RULES[type(callback)](ctx, transport, args, callback, params)


def _lower_tap(ctx: Any, transport: transports.Transport, args: Sequence[Any],
               callback: CallbackSpec, params: dict) -> list:
    """A tap (``id_tap``, ``id_print``, a watch): where it runs, its consumer, emitted as
    the transport says (a synchronous one as a call without results)."""
    context, ac = where(ctx)
    n, transforms = params["nr_tapped_args"], params["transforms"]
    shard_parts = params.get("shard_parts")
    sync = params.get("sync")
    if sync is None:  # the legacy mode: as the legacy module did on these platforms
        sync = legacy_sync(transports.platforms(ctx))
    if context in (Where.GLOBAL, Where.PARTIAL_MANUAL) and shard_parts is None:
        lower_global_tap(ctx, ac, args[:n], dict(params, callback=callback, sync=sync))
        return list(args)
    if context is Where.SINGLE:
        check_device_index(params["device_index"], 1, "run this computation")
    cid = _consumer_id(ctx, _tap_lease(callback, transforms, shard_parts))
    return _emit(ctx, transport, args, n, context, cid, shard_parts, sync, callback.name)


def _lower_record(ctx: Any, transport: transports.Transport, args: Sequence[Any],
                  callback: RecordSpec, params: dict) -> list:
    """A record (``Recorder.record``): where it goes is the recorder's lowering's
    (:func:`hostfeed._src.record.lowering.lower`); emitted as an asynchronous tap."""
    context, ac = where(ctx)
    n = params["nr_tapped_args"]
    lease = record_lowering.lower(ctx, context, ac, args[:n], dict(params, callback=callback),
                                  gathered_here=_runs_here(ac, params["device_index"]),
                                  joined=_tap_lease)
    if lease is None:  # lowered already: written part by part, or gathered first
        return list(args)
    return _emit(ctx, transport, args, n, context, _consumer_id(ctx, lease),
                 params.get("shard_parts"), False, callback.name)


#: The rule of each type of spec ``outside_call_p`` binds.
_TAP_RULES: dict[type, Callable[..., list]] = {CallbackSpec: _lower_tap,
                                                RecordSpec: _lower_record}


def _emit(ctx: Any, transport: transports.Transport, args: Sequence[Any], n: int,
          context: Where, cid: int, shard_parts: ShardParts | None, sync: bool,
          name: str) -> list:
    """Emits a tap of the first ``n`` of ``args`` for consumer ``cid`` (a synchronous one:
    a call without results, which the device waits for, with no time limit: the tap
    function may take as long as it takes), and returns the operands, ordered after it."""
    lifecycle.ensure_started()
    flags = _receiver.messages.FLAG_SHARD if shard_parts is not None else 0
    if sync:
        call_op, _ = _call(ctx, transport, args[:n], ctx.avals_in[:n], [],
                           context is Where.PER_DEVICE, consumer_id=cid,
                           flags=flags | _receiver.messages.FLAG_SYNC_TAP, timeout_ms=0,
                           name=name)
    else:
        call_op = transport.tap(ctx, args[:n], ctx.avals_in[:n], context is Where.PER_DEVICE,
                                consumer_id=cid, flags=flags)
    # Identity on every operand, but the outputs depend on the tap's token: code that uses
    # them runs after the tap. Without this dependency the tap is a side consumer of its
    # operand, and XLA CPU's instruction fusion duplicates the whole elementwise chain
    # that produced the operand into every later fusion (N taps along a chain of
    # elementwise ops compile O(N^2) ops). kAddDependency is a no-op at run time: its
    # output shares the operand's buffer, nothing is copied.
    if call_op is None:
        # A transport with nothing to order after (a TPU's send: later uses of the operand
        # do not wait for the transfer, and MHLO's add-dependency does not legalize to
        # what a TPU compiles).
        return list(args)
    # Not an operand in host memory (a pinned_host entry parameter): XLA:GPU's host
    # offloading refuses any operation on one but a few (custom calls among them, not
    # kAddDependency); nothing was fused into it, so it needs no dependency either.
    token = ctx.tokens_out.get(host_callback_effect)
    outs = [a if compat.in_host_memory(aval) else compat.add_dependency(a, token)
            for a, aval in zip(args, ctx.avals_in)]
    _depend_later_uses()
    return outs


def _call_timeout_ms() -> int:
    seconds = settings.call_timeout()
    return 0 if seconds is None else max(1, round(seconds * 1000))


def _host_call_lowering(ctx: Any, transport: transports.Transport, *args: Any,
                        callback: CallbackSpec, result_treedef: Any,
                            result_avals: tuple, device_index: int, with_status: bool = False,
                            shard_parts: ShardParts | None = None) -> list:
    context, ac = where(ctx)
    params = dict(callback=callback, result_treedef=result_treedef,
                  result_avals=result_avals, device_index=device_index)
    if context in (Where.GLOBAL, Where.PARTIAL_MANUAL) and not with_status:
        return lower_global_call(ctx, ac, args, params)
    if context is Where.PER_DEVICE and not with_status:
        return lower_per_device_call(ctx, ac, args, params)
    if context is Where.SINGLE:
        check_device_index(device_index, 1, "run this computation")
    cid = _call_consumer_id(ctx, callback, result_treedef, result_avals, shard_parts)
    if context is not Where.SINGLE:
        consumers.note_several_devices(cid)
    lifecycle.ensure_started()
    flags = ((_receiver.messages.FLAG_STATUS_OUTPUT if with_status else 0)
             | (_receiver.messages.FLAG_SHARD if shard_parts is not None else 0))
    return _call(ctx, transport, args, ctx.avals_in, ctx.avals_out, context is Where.PER_DEVICE,
                 consumer_id=cid, flags=flags, timeout_ms=_call_timeout_ms(),
                 name=callback.name)[1]


def _call_check_lowering(ctx: Any, transport: transports.Transport, status: Any,
                         *message: Any) -> list:
    context, _ = where(ctx)
    transport.check(ctx, [status, *message], ctx.avals_in, context is Where.PER_DEVICE)
    return []


def _failure_message_lowering(ctx: Any, transport: transports.Transport, status: Any) -> list:
    # No token: ordered after the call by its data dependency on the call's status.
    context, _ = where(ctx)
    return transport.failure(ctx, status, context is Where.PER_DEVICE)


#: What each rule lowers, as a compile failure's note names it.
_OPERATIONS = {_outside_call_lowering: "taps (id_tap, id_print, Recorder.record)",
               _host_call_lowering: "hcb.call",
               _call_check_lowering: "hcb.call status check",
               _failure_message_lowering: "hcb.call failure message"}


def _on(platform: str | None, rule: Any) -> Any:
    """``rule`` for ``platform`` (None: every platform without native handlers), called
    with the transport kept for the context (``transports.for_context``: chosen at the
    first rule of the computation, read by every later one), once that transport has
    prepared the context (or refused it: on a GPU platform whose handlers could not
    register on an existing backend, only a forced native transport reaches the native
    rule, and it refuses clearly)."""

    @functools.wraps(rule)
    def lower(ctx: Any, *args: Any, **params: Any) -> list:
        transport = transports.for_context(ctx)
        transport.prepare(ctx, platform)
        platforms = "/".join(transports.platforms(ctx))
        compat.note_lowered(ctx, f"{_OPERATIONS.get(rule, rule.__name__)} "
                                 f"({transport.name} transport on {platforms})")
        return rule(ctx, transport, *args, **params)
    return lower


for _prim, _rule in ((outside_call_p, _outside_call_lowering),
                     (host_call_p, _host_call_lowering),
                     (call_check_p, _call_check_lowering),
                     (failure_message_p, _failure_message_lowering)):
    # Lowered in place, not as a cached function inlined later: a tap's rule then sees the
    # blocks it is emitted into (`_depend_later_uses`); caching gained nothing, as every
    # tap's parameters differ.
    for _platform in transports.RULE_PLATFORMS:
        compat.register_lowering(_prim, _on(_platform, _rule), platform=_platform,
                                 cacheable=False)
    compat.register_lowering(_prim, _on(None, _rule), cacheable=False)
