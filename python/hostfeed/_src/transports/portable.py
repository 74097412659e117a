"""The portable transport: hostfeed's primitives lowered through JAX's own host-callback
lowering (what ``io_callback`` uses), for platforms without hostfeed handlers.

hostfeed's native transport is a custom call per primitive with a handler in Rust, for
CPU, CUDA and ROCm. Everywhere else (TPUs, Intel GPUs, a GPU whose handlers could not
register, and every platform when ``HOSTFEED_TRANSPORT=jax``) the same lowering rules
(``hostfeed._src.lowering``, placement included) emit, instead of each custom call, JAX's
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
(through Python on this path) work as with the native handlers. What it shares with the
TPU's transport (the device keys, the status check, a failure's message) is in
:mod:`.common`.

Which transport a platform uses is decided in :mod:`hostfeed._src.transports`.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Optional

import numpy as np

from ... import _receiver
from .base import Transport
from .common import check, check_platform, codes, device_keys, emit, failure, key, note_devices


def _contiguous(a: Any) -> np.ndarray:
    # (np.ascontiguousarray would make scalars 1-d.)
    return np.asarray(a, order="C")


def _tap_function(cid: int, flags: int, codes: list[int], keys: tuple[int, ...]) -> Callable:
    push = _receiver.portable.push_host

    def tap(*args: Any) -> tuple:
        # One copy, in Rust, into the message (the arrays may view buffers that live only
        # during this callback).
        push(cid, [_contiguous(a) for a in args[:-1]], codes, key(keys, args[-1]), flags)
        return ()
    return tap


def _call_function(cid: int, flags: int, timeout_ms: int, name: str, codes: list[int],
                   avals_out: Sequence[Any], keys: tuple[int, ...]) -> Callable:
    call_host = _receiver.portable.call_host
    with_status = bool(flags & _receiver.messages.FLAG_STATUS_OUTPUT)
    results = [(tuple(a.shape), np.dtype(a.dtype)) for a in avals_out[int(with_status):]]

    def call(*args: Any) -> tuple:
        outs = [np.empty(shape, dtype) for shape, dtype in results]
        status = call_host(cid, [_contiguous(a) for a in args[:-1]], codes, outs,
                           key(keys, args[-1]), flags, timeout_ms, name)
        return ((np.int32(status),) if with_status else ()) + tuple(outs)
    return call


# ---- lowering -----------------------------------------------------------------------------


def tap(ctx: Any, args: Sequence[Any], avals_in: Sequence[Any], per_device: bool, *,
        consumer_id: int, flags: int) -> Any:
    """The portable ``hostfeed_tap`` (``per_device``: the sharding follows from the
    context, as for io_callback); returns the operation that orders after it."""
    del per_device
    check_platform(ctx)
    fn = _tap_function(int(consumer_id), int(flags), codes(avals_in), device_keys(ctx))
    return emit(ctx, fn, args, avals_in, [])[0]


def call(ctx: Any, args: Sequence[Any], avals_in: Sequence[Any], avals_out: Sequence[Any],
         per_device: bool, *, consumer_id: int, flags: int, timeout_ms: int,
         name: str) -> tuple[Any, list]:
    """The portable ``hostfeed_call``; returns the operation and its results."""
    del per_device
    check_platform(ctx)
    keys = device_keys(ctx)
    fn = _call_function(int(consumer_id), int(flags), int(timeout_ms), str(name),
                        codes(avals_in), avals_out, keys)
    return emit(ctx, fn, args, avals_in, avals_out)


def prepare(ctx: Any, rule_platform: Optional[str]) -> None:
    """Before a rule lowers: the module keeps its device assignment (:func:`note_devices`)."""
    del rule_platform
    note_devices(ctx)


def end_scope(ctx: Any, token: Any) -> None:
    """Nothing at the end of a token scope: JAX's callbacks have returned when the
    computation ends."""
    del ctx, token


#: JAX's host-callback lowering: the Recorder's policies here (see :mod:`.tpu` for where
#: they differ): a summary at selected steps is computed in the ``cond`` that sends it,
#: records leave through callbacks inside the computation, and no hostfeed kernel is used
#: (JAX's lowering is asked for).
TRANSPORT = Transport(
    name="jax", summarize_every_step=False, records_as_outputs=False, native_kernels=False,
    one_computation_at_a_time=False, prepare=prepare, end_scope=end_scope, tap=tap, call=call,
    check=check, failure=failure)
