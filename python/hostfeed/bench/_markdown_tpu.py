"""Markdown tables of the TPU bench's runs (``docs/tpu/bench-*.json``,
``docs/tpu/record-*.json``), for docs/platforms.md and docs/recording-reference.md
(``docs/figures.py`` writes them; see :mod:`hostfeed.bench._markdown`)."""
from __future__ import annotations

import datetime
import math
from collections.abc import Callable, Sequence
from typing import Any

Run = dict[str, Any]


def _us(v: float) -> str:
    return f"{v:.3g} µs" if v < 10 else f"{v:.0f} µs" if v >= 100 else f"{v:.1f} µs"


def _ratio(v: float) -> str:
    return f"{v:.2f}x" if math.isfinite(v) else "-"


def _ms(v: float) -> str:
    return f"{v:.2f} ms" if v < 10 else f"{v:.1f} ms"


def tpu_machine(run: Run) -> str:
    """A TPU run's device and versions, in a phrase.

    Example:
        >>> tpu_machine({"header": {"devices": ["TPU_0"], "jax": "0.10.2",
        ...              "python": "3.11.7", "started": "2026-12-05T13:00:48+00:00"}})
        'TPU_0, jax 0.10.2, Python 3.11.7, 2026-12-05'
    """
    h = run["header"]
    day = datetime.datetime.fromisoformat(h["started"]).date().isoformat()
    return f"{', '.join(h['devices'])}, jax {h['jax']}, Python {h['python']}, {day}"


def tpu(runs: Sequence[Run]) -> str:
    """The TPU's targets (the cited TPU run, ``runs[0]``): hostfeed against JAX's callbacks
    on the same chip, each ratio against the bound it must stay under."""
    r = runs[0]
    taps = r["taps"]["methods"]
    tap = taps["hostfeed"]["device_side_per_tap_us"]
    slow = r["slow_taps"]["device_ms"]
    calls = r["call"]["methods"]
    rec = r["record"]["ms"]
    d = r["dispatch"]["methods"]
    rows = [
        ("a tap (float32[4]) in a loop, what the device spends per tap", _us(tap),
         f"{_us(taps['io_callback']['device_side_per_tap_us'])} (`io_callback`)",
         tap / taps["io_callback"]["device_side_per_tap_us"], "1.00x"),
        ("the same", _us(tap),
         f"{_us(taps['io_callback(ordered)']['device_side_per_tap_us'])} "
         "(`io_callback(ordered)`)",
         tap / taps["io_callback(ordered)"]["device_side_per_tap_us"], "0.50x"),
        ("50 taps of a 10 ms function, device side", _ms(slow["hostfeed"]),
         f"{_ms(slow['io_callback(ordered)'])} (`io_callback(ordered)`)",
         slow["hostfeed"] / slow["io_callback(ordered)"], "0.10x"),
        ("`call` round trip (float32[4]) in a loop", _us(calls["hcb.call"]["per_call_us"]),
         f"{_us(calls['pure_callback']['per_call_us'])} (`pure_callback`)",
         calls["hcb.call"]["per_call_us"] / calls["pure_callback"]["per_call_us"], "1.00x"),
        ("recording a 4 MiB activation, per training step", _ms(rec["hostfeed Recorder"]),
         f"{_ms(rec['returned + device_get'])} (returned and `device_get`; the step alone "
         f"{_ms(rec['step'])})", rec["hostfeed Recorder"] / rec["returned + device_get"],
         "1.00x"),
        ("the same, the aim", _ms(rec["hostfeed Recorder"]),
         f"{_ms(1.2 * (rec['step'] + rec['one device_get of 4 MiB']))} (1.2x the step and "
         "one 4 MiB `device_get`)",
         rec["hostfeed Recorder"] / (1.2 * (rec["step"] + rec["one device_get of 4 MiB"])),
         "1.00x"),
        ("dispatch of a small jitted function with one `id_tap`, waited for",
         _us(d["hostfeed id_tap"]["us"]),
         f"{_us(d['io_callback']['us'])} (`io_callback`; no callback: "
         f"{_us(d['no callback']['us'])})", d["hostfeed id_tap"]["us"] / d["io_callback"]["us"],
         ""),
    ]
    lines = ["| | hostfeed | compared with | ratio | at most |", "|---|---|---|---|---|"]
    lines += [f"| {what} | {mine} | {base} | {_ratio(ratio)} | {bound} |"
              for what, mine, base, ratio, bound in rows]
    order = "kept" if r["taps"].get("order_kept") else "**not kept**"
    lines.append(f"| taps from three places in a loop, three computations dispatched back "
                 f"to back | order {order} | | | |")
    return "\n".join(lines)


