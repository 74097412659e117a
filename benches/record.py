"""Recording activations to disk: hostfeed.Recorder vs what a user would write otherwise,
side by side in one run, with the floor.

Cases, each writing the same rows into a fresh directory:

* ``Recorder``: ``rec.record("layer/h", h)`` in a jitted loop, then ``rec.flush()`` (every
  row written and announced in the Zarr metadata). Also with ``compression="zstd"``.
* ``tap + zarr append``: ``hcb.id_tap`` whose function appends the row to a zarr-python
  array (chunks of one row, no compression: the fastest zarr-python setup for appends).
* ``tap + np.save``: ``hcb.id_tap`` whose function ``np.save``s each row to its own file.
* ``debug.callback + np.save``: the same with ``jax.debug.callback`` (runs on the device's
  thread, which waits for it).
* ``floor``: the same bytes written by one ``numpy.ndarray.tofile`` per row into the same
  directory, no JAX (and, for small rows, ``one tofile`` of all rows at once).
* steps: a Python loop calling a jitted step that records one row each call, as a training
  loop does: ``rec.step(step)`` (on a CPU the records stay inside the computation, as in
  ``jax.jit(step)``), ``rec.step(step, outputs=True)`` (they leave as outputs, the TPU's
  way) and ``jax.jit(step)``, large rows and small, with the ratio of the first to the last.

Timed end to end: from calling the compiled function until the rows are on disk (in the
page cache: nobody fsyncs) and, for the Recorder, announced. Compilation (the warm-up round,
and for the Recorder, whose records are bound to one store, an ahead-of-time compile in the
set-up) and directory set-up are not timed; ``os.sync()`` runs before each timed case so
that earlier cases' write-back does not throttle it. Rounds interleave the cases; the
table shows medians (and the best round), ratios to the floor, and each round's ratio to
that round's floor (its range).

A second table compares the device-side cost per record with a plain tap: the time until
the computation returns (``block_until_ready``), with a queue bound large enough that
neither waits for the host, after warm-up rounds until hostfeed's buffer pool stops
growing (it fills over the first bursts; fresh memory costs about 1 ms per 4 MiB in page
faults on a VM). For
large rows it adds what holding rows costs the copy itself: numpy copies into one buffer
(what a no-op tap gets: its buffer comes back warm from the pool) and into as many
buffers as rows (what a recorder needs: it keeps rows until they are written).

Large rows also go through the Recorder sharded (``shard_bytes``, 256 MiB shards of the
16 MiB chunks, one file per shard), beside the unsharded Recorder, and through zarrs (the
Rust Zarr implementation, via its zarr-python codec pipeline) into the same sharded
layout, all rows in one call from host memory.

``--s3 [MB]`` writes MB (default 1024) of the large rows to an S3 server started on
127.0.0.1 (s3s-fs when its binary is on PATH or in ``$S3S_FS``, else moto in a process of
its own; ``--s3-server moto`` chooses), side by side: the Recorder (sharded and not,
from a jitted loop, until flushed and closed) against tensorstore's ``zarr3`` driver with
sharding, zarrs (the Rust implementation, through its zarr-python codec pipeline) and
zarr-python, all sharded alike, each writing all rows from host memory in one call (their
fastest use, no JAX). Printed: GB/s, objects per GiB, objects written per
second, and ratios to tensorstore. Each case's bucket is removed after it is measured
(moto keeps objects in temporary files: rounds of GiB-sized cases would fill the disk).

A third mode, ``--names [N]``, checks that a new name costs the same however many came
before: N distinct names (default 10,000) into one store, recorded eagerly
(``rec.record(name, x)``) and from jitted functions that each record 100 new names, with a
flush after every 1000; it prints the cost per 1000 names of each block and the ratio of
the last block to the first.

Run: python benches/record.py [--device-only | --names [N] | --s3 [MB]] [DIR ...]
(default: /dev/shm and a directory under /work or the system temp dir; --device-only: the
second table only).
Environment: HOSTFEED_BENCH_REPEATS (default 5), HOSTFEED_BENCH_LARGE_MB (default 1024),
HOSTFEED_BENCH_SMALL_ROWS (default 10000).
"""
from __future__ import annotations

