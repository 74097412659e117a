"""Where a host callback runs when a computation spans several devices (the lowering
strategies), expressed as JAX code that the lowering rules lower in place.

* One device (plain jit, jit on a chosen device): the custom call runs there.
* Fully manual SPMD (pmap, shard_map with every mesh axis manual): per-device semantics;
  every device runs its own custom call on its own shard. GSPMD needs a MANUAL sharding
  on the op; Shardy needs none.
* Global view (jit over arrays sharded on several devices): the callback must see the
  whole logical operand, once. When every operand (and, for `call`, every result)
  splits evenly along dimension 0 over the devices, it goes shard by shard: a fully
  manual region where each device sends its own slice (plus its part number); the host
  joins the slices, calls once, and gives each device its slice of every result
  (runtime.Joiner; the parts of one execution are matched by XLA's run id).
  No bytes move between devices when the operands are laid out that way already;
  otherwise the partitioner moves each element at most once. The rest use the
  gathering scheme:
  GSPMD would accept a MAXIMAL sharding on our custom call, but Shardy keeps such
  shardings only for XLA's own callback targets and fails ours ("Side-effect HLO must
  have sharding"). So we lower, for both partitioners alike, to a fully manual region
  (`shard_map` over the computation's mesh, or a 1-D mesh of its devices when it has
  none): the operands enter it replicated (the partitioner all-gathers them), and only
  the device at `device_index` runs the custom call, under `axis_index ==
  device_index`. A `call`'s results are then broadcast from that device (an exact
  bitwise psum, since every other device contributes zeros) and leave the region
  replicated, so the partitioner hands every shard its part. Cost: one all-gather of the
  tapped operands (each device receives (n-1)/n of them) and, for `call`, one all-reduce
  of the results.
* Many processes (`jax.distributed`): every custom call runs in the process that owns
  its device, so per-device callbacks need nothing more. A global-view callback runs in
  the process that owns device `device_index` of the computation (the *owner*), and the
  host can join only slices that reach that process. So, shard by shard, the slices of
  the other processes' devices are first moved to the owner process's devices with
  `ppermute` rounds (round j pairs up to k remote devices with the owner's k devices),
  and each owner device sends its own slice plus the ones it received in one message
  (`[group, part_0, part_1, ...]`, -1 for an empty slot); only the owner process's
  devices send, so its host joins the whole value and never waits for a part that cannot
  come. A call's results travel back by the same rounds reversed. Bytes between
  processes: exactly the slices held outside the owner process, once (and their results
  for a call). One process is the special case with no rounds. The gathering scheme
  needs nothing more either: only device `device_index` calls, in its own process.
  Partially manual regions under many processes use the gathering scheme.
* A failing `call` in a multi-device computation must not fail on one device while the
  others wait in a collective (XLA would abort the process after its rendezvous
  timeout). There the call reports through an int32 status result instead; the status is
  combined over all devices (pmax) and a `hostfeed_check` on every device raises the
  recorded failure, so all devices fail together and the caller gets the exception.
* Partially manual shard_map (some mesh axes manual, others automatic): within each
  manual shard the value is global over the automatic axes, so we apply the global-view
  scheme over the automatic axes only: one callback per manual shard, with the operand
  gathered over the automatic axes. This works with GSPMD; with Shardy, XLA before jaxlib
  0.11.2 aborts the process when compiling a token-carrying manual region nested in a
  partially manual one, so there we raise a clear error at lowering instead.
"""
from __future__ import annotations

import enum
from typing import Any, NamedTuple
from collections.abc import Callable, Sequence

import jax
import numpy as np
from jax import lax
from jax.sharding import AbstractMesh, AxisType, PartitionSpec as P

from . import compat
from .primitives import (FAILURE_MESSAGE_BYTES, ShardParts, call_check_p, failure_message_p,
                         host_call_p, outside_call_p)


_AXIS = "_hostfeed_devices"


class Where(enum.Enum):
    """The sharding context a host callback is lowered in."""

    SINGLE = "single"  # one device
    PER_DEVICE = "per_device"  # fully manual: pmap, shard_map over every mesh axis
    GLOBAL = "global"  # jit over arrays sharded on several devices
    PARTIAL_MANUAL = "partial_manual"  # shard_map with some mesh axes left automatic


