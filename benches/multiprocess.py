"""Many processes: a tap and a call of an array sharded over 8 CPU devices, run as one
process of 8 devices and as 2 processes (`jax.distributed` on loopback, gloo) of 4
devices each. Prints the extra time per step over the same step without a callback, and
the bytes the compiled collectives move between processes. A last row taps inside
`shard_map` instead (each device's slice in its own process), the recipe for per-rank
logging.

Shard by shard, a global-view callback runs in the process owning device `device_index`
(here process 0): the other process's slices are moved there (one `ppermute`), joined on
the host, and a call's results go back the same way. One process moves nothing. The
gathering scheme (a leaf that does not split evenly over the devices) all-gathers the
operand to every device instead; its row shows what shard by shard saves.

Run: python benches/multiprocess.py   (starts the worker processes itself)
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile

N_DEV = 8
ELEMS = 1 << 20  # float32: 4 MiB logical array, 512 KiB per device
REPEATS = int(os.environ.get("HOSTFEED_BENCH_REPEATS", 20))
TIMEOUT = 600.0


def start_jax(process_id: int, n_proc: int, port: int, n_dev: int):
    """Starts JAX in worker ``process_id`` of ``n_proc``: ``n_dev // n_proc`` CPU devices
    here and, with several processes, ``jax.distributed`` on loopback (coordinator on
    ``port``, gloo collectives). Call it before anything imports JAX; returns ``jax``.
    Shared with shared_store.py."""
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={n_dev // n_proc}"
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax

    if n_proc > 1:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=n_proc,
                                   process_id=process_id, initialization_timeout=60)
    return jax


def worker(process_id: int, n_proc: int, port: int) -> None:
    jax = start_jax(process_id, n_proc, port, N_DEV)
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P

    from hostfeed import host_callback as hcb
    from hostfeed.bench import interleaved

    hcb.set_sync_taps(False)  # asynchronous taps, as measured here
    mesh = jax.make_mesh((N_DEV,), ("x",))
    whole = np.arange(ELEMS, dtype=np.float32)
    sharding = NamedSharding(mesh, P("x"))
    x = jax.make_array_from_callback(whole.shape, sharding, lambda idx: whole[idx])
    process_of = [d.process_index for d in mesh.devices.flat]
    seen: list = []
    shard_taps: list = []
    fns = {
        "no callback": jax.jit(lambda v: v * 2),
        "tap": jax.jit(lambda v: hcb.id_tap(lambda a, tr: seen.append(a.nbytes), v * 2)),
        # A scalar leaf does not split over the devices: the gathering scheme.
        "tap (gathered)": jax.jit(lambda v: hcb.id_tap(
            lambda a, tr: seen.append(a[0].nbytes), (v * 2, jnp.float32(1)))[0]),
        "call": jax.jit(lambda v: hcb.call(lambda a: a + 1, v, result_shape=v) * 2,
                        out_shardings=sharding),
        # The per-rank recipe: each device taps its slice in its own process.
        "tap (shard_map)": jax.jit(jax.shard_map(
            lambda v: hcb.id_tap(lambda a, tr: shard_taps.append(a.nbytes), v * 2),
            mesh=mesh, in_specs=P("x"), out_specs=P("x"))),
    }

    def step(fn):
        def run():
            fn(x).block_until_ready()
            hcb.barrier_wait()
        return run

    moved = {name: between_processes(fn.lower(x).compile().as_text(), process_of)
             for name, fn in fns.items()}
    times = interleaved({k: step(f) for k, f in fns.items()}, repeats=REPEATS, warmup=3)
    assert all(b == ELEMS * 4 for b in seen), "a tap did not receive the whole array"
    assert all(b == ELEMS * 4 // N_DEV for b in shard_taps)
    print("RESULT " + json.dumps({
        "process": jax.process_index(), "taps_here": len(seen),
        "shard_taps_here": len(shard_taps), "moved": moved,
        "min_ms": {k: v["min"] * 1e3 for k, v in times.items()},
        "median_ms": {k: v["median"] * 1e3 for k, v in times.items()}}), flush=True)


ITEMSIZE = {"f32": 4, "s32": 4, "u32": 4, "pred": 1, "u8": 1}


def between_processes(hlo: str, process_of: list[int]) -> int:
    """Bytes the compiled collectives move between processes, per execution.

    collective-permute: each source->target pair across processes moves the result
    once. all-gather over all n devices: each device receives every other device's
    piece, so (n - local) pieces per device come from other processes.
    """
    total = 0
    n = len(process_of)
    for line in hlo.splitlines():
        m = re.search(r"= \(?(\w+)\[([\d,]*)\][^ ]* (collective-permute|all-gather)"
                      r"(-start)?\(", line)
        if not m:
            continue
        dims = [int(d) for d in m.group(2).split(",") if d]
        nbytes = ITEMSIZE.get(m.group(1), 4) * math.prod(dims)
        if m.group(3) == "collective-permute":
            pairs = re.findall(r"\{(\d+),(\d+)\}", line.split("source_target_pairs=")[1])
            total += nbytes * sum(process_of[int(s)] != process_of[int(t)] for s, t in pairs)
        else:
            local = sum(p == process_of[0] for p in process_of)
            total += n * (nbytes // n) * (n - local)
    return total


def free_port() -> int:
    """A free TCP port on loopback, for the coordination service."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_workers(script: str, argvs: list[list[str]], tmp: str) -> list[dict]:
    """Runs ``script --worker ARGS`` once per entry of ``argvs`` (one process each, their
    output in ``tmp``), waits for all, and returns each one's ``RESULT {json}`` line; kills
    every worker left over, and exits with a worker's output if one failed."""
    with contextlib.ExitStack() as files:
        procs, outs = [], []
        for i, argv in enumerate(argvs):
            out = files.enter_context(open(os.path.join(tmp, f"{i}.out"), "w+"))
            outs.append(out)
            procs.append(subprocess.Popen(
                [sys.executable, script, "--worker", *argv],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True))
        try:
            for p in procs:
                p.wait(TIMEOUT)
        finally:
            for p in procs:  # never leave a worker behind
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
        results = []
        for out, p in zip(outs, procs):
            out.seek(0)
            text = out.read()
            found = [line for line in text.splitlines() if line.startswith("RESULT ")]
            if p.returncode != 0 or not found:
                raise SystemExit(f"worker failed (rc={p.returncode}):\n{text[-4000:]}")
            results.append(json.loads(found[0][len("RESULT "):]))
        return results


