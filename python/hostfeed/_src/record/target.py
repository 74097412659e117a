"""What a record's callback is: :class:`Target`, one name of one recorder."""
from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from ... import _receiver
from .. import settings
from .roles import STEP, lane_dims, roles
from ..spec import unpack_transforms

if TYPE_CHECKING:
    from .recorder import Recorder

logger = logging.getLogger("hostfeed")

__all__ = ["Target"]


class Target:
    """The ``func`` of a record's :class:`CallbackSpec`: one name of one recorder, with or
    without a step (``kind``). Called only on the paths that go through Python (see the
    module documentation), as a tap function with ``(arg, transforms, device=...)``."""

    __slots__ = ("kind", "name", "recorder", "_writers")

    def __init__(self, recorder: Recorder, name: str, kind: str):
        self.recorder = recorder
        self.name = name
        self.kind = kind
        # (transforms, operands' shapes and dtypes) -> what appends an instance's rows
        self._writers: dict[tuple, Callable[[Sequence[np.ndarray], int], None]] = {}

    def __repr__(self) -> str:  # names the consumer in messages
        return f"Recorder.record({self.name!r})"

    def __call__(self, arg: Any, transforms: Sequence, *, device: Any = None) -> None:
        # On the consumer thread (or inline): a failure belongs to this recorder, whose
        # flush, close and the next barrier_wait raise it (whichever comes first).
        try:
            self._append(arg, transforms, device)
        except Exception as exc:  # kept for the recorder's flush/close
            if settings.inline() and not _receiver.host.in_callback_thread():
                raise  # inline mode: the caller's own thread, which sees it at once
            if self.recorder.closed and isinstance(exc, ValueError):
                return  # dropped and counted: the next barrier_wait raises it
            logger.error("hostfeed: %r failed (raised by the recorder's next flush, "
                                  "close or barrier_wait): %s", self, exc)
            self.recorder.catalogue.failed(exc)

    def append_rows(self, operands: Sequence[np.ndarray], transforms: tuple,
                    device: Any) -> None:
        """Appends the rows of one record's ``operands`` (host arrays: the value, the step
        if any, tangents...; ``transforms`` as the primitive holds them) from a thread that
        is not the consumer's (a recorded step's pipeline), waiting for room under the
        queue's byte bound; raises. What depends only on the operands' types is worked out
        once (the arrays declared, the roles, the transforms' description)."""
        key = (transforms, tuple((o.shape, o.dtype.str) for o in operands))
        write = self._writers.get(key)
        if write is None:
            write = self._writers[key] = self._writer(transforms, operands)
        write(operands, -1 if device is None else int(getattr(device, "id", -1)))

    def _writer(self, transforms: tuple, operands: Sequence[np.ndarray]
                ) -> Callable[[Sequence[np.ndarray], int], None]:
        unpacked = unpack_transforms(transforms)
        names = [t[0] for t in unpacked]
        rs = roles(self.kind, names, len(operands))
        nb = lane_dims(names)
        lanes = int(np.prod(operands[0].shape[:nb], dtype=np.int64)) if nb else 1
        packed = json.dumps(unpacked, default=list)
        step_at = next((i for i, r in enumerate(rs) if r == STEP), None)
        arrays = []
        for i, (r, o) in enumerate(zip(rs, operands)):
            if r is not None and r != STEP:
                array_id = self.recorder.catalogue.declare(self.name + r, o.dtype, o.shape[nb:])
                self.recorder.catalogue.claim(self.name + r)
                arrays.append((i, array_id, o.shape[nb:]))
        append = self.recorder.catalogue.append

        def write(ops: Sequence[np.ndarray], ordinal: int) -> None:
            if step_at is None:
                steps = [-1] * lanes
            else:
                flat = ops[step_at].reshape(-1)
                steps = [int(flat[min(k, flat.size - 1)]) if flat.size else -1
                         for k in range(lanes)]
            for k in range(lanes):
                for i, array_id, shape in arrays:
                    row = np.ascontiguousarray(ops[i]).reshape(lanes, *shape)[k]
                    # Lent, not copied: the writers read the host copy of the output
                    # itself (read-only, alive while the row waits).
                    append(array_id, row.reshape(-1).view(np.uint8), steps[k], ordinal,
                           packed, True, True)
        return write

    def _append(self, arg: Any, transforms: Sequence, device: Any, wait: bool = False) -> None:
        leaves = [np.asarray(x) for x in jax.tree_util.tree_leaves(arg)]
        names = [t[0] for t in transforms]
        rs = roles(self.kind, names, len(leaves))
        nb = lane_dims(names)
        lanes = int(np.prod(leaves[0].shape[:nb], dtype=np.int64)) if nb else 1
        packed = json.dumps(transforms, default=list)
        steps = [-1] * lanes
        for r, leaf in zip(rs, leaves):
            if r == STEP:
                flat = leaf.reshape(-1)
                steps = [int(flat[min(k, flat.size - 1)]) if flat.size else -1
                         for k in range(lanes)]
        ordinal = -1 if device is None else int(getattr(device, "id", -1))
        catalogue = self.recorder.catalogue
        values = []
        for r, leaf in zip(rs, leaves):
            if r is not None and r != STEP:
                value = np.ascontiguousarray(leaf).reshape(lanes, *leaf.shape[nb:])
                array_id = catalogue.declare(self.name + r, value.dtype, value.shape[1:])
                catalogue.claim(self.name + r)
                values.append((array_id, value))
        for k in range(lanes):
            for array_id, value in values:
                catalogue.append(array_id, value[k].reshape(-1).view(np.uint8), steps[k],
                              ordinal, packed, wait)
