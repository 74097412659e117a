"""The recorder's side of lowering (``hostfeed._src.lowering``'s rule for a
:class:`~hostfeed._src.primitives.RecordSpec`): where a record goes, the declarations that make
a name's dtype and shape fixed at the call site, and the consumer leases that route a
record's messages to the Rust writer (whole values, or a device's part of a sharded
value). Everything it needs of the recorder comes with the spec: its ``catalogue`` and
its ``array``."""
from __future__ import annotations

from typing import Any, Optional
from collections.abc import Callable, Sequence

import numpy as np

from .. import consumers, settings
from ..consumers import ConsumerKind, make_tap_invoker
from ..placement import Where, check_device_index, lower_global_tap
from .parted import lower_parted_record, lower_per_device_parted_record
from .layout import declare
from .roles import transforms_json
from ..primitives import RecordSpec

__all__ = ["lower"]

#: Whether records of global values are written part by part (``HOSTFEED_RECORD_PARTS``).
_PARTED = settings.record_parts()


def _check_open(spec: RecordSpec) -> None:
    if spec.catalogue.closed:
        raise ValueError(f"hostfeed: a computation records {spec.array!r} to a closed "
                         f"recorder ({spec.catalogue.path})")


def _key(spec: RecordSpec, transforms: tuple, avals: Sequence[Any], *more: Any) -> tuple:
    """A record consumer's registry key: the spec, its transforms and its operands' types."""
    return (spec, transforms, tuple((tuple(a.shape), np.dtype(a.dtype).name) for a in avals),
            *more)


def _lease(key: tuple, spec: RecordSpec, transforms: tuple) -> consumers.Lease:
    def make() -> consumers.Consumer:
        # Never called for messages (the sink takes them in Rust); kept as the registry's
        # entry, and as a fallback that records through Python.
        return consumers.Consumer(make_tap_invoker(spec, transforms), spec.name,
                                  ConsumerKind.TAP)
    return consumers.register(key, make)


def parted_lease(spec: RecordSpec, transforms: tuple, avals: Sequence[Any],
                 parts: Any) -> consumers.Lease:
    """A lease on the consumer id of one part of a parted record (operands ``[group,
    part]``, the value's slice, the step if any): the array is declared (a clash raises
    here, at the call site, in the process where it differs) and the id bound to the
    parted array's Rust sink."""
    _check_open(spec)
    catalogue = spec.catalogue
    value = avals[1]
    part_shape = (1, *value.shape) if parts.per_device else tuple(value.shape)
    catalogue.declare_parted(spec.array, value.dtype, part_shape, parts.n_parts)
    lease = _lease(_key(spec, transforms, avals, "parted", parts), spec, transforms)
    catalogue.bind_parted(lease.cid, spec.array, 2 if spec.with_step else None,
                          transforms_json(transforms))
    return lease


def consumer_lease(spec: RecordSpec, transforms: tuple, avals: Sequence[Any],
                   alone: bool = False) -> consumers.Lease:
    """A lease on the consumer id of a record lowered on one device or per device: its
    arrays are declared (a clash raises here, at the call site) and the id is bound to a
    Rust sink. ``alone``: on one device, so each process that runs it writes the arrays
    (claimed for this process when the recorder is shared), unless the spec says which
    process writes them (``spec.claim``: a gathered global-view record's)."""
    _check_open(spec)
    catalogue = spec.catalogue
    claim = spec.claim if spec.claim is not None else (alone or catalogue.shared)
    layout = declare(catalogue, spec.array, spec.kind, transforms, avals, claim=claim)
    lease = _lease(_key(spec, transforms, avals, spec.kind), spec, transforms)
    if layout.lanes == 0:  # vmap over an empty batch: nothing to record, nothing is sent
        return lease
    catalogue.bind(lease.cid, layout.ids, layout.step, transforms_json(transforms),
                   layout.lanes)
    return lease


def lower(ctx: Any, context: Where, ac: Any, tapped: Sequence[Any], bind_params: dict, *,
          gathered_here: bool, joined: Callable[..., consumers.Lease]
          ) -> Optional[consumers.Lease]:
    """Where a record lowered in ``ctx`` (``context``, ``ac``: :func:`placement.where`)
    goes. None when it is lowered here already: written part by part (a global value, or
    a shared store's per-device value), or gathered into one device's callback first
    (whose process alone writes it where ``gathered_here``: the spec bound there says
    so). Otherwise the lease on the consumer id its messages name, bound to a Rust sink
    (one device, each device, or one part), or ``joined(spec, transforms, shard_parts)``:
    the Python consumer that joins the parts of a record of a sharded value, which
    records it as a tap would."""
    spec: RecordSpec = bind_params["callback"]
    transforms = bind_params["transforms"]
    shard_parts = bind_params.get("shard_parts")
    avals = ctx.avals_in[:len(tapped)]
    if shard_parts is None and _PARTED and not transforms and not settings.inline():
        # A plain record (no transformation), not in inline mode: part by part.
        if context is Where.GLOBAL and lower_parted_record(ctx, ac, tapped, bind_params):
            return None
        if context is Where.PER_DEVICE and spec.catalogue.shared:
            lower_per_device_parted_record(ctx, ac, tapped, bind_params)
            return None
    if context in (Where.GLOBAL, Where.PARTIAL_MANUAL) and shard_parts is None:
        lower_global_tap(ctx, ac, tapped,
                         dict(bind_params, callback=spec.claimed(gathered_here)))
        # Recorded through Python once joined. Declared once the lowering above succeeded,
        # so that a computation that fails to lower leaves no empty array behind.
        declare(spec.catalogue, spec.array, spec.kind, transforms, avals)
        return None
    if context is Where.SINGLE:
        check_device_index(bind_params["device_index"], 1, "run this computation")
    if shard_parts is None:  # a Rust sink takes the messages
        return consumer_lease(spec, transforms, avals, context is not Where.PER_DEVICE)
    if shard_parts.parted:  # one part, to Rust
        return parted_lease(spec, transforms, avals, shard_parts)
    return joined(spec, transforms, shard_parts)
