"""Which processor a bench run ran on: recorded with every run (the header's
``processor``), named in every table, and compared before a run is set beside committed
ones (a ratio measured on one processor says little about another: a copy, a wake-up, a
cache differ).

A virtual machine's model name can be vague (``AMD EPYC`` covers several generations), so
the vendor's family and model numbers go with it where the system gives them.
"""
from __future__ import annotations

import os
import platform
from typing import Any

#: The fields of ``/proc/cpuinfo`` recorded, by the name the record gives them.
_CPUINFO = {"model name": "model", "vendor_id": "vendor", "cpu family": "family",
            "model": "model_number", "stepping": "stepping"}


def describe() -> dict[str, Any]:
    """This machine's processor: ``model`` (the model name), and where the system says,
    ``vendor``, ``family``, ``model_number``, ``stepping`` and ``caches_kib`` (each cache
    level's size, per core or shared as the system lists it).

    Example:
        >>> "model" in describe()
        True
    """
    out: dict[str, Any] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    break  # the first processor's block
                key, _, value = (part.strip() for part in line.partition(":"))
                if key in _CPUINFO:
                    value_any: Any = int(value) if value.isdigit() else value
                    out[_CPUINFO[key]] = value_any
    except OSError:
        pass
    out.setdefault("model", platform.processor() or "unknown")
    caches = _caches()
    if caches:
        out["caches_kib"] = caches
    return out


def _caches() -> dict[str, int]:
    """Each cache's size in KiB (``L1d``, ``L1i``, ``L2``, ``L3``), from sysfs."""
    base = "/sys/devices/system/cpu/cpu0/cache"
    out: dict[str, int] = {}
    try:
        entries = sorted(os.listdir(base))
    except OSError:
        return out
    for entry in entries:
        try:
            with open(f"{base}/{entry}/level") as f:
                level = f.read().strip()
            with open(f"{base}/{entry}/type") as f:
                kind = f.read().strip()
            with open(f"{base}/{entry}/size") as f:
                size = f.read().strip()
        except OSError:
            continue
        suffix = {"Data": "d", "Instruction": "i"}.get(kind, "")
        if size.endswith("K") and size[:-1].isdigit():
            out[f"L{level}{suffix}"] = int(size[:-1])
    return out


def of(header: dict[str, Any]) -> dict[str, Any]:
    """A run's processor: its ``processor`` record, or for runs from before it was
    recorded, the model name they kept (``cpu``)."""
    return header.get("processor") or {"model": header.get("cpu", "unknown")}


def name(header: dict[str, Any]) -> str:
    """A run's processor in a phrase.

    Example:
        >>> name({"processor": {"model": "AMD EPYC", "family": 26, "model_number": 2}})
        'AMD EPYC (family 26, model 2)'
        >>> name({"cpu": "Intel(R) Xeon(R) Processor"})
        'Intel(R) Xeon(R) Processor'
    """
    p = of(header)
    if "family" in p and "model_number" in p:
        return f"{p['model']} (family {p['family']}, model {p['model_number']})"
    return str(p["model"])


def same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether the runs of headers ``a`` and ``b`` ran on the same kind of processor: the
    same model name, and the same family and model number where both recorded them.

    Example:
        >>> epyc = {"processor": {"model": "AMD EPYC", "family": 26, "model_number": 2}}
        >>> older = {"processor": {"model": "AMD EPYC", "family": 25, "model_number": 1}}
        >>> same(epyc, epyc), same(epyc, older), same(epyc, {"cpu": "AMD EPYC"})
        (True, False, True)
    """
    pa, pb = of(a), of(b)
    return pa["model"] == pb["model"] and all(
        pa[k] == pb[k] for k in ("vendor", "family", "model_number") if k in pa and k in pb)
