"""The ``outside_call`` primitive and the effect that keeps it alive and ordered.

``outside_call_p`` is the identity on all its operands; the first ``nr_tapped_args`` of
them are sent to the host, where the callback named by ``callback`` runs. Its effect is
ordered, so JAX threads a token through it: taps run in program order, are never dropped
by dead-code elimination even when their outputs are unused, and keep their order through
jit, nested jit and control flow.

Only what tracing needs lives here (the primitives, their effect, abstract evaluation and
parameters, the modes that are part of JAX's cache keys): what the primitives do outside a
computation is :mod:`hostfeed._src.eager`'s, so declaring them starts nothing.
"""
from __future__ import annotations

from typing import Any

import jax
import numpy as np

from . import compat, settings
from .spec import CallbackSpec

__all__ = [
    "HostCallbackEffect", "host_callback_effect", "outside_call_p",
    "outside_call_params", "host_call_p", "call_check_p", "failure_message_p",
    "get_ad_taps", "set_ad_taps", "get_sync_taps", "sync_taps_state", "sync_taps_mode",
    "tap_sync_param", "legacy_sync", "recorded_before_p",
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


# How taps traced from now on (without ``sync=``) run: ``legacy`` (the default: their tap
# function has run before the computation goes on, so before its results are ready, where
# the legacy module's did: on CPUs and GPUs; asynchronous on TPUs), ``sync`` or ``async``
# everywhere. A JAX configuration state for the same reason as the autodiff mode: a
# jitted function traced in one mode is traced again in another, never reused.
_default_sync_taps = settings.sync_taps()
with settings.parsed_here(settings.SYNC_TAPS_ENV):
    sync_taps_state = compat.enum_state(
        name="hostfeed_sync_taps",
        enum_values=list(settings.SYNC_TAPS_MODES),
        default=_default_sync_taps,
        help="How hostfeed taps run: 'legacy' (synchronous on CPUs and GPUs, asynchronous "
             "on TPUs), 'sync' or 'async'.",
        include_in_jit_key=True,
        include_in_trace_context=True,
    )


def sync_taps_mode() -> str:
    """The tap mode for functions traced from now on: ``'legacy'``, ``'sync'`` or
    ``'async'`` (see :data:`hostfeed._src.settings.SYNC_TAPS_MODES`).

    Example:
        >>> sync_taps_mode() in ("legacy", "sync", "async")
        True
    """
    return sync_taps_state.value


def tap_sync_param() -> bool | None:
    """The ``sync`` parameter of a tap traced now without ``sync=``: True, False, or None
    (the legacy mode: decided where it runs, by :func:`legacy_sync`).

    Example:
        >>> tap_sync_param() in (True, False, None)
        True
    """
    mode = sync_taps_state.value
    return None if mode == "legacy" else mode == "sync"


def legacy_sync(platforms: Any) -> bool:
    """Whether a tap of the legacy mode is synchronous on ``platforms`` (the platforms a
    computation is lowered for): as the legacy module's taps, everywhere but on a TPU,
    whose taps (outfeed) were asynchronous.

    Example:
        >>> legacy_sync(["cpu"]), legacy_sync(["tpu"])
        (True, False)
    """
    return not any(p == "tpu" for p in platforms)


def get_sync_taps() -> bool:
    """Whether taps traced from now on (without ``sync=``) are synchronous on this
    process's default backend (in the legacy mode: unless it is a TPU).

    Example:
        >>> isinstance(get_sync_taps(), bool)
        True
    """
    sync = tap_sync_param()
    return legacy_sync([jax.default_backend()]) if sync is None else sync


outside_call_p = compat.Primitive("outside_call")
outside_call_p.multiple_results = True


def outside_call_params(callback: CallbackSpec, nr_tapped_args: int, transforms: tuple = (),
                        device_index: int = 0, forward_tapped: bool = False,
                        shard_parts: tuple | None = None, sync: bool | None = False) -> dict:
    """The parameters of ``outside_call_p``.

    ``callback``: what to call on the host; ``nr_tapped_args``: how many leading operands are
    sent (the rest pass through, for ``result=``); ``transforms``: internal
    ``(name, *params)`` records; ``device_index``: which device collects the operand under
    global-view sharding; ``forward_tapped``: for a jvp tap, whether the forward pass
    already tapped its primals (so partial evaluation must not tap them again);
    ``shard_parts``: set only by the global-view lowering, a
    :class:`hostfeed._src.spec.ShardParts` when each device sends its shard and the host
    joins them; ``sync``: the computation waits until the tap function has run (a
    synchronous tap, lowered as a call without results); None: the legacy mode's choice,
    made where the tap runs (:func:`legacy_sync`).
    """
    return dict(callback=callback, nr_tapped_args=nr_tapped_args, transforms=transforms,
                device_index=device_index, forward_tapped=forward_tapped,
                shard_parts=shard_parts, sync=sync)


@outside_call_p.def_effectful_abstract_eval
def _outside_call_abstract_eval(*avals: Any, **params: Any) -> Any:
    del params
    return avals, {host_callback_effect}


# `recorded_before_p`: the identity, sending nothing. A record becomes this in the copy of a
# checkpointed function (`jax.checkpoint`, `nn.remat`, `nnx.remat`) that the backward pass
# recomputes: the forward pass recorded the value already (rules.py). Pure, and lowered to
# nothing, so the recomputation is the one XLA compiles without the record.
recorded_before_p = compat.Primitive("hostfeed_recorded_before")
recorded_before_p.multiple_results = True
recorded_before_p.def_impl(lambda *operands: list(operands))
recorded_before_p.def_abstract_eval(lambda *avals: list(avals))


# ----------------------------------------------------------------------------------------
# `call`: a host callback whose results flow back into the computation.

host_call_p = compat.Primitive("host_call")
host_call_p.multiple_results = True


@host_call_p.def_effectful_abstract_eval
def _host_call_abstract_eval(*avals: Any, result_avals: Any, with_status: bool = False,
                             **params: Any) -> Any:
    # `with_status` (set only by hostfeed's own multi-device lowering) adds a leading int32
    # status result: 0, or the ticket of a failure that a later check raises everywhere.
    del avals, params
    status = [_status_aval()] if with_status else []
    return status + list(result_avals), {host_callback_effect}


def _status_aval() -> Any:
    return jax.core.ShapedArray((), np.int32)


# `call_check_p`: fails the computation if a (combined) call status is non-zero. Bound only
# by the multi-device lowering of `call`, after every device has the same status, so that
# all devices fail together instead of some waiting forever in a collective.
call_check_p = compat.Primitive("host_call_check")
call_check_p.multiple_results = True


@call_check_p.def_effectful_abstract_eval
def _call_check_abstract_eval(status: Any, *message: Any) -> Any:
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
def _failure_message_abstract_eval(status: Any) -> Any:
    del status
    return jax.core.ShapedArray((FAILURE_MESSAGE_BYTES,), np.uint8)