import argparse
import importlib.util
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
from jax import lax

import hostfeed
from hostfeed import host_callback as hcb

hcb.set_sync_taps(False)  # the tap rows: asynchronous taps (the default is synchronous)
REPEATS = int(os.environ.get("HOSTFEED_BENCH_REPEATS", 5))
LARGE_MB = int(os.environ.get("HOSTFEED_BENCH_LARGE_MB", 1024))
SMALL_ROWS = int(os.environ.get("HOSTFEED_BENCH_SMALL_ROWS", 10_000))
LARGE_SHAPE = (256, 4096)  # float32: 4 MiB per row, a real layer's activations
SMALL_SHAPE = (1024,)  # float32: 4 KiB per row


class Case:
    """``setup(dir)`` (untimed) returns ``run()`` (timed)."""

    def __init__(self, name: str, setup: Callable[[str], Callable[[], None]]):
        self.name = name
        self.setup = setup


def loop(n: int, emit: Callable) -> Callable:
    """A jitted loop that emits the loop-invariant ``x`` n times (no other work, so every
    variant is charged for its own cost only)."""
    @jax.jit
    def f(x):
        def body(i, c):
            emit(x, i)
            return c + 1
        return lax.fori_loop(0, n, body, 0)
    return f


def recorder_case(n: int, x: jax.Array, **options) -> Callable[[str], Callable[[], None]]:
    def setup(d: str) -> Callable[[], None]:
        rec = hostfeed.Recorder(os.path.join(d, "run.zarr"), **options)
        f = loop(n, lambda v, i: rec.record("layer/h", v, step=i)).lower(x).compile()

        def run() -> None:
            f(x)
            rec.flush()
            rec.close()
        return run
    return setup


def step_case(n: int, x: jax.Array, wrapped: bool, outputs: bool | None = None
              ) -> Callable[[str], Callable[[], None]]:
    """n calls of a jitted step that records a row derived from ``x`` (a training loop's
    shape): ``rec.step(step, outputs=...)`` (on a CPU by default the records stay inside;
    ``outputs=True`` takes them out as outputs) or ``jax.jit(step)`` (the records are host
    callbacks inside the computation), until flushed and closed."""
    def setup(d: str) -> Callable[[], None]:
        rec = hostfeed.Recorder(os.path.join(d, "run.zarr"))

        def step(v: jax.Array, i: jax.Array) -> jax.Array:
            rec.record("layer/h", v * 1.0, step=i)
            return i + 1

        f = rec.step(step, outputs=outputs) if wrapped else jax.jit(step)
        f(x, jnp.int32(0))  # compiled (and the first row recorded) outside the timing
        rec.flush()

        def run() -> None:
            i = jnp.int32(1)
            for _ in range(n):
                i = f(x, i)
            rec.flush()
            rec.close()
        return run
    return setup


def tap_zarr_case(n: int, x: jax.Array) -> Callable[[str], Callable[[], None]]:
    import zarr
    holder: dict = {}
    f = loop(n, lambda v, i: hcb.id_tap(lambda a, t: holder["arr"].append(a[None]), v))

    def setup(d: str) -> Callable[[], None]:
        holder["arr"] = zarr.create_array(os.path.join(d, "run.zarr"), shape=(0, *x.shape),
                                          chunks=(1, *x.shape), dtype=x.dtype,
                                          compressors=None)

        def run() -> None:
            f(x)
            hcb.barrier_wait()
        return run
    return setup


