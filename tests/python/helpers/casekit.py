"""What the subprocess case scripts (multidevice_cases.py, multiprocess_cases.py) share:
host functions that log what they receive into ``got``, a registry of cases, and running
them with each failure reported as data. Import it after setting ``XLA_FLAGS`` and
``JAX_PLATFORMS``: it imports JAX.
"""
from __future__ import annotations

import traceback
from typing import Any
from collections.abc import Callable

import jax
import numpy as np

# What the host functions of the running case received, in arrival order.
got: list = []
CASES: dict[str, Callable[[], Any]] = {}


def case(fn):
    """Registers ``fn`` as a case, under its name."""
    CASES[fn.__name__] = fn
    return fn


def tap(tag):
    """A tap function (``tap_with_device=True``) logging [tag, value, device, transforms]."""
    def f(a, transforms, *, device):
        got.append([tag, jax.tree_util.tree_map(lambda v: np.asarray(v).tolist(), a),
                    device.id, [t[0] for t in transforms]])
    return f


def host_add(tag, k):
    """A call function logging [tag, value, device or None] and returning ``a + k``."""
    def f(a, *, device=None):
        got.append([tag, np.asarray(a).tolist(), None if device is None else device.id])
        return a + k
    return f


def shards(arr):
    """[[device id, shard as a list], ...] of the shards this process holds, by device."""
    return sorted([[s.device.id, np.asarray(s.data).tolist()] for s in arr.addressable_shards])


def run_cases(names: list[str]) -> dict[str, Any]:
    """Runs the named cases; a case that raises gives {"error": traceback}."""
    results: dict[str, Any] = {}
    for name in names:
        try:
            results[name] = CASES[name]()
        except Exception:  # noqa: BLE001 - reported to the test
            results[name] = {"error": traceback.format_exc()}
    return results
