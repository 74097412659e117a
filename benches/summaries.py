"""What recording a transformer layer's activation costs the step that produces it: no
record, ``reduce="stats"``, a histogram, a raw record, and a raw record every 10th step,
side by side in one run.

The step: ``h = gelu(x @ w)`` with ``x`` float32[8, 512, 1024] and ``w`` [1024, 1024] (the
activation ``h`` is float32[8, 512, 1024], 16 MiB), jitted, ``STEPS`` steps in a Python
loop, each waited for; then ``rec.flush()`` (every row written and announced), all timed
together, per step. Rounds interleave the cases (the machine is shared and noisy); the
table shows the median and the range over rounds, and each case's time against the step
without recording and against the raw record.

Run: python benches/summaries.py [DIR]   (default /dev/shm)
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

import jax
import jax.numpy as jnp
import numpy as np

import hostfeed

REPEATS = int(os.environ.get("HOSTFEED_BENCH_REPEATS", 5))
STEPS = int(os.environ.get("HOSTFEED_BENCH_STEPS", 20))
SHAPE = (8, 512, 1024)


def case(kind: str) -> Callable[[str], Callable[[], None]]:
    """A case: set up a recorder (if any) and a compiled step in ``d``; return the timed
    run."""
    def setup(d: str) -> Callable[[], None]:
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

        def run() -> None:
            for s in range(1, STEPS + 1):
                f(x, w, s).block_until_ready()
            if rec is not None:
                rec.close()
        return run
    return setup


def main() -> None:
    base = sys.argv[1] if len(sys.argv) > 1 else "/dev/shm"
    kinds = ["no record", "stats", "histogram", "raw", "raw, every 10th"]
    times: dict[str, list[float]] = {k: [] for k in kinds}
    hostfeed.start_receiver(max_queue_byte_size=1 << 30)
    for r in range(REPEATS + 1):  # round 0 warms up
        for k in kinds:
            d = tempfile.mkdtemp(prefix="hfsum-", dir=base)
            try:
                run = case(k)(d)
                t0 = time.perf_counter()
                run()
                if r:
                    times[k].append((time.perf_counter() - t0) / STEPS)
            finally:
                shutil.rmtree(d, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    base_t, raw_t = med["no record"], med["raw"]
    print(f"jax {jax.__version__}, hostfeed {hostfeed.__version__}, {os.cpu_count()} cpus, "
          f"{REPEATS} rounds of {STEPS} steps; h = gelu(x @ w), float32{list(SHAPE)} "
          f"(16 MiB), recorded to {base}")
    print(f"  {'case':<18}{'ms/step':>9}{'range':>16}{'added ms':>10}{'vs step':>9}"
          f"{'added vs raw':>14}")
    for k, v in times.items():
        added = med[k] - base_t
        rel = f"{added / (raw_t - base_t):>13.2f}x" if k != "no record" else ""
        print(f"  {k:<18}{med[k] * 1e3:>9.2f}{min(v) * 1e3:>8.2f}-{max(v) * 1e3:<7.2f}"
              f"{added * 1e3:>10.2f}{med[k] / base_t:>8.2f}x{rel}")


if __name__ == "__main__":
    main()