def where(ctx: Any) -> tuple[Where, Any]:
    """The context of a lowering rule, with JAX's axis context."""
    ac = ctx.module_context.axis_context
    if isinstance(ac, compat.SPMDAxisContext):
        manual = frozenset(compat.manual_axes(ac))
        if manual == frozenset(ac.mesh.axis_names):
            return Where.PER_DEVICE, ac
        if compat.shardy_partitioner() and not compat.SHARDY_COMPILES_NESTED_MANUAL_TOKENS:
            auto = sorted(set(ac.mesh.axis_names) - manual)
            raise NotImplementedError(
                f"hostfeed: host callbacks inside a partially manual shard_map (manual axes "
                f"{sorted(manual)}, automatic axes {auto}) are not supported with the Shardy "
                f"partitioner. Make every mesh axis manual (shard_map without axis_names, or "
                f"axis_names covering {sorted(ac.mesh.axis_names)}), move the callback out of "
                f"the shard_map, upgrade to jax >= 0.11.2 (older XLA aborts compiling this), or "
                f"set jax.config.update('jax_use_shardy_partitioner', False).")
        return Where.PARTIAL_MANUAL, ac
    if isinstance(ac, compat.ShardingContext) and ac.num_devices > 1:
        return Where.GLOBAL, ac
    return Where.SINGLE, ac


def check_device_index(device_index: int, n: int, what: str) -> None:
    """Refuses a ``device_index`` outside the ``n`` devices that ``what``."""
    if device_index >= n:
        raise ValueError(
            f"hostfeed: device_index={device_index} is outside the {n} device(s) that "
            f"{what}; use 0 <= device_index < {n}")


class Region(NamedTuple):
    """A fully manual region for the global-view schemes: the mesh, the axes made manual
    and the number of devices along them (one group)."""

    mesh: Any
    axes: tuple
    group: int


def manual_region(ac: Any, avals: Sequence[Any]) -> Region:
    """The region for the global-view schemes.

    Uses the mesh the computation is traced under, or else the mesh the operands are
    sharded over (explicit sharding), so operands enter the region naturally; with neither,
    a 1-D mesh over the computation's devices. Either way logical device k along the axes
    is device k of the device assignment.
    """
    mesh: Any = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        meshes = [getattr(getattr(a, "sharding", None), "mesh", None) for a in avals]
        meshes = [m for m in meshes if m is not None and not m.empty]
        mesh = meshes[0] if meshes else mesh
    if not mesh.empty:
        manual = frozenset(compat.manual_axes(ac))
        axes = tuple(a for a in mesh.axis_names if a not in manual)
        if axes:
            return Region(mesh, axes, int(np.prod([mesh.shape[a] for a in axes])))
    if isinstance(ac, compat.ShardingContext):
        # Auto axes (the default became Explicit in jax 0.12): the partitioner reshards the
        # operands into the region by itself.
        mesh = AbstractMesh((ac.num_devices,), (_AXIS,), axis_types=(AxisType.Auto,))
        return Region(mesh, (_AXIS,), ac.num_devices)
    raise NotImplementedError(
        "hostfeed: cannot place a host callback in this partially manual region: no "
        "automatic mesh axes were found")


def resharded(x: Any, spec: P, region_mesh: Any) -> Any:
    """`x` resharded to `spec` when its type carries an explicit sharding (explicit mesh
    axes), or no mesh at all while the region's mesh has explicit axes (a constant or a
    value broadcast from one, such as the step of a record under ``vmap``, which shard_map
    would otherwise take as replicated); with automatic axes the partitioner reshards by
    itself."""
    sharding = getattr(jax.typeof(x), "sharding", None)
    mesh = getattr(sharding, "mesh", None)
    if mesh is None or mesh.empty:
        mesh = region_mesh
    if mesh is None or mesh.empty or not any(
            t == AxisType.Explicit for t in mesh.axis_types):
        return x
    return jax.sharding.reshard(x, spec)


def _bitwise_broadcast(x: Any, is_source: Any, axes: tuple) -> Any:
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


