"""One process of a multi-process JAX program (`jax.distributed` over loopback, gloo CPU
collectives), running host-callback scenarios; test_multiprocess.py starts several.

Usage: python multiprocess_cases.py PROCESS_ID N_PROCESSES PORT LOCAL_DEVICES SHARDY(0|1)
       [CASE ...]
Prints `RESULT {case_name: result}` (JSON; a case that raises records {"error": ...}),
then, unless the case list is `hang`, dispatches a loop of taps and exits without waiting
for them (they must still all run: lines `EXIT <device id> <i>`). The case `hang` makes
a call whose host function never returns, after printing `HANGING`, on every device (see
`hang`).
"""
from __future__ import annotations

import io
import json
import os
import re
import sys
import threading

PROCESS_ID, N_PROCESSES, PORT, LOCAL, SHARDY = (int(a) for a in sys.argv[1:6])
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={LOCAL}"
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.config.update("jax_use_shardy_partitioner", SHARDY == 1)
jax.distributed.initialize(f"127.0.0.1:{PORT}", num_processes=N_PROCESSES,
                           process_id=PROCESS_ID, initialization_timeout=60,
                           heartbeat_timeout_seconds=20, shutdown_timeout_seconds=30)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402
from jax.experimental import io_callback  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

from casekit import CASES, case, got, host_add, run_cases, shards, tap  # noqa: E402
from hostfeed import host_callback as hcb  # noqa: E402

N = jax.device_count()
assert N == N_PROCESSES * LOCAL and jax.process_index() == PROCESS_ID
MESH = jax.make_mesh((N,), ("x",))
# Every device's position in the mesh (the `device_index` numbering) and process.
POSITION = {d.id: k for k, d in enumerate(MESH.devices.flat)}


def sharded(n_per_device=2, dtype=jnp.float32):
    """arange(n_per_device * N) sharded over the mesh, built from each process's part."""
    whole = np.arange(n_per_device * N, dtype=dtype)
    return jax.make_array_from_callback(whole.shape, NamedSharding(MESH, P("x")),
                                        lambda idx: whole[idx])


def collect(fn):
    got.clear()
    out = fn()
    hcb.barrier_wait()
    return {"taps": list(got), "out": out}


@case
def info():
    return {"local": [d.id for d in jax.local_devices()], "position": POSITION,
            "process_of": {d.id: d.process_index for d in jax.devices()}}


@case
def pmap_tap_and_call():
    local = np.array([POSITION[d.id] for d in jax.local_devices()], np.float32)

    def f(x):
        x = hcb.id_tap(tap("pmap"), x * 2, tap_with_device=True)
        return hcb.call(host_add("pcall", 100.0), x, result_shape=x, call_with_device=True)
    r = collect(lambda: jax.pmap(f, devices=list(MESH.devices.flat))(local))
    r["out"] = shards(r["out"])
    return r


@case
def shard_map_taps_and_calls():
    def body(v):
        v = hcb.id_tap(tap("sm"), v, tap_with_device=True)
        return hcb.call(host_add("smcall", 1.0), v, result_shape=v, call_with_device=True)
    f = jax.jit(jax.shard_map(body, mesh=MESH, in_specs=P("x"), out_specs=P("x")))
    r = collect(lambda: f(sharded()))
    r["out"] = shards(r["out"])
    return r


@case
def jit_taps_whole_value_once():
    a, b = sharded(2), sharded(3, jnp.int32)
    # A loop of taps of a pytree whose leaves split over the devices, in order.
    f = jax.jit(lambda a, b: lax.fori_loop(0, 3, lambda i, c: hcb.id_tap(
        tap("tree"), {"a": a + i, "b": b}, tap_with_device=True, result=c + 1), 0))
    out = {"tree": collect(lambda: int(f(a, b)))}
    # device_index names the device (mesh position) whose process runs the tap.
    g = jax.jit(lambda v: hcb.id_tap(tap("last"), v * 2, tap_with_device=True,
                                     device_index=N - 1))
    out["last"] = collect(lambda: shards(g(a)))
    # A leaf that does not split over the devices (a scalar): the gathering scheme.
    h = jax.jit(lambda v: hcb.id_tap(tap("mixed"), (v, jnp.sum(v)), tap_with_device=True))
    out["mixed"] = collect(lambda: shards(h(a)[0]))
    text = f.lower(a, b).compile().as_text()
    out["collectives"] = sorted(set(re.findall(
        r"all-gather|all-reduce|collective-permute|all-to-all|reduce-scatter", text)))
    # A mesh that lists the devices in reverse: device_index 0 is the last process's.
    rev = jax.sharding.Mesh(np.array(jax.devices()[::-1]), ("x",))
    y = jax.device_put(a, NamedSharding(rev, P("x")))
    r = jax.jit(lambda v: hcb.id_tap(tap("reversed"), v, tap_with_device=True))
    out["reversed"] = collect(lambda: shards(r(y)))
    return out


