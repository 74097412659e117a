"""What hostfeed's primitives do outside a computation (their ``impl`` rules, registered
here): an eager tap goes straight into the receiver's queue and runs on the consumer
thread, in order (a synchronous one returns once it ran); an eager ``call`` compiles like
any primitive. In the legacy inline mode (``JAX_HOST_CALLBACK_INLINE``) both run in the
caller's thread instead. An eager loop or conditional whose body taps synchronously
returns once it ran.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .. import _receiver
from . import compat, lifecycle, settings
from .primitives import (CallbackSpec, HostCallbackEffect, host_call_p, host_callback_effect,
                         legacy_sync, outside_call_p, tap_sync_param, unpack_transforms)
from .runtime import check_call_results

__all__ = ["outside_call"]


def _eager_device(callback: CallbackSpec, values: Sequence[Any]) -> jax.Device | None:
    if not callback.with_device:
        return None
    devs = [next(iter(a.devices())) for a in values if isinstance(a, jax.Array)]
    return devs[0] if devs else jax.devices()[0]


def _outside_call_impl(*args: Any, **params: Any) -> Any:
    callback, nr_tapped_args = params["callback"], params["nr_tapped_args"]
    transforms = params["transforms"]
    # Eager taps from inside a host callback also run inline: going through the device
    # would have the callback thread wait for a queue that only it can drain.
    if settings.inline() or _receiver.host.in_callback_thread():
        # Legacy JAX_HOST_CALLBACK_INLINE: run the callback here, in the caller's thread,
        # so its exceptions propagate with the caller's stack.
        tapped = args[:nr_tapped_args]
        arg = callback.arg_treedef.unflatten([np.asarray(a) for a in tapped])
        unpacked = unpack_transforms(transforms)
        if callback.with_device:
            callback.func(arg, unpacked, device=_eager_device(callback, tapped))
        else:
            callback.func(arg, unpacked)
        return list(args)
    return _tap_eager(callback, transforms, args, nr_tapped_args,
                      _eager_sync(params.get("sync", False)))


outside_call_p.def_impl(_outside_call_impl)


class _Legacy:
    """Whether an eager tap of the legacy mode is synchronous (decided once: by JAX's
    default backend, as the legacy module's eager taps ran there)."""

    sync: bool | None = None


def _eager_sync(sync: bool | None) -> bool:
    if sync is not None:
        return sync
    if _Legacy.sync is None:
        _Legacy.sync = legacy_sync([jax.default_backend()])
    return _Legacy.sync


def _taps_in(params: dict) -> bool:
    """Whether the jaxprs among an equation's parameters have hostfeed's effect."""
    for v in params.values():
        for j in (v if isinstance(v, tuple) else (v,)):
            effects = getattr(j, "effects", None)
            if effects and any(isinstance(e, HostCallbackEffect) for e in effects):
                return True
    return False


def _after_eager_control_flow(primitive: Any, params: dict, outs: Any) -> Any:
    """An eager ``while_loop``, ``cond`` or ``scan`` (outside ``jit``) whose body taps
    returns, where taps are synchronous, once it ran (so once its taps have run), as with
    the legacy module on JAX's synchronous CPU dispatch: code that reads what the taps
    wrote right after the call finds it complete."""
    del primitive
    if _eager_sync(tap_sync_param()) and _taps_in(params):
        jax.block_until_ready(outs)
    return outs


compat.install_eager_control_flow_hook(_after_eager_control_flow)

_Array = jax.Array


def _host_copy(x: Any) -> np.ndarray:
    """A host copy of an eager operand, with the dtype a computation would have given it
    (numpy float64 becomes float32 unless x64 is enabled), owned by the callback."""
    if isinstance(x, _Array):
        return np.array(x, copy=True)
    x = np.asarray(x)
    return np.array(x, dtype=jax.dtypes.canonicalize_dtype(x.dtype), copy=True)


def _tap_eager(callback: CallbackSpec, transforms: tuple, args: Sequence[Any],
               nr_tapped_args: int, sync: bool = False) -> list:
    """An eager tap without a computation: once the computations already dispatched have
    sent their taps, host copies of the operands go straight into the receiver's queue, and
    the callback runs on the consumer thread, in order. Nothing is compiled, and nothing is
    registered that outlives the message (a fresh tap function per call costs nothing
    more, and leaks nothing). A synchronous tap then waits until the receiver has run it
    (its exception, if any, is recorded for ``barrier_wait`` as for any tap)."""
    lifecycle.wait_for_dispatched(host_callback_effect)
    tapped = args[:nr_tapped_args]
    arrays = tuple([_host_copy(a) for a in tapped])
    func, treedef = callback.func, callback.arg_treedef
    unpacked = unpack_transforms(transforms)
    single = treedef.num_leaves == 1 and treedef.num_nodes == 1
    if callback.with_device:
        device = _eager_device(callback, tapped)

        def invoke(arrays: Sequence[np.ndarray], ordinal: int) -> None:
            func(arrays[0] if single else treedef.unflatten(arrays), unpacked, device=device)
    else:
        def invoke(arrays: Sequence[np.ndarray], ordinal: int) -> None:
            func(arrays[0] if single else treedef.unflatten(arrays), unpacked)
    lifecycle.push_eager(invoke, callback.name, arrays, sum([a.nbytes for a in arrays]))
    if sync:
        lifecycle.wait_processed()
    # Identity; values that are not JAX arrays yet become ones, as a computation's outputs.
    return [a if isinstance(a, _Array) else jax.numpy.asarray(a) for a in args]


def outside_call(args: Sequence[Any], params: dict) -> list:
    """What ``outside_call_p.bind(*args, **params)`` does outside any trace, without
    ``bind``'s per-call machinery (a third of an eager tap's cost): the evaluation rule, run
    directly. The caller (``host_callback``) checks that no trace is active, so a traced
    tap never comes here.

    Example:
        >>> import jax.numpy as jnp
        >>> from hostfeed import host_callback as hcb
        >>> from hostfeed._src.primitives import CallbackKind, outside_call_params
        >>> spec = CallbackSpec(lambda a, tr: None, jax.tree_util.tree_structure(0), False,
        ...                     CallbackKind.TAP)
        >>> [int(v) for v in outside_call([jnp.int32(3)], outside_call_params(spec, 1))]
        [3]
        >>> hcb.barrier_wait()
    """
    return _outside_call_impl(*[compat.canonicalize_value(a) for a in args], **params)


def _host_call_impl(*args: Any, callback: Any, result_treedef: Any, result_avals: Any,
                    device_index: int, with_status: bool = False,
                    shard_parts: Any = None) -> Any:
    if settings.inline():
        arg = callback.arg_treedef.unflatten([np.asarray(a) for a in args])
        if callback.with_device:
            res = callback.func(arg, device=_eager_device(callback, args))
        else:
            res = callback.func(arg)
        flat = check_call_results(callback.name, res, result_treedef, result_avals)
        return [jnp.asarray(a) for a in flat]
    return compat.apply_primitive(host_call_p, *args, callback=callback,
                                   result_treedef=result_treedef, result_avals=result_avals,
                                   device_index=device_index, with_status=with_status,
                                   shard_parts=shard_parts)


host_call_p.def_impl(_host_call_impl)
