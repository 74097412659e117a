"""What each operand of a record is after transformations (:func:`roles`), how many leading
dimensions are lanes (:func:`lane_dims`), and the names and kinds of records: shared by the
Recorder (``recorder.py``) and its lowering (``lowering.py``)."""
from __future__ import annotations

import json
from typing import Optional
from collections.abc import Sequence

from ..primitives import CallbackKind, unpack_transforms

#: Per-row metadata arrays stored next to each recorded array, by suffix.
ROW_METADATA = ("seq", "step", "device", "time_ns", "transforms")

#: Suffixes of the names under which tangents and cotangents are recorded.
TANGENT_SUFFIX = ".tangent"
COTANGENT_SUFFIX = ".cotangent"

KIND = CallbackKind.RECORD
KIND_WITH_STEP = CallbackKind.RECORD_WITH_STEP

STEP = "step"  # the role of the step operand


def roles(kind: str, transform_names: Sequence[str], n_operands: int) -> list[Optional[str]]:
    """What each operand of a record is, after ``transform_names`` (in order): the suffix
    of the name it is recorded under (``""``, ``".tangent"``, ``".cotangent"``...),
    ``"step"``, or None (not recorded: the tangent of a step).

    Example:
        >>> roles("record+step", ["jvp"], 4)
        ['', 'step', '.tangent', None]
        >>> roles("record", ["jvp", "transpose", "batch"], 1)
        ['.cotangent']
        >>> roles("record+step", ["jvp", "transpose"], 2)
        ['.cotangent', 'step']
    """
    out: list[Optional[str]] = ["", STEP] if kind == KIND_WITH_STEP else [""]
    open_jvps = 0

    def derived(r: Optional[str], suffix: str) -> Optional[str]:
        return None if r is None or r == STEP else r + suffix

    for t in transform_names:
        if t == "jvp":
            out = out + [derived(r, TANGENT_SUFFIX) for r in out]
            open_jvps += 1
        elif t == "transpose":
            if open_jvps:
                # The backward half of a jvp record: the cotangents of its tangents, which
                # are the gradients with respect to the primals.
                # The step's primal value travels with them (`rules._outside_call_transpose`).
                open_jvps -= 1
                out = [r if r == STEP else derived(r, COTANGENT_SUFFIX)
                       for r in out[:len(out) // 2]]
            else:
                # A record of linear values (inside a custom_jvp rule): only the linear
                # operands (never the integer step) are transposed.
                out = [derived(r, COTANGENT_SUFFIX) for r in out if r is not None and r != STEP]
    if len(out) != n_operands:
        raise NotImplementedError(
            f"hostfeed: cannot tell the operands of a record apart after the transformations "
            f"{list(transform_names)} ({n_operands} operands, expected {len(out)})")
    return out


def lane_dims(transform_names: Sequence[str]) -> int:
    """How many leading dimensions of a record's operands are vmap lanes: the batching rule
    puts each ``vmap``'s dimension first, and each lane is one row.

    Example:
        >>> lane_dims(["batch", "jvp", "batch"])
        2
    """
    return sum(1 for t in transform_names if t == "batch")


def transforms_json(transforms: tuple) -> str:
    return json.dumps(unpack_transforms(transforms), default=list)
