"""The sections of ``python -m hostfeed bench`` on a TPU: hostfeed against JAX's own
callbacks there (``buffer_callback`` has no TPU lowering), on the scale of a TPU's host
transfers (hundreds of microseconds each, where a CPU's callbacks take microseconds).

``taps``
    what a ``float32[4]`` tap in a ``fori_loop`` costs the device (until the loop's result is
    ready, less the loop without callbacks) and end to end (until every tap function ran):
    hostfeed ``id_tap``, ``io_callback(ordered)``, ``io_callback``, ``debug.callback``,
    ``pure_callback``; hostfeed's taps are checked to arrive in order.
``slow_taps``
    50 taps whose function sleeps 10 ms: device side, hostfeed against
    ``io_callback(ordered)`` and ``io_callback``.
``call``
    a ``float32[4] -> float32[4]`` call in a loop, per call: ``hcb.call``,
    ``pure_callback``, ``io_callback(ordered)``.
``dispatch``
    a small jitted function dispatched and waited for, per call: no callback, with one
    ``id_tap``, one ``call``, one of each JAX callback.
``record``
    a training step (``float32[1024, 1024]`` matrices, 4 MiB activation) per step: alone;
    returning the activation and ``device_get`` each step; returning it and
    ``copy_to_host_async``, fetched while the next step runs; one ``device_get`` of 4 MiB
    alone; ``hostfeed.Recorder.record`` of the activation (until every row reached the
    recorder; and with the write to disk); ``io_callback`` and ``debug.callback`` of it
    (:mod:`hostfeed.bench._training`, which the GPU bench shares).
``sweep``
    GB/s of one tap per step from 16 B to 16 MiB: hostfeed, ``io_callback``.
``barrier``
    an idle ``barrier_wait()`` after computations that tapped, and ``jax.effects_barrier()``.
``compile``
    compiling a function with 50 taps: hostfeed, ``io_callback(ordered)``.
``paths``
    the TPU's ways to the host measured raw (see :mod:`hostfeed.bench._tpu_paths`).

Every section runs its cases in interleaved rounds and keeps the fastest round (the
machine is shared); ratios are time ratios. A section that fails records its error and
the others still run (the exit status is then 1).
"""
from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import io_callback


from .. import host_callback as hcb
from . import _tpu_paths
from ._sections import Config, loop, tap_step
from ._timing import rounds as _rounds
from ._training import record

#: Rows of the taps section, hostfeed first.
TAP_METHODS = ("hostfeed", "io_callback(ordered)", "io_callback", "debug.callback",
               "pure_callback")


def _wait(f: Callable, *args: Any) -> Callable[[], float]:
    """A function that runs ``f(*args)`` until its results are ready; returns seconds."""
    def go() -> float:
        t0 = time.perf_counter()
        jax.block_until_ready(f(*args))
        return time.perf_counter() - t0
    return go


def _settled(go: Callable[[], float]) -> Callable[[], float]:
    """``go``, then every callback it made ran (``barrier_wait`` and the effects barrier);
    returns the seconds of both."""
    def run() -> float:
        t0 = time.perf_counter()
        go()
        hcb.barrier_wait()
        jax.effects_barrier()
        return time.perf_counter() - t0
    return run


def taps(cfg: Config) -> dict:
    """Per-tap device-side and end-to-end cost of a ``float32[4]`` tap in a loop."""
    n_hostfeed, n_jax = cfg.n(300, 1000), cfg.n(100, 300)
    x = jnp.arange(4, dtype=jnp.float32)
    seen: list[int] = []

    def record(a: Any) -> None:
        seen.append(1)

    fns = {m: loop(n_hostfeed if m == "hostfeed" else n_jax, tap_step(m, record))
           for m in TAP_METHODS}
    none_n = loop(n_hostfeed, lambda v, c: (v, c))
    cases = {"no callback": _wait(none_n, x)}
    cases.update({m: _wait(f, x) for m, f in fns.items()})
    cases.update({f"{m}, end to end": _settled(_wait(f, x)) for m, f in fns.items()})
    cfg.progress("tpu: taps")
    res = _rounds(cases, cfg.n(2, 3))
    base = min(res["no callback"]) / n_hostfeed
    out: dict[str, Any] = {"payload": "float32[4]", "taps": {"hostfeed": n_hostfeed,
                                                             "jax": n_jax},
                           "no_callback_step_us": base * 1e6, "methods": {}}
    for m in TAP_METHODS:
        n = n_hostfeed if m == "hostfeed" else n_jax
        out["methods"][m] = {
            "device_side_per_tap_us": (min(res[m]) / n - base) * 1e6,
            "end_to_end_per_tap_us": (min(res[f"{m}, end to end"]) / n - base) * 1e6,
            "rounds_device_us": [(t / n - base) * 1e6 for t in res[m]]}
    out["order_kept"] = _order_kept()
    return out


