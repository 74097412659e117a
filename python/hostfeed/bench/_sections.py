"""The measurements of ``python -m hostfeed bench``, one function per section.

Each section returns a JSON-ready dict (the schema is documented in
:mod:`hostfeed.bench`) and measures hostfeed and JAX's own callbacks side by side in one
process. The JAX callbacks run the host function on the device's thread, which waits for
it, so for them the per-callback device-side cost is the interval between two host
function starts in a loop of back-to-back callbacks; for hostfeed the receiver records
each tap's device-side cost and hand-over latency itself (``hostfeed.receiver_stats()``'s
``device_us`` and ``handover_us``).
"""
from __future__ import annotations

import contextlib
import itertools
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import io_callback
from jax.experimental.buffer_callback import buffer_callback

from .._src import measuring
from .. import host_callback as hcb
from ._timing import (cdf_of_buckets, cdf_of_samples, interleaved, summary_of_buckets,
                      summary_of_samples)

#: The JAX callbacks hostfeed is compared with, for taps (no result). ``buffer_callback``
#: is an identity tap (``input_output_aliases={0: 0}``, ``has_side_effect=True``): the
#: Python function gets the device buffers themselves, zero copy on CPU.
TAP_METHODS = ("buffer_callback", "io_callback(ordered)", "io_callback", "debug.callback",
               "pure_callback")
#: The JAX callbacks hostfeed's ``call`` is compared with.
CALL_METHODS = ("buffer_callback", "pure_callback", "io_callback", "io_callback(ordered)")


def buffer_tap(record: Callable[[Any], None]) -> Callable[[Any], Any]:
    """An identity tap with ``jax.experimental.buffer_callback``: ``record`` gets a numpy
    view of the device buffer (no copy on CPU), on the device's thread."""
    def cb(ctx: Any, out: Any, a: Any) -> None:
        del ctx, out  # the output aliases the input: nothing to write
        record(np.asarray(a))

    def tap(x: Any) -> Any:
        return buffer_callback(cb, jax.ShapeDtypeStruct(x.shape, x.dtype),
                               input_output_aliases={0: 0}, has_side_effect=True)(x)
    return tap


def buffer_call(host: Callable[[Any], Any], spec: Any) -> Callable[[Any], Any]:
    """A host call with ``buffer_callback``: ``host``'s result is written into the output
    buffer."""
    def cb(ctx: Any, out: Any, a: Any) -> None:
        del ctx
        np.asarray(out)[...] = host(np.asarray(a))
    return buffer_callback(cb, spec)


@dataclass
class Config:
    """How much to measure: ``quick`` (about a minute on 2 cores) or full; ``n_64mb``: the
    bytes each method of the throughput section moves per round, in 64 MiB (None: its
    default, 1 quick and 4 full)."""

    quick: bool = False
    progress: Callable[[str], None] = lambda step: None
    n_64mb: int | None = None

    def n(self, quick: int, full: int) -> int:
        return quick if self.quick else full


def tap_step(method: str, record: Callable[..., None]) -> Callable[[Any, Any], Any]:
    """``step(x, carry) -> (x, carry)`` that sends ``x`` to ``record`` with ``method``."""
    if method in ("hostfeed", "hostfeed (sync)"):
        # sync: the device waits until the tap function has run.
        sync = method == "hostfeed (sync)"
        return lambda x, c: (x, hcb.id_tap(lambda a, tr: record(a), x, result=c, sync=sync))
    if method == "buffer_callback":
        # The tap's output is carried as the next step's operand: an aliased operand that
        # stayed live would make XLA copy it before every call.
        tap = buffer_tap(record)
        return lambda x, c: (tap(x), c)
    if method == "io_callback(ordered)":
        return lambda x, c: (x, (io_callback(record, None, x, ordered=True), c)[1])
    if method == "io_callback":
        return lambda x, c: (x, (io_callback(record, None, x), c)[1])
    if method == "debug.callback":
        return lambda x, c: (x, (jax.debug.callback(record, x), c)[1])
    if method == "pure_callback":
        # A result the loop carries, and the carry as an operand, so that the callback is
        # neither removed as dead code nor hoisted out of the loop (it is "pure").
        def with_result(x: Any, c: Any) -> tuple[Any, Any]:
            r = jax.pure_callback(
                lambda a, k: (record(a), np.int32(0))[1],  # type: ignore[func-returns-value]
                jax.ShapeDtypeStruct((), jnp.int32), x, c)
            return x, c + r
        return with_result
    raise ValueError(method)


