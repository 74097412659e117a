"""Lowering of hostfeed's primitives to XLA FFI custom calls (``hostfeed_tap``,
``hostfeed_call``, ``hostfeed_check``) that take and return the ordered-effect token.

The custom calls have the same names on every platform: XLA keeps one handler per
(name, platform), so the CPU handlers are registered for ``cpu`` (at import) and the GPU
ones for ``CUDA`` and ``ROCM`` (at the first lowering for ``cuda`` or ``rocm``, see
:func:`cuda_status` and :func:`rocm_status`), and the same lowering serves all.

Each custom call names its host-side consumer by an integer attribute, ``consumer_id``,
registered with :mod:`hostfeed.receiver` when the call is lowered. Where a callback runs
under sharding is decided in :mod:`hostfeed.placement`; the rules below either emit the
custom call directly (one device, or each device of a fully manual region) or lower the
JAX code that placement builds, which binds the primitives again inside a manual region.
"""
from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import logging
import threading
import weakref
from typing import Any, Optional
from collections.abc import Sequence

import jax
import numpy as np

from . import _compat, portable, receiver, recording, settings
from .placement import (Where, check_device_index, lower_global_call, lower_global_tap,
                        lower_parted_record, lower_per_device_parted_record,
                        lower_per_device_call, where)
from .primitives import (call_check_p, failure_message_p, host_call_p, host_callback_effect,
                         outside_call_p)
from .runtime import (CallbackSpec, ShardParts, make_call_invoker, make_joined_call,
                      make_joined_tap, make_tap_invoker)

TAP_TARGET = "hostfeed_tap"
CALL_TARGET = "hostfeed_call"
CHECK_TARGET = "hostfeed_check"
FAILURE_TARGET = "hostfeed_failure"

for _name, _capsule in receiver.registrations().items():
    jax.ffi.register_ffi_target(_name, _capsule, platform="cpu")


# ---- The CUDA and ROCm handlers -----------------------------------------------------------
class _GpuTargets:
    """hostfeed's handlers for one GPU platform (CUDA, ROCm): registered with JAX for
    ``xla_platform`` at the first lowering for ``platform``, where JAX can have a backend
    of it here (one of its plugins is installed and the driver library loads)."""

    def __init__(self, platform: str, xla_platform: str, plugin_names: tuple[str, ...],
                 packages: str) -> None:
        self.platform, self.xla_platform = platform, xla_platform
        self.plugin_names, self.packages = plugin_names, packages
        self.lock = threading.Lock()
        self.tried = False
        self.reason: Optional[str] = None

    def driver(self, what: str) -> Any:
        """The native function ``{platform}_{what}`` (e.g. ``rocm_driver_error``)."""
        return getattr(receiver, f"{self.platform}_{what}")

    def plugins(self) -> list[str]:
        """The JAX plugins of this platform installed, found without importing or
        initialising them."""
        names = {ep.name for ep in importlib.metadata.entry_points(group="jax_plugins")
                 if ep.name.startswith(f"xla_{self.platform}")}
        for name in self.plugin_names:
            try:
                if importlib.util.find_spec(f"jax_plugins.{name}") is not None:
                    names.add(name)
            except (ImportError, ValueError):
                pass
        return sorted(names)

    def register(self) -> Optional[str]:
        """Registers the handlers; returns why they were not, else None."""
        plugins = self.plugins()
        if not plugins:
            return f"no JAX {self.xla_platform} plugin is installed ({self.packages})"
        why = self.driver("driver_error")()
        if why is not None:
            return f"{why} (JAX {self.xla_platform} plugin: {', '.join(plugins)})"
        try:
            for name, capsule in self.driver("registrations")().items():
                jax.ffi.register_ffi_target(name, capsule, platform=self.xla_platform)
        except Exception as exc:  # noqa: BLE001 - reported where the platform is lowered for
            return (f"registering the {self.xla_platform} handlers failed: "
                    f"{type(exc).__name__}: {exc}")
        return None

    def status(self) -> Optional[str]:
        """Why the handlers are not registered (None: they are); registers them on the
        first call."""
        with self.lock:
            if not self.tried:
                self.reason = self.register()
                self.tried = True
                if self.reason is not None:
                    logging.getLogger("hostfeed").debug(
                        "hostfeed: %s handlers not registered: %s", self.xla_platform,
                        self.reason)
            return self.reason

    def has_backend(self) -> bool:
        try:
            return bool(jax.devices(self.platform))
        except RuntimeError:
            return False

    def unavailable(self) -> Optional[str]:
        """Why the handlers cannot serve this platform's backend in this process (None:
        they can, or there is no such backend, where computations still lower natively)."""
        reason = self.status()
        return reason if reason is not None and self.has_backend() else None

    def on(self, rule: Any) -> Any:
        """``rule`` for this platform: registers the handlers first, and refuses clearly
        where a backend exists but the handlers could not be registered (only when
        ``HOSTFEED_TRANSPORT=native`` forbids the portable transport)."""
        def lower(ctx: Any, *args: Any, **params: Any) -> list:
            if portable.active(ctx):
                return rule(ctx, *args, **params)
            reason = self.status()
            if reason is not None and self.has_backend():
                raise NotImplementedError(
                    f"hostfeed cannot run host callbacks on this {self.xla_platform} "
                    f"backend: {reason}")
            return rule(ctx, *args, **params)
        return lower