def check_everywhere(status: Any, axes: tuple) -> None:
    """Combines the devices' call statuses and fails every device if one call failed.

    A status is a ticket of the process where the call failed. With one process every
    device can look it up; with many, the failure's message is also sent from a device
    whose status won (only when a call failed: the branch is taken by all devices alike,
    so its collectives are too), and the check raises with that text everywhere.
    """
    combined = lax.pmax(status, axes)
    if jax.process_count() == 1:
        call_check_p.bind(combined)
        return
    jnp = jax.numpy

    def message(status: Any) -> Any:
        idx = lax.axis_index(axes)
        source = lax.pmax(jnp.where(status == combined, idx, -1), axes)
        return _bitwise_broadcast(failure_message_p.bind(status), idx == source, axes)

    text = lax.cond(combined != 0, message,
                    lambda status: jnp.zeros((FAILURE_MESSAGE_BYTES,), np.uint8), status)
    call_check_p.bind(combined, text)


def _in_region(region: Region, body: Callable, spec: P, n_in: int, n_out: int,
               ops: Sequence[Any]) -> Any:
    with jax.sharding.use_abstract_mesh(region.mesh):
        return jax.shard_map(body, mesh=region.mesh, in_specs=(spec,) * n_in,
                             out_specs=(spec,) * n_out, axis_names=frozenset(region.axes),
                             check_vma=False)(*(resharded(o, spec, region.mesh) for o in ops))


def _lower_gathered(ctx: Any, region: Region, args: Sequence[Any], avals_in: Sequence[Any],
                    run: Callable, avals_out: Sequence[Any], device_index: int,
                    with_status: bool = False) -> list:
    """Lowers `run(*operands) -> results` to run once, on one device, with whole operands.

    With `with_status`, `run` returns `(status, *results)`; the status is combined over the
    devices and checked on all of them (see the module documentation).
    """
    axes = region.axes

    def body(*xs: Any) -> tuple[Any, ...]:
        is_source = lax.axis_index(axes) == device_index
        zeros: tuple[Any, ...] = tuple(jax.numpy.zeros(a.shape, a.dtype) for a in avals_out)
        if with_status:
            zeros = (np.int32(0),) + zeros
        outs = lax.cond(is_source, lambda xs: tuple(run(*xs)), lambda xs: zeros, xs)
        if with_status:
            status, *outs = outs
            outs = [_bitwise_broadcast(o, is_source, axes) for o in outs]
            check_everywhere(status, axes)
            return tuple(outs)
        return tuple(_bitwise_broadcast(o, is_source, axes) for o in outs)

    def fn(*ops: Any) -> Any:
        return _in_region(region, body, P(), len(ops), len(avals_out), ops)

    return compat.lower_fun(ctx, fn, avals_in, avals_out, args)


def _splits_evenly(avals: Sequence[Any], group: int) -> bool:
    return group >= 2 and all(len(a.shape) >= 1 and a.shape[0] % group == 0 for a in avals)


def part_meta(axes: tuple, manual: tuple) -> Any:
    """`[group, part]` of this device: its group of manual shards and its place in it."""
    part = lax.axis_index(axes)
    grp = lax.axis_index(manual) if manual else 0
    return jax.numpy.stack([jax.numpy.asarray(grp), part]).astype(np.int32)


class Rounds(NamedTuple):
    """How the slices of a shard-by-shard callback reach the process that runs it.

    ``owner[k]``: whether region device k belongs to the owner process (the one holding
    device ``device_index``); ``perms[j]``: the ``(remote, owner device)`` pairs of round
    j; ``slots[k]``: the parts device k sends (its own first, then one per round, -1 for
    none), the rows of the message's meta; ``round_of[k]``: the round that carries remote
    device k's slice (-1 for the owner's devices)."""

    owner: tuple[bool, ...]
    perms: tuple[tuple[tuple[int, int], ...], ...]
    slots: tuple[tuple[int, ...], ...]
    round_of: tuple[int, ...]

    @property
    def local(self) -> bool:
        """Every device of the region belongs to the owner process (no rounds)."""
        return all(self.owner)