def loop(n: int, step: Callable[[Any, Any], Any]) -> Callable[[Any], Any]:
    """A jitted loop of ``n`` steps on one operand carried unchanged (the loop moves no
    array in or out, so nothing but the callback is measured)."""
    @jax.jit
    def f(x: Any) -> Any:
        return lax.fori_loop(0, n, lambda i, s: step(*s), (x, jnp.int32(0)))[1]
    return f


def _inter_arrival_us(stamps: list[int]) -> list[float]:
    return [(b - a) / 1e3 for a, b in itertools.pairwise(stamps)]


# ----------------------------------------------------------------------------------------
# Per-tap latency.


def _stamper(stamps: list[int]) -> Callable[[Any], None]:
    def record(a: Any) -> None:
        del a
        stamps.append(time.perf_counter_ns())
    return record


def latency(cfg: Config) -> dict:
    """Per-tap device-side cost and hand-over latency of a float32[4] tap in a loop, in
    rounds that interleave the methods (each method's loop once a round), so that a slow
    stretch of the machine hits every method alike. The per-tap figures are the fastest
    round's; ``rounds_device_us``/``rounds_end_to_end_us`` keep every round's, and
    ``rounds_device_p50_us`` (``rounds_handover_p50_us``) each round's median cost of a tap
    (hand-over), for the medians of the rounds' ratios; the distributions pool every
    round's taps. The rounds alternate their order."""
    n = cfg.n(2000, 20000)
    rounds = cfg.n(11, 9)  # a quick run's rounds are short: more of them (6 moved it 20%)
    x = jnp.arange(4, dtype=jnp.float32)
    methods = ("hostfeed", "hostfeed (sync)", *TAP_METHODS)
    stamps: dict[str, list[int]] = {m: [] for m in methods}
    loops = {m: loop(n, tap_step(m, _stamper(stamps[m]))) for m in methods}
    gaps: dict[str, list[float]] = {m: [] for m in methods}
    buckets: dict[str, dict[int, int]] = {"device_ns": {}, "handover_ns": {}}
    timed: dict[str, list[tuple[float, float]]] = {m: [] for m in methods}
    # Each round's median cost of a tap (and hostfeed's median hand-over): the figures
    # that swing with the machine's mood (a wake-up, a shared core) are compared round by
    # round, the rounds alternating their order.
    p50s: dict[str, list[float]] = {m: [] for m in methods}
    handover_p50s: list[float] = []
    for m, f in loops.items():  # compile and warm up
        cfg.progress(f"latency: {m}")
        run_taps(f, x)
    for r in range(rounds):
        for m in (methods[::-1] if r % 2 else methods):
            f = loops[m]
            stamps[m].clear()
            measuring.reset_histograms()
            timed[m].append(run_taps(f, x))
            h = measuring.histograms()
            if m == "hostfeed":
                _add_buckets(buckets, h)
                p50s[m].append(summary_of_buckets(h["device_ns"], 1e-3)["p50"])
                handover_p50s.append(summary_of_buckets(h["handover_ns"], 1e-3)["p50"])
            else:  # the device waits for each host function: the time between two is the cost
                g = _inter_arrival_us(stamps[m])
                gaps[m] += g
                p50s[m].append(summary_of_samples(g)["p50"])
    out: dict[str, Any] = {"payload": "float32[4]", "taps": n, "rounds": rounds,
                           "methods": {}}
    for m in methods:
        device_s, end_s = zip(*timed[m], strict=True)
        entry: dict[str, Any] = {
            "device_side_per_tap_us": min(device_s) / n * 1e6,
            "end_to_end_per_tap_us": min(end_s) / n * 1e6,
            "rounds_device_us": [t / n * 1e6 for t in device_s],
            "rounds_end_to_end_us": [t / n * 1e6 for t in end_s],
            "rounds_device_p50_us": p50s[m]}
        if m == "hostfeed":
            entry.update(_histogram_entries({k: sorted(v.items()) for k, v in buckets.items()}))
            entry["rounds_handover_p50_us"] = handover_p50s
        else:
            entry["device_us"] = summary_of_samples(gaps[m])
            entry["device_cdf_us"] = cdf_of_samples(gaps[m])
            entry["handover_us"] = None  # the host function runs on the device's thread
        out["methods"][m] = entry
    out["methods"]["hostfeed (spaced taps)"] = _spaced_latency(cfg)
    cfg.progress("latency: floors")
    out["floors"] = _tap_floors(cfg, n)
    return out