_CUDA = _GpuTargets("cuda", "CUDA", ("xla_cuda12", "xla_cuda13"),
                    "jax-cuda12-plugin / jax-cuda13-plugin")
_ROCM = _GpuTargets("rocm", "ROCM", ("xla_rocm", "xla_rocm60", "xla_rocm7"),
                    "jax-rocm7-plugin / jax-rocm60-plugin")
_GPUS = (_CUDA, _ROCM)


def gpu_driver(platform: str, what: str) -> Any:
    """hostfeed's native function ``what`` for GPU ``platform`` (``"cuda"`` or ``"rocm"``):
    ``registrations``, ``driver_error``, ``driver_version``, ``driver_path``,
    ``pool_stats``; ``"status"`` is :func:`cuda_status` or
    :func:`rocm_status`. For code that serves both platforms (the GPU check, its bench).

    Example:
        >>> gpu_driver("rocm", "pool_stats")()["allocations"]
        0
    """
    targets = {t.platform: t for t in _GPUS}[platform]
    return targets.status if what == "status" else targets.driver(what)


def cuda_status() -> Optional[str]:
    """Why hostfeed's CUDA handlers are not registered (None: they are); registers them on
    the first call.

    The lowering for ``cuda`` calls this, so registration happens once JAX has
    initialised its backends (lowering needs them): the CUDA plugin then takes the
    handlers at once, and a failure is reported here instead of inside the plugin's
    initialisation (where it would also keep JAX's own CUDA handlers from registering).
    Without a CUDA backend, computations still lower for CUDA (the handlers are held by
    JAX until a CUDA plugin initialises, if ever). The reason names a driver library that
    is not the ``libcuda.so.1`` XLA loaded (both files), since every CUDA handle would be
    foreign to it; ``receiver.cuda_driver_path()`` names the file hostfeed uses.

    Example:
        >>> from hostfeed import lowering
        >>> lowering.cuda_status() is None or "CUDA" in lowering.cuda_status()
        True
    """
    return _CUDA.status()


def rocm_status() -> Optional[str]:
    """Why hostfeed's ROCm handlers are not registered (None: they are); registers them
    (for XLA's platform ``ROCM``) on the first call, as :func:`cuda_status` does for CUDA:
    the reason names a missing JAX ROCm plugin (``jax_plugins.xla_rocm*``) or why the HIP
    runtime (``libamdhip64``) cannot be used; ``receiver.rocm_driver_path()`` names the
    file hostfeed uses. Implemented, not verified on ROCm hardware.

    Example:
        >>> from hostfeed import lowering
        >>> lowering.rocm_status() is None or "ROCM" in lowering.rocm_status()
        True
    """
    return _ROCM.status()


