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

Run: python benches/object_bytes.py [ROWS] (default 100000). Environment:
HOSTFEED_BENCH_FLUSH_EVERY (comma-separated rows between flushes, default
"1000,5000,10000,100000").
"""
from __future__ import annotations

import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import hostfeed

ROW = (4,)  # float32: 16 bytes a row
FLUSH_EVERY = [int(v) for v in
               os.environ.get("HOSTFEED_BENCH_FLUSH_EVERY", "1000,5000,10000,100000").split(",")]


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
    finally:
        proxy.close()
        server.close()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 100_000)
