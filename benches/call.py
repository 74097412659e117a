"""Round-trip cost of host calls: N_CALLS calls of float32[4] -> float32[4] in a jitted
fori_loop, hostfeed's hcb.call vs jax.pure_callback and jax.experimental.io_callback (both
with results), side by side in one run.

Run: python benches/call.py   (prints us per call and ratios)
"""
from __future__ import annotations

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import io_callback

sys.path.insert(0, os.path.dirname(__file__))
from _harness import interleaved, table

import hostfeed
from hostfeed import host_callback as hcb

N_CALLS = int(os.environ.get("HOSTFEED_BENCH_N_CALLS", 2000))
REPEATS = int(os.environ.get("HOSTFEED_BENCH_REPEATS", 5))


def host(x):
    return x + np.float32(1)


def make(kind: str):
    spec = jax.ShapeDtypeStruct((4,), jnp.float32)
    if kind == "hostfeed call":
        step = lambda c: hcb.call(host, c, result_shape=spec)
    elif kind == "pure_callback":
        step = lambda c: jax.pure_callback(host, spec, c)
    elif kind == "io_callback(ordered)":
        step = lambda c: io_callback(host, spec, c, ordered=True)
    elif kind == "io_callback":
        step = lambda c: io_callback(host, spec, c)
    else:
        raise ValueError(kind)
    f = jax.jit(lambda x: lax.fori_loop(0, N_CALLS, lambda i, c: step(c), x))
    x = jnp.zeros(4, jnp.float32)

    def go():
        out = f(x)
        assert float(out[0]) == N_CALLS  # every call ran and returned its result
    return go


def main() -> None:
    print(f"jax {jax.__version__}, hostfeed {hostfeed.__version__}, {os.cpu_count()} cpus")
    kinds = ["hostfeed call", "pure_callback", "io_callback", "io_callback(ordered)"]
    res = interleaved({k: make(k) for k in kinds}, repeats=REPEATS)
    rows = [(k, res[k]["min"] / N_CALLS * 1e6, "us/call") for k in kinds]
    print(table(f"round trip: {N_CALLS} calls float32[4] -> float32[4] (min of {REPEATS})",
                rows, baseline="io_callback", higher_is_better=False))


if __name__ == "__main__":
    main()
