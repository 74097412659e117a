"""How fast a whole recording is drawn (``python -m hostfeed show``) and exported to
TensorBoard (``hostfeed.to_tensorboard``).

The store: a model of ``LAYERS`` layers trained ``STEPS`` steps, each layer recording its
activation's statistics (``blocks.L/output``, ``reduce="stats"``) at every step and a
histogram of 32 bins every 10th step (``blocks.L/output.hist``), and the ``loss``: 97
arrays, 538,000 rows for 48 x 10,000 (the default). It is recorded once by a jitted
``lax.scan`` and kept in DIR.

Timed: ``show``'s whole work (open, read every array, draw the grid, write the PNG) in a
fresh process, as a user runs it (the wall time and the process's CPU time; the machine is
shared, the CPU time is the steadier figure), beside the process that only imports
hostfeed (and JAX) and prints its help; the HTML page likewise; the export of the
statistics and histograms of 11 layers to TensorBoard event files, in rows per second.

Run: python benches/show.py [DIR]   (default /tmp/hostfeed-show-bench)
Environment: HOSTFEED_BENCH_LAYERS (48), HOSTFEED_BENCH_STEPS (10000).
"""
from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

LAYERS = int(os.environ.get("HOSTFEED_BENCH_LAYERS", 48))
STEPS = int(os.environ.get("HOSTFEED_BENCH_STEPS", 10_000))


def record(path: str) -> None:
    """The store of LAYERS layers over STEPS steps."""
    import jax
    import jax.numpy as jnp
    import hostfeed

    with hostfeed.Recorder(path, mode="w") as rec:
        def loss(x, w, s):
            for layer in range(LAYERS):
                x = jnp.tanh(x * w[layer])
                x = rec.record(f"blocks.{layer}/output", x, step=s, reduce="stats")
                rec.record(f"blocks.{layer}/output.hist", x, step=s, every=10,
                           reduce=hostfeed.Histogram(32, (-1.0, 1.0)))
            return jnp.mean(x ** 2)

        def body(w, s):
            value, g = jax.value_and_grad(loss, argnums=1)(jnp.linspace(-2, 2, 256), w, s)
            rec.record("loss", value, step=s)
            return w - 0.5 * g, None

        run = jax.jit(lambda w: jax.lax.scan(body, w, jnp.arange(STEPS))[0])
        run(jnp.linspace(0.5, 1.5, LAYERS)).block_until_ready()


def timed(args: list[str]) -> tuple[float, float]:
    """Runs ``python -m hostfeed ARGS`` in a fresh process: its wall and CPU seconds."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "hostfeed", *args], check=True,
                   stdout=subprocess.DEVNULL, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> int:
    folder = sys.argv[1] if len(sys.argv) > 1 else os.path.join(tempfile.gettempdir(),
                                                               "hostfeed-show-bench")
    store = os.path.join(folder, f"run-{LAYERS}x{STEPS}.zarr")
    os.makedirs(folder, exist_ok=True)
    if not os.path.exists(os.path.join(store, "loss")):
        start = time.perf_counter()
        record(store)
        print(f"recorded {store} in {time.perf_counter() - start:.0f} s")
    import hostfeed
    rec = hostfeed.open_recording(store)
    rows = sum(len(rec[n]) for n in rec.names)
    print(f"{store}: {len(rec.names)} arrays, {rows:,} rows; {os.cpu_count()} CPUs")
    wall, cpu = timed(["show", "--help"])
    print(f"python -m hostfeed show --help (importing hostfeed and JAX): {wall:.1f} s wall, "
          f"{cpu:.1f} s CPU")
    for out in ("grid.png", "grid.html"):
        path = os.path.join(folder, out)
        wall, cpu = timed(["show", store, "-o", path])
        print(f"show -o {out}: {wall:.1f} s wall, {cpu:.1f} s CPU "
              f"({os.path.getsize(path) / 2**20:.1f} MiB)")
    logdir = os.path.join(folder, "tb")
    shutil.rmtree(logdir, ignore_errors=True)
    start, cpu0 = time.perf_counter(), time.process_time()
    exported = hostfeed.to_tensorboard(store, logdir, ["blocks.1*", "loss"])
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu0
    n = sum(exported.values())
    size = sum(os.path.getsize(os.path.join(logdir, f)) for f in os.listdir(logdir))
    print(f"to_tensorboard of {len(exported)} arrays ({n:,} rows): {wall:.1f} s wall, "
          f"{cpu:.1f} s CPU: {n / wall:,.0f} rows/s ({n / cpu:,.0f} a CPU-second; "
          f"{size / 2**20:.1f} MiB of events)")
    return 0


if __name__ == "__main__":
    np.seterr(all="ignore")
    sys.exit(main())