def tpu_paths(runs: Sequence[Run]) -> str:
    """The TPU's ways to the host measured raw (the cited TPU run's ``paths`` section)."""
    p = runs[0]["paths"]
    lines = ["| path | per loop step | GB/s |", "|---|---|---|"]

    def row(what: str, v: dict, unit: str) -> str:
        if "unavailable" in v:
            return f"| {what} | n/a | |"
        value = _us(v["us"]) if unit == "us" else _ms(v["ms"])
        rate = f"{v['gb_per_s']:.2f} GB/s" if "gb_per_s" in v else ""
        return f"| {what} | {value} | {rate} |"

    lines += [row(f"float32[4]: {k}", v, "us") for k, v in p["small_us_per_step"].items()]
    lines += [row(f"device work, a send, both: {k}", v, "us")
              for k, v in p["overlap_us_per_step"].items()]
    for size, rows in p["large"].items():
        lines += [row(f"{size} operand as {k}", v, "us") for k, v in rows.items()]
    lines += [row(f"4 MiB outside a computation: {k}", v, "ms")
              for k, v in p["outside_a_computation"].items()]
    return "\n".join(lines)


def tpu_record(runs: Sequence[Run]) -> str:
    """Logging a 4 MiB activation each training step on a TPU, every way (the record
    section of the cited TPU record run, ``docs/tpu/record-*.json``)."""
    ms = runs[0]["record"]["ms"]
    step, copy = ms["step"], ms["returned + copy_to_host_async, overlapped"]
    rows = [
        ("the step alone", ms["step"], "", None, ""),
        ("the activation returned, `copy_to_host_async`, overlapped with the next step",
         copy, "", None, ""),
        ("the activation returned, `device_get` every step", ms["returned + device_get"],
         "", None, ""),
        ("`io_callback` of it", ms["io_callback"], "", None, ""),
        ("`rec.record` inside the computation", ms["hostfeed Recorder"],
         "returned + `device_get`", ms["hostfeed Recorder"] / ms["returned + device_get"],
         "1.00x"),
        ("`rec.step`: the row leaves as an output, written to disk",
         ms["rec.step, written to disk"], "returned + `copy_to_host_async`",
         ms["rec.step, written to disk"] / copy, "1.00x"),
        ("the same", ms["rec.step, written to disk"], "max(step, one 4 MiB `device_get`)",
         ms["rec.step, written to disk"] / max(step, ms["one device_get of 4 MiB"]), "1.10x"),
        ("`rec.step`, `every=10` (the step a host int)", ms["rec.step, every=10"],
         "the step alone", ms["rec.step, every=10"] / step, "1.10x"),
        ("`rec.step`, `reduce=\"stats\"` every step", ms["rec.step, reduce='stats'"],
         "the step alone", ms["rec.step, reduce='stats'"] / step, "1.20x"),
    ]
    lines = ["| way | ms per step | compared with | ratio | at most |",
             "|---|---|---|---|---|"]
    lines += [f"| {what} | {_ms(v)} | {base} | {_ratio(r) if r is not None else ''} | {b} |"
              for what, v, base, r, b in rows]
    return "\n".join(lines)


#: The tables of TPU runs (``docs/tpu/bench-*.json``, the newest cited).
TPU_TABLES: dict[str, Callable[[Sequence[Run]], str]] = {"tpu": tpu, "tpu_paths": tpu_paths,
                                                         "tpu_record": tpu_record}
#: TPU tables read from the record runs (``docs/tpu/record-*.json``), not the full ones.
TPU_RECORD_TABLES = frozenset({"tpu_record"})
