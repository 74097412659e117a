"""What recording small rows to an object store costs in bytes, against the bytes of the
rows: stored / recorded and sent / recorded, as ratios.

A moto S3 server runs on 127.0.0.1 in a process of its own (the test suite's launcher,
``tests/python/helpers/s3_server.py``), behind a counting TCP proxy on 127.0.0.1
(``CountingProxy`` there) that the Recorder is pointed at (``storage_options=
{"aws_endpoint": proxy}``): every byte the recorder sends (request lines, headers, bodies)
and receives passes through it. Each case records ``ROWS`` rows of float32[4] (16 bytes;
the rows of a loss or a few statistics) with ``step=``, from a jitted loop of
``FLUSH_EVERY`` steps called again and again, with ``rec.flush()`` after each call (what a
``follow()`` reader or a ``barrier_wait()`` per block of steps asks for), then closes the
recorder. Printed per case: the rows recorded, the flushes, the bytes stored (every object
under the store's prefix, per-row metadata included), the bytes sent and received through
the proxy, the connections, and the ratios stored / recorded and sent / recorded, where
recorded = rows x 16 bytes. The rows are read back (zarr-python, from the server itself,
not counted) and compared.

The ratios depend on the flushes: a flush puts the object holding an array's last rows
again (an object store cannot append to an object), so what it sends grows with the rows
since that object began. In an object store an object holds at most 256 rows (a shard of
eight 32-row chunks for small rows; the per-row metadata in 1,024-row chunks, shuffled and
compressed), so a flush every 1,000 rows of an array costs under 2x (each flush's
requests, about 450 bytes of headers each, and the rows put again, weigh less the more
rows there are between flushes).

Then, live: rows of 1 KiB and more recorded at one row per second per array for 10
minutes, with no flush, each made readable by the recorder's live cycles (every
``commit_interval``). The 10 minutes are simulated quickly by driving the interval: time
runs ``SCALE`` times faster (default 100: a row every 10 ms, the interval and the lock's
lease divided by 100, so six seconds a case), which keeps the rows per cycle, the cycles
per run and the lease renewals of the real run, and so its requests and bytes. Printed per
case: the row size, the interval (simulated), the live cycles (the recorder's commits), the
bytes stored and sent, and sent / recorded; the rows are read back and compared.

Run: python benches/object_bytes.py [ROWS] (default 100000). Environment:
HOSTFEED_BENCH_FLUSH_EVERY (comma-separated rows between flushes, default
"1000,5000,10000,100000"); HOSTFEED_BENCH_LIVE (comma-separated row bytes of the live
cases, default "1024,16384,262144"; empty: none), HOSTFEED_BENCH_LIVE_INTERVALS (simulated
seconds, default: the object-store default and 10), HOSTFEED_BENCH_LIVE_SCALE (default 100),
HOSTFEED_BENCH_LIVE_MINUTES (default 10).
"""
from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import hostfeed
from hostfeed._src.record.stores import OBJECT_COMMIT_INTERVAL

ROW = (4,)  # float32: 16 bytes a row
FLUSH_EVERY = [int(v) for v in os.environ.get(
    "HOSTFEED_BENCH_FLUSH_EVERY", "1000,5000,10000,100000").split(",") if v]
LIVE_ROW_BYTES = [int(v) for v in
                  os.environ.get("HOSTFEED_BENCH_LIVE", "1024,16384,262144").split(",") if v]
LIVE_INTERVALS = [float(v) for v in os.environ.get(
    "HOSTFEED_BENCH_LIVE_INTERVALS",
    f"{OBJECT_COMMIT_INTERVAL:g},10").split(",") if v]
LIVE_SCALE = float(os.environ.get("HOSTFEED_BENCH_LIVE_SCALE", "100"))
LIVE_MINUTES = float(os.environ.get("HOSTFEED_BENCH_LIVE_MINUTES", "10"))


def record(url: str, options: dict, rows: int, every: int) -> int:
    """Records ``rows`` rows with a flush after every ``every``; returns the flushes."""
    flushes = 0
    with hostfeed.Recorder(url, storage_options=options) as rec:
        @jax.jit
        def block(first):
            def body(i, c):
                s = first + i
                rec.record("stats", jnp.full(ROW, s, jnp.float32), step=s)
                return c
            return lax.fori_loop(0, every, body, 0)
        for first in range(0, rows, every):
            jax.block_until_ready(block(first))
            rec.flush()
            flushes += 1
    return flushes