def _add_buckets(into: dict[str, dict[int, int]], histograms: dict[str, Any]) -> None:
    """Adds the ``(upper bound, count)`` buckets of ``histograms`` into ``into``."""
    for key, table in into.items():
        for bound, count in histograms[key]:
            table[bound] = table.get(bound, 0) + count


def run_taps(f: Callable, x: Any) -> tuple[float, float]:
    """Runs ``f(x)`` once: seconds until it returns (device side) and until every callback
    ran (end to end)."""
    t0 = time.perf_counter()
    f(x).block_until_ready()
    device_s = time.perf_counter() - t0
    hcb.barrier_wait()
    jax.effects_barrier()
    return device_s, time.perf_counter() - t0


def _tap_floors(cfg: Config, n: int) -> dict[str, float]:
    """What a small tap in a loop cannot go below, per tap (µs): ``xla_custom_call``, the
    loop step of an XLA custom call that does nothing (hostfeed's check target with a zero
    status, threaded on the same effect token as a tap: XLA's own cost of calling a
    handler); ``numpy``, copying the tap's bytes and calling the same Python function in a
    Python loop."""
    @jax.jit
    def custom_calls(x: Any) -> Any:
        def step(i: Any, c: Any) -> Any:
            measuring.noop_custom_call(c)  # returns at once
            return c + 1
        return lax.fori_loop(0, n, step, x)

    host = np.arange(4, dtype=np.float32)
    tap_fn = _stamper([])

    def numpy_floor() -> None:
        for _ in range(n):
            tap_fn(np.array(host, copy=True))

    x = jnp.int32(0)
    custom_calls(x).block_until_ready()
    res = interleaved({"xla_custom_call": lambda: custom_calls(x).block_until_ready(),
                       "numpy": numpy_floor}, repeats=cfg.n(3, 5))
    return {k: v["min"] / n * 1e6 for k, v in res.items()}


