"""Lowering of ``outside_call`` to an XLA FFI custom call with a token in and out."""
from __future__ import annotations

import dataclasses

import jax
import numpy as np

from . import _compat, _receiver, receiver
from .primitives import (CallbackSpec, call_timeout_ms, host_call_p, host_callback_effect,
                         make_call_invoker, make_invoker, outside_call_p)

TAP_TARGET = "hostfeed_tap"
CALL_TARGET = "hostfeed_call"

for _name, _capsule in _receiver.registrations().items():
    jax.ffi.register_ffi_target(_name, _capsule, platform="cpu")


def _consumer_id(spec: CallbackSpec, transforms: tuple) -> int:
    return receiver.register((spec, transforms), make_invoker(spec, transforms), spec.name)


def _outside_call_lowering_cpu(ctx, *args, callback, nr_tapped_args, transforms, **_):
    cid = _consumer_id(callback, transforms)
    receiver.ensure_started()
    tapped = args[:nr_tapped_args]
    token = ctx.tokens_in.get(host_callback_effect)
    sub_ctx = dataclasses.replace(
        ctx,
        avals_in=[_compat.abstract_token, *ctx.avals_in[:nr_tapped_args]],
        avals_out=[_compat.abstract_token],
    )
    op = _compat.build_ffi_lowering_function(TAP_TARGET, has_side_effect=True)(
        sub_ctx, token, *tapped,
        consumer_id=np.int64(cid), flags=np.int64(int(callback.with_device)))
    ctx.set_tokens_out(
        ctx.tokens_in.update_tokens(_compat.mlir.TokenSet({host_callback_effect: op.results[0]})))
    # Identity on every operand: the outputs are the inputs.
    return list(args)


def _host_call_lowering_cpu(ctx, *args, callback, result_treedef, result_avals, device_index):
    cid = receiver.register((callback, "call", result_treedef, result_avals),
                            make_call_invoker(callback, result_treedef, result_avals),
                            callback.name)
    receiver.ensure_started()
    token = ctx.tokens_in.get(host_callback_effect)
    sub_ctx = dataclasses.replace(
        ctx,
        avals_in=[_compat.abstract_token, *ctx.avals_in],
        avals_out=[_compat.abstract_token, *ctx.avals_out],
    )
    op = _compat.build_ffi_lowering_function(CALL_TARGET, has_side_effect=True)(
        sub_ctx, token, *args,
        consumer_id=np.int64(cid), flags=np.int64(int(callback.with_device)),
        timeout_ms=np.int64(call_timeout_ms()), name=callback.name)
    token_out, *results = op.results
    ctx.set_tokens_out(
        ctx.tokens_in.update_tokens(_compat.mlir.TokenSet({host_callback_effect: token_out})))
    return results


def _outside_call_lowering_unsupported(ctx, *args, **params):
    platforms = ", ".join(ctx.module_context.platforms)
    raise NotImplementedError(
        f"hostfeed host callbacks currently run on CPU only; this computation targets "
        f"{platforms}. Run it on CPU (jax.default_device(jax.devices('cpu')[0])) or use "
        f"jax.experimental.io_callback there.")


_compat.register_lowering(outside_call_p, _outside_call_lowering_cpu, platform="cpu")
_compat.register_lowering(outside_call_p, _outside_call_lowering_unsupported)
_compat.register_lowering(host_call_p, _host_call_lowering_cpu, platform="cpu")
_compat.register_lowering(host_call_p, _outside_call_lowering_unsupported)
