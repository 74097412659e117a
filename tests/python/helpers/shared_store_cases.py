"""One process of a multi-process recording into one Zarr store, or the
single-process reference run of the same program; test_shared_store.py starts them.

Usage: python shared_store_cases.py PROCESS_ID N_PROCESSES PORT LOCAL_DEVICES PATH SCENARIO
N_PROCESSES 0 means one process without jax.distributed (the reference run). Scenarios:

* ``program``: a sharded value recorded under jit for STEPS steps (``act/h``, with the
  step), a replicated one (``act/r``) and, under many processes, a per-device shard_map
  record (``dev/v``); then close. Prints ``RESULT {...}`` (collectives in the compiled
  step, errors of the lock checks).
* ``killed``: process 1 records 3 steps, flushes and kills itself (SIGKILL); the others
  record STEPS steps and close (which must raise RecordingError within the time limit).
* ``raising``: process 1 records 3 steps, then raises inside the ``with`` block.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import time

PROCESS_ID, N_PROCESSES, PORT, LOCAL = (int(a) for a in sys.argv[1:5])
PATH, SCENARIO = sys.argv[5], sys.argv[6]
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={LOCAL}"
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")
if N_PROCESSES:
    jax.distributed.initialize(f"127.0.0.1:{PORT}", num_processes=N_PROCESSES,
                               process_id=PROCESS_ID, initialization_timeout=60,
                               heartbeat_timeout_seconds=60, shutdown_timeout_seconds=10)

import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

import hostfeed  # noqa: E402

STEPS = 6
TIMEOUT = 8.0  # coordination_timeout of the fault scenarios
N = jax.device_count()
MESH = jax.make_mesh((N,), ("x",))


def global_value(rows_per_device=2, width=3):
    whole = np.arange(rows_per_device * N * width, dtype=np.float32).reshape(-1, width)
    return jax.make_array_from_callback(whole.shape, NamedSharding(MESH, P("x")),
                                        lambda idx: whole[idx])


def replicated():
    whole = np.arange(4, dtype=np.int32)
    return jax.make_array_from_callback(whole.shape, NamedSharding(MESH, P()),
                                        lambda idx: whole[idx])


def collectives(compiled) -> int:
    text = compiled.as_text()
    return sum(text.count(op) for op in ("all-gather", "collective-permute", "all-reduce",
                                         "all-to-all", "reduce-scatter"))


def program() -> dict:
    out: dict = {}
    x, r = global_value(), replicated()
    rec = hostfeed.Recorder(PATH, mode="w", chunk_bytes=48)
    try:
        hostfeed.Recorder(PATH, mode="w")
    except hostfeed.RecordingError as exc:
        out["second_open"] = str(exc)
    step = jax.jit(lambda x, r, s: (rec.record("act/h", x * 2 + s, step=s),
                                    rec.record("act/r", r + s)))
    out["collectives"] = collectives(step.lower(x, r, 0).compile())
    for s in range(STEPS):
        step(x, r, s)
    if N_PROCESSES:
        per_device = jax.jit(jax.shard_map(lambda v: rec.record("dev/v", v + 1), mesh=MESH,
                                           in_specs=P("x"), out_specs=P("x")))
        for _ in range(2):
            per_device(x)
        # pmap: this process passes its devices' rows; each device records its own.
        mine = np.stack([np.full(3, d.id, np.int32) for d in jax.local_devices()])
        out["local_ids"] = [d.id for d in jax.local_devices()]
        out["pmap_ids"] = [d.id for d in jax.devices()]
        jax.pmap(lambda v: rec.record("dev/p", v * 10))(mine)
        out["clash"] = clashes(rec)
    rec.flush()
    rec.close()
    return out


def clashes(rec) -> dict:
    """Process 0 declares and writes first; then every other process tries a clashing
    declaration (same name, another shape) and to write a name process 0 writes."""
    import jax.numpy as jnp

    from hostfeed._src import compat as _compat

    client = _compat.distributed_client()
    errors = {}
    if PROCESS_ID == 0:
        rec.catalogue.declare("many/d", np.float32, (2,))
        rec.record("many/e", jnp.ones(2))
        jax.jit(lambda v: rec.record("many/s", v))(jnp.ones(3))
    client.wait_at_barrier("test/clash", 60_000)
    if PROCESS_ID != 0:
        attempts = {
            "declare": lambda: rec.catalogue.declare("many/d", np.float32, (3,)),
            "eager": lambda: rec.record("many/e", jnp.ones(2)),
            "jit": lambda: jax.jit(lambda v: rec.record("many/s", v))(jnp.ones(3)),
        }
        for what, attempt in attempts.items():
            try:
                attempt()
                errors[what] = None
            except ValueError as exc:
                errors[what] = str(exc)
    return errors


def faulty(kind: str) -> dict:
    x = global_value()
    start = time.monotonic()
    out: dict = {}
    try:
        with hostfeed.Recorder(PATH, mode="w", chunk_bytes=48,
                               coordination_timeout=TIMEOUT) as rec:
            step = jax.jit(lambda x, s: rec.record("act/h", x * 2 + s, step=s))
            for s in range(STEPS):
                if PROCESS_ID == 1 and s == 3:
                    rec.flush()
                    if kind == "killed":
                        os.kill(os.getpid(), signal.SIGKILL)
                    raise RuntimeError("process 1 fails at step 3")
                step(x, s)
    except Exception as exc:  # noqa: BLE001 - reported
        out["error"] = f"{type(exc).__name__}: {exc}"
    out["seconds"] = time.monotonic() - start
    return out


def main() -> None:
    result = program() if SCENARIO == "program" else faulty(SCENARIO)
    print("RESULT " + json.dumps(result), flush=True)
    if N_PROCESSES and SCENARIO == "killed":
        os._exit(0)  # a peer is gone: jax.distributed's shutdown would wait for it
    # Otherwise every process leaves through jax.distributed's shutdown barrier: a process
    # that outlives the coordination service's host (process 0) is terminated by JAX
    # (jax 0.11+), possibly before it prints its result.


if __name__ == "__main__":
    main()
