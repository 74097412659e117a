"""Multi-device scenarios, run in a subprocess that sets the device count and partitioner.

Usage: python multidevice_cases.py N_DEVICES SHARDY(0|1)
Prints one JSON object {case_name: result} on its last line; a case that raises records
{"error": "..."}. The pytest module test_multidevice.py runs this and asserts on it.
"""
from __future__ import annotations

import json
import os
import re
import sys

N = int(sys.argv[1])
SHARDY = sys.argv[2] == "1"
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={N}"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P  # noqa: E402

from casekit import CASES, case, got, host_add, run_cases, shards, tap  # noqa: E402
from hostfeed import host_callback as hcb  # noqa: E402

jax.config.update("jax_use_shardy_partitioner", SHARDY)
assert jax.device_count() == N

def collect(fn):
    got.clear()
    out = fn()
    hcb.barrier_wait()
    return {"taps": sorted(got, key=lambda g: (g[2], str(g))), "out": out}


@case
def pmap_tap_and_call():
    def f(x):
        x = hcb.id_tap(tap("pmap"), x * 2, tap_with_device=True)
        return hcb.call(host_add("call", 100.0), x, result_shape=x, call_with_device=True)
    r = collect(lambda: jax.pmap(f)(jnp.arange(N, dtype=jnp.float32)).tolist())
    return r


@case
def pmap_of_vmap():
    def f(x):
        x = hcb.id_tap(tap("pv"), x, tap_with_device=True)
        return hcb.call(host_add("pvcall", 0.5), x, result_shape=x, call_with_device=True)
    return collect(lambda: jax.pmap(jax.vmap(f))(
        jnp.arange(2 * N, dtype=jnp.float32).reshape(N, 2)).tolist())


@case
def shard_map_full_manual():
    mesh = jax.make_mesh((N,), ("x",))
    x = jax.device_put(jnp.arange(2 * N, dtype=jnp.float32), NamedSharding(mesh, P("x")))

    def body(v):
        v = hcb.id_tap(tap("sm"), v, tap_with_device=True)
        return hcb.call(host_add("smcall", 1.0), v, result_shape=v, call_with_device=True)
    out = collect(lambda: jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"),
                                                out_specs=P("x")))(x))
    out["shards"] = shards(out.pop("out"))
    return out


