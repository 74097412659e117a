"""The accelerators' ``record`` section (the TPU suite of ``python -m hostfeed bench`` and
``benches/gpu.py``): what logging an activation costs a training step, against JAX's best
ways to bring it to the host.

A step (``float32[size, size]`` matrices, ``size`` 1024: a 4 MiB activation) per call:
alone; returning the activation and ``device_get`` each step; returning it and
``copy_to_host_async``, fetched while the next step runs; one ``device_get`` of the
activation alone; ``Recorder.record`` of it in the computation (until every row reached
the recorder; and with the write to disk), every step, ``every=10`` and
``reduce="stats"``; the same through ``Recorder.step`` (its default for the platform;
with ``both_step_ways``, also ``outputs=True``: the records leave as outputs, and
``outputs=False``: they stay in the computation); ``io_callback`` and ``debug.callback``
of it. Cases run in interleaved rounds; the fastest round of each is kept (ms per step).
"""
from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback

import hostfeed

from .. import host_callback as hcb
from ._sections import Config
from ._timing import rounds


def record(cfg: Config, *, both_step_ways: bool = False, size: int = 1024,
           label: str = "tpu: record") -> dict:
    """A training step with a ``size`` x ``size`` float32 activation, recorded or fetched
    in several ways; ms per step (the fastest round) under ``"ms"``."""
    steps = cfg.n(10, 30)
    key = jax.random.PRNGKey(0)
    w0 = jax.random.normal(key, (size, size), jnp.float32) * 0.01
    xs = jax.random.normal(key, (size, size), jnp.float32)
    folder = tempfile.mkdtemp(prefix="hostfeed-bench-record-")
    rec = hostfeed.Recorder(f"{folder}/run.zarr", mode="w")

    def make(tap: Callable[[Any, Any], None], wrap: Callable = jax.jit) -> Callable:
        def step(w: Any, x: Any, i: Any) -> Any:
            h = jnp.tanh(x @ w)
            tap(h, i)
            g = jax.grad(lambda w: jnp.mean(jnp.tanh(x @ w) ** 2))(w)
            return w - 0.1 * g, h
        return wrap(step)

    def noop(*args: Any) -> None:
        return None

    def stepped(name: str, outputs: bool | None, **kw: Any) -> Callable:
        return make(lambda h, i: rec.record(name, h, step=i, **kw),
                    lambda fn: rec.step(fn, outputs=outputs))

    plain = make(lambda h, i: None)
    recorded = make(lambda h, i: rec.record("h", h, step=i))
    every10 = make(lambda h, i: rec.record("h10", h, step=i, every=10))
    stats = make(lambda h, i: rec.record("h_stats", h, step=i, reduce="stats"))
    io_cb = make(lambda h, i: io_callback(noop, None, h))
    debug_cb = make(lambda h, i: jax.debug.callback(noop, h))
    # Recorder.step: the platform's default, and with both_step_ways each way by name.
    ways: dict[str, bool | None] = {"": None}
    if both_step_ways:
        ways.update({", outputs=True": True, ", outputs=False": False})
    by_step = {way: (stepped(f"s{i}", outputs), stepped(f"s{i}_10", outputs, every=10),
                     stepped(f"s{i}_stats", outputs, reduce="stats"))
               for i, (way, outputs) in enumerate(ways.items())}

    def train(step: Callable, fetch: str | None = None, settle: str | None = None
              ) -> Callable[[], float]:
        def go() -> float:
            w, prev = w0, None
            t0 = time.perf_counter()
            for i in range(steps):
                w, h = step(w, xs, i)
                if fetch == "device_get":
                    jax.device_get(h)
                elif fetch == "copy_to_host_async":
                    h.copy_to_host_async()
                    if prev is not None:
                        np.asarray(prev)
                    prev = h
            if prev is not None:
                np.asarray(prev)
            jax.block_until_ready(w)
            if settle == "barrier":
                hcb.barrier_wait()
            elif settle == "flush":
                rec.flush()
            return (time.perf_counter() - t0) / steps
        return go

    h4 = jnp.ones((size, size), jnp.float32)

    def one_copy() -> float:
        fresh = h4 + 1
        fresh.block_until_ready()
        t0 = time.perf_counter()
        jax.device_get(fresh)
        return time.perf_counter() - t0

    cases = {
        "step": train(plain),
        "returned + device_get": train(plain, "device_get"),
        "returned + copy_to_host_async, overlapped": train(plain, "copy_to_host_async"),
        "one device_get of 4 MiB": one_copy,
        "hostfeed Recorder": train(recorded, settle="barrier"),
        "hostfeed Recorder, written to disk": train(recorded, settle="flush"),
        "hostfeed Recorder, every=10": train(every10, settle="barrier"),
        "hostfeed Recorder, reduce='stats'": train(stats, settle="barrier"),
    }
    for way, (each, ten, summary) in by_step.items():
        cases[f"rec.step{way}"] = train(each, settle="barrier")
        if not way:
            cases["rec.step, written to disk"] = train(each, settle="flush")
        cases[f"rec.step{way}, every=10"] = train(ten, settle="barrier")
        cases[f"rec.step{way}, reduce='stats'"] = train(summary, settle="barrier")
    cases["io_callback"] = train(io_cb)
    cases["debug.callback"] = train(debug_cb)
    cfg.progress(label)
    try:
        res = rounds(cases, cfg.n(2, 3))
    finally:
        rec.close()
    every = list(range(0, steps, 10))
    for name in ("h", *(f"s{i}" for i in range(len(ways)))):
        rows, meta = hostfeed.read_recording(f"{folder}/run.zarr", name)
        assert rows.shape[1:] == (size, size) and rows.shape[0] % steps == 0, rows.shape
        assert list(meta["step"][:steps]) == list(range(steps)), meta["step"][:steps]
        _, meta = hostfeed.read_recording(f"{folder}/run.zarr", f"{name}10" if name == "h"
                                          else f"{name}_10")
        assert list(meta["step"][:len(every)]) == every, meta["step"]
    out = {k: min(t) * 1e3 for k, t in res.items()}
    return {"steps": steps, "activation_bytes": size * size * 4, "ms": out,
            "rounds_ms": {k: [v * 1e3 for v in t] for k, t in res.items()},
            "rows_recorded": int(rows.shape[0])}
