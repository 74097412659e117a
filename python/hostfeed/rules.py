"""Transformation rules for hostfeed's primitives, each registered under its definition."""
from __future__ import annotations

from jax.interpreters import ad, batching

from .primitives import host_call_p

# ----------------------------------------------------------------------------------------
# host_call_p (`hcb.call`)


def _host_call_not_differentiable(*args, callback, **params):
    raise TypeError(
        f"hcb.call of {callback.name} is not differentiable: JAX cannot see through the host "
        f"function (the legacy module did not differentiate it either). Define the "
        f"derivative yourself with jax.custom_vjp (or jax.custom_jvp), for example by "
        f"calling hcb.call again with the host function's derivative in the backward rule.")


ad.primitive_jvps[host_call_p] = (
    lambda primals, tangents, **params: _host_call_not_differentiable(**params))
ad.primitive_transposes[host_call_p] = (
    lambda cts, *args, **params: _host_call_not_differentiable(**params))


def _host_call_batching(args, dims, *, callback, result_treedef, result_avals, device_index):
    # One host call per batch element, in order (like vmap_method="sequential"): the host
    # function keeps seeing the shapes it was written for.
    import jax.numpy as jnp
    from jax import lax

    is_batched = [d is not None for d in dims]
    moved = [jnp.moveaxis(a, d, 0) if b else a for a, d, b in zip(args, dims, is_batched)]
    batched = [a for a, b in zip(moved, is_batched) if b]

    def one(batched_slice):
        it = iter(batched_slice)
        operands = [next(it) if b else a for a, b in zip(moved, is_batched)]
        return host_call_p.bind(*operands, callback=callback, result_treedef=result_treedef,
                                result_avals=result_avals, device_index=device_index)

    outs = lax.map(one, batched)
    return outs, [0] * len(outs)


batching.primitive_batchers[host_call_p] = _host_call_batching
