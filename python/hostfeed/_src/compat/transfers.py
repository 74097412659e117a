"""The JAX internals of the transports that leave through JAX's own host transfers and
callbacks (a TPU's send/recv, the portable transport's ``emit_python_callback``, the
executing device's partition id) and of many processes (the coordination service's
client): the other half of :mod:`hostfeed._src.compat` (which re-exports every name here),
split off by concern, and off a native tap's road. Imported only by that package's
``__init__``."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from jax._src import callback as _callback
from jax._src import dispatch as _dispatch
from jax._src import pickle_util as _pickle_util
from jax._src.lib.mlir.dialects import hlo

from .versions import since


# ---- Host transfers (transports/tpu.py): TPUs' send/recv to the host ----------
# jax 0.10-0.12: `callback.send_to_host(module_ctx, channel, token, operand, *, sharding)`
# and `callback.receive_from_host(module_ctx, channel, token, out_aval, *, sharding)` emit
# `stablehlo.send`/`recv` with `is_host_transfer` and the rendezvous attributes PJRT's
# host callbacks match on; `Client.make_python_callback_from_host_send_and_recv(fn,
# operand_shapes, result_shapes, send_channels, recv_channels, serializer)` makes the
# host side, added to the module with `ModuleContext.add_host_callback`. This is what
# `callback._emit_tpu_python_callback` does, without the extra receive it adds to every
# callback that returns a token (a second transfer the device waits for).


def jax_ordered_io_effect() -> Any:
    """The effect of ``io_callback(ordered=True)`` (the bench's raw transfers order on it)."""
    return _callback._OrderedIOEffect


def after_all(tokens: Sequence[Any]) -> Any:
    """A token after every one of ``tokens``."""
    return hlo.after_all(list(tokens))


def xla_shape(aval: Any) -> Any:
    """The XLA shape of ``aval`` (what the host callback's operands and results declare)."""
    return _callback._aval_to_xla_shape(aval)


def send_to_host(ctx: Any, token: Any, operand: Any, sharding: Any) -> tuple[int, Any]:
    """``stablehlo.send`` of ``operand`` to the host after ``token``; returns the channel
    and the token that orders after the send."""
    mc = ctx.module_context
    channel = mc.new_channel()
    return channel, _callback.send_to_host(mc, channel, token, operand, sharding=sharding)


def receive_from_host(ctx: Any, token: Any, aval: Any, sharding: Any) -> tuple[int, Any, Any]:
    """``stablehlo.recv`` of an ``aval`` from the host after ``token``; returns the channel,
    the token after it and the value."""
    mc = ctx.module_context
    channel = mc.new_channel()
    token, value = _callback.receive_from_host(mc, channel, token, aval, sharding=sharding)
    return channel, token, value


def add_host_transfer_callback(ctx: Any, fn: Any, operand_avals: Sequence[Any],
                               result_avals: Sequence[Any], sends: Sequence[int],
                               recvs: Sequence[int]) -> None:
    """Makes ``fn`` the host side of the transfers on channels ``sends`` (its arguments,
    one numpy array each, once all arrived) and ``recvs`` (what it returns, in order)."""
    mc = ctx.module_context
    backend = mc.get_backend()
    callback = backend.make_python_callback_from_host_send_and_recv(
        fn, [xla_shape(a) for a in operand_avals], [xla_shape(a) for a in result_avals],
        list(sends), list(recvs), _pickle_util.dumps)
    mc.add_host_callback(callback)


# ---- The portable transport (portable.py): JAX's own host-callback lowering -------------
# jax 0.10-0.12: `callback.emit_python_callback(ctx, callback, token, operands,
# operand_avals, result_avals, *, has_side_effect, returns_token, partitioned, sharding)`
# (the lowering io_callback uses; send/recv to the host on TPUs, the xla_ffi_python_*
# custom calls elsewhere) and `callback._callback_op_sharding(axis_context, sharding,
# avals_out)`, with the same signatures in all three. What differs is the platforms it
# accepts: jax 0.11 added "oneapi" (Intel GPUs).
emit_python_callback = _callback.emit_python_callback
callback_op_sharding = _callback._callback_op_sharding
#: Platforms whose computations JAX's host callbacks (and so the portable transport) run on.
PYTHON_CALLBACK_PLATFORMS = frozenset(
    {"cpu", "cuda", "rocm", "tpu"} | ({"oneapi"} if since("python_callbacks_on_oneapi")
                                      else set()))


def partition_id() -> Any:
    """The executing device's partition number (``stablehlo.partition_id``, ``ui32[]``):
    its index in the computation's device assignment under SPMD partitioning."""
    return hlo.partition_id()


# ---- Many processes (placement.py, record/coordination.py) --------------------------------
# The global-view lowering must know which process owns each device of the computation
# (`ShardingContext.device_assignment`), which JAX 0.10-0.12 fills in only for
# computations containing a primitive of this registry (as io_callback's). Same name in
# 0.10.2 through 0.12.
def require_devices_during_lowering(*prims: Any) -> None:
    """Makes JAX pass the physical devices to the lowering of computations using ``prims``."""
    _dispatch.prim_requires_devices_during_lowering.update(prims)


def distributed_client() -> Any:
    """The ``jax.distributed`` coordination service client of this process (its key-value
    store and barriers: ``key_value_set``, ``blocking_key_value_get``,
    ``key_value_dir_get``, ``wait_at_barrier``), or None when ``jax.distributed`` is not
    initialized. jax 0.10 to 0.12 keep it at ``jax._src.distributed.global_state.client``
    with these methods (the key-value calls take and return ``str``)."""
    try:
        from jax._src.distributed import global_state
    except ImportError:  # pragma: no cover - a layout of a jax we do not support
        return None
    return getattr(global_state, "client", None)
