"""Scenarios of the flight recorder (``Recorder(window=...)``) that need a process of their
own; test_flight_recorder.py starts them and checks what they print and write.

Usage: python flight_cases.py SCENARIO PATH [ARGS...]

* ``distributed PATH PROCESS N PORT FIRING``: process PROCESS of N under jax.distributed
  (one CPU device each, gloo): each records ``p{PROCESS}/h`` (a jitted record on its own
  device, ``keep="window"``, window 4, after 1) for STEPS steps, process FIRING with a NaN
  at step FIRE_AT; the processes line up after each step (the coordination service's
  barrier) and flush. Prints ``RESULT {...}``.
* ``killed PATH``: records 48 windowed arrays of 64 KiB rows for 6 steps, fires
  ``rec.keep``, and while the writers write the window (one writer), kills itself
  (SIGKILL) as soon as some arrays announce rows and others do not yet. Prints ``PARTIAL``
  first when it saw that state (else ``WHOLE``: the write ended before it looked).
* ``rss PATH``: 10,000 steps of 1 MiB rows (keep="window", window_bytes 64 MiB, a 16
  MiB queue bound), recorded by a jitted loop of 500 steps a call; the process's resident
  memory after the first call, at step 2,000 and at the end. Prints ``RESULT {...}``.
* ``sharded PATH``: 4 CPU devices: a value sharded over them recorded under jit with
  ``keep="window"`` (part by part) and per device under shard_map, beside the same values
  recorded with ``keep="always"``; ``rec.keep`` at the last step. Prints ``RESULT {...}``.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import threading

SCENARIO, PATH = sys.argv[1], sys.argv[2]
ARGS = [int(a) for a in sys.argv[3:]]
os.environ["JAX_PLATFORMS"] = "cpu"
os.environ["XLA_FLAGS"] = ("--xla_force_host_platform_device_count=4"
                           if SCENARIO == "sharded" else "")
if SCENARIO == "rss":
    os.environ["JAX_HOST_CALLBACK_MAX_QUEUE_BYTE_SIZE"] = str(16 << 20)
    os.environ["HOSTFEED_BUFFER_POOL_BYTES"] = str(16 << 20)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

STEPS, FIRE_AT = 16, 9


def distributed(process: int, n: int, port: int, firing: int) -> None:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=n, process_id=process,
                               local_device_ids=[0])
    import hostfeed
    from jax._src.distributed import global_state

    client = global_state.client
    rec = hostfeed.Recorder(PATH, window=4, after=1, on_nonfinite=True,
                            coordination_timeout=60)
    name = f"p{process}/h"
    f = jax.jit(lambda x, s: rec.record(name, x * 1.0, step=s, keep="window"))
    for s in range(STEPS):
        x = np.full(8, s + 100 * process, np.float32)
        if process == firing and s == FIRE_AT:
            x[3] = np.nan
        f(x, s)
        hostfeed.barrier_wait()  # the firing process publishes its trigger here
        client.wait_at_barrier(f"flight-step-{s}", 60_000)
        rec.flush()  # the others apply it here at the latest
    triggers = rec.triggers
    rec.close()
    print("RESULT " + json.dumps({"triggers": triggers}), flush=True)


def killed() -> None:
    import hostfeed

    arrays, row = 48, 16 << 10  # float32: 64 KiB rows
    rec = hostfeed.Recorder(PATH, window=4, writers=1, commit_interval=0.001)
    names = [f"a{k:02d}" for k in range(arrays)]
    for s in range(6):
        for k, name in enumerate(names):
            rec.record(name, np.full(row, s * 1000 + k, np.float32), step=s, keep="window")
    hostfeed.barrier_wait()
    rec.keep("the run is going down")
    done = threading.Event()
    threading.Thread(target=lambda: (rec.flush(), done.set()), daemon=True).start()
    def rows(name: str) -> int:
        with open(os.path.join(PATH, name, "zarr.json")) as f:
            return int(json.load(f)["shape"][0])

    state = "WHOLE"
    while not done.is_set():
        announced = [rows(n) for n in names]
        if 0 < sum(a > 0 for a in announced) < arrays:
            state = "PARTIAL"
            break
    print(state, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def rss() -> None:
    import hostfeed

    def resident() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    window_bytes = 64 << 20
    rec = hostfeed.Recorder(PATH, window=1000, window_bytes=window_bytes)
    x = jnp.zeros(1 << 18, jnp.float32)  # 1 MiB rows

    @jax.jit
    def block(x, first):  # 500 steps, each recording a 1 MiB row
        def one(i, x):
            return rec.record("h", x + 1.0, step=first + i, keep="window")
        return jax.lax.fori_loop(0, 500, one, x)

    base = resident()
    x = block(x, 0)
    hostfeed.barrier_wait()
    before = resident()
    held_max, at_2000 = 0, 0
    for first in range(500, 10_000, 500):
        x = block(x, first)
        hostfeed.barrier_wait()
        held_max = max(held_max, rec.stats()["window_bytes_held"])
        if first + 500 == 2000:
            at_2000 = resident()
    stats = rec.stats()
    after = resident()
    rec.keep("the end")
    rec.close()
    print("RESULT " + json.dumps({"base": base, "before": before, "at_2000": at_2000,
                                  "after": after,
                                  "held_max": held_max, "window_bytes": window_bytes,
                                  "steps_held": stats["window_steps_held"]}), flush=True)


def sharded() -> None:
    import hostfeed
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:4]), ("d",))
    rec = hostfeed.Recorder(PATH, window=3)

    @jax.jit
    def step(x, s):
        rec.record("ref/g", x, step=s)
        rec.record("win/g", x, step=s, keep="window")

        def per_device(v, s):
            rec.record("ref/d", v, step=s)
            rec.record("win/d", v, step=s, keep="window")
            return v
        return jax.shard_map(per_device, mesh=mesh, in_specs=(P("d"), P()),
                             out_specs=P("d"))(x, s)

    for s in range(8):
        x = jax.device_put(jnp.arange(8 * 3, dtype=jnp.float32).reshape(8, 3) + s,
                           NamedSharding(mesh, P("d")))
        step(x, s)
    hostfeed.barrier_wait()
    rec.keep("last steps")
    rec.close()
    r = hostfeed.open_recording(PATH)
    out = {}
    for kind in ("g", "d"):
        ref, win = r[f"ref/{kind}"], r[f"win/{kind}"]
        kept = sorted(set(win.steps.tolist()))

        def by_step_and_device(a, steps):
            key = np.lexsort((a.meta("device"), a.steps))
            rows = a[:][key]
            return rows[np.isin(a.steps[key], steps)]
        equal = np.array_equal(by_step_and_device(win, kept), by_step_and_device(ref, kept))
        out[kind] = {"steps": kept, "equal": bool(equal), "rows": len(win)}
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    {"distributed": lambda: distributed(*ARGS), "killed": killed, "rss": rss,
     "sharded": sharded}[SCENARIO]()
