"""The recorder's side of lowering (called by ``hostfeed._src.lowering``): whether a tap is
a record, the declarations that make a name's dtype and shape fixed at the call site, and
the consumer leases that route a record's messages to the Rust writer (whole values, or a
device's part of a sharded value)."""
from __future__ import annotations

import logging
import contextlib
import contextvars
from typing import Any, Optional
from collections.abc import Iterator, Sequence

import numpy as np

from . import consumers, settings
from .record_roles import KIND, KIND_WITH_STEP, STEP, lane_dims, roles, transforms_json
from .record.target import Target
from .consumers import ConsumerKind
from .runtime import make_tap_invoker
from .spec import CallbackSpec


logger = logging.getLogger("hostfeed")


def is_record(spec: CallbackSpec) -> bool:
    """Whether a callback spec is a record."""
    return spec.kind in (KIND, KIND_WITH_STEP)


def _declare_operands(spec: CallbackSpec, transforms: tuple, avals: Sequence[Any]
                      ) -> tuple[list[Optional[int]], Optional[int], int]:
    """Declares the arrays a record's operands go to: (array id or None per operand, the
    step operand's index, lanes per message)."""
    target: Target = spec.func
    names = [t[0] for t in transforms]
    rs = roles(spec.kind, names, len(avals))
    nb = lane_dims(names)
    lanes = int(np.prod(avals[0].shape[:nb], dtype=np.int64)) if nb else 1
    ids: list[Optional[int]] = []
    step = None
    for i, (r, aval) in enumerate(zip(rs, avals)):
        if r == STEP:
            step = i if step is None else step
            ids.append(None)
        elif r is None:
            ids.append(None)
        else:
            ids.append(target.recorder._declare(target.name + r, aval.dtype, aval.shape[nb:]))
    return ids, step, lanes


def declare_global(spec: CallbackSpec, transforms: tuple, avals: Sequence[Any]) -> None:
    """Declares the arrays of a global-view record (recorded through Python after its
    shards are joined) at lowering, so that a clash raises at the call site."""
    _declare_operands(spec, transforms, avals)


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


#: Records of global values are written part by part. Benches set it False
#: to measure the path before it (joined in the process of ``device_index``).
_PARTED = True


def partable(spec: CallbackSpec, transforms: tuple) -> bool:
    """Whether a record can be written part by part: a plain record (no
    transformation), not in inline mode."""
    return _PARTED and is_record(spec) and not transforms and not settings.inline()


def is_shared(spec: CallbackSpec) -> bool:
    """Whether a record's recorder is shared by the processes of a jax.distributed run."""
    return bool(spec.func.recorder._coord.shared)


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
    rec._declare_parted(target.name, value.dtype, part_shape, parts.n_parts)
    step = 2 if spec.kind == KIND_WITH_STEP else None
    key = (spec, transforms, tuple((tuple(a.shape), np.dtype(a.dtype).name) for a in avals),
           "parted", parts)

    def make() -> consumers.Consumer:
        return consumers.Consumer(make_tap_invoker(spec, transforms), spec.name, ConsumerKind.TAP)

    lease = consumers.register(key, make)
    rec._native.bind_parted(lease.cid, target.name, step, transforms_json(transforms))
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
    if gathered_here if gathered_here is not None else (alone or target.recorder._coord.shared):
        # Claimed first: a declaration must not touch an array another process writes.
        names = [target.name + r for r in roles(spec.kind, [t[0] for t in transforms],
                                                len(avals)) if r is not None and r != STEP]
        for n in names:
            target.recorder._coord.claim(n)
    ids, step, lanes = _declare_operands(spec, transforms, avals)
    key = (spec, transforms, tuple((tuple(a.shape), np.dtype(a.dtype).name) for a in avals),
           KIND)

    def make() -> consumers.Consumer:
        # Never called for messages (the sink takes them in Rust); kept as the registry's
        # entry, and as a fallback that records through Python.
        return consumers.Consumer(make_tap_invoker(spec, transforms), spec.name, ConsumerKind.TAP)

    lease = consumers.register(key, make)
    if lanes == 0:  # vmap over an empty batch: nothing to record, nothing is sent
        return lease
    target.recorder._native.bind(lease.cid, ids, step, transforms_json(transforms), lanes)
    return lease