def rounds_for(processes: Sequence[int], device_index: int) -> Rounds:
    """The rounds for a region whose device k belongs to process ``processes[k]``.

    Example:
        >>> r = rounds_for([0, 0, 1, 1, 1], device_index=0)
        >>> r.perms  # round 0: devices 2, 3 -> 0, 1; round 1: device 4 -> 0
        (((2, 0), (3, 1)), ((4, 0),))
        >>> r.slots[:2], r.round_of
        (((0, 2, 4), (1, 3, -1)), (-1, -1, 0, 0, 1))
    """
    owner_process = processes[device_index]
    owner = tuple(p == owner_process for p in processes)
    local = [k for k, o in enumerate(owner) if o]
    remote = [k for k, o in enumerate(owner) if not o]
    width = len(local)
    perms = tuple(tuple(zip(remote[j:j + width], local))
                  for j in range(0, len(remote), width))
    slots = [[k] + [-1] * len(perms) if o else [-1] * (1 + len(perms))
             for k, o in enumerate(owner)]
    round_of = [-1] * len(processes)
    for j, perm in enumerate(perms):
        for src, dst in perm:
            slots[dst][1 + j] = src
            round_of[src] = j
    return Rounds(owner, perms, tuple(tuple(s) for s in slots), tuple(round_of))


def _region_processes(ctx: Any, ac: Any, region: Region) -> list[int] | None:
    """The process of each region device (in axis-index order), or None when unknown."""
    if jax.process_count() == 1:
        return [0] * region.group
    if where(ctx)[0] is not Where.GLOBAL:
        return None  # partially manual: several groups; use the gathering scheme
    devices = getattr(ac, "device_assignment", None)
    if devices is None or len(devices) != region.group:
        return None
    return [d.process_index for d in devices]


def _meta_rows(rounds: Rounds, idx: Any, manual: tuple) -> Any:
    """This device's meta: ``[group, *slots]`` (its row of ``rounds.slots``)."""
    jnp = jax.numpy
    grp = lax.axis_index(manual) if manual else 0
    table = jnp.asarray(np.array(rounds.slots, np.int32))
    return jnp.concatenate([jnp.asarray(grp, np.int32)[None], table[idx]])


def _gather_slots(rounds: Rounds, axes: tuple, shards: Sequence[Any]) -> list:
    """Own shards, then each round's received shards (zeros where none arrived)."""
    out = list(shards)
    for perm in rounds.perms:
        out += list(lax.ppermute(tuple(shards), axes, perm=list(perm)))
    return out


def lower_global_tap(ctx: Any, ac: Any, tapped: Sequence[Any], bind_params: dict) -> None:
    """A global-view tap: shard by shard when every tapped operand splits evenly along
    dimension 0 over the devices, else gathered onto device ``device_index``.

    Shard by shard, each device of the group taps its own slice plus `[group, part]`; the
    host joins the slices and calls the tap function once (:class:`runtime.Joiner`). No
    bytes move between devices when the operands are already split that way (the usual
    case); otherwise the partitioner moves each element at most once, instead of
    replicating the operands everywhere.
    """
    avals = ctx.avals_in[:len(tapped)]
    region = manual_region(ac, avals)
    device_index = bind_params["device_index"]
    check_device_index(device_index, region.group, "collect the tapped operand")
    processes = _region_processes(ctx, ac, region)
    if tapped and processes is not None and _splits_evenly(avals, region.group):
        manual = compat.manual_axes(ac)
        rounds = rounds_for(processes, device_index)
        n_slots = 1 + len(rounds.perms)
        params = dict(bind_params, nr_tapped_args=n_slots * len(tapped) + 1,
                      shard_parts=ShardParts(region.group, device_index))

        def body(*shards: Any) -> tuple[()]:
            if rounds.local:
                outside_call_p.bind(part_meta(region.axes, manual), *shards, **params)
                return ()
            idx = lax.axis_index(region.axes)
            ops = (_meta_rows(rounds, idx, manual), *_gather_slots(rounds, region.axes, shards))

            def send(ops: Sequence[Any]) -> tuple[()]:
                outside_call_p.bind(*ops, **params)
                return ()

            lax.cond(jax.numpy.asarray(rounds.owner)[idx], send, lambda ops: (), ops)
            return ()

        def fn(*ops: Any) -> tuple[()]:
            _in_region(region, body, P(region.axes), len(ops), 0, ops)
            return ()

        compat.lower_fun(ctx, fn, avals, [], tapped)
        return

    def run(*xs: Any) -> tuple[()]:
        outside_call_p.bind(*xs, **bind_params)
        return ()

    _lower_gathered(ctx, region, tapped, avals, run, [], device_index)


