"""Transformation rules for hostfeed's primitives, each registered under its definition."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import jax
import jax.numpy as jnp
from jax import lax
from jax.extend.core import jaxpr_as_fun
from jax.extend.core.primitives import cond_p, while_p
from jax.interpreters import ad, batching, mlir

from . import compat
from .primitives import (CallbackKind, CallbackSpec, HostCallbackEffect, get_ad_taps, host_call_p,
                         is_record, outside_call_p, recorded_before_p)

# ----------------------------------------------------------------------------------------
# host_call_p (`hcb.call`)


def _host_call_not_differentiable(*args: Any, callback: CallbackSpec, **params: Any) -> NoReturn:
    # The legacy module's wording first (code and tests match on it), then the way out.
    raise NotImplementedError(
        f"differentiation rules are implemented only for id_tap, not for call (hcb.call of "
        f"{callback.name}): JAX cannot see through the host function. Define the "
        f"derivative yourself with jax.custom_vjp (or jax.custom_jvp), for example by "
        f"calling hcb.call again with the host function's derivative in the backward rule.")


ad.primitive_jvps[host_call_p] = (
    lambda primals, tangents, **params: _host_call_not_differentiable(**params))
ad.primitive_transposes[host_call_p] = (
    lambda cts, *args, **params: _host_call_not_differentiable(**params))


def _host_call_batching(args: Sequence[Any], dims: Sequence[Any],
                        **params: Any) -> tuple[Any, list[int]]:
    # One host call per batch element, in order (like vmap_method="sequential"): the host
    # function keeps seeing the shapes it was written for.
    is_batched = [d is not None for d in dims]
    moved = [jnp.moveaxis(a, d, 0) if b else a for a, d, b in zip(args, dims, is_batched)]
    batched = [a for a, b in zip(moved, is_batched) if b]

    def one(batched_slice: Sequence[Any]) -> Any:
        it = iter(batched_slice)
        operands = [next(it) if b else a for a, b in zip(moved, is_batched)]
        return host_call_p.bind(*operands, **params)

    outs = lax.map(one, batched)
    return outs, [0] * len(outs)


batching.primitive_batchers[host_call_p] = _host_call_batching


# ----------------------------------------------------------------------------------------
# outside_call_p (`id_tap`, `id_print`)
#
# Operands are [tapped args..., pass-through args...] (the pass-through ones come from
# `result=`); outputs are the operands (identity). `transforms` holds internal
# `(name, *params)` tuples, unpacked for the tap function by spec.unpack_transforms.
#
# A "jvp tap" (transforms mode) has transforms ending in ("jvp",) and tapped operands
# [primals..., tangents...] whose argument tree is the pair (primals, tangents).

Zero = compat.Zero


def _with_transform(transforms: tuple, name: str, *params: Any) -> tuple:
    return transforms + ((name, *params),)


def _is_jvp_tap(transforms: tuple) -> bool:
    return bool(transforms) and transforms[-1] == ("jvp",)


def _is_float0(aval: Any) -> bool:
    return getattr(aval, "dtype", None) == compat.float0


def _tangent_aval(x: Any) -> Any:
    return x.aval if compat.is_undefined_primal(x) else jax.typeof(x).to_tangent_aval()


def _instantiate(t: Any, aval: Any) -> Any:
    """A tangent or cotangent as an array to send: symbolic zeros become zeros of the right
    shape and dtype; float0 (the tangent type of integers and bools) is sent as bool zeros,
    as the legacy module did."""
    if type(t) is Zero:
        aval = t.aval
        t = None
    if _is_float0(aval) or (t is not None and getattr(t, "dtype", None) == compat.float0):
        return jnp.zeros(aval.shape, jnp.bool_)
    if t is None:
        return jnp.zeros(aval.shape, aval.dtype)
    return t


def _primal_half(callback: CallbackSpec) -> CallbackSpec:
    return callback.with_tree(callback.arg_treedef.children()[0])


def _outside_call_jvp(primals: Sequence[Any], tangents: Sequence[Any],
                      **params: Any) -> tuple[Any, list[Any]]:
    n = params["nr_tapped_args"]
    if (params["callback"].ad_taps or get_ad_taps()) == "primals":
        # JAX 0.4.x behaviour: the tap sees the primals only; tangents pass through.
        return outside_call_p.bind(*primals, **params), list(tangents)
    tapped_p, pass_p = list(primals[:n]), list(primals[n:])
    tapped_t, pass_t = list(tangents[:n]), list(tangents[n:])
    t_avals = [jax.typeof(p).to_tangent_aval() for p in tapped_p]
    sent_t = [_instantiate(t, a) for t, a in zip(tapped_t, t_avals)]
    tree = params["callback"].arg_treedef
    pair = params["callback"].with_tree(jax.tree_util.treedef_tuple((tree, tree)))
    outs = outside_call_p.bind(
        *tapped_p, *sent_t, *pass_p,
        **dict(params, callback=pair, nr_tapped_args=2 * n, forward_tapped=False,
               transforms=_with_transform(params["transforms"], "jvp")))
    out_p = list(outs[:n]) + list(outs[2 * n:])
    out_t = [Zero(a) if _is_float0(a) else o for a, o in zip(t_avals, outs[n:2 * n])]
    return out_p, out_t + pass_t


ad.primitive_jvps[outside_call_p] = _outside_call_jvp


def _primal_params(params: dict) -> dict:
    n = params["nr_tapped_args"] // 2
    return dict(params, callback=_primal_half(params["callback"]), nr_tapped_args=n,
                transforms=params["transforms"][:-1], forward_tapped=False)


def _splittable(params: dict, known_or_unknown: list[bool], known_value: bool) -> bool:
    # A jvp tap whose primal (and pass-through) operands are known and some tangent is not.
    if not _is_jvp_tap(params["transforms"]) or params["forward_tapped"]:
        return False
    n2 = params["nr_tapped_args"]
    n = n2 // 2
    is_known = [k == known_value for k in known_or_unknown]
    return all(is_known[:n]) and all(is_known[n2:]) and not all(is_known[n:n2])


def _outside_call_partial_eval(trace: Any, *tracers: Any, **params: Any) -> Any:
    # Linearisation (grad, vjp, linearize) traces the jvp tap with known primals and
    # unknown tangents. Split it, as the legacy module did: the forward pass taps the
    # primals (without 'jvp'), and the jvp tap is staged for the backward pass, where its
    # transpose taps the cotangents.
    if not _splittable(params, [t.pval.is_known() for t in tracers], True):
        return trace.default_process_primitive(outside_call_p, tracers, params)
    n2 = params["nr_tapped_args"]
    n = n2 // 2
    outs_known = trace.default_process_primitive(
        outside_call_p, list(tracers[:n]) + list(tracers[n2:]), _primal_params(params))
    outs_all = trace.default_process_primitive(outside_call_p, tracers,
                                               dict(params, forward_tapped=True))
    return list(outs_known[:n]) + list(outs_all[n:n2]) + list(outs_known[n:])


compat.custom_partial_eval_rules[outside_call_p] = _outside_call_partial_eval


def _recomputes(saveable: Callable[..., Any], eqn: Any) -> bool:
    policy = compat.ensure_enum(
        saveable(outside_call_p, *[v.aval for v in eqn.invars], **eqn.params))
    return isinstance(policy, compat.RecomputeType)


def _outside_call_partial_eval_custom(
        saveable: Callable[..., Any], unks_in: Sequence[bool], inst_in: Sequence[bool], eqn: Any,
) -> tuple[Any, Any, list[bool], list[bool], list[Any]]:
    # Used by jax.checkpoint/remat (and other users of partial_eval_jaxpr_custom). The
    # checkpoint policy decides whether the taps of a checkpointed function run again in
    # the backward pass, where it is rematerialised (the default policy: yes).
    params = eqn.params
    n_out = len(eqn.outvars)
    res = [v for v, unk, inst in zip(eqn.invars, unks_in, inst_in) if not unk and not inst]
    record = is_record(params["callback"])
    if not any(unks_in):
        if record:
            # A record writes what the forward pass computed, once: the recomputation has
            # the identity in its place, so that it is the one without the record.
            return (eqn, eqn.replace(primitive=recorded_before_p, params={},
                                     effects=compat.no_effects),
                    [False] * n_out, [True] * n_out, res)
        if _recomputes(saveable, eqn):
            return eqn, eqn, [False] * n_out, [True] * n_out, res
        return eqn, None, [False] * n_out, [False] * n_out, []
    if _splittable(params, list(unks_in), False):
        # Primal tap in the forward pass, jvp tap in the backward pass. When the policy
        # rematerialises, the staged jvp tap is split again when the backward pass is
        # built, so the primals are tapped again there too.
        n2 = params["nr_tapped_args"]
        n = n2 // 2
        known_eqn = eqn.replace(invars=eqn.invars[:n] + eqn.invars[n2:],
                                outvars=eqn.outvars[:n] + eqn.outvars[n2:],
                                params=_primal_params(params))
        staged_outvars = ([compat.DropVar(v.aval) for v in eqn.outvars[:n]]
                          + eqn.outvars[n:n2]
                          + [compat.DropVar(v.aval) for v in eqn.outvars[n2:]])
        staged_eqn = eqn.replace(
            outvars=staged_outvars,
            params=dict(params, forward_tapped=record or not _recomputes(saveable, eqn)))
        unks_out = [False] * n + [True] * n + [False] * (n_out - n2)
        inst_out = [False] * n + [True] * n + [False] * (n_out - n2)
        return known_eqn, staged_eqn, unks_out, inst_out, res
    return None, eqn, [True] * n_out, [True] * n_out, res


compat.partial_eval_jaxpr_custom_rules[outside_call_p] = _outside_call_partial_eval_custom


ad.primitive_jvps[recorded_before_p] = (
    lambda primals, tangents: (recorded_before_p.bind(*primals), list(tangents)))
ad.primitive_transposes[recorded_before_p] = lambda cts, *args: list(cts)
batching.primitive_batchers[recorded_before_p] = (
    lambda args, dims: (recorded_before_p.bind(*args), list(dims)))
mlir.register_lowering(recorded_before_p, lambda ctx, *operands: list(operands))


def _outside_call_transpose(cts: Sequence[Any], *args: Any, **params: Any) -> list[Any]:
    n2 = params["nr_tapped_args"]
    linear = [compat.is_undefined_primal(a) for a in args]
    out: list[Any] = [None] * len(args)
    for i in range(n2, len(args)):  # pass-through operands: identity
        if linear[i]:
            out[i] = cts[i]
    callback = params["callback"]
    if _is_jvp_tap(params["transforms"]) and not any(linear[:n2 // 2]):
        # The backward half of a jvp tap: tap the cotangents of the tangents.
        idx = list(range(n2 // 2, n2))
        spec = _primal_half(callback)
    else:
        # A tap applied to linear values (e.g. inside a custom_jvp rule): tap their
        # cotangents.
        idx = [i for i in range(n2) if linear[i]]
        spec = (callback if len(idx) == n2 else
                callback.with_tree(jax.tree_util.tree_structure([0] * len(idx))))
    if not idx:
        return out
    avals = [_tangent_aval(args[i]) for i in idx]
    sent = [_instantiate(cts[i], a) for i, a in zip(idx, avals)]
    if callback.kind is CallbackKind.RECORD_WITH_STEP and idx[0] == n2 // 2 and len(sent) > 1:
        # A record's step is an integer, so its cotangent is always zero: send its primal
        # value instead (known here), so that the cotangent's row carries the step.
        sent[1] = args[1]
    tapped = outside_call_p.bind(
        *sent, **dict(params, callback=spec, nr_tapped_args=len(sent), forward_tapped=False,
                      transforms=_with_transform(params["transforms"], "transpose")))
    for i, a, t in zip(idx, avals, tapped):
        if linear[i]:
            out[i] = Zero(a) if _is_float0(a) else t
    return out


ad.primitive_transposes[outside_call_p] = _outside_call_transpose


def _outside_call_batching(args: Sequence[Any], dims: Sequence[int | None],
                           **params: Any) -> tuple[Any, list[int | None]]:
    # The tap sees the batched values; `transforms` records where each tapped operand's
    # batch dimension is (None for an operand that is not batched).
    n = params["nr_tapped_args"]
    if is_record(params["callback"]):
        return _record_batching(args, dims, **params)
    batch_dims = tuple(dims[:n])
    outs = outside_call_p.bind(
        *args, **dict(params, transforms=_with_transform(params["transforms"], "batch",
                                                         batch_dims)))
    return outs, list(dims)


def _record_batching(args: Sequence[Any], dims: Sequence[int | None],
                     **params: Any) -> tuple[list[Any], list[int | None]]:
    # A record (hostfeed.Recorder) writes one row per lane: every tapped operand gets the
    # batch dimension first (an unbatched one is broadcast), so that lane i is row i of
    # each. An unbatched operand's output is the operand itself, still unbatched (the
    # identity, and what e.g. jacfwd's `out_axes=None` expects).
    n = params["nr_tapped_args"]
    size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
    sent = [a if i >= n else jnp.moveaxis(a, d, 0) if d is not None
            else jnp.broadcast_to(a, (size, *jnp.shape(a)))
            for i, (a, d) in enumerate(zip(args, dims))]
    outs = outside_call_p.bind(
        *sent, **dict(params, transforms=_with_transform(params["transforms"], "batch",
                                                         (0,) * n)))
    outs = [o if i >= n or d is not None else a
            for i, (o, a, d) in enumerate(zip(outs, args, dims))]
    return outs, [d if i >= n or d is None else 0 for i, d in enumerate(dims)]


batching.primitive_batchers[outside_call_p] = _outside_call_batching


# ----------------------------------------------------------------------------------------
# while_p, when its predicate taps (or calls) and is batched
#
# JAX (0.10 to 0.12, `_while_lowering` in lax/control_flow/loops.py) lowers a while loop
# whose cond function has an ordered effect, such as ours, by carrying the predicate
# through the loop; when the predicate is batched it ORs the lanes into one and never
# selects per lane, so lanes that are done keep running the body and the results are
# wrong. (Without an ordered effect in the cond, the same lowering recomputes the
# predicate in the body and selects per lane.) For these loops hostfeed builds the
# per-lane loop itself, carrying the predicate as the legacy module's rewrite did, so the
# loop JAX lowers has an effect-free cond and no batched predicate to mishandle:
#
#     pred = cond(carry)                    # cond taps see the initial carry
#     while any(pred):
#         new = body(carry)                 # every lane computes the body (body taps)
#         carry = where(pred, new, carry)   # lanes that are done keep their carry
#         pred = cond(carry)                # cond taps, once per iteration
#
# So the cond's taps see, lane by lane, the carries an unbatched loop has (a lane that is
# done repeats its final carry), never the body's results for lanes that are done (the
# legacy rewrite ran the cond before selecting, so a `call` in the predicate could get
# values past a lane's end). Every other loop (no hostfeed effect in the cond, or a
# predicate that is not batched) goes to JAX's own rule, unchanged.

def _has_hostfeed_effect(jaxpr: Any) -> bool:
    return any(isinstance(e, HostCallbackEffect) for e in jaxpr.effects)


def _batched_carry(axis_data: Any, bconst_bat: list[bool], init_bat: list[bool],
                   body_jaxpr: Any) -> list[bool]:
    """Which carries are batched: batched initially, or made so by the body (fixpoint)."""
    carry_bat = list(init_bat)
    for _ in range(1 + len(carry_bat)):
        _, out_bat = compat.batch_jaxpr(body_jaxpr, axis_data, bconst_bat + carry_bat,
                                         carry_bat)
        new = [a or b for a, b in zip(carry_bat, out_bat)]
        if new == carry_bat:
            return carry_bat
        carry_bat = new
    raise AssertionError("while_loop batching: no fixpoint for the batched carries")


def _select_lanes(pred: Any, new: Any, old: Any) -> Any:
    """`new` in the lanes where `pred` (shape (lanes,)) is true, else `old`; lanes on axis 0."""
    return lax.select(lax.broadcast_in_dim(pred, jnp.shape(new), (0,)), new, old)


def _while_batching(axis_data: Any, args: Sequence[Any], dims: Sequence[int | None], *,
                    cond_nconsts: int, cond_jaxpr: Any, body_nconsts: int,
                    body_jaxpr: Any) -> tuple[Any, Sequence[int | None]]:
    params = dict(cond_nconsts=cond_nconsts, cond_jaxpr=cond_jaxpr,
                  body_nconsts=body_nconsts, body_jaxpr=body_jaxpr)
    if not _has_hostfeed_effect(cond_jaxpr):
        return _jax_while_batching(axis_data, args, dims, **params)
    n_consts = cond_nconsts + body_nconsts
    batched = [d is not None for d in dims]
    carry_bat = _batched_carry(axis_data, batched[cond_nconsts:n_consts],
                               batched[n_consts:], body_jaxpr)
    _, (pred_bat,) = compat.batch_jaxpr(cond_jaxpr, axis_data,
                                         batched[:cond_nconsts] + carry_bat, False)
    if not pred_bat:  # JAX lowers a loop with one predicate correctly
        return _jax_while_batching(axis_data, args, dims, **params)

    cconsts, bconsts = args[:cond_nconsts], args[cond_nconsts:n_consts]
    n_carry = len(args) - n_consts
    lanes = [0] * n_carry  # with a batched predicate every carry is batched, on axis 0
    cond_b, _ = compat.batch_jaxpr_axes(cond_jaxpr, axis_data,
                                         list(dims[:cond_nconsts]) + lanes, [0])
    body_b, _ = compat.batch_jaxpr_axes(body_jaxpr, axis_data,
                                         list(dims[cond_nconsts:n_consts]) + lanes, lanes)
    init = [batching.bdim_at_front(x, d, axis_data.size, axis_data.explicit_mesh_axis)
            for x, d in zip(args[n_consts:], dims[n_consts:])]

    def lane_preds(carry: Sequence[Any]) -> Any:
        return jaxpr_as_fun(cond_b)(*cconsts, *carry)[0]

    def step(state: tuple[Any, list[Any]]) -> tuple[Any, list[Any]]:
        pred, carry = state
        new = jaxpr_as_fun(body_b)(*bconsts, *carry)
        carry = [_select_lanes(pred, a, b) for a, b in zip(new, carry)]
        return lane_preds(carry), carry

    _, out = lax.while_loop(lambda state: jnp.any(state[0]), step, (lane_preds(init), init))
    return out, lanes


_jax_while_batching = getattr(batching.fancy_primitive_batchers[while_p],
                              "_hostfeed_wrapped", batching.fancy_primitive_batchers[while_p])
_while_batching._hostfeed_wrapped = _jax_while_batching  # type: ignore[attr-defined]
batching.fancy_primitive_batchers[while_p] = _while_batching


# ----------------------------------------------------------------------------------------
# cond_p, when a branch records and partial evaluation splits it
#
# Partial evaluation (a JaxprTrace) builds the unknown side of a function from the
# equations its outputs depend on, plus those it holds an effect handle for (effects in
# `partial_eval_kept_effects`, which hostfeed's effect joins). JAX's rule for `cond`
# (0.10 to 0.12, `_cond_partial_eval`) stages the unknown half of a cond whose index is
# known without such a handle, so that half is dropped when none of its outputs is used:
# a record of a selected step (`every=` with `cotangents=False`) or a summary is such a
# cond. It happens under `grad` of a `scan`: the scan's known body is partially evaluated
# again with the carry unknown (`_scan_known_hoisting`), and the records, which depend on
# the carry, vanished with the unknown half. This rule calls JAX's and keeps that half
# when it holds a hostfeed effect: through one of its unknown outputs, or, when it would
# have none, through an output added for the purpose (an unknown operand passed on).

def _cond_partial_eval(trace: Any, *tracers: Any, branches: Sequence[Any],
                       **params: Any) -> Any:
    ops_uk = [not t.pval.is_known() for t in tracers[1:]]
    if (not tracers[0].pval.is_known() or not any(ops_uk)
            or not any(_has_hostfeed_effect(b) for b in branches)):
        return _jax_cond_partial_eval(trace, *tracers, branches=branches, **params)
    out_uks = [any(uks) for uks in zip(*(compat.partial_eval_out_unknowns(b, ops_uk)
                                         for b in branches))]
    extra = not any(out_uks)
    if extra:
        k = ops_uk.index(True)
        branches = tuple(_with_operand_out(b, k) for b in branches)
    outs = _jax_cond_partial_eval(trace, *tracers, branches=branches, **params)
    staged = outs[-1] if extra else next(t for t, uk in zip(outs, out_uks) if uk)
    recipe = staged.recipe
    if any(isinstance(e, HostCallbackEffect) for e in getattr(recipe, "effects", ())):
        trace.effect_handles.append(compat.EffectHandle(list(recipe.in_tracers), recipe))
    return outs[:-1] if extra else outs


def _with_operand_out(branch: Any, k: int) -> Any:
    """``branch`` (a ClosedJaxpr, or a Jaxpr from 0.12) with its ``k``-th operand as one
    more output."""
    jaxpr, rebuild = compat.open_jaxpr(branch)
    return rebuild(jaxpr.replace(outvars=[*jaxpr.outvars, jaxpr.invars[k]]))


_jax_cond_partial_eval = getattr(compat.custom_partial_eval_rules[cond_p],
                                 "_hostfeed_wrapped", compat.custom_partial_eval_rules[cond_p])
_cond_partial_eval._hostfeed_wrapped = _jax_cond_partial_eval  # type: ignore[attr-defined]
compat.custom_partial_eval_rules[cond_p] = _cond_partial_eval
