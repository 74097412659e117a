"""What recording a transformer layer's activation costs the step that produces it: no
record, ``reduce="stats"``, a histogram, a raw record, and a raw record every 10th step,
side by side in one run; then how fast a recording reads back as training data.

The step: ``h = gelu(x @ w)`` with ``x`` float32[8, 512, 1024] and ``w`` [1024, 1024] (the
activation ``h`` is float32[8, 512, 1024], 16 MiB), jitted, ``STEPS`` steps in a Python
loop, each waited for and timed; then ``rec.close()`` (every row written), timed. The
machine is shared and noisy (the same step takes 20 or 33 ms from one stretch to the next,
more than a summary adds), so the summaries run step by step in turn with the step without
recording, each step's added time taken against the step without recording of the same
turn; the raw records (whose writes go on after a step and would slow the next case's)
round by round, against the step without recording of those rounds. Each case's added
cost per step is that median plus its median close over the round's steps. The record is
also timed alone, of the activation already computed, the cases called in turn and each
call's added time taken against the call without recording just before it (and
``hostfeed.Stats(dtype=jnp.float8_e4m3fn)``: the statistics with a cast's underflows and
overflows).

Reading back: 1 GiB of rows float32[512, 1024] recorded into DIR, then read whole by
zarr-python (``arr[:]``), by ``open_recording(...).iter_batches`` (batches of 4096 tokens,
``flatten_axes=1``) in order and shuffled, and by numpy reading each chunk file (the
floor: the disk's sequential read, no decoding); from a directory on a disk, as root, the
page cache is dropped before each case, so every case reads from the disk itself.

Run: python benches/summaries.py [DIR ...]   (default /dev/shm and a directory on the
working disk, /work/tmp or $HOSTFEED_BENCH_DISK)
Environment: HOSTFEED_BENCH_REPEATS (default 5), HOSTFEED_BENCH_STEPS (default 20).
"""
from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import hostfeed

REPEATS = int(os.environ.get("HOSTFEED_BENCH_REPEATS", 5))
STEPS = int(os.environ.get("HOSTFEED_BENCH_STEPS", 20))
SHAPE = (8, 512, 1024)


def case(kind: str) -> Callable[[str], tuple[Callable[[int], float], Callable[[], float]]]:
    """A case: set up a recorder (if any) and a compiled step in ``d``; return the timed
    step (of a step number) and the timed close."""
    def setup(d: str) -> tuple[Callable[[int], float], Callable[[], float]]:
        rng = np.random.default_rng(0)
        x = jnp.asarray(rng.normal(size=SHAPE).astype(np.float32))
        w = jnp.asarray(rng.normal(size=SHAPE[-1:] * 2).astype(np.float32) / 32)
        rec = None if kind == "no record" else hostfeed.Recorder(os.path.join(d, "r.zarr"))

        def step(x, w, s):
            h = jax.nn.gelu(x @ w)
            if kind == "stats":
                rec.record("h", h, step=s, reduce="stats")
            elif kind == "histogram":
                rec.record("h", h, step=s, reduce=hostfeed.Histogram(64, "log"))
            elif kind == "raw":
                h = rec.record("h", h, step=s)
            elif kind == "raw, every 10th":
                h = rec.record("h", h, step=s, every=10)
            return h

        f = jax.jit(step)
        f(x, w, 0).block_until_ready()  # compiled, not timed
        if rec is not None:
            rec.flush()

        def one(s: int) -> float:
            t0 = time.perf_counter()
            f(x, w, s).block_until_ready()
            return time.perf_counter() - t0

        def close() -> float:
            t0 = time.perf_counter()
            if rec is not None:
                rec.close()
            return time.perf_counter() - t0
        return one, close
    return setup


def _can_drop_caches() -> bool:
    return os.access("/proc/sys/vm/drop_caches", os.W_OK)


