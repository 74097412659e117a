"""The portable transport: hostfeed's primitives lowered through JAX's own host-callback
lowering (what ``io_callback`` uses), for platforms without hostfeed handlers.

hostfeed's native transport is a custom call per primitive with a handler in Rust, for
CPU, CUDA and ROCm. Everywhere else (TPUs, Intel GPUs, a GPU whose handlers could not
register, and every platform when ``HOSTFEED_TRANSPORT=jax``) the same lowering rules
(:mod:`hostfeed.lowering`, placement included) emit, instead of each custom call, JAX's
host callback (``callback.emit_python_callback``: send/recv to the host on TPUs, the
``xla_ffi_python_*_callback`` custom calls elsewhere), threading hostfeed's ordered token
through it. The Python function it runs on JAX's execution thread does only what a
native handler does:

* a tap hands the operands to hostfeed's queue (``push_host`` copies them, in Rust, into
  the message a native handler would have made, and pushes it as eager taps are pushed:
  the same byte bound and back-pressure) and returns; the tap function
  runs later on hostfeed's consumer thread, so a slow tap function does not hold up the
  device (until the byte bound is reached);
* a call does the same with a reply slot and waits for it (GIL released): the consumer
  thread runs the host function and writes the results into the arrays it returns; a
  failure fails the computation with the host function's message (or, in multi-device
  calls, is reported through the status result like the native handler's);
* ``call_check`` and ``failure_message`` read the failures recorded by calls.

Each message names its consumer by id and carries the device's key, so the dispatcher,
the per-device order, ``tap_with_device``, joined global-view parts and the recorder
(through Python on this path) work as with the native handlers. The executing device is
found from ``stablehlo.partition_id`` (an operand of every callback) and the device
assignment known at lowering.

Which transport a platform uses: :func:`transport_for` (``HOSTFEED_TRANSPORT``, read at
import, forces one for every platform) and :func:`transports`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Optional

import jax
import numpy as np

from . import _compat, receiver, settings
from .primitives import host_callback_effect

__all__ = ["NATIVE_PLATFORMS", "forcing", "forced", "transport_for", "transports", "active", "emit",
           "failure_message", "noting", "set_native_check"]

#: Platforms that hostfeed has native handlers for.
NATIVE_PLATFORMS = ("cpu", "cuda", "rocm")
#: Platforms listed by :func:`transports` besides those of this process's backends.
KNOWN_PLATFORMS = ("cpu", "cuda", "rocm", "tpu")

class _Choice:
    """The transport forced for every platform (None: chosen per platform)."""

    forced: Optional[str] = settings.transport()  # HOSTFEED_TRANSPORT, read at import


_choice = _Choice()

# platform -> check() returning why the native handlers cannot serve that platform here
# (None: they can); set by the lowering (CUDA, ROCm: handlers not registrable on a backend).
_native_checks: dict[str, Callable[[], Optional[str]]] = {}

_U32 = jax.core.ShapedArray((), np.uint32)


def set_native_check(platform: str, check: Callable[[], Optional[str]]) -> None:
    """Makes :func:`transport_for` fall back to the portable transport for ``platform``
    when ``check()`` returns a reason (and no transport is forced)."""
    _native_checks[platform] = check


def forced() -> Optional[str]:
    """The transport forced for every platform: ``HOSTFEED_TRANSPORT`` (read at import) or
    :func:`forcing`; None: chosen per platform."""
    return _choice.forced


@contextlib.contextmanager
def forcing(transport: Optional[str]) -> Iterator[None]:
    """Computations lowered in the block use ``transport`` (``"native"``, ``"jax"``, or None:
    chosen per platform) as if ``HOSTFEED_TRANSPORT`` said so (for benchmarks; not
    thread-safe: one lowering thread).

    Example:
        >>> with forcing("jax"):
        ...     transport_for("cpu")
        'jax'
    """
    before = _choice.forced
    _choice.forced = transport
    try:
        yield
    finally:
        _choice.forced = before


def transport_for(platform: str) -> str:
    """``"native"`` or ``"jax"``: the transport hostfeed's callbacks use in computations
    lowered for ``platform``.

    Native on CPU, CUDA and ROCm (on a GPU backend, where its handlers register), JAX's
    host-callback lowering elsewhere, unless ``HOSTFEED_TRANSPORT`` forced one.

    Example:
        >>> transport_for("tpu") == ("native" if forced() == "native" else "jax")
        True
    """
    if _choice.forced is not None:
        return _choice.forced
    if platform not in NATIVE_PLATFORMS:
        return "jax"
    check = _native_checks.get(platform)
    if check is not None and check() is not None:
        return "jax"
    return "native"


def transports() -> dict[str, str]:
    """The transport of each platform: CPU, CUDA, ROCm, TPU and those of this process's
    JAX backends, as ``{platform: "native" | "jax"}``. (For CUDA this registers hostfeed's
    CUDA handlers if a CUDA backend exists, as the first lowering for CUDA would.)

    Example:
        >>> import hostfeed
        >>> sorted(hostfeed.transports())[:2]
        ['cpu', 'cuda']
    """
    platforms = list(KNOWN_PLATFORMS)
    for backend in ("cpu", "gpu", "tpu", None):
        with contextlib.suppress(RuntimeError):
            platforms += [d.platform for d in jax.devices(backend)[:1]]
    return {p: transport_for(p) for p in dict.fromkeys(platforms)}


def _platforms(ctx: Any) -> Sequence[str]:
    return ctx.platforms or ctx.module_context.platforms


def active(ctx: Any) -> bool:
    """Whether the lowering rule context ``ctx`` lowers through the portable transport."""
    return any(transport_for(p) == "jax" for p in _platforms(ctx))


# ---- the executing device ---------------------------------------------------------------


class _DeviceTable:
    """A module's device assignment, kept among its keepalives by the first rule lowered
    with it in view, for rules lowered later inside manual regions (which only see a mesh,
    possibly abstract)."""

    __slots__ = ("devices",)

    def __init__(self, devices: tuple):
        self.devices = devices


def _note_devices(ctx: Any) -> None:
    mc = ctx.module_context
    devices = getattr(mc.axis_context, "device_assignment", None)
    if devices and not any(isinstance(k, _DeviceTable) for k in mc.keepalives):
        mc.add_keepalive(_DeviceTable(tuple(devices)))


def _device_keys(ctx: Any) -> tuple[int, ...]:
    """The device key (:func:`receiver.portable_device_key`) of each partition id of the
    computation being lowered."""
    mc = ctx.module_context
    ac = mc.axis_context
    devices = getattr(ac, "device_assignment", None)
    if not devices:
        table = next((k for k in mc.keepalives if isinstance(k, _DeviceTable)), None)
        devices = table.devices if table is not None else None
    if not devices:
        devices = _compat.mesh_devices(getattr(ac, "mesh", None))
    if not devices:
        platform = _platforms(ctx)[0]
        try:
            devices = tuple(jax.devices(platform))
        except RuntimeError:
            devices = tuple(jax.devices())
    return tuple(receiver.portable_device_key(d) for d in devices)


def _key(keys: tuple[int, ...], pid: Any) -> int:
    p = int(pid)
    return keys[p] if 0 <= p < len(keys) else keys[0]


def noting(rule: Callable) -> Callable:
    """``rule`` that first notes the module's device assignment for the portable
    transport (see :class:`_DeviceTable`)."""
    @functools.wraps(rule)
    def lower(ctx: Any, *args: Any, **params: Any) -> Any:
        if active(ctx):
            _note_devices(ctx)
        return rule(ctx, *args, **params)
    return lower


# ---- the functions JAX runs on its execution thread ---------------------------------------


def _codes(avals: Sequence[Any]) -> list[int]:
    """The XLA dtype code of each operand (what the native handlers read from the frame)."""
    return [receiver.DTYPE_CODES.get(np.dtype(a.dtype).name, -1) for a in avals]


def _contiguous(a: Any) -> np.ndarray:
    # (np.ascontiguousarray would make scalars 1-d.)
    return np.asarray(a, order="C")


def _tap_function(cid: int, flags: int, codes: list[int], keys: tuple[int, ...]) -> Callable:
    push = receiver.push_host

    def tap(*args: Any) -> tuple:
        # One copy, in Rust, into the message (the arrays may view buffers that live only
        # during this callback).
        push(cid, [_contiguous(a) for a in args[:-1]], codes, _key(keys, args[-1]), flags)
        return ()
    return tap


def _call_function(cid: int, flags: int, timeout_ms: int, name: str, codes: list[int],
                   avals_out: Sequence[Any], keys: tuple[int, ...]) -> Callable:
    call_host = receiver.call_host
    with_status = bool(flags & receiver.FLAG_STATUS_OUTPUT)
    results = [(tuple(a.shape), np.dtype(a.dtype)) for a in avals_out[int(with_status):]]

    def call(*args: Any) -> tuple:
        outs = [np.empty(shape, dtype) for shape, dtype in results]
        status = call_host(cid, [_contiguous(a) for a in args[:-1]], codes, outs,
                           _key(keys, args[-1]), flags, timeout_ms, name)
        return ((np.int32(status),) if with_status else ()) + tuple(outs)
    return call


def _text(message: Sequence[Any]) -> str:
    if not message:
        return ""
    raw = np.asarray(message[0], np.uint8).tobytes()
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


def _check_function() -> Callable:
    def check(status: Any, *rest: Any) -> tuple:
        ticket = int(status)
        if ticket != 0:
            text = _text(rest[:-1]) or receiver.failure_text(ticket)
            raise receiver.ReceiverError(text)
        return ()
    return check


def padded(text: str, n: int) -> np.ndarray:
    """``text`` as exactly ``n`` UTF-8 bytes: NUL-padded, or cut at a character boundary
    and marked `` [...]`` when longer (as the native ``hostfeed_failure``).

    Example:
        >>> bytes(padded("abc", 5)), bytes(padded("abcdefghij", 8))
        (b'abc\\x00\\x00', b'ab [...]')
    """
    more = b" [...]"
    raw = text.encode()
    if len(raw) > n:
        cut = max(0, n - len(more))
        while cut > 0 and (raw[cut] & 0xC0) == 0x80:
            cut -= 1
        raw = raw[:cut] + more[:min(len(more), n - cut)]
    return np.frombuffer(raw.ljust(n, b"\0"), np.uint8).copy()


# ---- lowering -----------------------------------------------------------------------------


def _sharding(ctx: Any, avals_out: Sequence[Any]) -> Any:
    return _compat.callback_op_sharding(ctx.module_context.axis_context, None, avals_out)


def _check_platform(ctx: Any) -> None:
    bad = [p for p in _platforms(ctx) if p not in _compat.PYTHON_CALLBACK_PLATFORMS]
    if bad:
        raise ValueError(
            f"hostfeed: JAX has no host callbacks for platform {', '.join(bad)} (JAX's own "
            f"io_callback and debug.callback do not run there either; they run on "
            f"{', '.join(sorted(_compat.PYTHON_CALLBACK_PLATFORMS))}), so hostfeed cannot "
            f"send data to the host from this computation. Run it on one of those "
            f"platforms, e.g. under jax.default_device(jax.devices('cpu')[0]).")


def emit(ctx: Any, target: str, args: Sequence[Any], avals_in: Sequence[Any],
         avals_out: Sequence[Any], per_device: bool, **attrs: Any) -> list:
    """The portable counterpart of the native custom call ``target`` (``hostfeed_tap``,
    ``hostfeed_call`` or ``hostfeed_check``): JAX's host callback with hostfeed's token in
    and out; returns its non-token results. (``per_device``: the sharding follows from the
    context, as for io_callback.)"""
    from .lowering import CALL_TARGET, CHECK_TARGET, TAP_TARGET
    del per_device
    _check_platform(ctx)
    keys = _device_keys(ctx)
    cid = int(attrs.get("consumer_id", 0))
    flags = int(attrs.get("flags", 0))
    fn: Callable
    if target == TAP_TARGET:
        fn = _tap_function(cid, flags, _codes(avals_in), keys)
    elif target == CALL_TARGET:
        fn = _call_function(cid, flags, int(attrs.get("timeout_ms", 0)),
                            str(attrs.get("name", "")), _codes(avals_in), avals_out, keys)
    elif target == CHECK_TARGET:
        fn = _check_function()
    else:
        raise AssertionError(f"hostfeed internal error: no portable lowering for {target}")
    token = ctx.tokens_in.get(host_callback_effect)
    operands = [*args, _compat.partition_id()]
    operand_avals = [*avals_in, _U32]
    sub_ctx = dataclasses.replace(ctx, avals_in=operand_avals, avals_out=list(avals_out))
    results, token_out, _ = _compat.emit_python_callback(
        sub_ctx, fn, token, operands, operand_avals, list(avals_out), has_side_effect=True,
        returns_token=True, sharding=_sharding(ctx, avals_out))
    ctx.set_tokens_out(
        ctx.tokens_in.update_tokens(_compat.mlir.TokenSet({host_callback_effect: token_out})))
    return list(results)


def failure_message(ctx: Any, status: Any) -> list:
    """The portable ``hostfeed_failure``: the text of this process's failed call named by
    ``status`` as ``uint8[n]`` (zeros for status 0). No token, no side effect."""
    _check_platform(ctx)
    (out_aval,) = ctx.avals_out
    n = out_aval.shape[0]

    def failure(status: Any) -> tuple:
        ticket = int(status)
        return (padded(receiver.failure_text(ticket) if ticket else "", n),)

    results, _, _ = _compat.emit_python_callback(
        ctx, failure, None, [status], list(ctx.avals_in), [out_aval], has_side_effect=False,
        returns_token=False, sharding=_sharding(ctx, ctx.avals_out))
    return list(results)