def np_save_case(n: int, x: jax.Array, kind: str) -> Callable[[str], Callable[[], None]]:
    holder = {"dir": "", "i": 0}

    def save(a, *unused) -> None:
        np.save(os.path.join(holder["dir"], f"h_{holder['i']:06d}.npy"), a)
        holder["i"] += 1

    if kind == "tap":
        f = loop(n, lambda v, i: hcb.id_tap(save, v))
    else:
        f = loop(n, lambda v, i: jax.debug.callback(save, v))

    def setup(d: str) -> Callable[[], None]:
        holder["dir"], holder["i"] = d, 0

        def run() -> None:
            f(x)
            if kind == "tap":
                hcb.barrier_wait()
            else:
                jax.effects_barrier()
        return run
    return setup


def zarrs_case(n: int, x: jax.Array, store: Callable[[str], object] = str
               ) -> Callable[[str], Callable[[], None]]:
    """zarrs, the Rust Zarr implementation (through its zarr-python codec pipeline), writing
    every row at once from host memory into a sharded array (16 MiB chunks, 256 MiB
    shards, as the sharded Recorder): its fastest use, no JAX."""
    import zarr
    rows = np.ascontiguousarray(np.broadcast_to(np.asarray(x), (n, *x.shape)))
    inner = (max(1, (16 << 20) // x.nbytes), *x.shape)
    shard = (max(1, (256 << 20) // x.nbytes), *x.shape)

    def setup(d: str) -> Callable[[], None]:
        with zarr.config.set({"codec_pipeline.path": "zarrs.ZarrsCodecPipeline"}):
            arr = zarr.create_array(store(os.path.join(d, "zarrs.zarr")), shape=rows.shape,
                                    dtype=rows.dtype, chunks=inner, shards=shard,
                                    compressors=None)

        def run() -> None:
            with zarr.config.set({"codec_pipeline.path": "zarrs.ZarrsCodecPipeline"}):
                arr[:] = rows
        return run
    return setup


def floor_case(n: int, x: jax.Array, one_file: bool = False
               ) -> Callable[[str], Callable[[], None]]:
    host = np.asarray(x)

    def setup(d: str) -> Callable[[], None]:
        block = np.tile(host, (n,) + (1,) * host.ndim) if one_file else None

        def run() -> None:
            if block is not None:
                block.tofile(os.path.join(d, "all.bin"))
            else:
                for i in range(n):
                    host.tofile(os.path.join(d, f"h_{i:06d}.bin"))
        return run
    return setup


def measure(base: str, cases: list[Case]) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {c.name: [] for c in cases}
    for r in range(REPEATS + 1):  # round 0 warms up
        for c in cases:
            d = tempfile.mkdtemp(prefix="hfbench-", dir=base)
            try:
                run = c.setup(d)
                os.sync()
                t0 = time.perf_counter()
                run()
                t = time.perf_counter() - t0
                if r:
                    times[c.name].append(t)
            finally:
                shutil.rmtree(d, ignore_errors=True)
    return times


def report(title: str, times: dict[str, list[float]], nbytes: int, n: int,
           floor: str) -> None:
    med = {k: statistics.median(v) for k, v in times.items()}
    best = {k: min(v) for k, v in times.items()}
    print(title)
    print(f"  {'case':<34}{'GB/s med':>10}{'best':>8}{'us/row':>10}{'vs floor':>10}"
          f"{'vs best Python':>16}  vs floor by round")
    python = [k for k in times if "np.save" in k or "zarr append" in k]
    best_python = min(med[k] for k in python) if python else None
    for k, case_times in times.items():
        gbs = nbytes / med[k] / 1e9
        ratio = med[floor] / med[k]
        # The rounds interleave the cases: each round's floor against the case's.
        rounds = [f / t for f, t in zip(times[floor], case_times)]
        vs_py = f"{best_python / med[k]:>15.2f}x" if best_python else f"{'':>16}"
        print(f"  {k:<34}{gbs:>10.3f}{nbytes / best[k] / 1e9:>8.3f}{med[k] / n * 1e6:>10.1f}"
              f"{ratio:>9.2f}x{vs_py}  {min(rounds):.2f}-{max(rounds):.2f}x")


def device_cost(n: int, x: jax.Array, d: str) -> None:
    """Time until the computation returns: a plain tap vs a record (no back-pressure)."""
    hostfeed.start_receiver(max_queue_byte_size=max(256_000_000, 4 * n * x.nbytes))
    rec = hostfeed.Recorder(tempfile.mkdtemp(prefix="device-", dir=d))
    count = [0]
    tap = loop(n, lambda v, i: hcb.id_tap(lambda a, t: count.__setitem__(0, count[0] + 1), v))
    record = loop(n, lambda v, i: rec.record("h", v))
    cases = {"plain tap (no-op function)": tap, "Recorder.record": record}
    # Compile, then repeat until hostfeed's buffer pool stops growing (steady state: each
    # burst of rows finds the buffers the previous one returned; at most 12 rounds).
    idle = -1
    for _ in range(12):
        for f in cases.values():
            f(x).block_until_ready()
            hcb.barrier_wait()
        now = hostfeed.receiver_stats()["buffer_pool_idle_bytes"]
        if now == idle:
            break
        idle = now
    times: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(REPEATS):
        for k, f in cases.items():
            t0 = time.perf_counter()
            f(x).block_until_ready()
            times[k].append(time.perf_counter() - t0)
            hcb.barrier_wait()
    rec.close()
    # What holding rows costs the copy itself: numpy copies of x into one buffer (a no-op
    # tap's buffer comes back warm from the pool) vs into n distinct buffers (a recorder
    # keeps its rows until written), pre-faulted, no JAX.
    src = np.asarray(x)
    held = [np.ones_like(src) for _ in range(n)] if x.nbytes >= 1 << 20 else []
    for k in ["numpy copy, one buffer", f"numpy copy, {n} buffers"] if held else []:
        times[k] = []
        for _ in range(REPEATS):
            t0 = time.perf_counter()
            for i in range(n):
                np.copyto(held[i if "buffers" in k else 0], src)
            times[k].append(time.perf_counter() - t0)
    base = statistics.median(times["plain tap (no-op function)"])
    print(f"device-side cost per record, {n} x {x.dtype}{list(x.shape)} "
          f"({x.nbytes} bytes), median of {REPEATS}")
    for k, v in times.items():
        m = statistics.median(v)
        print(f"  {k:<34}{m / n * 1e6:>10.2f} us/record{m / base:>10.2f}x of a tap")
    hostfeed.start_receiver(max_queue_byte_size=256_000_000)


def names_cost(n: int, base: str) -> None:
    """Seconds per 1000 new names, block by block (see the module documentation)."""
    x = jnp.arange(4, dtype=jnp.float32)
    for kind in ("eager", "jit, 100 names per function"):
        d = tempfile.mkdtemp(prefix="hfbench-names-", dir=base)
        try:
            rec = hostfeed.Recorder(os.path.join(d, "names.zarr"))
            per_block, cpu_block = [], []
            for block in range(n // 1000):
                t0, c0 = time.perf_counter(), time.process_time()
                for first in range(block * 1000, (block + 1) * 1000, 100):
                    names = [f"layer{i // 100}/n{i}" for i in range(first, first + 100)]
                    if kind == "eager":
                        for name in names:
                            rec.record(name, x)
                    else:
                        jax.jit(lambda v, names=names: [rec.record(m, v) for m in names])(x)
                rec.flush()
                per_block.append(time.perf_counter() - t0)
                cpu_block.append(time.process_time() - c0)
            rec.close()
        finally:
            shutil.rmtree(d, ignore_errors=True)
        for what, t in (("wall", per_block), ("cpu (all threads)", cpu_block)):
            blocks = " ".join(f"{v:.2f}" for v in t)
            print(f"{base}, {kind}, {what}: s per 1000 new names, block by block: {blocks}")
            print(f"  first {t[0]:.2f} s, last {t[-1]:.2f} s, last/first {t[-1] / t[0]:.2f}, "
                  f"all {sum(t):.1f} s for {n} names")


def s3_cost(mb: int, kind: str) -> None:
    """The S3 table (see the module documentation)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                    "python", "helpers"))
    from s3_server import S3Process  # the test suite's server launcher
    import tensorstore as ts
    import zarr
    import obstore.store

    if kind == "auto":
        kind = "s3s-fs" if S3Process.s3s_fs() else "moto"
    server = S3Process(kind)
    server.start()
    os.environ.update(server.env())
    x = jnp.asarray(np.random.default_rng(0).normal(size=LARGE_SHAPE).astype(np.float32))
    n = max(1, mb * (1 << 20) // x.nbytes)
    host = np.asarray(x)
    rows = np.broadcast_to(host, (n, *host.shape))
    inner, shard = (4, *host.shape), (64, *host.shape)  # 16 MiB chunks, 256 MiB shards
    where: dict[str, str] = {}

    def recorder(**options) -> Callable[[str], Callable[[], None]]:
        def setup(bucket: str) -> Callable[[], None]:
            where["bucket"], where["prefix"] = bucket, "run.zarr/"
            return recorder_case(n, x, **options)(f"s3://{bucket}")
        return setup

    def tensorstore(bucket: str) -> Callable[[], None]:
        where["bucket"], where["prefix"] = bucket, "ts.zarr/"
        spec = {"driver": "zarr3", "kvstore": {
                    "driver": "s3", "bucket": bucket, "path": "ts.zarr/",
                    "endpoint": server.endpoint, "aws_region": "us-east-1"},
                "metadata": {"shape": list(rows.shape), "data_type": "float32",
                             "chunk_grid": {"name": "regular",
                                            "configuration": {"chunk_shape": list(shard)}},
                             "codecs": [{"name": "sharding_indexed", "configuration": {
                                 "chunk_shape": list(inner), "codecs": [{"name": "bytes"}]}}]},
                "create": True}
        arr = ts.open(spec).result()
        return lambda: arr.write(rows).result()

    def zarr_python(bucket: str) -> Callable[[], None]:
        where["bucket"], where["prefix"] = bucket, "zp.zarr/"
        store = zarr.storage.ObjectStore(obstore.store.from_url(
            f"s3://{bucket}/zp.zarr", config={"endpoint": server.endpoint},
            client_options={"allow_http": True}))
        arr = zarr.create_array(store, shape=rows.shape, dtype="float32", chunks=inner,
                                shards=shard, compressors=None)
        return lambda: arr.__setitem__(slice(None), rows)

    def zarrs(bucket: str) -> Callable[[], None]:
        where["bucket"], where["prefix"] = bucket, "zarrs.zarr/"
        return zarrs_case(n, x, lambda path: zarr.storage.ObjectStore(obstore.store.from_url(
            f"s3://{bucket}/zarrs.zarr", config={"endpoint": server.endpoint},
            client_options={"allow_http": True})))(bucket)

    cases = {"Recorder, sharded 256 MiB": recorder(shard_bytes=256 << 20),
             "Recorder, unsharded": recorder(shard_bytes=0),
             "tensorstore zarr3, sharded": tensorstore,
             "zarrs, sharded": zarrs,
             "zarr-python, sharded": zarr_python}
    times: dict[str, list[float]] = {k: [] for k in cases}
    objects: dict[str, int] = {}
    hostfeed.start_receiver(max_queue_byte_size=1 << 30)  # room for a 256 MiB shard
    try:
        for r in range(REPEATS + 1):  # round 0 warms up
            for k, setup in cases.items():
                bucket = server.new_bucket()
                run = setup(bucket)
                t0 = time.perf_counter()
                run()
                t = time.perf_counter() - t0
                if r:
                    times[k].append(t)
                objects[k] = len(server.keys(where["bucket"], where["prefix"]))
                server.remove_bucket(bucket)  # 5 cases x 6 rounds x 1 GiB filled moto's disk
    finally:
        server.close()
        hostfeed.start_receiver(max_queue_byte_size=256_000_000)
    gib = rows.nbytes / 2**30
    base = statistics.median(times["tensorstore zarr3, sharded"])
    print(f"\nS3 ({kind} on 127.0.0.1): {n} rows of float32{list(LARGE_SHAPE)} ({gib:.2f} GiB), "
          f"median of {REPEATS}")
    print(f"  {'case':<30}{'GB/s med':>10}{'best':>8}{'objects/GiB':>13}{'objects/s':>11}"
          f"{'vs tensorstore':>16}")
    for k, v in times.items():
        med = statistics.median(v)
        print(f"  {k:<30}{rows.nbytes / med / 1e9:>10.3f}{rows.nbytes / min(v) / 1e9:>8.3f}"
              f"{objects[k] / gib:>13.0f}{objects[k] / med:>11.1f}{base / med:>15.2f}x")


def _arguments(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (``--help`` prints it; an unknown option is an error, never taken
    for a directory to write into)."""
    p = argparse.ArgumentParser(
        prog="benches/record.py", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--device-only", action="store_true",
                      help="the device-side cost table only")
    mode.add_argument("--names", type=int, nargs="?", const=10_000, metavar="N",
                      help="the cost of N new names (default 10,000)")
    mode.add_argument("--s3", type=int, nargs="?", const=1024, metavar="MB",
                      help="write MB (default 1024) to an S3 server on 127.0.0.1")
    p.add_argument("--s3-server", choices=("auto", "moto", "s3s-fs"), default="auto",
                   help="which S3 server --s3 starts (auto: s3s-fs when found, else moto)")
    p.add_argument("dirs", nargs="*", metavar="DIR",
                   help="directories to write into (default: /dev/shm and "
                        "$HOSTFEED_BENCH_DISK or /work/tmp)")
    args = p.parse_args(argv)
    if args.s3 is not None and args.dirs:
        p.error("--s3 writes to the S3 server: give no DIR")
    return args


def main() -> None:
    args = _arguments()
    if args.s3 is not None:
        print(f"jax {jax.__version__}, hostfeed {hostfeed.__version__}, {os.cpu_count()} cpus, "
              f"load {os.getloadavg()[0]:.1f}, {REPEATS} rounds")
        s3_cost(args.s3, args.s3_server)
        return
    device_only = args.device_only
    if args.names is not None:
        for base in args.dirs or ["/dev/shm"]:
            os.makedirs(base, exist_ok=True)
            names_cost(args.names, base)
        return
    dirs = args.dirs or ["/dev/shm", os.environ.get("HOSTFEED_BENCH_DISK", "/work/tmp")]
    print(f"jax {jax.__version__}, hostfeed {hostfeed.__version__}, {os.cpu_count()} cpus, "
          f"load {os.getloadavg()[0]:.1f}, {REPEATS} rounds")
    rng = np.random.default_rng(0)
    large = jnp.asarray(rng.normal(size=LARGE_SHAPE).astype(np.float32))
    small = jnp.asarray(rng.normal(size=SMALL_SHAPE).astype(np.float32))
    n_large = LARGE_MB * (1 << 20) // large.nbytes

    for base in [] if device_only else dirs:
        os.makedirs(base, exist_ok=True)
        large_cases = [
            Case("Recorder (2 writers)", recorder_case(n_large, large)),
            Case("Recorder, 1 writer", recorder_case(n_large, large, writers=1)),
            Case("Recorder, zstd 1, 2 writers",
                 recorder_case(n_large, large, compression="zstd", writers=2)),
            Case("Recorder, sharded 256 MiB", recorder_case(n_large, large, shard_bytes=256 << 20)),
            *([Case("zarrs, sharded (no JAX)", zarrs_case(n_large, large))]
              if importlib.util.find_spec("zarrs") else []),  # pip install zarrs
            Case("tap + zarr append", tap_zarr_case(n_large, large)),
            Case("tap + np.save", np_save_case(n_large, large, "tap")),
            Case("debug.callback + np.save", np_save_case(n_large, large, "debug")),
            Case("floor: tofile per row", floor_case(n_large, large)),
        ]
        times = measure(base, large_cases)
        report(f"\n{base}: {n_large} rows of float32{list(LARGE_SHAPE)} "
               f"({n_large * large.nbytes / 2**30:.2f} GiB), end to end",
               times, n_large * large.nbytes, n_large, "floor: tofile per row")
        sharded, plain = times["Recorder, sharded 256 MiB"], times["Recorder (2 writers)"]
        per_round = [p / s for s, p in zip(sharded, plain)]  # the rounds interleave cases
        print(f"  sharded / unsharded throughput: "
              f"{statistics.median(plain) / statistics.median(sharded):.2f}x of the medians, "
              f"rounds {min(per_round):.2f}-{max(per_round):.2f}x")

        n_steps = min(n_large, 256)
        step_cases = [
            Case("rec.step(step)", step_case(n_steps, large, wrapped=True)),
            Case("rec.step(step, outputs=True)", step_case(n_steps, large, True, True)),
            Case("jax.jit(step), records inside", step_case(n_steps, large, wrapped=False)),
            Case("floor: tofile per row", floor_case(n_steps, large)),
        ]
        times = measure(base, step_cases)
        report(f"\n{base}: {n_steps} calls of a jitted step recording float32"
               f"{list(LARGE_SHAPE)} each, end to end", times, n_steps * large.nbytes,
               n_steps, "floor: tofile per row")
        stepped, inside = times["rec.step(step)"], times["jax.jit(step), records inside"]
        per_round = [j / s for s, j in zip(stepped, inside)]
        print(f"  rec.step / records inside, time: "
              f"{statistics.median(stepped) / statistics.median(inside):.2f}x of the medians, "
              f"rounds {min(1 / r for r in per_round):.2f}-{max(1 / r for r in per_round):.2f}x")
        n_small_steps = min(SMALL_ROWS, 2000)
        small_steps = [
            Case("rec.step(step)", step_case(n_small_steps, small, wrapped=True)),
            Case("rec.step(step, outputs=True)", step_case(n_small_steps, small, True, True)),
            Case("jax.jit(step), records inside", step_case(n_small_steps, small,
                                                           wrapped=False)),
            Case("floor: tofile per row", floor_case(n_small_steps, small)),
        ]
        times = measure(base, small_steps)
        report(f"\n{base}: {n_small_steps} calls of a jitted step recording float32"
               f"{list(SMALL_SHAPE)} each, end to end", times,
               n_small_steps * small.nbytes, n_small_steps, "floor: tofile per row")
        stepped, inside = times["rec.step(step)"], times["jax.jit(step), records inside"]
        print(f"  rec.step / records inside, time: "
              f"{statistics.median(stepped) / statistics.median(inside):.2f}x of the medians")

        small_cases = [
            Case("Recorder", recorder_case(SMALL_ROWS, small)),
            Case("tap + zarr append", tap_zarr_case(SMALL_ROWS, small)),
            Case("tap + np.save", np_save_case(SMALL_ROWS, small, "tap")),
            Case("debug.callback + np.save", np_save_case(SMALL_ROWS, small, "debug")),
            Case("floor: tofile per row", floor_case(SMALL_ROWS, small)),
            Case("floor: one tofile of all rows", floor_case(SMALL_ROWS, small, True)),
        ]
        times = measure(base, small_cases)
        report(f"\n{base}: {SMALL_ROWS} rows of float32{list(SMALL_SHAPE)} "
               f"({SMALL_ROWS * small.nbytes / 2**20:.0f} MiB), end to end",
               times, SMALL_ROWS * small.nbytes, SMALL_ROWS, "floor: tofile per row")

    d = tempfile.mkdtemp(prefix="hfbench-", dir=dirs[0])
    try:
        print()
        device_cost(SMALL_ROWS, small, d)
        device_cost(8, large, d)  # 32 MiB: buffers reused warm from hostfeed's buffer pool
        device_cost(32, large, d)  # 128 MiB: half the buffers are fresh memory each round
    finally:
        shutil.rmtree(d, ignore_errors=True)
    print("\nreceiver:", hostfeed.receiver_stats())


if __name__ == "__main__":
    main()