def record_live(url: str, options: dict, row_bytes: int, interval: float) -> tuple[int, int]:
    """Records a row of ``row_bytes`` every simulated second for ``LIVE_MINUTES`` simulated
    minutes (``LIVE_SCALE`` times faster than real time), with no flush: what each row's
    live cycle makes readable. Returns the rows and the commits."""
    rows = int(LIVE_MINUTES * 60)
    tick = 1.0 / LIVE_SCALE
    pace = threading.Event()  # the workload's pacing: a row every simulated second
    with hostfeed.Recorder(url, storage_options=options, commit_interval=interval / LIVE_SCALE,
                           lease=60.0 / LIVE_SCALE) as rec:
        step = jax.jit(lambda x, s: rec.record("h", x + s.astype(x.dtype), step=s))
        x = jnp.zeros(row_bytes // 4, jnp.float32)
        start = time.monotonic()
        for s in range(rows):
            pace.wait(max(0.0, start + s * tick - time.monotonic()))
            step(x, jnp.int32(s))
        jax.block_until_ready(x)
        pace.wait(2 * interval / LIVE_SCALE)  # the last rows' cycle, as in a longer run
        commits = int(rec.stats()["commits"])
    return rows, commits


def live(server: Any, proxy: Any) -> None:
    import obstore.store
    import zarr

    print(f"\nlive: a row every second per array for {LIVE_MINUTES:g} minutes, no flush, "
          f"simulated {LIVE_SCALE:g}x faster (the interval and the lease scaled alike)")
    print(f"  {'row bytes':>9}{'interval s':>11}{'rows':>6}{'commits':>8}{'stored MB':>10}"
          f"{'sent MB':>9}{'sent/rec':>9}{'s':>6}")
    for row_bytes in LIVE_ROW_BYTES:
        for interval in LIVE_INTERVALS:
            bucket = server.new_bucket()
            url = f"s3://{bucket}/live.zarr"
            proxy.reset()
            t0 = time.perf_counter()
            rows, commits = record_live(url, {"aws_endpoint": proxy.endpoint}, row_bytes,
                                        interval)
            took = time.perf_counter() - t0
            sent = proxy.sent
            recorded = rows * row_bytes
            stored = sum(server.keys(bucket, "live.zarr/").values())
            store = zarr.storage.ObjectStore(obstore.store.from_url(
                url, config={"endpoint": server.endpoint}, client_options={"allow_http": True}))
            got = np.asarray(zarr.open_group(store, mode="r")["h"][:, 0])
            assert np.array_equal(got, np.arange(rows, dtype=np.float32)), "rows differ"
            print(f"  {row_bytes:>9}{interval:>11g}{rows:>6}{commits:>8}{stored / 1e6:>10.3f}"
                  f"{sent / 1e6:>9.3f}{sent / recorded:>8.2f}x{took:>6.1f}")
            server.remove_bucket(bucket)


def main(rows: int) -> None:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                    "python", "helpers"))
    from s3_server import CountingProxy, S3Process  # the test suite's server launcher
    import obstore.store
    import zarr

    server = S3Process("moto")
    server.start()
    os.environ.update(server.env())
    proxy = CountingProxy(server.port)
    recorded = rows * int(np.prod(ROW)) * 4
    print(f"hostfeed {hostfeed.__version__}, jax {jax.__version__}; moto on 127.0.0.1 behind "
          f"a counting proxy; {rows} rows of float32{list(ROW)} ({recorded / 1e6:.2f} MB "
          f"recorded), one array, step=")
    print(f"  {'flush every':>11}{'flushes':>9}{'stored MB':>11}{'sent MB':>9}{'recv MB':>9}"
          f"{'conns':>7}{'stored/rec':>12}{'sent/rec':>10}{'s':>7}")
    try:
        for every in FLUSH_EVERY:
            bucket = server.new_bucket()
            url = f"s3://{bucket}/run.zarr"
            proxy.reset()
            t0 = time.perf_counter()
            flushes = record(url, {"aws_endpoint": proxy.endpoint}, rows, min(every, rows))
            took = time.perf_counter() - t0
            sent, received, conns = proxy.sent, proxy.received, proxy.connections
            stored = sum(server.keys(bucket, "run.zarr/").values())
            store = zarr.storage.ObjectStore(obstore.store.from_url(
                url, config={"endpoint": server.endpoint}, client_options={"allow_http": True}))
            got = np.asarray(zarr.open_group(store, mode="r")["stats"][:])
            want = np.repeat(np.arange(rows, dtype=np.float32)[:, None], ROW[0], axis=1)
            assert np.array_equal(got, want), "the rows read back differ"
            print(f"  {every:>11}{flushes:>9}{stored / 1e6:>11.3f}{sent / 1e6:>9.3f}"
                  f"{received / 1e6:>9.3f}{conns:>7}{stored / recorded:>11.2f}x"
                  f"{sent / recorded:>9.2f}x{took:>7.1f}")
            server.remove_bucket(bucket)
        if LIVE_ROW_BYTES:
            live(server, proxy)
    finally:
        proxy.close()
        server.close()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 100_000)