# Without usable handlers, GPU computations take the portable transport.
for _gpu in _GPUS:
    portable.set_native_check(_gpu.platform, _gpu.unavailable)
# ---- end of the GPU handlers -------------------------------------------------------------


def _runs_here(ac: Any, device_index: int) -> bool:
    """Whether device ``device_index`` of a global-view computation is this process's
    (True when that cannot be told)."""
    devices = getattr(ac, "device_assignment", None)
    if not devices or device_index >= len(devices):
        return True
    return bool(devices[device_index].process_index == jax.process_index())


def _consumer_id(ctx: Any, lease: receiver.Lease) -> int:
    # The module keeps the lease (and so the consumer) alive as long as any executable
    # compiled from it lives.
    ctx.module_context.add_keepalive(lease)
    return lease.cid


def _tap_consumer_id(ctx: Any, spec: CallbackSpec, transforms: tuple,
                     shard_parts: ShardParts | None) -> int:
    def make() -> receiver.Consumer:
        invoke = make_tap_invoker(spec, transforms)
        if shard_parts is None:
            return receiver.Consumer(invoke, spec.name, "tap")
        return receiver.Consumer(make_joined_tap(invoke, shard_parts, spec.name), spec.name,
                                 "joined")

    return _consumer_id(ctx, receiver.register((spec, transforms, shard_parts), make))


def _call_consumer_id(ctx: Any, spec: CallbackSpec, result_treedef: Any, result_avals: tuple,
                      shard_parts: ShardParts | None) -> int:
    def make() -> receiver.Consumer:
        if shard_parts is None:
            return receiver.Consumer(make_call_invoker(spec, result_treedef, result_avals),
                                     spec.name, "call")
        return receiver.Consumer(make_joined_call(spec, result_treedef, shard_parts),
                                 spec.name, "joined")

    key = (spec, "call", result_treedef, result_avals, shard_parts)
    return _consumer_id(ctx, receiver.register(key, make))


def _emit(ctx: Any, target: str, args: Sequence[Any], avals_in: Sequence[Any],
          avals_out: Sequence[Any], per_device: bool, **attrs: Any) -> list:
    """The FFI custom call with a token in and out; returns its non-token results (or the
    portable transport's counterpart, on platforms that use it)."""
    return _emit_op(ctx, target, args, avals_in, avals_out, per_device, **attrs)[1]


def _emit_op(ctx: Any, target: str, args: Sequence[Any], avals_in: Sequence[Any],
             avals_out: Sequence[Any], per_device: bool, **attrs: Any) -> tuple[Any, list]:
    """:func:`_emit`, also returning the custom call's operation (where the portable
    transport lowers it, JAX's host callback that produced the token)."""
    if portable.active(ctx):
        results = portable.emit(ctx, target, args, avals_in, avals_out, per_device, **attrs)
        return ctx.tokens_out.get(host_callback_effect).owner, results
    token = ctx.tokens_in.get(host_callback_effect)
    sub_ctx = dataclasses.replace(
        ctx, avals_in=[_compat.abstract_token, *avals_in],
        avals_out=[_compat.abstract_token, *avals_out])
    op = _compat.build_ffi_lowering_function(target, has_side_effect=True)(
        sub_ctx, token, *args, **attrs)
    if per_device and not _compat.use_shardy.value:
        _compat.set_sharding(ctx.module_context, op, _compat.manual_op_sharding())
    token_out, *results = op.results
    ctx.set_tokens_out(
        ctx.tokens_in.update_tokens(_compat.mlir.TokenSet({host_callback_effect: token_out})))
    return op, results


# Taps whose later uses of their operands still read the operands themselves, per module
# being lowered: (custom call, operands, outputs that depend on the tap).
_undepended: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _depend_later_uses(ctx: Any, call_op: Any, operands: Sequence[Any],
                       outputs: Sequence[Any]) -> None:
    """Makes the ops lowered after earlier taps of this module, which read a tapped operand
    itself (a tap whose result the program ignores, as ``id_print`` is mostly used), read
    the tap's output instead: the same value, ordered after the tap. XLA CPU's fusion
    otherwise duplicates the chain of elementwise ops that produced the operand into each
    later op and into each later tap's operand (N ignored taps along a chain compiled O(N^2)
    ops: 200 compiled 8x slower than with the results used). Uses lowered after the
    module's last tap keep the operand (one duplicated chain at most)."""
    pending = _undepended.setdefault(ctx.module_context.module, [])
    for entry in pending:
        _redirect_uses_after(*entry)
    pending.append((call_op, list(operands), list(outputs)))