def lower_global_call(ctx: Any, ac: Any, args: Sequence[Any], params: dict) -> list:
    """A global-view call: shard by shard when the operands and results split evenly along
    dimension 0 over the devices, else gathered onto device ``device_index`` with the
    results broadcast back.

    Shard by shard, each device sends its slices (plus `[group, part]`) and waits; the host
    joins them, calls once and returns to every device its slice of each result. No operand
    or result bytes move between devices; only the int32 status is combined, as for every
    multi-device call.
    """
    region = manual_region(ac, ctx.avals_in)
    device_index = params["device_index"]
    check_device_index(device_index, region.group, "make the call")
    whole = tuple(params["result_avals"])
    processes = _region_processes(ctx, ac, region)
    if args and processes is not None and _splits_evenly(ctx.avals_in, region.group) \
            and _splits_evenly(whole, region.group):
        group = region.group
        local = tuple(a.update(shape=(a.shape[0] // group, *a.shape[1:])) for a in whole)
        manual = compat.manual_axes(ac)
        rounds = rounds_for(processes, device_index)
        n_slots = 1 + len(rounds.perms)
        inner = dict(params, result_avals=local * n_slots, with_status=True,
                     shard_parts=ShardParts(group, device_index, whole))

        def body(*shards: Any) -> tuple[Any, ...]:
            if rounds.local:
                status, *outs = host_call_p.bind(part_meta(region.axes, manual), *shards,
                                                 **inner)
                check_everywhere(status, region.axes)
                return tuple(outs)
            jnp = jax.numpy
            idx = lax.axis_index(region.axes)
            ops = (_meta_rows(rounds, idx, manual), *_gather_slots(rounds, region.axes, shards))

            def call(ops: Sequence[Any]) -> tuple[Any, ...]:
                return tuple(host_call_p.bind(*ops, **inner))

            def skip(ops: Sequence[Any]) -> tuple[Any, ...]:
                return (np.int32(0), *(jnp.zeros(a.shape, a.dtype) for a in local * n_slots))

            status, *outs = lax.cond(jnp.asarray(rounds.owner)[idx], call, skip, ops)
            n = len(local)
            mine = list(outs[:n])
            my_round = jnp.asarray(np.array(rounds.round_of, np.int32))[idx]
            for j, perm in enumerate(rounds.perms):
                back = lax.ppermute(tuple(outs[(j + 1) * n:(j + 2) * n]), region.axes,
                                    perm=[(dst, src) for src, dst in perm])
                mine = [jnp.where(my_round == j, b, m) for b, m in zip(back, mine)]
            check_everywhere(status, region.axes)
            return tuple(mine)

        def fn(*ops: Any) -> Any:
            return _in_region(region, body, P(region.axes), len(ops), len(whole), ops)

        return compat.lower_fun(ctx, fn, ctx.avals_in, ctx.avals_out, args)

    def run(*xs: Any) -> Any:
        return host_call_p.bind(*xs, **params, with_status=True)

    return _lower_gathered(ctx, region, args, ctx.avals_in, run, ctx.avals_out,
                           device_index, with_status=True)


def lower_per_device_call(ctx: Any, ac: Any, args: Sequence[Any], params: dict) -> list:
    """A call on every device of a fully manual region: each device's status is combined
    so that a failure fails every device together."""
    axes = tuple(ac.mesh.axis_names)

    def per_device(*xs: Any) -> list[Any]:
        status, *outs = host_call_p.bind(*xs, **params, with_status=True)
        check_everywhere(status, axes)
        return outs

    return compat.lower_fun(ctx, per_device, ctx.avals_in, ctx.avals_out, args)