def _spaced_latency(cfg: Config) -> dict:
    """hostfeed's hand-over latency when the receiver is idle between taps: each loop step
    computes for tens of microseconds before it taps, so every tap finds the queue empty
    (the burst above measures hand-over behind the taps queued before)."""
    n = cfg.n(300, 2000)
    cfg.progress("latency: hostfeed (spaced taps)")

    # Scalar, single-threaded work (XLA would spread array work over all cores and starve
    # the consumer on a small machine).
    def spin(j: Any, v: Any) -> Any:
        return v * 1.0000001 + 1e-7

    @jax.jit
    def f(x: Any) -> Any:
        def body(i: Any, c: Any) -> Any:
            c = lax.fori_loop(0, 8000, spin, c)  # device work between taps
            return hcb.id_tap(lambda a, tr: None, x, result=c)
        return lax.fori_loop(0, n, body, jnp.float32(0))

    x = jnp.arange(4, dtype=jnp.float32)
    run_taps(f, x)  # compile and warm up
    buckets: dict[str, dict[int, int]] = {"device_ns": {}, "handover_ns": {}}
    timed, p50s = [], []
    for _ in range(cfg.n(7, 9)):  # rounds: each round's median hand-over, and all pooled
        measuring.reset_histograms()
        timed.append(run_taps(f, x))
        h = measuring.histograms()
        _add_buckets(buckets, h)
        p50s.append(summary_of_buckets(h["handover_ns"], 1e-3)["p50"])
    device_s, end_s = zip(*timed, strict=True)
    entry = {"device_side_per_tap_us": min(device_s) / n * 1e6,
             "end_to_end_per_tap_us": min(end_s) / n * 1e6, "rounds_handover_p50_us": p50s}
    entry.update(_histogram_entries({k: sorted(v.items()) for k, v in buckets.items()}))
    return entry


def _histogram_entries(h: dict[str, Any] | None = None) -> dict[str, Any]:
    """Summaries and CDFs, in µs, of hostfeed's timing histograms (``h``, by default the
    receiver's since the last reset)."""
    h = h if h is not None else measuring.histograms()
    return {"device_us": summary_of_buckets(h["device_ns"], 1e-3),
            "device_cdf_us": cdf_of_buckets(h["device_ns"], 1e-3),
            "handover_us": summary_of_buckets(h["handover_ns"], 1e-3),
            "handover_cdf_us": cdf_of_buckets(h["handover_ns"], 1e-3)}


def timing_cost(cfg: Config) -> dict:
    """What recording the timing histograms costs a small tap (device side)."""
    n = cfg.n(2000, 20000)
    x = jnp.arange(4, dtype=jnp.float32)
    f = loop(n, tap_step("hostfeed", lambda a: None))
    f(x).block_until_ready()
    hcb.barrier_wait()

    def run(on: bool) -> Callable[[], None]:
        def go() -> None:
            measuring.set_timing(on)
            f(x).block_until_ready()
            hcb.barrier_wait()
        return go

    cfg.progress("timing cost")
    try:
        res = interleaved({"on": run(True), "off": run(False)}, repeats=cfg.n(3, 7))
    finally:
        measuring.set_timing(True)
    on, off = res["on"]["min"] / n * 1e6, res["off"]["min"] / n * 1e6
    # While jax.profiler does not trace, the consumer asks once per batch whether it does.
    checks = 100_000
    t0 = time.perf_counter()
    for _ in range(checks):
        measuring.profiler_check()
    check_us = (time.perf_counter() - t0) / checks * 1e6
    return {"taps": n, "per_tap_us_timing_on": on, "per_tap_us_timing_off": off,
            "cost_us_per_tap": on - off, "profiler_check_us_per_batch": check_us}


# ----------------------------------------------------------------------------------------
# Payload sweep.


#: The sweep's floors: copy the same bytes with numpy and call the same Python function
#: with the copy, into a fresh buffer each time (freed before the next: one hot buffer),
#: and alternately into two (what an asynchronous tap needs at least).
FLOORS = ("numpy copy", "numpy copy, 2 buffers")