def _redirect_uses_after(call_op: Any, operands: Sequence[Any],
                         outputs: Sequence[Any]) -> None:
    call = call_op.operation
    block = call.block
    own = {call, *[o.owner.operation for o in outputs]}
    for value, out in zip(operands, outputs):
        for use in list(value.uses):
            user = use.owner.operation
            if user in own:
                continue
            anchor: Any = user  # the user, or the op of this block that contains it
            while anchor is not None and anchor.block != block:
                anchor = anchor.parent
                anchor = None if anchor is None else anchor.operation
            if anchor is not None and anchor not in own and call.is_before_in_block(anchor):
                user.operands[use.operand_number] = out


def _outside_call_lowering(ctx: Any, *args: Any, callback: CallbackSpec,
                               nr_tapped_args: int, transforms: tuple, **params: Any) -> list:
    context, ac = where(ctx)
    shard_parts = params.get("shard_parts")
    record = recording.is_record(callback)
    if record and shard_parts is None and recording.partable(callback, transforms):
        bind_params = dict(params, callback=callback, nr_tapped_args=nr_tapped_args,
                           transforms=transforms)
        if context is Where.GLOBAL and lower_parted_record(ctx, ac, args[:nr_tapped_args],
                                                           bind_params):
            return list(args)
        if context is Where.PER_DEVICE and recording.is_shared(callback):
            lower_per_device_parted_record(ctx, ac, args[:nr_tapped_args], bind_params)
            return list(args)
    if context in (Where.GLOBAL, Where.PARTIAL_MANUAL) and shard_parts is None:
        if record:  # recorded through Python once joined; a clash raises here
            recording.declare_global(callback, transforms, ctx.avals_in[:nr_tapped_args])
        bind_params = dict(params, callback=callback, nr_tapped_args=nr_tapped_args,
                           transforms=transforms)
        # Gathered, a record is written by the process of device `device_index` alone.
        with recording.gathered(_runs_here(ac, params["device_index"])):
            lower_global_tap(ctx, ac, args[:nr_tapped_args], bind_params)
        return list(args)
    if context is Where.SINGLE:
        check_device_index(params["device_index"], 1, "run this computation")
    if record and shard_parts is None:  # a Rust sink takes the messages
        cid = _consumer_id(ctx, recording.consumer_lease(callback, transforms,
                                                         ctx.avals_in[:nr_tapped_args],
                                                         context is not Where.PER_DEVICE))
    elif record and shard_parts is not None and shard_parts.parted:  # one part, to Rust
        cid = _consumer_id(ctx, recording.parted_lease(callback, transforms,
                                                       ctx.avals_in[:nr_tapped_args],
                                                       shard_parts))
    else:
        cid = _tap_consumer_id(ctx, callback, transforms, shard_parts)
    receiver.ensure_started()
    flags = receiver.FLAG_SHARD if shard_parts is not None else 0
    if params.get("sync") and not record:
        # A synchronous tap: a call without results, which the device waits for (with no
        # time limit: the tap function may take as long as it takes).
        call_op, _ = _emit_op(ctx, CALL_TARGET, args[:nr_tapped_args],
                              ctx.avals_in[:nr_tapped_args], [], context is Where.PER_DEVICE,
                              consumer_id=np.int64(cid),
                              flags=np.int64(flags | receiver.FLAG_SYNC_TAP),
                              timeout_ms=np.int64(0), name=callback.name)
    else:
        call_op, _ = _emit_op(ctx, TAP_TARGET, args[:nr_tapped_args],
                              ctx.avals_in[:nr_tapped_args], [], context is Where.PER_DEVICE,
                              consumer_id=np.int64(cid), flags=np.int64(flags))
    # Identity on every operand, but the outputs depend on the tap's token: code that uses
    # them runs after the tap. Without this dependency the tap is a side consumer of its
    # operand, and XLA CPU's instruction fusion duplicates the whole elementwise chain
    # that produced the operand into every later fusion (N taps along a chain of
    # elementwise ops compile O(N^2) ops). kAddDependency is a no-op at run time: its
    # output shares the operand's buffer, nothing is copied.
    token = ctx.tokens_out.get(host_callback_effect)
    outs = [_compat.add_dependency(a, token) for a in args]
    _depend_later_uses(ctx, call_op, args, outs)
    return outs


