"""A record written part by part (``HOSTFEED_RECORD_PARTS``): the lowering strategies that
have each device send its own part of a recorded value to a Rust sink, which writes it as
that part's chunks of one array, so that no recorded byte is joined on a host
(:func:`lower_parted_record` for a global value, :func:`lower_per_device_parted_record`
for a shared store's per-device value). The recorder's lowering (``lowering.py``) picks
them; the regions and ``[group, part]`` they use are :mod:`hostfeed._src.placement`'s."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import PartitionSpec as P

from .. import compat
from ..placement import Where, manual_region, part_meta, resharded, where
from ..primitives import ShardParts, outside_call_p

__all__ = ["lower_parted_record", "lower_per_device_parted_record"]


def lower_parted_record(ctx: Any, ac: Any, tapped: Sequence[Any], bind_params: dict) -> bool:
    """A record of a global value, part by part: each device of the region
    sends its own slice of the value along dimension 0 (plus ``[group, part]`` and the
    step, replicated), and a Rust sink writes it as that part's chunks of one array whose
    rows have the value's global shape. Nothing is joined on any host, so each process
    writes what its own devices hold and no recorded byte moves between processes (nor
    between devices, when the value is laid out along dimension 0 already; a replicated
    value is sliced where it is). Returns False (nothing lowered) when the value does not
    split evenly along dimension 0 over the region's devices.
    """
    avals = ctx.avals_in[:len(tapped)]
    if where(ctx)[0] is not Where.GLOBAL:
        return False
    region = manual_region(ac, avals)
    value = avals[0]
    if region.group < 2 or len(value.shape) < 1 or value.shape[0] % region.group:
        return False
    params = dict(bind_params, nr_tapped_args=len(tapped) + 1,
                  shard_parts=ShardParts(region.group, 0, None, parted=True))
    specs = (P(region.axes),) + (P(),) * (len(tapped) - 1)

    def body(*ops: Any) -> tuple[()]:
        outside_call_p.bind(part_meta(region.axes, ()), *ops, **params)
        return ()

    def fn(*ops: Any) -> tuple[()]:
        with jax.sharding.use_abstract_mesh(region.mesh):
            jax.shard_map(body, mesh=region.mesh, in_specs=specs, out_specs=(),
                          axis_names=frozenset(region.axes), check_vma=False)(
                *(resharded(o, s, region.mesh) for o, s in zip(ops, specs)))
        return ()

    compat.lower_fun(ctx, fn, avals, [], tapped)
    return True


def lower_per_device_parted_record(ctx: Any, ac: Any, tapped: Sequence[Any],
                                   bind_params: dict) -> None:
    """A per-device record (fully manual shard_map) of a recorder shared by many
    processes: each device's value is one part (its position in the mesh) of one array
    ``[rows, devices, *shape]``, written by the device's own process."""
    axes = tuple(ac.mesh.axis_names)
    n = int(np.prod([ac.mesh.shape[a] for a in axes]))
    params = dict(bind_params, nr_tapped_args=len(tapped) + 1,
                  shard_parts=ShardParts(n, 0, None, parted=True, per_device=True))
    avals = ctx.avals_in[:len(tapped)]

    def fn(*ops: Any) -> tuple[()]:
        outside_call_p.bind(part_meta(axes, ()), *ops, **params)
        return ()

    compat.lower_fun(ctx, fn, avals, [], tapped)