def _drop_caches() -> None:
    """Empties the page cache (root only), so that reads come from the disk."""
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def read_back(base: str, mb: int = 1024) -> None:
    """Reading a recording back: hostfeed's iter_batches (in order, and shuffled across
    rows and tokens) against zarr-python reading the whole array and the floor (each chunk
    file read with numpy, in order); GB/s and ratios, medians over rounds."""
    import glob

    import zarr
    shape = (512, 1024)  # float32 rows of 2 MiB: [sequence, d]
    n = mb * (1 << 20) // (4 * shape[0] * shape[1])
    d = tempfile.mkdtemp(prefix="hfread-", dir=base)
    path = os.path.join(d, "r.zarr")
    try:
        x = jnp.asarray(np.random.default_rng(0).normal(size=shape).astype(np.float32))
        with hostfeed.Recorder(path) as rec:
            f = jax.jit(lambda x, s: rec.record("h", x + s, step=s))
            for s in range(n):
                f(x, s)
        nbytes = n * 4 * shape[0] * shape[1]
        chunks = sorted(glob.glob(os.path.join(path, "h", "c", "*", "*", "*")),
                        key=lambda p: int(p.split(os.sep)[-3]))

        def floor() -> None:
            for c in chunks:
                np.fromfile(c, np.uint8)

        def zarr_python() -> None:
            np.asarray(zarr.open_array(os.path.join(path, "h"), mode="r")[:])

        def batches(**kw: Any) -> Callable[[], None]:
            def run() -> None:
                for _ in hostfeed.open_recording(path).iter_batches("h", 4096, **kw):
                    pass
            return run

        cases = {"floor: np.fromfile per chunk": floor, "zarr-python arr[:]": zarr_python,
                 "iter_batches, in order": batches(shuffle=False, flatten_axes=1),
                 "iter_batches, shuffled": batches(shuffle=True, flatten_axes=1)}
        times: dict[str, list[float]] = {k: [] for k in cases}
        cold = _can_drop_caches() and not base.startswith("/dev/shm")
        for r in range(REPEATS + 1):
            for k, run in cases.items():
                if cold:
                    _drop_caches()
                t0 = time.perf_counter()
                run()
                if r:
                    times[k].append(time.perf_counter() - t0)
        med = {k: statistics.median(v) for k, v in times.items()}
        print(f"\nreading back {nbytes / 2**30:.2f} GiB ({n} rows of float32{list(shape)}, "
              f"16 MiB chunks) from {base}" + (" (page cache dropped before each case)"
                                               if cold else "") +
              f", batches of 4096 tokens, median of {REPEATS}")
        print(f"  {'case':<32}{'GB/s':>8}{'range':>15}{'vs floor':>10}{'vs zarr-python':>16}")
        floor_t = med["floor: np.fromfile per chunk"]
        for k, v in times.items():
            print(f"  {k:<32}{nbytes / med[k] / 1e9:>8.2f}{nbytes / max(v) / 1e9:>7.2f}-"
                  f"{nbytes / min(v) / 1e9:<7.2f}{floor_t / med[k]:>9.2f}x"
                  f"{med['zarr-python arr[:]'] / med[k]:>15.2f}x")
    finally:
        shutil.rmtree(d, ignore_errors=True)


def in_step(base: str, kinds: list[str]) -> float:
    """The cases in the step. The summaries (rows of a few bytes) step by step with the step
    without recording, each step's added time taken against the step without recording of
    the same turn (paired: a slow stretch of the machine slows both); the raw records round
    by round (their writes, going on after a step, would slow the next case's step), their
    added time against the median step without recording of those rounds."""
    steps: dict[str, list[float]] = {k: [] for k in kinds}
    closes: dict[str, list[float]] = {k: [] for k in kinds}
    paired: dict[str, list[float]] = {}
    summaries = kinds[:3]
    rounds = [kinds[0], *kinds[3:]]
    for r in range(REPEATS + 1):  # round 0 warms up
        dirs = {k: tempfile.mkdtemp(prefix="hfsum-", dir=base) for k in summaries}
        try:
            cases = {k: case(k)(dirs[k]) for k in summaries}
            turns = [[cases[k][0](s) for k in summaries] for s in range(1, STEPS + 1)]
            done = {k: cases[k][1]() for k in summaries}
        finally:
            for d in dirs.values():
                shutil.rmtree(d, ignore_errors=True)
        if r:
            for i, k in enumerate(summaries):
                paired.setdefault(k, []).extend(t[i] - t[0] for t in turns)
                closes[k].append(done[k])
        # Each round of the raw records starts with another case (the first of a round runs
        # just after the last round's writes and removals).
        for k in rounds[r % len(rounds):] + rounds[:r % len(rounds)]:
            d = tempfile.mkdtemp(prefix="hfsum-", dir=base)
            try:
                one, close = case(k)(d)
                times = [one(s) for s in range(1, STEPS + 1)]
                ended = close()
                if r:
                    steps[k] += times
                    if k != kinds[0]:
                        closes[k].append(ended)
            finally:
                shutil.rmtree(d, ignore_errors=True)
    base_t = statistics.median(steps[kinds[0]])
    added = {k: statistics.median(paired[k]) for k in summaries}
    added.update({k: statistics.median(steps[k]) - base_t for k in rounds})
    added = {k: v + (statistics.median(closes[k]) / STEPS if closes[k] else 0.0)
             for k, v in added.items()}
    print(f"jax {jax.__version__}, hostfeed {hostfeed.__version__}, {os.cpu_count()} cpus, "
          f"{REPEATS} rounds of {STEPS} steps; h = gelu(x @ w), float32{list(SHAPE)} "
          f"(16 MiB), recorded to {base}; added per step: summaries paired step by step with "
          f"the step without recording, raw records round by round; each plus its median "
          f"close over the round's steps")
    print(f"  {'case':<18}{'added ms':>10}{'quartiles':>18}{'close ms':>10}"
          f"{'vs step':>9}{'vs raw':>9}")
    print(f"  {kinds[0]:<18}{'step':>10}{'':>18}{'':>10}{base_t * 1e3:>8.2f} ms")
    for k in kinds[1:]:
        spread = (f"{statistics.quantiles(paired[k], n=4)[0] * 1e3:>8.2f}-"
                  f"{statistics.quantiles(paired[k], n=4)[2] * 1e3:<9.2f}"
                  if k in paired else " " * 18)
        print(f"  {k:<18}{added[k] * 1e3:>10.3f}{spread}"
              f"{statistics.median(closes[k]) * 1e3:>10.2f}{added[k] / base_t:>8.1%}"
              f"{added[k] / added['raw']:>8.2f}x")
    return base_t


