"""Lowering of hostfeed's primitives to XLA FFI custom calls (``hostfeed_tap``,
``hostfeed_call``, ``hostfeed_check``) that take and return the ordered-effect token, and
the choice of where they run under sharding (see the comment below)."""
from __future__ import annotations

import dataclasses

import jax
import numpy as np
from jax import lax
from jax.sharding import AbstractMesh, AxisType, PartitionSpec as P

from . import _compat, _receiver, receiver
from .primitives import (CallbackSpec, call_check_p, call_timeout_ms, host_call_p,
                         host_callback_effect, make_call_assembler, make_call_invoker,
                         make_invoker, make_shard_assembler, outside_call_p)

TAP_TARGET = "hostfeed_tap"
CALL_TARGET = "hostfeed_call"
CHECK_TARGET = "hostfeed_check"
FLAG_WITH_DEVICE = 1 << 0
FLAG_STATUS_OUTPUT = 1 << 1  # rust/handlers.rs FLAG_STATUS_OUTPUT
FLAG_SHARD = 1 << 2  # rust/handlers.rs FLAG_SHARD

for _name, _capsule in _receiver.registrations().items():
    jax.ffi.register_ffi_target(_name, _capsule, platform="cpu")


def _tap_consumer_id(spec: CallbackSpec, transforms: tuple, shard_parts=None) -> int:
    invoke = make_invoker(spec, transforms)
    if shard_parts is not None:
        invoke = make_shard_assembler(invoke, *shard_parts)
    return receiver.register((spec, transforms, shard_parts), invoke, spec.name)


def _call_consumer_id(spec: CallbackSpec, result_treedef, result_avals,
                      shard_parts=None) -> int:
    if shard_parts is None:
        invoke = make_call_invoker(spec, result_treedef, result_avals)
    else:  # (n_parts, source, the whole results' avals)
        n_parts, source, whole_avals = shard_parts
        invoke = make_call_assembler(spec, result_treedef, whole_avals, n_parts, source)
    return receiver.register((spec, "call", result_treedef, result_avals, shard_parts),
                             invoke, spec.name)


# ----------------------------------------------------------------------------------------
# Where a host callback runs, by sharding context.
#
# * One device (plain jit, jit on a chosen device): the custom call runs there.
# * Fully manual SPMD (pmap, shard_map with every mesh axis manual): per-device semantics;
#   every device runs its own custom call on its own shard. GSPMD needs a MANUAL sharding
#   on the op; Shardy needs none.
# * Global view (jit over arrays sharded on several devices): the callback must see the
#   whole logical operand, once. When every operand (and, for `call`, every result)
#   splits evenly along dimension 0 over the devices, it goes shard by shard: a fully
#   manual region where each device sends its own slice (plus its part number); the host
#   joins the slices, calls once, and gives each device its slice of every result
#   (primitives.PartCollector; the parts of one execution are matched by XLA's run id).
#   No bytes move between devices when the operands are laid out that way already;
#   otherwise the partitioner moves each element at most once. The rest use the
#   gathering scheme:
#   GSPMD would accept a MAXIMAL sharding on our custom call, but Shardy keeps such
#   shardings only for XLA's own callback targets and fails ours ("Side-effect HLO must
#   have sharding"). So we lower, for both partitioners alike, to a fully manual region
#   (`shard_map` over the computation's mesh, or a 1-D mesh of its devices when it has
#   none): the operands enter it replicated (the partitioner all-gathers them), and only
#   the device at `device_index` runs the custom call, under `axis_index ==
#   device_index`. A `call`'s results are then broadcast from that device (an exact bitwise psum, since every other device
#   contributes zeros) and leave the region replicated, so the partitioner hands every
#   shard its part. Cost: one all-gather of the tapped operands (each device receives
#   (n-1)/n of them) and, for `call`, one all-reduce of the results.
# * A failing `call` in a multi-device computation must not fail on one device while the
#   others wait in a collective (XLA would abort the process after its rendezvous
#   timeout). There the call reports through an int32 status result instead; the status is
#   combined over all devices (pmax) and a `hostfeed_check` on every device raises the
#   recorded failure, so all devices fail together and the caller gets the exception.
# * Partially manual shard_map (some mesh axes manual, others automatic): within each
#   manual shard the value is global over the automatic axes, so we apply the global-view
#   scheme over the automatic axes only: one callback per manual shard, with the operand
#   gathered over the automatic axes. This works with GSPMD, and with Shardy from jaxlib
#   0.11.2 on; before that, XLA aborts the process when compiling a token-carrying manual
#   region nested in a partially manual one under Shardy, so there we raise a clear error
#   at lowering instead (_compat.SHARDY_COMPILES_NESTED_MANUAL_TOKENS).

