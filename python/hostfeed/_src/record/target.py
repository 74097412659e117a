"""What a record's host function is: :class:`Target`, one name of one recorder's
catalogue, called on the paths that record through Python."""
from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from ... import _receiver
from .. import settings
from .layout import declare
from .roles import transforms_json

if TYPE_CHECKING:
    from .catalogue import Catalogue

logger = logging.getLogger("hostfeed")

__all__ = ["Target"]


class Target:
    """The ``func`` of a record's :class:`~hostfeed._src.primitives.RecordSpec`: one name of one
    recorder's ``catalogue``, with or without a step (``kind``). Called only on the paths
    that go through Python (a global-view record joined on the host, the inline mode, a
    recorded step's rows), as a tap function with ``(arg, transforms, device=...)``."""

    __slots__ = ("kind", "name", "catalogue", "_writers")

    def __init__(self, catalogue: Catalogue, name: str, kind: str):
        self.catalogue = catalogue
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
            if self.catalogue.closed and isinstance(exc, ValueError):
                return  # dropped and counted: the next barrier_wait raises it
            logger.error("hostfeed: %r failed (raised by the recorder's next flush, "
                                  "close or barrier_wait): %s", self, exc)
            self.catalogue.failed(exc)

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
        layout = declare(self.catalogue, self.name, self.kind, transforms, operands,
                         claim=True)
        packed = transforms_json(transforms)
        append = self.catalogue.append

        def write(ops: Sequence[np.ndarray], ordinal: int) -> None:
            for array_id, row, step in layout.rows(ops):
                # Lent, not copied: the writers read the host copy of the output itself
                # (read-only, alive while the row waits).
                append(array_id, row, step, ordinal, packed, True, True)
        return write

    def _append(self, arg: Any, transforms: Sequence, device: Any, wait: bool = False) -> None:
        leaves = [np.asarray(x) for x in jax.tree_util.tree_leaves(arg)]
        catalogue = self.catalogue
        layout = declare(catalogue, self.name, self.kind, transforms, leaves, claim=True)
        packed = json.dumps(transforms, default=list)
        ordinal = -1 if device is None else int(getattr(device, "id", -1))
        for array_id, row, step in layout.rows(leaves):
            catalogue.append(array_id, row, step, ordinal, packed, wait)
