"""Tap throughput: hostfeed vs jax.experimental.io_callback(ordered=True), jax.debug.callback
and a numpy copy of the same bytes, side by side in one run.

* small: per-tap cost of N_SMALL taps of float32[4] inside one jitted fori_loop, end to end
  (from the call until every callback has run: barrier_wait / effects_barrier).
* large: GB/s of N_LARGE taps of a 4 MB float32 array, end to end.

The numpy rows copy the same bytes on the host: "numpy copy" frees each copy at once (the
allocator hands the same, cache-hot block back every time); "numpy copy, 2 live" keeps the
previous copy alive, as any pipeline does where the device produces tap k+1 while the host
still holds tap k.

Run: python benches/taps.py   (prints absolute numbers and ratios)
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

N_SMALL = int(os.environ.get("HOSTFEED_BENCH_N_SMALL", 10_000))
N_LARGE = int(os.environ.get("HOSTFEED_BENCH_N_LARGE", 100))
LARGE_ELEMS = 1 << 20  # float32 -> 4 MiB
REPEATS = int(os.environ.get("HOSTFEED_BENCH_REPEATS", 5))


class Sink:
    """A callback that counts calls and bytes (touches no data, like a logger's enqueue)."""

    def __init__(self) -> None:
        self.calls = 0
        self.nbytes = 0

    def tap(self, x, transforms=None, **kw):
        self.calls += 1
        self.nbytes += x.nbytes

    def io(self, x):
        self.calls += 1
        self.nbytes += np.asarray(x).nbytes


def make_loop(n: int, emit):
    # The tapped array is loop-invariant and the loop carries only a counter, so the
    # computation does nothing but the n taps: no array flows in and out of the loop (its
    # copies and fresh output buffers would be charged to every variant alike and blur
    # the comparison of the taps themselves).
    @jax.jit
    def f(x):
        def body(i, count):
            emit(x)
            return count + 1
        return lax.fori_loop(0, n, body, 0)
    return f


def run(n: int, x, kind: str, sink: Sink):
    if kind == "hostfeed":
        f = make_loop(n, lambda c: hcb.id_tap(sink.tap, c))
        def go():
            f(x).block_until_ready()
            hcb.barrier_wait()
    elif kind == "io_callback(ordered)":
        f = make_loop(n, lambda c: io_callback(sink.io, None, c, ordered=True))
        def go():
            f(x).block_until_ready()
            jax.effects_barrier()
    elif kind == "debug.callback":
        f = make_loop(n, lambda c: jax.debug.callback(sink.io, c))
        def go():
            f(x).block_until_ready()
            jax.effects_barrier()
    else:
        raise ValueError(kind)
    return go


def numpy_copy(n: int, x: np.ndarray, sink: Sink):
    """The floor: copy the same bytes, freeing each copy at once (the destination stays
    cache-hot because the allocator hands the same block back every time)."""
    def go():
        for _ in range(n):
            sink.tap(np.array(x, copy=True))
    return go


def numpy_copy_pipelined(n: int, x: np.ndarray, sink: Sink):
    """The same copies, but each one is kept until the next is made, as in any pipeline
    where the device produces tap k+1 while the host still holds tap k."""
    def go():
        prev = None
        for _ in range(n):
            cur = np.array(x, copy=True)
            sink.tap(cur)
            prev = cur
        del prev
    return go


def main() -> None:
    print(f"jax {jax.__version__}, hostfeed {hostfeed.__version__}, "
          f"{os.cpu_count()} cpus, backend {jax.default_backend()}")
    kinds = ["hostfeed", "io_callback(ordered)", "debug.callback"]

    small = jnp.arange(4, dtype=jnp.float32)
    sinks = {k: Sink() for k in kinds + ["numpy copy"]}
    cases = {k: run(N_SMALL, small, k, sinks[k]) for k in kinds}
    cases["numpy copy"] = numpy_copy(N_SMALL, np.asarray(small), sinks["numpy copy"])
    res = interleaved(cases, repeats=REPEATS)
    for k, s in sinks.items():
        assert s.calls == N_SMALL * (REPEATS + 1), (k, s.calls)
    rows = [(k, res[k]["min"] / N_SMALL * 1e6, "us/tap") for k in cases]
    print(table(f"small taps: {N_SMALL} x float32[4], end to end (min of {REPEATS})",
                rows, baseline="io_callback(ordered)", higher_is_better=False))

    big = jnp.arange(LARGE_ELEMS, dtype=jnp.float32)
    sinks = {k: Sink() for k in kinds + ["numpy copy"]}
    cases = {k: run(N_LARGE, big, k, sinks[k]) for k in kinds}
    cases["numpy copy"] = numpy_copy(N_LARGE, np.asarray(big), sinks["numpy copy"])
    sinks["numpy copy, 2 live"] = Sink()
    cases["numpy copy, 2 live"] = numpy_copy_pipelined(N_LARGE, np.asarray(big),
                                                       sinks["numpy copy, 2 live"])
    res = interleaved(cases, repeats=REPEATS)
    total = N_LARGE * LARGE_ELEMS * 4
    for k, s in sinks.items():
        assert s.nbytes == total * (REPEATS + 1), (k, s.nbytes)
    rows = [(k, total / res[k]["min"] / 1e9, "GB/s") for k in cases]
    print(table(f"large taps: {N_LARGE} x 4 MiB, end to end (min of {REPEATS})",
                rows, baseline="numpy copy", higher_is_better=True))
    print("receiver:", hostfeed.receiver_stats())


if __name__ == "__main__":
    main()