_AXIS = "_hostfeed_devices"


def _context(ctx):
    ac = ctx.module_context.axis_context
    if isinstance(ac, _compat.SPMDAxisContext):
        manual = frozenset(_compat.manual_axes(ac))
        if manual == frozenset(ac.mesh.axis_names):
            return "per_device", ac
        if _compat.use_shardy.value and not _compat.SHARDY_COMPILES_NESTED_MANUAL_TOKENS:
            auto = sorted(set(ac.mesh.axis_names) - manual)
            raise NotImplementedError(
                f"hostfeed: host callbacks inside a partially manual shard_map (manual axes "
                f"{sorted(manual)}, automatic axes {auto}) are not supported with the Shardy "
                f"partitioner before jax 0.11.2 (XLA aborts compiling them). Upgrade jax and "
                f"jaxlib to 0.11.2 or later, make every mesh axis manual (shard_map without "
                f"axis_names, or axis_names covering {sorted(ac.mesh.axis_names)}), move the "
                f"callback out of the shard_map, or set "
                f"jax.config.update('jax_use_shardy_partitioner', False).")
        return "partial_manual", ac
    if isinstance(ac, _compat.ShardingContext) and ac.num_devices > 1:
        return "global", ac
    return "single", ac


def _check_device_index(device_index: int, n: int, what: str) -> None:
    if device_index >= n:
        raise ValueError(
            f"hostfeed: device_index={device_index} is outside the {n} device(s) that "
            f"{what}; use 0 <= device_index < {n}")


def _manual_region(ac, avals):
    """(mesh, axes to make manual, devices per group) for the global-view scheme.

    Uses the mesh the computation is traced under, or else the mesh the operands are
    sharded over (explicit sharding), so operands enter the region naturally; with neither,
    a 1-D mesh over the computation's devices. Either way logical device k along the axes
    is device k of the device assignment.
    """
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        meshes = [getattr(getattr(a, "sharding", None), "mesh", None) for a in avals]
        meshes = [m for m in meshes if m is not None and not m.empty]
        mesh = meshes[0] if meshes else mesh
    if not mesh.empty:
        manual = frozenset(_compat.manual_axes(ac))
        axes = tuple(a for a in mesh.axis_names if a not in manual)
        if axes:
            return mesh, axes, int(np.prod([mesh.shape[a] for a in axes]))
    if isinstance(ac, _compat.ShardingContext):
        return AbstractMesh((ac.num_devices,), (_AXIS,)), (_AXIS,), ac.num_devices
    raise NotImplementedError(
        "hostfeed: cannot place a host callback in this partially manual region: no "
        "automatic mesh axes were found")


def _resharded(x, spec):
    """`x` resharded to `spec` when its type carries an explicit sharding (explicit mesh
    axes); with automatic axes the partitioner reshards by itself."""
    sharding = getattr(jax.typeof(x), "sharding", None)
    mesh = getattr(sharding, "mesh", None)
    if mesh is None or mesh.empty or not any(
            t == AxisType.Explicit for t in mesh.axis_types):
        return x
    return jax.sharding.reshard(x, spec)


def _replicated(x):
    return _resharded(x, P())


def _bitwise_broadcast(x, is_source, axes):
    """Every device gets the source device's `x`, bit for bit (others hold zeros)."""
    jnp = jax.numpy
    dtype = np.dtype(x.dtype)
    if dtype.kind == "c":
        part = np.float32 if dtype.itemsize == 8 else np.float64
        re = _bitwise_broadcast(jnp.real(x).astype(part), is_source, axes)
        im = _bitwise_broadcast(jnp.imag(x).astype(part), is_source, axes)
        return lax.complex(re, im)
    if dtype == np.bool_:
        bits = x.astype(np.uint8)
    else:
        bits = lax.bitcast_convert_type(x, np.dtype(f"uint{dtype.itemsize * 8}"))
    bits = lax.psum(jnp.where(is_source, bits, jnp.zeros_like(bits)), axes)
    if dtype == np.bool_:
        return bits != 0
    return lax.bitcast_convert_type(bits, dtype)


