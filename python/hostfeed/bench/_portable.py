"""The ``portable`` section of ``python -m hostfeed bench``: the portable transport (JAX's
host-callback lowering, what TPUs and ROCm GPUs use; see :mod:`hostfeed._src.transports.portable`)
forced on the current backend, beside the native transport and ``io_callback``: per-tap
device-side cost, call round trip, and whether a slow tap function holds up the device.

Rows (``portable`` in the JSON):

* ``taps``: ``{name: {"device_side_per_tap_us", "end_to_end_per_tap_us"}}`` (over
  alternating rounds, the two orders' medians weighed alike:
  :func:`~hostfeed.bench._timing.balanced`; ``"rounds_device_us"``, each round's) for
  ``hostfeed (native)``, ``hostfeed (portable)`` and ``io_callback(ordered)``, ``n`` taps
  of ``float32[4]`` in a loop;
* ``calls``: ``{name: {"per_call_us"}}``, a ``float32[4] -> float32[4]`` call in a loop;
* ``slow_taps``: the portable transport's device side (until the computation's results
  are ready) of 1000 taps whose function takes 0.2 ms, against 1000 no-op taps, in paired
  rounds: ``{"taps", "host_ms_per_tap", "slow_device_s", "noop_device_s"`` (medians),
  ``"ratio"`` (the median of ``"rounds_ratio"``, each round's ratio)``}`` (until
  2026-12-07, 10 ms functions and the best of 5 rounds each, with no ``rounds_ratio``).
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import io_callback

from .. import host_callback as hcb
from .._src import measuring
from ._sections import run_taps
from ._text import grid
from ._timing import balanced, interleaved, paired

#: Rows of the section: (name, transport forced, or None for io_callback).
ROWS = (("hostfeed (native)", "native"), ("hostfeed (portable)", "jax"),
        ("io_callback(ordered)", None))


def _lowered(transport: str | None, f: Callable, x: Any) -> Callable:
    """``f`` jitted and run once for ``x`` with ``transport`` forced (which compiles it;
    later calls reuse that executable)."""
    jitted = jax.jit(f)
    with measuring.forcing_transport(transport):
        _run(jitted, x)()
    return jitted


def _taps(n: int, transport: str | None) -> Callable[[Any], Any]:
    def step(i: Any, c: Any, x: Any) -> Any:
        if transport is None:
            io_callback(lambda a: None, None, x, ordered=True)
            return c
        return hcb.id_tap(lambda a, tr: None, x, result=c)
    return lambda x: lax.fori_loop(0, n, lambda i, c: step(i, c, x), jnp.int32(0))


def _calls(n: int, transport: str | None) -> Callable[[Any], Any]:
    spec = jax.ShapeDtypeStruct((4,), jnp.float32)

    def host(a: Any) -> np.ndarray:
        return np.asarray(a) + np.float32(1)

    def step(a: Any) -> Any:
        if transport is None:
            return io_callback(host, spec, a, ordered=True)
        return hcb.call(host, a, result_shape=spec)
    return lambda v: lax.fori_loop(0, n, lambda i, a: step(a), v)


def _run(f: Callable, x: Any) -> Callable[[], None]:
    def go() -> None:
        f(x).block_until_ready()
        hcb.barrier_wait()
        jax.effects_barrier()
    return go


def _device_side(f: Callable, x: Any) -> tuple[float, float]:
    """Seconds until ``f(x)``'s results are ready, and until every callback ran (from an
    idle receiver)."""
    hcb.barrier_wait()
    return run_taps(f, x)


def portable_section(cfg: Any) -> dict:
    """The portable transport beside the native one and ``io_callback(ordered=True)``."""
    n = cfg.n(1000, 10000)
    x = jnp.arange(4, dtype=jnp.float32)
    out: dict[str, Any] = {"payload": "float32[4]", "taps_per_run": n, "taps": {},
                           "calls": {}}
    cfg.progress("portable: taps")
    taps = {name: _lowered(t, _taps(n, t), x) for name, t in ROWS}
    # Rounds of the three, their order alternating; each figure from all its rounds (the
    # best of two or five, until 2026-12-07, put the same quick run's native taps 50%
    # apart).
    # The first round warms up (its taps took 100 times longer) and is not counted.
    rounds: dict[str, list[tuple[float, float]]] = {name: [] for name in taps}
    for r in range(cfg.n(9, 9) + 1):
        for name in (list(taps)[::-1] if r % 2 else list(taps)):
            one = _device_side(taps[name], x)
            if r:
                rounds[name].append(one)
    # Each figure weighs the rounds of the two orders alike (`balanced`): a method's taps
    # right after another's cost more than after its own round.
    for name, seen in rounds.items():
        out["taps"][name] = {
            "device_side_per_tap_us": balanced([d for d, _ in seen]) / n * 1e6,
            "end_to_end_per_tap_us": balanced([e for _, e in seen]) / n * 1e6,
            "rounds_device_us": [d / n * 1e6 for d, _ in seen]}
    cfg.progress("portable: calls")
    m = cfg.n(300, 3000)
    calls = {name: _lowered(t, _calls(m, t), x) for name, t in ROWS}
    res = interleaved({name: _run(f, x) for name, f in calls.items()}, repeats=cfg.n(2, 5))
    out["calls"] = {name: {"per_call_us": r["min"] / m * 1e6} for name, r in res.items()}
    out["calls_per_run"] = m
    cfg.progress("portable: slow taps")
    out["slow_taps"] = _slow_taps(cfg)
    return out


def _slow_taps(cfg: Any, taps: int = 1000, host_ms: float = 0.2) -> dict:
    """Device side of ``taps`` taps with a ``host_ms`` tap function, against no-op taps,
    on the portable transport, in paired rounds (the two alternate; each round starts from
    an idle receiver, which waits for the slow functions of the round before): the ratio is
    the median of the rounds' ratios. The no-op taps' device side moves with where the
    receiver is when they come (it runs beside them), so one round tells little; 100 taps
    of 10 ms functions, best of 5 rounds each, gave ratios 20% apart from run to run."""
    def loop(func: Callable) -> Callable:
        return lambda x: lax.fori_loop(
            0, taps, lambda i, c: hcb.id_tap(func, x, result=c), jnp.int32(0))

    x = jnp.arange(4, dtype=jnp.float32)
    slow = _lowered("jax", loop(lambda a, tr: time.sleep(host_ms / 1e3)), x)
    noop = _lowered("jax", loop(lambda a, tr: None), x)
    noop_s: list[float] = []
    slow_s: list[float] = []
    for r in range(cfg.n(15, 21) + 1):  # the first pair warms up; not counted
        pair = (noop, slow) if r % 2 else (slow, noop)
        times = {id(f): _device_side(f, x)[0] for f in pair}
        if r:
            noop_s.append(times[id(noop)])
            slow_s.append(times[id(slow)])
    ratios = [s / n for s, n in zip(slow_s, noop_s)]
    return {"taps": taps, "host_ms_per_tap": host_ms, "slow_device_s": statistics.median(slow_s),
            "noop_device_s": statistics.median(noop_s), "ratio": statistics.median(ratios),
            "rounds_ratio": ratios}


def render(r: dict) -> list[str]:
    """The section as text lines, with time ratios to ``io_callback(ordered)``."""
    io_tap = r["taps"]["io_callback(ordered)"]["device_side_per_tap_us"]
    io_call = r["calls"]["io_callback(ordered)"]["per_call_us"]
    rows = []
    for name, t in r["taps"].items():
        c = r["calls"][name]["per_call_us"]
        d = t["device_side_per_tap_us"]
        rows.append([name, f"{d:.2f}", f"{t['end_to_end_per_tap_us']:.2f}",
                     f"{d / io_tap:.3f}x", f"{c:.2f}", f"{c / io_call:.3f}x"])
    s = r["slow_taps"]
    return [f"portable transport (JAX's host-callback lowering, forced here), "
            f"{r['taps_per_run']} taps of {r['payload']} / {r['calls_per_run']} calls in a "
            f"loop (us; ratios: time over io_callback(ordered)'s)",
            *grid(["method", "computation per tap", "until every function ran",
                    "/ io_callback(ordered)", "call", "/ io_callback(ordered)"], rows),
            f"  slow taps (portable): {s['taps']} taps of a {s['host_ms_per_tap']:g} ms "
            f"function: device side {s['slow_device_s'] * 1e3:.2f} ms vs "
            f"{s['noop_device_s'] * 1e3:.2f} ms for no-op taps ({s['ratio']:.2f}x"
            + (f", {paired(s['rounds_ratio']).spread()} over {len(s['rounds_ratio'])} rounds"
               if s.get("rounds_ratio") else "") + ")"]
