"""The native transport: one XLA FFI custom call per operation (``hostfeed_tap``,
``hostfeed_call``, ``hostfeed_check``, ``hostfeed_failure``) with a handler in Rust that
copies the operands into hostfeed's queue, taking and returning hostfeed's ordered-effect
token.

The custom calls have the same names on every platform: XLA keeps one handler per
(name, platform), so the CPU handlers are registered for ``cpu`` at import and those of a
GPU platform (a row of :data:`GPU_PLATFORMS`) at the first lowering for it.

Adding a GPU platform: its driver folder in the Rust core and a row in the core's
``gpu::PLATFORMS`` table (which the binding exposes as ``_receiver.gpu.GPU_PLATFORMS``), then
a row here (its JAX plugins).
"""
from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import logging
import threading
from collections.abc import Sequence
from typing import Any, Optional

import jax
import numpy as np

from ... import _receiver
from .. import compat
from ..primitives import host_callback_effect
from .base import Transport

TAP_TARGET = "hostfeed_tap"
CALL_TARGET = "hostfeed_call"
CHECK_TARGET = "hostfeed_check"
FAILURE_TARGET = "hostfeed_failure"

for _name, _capsule in _receiver.host.registrations().items():
    jax.ffi.register_ffi_target(_name, _capsule, platform="cpu")

#: The platforms with the core's compute kernels (the summaries' custom calls, registered
#: here at import): XLA:CPU has no single-pass way to take several reductions.
KERNEL_PLATFORMS = ("cpu",)

for _name, _capsule in _receiver.host.summary_registrations().items():
    for _platform in KERNEL_PLATFORMS:
        jax.ffi.register_ffi_target(_name, _capsule, platform=_platform)


class GpuPlatform:
    """hostfeed's handlers for one GPU platform, registered with JAX for ``xla_platform`` at
    the first lowering for ``name``, where JAX can have a backend of it here (one of its
    ``plugins`` is installed and the driver library loads).

    Example:
        >>> platform("rocm").xla_platform
        'ROCM'
    """

    def __init__(self, name: str, xla_platform: str, title: str, plugins: tuple[str, ...],
                 packages: str) -> None:
        self.name, self.xla_platform, self.title = name, xla_platform, title
        self.plugin_names, self.packages = plugins, packages
        self.lock = threading.Lock()
        self.tried = False
        self.reason: Optional[str] = None

    @property
    def driver(self) -> Any:
        """The platform's native side (``_receiver.gpu.GpuPlatform``): ``registrations()``,
        ``driver_error()``, ``driver_version()``, ``driver_path()``, ``pool_stats()``."""
        return _receiver.gpu.GPU_PLATFORMS[self.name]

    def installed_plugins(self) -> list[str]:
        """The JAX plugins of this platform installed, found without importing or
        initialising them."""
        names = {ep.name for ep in importlib.metadata.entry_points(group="jax_plugins")
                 if ep.name.startswith(f"xla_{self.name}")}
        for name in self.plugin_names:
            try:
                if importlib.util.find_spec(f"jax_plugins.{name}") is not None:
                    names.add(name)
            except (ImportError, ValueError):
                pass
        return sorted(names)

    def _register(self) -> Optional[str]:
        plugins = self.installed_plugins()
        if not plugins:
            return f"no JAX {self.xla_platform} plugin is installed ({self.packages})"
        why = self.driver.driver_error()
        if why is not None:
            return f"{why} (JAX {self.xla_platform} plugin: {', '.join(plugins)})"
        try:
            for name, capsule in self.driver.registrations().items():
                jax.ffi.register_ffi_target(name, capsule, platform=self.xla_platform)
        except Exception as exc:  # noqa: BLE001 - reported where the platform is lowered for
            return (f"registering the {self.xla_platform} handlers failed: "
                    f"{type(exc).__name__}: {exc}")
        return None

    def status(self) -> Optional[str]:
        """Why the handlers are not registered (None: they are); registers them on the
        first call.

        The lowering for the platform calls this, so registration happens once JAX has
        initialised its backends: the plugin then takes the handlers at once, and a
        failure is reported here instead of inside the plugin's initialisation (where it
        would also keep JAX's own handlers from registering). Without a backend,
        computations still lower for the platform (JAX holds the handlers until a plugin
        initialises, if ever).
        """
        with self.lock:
            if not self.tried:
                self.reason = self._register()
                self.tried = True
                if self.reason is not None:
                    logging.getLogger("hostfeed").debug(
                        "hostfeed: %s handlers not registered: %s", self.xla_platform,
                        self.reason)
            return self.reason

    def has_backend(self) -> bool:
        try:
            return bool(jax.devices(self.name))
        except RuntimeError:
            return False

    def unavailable(self) -> Optional[str]:
        """Why the handlers cannot serve this platform's backend in this process (None:
        they can, or there is no such backend, where computations still lower natively)."""
        reason = self.status()
        return reason if reason is not None and self.has_backend() else None