def launch(n_proc: int) -> list[dict]:
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        return run_workers(__file__, [[str(i), str(n_proc), str(port)] for i in range(n_proc)],
                           tmp)


def main() -> None:
    import jax

    print(f"jax {jax.__version__}; float32[{ELEMS}] = {ELEMS * 4 / 2**20:.0f} MiB sharded over "
          f"{N_DEV} CPU devices; min of {REPEATS} steps (median in brackets); a step is "
          f"one jitted call + block_until_ready + barrier_wait")
    runs = {"1 process x 8 devices": launch(1), "2 processes x 4 devices": launch(2)}
    names = list(runs["1 process x 8 devices"][0]["min_ms"])
    for label, results in runs.items():
        print(f"\n{label}")
        print(f"  {'step':<18}{'ms/step':>16}{'extra vs no callback':>24}"
              f"{'MiB between processes':>24}")
        for name in names:
            t = max(r["min_ms"][name] for r in results)
            med = max(r["median_ms"][name] for r in results)
            base = max(r["min_ms"]["no callback"] for r in results)
            moved = results[0]["moved"][name] / 2**20
            extra = "" if name == "no callback" else f"+{t - base:.3f} ms"
            print(f"  {name:<18}{t:>9.3f} ({med:.3f}){extra:>20}{moved:>24.2f}")
        print("  whole-value taps received per process: " +
              ", ".join(str(r["taps_here"]) for r in results) +
              "; shard_map taps: " + ", ".join(str(r["shard_taps_here"]) for r in results))
    one, two = runs["1 process x 8 devices"], runs["2 processes x 4 devices"]
    print("\nextra time per step, 2 processes minus 1 process (ms):")
    for name in names[1:]:
        e1 = max(r["min_ms"][name] for r in one) - max(r["min_ms"]["no callback"] for r in one)
        e2 = max(r["min_ms"][name] for r in two) - max(r["min_ms"]["no callback"] for r in two)
        print(f"  {name:<18}{e2 - e1:+9.3f}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
    else:
        main()
