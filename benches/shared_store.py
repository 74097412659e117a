"""Recording a sharded value from many processes into one Zarr store: a
float32 value of 4 MiB per step, sharded over 4 CPU devices, recorded under jit by 1, 2
and 4 processes (`jax.distributed` on loopback, gloo), each process writing the chunks of
its own devices' shards ("parts"), side by side with the other path, which the
benchmark can force ("owner writes": the shards are moved to the process of device 0 with `ppermute`
rounds, joined there and written by that process alone).

Prints per configuration: rows (steps) per second until every row is on disk (steps +
flush, the slowest process), the bytes the compiled step moves between processes (from
its HLO: collective-permute / all-gather operands whose pair crosses processes), the
collectives in the step, and the device-side cost of the record per message (hostfeed's
timing histogram: the handler's time on the device thread, median).

Run: python benches/shared_store.py   (starts the worker processes itself)
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time

N_DEV = 4
ELEMS = 1 << 20  # float32: 4 MiB per step, 1 MiB per device
STEPS = int(os.environ.get("HOSTFEED_BENCH_STEPS", 40))

_spec = importlib.util.spec_from_file_location(
    "_mp_bench", os.path.join(os.path.dirname(os.path.abspath(__file__)), "multiprocess.py"))
_mp = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_mp)  # type: ignore[union-attr]
between_processes = _mp.between_processes


def worker(process_id: int, n_proc: int, port: int, mode: str, path: str) -> None:
    # Parts, or the value gathered in one process first (read when hostfeed is imported).
    os.environ["HOSTFEED_RECORD_PARTS"] = "1" if mode == "parts" else "0"
    jax = _mp.start_jax(process_id, n_proc, port, N_DEV)
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P

    import hostfeed
    from hostfeed._src import lifecycle
    from hostfeed.bench import summary_of_buckets

    mesh = jax.make_mesh((N_DEV,), ("x",))
    whole = np.arange(ELEMS, dtype=np.float32)
    x = jax.make_array_from_callback(whole.shape, NamedSharding(mesh, P("x")),
                                     lambda idx: whole[idx])
    process_of = [d.process_index for d in mesh.devices.flat]
    with hostfeed.Recorder(path, mode="w") as rec:
        # No step: then the owner path goes shard by shard (ppermute rounds to
        # the owner process), its cheaper scheme; a step would make it gather.
        f = jax.jit(lambda v, s: rec.record("h", v))
        hlo = f.lower(x, 0).compile().as_text()
        moved = between_processes(hlo, process_of)
        n_coll = sum(hlo.count(op + "(") + hlo.count(op + "-start(")
                     for op in ("collective-permute", "all-gather", "all-reduce"))
        for s in range(3):  # warm-up
            f(x, s).block_until_ready()
        rec.flush()
        lifecycle.set_timing(True)
        lifecycle.reset_histograms()
        start = time.perf_counter()
        for s in range(STEPS):
            f(x, s)
        rec.flush()
        elapsed = time.perf_counter() - start
        device = summary_of_buckets(lifecycle.histograms()["device_ns"], 1e-3)
    print("RESULT " + json.dumps({"seconds": elapsed, "moved": moved, "collectives": n_coll,
                                  "device_us": device.get("p50"),
                                  "messages": device.get("count")}), flush=True)


def launch(n_proc: int, mode: str) -> list[dict]:
    port = _mp.free_port()
    tmp = tempfile.mkdtemp(prefix="hostfeed-shared-bench-")
    path = os.path.join(tmp, "run.zarr")
    try:
        return _mp.run_workers(
            __file__, [[str(i), str(n_proc), str(port), mode, path] for i in range(n_proc)], tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    import jax

    print(f"jax {jax.__version__}; float32[{ELEMS}] = {ELEMS * 4 / 2**20:.0f} MiB per step "
          f"sharded over {N_DEV} CPU devices; {STEPS} steps then flush, slowest process")
    print(f"{'configuration':<34}{'rows/s':>9}{'vs 1 process':>14}{'MiB moved/step':>16}"
          f"{'collectives':>13}{'device us/msg':>15}")
    base = None
    for n_proc in (1, 2, 4):
        for mode in ("parts", "owner"):
            res = launch(n_proc, mode)
            rate = STEPS / max(r["seconds"] for r in res)
            base = base or rate
            label = f"{n_proc} process(es), {'parts' if mode == 'parts' else 'owner writes'}"
            dev = max((r["device_us"] or 0.0) for r in res if r["messages"])
            print(f"{label:<34}{rate:>9.1f}{rate / base:>13.2f}x"
                  f"{res[0]['moved'] / 2**20:>16.2f}{res[0]['collectives']:>13}{dev:>15.1f}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5],
               sys.argv[6])
    else:
        main()
