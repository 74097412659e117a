"""The ``outside_call`` primitive and the effect that keeps it alive and ordered.

``outside_call_p`` is the identity on all its operands; the first ``nr_tapped_args`` of
them are sent to the host, where the callback named by ``callback`` runs. Its effect is
ordered, so JAX threads a token through it: taps run in program order, are never dropped
by dead-code elimination even when their outputs are unused, and keep their order through
jit, nested jit and control flow.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .. import _receiver
from . import compat, lifecycle, settings
from .runtime import CallbackSpec, check_call_results, unpack_transforms

__all__ = [
    "HostCallbackEffect", "host_callback_effect", "CallbackSpec", "outside_call_p",
    "outside_call", "outside_call_params", "host_call_p", "call_check_p", "failure_message_p",
    "get_ad_taps", "set_ad_taps", "get_sync_taps", "sync_taps_state",
]


class HostCallbackEffect(compat.Effect):
    """The ordered side effect of sending data to a hostfeed host callback."""

    def __str__(self) -> str:
        return "HostCallback"


host_callback_effect = HostCallbackEffect()
for _effect_set in compat.EFFECT_SETS:
    _effect_set.add_type(HostCallbackEffect)
# Dispatch: the token of the previous computation that tapped is passed on as it is.
compat.install_token_fast_path(HostCallbackEffect)

# A JAX configuration state, so that the mode is part of JAX's tracing and compilation
# cache keys: switching modes never reuses a jaxpr traced (or a jvp taken) in the other.
_default_ad_taps = settings.ad_taps()
with settings.parsed_here(settings.AD_TAPS_ENV):
    _ad_taps = compat.enum_state(
        name="hostfeed_ad_taps",
        enum_values=list(settings.AD_TAPS_MODES),
        default=_default_ad_taps,
        help="What hostfeed taps see under autodiff: 'transforms' or 'primals'.",
        include_in_jit_key=True,
        include_in_trace_context=True,
    )


def get_ad_taps() -> str:
    """The autodiff tap mode for functions traced from now on.

    Example:
        >>> get_ad_taps() in ("transforms", "primals")
        True
    """
    return _ad_taps.value


def set_ad_taps(mode: str) -> None:
    """Sets the autodiff tap mode (``'transforms'`` or ``'primals'``) for functions traced
    afterwards; see :func:`hostfeed.host_callback.set_ad_taps`."""
    jax.config.update("hostfeed_ad_taps", settings.check_ad_taps(mode, "set_ad_taps(mode)"))


# Whether taps traced from now on are synchronous (their tap function has run before the
# computation goes on, so before its results are ready). A JAX configuration state for the
# same reason as the autodiff mode: a jitted function traced in one mode is traced again in
# the other, never reused.
_default_sync_taps = settings.sync_taps()
with settings.parsed_here(settings.SYNC_TAPS_ENV):
    sync_taps_state = compat.bool_state(
        name="hostfeed_sync_taps",
        default=_default_sync_taps,
        help="Whether hostfeed taps complete before the computation's results are ready.",
        include_in_jit_key=True,
        include_in_trace_context=True,
    )


def get_sync_taps() -> bool:
    """Whether taps traced from now on (without ``sync=``) are synchronous.

    Example:
        >>> isinstance(get_sync_taps(), bool)
        True
    """
    return bool(sync_taps_state.value)


outside_call_p = compat.Primitive("outside_call")
outside_call_p.multiple_results = True


def outside_call_params(callback: CallbackSpec, nr_tapped_args: int, transforms: tuple = (),
                        device_index: int = 0, forward_tapped: bool = False,
                        shard_parts: tuple | None = None, sync: bool = False) -> dict:
    """The parameters of ``outside_call_p``.

    ``callback``: what to call on the host; ``nr_tapped_args``: how many leading operands are
    sent (the rest pass through, for ``result=``); ``transforms``: internal
    ``(name, *params)`` records; ``device_index``: which device collects the operand under
    global-view sharding; ``forward_tapped``: for a jvp tap, whether the forward pass
    already tapped its primals (so partial evaluation must not tap them again);
    ``shard_parts``: set only by the global-view lowering, a
    :class:`hostfeed._src.runtime.ShardParts` when each device sends its shard and the host
    joins them; ``sync``: the computation waits until the tap function has run (a
    synchronous tap, lowered as a call without results).
    """
    return dict(callback=callback, nr_tapped_args=nr_tapped_args, transforms=transforms,
                device_index=device_index, forward_tapped=forward_tapped,
                shard_parts=shard_parts, sync=sync)


@outside_call_p.def_effectful_abstract_eval
def _outside_call_abstract_eval(*avals, **params):
    del params
    return avals, {host_callback_effect}


def _eager_device(callback: CallbackSpec, values: Sequence[Any]) -> jax.Device | None:
    if not callback.with_device:
        return None
    devs = [next(iter(a.devices())) for a in values if isinstance(a, jax.Array)]
    return devs[0] if devs else jax.devices()[0]


def _outside_call_impl(*args, **params):
    callback, nr_tapped_args = params["callback"], params["nr_tapped_args"]
    transforms = params["transforms"]
    # Eager taps from inside a host callback also run inline: going through the device
    # would have the callback thread wait for a queue that only it can drain.
    if settings.inline() or _receiver.in_callback_thread():
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
    return _tap_eager(callback, transforms, args, nr_tapped_args, params.get("sync", False))


outside_call_p.def_impl(_outside_call_impl)

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
    """``outside_call_p.bind(*args, **params)``, with a shortcut for eager use: outside
    any trace the evaluation rule runs directly (what JAX's ``EvalTrace`` does, without
    ``bind``'s per-call machinery, a third of an eager tap's cost).

    Example:
        >>> import jax.numpy as jnp
        >>> from hostfeed import host_callback as hcb
        >>> spec = CallbackSpec(lambda a, tr: None, jax.tree_util.tree_structure(0), False,
        ...                     "tap")
        >>> [int(v) for v in outside_call([jnp.int32(3)], outside_call_params(spec, 1))]
        [3]
        >>> hcb.barrier_wait()
    """
    # (A list, not a generator: faster for the few operands of a tap.)
    if compat.eval_trace_active() and not any([compat.is_tracer(a) for a in args]):  # noqa: C419
        return _outside_call_impl(*[compat.canonicalize_value(a) for a in args], **params)
    return outside_call_p.bind(*args, **params)


# ----------------------------------------------------------------------------------------
# `call`: a host callback whose results flow back into the computation.

host_call_p = compat.Primitive("host_call")
host_call_p.multiple_results = True


@host_call_p.def_effectful_abstract_eval
def _host_call_abstract_eval(*avals, result_avals, with_status=False, **params):
    # `with_status` (set only by hostfeed's own multi-device lowering) adds a leading int32
    # status result: 0, or the ticket of a failure that a later check raises everywhere.
    del avals, params
    status = [_status_aval()] if with_status else []
    return status + list(result_avals), {host_callback_effect}


def _status_aval():
    return jax.core.ShapedArray((), np.int32)


def _host_call_impl(*args, callback, result_treedef, result_avals, device_index,
                    with_status=False, shard_parts=None):
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


# `call_check_p`: fails the computation if a (combined) call status is non-zero. Bound only
# by the multi-device lowering of `call`, after every device has the same status, so that
# all devices fail together instead of some waiting forever in a collective.
call_check_p = compat.Primitive("host_call_check")
call_check_p.multiple_results = True


@call_check_p.def_effectful_abstract_eval
def _call_check_abstract_eval(status, *message):
    # `message` (many processes only): the failure's text as NUL-padded uint8 bytes, sent
    # from the process where the call failed (its status ticket means nothing elsewhere).
    del status, message
    return [], {host_callback_effect}


# Global-view placement needs each device's process (many processes): see placement.py.
compat.require_devices_during_lowering(outside_call_p, host_call_p)


# `failure_message_p` (many processes only): the text of this process's failed call named
# by a device's own status, as `uint8[FAILURE_MESSAGE_BYTES]` (zeros for status 0), so the
# lowering can send it to the other processes. Pure: it only reads what the call recorded.
failure_message_p = compat.Primitive("host_call_failure_message")
FAILURE_MESSAGE_BYTES = 2048


@failure_message_p.def_abstract_eval
def _failure_message_abstract_eval(status):
    del status
    return jax.core.ShapedArray((FAILURE_MESSAGE_BYTES,), np.uint8)