def alone(base: str, step: float, calls: int = 200) -> None:
    """The record by itself, of an activation already computed: a jitted function of ``h``
    and the step that records it (stats, histogram) or returns ``h`` (nothing), the cases
    called in turn, each call waited for; the added time of a call is taken against the
    call without recording just before it. The raw record, whose writes go on after the
    call, is timed over ``STEPS`` calls and its close, against as many calls without
    recording. ``step``: the step without recording, for the fraction of it each costs."""
    h = jax.jit(lambda x, w: jax.nn.gelu(x @ w))(
        jnp.asarray(np.random.default_rng(0).normal(size=SHAPE).astype(np.float32)),
        jnp.asarray(np.random.default_rng(1).normal(size=SHAPE[-1:] * 2).astype(np.float32)
                    / 32)).block_until_ready()
    d = tempfile.mkdtemp(prefix="hfsum-", dir=base)
    try:
        rec = hostfeed.Recorder(os.path.join(d, "r.zarr"))
        e4m3 = hostfeed.Stats(dtype=jnp.float8_e4m3fn)
        fs = {"nothing": jax.jit(lambda h, s: h),
              "stats": jax.jit(lambda h, s: (rec.record("s", h, step=s, reduce="stats"), h)[1]),
              "stats vs e4m3fn": jax.jit(lambda h, s: (rec.record(
                  "c", h, step=s, reduce=e4m3), h)[1]),
              "histogram": jax.jit(lambda h, s: (rec.record(
                  "g", h, step=s, reduce=hostfeed.Histogram(64, "log")), h)[1])}
        times: dict[str, list[float]] = {k: [] for k in fs}
        for i in range(calls + 10):  # 10 calls warm up
            for k, f in fs.items():
                t0 = time.perf_counter()
                f(h, i).block_until_ready()
                if i >= 10:
                    times[k].append(time.perf_counter() - t0)
        rec.close()
        raw_rounds = []
        for r in range(REPEATS + 1):
            rrec = hostfeed.Recorder(os.path.join(d, f"raw{r}.zarr"))
            f = jax.jit(lambda h, s: rrec.record("h", h, step=s))
            f(h, 0).block_until_ready()
            rrec.flush()
            t0 = time.perf_counter()
            for i in range(1, STEPS + 1):
                f(h, i).block_until_ready()
            rrec.close()
            t_raw = time.perf_counter() - t0
            t0 = time.perf_counter()
            for i in range(1, STEPS + 1):
                fs["nothing"](h, i).block_until_ready()
            if r:
                raw_rounds.append((t_raw - (time.perf_counter() - t0)) / STEPS)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    added = {k: statistics.median([a - b for a, b in zip(times[k], times["nothing"])])
             for k in fs if k != "nothing"}
    raw = statistics.median(raw_rounds)
    print(f"\nthe record alone, of h = float32{list(SHAPE)} already computed: added ms per "
          f"record (median of {calls} calls, each against the call without recording just "
          f"before it; raw: {REPEATS} rounds of {STEPS} records and the close); vs step: "
          f"against the median step without recording above ({step * 1e3:.2f} ms)")
    print(f"  {'case':<18}{'added ms':>10}{'vs step':>9}{'vs raw':>9}")
    for k, v in [*added.items(), ("raw", raw)]:
        print(f"  {k:<18}{v * 1e3:>10.3f}{v / step:>8.1%} {v / raw:>7.2f}x")


def main() -> None:
    dirs = sys.argv[1:] or ["/dev/shm", os.environ.get("HOSTFEED_BENCH_DISK", "/work/tmp")]
    for d in dirs:
        os.makedirs(d, exist_ok=True)
    base = dirs[0]
    kinds = ["no record", "stats", "histogram", "raw", "raw, every 10th"]
    hostfeed.start_receiver(max_queue_byte_size=1 << 30)
    step = in_step(base, kinds)
    alone(base, step)
    for d in dirs:
        read_back(d)


if __name__ == "__main__":
    main()
