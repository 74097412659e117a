"""The ``paths`` section of ``python -m hostfeed bench`` on a TPU: the device's ways to the
host measured raw, below hostfeed, to choose the one hostfeed's transport takes.

* host transfers as JAX lowers them (``stablehlo.send``/``recv`` with
  ``is_host_transfer``, handed to a Python function by PJRT): one send of a
  ``float32[4]``; a send and a receive (the shape of an ordered ``io_callback``); two
  operands as two sends, and packed into one;
* a 4 MiB and a 16 MiB operand as 1, 2, 4 or 8 sends of a part each, the parts' sends
  either chained on one token or all after the same token (so that they may overlap);
* 4 MiB to the host outside a computation: ``device_get``, ``copy_to_host_async``, and a
  jitted function whose output is placed in ``pinned_host`` memory.

Each row is the time per loop step less the loop without transfers (µs), with GB/s for
the large ones. A row the backend cannot run records why (on CPU: every send).
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .._src import measuring


def _send(*values: Any, receive: bool = False, overlap: bool = False) -> None:
    measuring.raw_host_send(*values, receive=receive, overlap=overlap)


def _parts(v: Any, parts: int) -> list[Any]:
    step = v.shape[0] // parts
    return [v[i * step:(i + 1) * step] for i in range(parts)]


def _loop(n: int, step: Callable[[Any], None]) -> Callable:
    @jax.jit
    def f(x: Any) -> Any:
        def body(i: Any, c: Any) -> Any:
            step(x)
            return c + 1
        return lax.fori_loop(0, n, body, jnp.int32(0))
    return f


def _best(f: Callable, x: Any, rounds: int = 2) -> float:
    jax.block_until_ready(f(x))
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        jax.block_until_ready(f(x))
        best = min(best, time.perf_counter() - t0)
    return best


def _per_step_us(n: int, step: Callable[[Any], None], x: Any, base_s: float) -> float:
    return (_best(_loop(n, step), x) - base_s) / n * 1e6


def _rows(n: int, x: Any, cases: dict[str, Callable[[Any], None]]) -> dict[str, Any]:
    base = _best(_loop(n, lambda v: None), x)
    out: dict[str, Any] = {}
    for name, step in cases.items():
        try:
            out[name] = {"us": _per_step_us(n, step, x, base)}
        except Exception as exc:  # noqa: BLE001 - a path this backend lacks
            out[name] = {"unavailable": f"{type(exc).__name__}: {str(exc)[:300]}"}
    return out


def _packed(a: Any, b: Any) -> Any:
    return jnp.concatenate([lax.bitcast_convert_type(a, jnp.uint8).reshape(-1),
                            lax.bitcast_convert_type(b, jnp.uint8).reshape(-1)])


def _split_send(parts: int, overlap: bool) -> Callable[[Any], None]:
    """A step that sends its operand as ``parts`` sends."""
    def step(v: Any) -> None:
        _send(*_parts(v, parts), overlap=overlap)
    return step


def _large(sizes: Sequence[int]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for size in sizes:
        x = jnp.zeros((size // 4,), jnp.float32)
        cases: dict[str, Callable[[Any], None]] = {}
        for parts in (1, 2, 4, 8):
            cases[f"{parts} sends, chained"] = _split_send(parts, overlap=False)
            if parts > 1:
                cases[f"{parts} sends, overlapping"] = _split_send(parts, overlap=True)
        rows = _rows(10, x, cases)
        for row in rows.values():
            if "us" in row:
                row["gb_per_s"] = size / row["us"] / 1e3
        out[f"{size >> 20} MiB"] = rows
    return out


def _outside(size: int = 4 << 20) -> dict[str, Any]:
    """4 MiB to the host outside a computation, ms each (best of 5)."""
    x = jnp.ones((size // 4,), jnp.float32)
    device = x.devices().pop() if hasattr(x, "devices") else jax.devices()[0]
    out: dict[str, Any] = {}

    def fresh() -> Any:
        y = x + 1
        y.block_until_ready()
        return y

    def timed(go: Callable[[Any], Any]) -> float:
        best = float("inf")
        for _ in range(5):
            y = fresh()
            t0 = time.perf_counter()
            go(y)
            best = min(best, time.perf_counter() - t0)
        return best * 1e3

    out["device_get"] = {"ms": timed(jax.device_get)}
    out["copy_to_host_async, then read"] = {
        "ms": timed(lambda y: (y.copy_to_host_async(), np.asarray(y)))}
    try:
        pinned = jax.sharding.SingleDeviceSharding(device, memory_kind="pinned_host")
        to_host = jax.jit(lambda v: v + 1, out_shardings=pinned)
        plain = jax.jit(lambda v: v + 1)
        out["jit with its output in pinned_host, then read"] = {
            "ms": timed(lambda y: np.asarray(to_host(y)))}
        out["the same jit with its output on the device"] = {
            "ms": timed(lambda y: plain(y).block_until_ready())}
    except Exception as exc:  # noqa: BLE001 - a memory kind this backend lacks
        out["jit with its output in pinned_host, then read"] = {
            "unavailable": f"{type(exc).__name__}: {str(exc)[:300]}"}
    for row in out.values():
        if "ms" in row:
            row["gb_per_s"] = size / row["ms"] / 1e6
    return out


def _overlap(n: int = 50) -> dict[str, Any]:
    """Whether the device waits for a send: a step of device work alone, one send alone,
    and both in each step (us per step; both ~ the larger of the two: they overlap)."""
    w = jnp.eye(1024, dtype=jnp.float32) * 0.5

    def loop(work: bool, send: bool) -> Callable:
        @jax.jit
        def f(c: Any) -> Any:
            def body(i: Any, c: Any) -> Any:
                if work:
                    for _ in range(4):
                        c = jnp.tanh(c @ w)
                if send:
                    _send(c[0, :4])
                return c
            return lax.fori_loop(0, n, body, c)
        return f

    x = jnp.ones((1024, 1024), jnp.float32)
    base = _best(loop(False, False), x)
    out: dict[str, dict[str, Any]] = {}
    for name, work, send in (("device work", True, False), ("1 send", False, True),
                             ("device work and 1 send", True, True)):
        try:
            out[name] = {"us": (_best(loop(work, send), x) - base) / n * 1e6}
        except Exception as exc:  # noqa: BLE001 - a path this backend lacks
            out[name] = {"unavailable": f"{type(exc).__name__}: {str(exc)[:300]}"}
    return out


def paths(cfg: Any) -> dict:
    """The raw paths (see the module's docstring)."""
    cfg.progress("tpu: paths")
    n = cfg.n(100, 300)
    x = jnp.arange(4, dtype=jnp.float32)
    small = _rows(n, x, {
        "1 send": lambda v: _send(v),
        "1 send + 1 receive": lambda v: _send(v, receive=True),
        "2 operands, 2 sends": lambda v: _send(v, v[0]),
        "2 operands packed, 1 send": lambda v: _send(_packed(v, v[0])),
    })
    return {"small_us_per_step": small, "overlap_us_per_step": _overlap(),
            "large": _large([4 << 20] if cfg.quick else [4 << 20, 16 << 20]),
            "outside_a_computation": _outside()}


def text(r: dict) -> list[str]:
    """The section as terminal lines."""
    def cell(row: dict, key: str, fmt: str) -> str:
        return format(row[key], fmt) if key in row else "n/a (" + row["unavailable"][:60] + ")"

    out = ["paths: the TPU's ways to the host, raw (us per loop step, less the loop)"]
    out += [f"  {k:<30}{cell(v, 'us', '>10.1f')}" for k, v in r["small_us_per_step"].items()]
    out.append("  does the device wait for a send? (us per step)")
    out += [f"    {k:<28}{cell(v, 'us', '>10.1f')}" for k, v in r["overlap_us_per_step"].items()]
    for size, rows in r["large"].items():
        out.append(f"  {size} operand:")
        out += [f"    {k:<26}{cell(v, 'us', '>10.0f')} us"
                + (f"{v['gb_per_s']:>8.2f} GB/s" if "gb_per_s" in v else "")
                for k, v in rows.items()]
    out.append("  4 MiB outside a computation:")
    out += [f"    {k:<48}{cell(v, 'ms', '>8.2f')} ms"
            + (f"{v['gb_per_s']:>8.2f} GB/s" if "gb_per_s" in v else "")
            for k, v in r["outside_a_computation"].items()]
    return out
