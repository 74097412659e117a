"""Per-device order of taps and calls of every multi-device strategy mixed in one program,
run in a subprocess that sets the device count and partitioner.

Usage: python ordering_cases.py N_DEVICES SHARDY(0|1) ITERATIONS
Prints one JSON object on its last line:
  {"events": [[iteration, step, [devices...], kind], ...],   # in host order
   "issue_example": [[what, device], ...]}
Each event names the devices at whose program position it happens: the sending device of
a per-device or gathered callback, every device of a joined (shard-by-shard) one.
"""
from __future__ import annotations

import io
import json
import os
import sys

N = int(sys.argv[1])
SHARDY = sys.argv[2] == "1"
ITERATIONS = int(sys.argv[3])
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={N}"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P  # noqa: E402

from hostfeed import host_callback as hcb  # noqa: E402

jax.config.update("jax_use_shardy_partitioner", SHARDY)
assert jax.device_count() == N
ALL = list(range(N))
events: list = []


def marker_of(a) -> tuple[int, int]:
    m = np.asarray(a)
    return int(m.reshape(-1, 2)[0, 0]), int(m.reshape(-1, 2)[0, 1])


def record(kind, devices_of):
    def tap(arg, transforms, *, device):
        it, step = marker_of(arg[0])
        events.append([it, step, devices_of(device), kind])
    return tap


def host_call(kind, devices_of):
    def call(arg, *, device):
        it, step = marker_of(arg[0])
        events.append([it, step, devices_of(device), kind])
        return arg[1] + 1
    return call


joined = record("joined tap", lambda d: ALL)
per_device = record("per-device tap", lambda d: [d.id])
gathered = record("gathered tap", lambda d: [d.id])
joined_call = host_call("joined call", lambda d: ALL)
per_device_call = host_call("per-device call", lambda d: [d.id])

mesh = jax.make_mesh((N,), ("d",), axis_types=(AxisType.Auto,))
spec = NamedSharding(mesh, P("d"))


def marker(it, step):
    # One [iteration, step] row per device, so that it splits like the data.
    return jnp.broadcast_to(jnp.stack([it, jnp.int32(step)]), (N, 2))


def shard_taps(m, x):
    def body(mm, xx):
        hcb.id_tap(per_device, (mm, xx), tap_with_device=True)
        return xx

    return jax.shard_map(body, mesh=mesh, in_specs=(P("d"), P("d")), out_specs=P("d"))(m, x)


def shard_calls(m, x):
    def body(mm, xx):
        return hcb.call(per_device_call, (mm, xx), result_shape=xx, call_with_device=True)

    return jax.shard_map(body, mesh=mesh, in_specs=(P("d"), P("d")), out_specs=P("d"))(m, x)


@jax.jit
def program(it, x):
    x = hcb.id_tap(joined, (marker(it, 0), x), tap_with_device=True, result=x)
    x = shard_taps(marker(it, 1), x)
    # A scalar leaf cannot be split over the devices: gathered onto device 0.
    x = hcb.id_tap(gathered, (marker(it, 2), x, jnp.float32(0)), tap_with_device=True,
                   result=x)
    x = hcb.call(joined_call, (marker(it, 3), x), result_shape=x, call_with_device=True)
    x = shard_taps(marker(it, 4), x)
    x = shard_calls(marker(it, 5), x)
    x = hcb.id_tap(joined, (marker(it, 6), x), tap_with_device=True, result=x)
    return shard_taps(marker(it, 7), x)


x = jax.device_put(jnp.zeros((N, 3), jnp.float32), spec)
for it in range(ITERATIONS):
    x = program(jnp.int32(it), x)
hcb.barrier_wait()
assert np.asarray(x).tolist() == [[2.0 * ITERATIONS] * 3] * N  # each call adds 1, twice


# The example of the issue: a joined tap, per-device taps under pmap, a joined tap.
stream = io.StringIO()


def fun(xv):
    xv = hcb.id_print(xv + 1., what="before", tap_with_device=True, output_stream=stream)
    res = jax.pmap(lambda v: hcb.id_print(v * 2., what="inside", tap_with_device=True,
                                          output_stream=stream))(xv)
    return hcb.id_print(res + 1., what="after", tap_with_device=True, output_stream=stream)


example = []
for _ in range(ITERATIONS):
    stream.seek(0)
    stream.truncate()
    jax.jit(fun)(np.arange(2 * N, dtype=np.float32).reshape(N, 2))
    hcb.barrier_wait()
    heads = [line for line in stream.getvalue().splitlines() if line.startswith("device")]
    example.append([[h.split("what: ")[1], h.split(" what:")[0]] for h in heads])

print(json.dumps({"events": events, "issue_example": example}))