@case
def shard_map_partial_manual():
    mesh = jax.make_mesh((2, N // 2), ("a", "b"))
    x = jax.device_put(jnp.arange(N, dtype=jnp.float32).reshape(2, N // 2),
                       NamedSharding(mesh, P("a", "b")))

    def body(v):
        v = hcb.id_tap(tap("pm"), v, tap_with_device=True)
        return hcb.call(host_add("pmcall", 10.0), v, result_shape=v, call_with_device=True)
    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("a"), out_specs=P("a"),
                              axis_names={"a"}))
    try:
        out = collect(lambda: f(x))
    except NotImplementedError as e:
        return {"error_type": "NotImplementedError", "message": str(e).splitlines()[0]}
    out["out"] = np.asarray(out["out"]).tolist()
    return out


@case
def failing_calls_fail_every_device_and_recover():
    results = {}
    _, x = sharded(P("x"), (2 * N,))

    def bad(a, *, device=None):
        raise ValueError("host side failed")

    runs = {
        "global": lambda: jax.jit(lambda v: hcb.call(bad, v, result_shape=v) + 1)(x),
        # A scalar result cannot be split over the devices: the gathering scheme.
        "global_gathered": lambda: jax.jit(lambda v: hcb.call(bad, v, result_shape=1.0))(x),
        "pmap": lambda: jax.pmap(lambda v: lax.psum(hcb.call(bad, v, result_shape=v), "i"),
                                 axis_name="i")(jnp.arange(N, dtype=jnp.float32)),
    }
    for name, run in runs.items():
        entry = {}
        try:
            np.asarray(run())
            entry["raised"] = None
        except Exception as e:  # noqa: BLE001 - recorded for the test
            entry["raised"] = [type(e).__name__, "host side failed" in str(e)]
        try:
            hcb.barrier_wait()
            entry["barrier"] = None
        except hcb.CallbackException as e:
            entry["barrier"] = ["CallbackException", "host side failed" in str(e)]
        ok = jax.jit(lambda v: hcb.call(host_add("ok", 1.0), v, result_shape=v))(x)
        entry["after"] = np.asarray(ok).tolist()[:3]
        hcb.barrier_wait()
        results[name] = entry
    return results


@case
def jit_on_chosen_device():
    d = jax.devices()[N - 1]
    x = jax.device_put(jnp.arange(3.0), d)
    out = collect(lambda: jax.jit(lambda v: hcb.call(
        host_add("devcall", 1.0), hcb.id_tap(tap("dev"), v, tap_with_device=True),
        result_shape=v, call_with_device=True))(x))
    out["out_devices"] = sorted(d.id for d in out.pop("out").devices())
    return out


def sharded(spec, shape, axis_types=None, mesh_shape=None, names=("x",)):
    mesh = jax.make_mesh(mesh_shape or (N,), names,
                         axis_types=axis_types or (AxisType.Explicit,) * len(names))
    x = jnp.arange(int(np.prod(shape)), dtype=jnp.float32).reshape(shape)
    return mesh, jax.device_put(x, NamedSharding(mesh, spec))


@case
def global_1d_explicit():
    _, x = sharded(P("x"), (2 * N,))
    return collect(lambda: jax.jit(lambda v: hcb.id_tap(tap("g1"), v * 2,
                                                        tap_with_device=True))(x).tolist())


@case
def global_1d_auto():
    _, x = sharded(P("x"), (2 * N,), axis_types=(AxisType.Auto,))
    return collect(lambda: jax.jit(lambda v: hcb.id_tap(tap("g1a"), v + 1,
                                                        tap_with_device=True))(x).tolist())


@case
def global_device_index():
    _, x = sharded(P("x"), (2 * N,))
    return collect(lambda: jax.jit(lambda v: hcb.id_tap(tap("gk"), v, tap_with_device=True,
                                                        device_index=2))(x).tolist())


@case
def global_shardwise_pytree_loop_and_fallback():
    mesh, x = sharded(P("x"), (2 * N,))
    y = jax.device_put(jnp.arange(3 * N, dtype=jnp.int32).reshape(N, 3),
                       NamedSharding(mesh, P("x")))
    out = {}
    # Every leaf splits evenly along dimension 0: each device sends its slice and the
    # host assembles them; a loop of such taps keeps its order.
    f = jax.jit(lambda a, b: lax.fori_loop(0, 3, lambda i, c: hcb.id_tap(
        tap("tree"), {"a": a + i, "b": b}, tap_with_device=True, result=c + 1), 0))
    out["tree"] = collect(lambda: int(f(x, y)))
    out["tree_collectives"] = len(re.findall(r"all-gather|all-reduce|collective-permute|"
                                             r"all-to-all", f.lower(x, y).compile().as_text()))
    # A scalar leaf cannot be split: the whole tap falls back to gathering the operands.
    g = jax.jit(lambda a: hcb.id_tap(tap("mixed"), (a, jnp.sum(a)), tap_with_device=True))
    out["mixed"] = collect(lambda: g(x)[1].tolist())
    out["mixed_gathers"] = "all-gather" in g.lower(x).compile().as_text()
    # An operand with no mesh (an uncommitted argument) enters the explicit mesh's region
    # resharded like the others (issue 65.1: shard_map refused it as replicated).
    h = jax.jit(lambda a, c: hcb.id_tap(tap("unmeshed"), (a, c), tap_with_device=True))
    out["unmeshed"] = collect(lambda: h(x, jnp.arange(N, dtype=jnp.int32))[1].tolist())
    return out


@case
def global_device_index_out_of_range():
    _, x = sharded(P("x"), (2 * N,))
    try:
        jax.jit(lambda v: hcb.id_tap(tap("bad"), v, tap_with_device=True,
                                     device_index=N))(x)
    except Exception as e:  # noqa: BLE001 - the message is the result
        return {"error_type": type(e).__name__, "message": str(e).splitlines()[0]}
    return {"error_type": None}


@case
def global_2d():
    results = {}
    for name, spec, types in [("both", P("a", "b"), (AxisType.Explicit,) * 2),
                              ("one", P(None, "b"), (AxisType.Explicit,) * 2),
                              ("replicated", P(), (AxisType.Explicit,) * 2),
                              ("auto_both", P("a", "b"), (AxisType.Auto,) * 2)]:
        _, x = sharded(spec, (4, N), axis_types=types, mesh_shape=(2, N // 2),
                       names=("a", "b"))
        results[name] = collect(lambda: jax.jit(
            lambda v: hcb.id_tap(tap(name), v, tap_with_device=True))(x).tolist())
    return results


@case
def global_call_results_on_shards():
    mesh, x = sharded(P("x"), (2 * N,))
    f = jax.jit(lambda v: hcb.call(host_add("gcall", 1000.0), v, result_shape=v,
                                   call_with_device=True) * 2,
                out_shardings=NamedSharding(mesh, P("x")))
    out = collect(lambda: f(x))
    out["shards"] = shards(out.pop("out"))
    mesh2, y = sharded(P("a", "b"), (4, N), mesh_shape=(2, N // 2), names=("a", "b"))
    g = jax.jit(lambda v: hcb.call(host_add("gcall2", 0.5), v, result_shape=v) + v)
    out2 = collect(lambda: g(y))
    out["shards_2d"] = shards(out2["out"])
    out["spec_2d"] = str(out2["out"].sharding.spec)
    out["taps_2d"] = out2["taps"]
    return out


@case
def scan_and_while_under_sharding():
    _, x = sharded(P("x"), (N,))

    def f(v):
        v, _ = lax.scan(lambda c, i: (hcb.id_tap(tap("scan"), c + i, tap_with_device=True),
                                      None), v, jnp.arange(2.0))
        return lax.while_loop(lambda c: c[0] < 2, lambda c: (
            c[0] + 1, hcb.id_tap(tap("while"), c[1] * 2, tap_with_device=True)), (0, v))[1]
    got.clear()
    out = jax.jit(f)(x)
    hcb.barrier_wait()
    return {"taps_in_order": list(got), "out": out.tolist()}


@case
def vmap_and_grad_of_sharded():
    _, x = sharded(P("x"), (N,))
    v = collect(lambda: jax.jit(jax.vmap(lambda e: hcb.id_tap(tap("vmap"), e * 3,
                                                              tap_with_device=True)))(x).tolist())
    g = collect(lambda: jax.jit(jax.grad(lambda e: jnp.sum(
        hcb.id_tap(tap("grad"), e * e, tap_with_device=True))))(x).tolist())
    return {"vmap": v, "grad": g}


@case
def barrier_waits_for_all_devices():
    got.clear()
    f = jax.pmap(lambda x: lax.fori_loop(0, 50, lambda i, c: hcb.id_tap(
        tap("many"), i, tap_with_device=True, result=c + i), x))
    for _ in range(5):
        f(jnp.zeros(N))  # dispatched, not waited for
    hcb.barrier_wait()
    per_device = {}
    for _, _, dev, _ in got:
        per_device[dev] = per_device.get(dev, 0) + 1
    in_order = all(
        [g[1] for g in got if g[2] == d] == [i for _ in range(5) for i in range(50)]
        for d in per_device)
    return {"count": len(got), "per_device": sorted(per_device.items()), "in_order": in_order}


def main() -> None:
    only = sys.argv[3:] or list(CASES)
    results = run_cases(only)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