#: The GPU platforms with native handlers: a row per platform.
GPU_PLATFORMS: tuple[GpuPlatform, ...] = (
    GpuPlatform("cuda", "CUDA", "CUDA", ("xla_cuda12", "xla_cuda13"),
                "jax-cuda12-plugin / jax-cuda13-plugin"),
    GpuPlatform("rocm", "ROCM", "ROCm", ("xla_rocm", "xla_rocm60", "xla_rocm7"),
                "jax-rocm7-plugin / jax-rocm60-plugin"),
)

#: The platforms with native handlers, as a phrase ("CPU, CUDA and ROCm GPUs").
TITLES = "CPU, " + " and ".join(p.title for p in GPU_PLATFORMS) + " GPUs"

#: Platforms that hostfeed has native handlers for.
PLATFORMS: tuple[str, ...] = ("cpu", *(p.name for p in GPU_PLATFORMS))


def platform(name: str) -> GpuPlatform:
    """The row of GPU platform ``name``.

    Example:
        >>> platform("cuda").name
        'cuda'
    """
    for row in GPU_PLATFORMS:
        if row.name == name:
            return row
    raise ValueError(f"hostfeed has no native handlers for GPU platform {name!r}; it has "
                     f"{[p.name for p in GPU_PLATFORMS]}")


def unavailable(name: str) -> Optional[str]:
    """Why the native handlers cannot serve platform ``name`` here (None: they can).

    Example:
        >>> unavailable("cpu") is None
        True
    """
    if name == "cpu":
        return None
    if name not in PLATFORMS:
        return f"hostfeed has no native handlers for {name}"
    return platform(name).unavailable()


# ---- the transport (:class:`hostfeed._src.transports.Transport`) ---------------------------

def prepare(ctx: Any, rule_platform: Optional[str]) -> None:
    """Before the rule registered for ``rule_platform`` (None: the rule of every platform
    without native handlers) lowers: refuses clearly where the handlers cannot serve."""
    if rule_platform is None:  # only a forced native transport gets here
        platforms = ", ".join(compat.lowering_platforms(ctx))
        raise NotImplementedError(
            f"hostfeed's native host callbacks run on {TITLES} only; this computation "
            f"targets {platforms} and HOSTFEED_TRANSPORT=native forbids the portable "
            f"transport (JAX's host-callback lowering). Unset HOSTFEED_TRANSPORT (or set it "
            f"to 'jax'), or run it on CPU (jax.default_device(jax.devices('cpu')[0])).")
    if rule_platform != "cpu":
        gpu = platform(rule_platform)
        reason = gpu.status()
        if reason is not None and gpu.has_backend():
            raise NotImplementedError(
                f"hostfeed cannot run host callbacks on this {gpu.xla_platform} backend: "
                f"{reason}")


def end_scope(ctx: Any, token: Any) -> None:
    """Nothing at the end of a token scope: the handlers have run when the computation
    ends."""
    del ctx, token


