"""The recorder's side of lowering (called by ``hostfeed._src.lowering``): whether a tap is
a record, the declarations that make a name's dtype and shape fixed at the call site, and
the consumer leases that route a record's messages to the Rust writer (whole values, or a
device's part of a sharded value)."""
from __future__ import annotations

import logging
import contextlib
import contextvars
from typing import Any, Optional
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from .. import consumers, settings
from ..consumers import ConsumerKind
from ..placement import Where, check_device_index, lower_global_tap
from .parted import lower_parted_record, lower_per_device_parted_record
from .layout import declare
from .roles import KIND, KIND_WITH_STEP, transforms_json
from .target import Target
from ..runtime import make_tap_invoker
from ..spec import CallbackSpec


logger = logging.getLogger("hostfeed")


def is_record(spec: CallbackSpec) -> bool:
    """Whether a callback spec is a record."""
    return spec.kind in (KIND, KIND_WITH_STEP)


def declare_global(spec: CallbackSpec, transforms: tuple, avals: Sequence[Any]) -> None:
    """Declares the arrays of a global-view record (recorded through Python after its
    shards are joined) at lowering, so that a clash raises at the call site."""
    declare(spec.func.recorder.catalogue, spec.func.name, spec.kind, transforms, avals)


#: While a global-view record is lowered by the gathering scheme: whether the device that
#: records it is this process's (then this process writes its arrays).
_gathered: contextvars.ContextVar[Optional[bool]] = contextvars.ContextVar(
    "hostfeed_gathered", default=None)


@contextlib.contextmanager
def gathered(here: bool) -> Iterator[None]:
    """Marks the lowering of a gathered global-view record (see :data:`_gathered`)."""
    token = _gathered.set(here)
    try:
        yield
    finally:
        _gathered.reset(token)


#: Whether records of global values are written part by part (``HOSTFEED_RECORD_PARTS``).
_PARTED = settings.record_parts()


def partable(spec: CallbackSpec, transforms: tuple) -> bool:
    """Whether a record can be written part by part: a plain record (no
    transformation), not in inline mode."""
    return _PARTED and is_record(spec) and not transforms and not settings.inline()


def is_shared(spec: CallbackSpec) -> bool:
    """Whether a record's recorder is shared by the processes of a jax.distributed run."""
    return spec.func.recorder.catalogue.shared


def parted_lease(spec: CallbackSpec, transforms: tuple, avals: Sequence[Any],
                 parts: Any) -> consumers.Lease:
    """A lease on the consumer id of one part of a parted record (operands ``[group,
    part]``, the value's slice, the step if any): the array is declared (a clash raises
    here, at the call site, in the process where it differs) and the id bound to the
    parted array's Rust sink."""
    target: Target = spec.func
    rec = target.recorder
    if rec.closed:
        raise ValueError(f"hostfeed: a computation records {target.name!r} to a closed "
                         f"recorder ({rec.path})")
    value = avals[1]
    part_shape = (1, *value.shape) if parts.per_device else tuple(value.shape)
    rec.catalogue.declare_parted(target.name, value.dtype, part_shape, parts.n_parts)
    step = 2 if spec.kind == KIND_WITH_STEP else None
    key = (spec, transforms, tuple((tuple(a.shape), np.dtype(a.dtype).name) for a in avals),
           "parted", parts)

    def make() -> consumers.Consumer:
        return consumers.Consumer(make_tap_invoker(spec, transforms), spec.name, ConsumerKind.TAP)

    lease = consumers.register(key, make)
    rec.catalogue.bind_parted(lease.cid, target.name, step, transforms_json(transforms))
    return lease


def consumer_lease(spec: CallbackSpec, transforms: tuple,
                   avals: Sequence[Any], alone: bool = False) -> consumers.Lease:
    """A lease on the consumer id of a record lowered on one device or per device: its
    arrays are declared (a clash raises here, at the call site) and the id is bound to a
    Rust sink. ``alone``: on one device, so each process that runs it writes the arrays
    (claimed for this process when the recorder is shared)."""
    target: Target = spec.func
    if target.recorder.closed:
        raise ValueError(f"hostfeed: a computation records {target.name!r} to a closed "
                         f"recorder ({target.recorder.path})")
    gathered_here = _gathered.get()
    layout = declare(target.recorder.catalogue, target.name, spec.kind, transforms, avals,
                     claim=gathered_here if gathered_here is not None
                     else (alone or target.recorder.catalogue.shared))
    key = (spec, transforms, tuple((tuple(a.shape), np.dtype(a.dtype).name) for a in avals),
           KIND)

    def make() -> consumers.Consumer:
        # Never called for messages (the sink takes them in Rust); kept as the registry's
        # entry, and as a fallback that records through Python.
        return consumers.Consumer(make_tap_invoker(spec, transforms), spec.name, ConsumerKind.TAP)

    lease = consumers.register(key, make)
    if layout.lanes == 0:  # vmap over an empty batch: nothing to record, nothing is sent
        return lease
    target.recorder.catalogue.bind(lease.cid, layout.ids, layout.step,
                                   transforms_json(transforms), layout.lanes)
    return lease


def lower(ctx: Any, context: Where, ac: Any, tapped: Sequence[Any], bind_params: dict, *,
          gathered_here: bool, joined: Callable[..., consumers.Lease]
          ) -> Optional[consumers.Lease]:
    """Where a record lowered in ``ctx`` (``context``, ``ac``: :func:`placement.where`)
    goes. None when it is lowered here already: written part by part (a global value, or
    a shared store's per-device value), or gathered into one device's callback first
    (whose process alone writes it where ``gathered_here``). Otherwise the lease on the
    consumer id its messages name, bound to a Rust sink (one device, each device, or one
    part), or ``joined(spec, transforms, shard_parts)``: the Python consumer that joins the
    parts of a record of a sharded value, which records it as a tap would."""
    spec: CallbackSpec = bind_params["callback"]
    transforms = bind_params["transforms"]
    shard_parts = bind_params.get("shard_parts")
    avals = ctx.avals_in[:len(tapped)]
    if shard_parts is None and partable(spec, transforms):
        if context is Where.GLOBAL and lower_parted_record(ctx, ac, tapped, bind_params):
            return None
        if context is Where.PER_DEVICE and is_shared(spec):
            lower_per_device_parted_record(ctx, ac, tapped, bind_params)
            return None
    if context in (Where.GLOBAL, Where.PARTIAL_MANUAL) and shard_parts is None:
        with gathered(gathered_here):
            lower_global_tap(ctx, ac, tapped, bind_params)
        # Recorded through Python once joined. Declared once the lowering above succeeded,
        # so that a computation that fails to lower leaves no empty array behind.
        declare_global(spec, transforms, avals)
        return None
    if context is Where.SINGLE:
        check_device_index(bind_params["device_index"], 1, "run this computation")
    if shard_parts is None:  # a Rust sink takes the messages
        return consumer_lease(spec, transforms, avals, context is not Where.PER_DEVICE)
    if shard_parts.parted:  # one part, to Rust
        return parted_lease(spec, transforms, avals, shard_parts)
    return joined(spec, transforms, shard_parts)
