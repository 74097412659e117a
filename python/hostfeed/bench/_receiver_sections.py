"""The sections of ``python -m hostfeed bench`` about the receiver as a whole rather than
one callback: back-pressure at several queue bounds, eager taps, compile time and an idle
``barrier_wait``."""
from __future__ import annotations

import gc
import io
import os
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import io_callback

from .._src import measuring
from .. import host_callback as hcb
from ._timing import (interleaved)

from ._sections import Config, buffer_tap, loop, tap_step


# ----------------------------------------------------------------------------------------
# Back-pressure.


def backpressure(cfg: Config) -> dict:
    """A slow host function (busy for 50 us per tap) with several queue bounds: the device
    runs ahead until the bound is reached, then at the host's pace."""
    host_us, tap_bytes = 50.0, 16 << 10
    n = cfg.n(100, 400)
    x = jnp.zeros(tap_bytes // 4, jnp.float32)

    def slow(a: Any) -> None:
        end = time.perf_counter() + host_us / 1e6
        while time.perf_counter() < end:
            pass

    runs = []
    old_bound = measuring.stats()["max_queue_bytes"]
    try:
        for bound in (64 << 10, 1 << 20, 256_000_000):
            cfg.progress(f"back-pressure: bound {bound} B")
            f = loop(n, tap_step("hostfeed", slow))
            f(x).block_until_ready()
            hcb.barrier_wait()
            measuring.set_max_queue_bytes(bound)
            measuring.reset_peak()
            before = measuring.stats()
            t0 = time.perf_counter()
            f(x).block_until_ready()
            device_s = time.perf_counter() - t0
            hcb.barrier_wait()
            total_s = time.perf_counter() - t0
            after = measuring.stats()
            runs.append({
                "method": "hostfeed", "bound_bytes": bound, "device_s": device_s,
                "end_to_end_s": total_s,
                "blocked_s": (after["producer_blocked_ns"] - before["producer_blocked_ns"])
                / 1e9,
                "blocked_count": after["producer_blocked_count"]
                - before["producer_blocked_count"],
                "peak_queued_bytes": after["peak_queued_bytes"]})
    finally:
        measuring.set_max_queue_bytes(old_bound)
    cfg.progress("back-pressure: io_callback(ordered)")
    f = loop(n, tap_step("io_callback(ordered)", slow))
    f(x).block_until_ready()
    t0 = time.perf_counter()
    f(x).block_until_ready()
    device_s = time.perf_counter() - t0
    runs.append({"method": "io_callback(ordered)", "bound_bytes": None, "device_s": device_s,
                 "end_to_end_s": device_s, "blocked_s": None, "blocked_count": None,
                 "peak_queued_bytes": None})
    return {"host_us_per_tap": host_us, "tap_bytes": tap_bytes, "taps": n, "runs": runs}


# ----------------------------------------------------------------------------------------
# Eager taps, compile time, idle barrier.


def eager(cfg: Config) -> dict:
    """An eager ``id_tap`` until its host function ran, vs ``jax.debug.callback``; and a
    fresh tap function on every call (``id_print`` in a loop), with the memory it keeps. In
    many short rounds, their order alternating: the figures are compared round by round."""
    n = cfg.n(100, 300)
    x = jnp.arange(4, dtype=jnp.float32)
    got: list[Any] = []
    tap_fn = lambda a, tr: got.append(1)
    dbg_fn = lambda a: got.append(1)

    def hf_each() -> None:
        for _ in range(n):
            hcb.id_tap(tap_fn, x)
            hcb.barrier_wait()

    # JAX's own costs: jax.effects_barrier() also runs hostfeed's fast-dispatch markers
    # (it still waits for computations that tap); set aside for the JAX rows.
    def dbg_each() -> None:
        with measuring.devices_set_aside():
            for _ in range(n):
                jax.debug.callback(dbg_fn, x)
                jax.effects_barrier()

    bc_tap = buffer_tap(dbg_fn)

    def bc_each() -> None:  # runs on the device's thread: done when it returns
        for _ in range(n):
            bc_tap(x).block_until_ready()

    def hf_fresh() -> None:
        sink = io.StringIO()
        for i in range(n):
            hcb.id_print(x, what=i, output_stream=sink)
        hcb.barrier_wait()

    def dbg_fresh() -> None:
        sink = io.StringIO()
        with measuring.devices_set_aside():
            for i in range(n):
                jax.debug.callback(lambda v, i=i: (sink.write(f"what: {i}\n{v}\n"), None)[1], x)
            jax.effects_barrier()

    cfg.progress("eager")
    gc.collect()
    rss0, registered0 = _rss_bytes(), measuring.registered_consumers()
    res = interleaved({"hostfeed": hf_each, "debug.callback": dbg_each,
                       "buffer_callback": bc_each,
                       "hostfeed, fresh function": hf_fresh,
                       "debug.callback, fresh function": dbg_fresh}, repeats=15,
                      alternate=True)
    gc.collect()
    return {"taps": n, **{k: {"per_tap_us": v["median"] / n * 1e6,
                              "rounds_us": [t / n * 1e6 for t in v["all"]]}
                          for k, v in res.items()},
            "rss_growth_mb": max(0.0, (_rss_bytes() - rss0) / 2**20),
            "registered_consumers_growth": measuring.registered_consumers() - registered0}


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:  # not Linux
        return 0


def compile_time(cfg: Config) -> dict:
    """Trace + lower + compile of a function with many taps separated by arithmetic."""
    n_taps = cfg.n(40, 200)
    x = jnp.arange(4, dtype=jnp.float32)

    def noop(*args: Any) -> None:
        del args

    bc_tap = buffer_tap(noop)

    def case(kind: str) -> Callable[[], None]:
        def f(y: Any) -> Any:
            for i in range(n_taps):
                y = jnp.sin(y) * 1.5 + i
                if kind == "hostfeed":
                    y = hcb.id_tap(noop, y)
                elif kind == "hostfeed, result ignored":
                    hcb.id_tap(noop, y)
                elif kind == "buffer_callback":
                    y = bc_tap(y)
                elif kind == "io_callback(ordered)":
                    io_callback(noop, None, y, ordered=True)
                elif kind == "io_callback":
                    io_callback(noop, None, y)
            return y

        def go() -> None:
            # No collection of the garbage of earlier rounds within a round (each round
            # starts after one, `before=gc.collect` below): a collection's pause would
            # land in whichever round it fell in.
            gc.disable()
            try:
                jax.jit(lambda y: f(y)).lower(x).compile()  # a fresh function every time
            finally:
                gc.enable()
        return go

    cfg.progress("compile")
    kinds = ("hostfeed", "hostfeed, result ignored", "buffer_callback", "io_callback(ordered)",
             "io_callback", "no callbacks")
    # JAX's io_callback compiles many times slower than the rest (XLA copies the chain
    # that produced an ignored operand into it): once each, the rest in rounds.
    slow = ("io_callback(ordered)", "io_callback")
    res = interleaved({k: case(k) for k in kinds if k not in slow}, repeats=cfg.n(9, 7),
                      warmup=0, alternate=True, before=gc.collect)
    res.update(interleaved({k: case(k) for k in slow}, repeats=1, warmup=0, before=gc.collect))
    return {"taps": n_taps, **{k: {"seconds": res[k]["min"], "rounds_seconds": res[k]["all"]}
                               for k in kinds}}


def barrier(cfg: Config) -> dict:
    """An idle ``barrier_wait()`` vs ``jax.effects_barrier()`` (JAX's own, without the
    fast-dispatch markers it also runs once hostfeed is imported)."""
    n = cfg.n(1000, 10000)
    hcb.id_tap(lambda *a: None, jnp.float32(0))
    hcb.barrier_wait()

    def hf() -> None:
        for _ in range(n):
            hcb.barrier_wait()

    def jx() -> None:
        # JAX's own cost: jax.effects_barrier() also runs hostfeed's markers (so that it
        # still waits for computations that tap); set aside here.
        with measuring.devices_set_aside():
            for _ in range(n):
                jax.effects_barrier()

    def hf_unmarked() -> None:
        with measuring.devices_set_aside():
            hf()

    # The marker's own floor: one dispatch of the computation a marker runs (v + 1 on an
    # int32 scalar on the device), waited for.
    operand = jnp.int32(0)
    trivial = jax.jit(lambda v: v + 1)
    trivial(operand).block_until_ready()

    def td() -> None:
        for _ in range(n):
            trivial(operand).block_until_ready()

    cfg.progress("barrier")
    marked = len(measuring.scoped_devices())
    res = interleaved({"hostfeed barrier_wait": hf, "jax.effects_barrier": jx,
                       "hostfeed barrier_wait, no device to mark": hf_unmarked,
                       TRIVIAL_DISPATCH: td},
                      repeats=cfg.n(11, 9), alternate=True)
    return {"calls": n, "marked devices": marked,
            **{k: {"us": v["min"] / n * 1e6, "rounds_us": [t / n * 1e6 for t in v["all"]]}
               for k, v in res.items()}}


#: The barrier section's row of the marker's floor.
TRIVIAL_DISPATCH = "one dispatch of a trivial jitted function (v + 1 on int32[])"