@case
def jit_calls_return_each_process_its_part():
    x = sharded(2)
    f = jax.jit(lambda v: hcb.call(host_add("gcall", 1000.0), v, result_shape=v,
                                   call_with_device=True) * 2,
                out_shardings=NamedSharding(MESH, P("x")))
    out = {"split": collect(lambda: shards(f(x)))}
    g = jax.jit(lambda v: hcb.call(host_add("last", 0.5), v, result_shape=v,
                                   call_with_device=True, device_index=N - 1),
                out_shardings=NamedSharding(MESH, P("x")))
    out["last"] = collect(lambda: shards(g(x)))
    # A scalar result cannot be split: the gathering scheme, broadcast to every device.
    h = jax.jit(lambda v: hcb.call(lambda a: np.float32(a.sum()), v, result_shape=1.0))
    out["gathered"] = collect(lambda: float(h(x).addressable_shards[0].data))
    return out


@case
def id_print_in_the_owning_process():
    s = io.StringIO()
    x = sharded(1)
    f = jax.jit(jax.shard_map(lambda v: hcb.id_print(v, where="sm", output_stream=s,
                                                      tap_with_device=True),
                              mesh=MESH, in_specs=P("x"), out_specs=P("x")))
    f(x)
    hcb.barrier_wait()
    per_device = s.getvalue()
    s2 = io.StringIO()
    jax.jit(lambda v: hcb.id_print(v, what="whole", output_stream=s2))(x)
    hcb.barrier_wait()
    return {"per_device": per_device, "whole": s2.getvalue()}


@case
def failing_calls_fail_every_process():
    x = sharded(2)

    def bad(a, *, device=None):
        raise ValueError("host side failed")

    runs = {
        "global": lambda: jax.jit(lambda v: hcb.call(bad, v, result_shape=v) + 1)(x),
        "global_gathered": lambda: jax.jit(lambda v: hcb.call(bad, v, result_shape=1.0))(x),
        "shard_map": lambda: jax.jit(jax.shard_map(
            lambda v: hcb.call(bad, v, result_shape=v), mesh=MESH, in_specs=P("x"),
            out_specs=P("x")))(x),
        "pmap": lambda: jax.pmap(lambda v: lax.psum(hcb.call(bad, v, result_shape=v), "i"),
                                 axis_name="i", devices=list(MESH.devices.flat))(
            np.zeros(LOCAL, np.float32)),
    }
    results = {}
    for name, run in runs.items():
        entry = {}
        try:
            np.asarray(run().addressable_shards[0].data)
            entry["raised"] = None
        except Exception as e:  # noqa: BLE001 - recorded for the test
            entry["raised"] = [type(e).__name__, str(e)]
        try:
            hcb.barrier_wait()
            entry["barrier"] = None
        except Exception as e:  # noqa: BLE001 - recorded for the test
            entry["barrier"] = [type(e).__name__, "host side failed" in str(e)]
        ok = jax.jit(lambda v: hcb.call(host_add("ok", 1.0), v, result_shape=v),
                     out_shardings=NamedSharding(MESH, P("x")))(x)
        entry["after"] = shards(ok)
        hcb.barrier_wait()
        results[name] = entry
    return results


@case
def counts_and_order_per_device():
    got.clear()
    f = jax.jit(jax.shard_map(lambda v: lax.fori_loop(0, 50, lambda i, c: hcb.id_tap(
        tap("many"), i, tap_with_device=True, result=c + 1), v), mesh=MESH,
        in_specs=P("x"), out_specs=P("x")))
    x = sharded(1)
    for _ in range(3):
        f(x)  # dispatched, not waited for
    hcb.barrier_wait()
    per_device: dict = {}
    for _, i, dev, _ in got:
        per_device.setdefault(dev, []).append(i)
    return {d: v == list(range(50)) * 3 for d, v in per_device.items()}


def exit_with_taps_pending():
    def tap_out(a, transforms, *, device):
        sys.stdout.write(f"EXIT {device.id} {int(a)}\n")

    f = jax.jit(jax.shard_map(lambda v: lax.fori_loop(0, 100, lambda i, c: hcb.id_tap(
        tap_out, i, tap_with_device=True, result=c + 1), v), mesh=MESH,
        in_specs=P("x"), out_specs=P("x")))
    f(sharded(1))  # not waited for: the exit drain must run every tap


def hang():
    """Every device calls a host function that never returns; the last local device gets
    there only once the file named by HANG_GO_FILE exists (the test creates it after
    signalling), so its call starts after the signal."""
    go = os.environ["HANG_GO_FILE"]

    def stuck(a):
        print("HANGING", flush=True)
        threading.Event().wait()

    def gate(v, position):
        # JAX's own callback: there is no hostfeed wait for the signal to interrupt here.
        pause = threading.Event()
        for _ in range(6000 if position % LOCAL == LOCAL - 1 else 0):  # 60 s at most
            if os.path.exists(go):
                break
            pause.wait(0.01)
        return v

    def body(v):
        v = io_callback(gate, jax.ShapeDtypeStruct(v.shape, v.dtype), v, lax.axis_index("x"))
        return hcb.call(stuck, lax.pcast(v, ("x",), to="varying"), result_shape=v)

    f = jax.jit(jax.shard_map(body, mesh=MESH, in_specs=P("x"), out_specs=P("x")))
    f(sharded(1)).block_until_ready()


def main() -> None:
    names = sys.argv[6:] or list(CASES)
    if names == ["hang"]:
        hang()
        return
    results = run_cases(names)
    print("RESULT " + json.dumps(results), flush=True)
    exit_with_taps_pending()


if __name__ == "__main__":
    main()