# ---- emitting the custom calls -------------------------------------------------------------


def _custom_call(ctx: Any, target: str, args: Sequence[Any], avals_in: Sequence[Any],
                 avals_out: Sequence[Any], per_device: bool, **attrs: Any) -> Any:
    """The custom call ``target`` with hostfeed's token in and out; sets the context's
    output token and returns the operation."""
    token = ctx.tokens_in.get(host_callback_effect)
    sub_ctx = dataclasses.replace(
        ctx, avals_in=[compat.abstract_token, *avals_in],
        avals_out=[compat.abstract_token, *avals_out])
    op = compat.build_ffi_lowering_function(target, has_side_effect=True)(
        sub_ctx, token, *args, **attrs)
    if per_device and not compat.shardy_partitioner():
        compat.set_sharding(ctx.module_context, op, compat.manual_op_sharding())
    ctx.set_tokens_out(ctx.tokens_in.update_tokens(
        compat.mlir.TokenSet({host_callback_effect: op.results[0]})))
    return op


def tap(ctx: Any, args: Sequence[Any], avals_in: Sequence[Any], per_device: bool, *,
        consumer_id: int, flags: int) -> Any:
    """A tap of ``args``; returns the operation that orders after it."""
    return _custom_call(ctx, TAP_TARGET, args, avals_in, [], per_device,
                        consumer_id=np.int64(consumer_id), flags=np.int64(flags))


def call(ctx: Any, args: Sequence[Any], avals_in: Sequence[Any], avals_out: Sequence[Any],
         per_device: bool, *, consumer_id: int, flags: int, timeout_ms: int,
         name: str) -> tuple[Any, list]:
    """A call of the host function ``name`` on ``args``; returns the operation and its
    results (none for a synchronous tap)."""
    op = _custom_call(ctx, CALL_TARGET, args, avals_in, avals_out, per_device,
                      consumer_id=np.int64(consumer_id), flags=np.int64(flags),
                      timeout_ms=np.int64(timeout_ms), name=name)
    return op, list(op.results[1:])


def check(ctx: Any, args: Sequence[Any], avals_in: Sequence[Any], per_device: bool) -> None:
    """Fails the computation when the status (``args[0]``) of a call names a failure."""
    _custom_call(ctx, CHECK_TARGET, args, avals_in, [], per_device)


def failure(ctx: Any, status: Any, per_device: bool) -> list:
    """The text of the failed call ``status`` names, as ``uint8[n]``. No token: ordered
    after the call by its data dependency on the call's status."""
    op = compat.build_ffi_lowering_function(FAILURE_TARGET, has_side_effect=False)(ctx, status)
    if per_device and not compat.shardy_partitioner():
        compat.set_sharding(ctx.module_context, op, compat.manual_op_sharding())
    return list(op.results)


def kernel(ctx: Any, target: str, value: Any, constants: Sequence[np.ndarray]) -> Any:
    """The core's compute kernel ``target`` (an FFI target of :data:`KERNEL_PLATFORMS`)
    on ``value``, with ``constants`` as further operands; returns its results."""
    ctx = ctx.replace(avals_in=[*ctx.avals_in,
                                *(jax.core.ShapedArray(c.shape, c.dtype) for c in constants)])
    return jax.ffi.ffi_lowering(target)(ctx, value, *map(compat.mlir.ir_constant, constants))


#: hostfeed's handlers. Its policies: a summary at selected steps is computed in the
#: ``cond`` that sends it, records leave through the handlers inside the computation (a
#: copy there costs less than a copy of an output), and summaries use the core's kernels
#: (on :data:`KERNEL_PLATFORMS`).
TRANSPORT = Transport(
    name="native", summarize_every_step=False, records_as_outputs=False, native_kernels=True,
    one_computation_at_a_time=False, prepare=prepare, end_scope=end_scope, tap=tap, call=call,
    check=check, failure=failure)