def sweep(cfg: Config) -> dict:
    """Taps/s and GB/s from 16 B to 64 MiB, against the floor: copying the same bytes with
    numpy and calling the same Python function with the copy."""
    sizes = ([16, 4096, 1 << 20, 16 << 20] if cfg.quick
             else [16 << (2 * k) for k in range(12)])  # 16 B ... 64 MiB
    budget = cfg.n(48 << 20, 1 << 31)
    methods = ("hostfeed", "buffer_callback", "io_callback(ordered)", "io_callback",
               "debug.callback")
    out: dict[str, Any] = {"sizes": sizes, "methods": {m: [] for m in
                                                       (*methods, *FLOORS)}}
    for size in sizes:
        n = int(np.clip(budget // size, cfg.n(4, 8), cfg.n(500, 5000)))
        cfg.progress(f"sweep: {size} B")
        for m, rounds in _sweep_one(cfg, methods, size, n).items():
            seconds = min(rounds)
            out["methods"][m].append({"bytes": size, "taps": n, "taps_per_s": n / seconds,
                                      "gb_per_s": n * size / seconds / 1e9,
                                      "rounds_gb_per_s": [n * size / t / 1e9 for t in rounds]})
    return out


def _sweep_one(cfg: Config, methods: tuple[str, ...], size: int,
               n: int) -> dict[str, list[float]]:
    """Seconds of ``n`` taps of ``size`` bytes in each round, per method and for the numpy
    copies (the rounds interleave them)."""
    x = jnp.zeros(size // 4, jnp.float32)
    host_x = np.asarray(x)
    sink: list[int] = []

    def record(a: Any) -> None:
        sink.append(1)

    loops = {m: loop(n, tap_step(m, record)) for m in methods}
    tap_fn = lambda a, tr: record(a)  # what hostfeed's tap calls

    def case(f: Callable[[Any], Any]) -> Callable[[], None]:
        def go() -> None:
            f(x).block_until_ready()
            hcb.barrier_wait()
            jax.effects_barrier()
            sink.clear()
        return go

    def numpy_copy() -> None:  # the floor: copy the bytes, call the same Python function
        for _ in range(n):
            tap_fn(np.array(host_x, copy=True), ())
        sink.clear()

    # A synchronous copy reuses one hot buffer (the last one is freed before the next
    # copy); an asynchronous tap needs two at least: one filled while the previous one
    # waits for, or is in, its host function.
    two = [np.empty_like(host_x), np.empty_like(host_x)]

    def numpy_copy_two_buffers() -> None:
        for i in range(n):
            buf = two[i % 2]
            np.copyto(buf, host_x)
            tap_fn(buf, ())
        sink.clear()

    res = interleaved({**{m: case(loops[m]) for m in methods}, "numpy copy": numpy_copy,
                       "numpy copy, 2 buffers": numpy_copy_two_buffers},
                      repeats=cfg.n(1, 5))
    return {m: r["all"] for m, r in res.items()}


# ----------------------------------------------------------------------------------------
# Call round trips.


def call(cfg: Config) -> dict:
    """Round trip of a float32[4] -> float32[4] host call in a loop, per call: on the machine
    as it is, and again with it loaded (a busy process per core)."""
    n = cfg.n(500, 5000)
    out: dict[str, Any] = {"calls": n, "methods": _call_runs(cfg, n, "")}
    n_loaded = cfg.n(200, 1000)
    with busy_cores() as cores:
        out["loaded"] = {"calls": n_loaded, "busy_processes": cores,
                         "methods": _call_runs(cfg, n_loaded, " (loaded)")}
    hcb.barrier_wait()
    return out


@contextlib.contextmanager
def busy_cores(count: int | None = None) -> Any:
    """Loads the machine with ``count`` (default: one per core) processes that spin."""
    count = count or os.cpu_count() or 1
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"],
                              stdin=subprocess.DEVNULL) for _ in range(count)]
    try:
        yield count
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def _call_runs(cfg: Config, n: int, tag: str) -> dict[str, Any]:
    """Each method's loop of ``n`` calls, in rounds that interleave the methods (and the
    host function alone). Per method: ``p50_us``, the median round trip of its fastest
    round (this machine switches between a fast and a slow mode for seconds at a time,
    for hostfeed and JAX alike: the fastest rounds compare like with like);
    ``rounds_p50_us``, each round's median (for the ratio's range); the round trips of
    every round pooled (for the tail); and the fastest round's time per call."""
    spec = jax.ShapeDtypeStruct((4,), jnp.float32)
    rounds = cfg.n(5, 7)
    z = jnp.zeros(4, jnp.float32)
    stamps: dict[str, list[int]] = {}
    runs: dict[str, Callable[[], None]] = {}
    for method in ("hostfeed call", *CALL_METHODS):
        cfg.progress(f"call: {method}{tag}")
        stamps[method] = []

        def host(a: Any, stamps: list[int] = stamps[method]) -> np.ndarray:
            stamps.append(time.perf_counter_ns())
            return np.asarray(a) + np.float32(1)

        step = _call_step(method, host, spec)
        f = jax.jit(lambda v, step=step: lax.fori_loop(0, n, lambda i, a: step(a), v))
        f(z).block_until_ready()  # compile and warm up
        runs[method] = _waited(f, z)
    # The same call, its host function kept on the receiver thread (as with
    # HOSTFEED_CALL_THREAD=receiver): the hand-over between threads that a call on its
    # device's thread saves.
    stamps[RECEIVER_CALL] = stamps["hostfeed call"]
    runs[RECEIVER_CALL] = on_receiver_thread(runs["hostfeed call"])
    stamps["host function alone"] = []
    runs["host function alone"] = _host_floor(n, stamps["host function alone"])
    gaps: dict[str, list[float]] = {m: [] for m in runs}
    p50s: dict[str, list[float]] = {m: [] for m in runs}
    per_call: dict[str, list[float]] = {m: [] for m in runs}
    names = list(runs)
    for r in range(rounds):
        for method in (names[::-1] if r % 2 else names):
            go = runs[method]
            stamps[method].clear()
            t0 = time.perf_counter()
            go()
            per_call[method].append((time.perf_counter() - t0) / n * 1e6)
            g = _inter_arrival_us(stamps[method])
            gaps[method] += g
            p50s[method].append(summary_of_samples(g)["p50"])
    order = ("host function alone", "hostfeed call", RECEIVER_CALL, *CALL_METHODS)
    return {m: {"p50_us": min(p50s[m]), "round_trip_us": summary_of_samples(gaps[m]),
                "round_trip_cdf_us": cdf_of_samples(gaps[m]),
                "rounds_p50_us": p50s[m], "per_call_us": min(per_call[m])} for m in order}


#: The row of a ``call`` whose host function runs on the receiver thread.
RECEIVER_CALL = "hostfeed call, receiver thread"


def on_receiver_thread(go: Callable[[], object]) -> Callable[[], None]:
    """``go`` with every ``call`` kept on the receiver thread while it runs."""
    def run() -> None:
        with measuring.calls_on_receiver_thread():
            go()
    return run


def _waited(f: Callable[[Any], Any], x: Any) -> Callable[[], None]:
    """Calls ``f(x)`` and waits for its result."""
    def go() -> None:
        f(x).block_until_ready()
    return go


def _host_floor(n: int, stamps: list[int]) -> Callable[[], None]:
    """The floor of a round trip: the host function called in a Python loop on a numpy
    copy of its operand, with its result copied as a call's result is (stamped into
    ``stamps``)."""
    a = np.zeros(4, np.float32)
    res = np.empty(4, np.float32)

    def go() -> None:
        for _ in range(n):
            stamps.append(time.perf_counter_ns())
            res[...] = np.array(a, copy=True) + np.float32(1)
    return go


def _call_step(method: str, host: Callable[[Any], Any], spec: Any) -> Callable[[Any], Any]:
    if method == "hostfeed call":
        return lambda a: hcb.call(host, a, result_shape=spec)
    if method == "buffer_callback":
        return buffer_call(host, spec)
    if method == "io_callback":
        return lambda a: io_callback(host, spec, a)
    if method == "io_callback(ordered)":
        return lambda a: io_callback(host, spec, a, ordered=True)
    if method == "pure_callback":
        return lambda a: jax.pure_callback(host, spec, a)
    raise ValueError(method)


# ----------------------------------------------------------------------------------------
# Dispatch of a small jitted function that calls back once.

#: The rows of the dispatch section: no callback, hostfeed's tap and call, JAX's callbacks.
DISPATCH_METHODS = ("no callback", "hostfeed id_tap", "hostfeed call", "buffer_callback",
                    "pure_callback", "io_callback", "io_callback(ordered)", "debug.callback")


def _dispatch_fn(method: str) -> Any:
    """The jitted function of a dispatch row."""
    spec = jax.ShapeDtypeStruct((4,), jnp.float32)

    def noop(*args: Any) -> None:
        del args

    def ident(a: Any) -> np.ndarray:
        return np.asarray(a)

    bodies: dict[str, Callable[[Any], Any]] = {
        "no callback": lambda v: v + 1,
        "hostfeed id_tap": lambda v: hcb.id_tap(noop, v) + 1,
        "hostfeed id_tap, synchronous": lambda v: hcb.id_tap(noop, v, sync=True) + 1,
        "hostfeed call": lambda v: hcb.call(ident, v, result_shape=spec) + 1,
        "buffer_callback": lambda v: buffer_tap(noop)(v) + 1,
        "pure_callback": lambda v: jax.pure_callback(ident, spec, v) + 1,
        "io_callback": lambda v: (io_callback(noop, None, v), v + 1)[1],
        "io_callback(ordered)": lambda v: (io_callback(noop, None, v, ordered=True), v + 1)[1],
        "debug.callback": lambda v: (jax.debug.callback(noop, v), v + 1)[1],
    }
    return jax.jit(bodies[method])


def dispatch(cfg: Config) -> dict:
    """A small jitted function (``v + 1`` on float32[4]) with one callback, dispatched and
    waited for (``block_until_ready``) again and again: what calling it costs, per call.
    Also the same hostfeed tap through an ahead-of-time compiled object. Many short rounds,
    their order alternating: the figures are compared round by round."""
    n = cfg.n(100, 500)
    x = jnp.arange(4, dtype=jnp.float32)
    fns: dict[str, Callable[[Any], Any]] = {m: _dispatch_fn(m) for m in DISPATCH_METHODS}
    fns["hostfeed id_tap, compiled ahead of time"] = (
        _dispatch_fn("hostfeed id_tap").lower(x).compile())
    # (The default mode on CPUs and GPUs.)
    fns["hostfeed id_tap, synchronous"] = _dispatch_fn("hostfeed id_tap, synchronous")
    with measuring.token_chain_lowering():  # as with HOSTFEED_FAST_DISPATCH=0
        for m in ("hostfeed id_tap", "hostfeed call"):
            f = _dispatch_fn(m)
            f(x).block_until_ready()  # lowered now, in this mode; its later calls reuse it
            fns[f"{m}, token chain"] = f

    fns[RECEIVER_CALL] = _dispatch_fn("hostfeed call")

    def case(f: Callable[[Any], Any]) -> Callable[[], None]:
        def go() -> None:
            for _ in range(n):
                f(x).block_until_ready()
        return go

    for f in fns.values():  # compile and warm up
        f(x).block_until_ready()
    hcb.barrier_wait()
    cfg.progress("dispatch")
    cases: dict[str, Callable[[], object]] = {k: case(f) for k, f in fns.items()}
    cases[RECEIVER_CALL] = on_receiver_thread(cases[RECEIVER_CALL])
    res = interleaved(cases, repeats=15, alternate=True)
    hcb.barrier_wait()
    jax.effects_barrier()
    return {"calls": n, **{k: {"us": v["min"] / n * 1e6,
                                "rounds_us": [t / n * 1e6 for t in v["all"]]}
                            for k, v in res.items()}}
