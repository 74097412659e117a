"""The triggers a recording lists (``Recorder(window=..., on_nonfinite=...)``: the store's
root attributes, ``hostfeed.triggers``), checked against the arrays: the steps a trigger
kept that an array does not hold are ``missing`` (a window whose writing a killed process
cut short: what was announced is whole, the rest is reported); and where a non-finite
value first appeared, for ``show``."""
from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Optional

import numpy as np

if TYPE_CHECKING:
    from .opened import Recording

__all__ = ["listed", "first_nonfinite", "lines"]


def listed(rec: Recording) -> list[dict]:
    """Every trigger of ``rec``, each with ``missing``: {array: [steps it kept that the
    array does not hold]} (empty when its window is whole)."""
    raw = dict(rec._root.attrs).get("hostfeed", {}).get("triggers") or []
    held: dict[str, set[int]] = {}
    out = []
    for entry in raw:
        t = dict(entry)
        missing: dict[str, list[int]] = {}
        for name, steps in (t.get("kept") or {}).items():
            if name not in held:
                held[name] = ({int(s) for s in rec[name].steps} if name in rec.names
                              else set())
            gone = [int(s) for s in steps if int(s) not in held[name]]
            if gone:
                missing[name] = gone
        t["missing"] = missing
        out.append(t)
    return out


def first_nonfinite(rec: Recording, triggers: Iterable[dict]) -> Optional[dict[str, Any]]:
    """Where a non-finite value first appeared: the first non-finite trigger's step and
    array; without one, the first row of a ``"stats"`` summary whose NaN or infinity count
    is not zero (its step, array, and what it counted). None if neither shows one."""
    for t in triggers:
        if t.get("kind") == "nonfinite":
            return {"step": t.get("step"), "name": t.get("name"), "value": t.get("value"),
                    "how": "its trigger"}
    best: Optional[dict[str, Any]] = None
    for name in rec.names:
        arr = rec[name]
        reduce = arr.attrs.get("reduce") or {}
        columns = list(reduce.get("columns") or ())
        counting = [columns.index(c) for c in ("nan_count", "inf_count") if c in columns]
        if reduce.get("kind") != "stats" or not counting or not len(arr):
            continue
        rows = np.asarray(arr[:], np.float64).reshape(len(arr), -1, len(columns))
        hit = np.nonzero((rows[:, :, counting] != 0).any(axis=(1, 2)))[0]
        if hit.size:
            step = int(arr.steps[hit[0]])
            if best is None or step < best["step"]:
                best = {"step": step, "name": name, "how": "its stats summary's counts"}
    return best


def lines(rec: Recording) -> list[str]:
    """What ``show`` prints of the triggers: one line each, then where a non-finite value
    first appeared."""
    triggers = listed(rec)
    out = []
    if triggers:
        out.append(f"{len(triggers)} trigger{'s' if len(triggers) != 1 else ''}:")
        for t in triggers:
            kept = sum(len(v) for v in (t.get("kept") or {}).values())
            missing = t["missing"]
            gap = (f"; MISSING {sum(len(v) for v in missing.values())} rows of "
                   f"{', '.join(sorted(missing))}" if missing else "")
            out.append(f"  step {t.get('step')}: {t.get('kind')} "
                       f"({t.get('name') or '-'}, process {t.get('process', 0)}): "
                       f"{t.get('reason')}; steps {t.get('first_step')}..{t.get('last_step')}"
                       f", {kept} rows kept, {t.get('state')}{gap}")
    first = first_nonfinite(rec, triggers)
    if first is not None:
        what = f" ({first['value']})" if first.get("value") else ""
        out.append(f"first non-finite value{what}: step {first['step']}, {first['name']!r} "
                   f"(from {first['how']})")
    return out
