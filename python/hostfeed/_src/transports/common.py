"""What the transports that leave through JAX's host callbacks share (the portable one,
:mod:`.portable`, and the TPU's, :mod:`.tpu`): the executing device's key, the host side
of a call, the platform check, and a failed call's status check and message (JAX's host
callbacks on both: they run once per failure, not per step).

The executing device is found from ``stablehlo.partition_id`` (an operand of every
callback) and the device assignment known at lowering.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from ... import _receiver
from .. import compat, dtypes
from ..devices import portable_device_key
from ..primitives import host_callback_effect

_U32 = jax.core.ShapedArray((), np.uint32)


# ---- the executing device ---------------------------------------------------------------


class _DeviceTable:
    """A module's device assignment, kept among its keepalives by the first rule lowered
    with it in view, for rules lowered later inside manual regions (which only see a mesh,
    possibly abstract)."""

    __slots__ = ("devices",)

    def __init__(self, devices: tuple):
        self.devices = devices


def note_devices(ctx: Any) -> None:
    """Keeps the module's device assignment among its keepalives, for the rules lowered
    later inside manual regions (see :class:`_DeviceTable`)."""
    mc = ctx.module_context
    devices = getattr(mc.axis_context, "device_assignment", None)
    if devices and not any(isinstance(k, _DeviceTable) for k in mc.keepalives):
        mc.add_keepalive(_DeviceTable(tuple(devices)))


def device_keys(ctx: Any) -> tuple[int, ...]:
    """The device key (:func:`devices.portable_device_key`) of each partition id of the
    computation being lowered."""
    mc = ctx.module_context
    ac = mc.axis_context
    devices = getattr(ac, "device_assignment", None)
    if not devices:
        table = next((k for k in mc.keepalives if isinstance(k, _DeviceTable)), None)
        devices = table.devices if table is not None else None
    if not devices:
        devices = compat.mesh_devices(getattr(ac, "mesh", None))
    if not devices:
        platform = compat.lowering_platforms(ctx)[0]
        try:
            devices = tuple(jax.devices(platform))
        except RuntimeError:
            devices = tuple(jax.devices())
    return tuple(portable_device_key(d) for d in devices)


def key(keys: tuple[int, ...], pid: Any) -> int:
    """The device key of partition id ``pid`` (the first device's for an unknown one)."""
    p = int(pid)
    return keys[p] if 0 <= p < len(keys) else keys[0]


# ---- the host side ---------------------------------------------------------------------


def codes(avals: Sequence[Any]) -> list[int]:
    """The XLA dtype code of each operand (what the native handlers read from the frame)."""
    return [dtypes.DTYPE_CODES.get(np.dtype(a.dtype).name, -1) for a in avals]


def call_host_function(cid: int, flags: int, timeout_ms: int, name: str, codes: list[int],
                       keys: tuple[int, ...]) -> Callable:
    """The host side of a call over host transfers: the results are written into the
    arrays the transport receives from (a failure's ticket into the status, with one)."""
    call_host = _receiver.portable.call_host
    with_status = bool(flags & _receiver.messages.FLAG_STATUS_OUTPUT)

    def host(arrays: list[np.ndarray], pid: int, outputs: list[np.ndarray]) -> None:
        status = call_host(cid, arrays, codes, outputs[int(with_status):], key(keys, pid),
                           flags, timeout_ms, name)
        if with_status:
            outputs[0][...] = status
    return host


def _text(text_operands: Sequence[Any]) -> str:
    """A failure's text from the operands that carry it (NUL-padded UTF-8 bytes)."""
    if not text_operands:
        return ""
    raw = np.asarray(text_operands[0], np.uint8).tobytes()
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


def _check_function() -> Callable:
    def check(status: Any, *rest: Any) -> tuple:
        ticket = int(status)
        if ticket != 0:
            text = _text(rest[:-1]) or _receiver.portable.failure_text(ticket)
            raise _receiver.error.ReceiverError(text)
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


def sharding(ctx: Any, avals_out: Sequence[Any]) -> Any:
    """The sharding of a host callback with results of ``avals_out`` in ``ctx``."""
    return compat.callback_op_sharding(ctx.module_context.axis_context, None, avals_out)


def check_platform(ctx: Any) -> None:
    """Refuses clearly where JAX has no host callbacks for a platform lowered for."""
    bad = [p for p in compat.lowering_platforms(ctx) if p not in compat.PYTHON_CALLBACK_PLATFORMS]
    if bad:
        raise ValueError(
            f"hostfeed: JAX has no host callbacks for platform {', '.join(bad)} (JAX's own "
            f"io_callback and debug.callback do not run there either; they run on "
            f"{', '.join(sorted(compat.PYTHON_CALLBACK_PLATFORMS))}), so hostfeed cannot "
            f"send data to the host from this computation. Run it on one of those "
            f"platforms, e.g. under jax.default_device(jax.devices('cpu')[0]).")


def emit(ctx: Any, fn: Callable, args: Sequence[Any], avals_in: Sequence[Any],
         avals_out: Sequence[Any]) -> tuple[Any, list]:
    """JAX's host callback running ``fn`` with hostfeed's token in and out (the executing
    device's partition id as one more operand); returns the operation that produced the
    output token and the non-token results."""
    token = ctx.tokens_in.get(host_callback_effect)
    operands = [*args, compat.partition_id()]
    operand_avals = [*avals_in, _U32]
    sub_ctx = dataclasses.replace(ctx, avals_in=operand_avals, avals_out=list(avals_out))
    results, token_out, _ = compat.emit_python_callback(
        sub_ctx, fn, token, operands, operand_avals, list(avals_out), has_side_effect=True,
        returns_token=True, sharding=sharding(ctx, avals_out))
    ctx.set_tokens_out(
        ctx.tokens_in.update_tokens(compat.mlir.TokenSet({host_callback_effect: token_out})))
    return token_out.owner, list(results)


def check(ctx: Any, args: Sequence[Any], avals_in: Sequence[Any], per_device: bool) -> None:
    """``hostfeed_check`` as JAX's host callback: fails the computation when the status
    (``args[0]``) names a failed call."""
    del per_device
    check_platform(ctx)
    emit(ctx, _check_function(), args, avals_in, [])


def failure(ctx: Any, status: Any, per_device: bool) -> list:
    """``hostfeed_failure`` as JAX's host callback: the text of this process's failed call named by
    ``status`` as ``uint8[n]`` (zeros for status 0). No token, no side effect."""
    del per_device
    check_platform(ctx)
    (out_aval,) = ctx.avals_out
    n = out_aval.shape[0]

    def failure(status: Any) -> tuple:
        ticket = int(status)
        return (padded(_receiver.portable.failure_text(ticket) if ticket else "", n),)

    results, _, _ = compat.emit_python_callback(
        ctx, failure, None, [status], list(ctx.avals_in), [out_aval], has_side_effect=False,
        returns_token=False, sharding=sharding(ctx, ctx.avals_out))
    return list(results)