def _lower_global_view(ctx, ac, args, avals_in, run, avals_out, device_index, what,
                       with_status=False):
    """Lowers `run(*operands) -> results` to run once, on one device, with whole operands.

    With `with_status`, `run` returns `(status, *results)`; the status is combined over the
    devices and checked on all of them (see the comment at the top of this section).
    """
    mesh, axes, group = _manual_region(ac, avals_in)
    _check_device_index(device_index, group, what)
    spec = P()

    def body(*xs):
        is_source = lax.axis_index(axes) == device_index
        zeros = tuple(jax.numpy.zeros(a.shape, a.dtype) for a in avals_out)
        if with_status:
            zeros = (np.int32(0),) + zeros
        outs = lax.cond(is_source, lambda xs: tuple(run(*xs)), lambda xs: zeros, xs)
        if with_status:
            status, *outs = outs
            outs = [_bitwise_broadcast(o, is_source, axes) for o in outs]
            call_check_p.bind(lax.pmax(status, axes))
            return tuple(outs)
        return tuple(_bitwise_broadcast(o, is_source, axes) for o in outs)

    def fn(*ops):
        with jax.sharding.use_abstract_mesh(mesh):
            return jax.shard_map(body, mesh=mesh, in_specs=(spec,) * len(ops),
                                 out_specs=(spec,) * len(avals_out),
                                 axis_names=frozenset(axes), check_vma=False)(
                *map(_replicated, ops))

    return _lower_fun(ctx, fn, avals_in, avals_out, args)


def _lower_fun(ctx, fn, avals_in, avals_out, args):
    """`mlir.lower_fun` on a context with the given avals, passing the effect tokens on."""
    sub_ctx = dataclasses.replace(ctx, avals_in=list(avals_in), avals_out=list(avals_out))
    outs = _compat.lower_fun(fn, multiple_results=True)(sub_ctx, *args)
    ctx.set_tokens_out(sub_ctx.tokens_out)
    return outs


def _emit(ctx, target, args, avals_in, avals_out, per_device, **attrs):
    """The FFI custom call with a token in and out; returns its non-token results."""
    token = ctx.tokens_in.get(host_callback_effect)
    sub_ctx = dataclasses.replace(
        ctx, avals_in=[_compat.abstract_token, *avals_in],
        avals_out=[_compat.abstract_token, *avals_out])
    op = _compat.build_ffi_lowering_function(target, has_side_effect=True)(
        sub_ctx, token, *args, **attrs)
    if per_device and not _compat.use_shardy.value:
        _compat.set_sharding(ctx.module_context, op, _compat.manual_op_sharding())
    token_out, *results = op.results
    ctx.set_tokens_out(
        ctx.tokens_in.update_tokens(_compat.mlir.TokenSet({host_callback_effect: token_out})))
    return results


def _splits_evenly(avals, group: int) -> bool:
    return group >= 2 and all(len(a.shape) >= 1 and a.shape[0] % group == 0 for a in avals)


def _part_meta(axes, manual):
    """`[group, part]` of this device: its group of manual shards and its place in it."""
    part = lax.axis_index(axes)
    grp = lax.axis_index(manual) if manual else 0
    return jax.numpy.stack([jax.numpy.asarray(grp), part]).astype(np.int32)