def _order_kept(n: int = 200) -> bool:
    """Whether taps from three places in a loop (three dtypes) arrive in program order."""
    got: list[tuple[str, int]] = []

    def site(name: str) -> Callable:
        return lambda a, tr: got.append((name, int(np.asarray(a).reshape(-1)[0])))

    def body(i: Any, c: Any) -> Any:
        c = hcb.id_tap(site("a"), i, result=c)
        c = hcb.id_tap(site("b"), jnp.full((300,), i, jnp.float32), result=c)
        return hcb.id_tap(site("c"), (i % 100).astype(jnp.int8), result=c)

    f = jax.jit(lambda c: lax.fori_loop(0, n, body, c))
    for _ in range(3):
        f(jnp.int32(0))
    hcb.barrier_wait()
    expected = [(s, v) for i in range(n) for s, v in (("a", i), ("b", i), ("c", i % 100))]
    return got == expected * 3


def slow_taps(cfg: Config, n: int = 50, host_ms: float = 10.0) -> dict:
    """Device side of ``n`` taps whose function sleeps ``host_ms``."""
    x = jnp.arange(4, dtype=jnp.float32)

    def sleep(*args: Any) -> None:
        time.sleep(host_ms / 1e3)

    fns = {m: loop(n, tap_step(m, sleep)) for m in ("hostfeed", "io_callback(ordered)",
                                                      "io_callback")}
    cfg.progress("tpu: slow taps")
    res = _rounds({m: _wait(f, x) for m, f in fns.items()}, cfg.n(1, 2))
    hcb.barrier_wait()
    return {"taps": n, "host_ms_per_tap": host_ms,
            "device_ms": {m: min(t) * 1e3 for m, t in res.items()}}


def _call_loop(method: str, n: int) -> Callable:
    spec = jax.ShapeDtypeStruct((4,), jnp.float32)

    def host(a: Any) -> np.ndarray:
        return np.asarray(a) + np.float32(1)

    def step(a: Any) -> Any:
        if method == "hcb.call":
            return hcb.call(host, a, result_shape=spec)
        if method == "pure_callback":
            return jax.pure_callback(host, spec, a)
        return io_callback(host, spec, a, ordered=method == "io_callback(ordered)")
    return jax.jit(lambda v: lax.fori_loop(0, n, lambda i, a: step(a), v))


def call(cfg: Config) -> dict:
    """Round trip of a ``float32[4] -> float32[4]`` call in a loop, per call."""
    n = cfg.n(100, 300)
    x = jnp.arange(4, dtype=jnp.float32)
    methods = ("hcb.call", "pure_callback", "io_callback(ordered)", "io_callback")
    cfg.progress("tpu: calls")
    res = _rounds({m: _wait(_call_loop(m, n), x) for m in methods}, cfg.n(2, 3))
    out = np.asarray(_call_loop("hcb.call", 3)(x))
    assert out.tolist() == [3.0, 4.0, 5.0, 6.0], out
    return {"calls": n, "methods": {m: {"per_call_us": min(t) / n * 1e6,
                                        "rounds_us": [v / n * 1e6 for v in t]}
                                    for m, t in res.items()}}


def dispatch(cfg: Config) -> dict:
    """A small jitted function with one callback, dispatched and waited for, per call."""
    spec = jax.ShapeDtypeStruct((4,), jnp.float32)

    def noop(*args: Any) -> None:
        return None

    fns = {
        "no callback": lambda v: v + 1,
        "hostfeed id_tap": lambda v: hcb.id_tap(lambda a, t: None, v) + 1,
        "hostfeed call": lambda v: hcb.call(lambda a: a, v, result_shape=spec) + 1,
        "io_callback(ordered)": lambda v: (io_callback(noop, None, v, ordered=True), v + 1)[1],
        "io_callback": lambda v: (io_callback(noop, None, v), v + 1)[1],
        "debug.callback": lambda v: (jax.debug.callback(noop, v), v + 1)[1],
        "pure_callback": lambda v: jax.pure_callback(lambda a: a, spec, v) + 1,
    }
    x = jnp.arange(4, dtype=jnp.float32)
    n = cfg.n(20, 50)

    def many(f: Callable) -> Callable[[], float]:
        jitted = jax.jit(f)

        def go() -> float:
            t0 = time.perf_counter()
            for _ in range(n):
                jitted(x).block_until_ready()
            return time.perf_counter() - t0
        return go

    cfg.progress("tpu: dispatch")
    res = _rounds({k: many(f) for k, f in fns.items()}, cfg.n(2, 3))
    hcb.barrier_wait()
    return {"calls": n, "methods": {k: {"us": min(t) / n * 1e6} for k, t in res.items()}}


