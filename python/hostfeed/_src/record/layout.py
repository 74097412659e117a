"""One record's layout, worked out in one place: what each of its operands is (its
:func:`~.roles.roles`), how many rows one message holds (its vmap lanes), and the arrays
its recorded operands are declared as. The lowering (``lowering.py``: the ids a Rust sink
is bound to), a record written through Python (``target.py``) and a recorded step
(``step.py``: the declarations at the call) all ask :func:`declare` for it."""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Optional

import numpy as np

from .roles import STEP, lane_dims, roles

if TYPE_CHECKING:
    from .catalogue import Catalogue

__all__ = ["Layout", "declare"]


class Layout(NamedTuple):
    """A record's operands as they are written: ``roles`` (one per operand: the suffix of
    the array it goes to, ``"step"``, or None), ``lane_dims`` leading dimensions that are
    vmap lanes, ``lanes`` rows per message, the index of the ``step`` operand (None
    without), and ``arrays``: ``(operand index, array id)`` of each recorded operand, in
    operand order.

    Example:
        >>> Layout(("", "step"), 0, 1, 1, ((0, 7),)).ids
        [7, None]
    """

    roles: tuple[Optional[str], ...]
    lane_dims: int
    lanes: int
    step: Optional[int]
    arrays: tuple[tuple[int, int], ...]

    @property
    def ids(self) -> list[Optional[int]]:
        """The array id of each operand (None for the step, and what is not recorded)."""
        ids: list[Optional[int]] = [None] * len(self.roles)
        for i, array_id in self.arrays:
            ids[i] = array_id
        return ids

    def steps(self, operands: Sequence[np.ndarray]) -> list[int]:
        """The step of each lane (-1 without a step; one step for all lanes when it is not
        batched)."""
        if self.step is None:
            return [-1] * self.lanes
        flat = operands[self.step].reshape(-1)
        return [int(flat[min(k, flat.size - 1)]) if flat.size else -1
                for k in range(self.lanes)]

    def rows(self, operands: Sequence[np.ndarray]) -> list[tuple[int, np.ndarray, int]]:
        """``(array id, row bytes, step)`` of every row of one message's host ``operands``,
        lane by lane, in operand order within a lane. A row is a view of its operand (not
        a copy) where the operand is contiguous."""
        lanes = self.lanes
        if not lanes:
            return []
        steps = self.steps(operands)
        values = [(array_id, np.ascontiguousarray(operands[i]).reshape(lanes, -1))
                  for i, array_id in self.arrays]
        return [(array_id, value[k].view(np.uint8), steps[k])
                for k in range(lanes) for array_id, value in values]

def declare(catalogue: Catalogue, name: str, kind: str, transforms: Sequence[Sequence[Any]],
            operands: Sequence[Any], *, claim: bool = False) -> Layout:
    """The layout of record ``name`` (of ``kind``) after ``transforms`` (packed or
    unpacked: each starts with its name) whose ``operands`` (arrays or avals: anything
    with a ``shape`` and a ``dtype``) are given, its arrays declared in ``catalogue`` (a
    clash raises). ``claim``: the arrays are first claimed for this process (a shared
    store's arrays each have one writer; a declaration must not touch an array another
    process writes)."""
    names = [t[0] for t in transforms]
    rs = roles(kind, names, len(operands))
    nb = lane_dims(names)
    lanes = int(np.prod(operands[0].shape[:nb], dtype=np.int64)) if nb else 1
    step = next((i for i, r in enumerate(rs) if r == STEP), None)
    recorded = [(i, name + r) for i, r in enumerate(rs) if r is not None and r != STEP]
    if claim:
        for _, array in recorded:
            catalogue.claim(array)
    arrays = tuple((i, catalogue.declare(array, operands[i].dtype, operands[i].shape[nb:]))
                   for i, array in recorded)
    return Layout(tuple(rs), nb, lanes, step, arrays)