def _call_timeout_ms() -> int:
    seconds = settings.call_timeout()
    return 0 if seconds is None else max(1, round(seconds * 1000))


def _host_call_lowering(ctx: Any, *args: Any, callback: CallbackSpec, result_treedef: Any,
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
    receiver.ensure_started()
    flags = ((receiver.FLAG_STATUS_OUTPUT if with_status else 0)
             | (receiver.FLAG_SHARD if shard_parts is not None else 0))
    return _emit(ctx, CALL_TARGET, args, ctx.avals_in, ctx.avals_out,
                 context is Where.PER_DEVICE, consumer_id=np.int64(cid), flags=np.int64(flags),
                 timeout_ms=np.int64(_call_timeout_ms()), name=callback.name)


def _call_check_lowering(ctx: Any, status: Any, *message: Any) -> list:
    context, _ = where(ctx)
    _emit(ctx, CHECK_TARGET, [status, *message], ctx.avals_in, [],
          context is Where.PER_DEVICE)
    return []


def _failure_message_lowering(ctx: Any, status: Any) -> list:
    # No token: ordered after the call by its data dependency on the call's status.
    if portable.active(ctx):
        return portable.failure_message(ctx, status)
    context, _ = where(ctx)
    op = _compat.build_ffi_lowering_function(FAILURE_TARGET, has_side_effect=False)(
        ctx, status)
    if context is Where.PER_DEVICE and not _compat.use_shardy.value:
        _compat.set_sharding(ctx.module_context, op, _compat.manual_op_sharding())
    return list(op.results)


def _lowering_unsupported(ctx: Any, *args: Any, **params: Any) -> list:
    platforms = ", ".join(ctx.platforms or ctx.module_context.platforms)
    raise NotImplementedError(
        f"hostfeed's native host callbacks run on CPU, CUDA and ROCm GPUs only; this computation "
        f"targets {platforms} and HOSTFEED_TRANSPORT=native forbids the portable transport "
        f"(JAX's host-callback lowering). Unset HOSTFEED_TRANSPORT (or set it to 'jax'), or "
        f"run it on CPU (jax.default_device(jax.devices('cpu')[0])).")


def _on_other(rule: Any) -> Any:
    """``rule`` for platforms without native handlers: the portable transport, unless
    ``HOSTFEED_TRANSPORT=native``."""
    def lower(ctx: Any, *args: Any, **params: Any) -> list:
        if not portable.active(ctx):
            return _lowering_unsupported(ctx, *args, **params)
        return rule(ctx, *args, **params)
    return lower


for _prim, _rule in ((outside_call_p, _outside_call_lowering),
                     (host_call_p, _host_call_lowering),
                     (call_check_p, _call_check_lowering),
                     (failure_message_p, _failure_message_lowering)):
    # Lowered in place, not as a cached function inlined later: a tap's rule then sees the
    # values of the function it is in (`_depend_later_uses`); caching gained nothing, as
    # every tap's parameters differ.
    _compat.register_lowering(_prim, portable.noting(_rule), platform="cpu", cacheable=False)
    for _gpu in _GPUS:
        _compat.register_lowering(_prim, portable.noting(_gpu.on(_rule)),
                                  platform=_gpu.platform, cacheable=False)
    _compat.register_lowering(_prim, portable.noting(_on_other(_rule)), cacheable=False)