def sweep(cfg: Config) -> dict:
    """GB/s of one tap per loop step, by payload size."""
    sizes = [16, 64 << 10, 1 << 20, 4 << 20] + ([] if cfg.quick else [16 << 20])
    out: dict[str, list[dict]] = {"hostfeed": [], "io_callback": []}
    for size in sizes:
        n = 20 if size >= 1 << 20 else 100
        x = jnp.zeros((max(1, size // 4),), jnp.float32)
        cfg.progress(f"tpu: sweep {size} B")
        fns = {m: loop(n, tap_step(m, lambda a: None)) for m in out}
        cases = {"none": _wait(loop(n, lambda v, c: (v, c)), x)}
        cases.update({m: _settled(_wait(f, x)) for m, f in fns.items()})
        res = _rounds(cases, 2)
        base = min(res["none"])
        for m, rows in out.items():
            per = (min(res[m]) - base) / n
            rows.append({"bytes": size, "per_tap_us": per * 1e6,
                         "gb_per_s": x.nbytes / per / 1e9})
    return {"sizes": sizes, "methods": out}


def barrier(cfg: Config) -> dict:
    """An idle ``barrier_wait`` after computations that tapped, and the effects barrier."""
    jax.block_until_ready(jax.jit(lambda v: hcb.id_tap(lambda a, t: None, v))(1.0))
    hcb.barrier_wait()
    n = cfg.n(20, 100)

    def many(fn: Callable[[], object]) -> Callable[[], float]:
        def go() -> float:
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            return time.perf_counter() - t0
        return go

    cfg.progress("tpu: barrier")
    res = _rounds({"hostfeed barrier_wait": many(hcb.barrier_wait),
                   "jax.effects_barrier": many(jax.effects_barrier)}, 3)
    return {"calls": n, "methods": {k: {"us": min(t) / n * 1e6} for k, t in res.items()}}


def compile_time(cfg: Config) -> dict:
    """Seconds to compile a function with 50 taps."""
    taps = 50
    x = jnp.arange(4, dtype=jnp.float32)

    def many(method: str) -> Callable[[], float]:
        def go() -> float:
            def f(v: Any) -> Any:
                for i in range(taps):
                    v = v * 1.5 + i
                    if method == "hostfeed":
                        v = hcb.id_tap(lambda a, t: None, v)
                    else:
                        io_callback(lambda a: None, None, v, ordered=True)
                return v
            t0 = time.perf_counter()
            jax.jit(f).lower(x).compile()
            return time.perf_counter() - t0
        return go

    cfg.progress("tpu: compile")
    res = _rounds({m: many(m) for m in ("hostfeed", "io_callback(ordered)")}, 1)
    return {"taps": taps, "methods": {k: {"seconds": min(t)} for k, t in res.items()}}


#: The TPU sections, in the order they run and print.
SECTIONS: dict[str, Callable[[Config], dict]] = {
    "taps": taps, "slow_taps": slow_taps, "call": call, "dispatch": dispatch,
    "record": record, "sweep": sweep, "barrier": barrier, "compile": compile_time,
    "paths": _tpu_paths.paths,
}


def run_section(name: str, cfg: Config) -> dict:
    """One section; an exception is recorded as the section's ``error`` (and printed)."""
    try:
        return SECTIONS[name](cfg)
    except Exception as exc:  # noqa: BLE001 - recorded; the other sections still run
        return {"error": "".join(traceback.format_exception_only(type(exc), exc)).strip(),
                "traceback": traceback.format_exc()[-4000:]}


def targets(result: dict) -> dict[str, float]:
    """The issue's four targets on a TPU as time ratios (each must be at most 1.0)."""
    out: dict[str, float] = {}
    t = result.get("taps", {}).get("methods")
    if t:
        hf = t["hostfeed"]["device_side_per_tap_us"]
        out["tap vs io_callback"] = hf / t["io_callback"]["device_side_per_tap_us"]
        out["tap vs 0.5x io_callback(ordered)"] = hf / (
            0.5 * t["io_callback(ordered)"]["device_side_per_tap_us"])
    s = result.get("slow_taps", {}).get("device_ms")
    if s:
        out["slow taps vs 0.1x io_callback(ordered)"] = s["hostfeed"] / (
            0.1 * s["io_callback(ordered)"])
    c = result.get("call", {}).get("methods")
    if c:
        out["call vs pure_callback"] = (c["hcb.call"]["per_call_us"]
                                        / c["pure_callback"]["per_call_us"])
    r = result.get("record", {}).get("ms")
    if r:
        out["record inside vs returned + device_get"] = (r["hostfeed Recorder"]
                                                         / r["returned + device_get"])
        if "rec.step" in r:
            out["rec.step vs returned + copy_to_host_async"] = (
                r["rec.step"] / r["returned + copy_to_host_async, overlapped"])
            out["rec.step vs 1.1x max(step, one copy) (aim)"] = r["rec.step"] / (
                1.1 * max(r["step"], r["one device_get of 4 MiB"]))
            out["rec.step every=10 vs 1.1x the step"] = r["rec.step, every=10"] / (
                1.1 * r["step"])
            out["rec.step stats vs 1.2x the step"] = r["rec.step, reduce='stats'"] / (
                1.2 * r["step"])
    return out


def _f(v: Any, digits: int = 1) -> str:
    return f"{v:.{digits}f}" if isinstance(v, (int, float)) else "-"


def text(result: dict) -> list[str]:
    """The TPU sections as terminal lines."""
    lines: list[str] = []
    for name in SECTIONS:
        r = result.get(name)
        if r is None:
            continue
        lines.append("")
        if "error" in r:
            lines.append(f"{name}: FAILED: {r['error']}")
            continue
        lines += _RENDER[name](r)
    tg = targets(result)
    if tg:
        lines += ["", "targets (time ratios; each must be at most 1.00x):"]
        lines += [f"  {k:<44}{v:>7.2f}x  {'met' if v <= 1.0 else 'MISSED'}"
                  for k, v in tg.items()]
    return lines


def _taps_text(r: dict) -> list[str]:
    io = r["methods"]["io_callback(ordered)"]["device_side_per_tap_us"]
    out = [f"taps: {r['payload']} in a loop ({r['taps']['hostfeed']} hostfeed, "
           f"{r['taps']['jax']} JAX taps a run; a step without callback "
           f"{r['no_callback_step_us']:.2f} us); hostfeed's order kept: {r['order_kept']}",
           f"  {'method':<24}{'device us/tap':>14}{'end to end':>12}"
           f"{'/ io_callback(ordered)':>25}"]
    for m, v in r["methods"].items():
        d = v["device_side_per_tap_us"]
        out.append(f"  {m:<24}{d:>14.1f}{v['end_to_end_per_tap_us']:>12.1f}{d / io:>24.2f}x")
    return out


def _slow_text(r: dict) -> list[str]:
    d = r["device_ms"]
    return [f"slow taps: {r['taps']} taps of a {r['host_ms_per_tap']:.0f} ms function, device "
            "side (ms): " + ", ".join(f"{k} {v:.1f}" for k, v in d.items())
            + f"; hostfeed {d['hostfeed'] / d['io_callback(ordered)']:.3f}x "
              "io_callback(ordered)"]


def _call_text(r: dict) -> list[str]:
    m = r["methods"]
    pc = m["pure_callback"]["per_call_us"]
    return [f"call: float32[4] round trip in a loop of {r['calls']}, us per call: "
            + ", ".join(f"{k} {v['per_call_us']:.1f} ({v['per_call_us'] / pc:.2f}x)"
                        for k, v in m.items()) + " (ratios to pure_callback)"]


def _dispatch_text(r: dict) -> list[str]:
    m = r["methods"]
    return ["dispatch of a small jitted function, waited for, us per call: "
            + ", ".join(f"{k} {v['us']:.0f}" for k, v in m.items())]


def _record_text(r: dict) -> list[str]:
    ms = r["ms"]
    step = ms["step"]
    out = [f"record: a training step with a 4 MiB activation, ms per step "
           f"({r['steps']} steps a round; x: times the step alone)"]
    out += [f"  {k:<44}{v:>8.3f} ms{v / step:>8.2f}x" for k, v in ms.items()]
    return out


def _sweep_text(r: dict) -> list[str]:
    out = ["sweep: one tap per loop step, GB/s (us per tap)"]
    for m, rows in r["methods"].items():
        out.append(f"  {m:<14}" + "  ".join(
            f"{row['bytes']}B {row['gb_per_s']:.3f} ({row['per_tap_us']:.0f})" for row in rows))
    return out


def _barrier_text(r: dict) -> list[str]:
    return ["barrier: " + ", ".join(f"{k} {v['us']:.1f} us" for k, v in r["methods"].items())]


def _compile_text(r: dict) -> list[str]:
    return [f"compile: {r['taps']} taps, " + ", ".join(
        f"{k} {v['seconds']:.2f} s" for k, v in r["methods"].items())]


_RENDER: dict[str, Callable[[dict], list[str]]] = {
    "taps": _taps_text, "slow_taps": _slow_text, "call": _call_text,
    "dispatch": _dispatch_text, "record": _record_text, "sweep": _sweep_text,
    "barrier": _barrier_text, "compile": _compile_text, "paths": _tpu_paths.text,
}