def _lower_sharded_call(ctx, ac, args, params):
    """Global-view call sent shard by shard, or None when operands or results do not split
    evenly along dimension 0 over the devices. Each device sends its slices (plus
    `[group, part]`) and waits; the host joins them, calls once and returns to every device
    its slice of each result (`make_call_assembler`). No operand or result bytes move
    between devices; only the int32 status is combined, as for every multi-device call."""
    mesh, axes, group = _manual_region(ac, ctx.avals_in)
    _check_device_index(params["device_index"], group, "make the call")
    whole = tuple(params["result_avals"])
    if not args or not _splits_evenly(ctx.avals_in, group) or not _splits_evenly(whole, group):
        return None
    local = tuple(a.update(shape=(a.shape[0] // group, *a.shape[1:])) for a in whole)
    spec = P(axes)
    manual = _compat.manual_axes(ac)
    inner = dict(params, result_avals=local, with_status=True,
                 shard_parts=(group, params["device_index"], whole))

    def body(*shards):
        status, *outs = host_call_p.bind(_part_meta(axes, manual), *shards, **inner)
        call_check_p.bind(lax.pmax(status, axes))
        return tuple(outs)

    def fn(*ops):
        with jax.sharding.use_abstract_mesh(mesh):
            return jax.shard_map(body, mesh=mesh, in_specs=(spec,) * len(ops),
                                 out_specs=(spec,) * len(whole), axis_names=frozenset(axes),
                                 check_vma=False)(*(_resharded(o, spec) for o in ops))

    return _lower_fun(ctx, fn, ctx.avals_in, ctx.avals_out, args)


def _lower_sharded_tap(ctx, ac, tapped, avals, bind_params):
    """Global-view tap sent shard by shard, or None when the operands do not allow it.

    Each device of the group taps its own slice (dimension 0 split over the group) plus
    `[group, part]`; the host assembles the slices and calls the tap function once (see
    `make_shard_assembler`). No bytes move between devices when the operands are already
    split that way (the usual case); otherwise the partitioner moves each element at most
    once, instead of replicating the operands everywhere.
    """
    mesh, axes, group = _manual_region(ac, avals)
    _check_device_index(bind_params["device_index"], group, "collect the tapped operand")
    if not tapped or not _splits_evenly(avals, group):
        return None
    spec = P(axes)
    manual = _compat.manual_axes(ac)
    params = dict(bind_params, nr_tapped_args=len(tapped) + 1,
                  shard_parts=(group, bind_params["device_index"]))

    def body(*shards):
        outside_call_p.bind(_part_meta(axes, manual), *shards, **params)
        return ()

    def fn(*ops):
        with jax.sharding.use_abstract_mesh(mesh):
            jax.shard_map(body, mesh=mesh, in_specs=(spec,) * len(ops), out_specs=(),
                          axis_names=frozenset(axes), check_vma=False)(
                *(_resharded(o, spec) for o in ops))
        return ()

    return _lower_fun(ctx, fn, avals, [], tapped)


def _outside_call_lowering_cpu(ctx, *args, callback, nr_tapped_args, transforms, **params):
    where, ac = _context(ctx)
    if where in ("global", "partial_manual") and params.get("shard_parts") is None:
        tapped = args[:nr_tapped_args]
        bind_params = dict(params, callback=callback, nr_tapped_args=nr_tapped_args,
                           transforms=transforms)

        def run(*xs):
            outside_call_p.bind(*xs, **bind_params)
            return ()

        avals = ctx.avals_in[:nr_tapped_args]
        if _lower_sharded_tap(ctx, ac, tapped, avals, bind_params) is None:
            _lower_global_view(ctx, ac, tapped, avals, run, [], params["device_index"],
                               "collect the tapped operand")
        return list(args)
    cid = _tap_consumer_id(callback, transforms, params.get("shard_parts"))
    receiver.ensure_started()
    flags = (FLAG_WITH_DEVICE if callback.with_device else 0) | (
        FLAG_SHARD if params.get("shard_parts") is not None else 0)
    _emit(ctx, TAP_TARGET, args[:nr_tapped_args], ctx.avals_in[:nr_tapped_args], [],
          where == "per_device", consumer_id=np.int64(cid), flags=np.int64(flags))
    # Identity on every operand: the outputs are the inputs.
    return list(args)


def _host_call_lowering_cpu(ctx, *args, callback, result_treedef, result_avals, device_index,
                            with_status=False, shard_parts=None):
    where, ac = _context(ctx)
    params = dict(callback=callback, result_treedef=result_treedef,
                  result_avals=result_avals, device_index=device_index)
    if where in ("global", "partial_manual") and not with_status:
        sharded = _lower_sharded_call(ctx, ac, args, params)
        if sharded is not None:
            return sharded

        def run(*xs):
            return host_call_p.bind(*xs, **params, with_status=True)

        return _lower_global_view(ctx, ac, args, ctx.avals_in, run, ctx.avals_out,
                                  device_index, "make the call", with_status=True)
    if where == "per_device" and not with_status:
        axes = tuple(ac.mesh.axis_names)

        def per_device(*xs):
            status, *outs = host_call_p.bind(*xs, **params, with_status=True)
            call_check_p.bind(lax.pmax(status, axes))
            return outs

        return _lower_fun(ctx, per_device, ctx.avals_in, ctx.avals_out, args)
    cid = _call_consumer_id(callback, result_treedef, result_avals, shard_parts)
    receiver.ensure_started()
    flags = ((FLAG_WITH_DEVICE if callback.with_device else 0)
             | (FLAG_STATUS_OUTPUT if with_status else 0)
             | (FLAG_SHARD if shard_parts is not None else 0))
    return _emit(ctx, CALL_TARGET, args, ctx.avals_in, ctx.avals_out, where == "per_device",
                 consumer_id=np.int64(cid), flags=np.int64(flags),
                 timeout_ms=np.int64(call_timeout_ms()), name=callback.name)


def _call_check_lowering_cpu(ctx, status):
    where, _ = _context(ctx)
    _emit(ctx, CHECK_TARGET, [status], ctx.avals_in, [], where == "per_device")
    return []


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
_compat.register_lowering(call_check_p, _call_check_lowering_cpu, platform="cpu")
_compat.register_lowering(call_check_p, _outside_call_lowering_unsupported)
