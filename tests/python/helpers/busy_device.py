"""A joined (global-view) tap over 2 CPU devices whose device 1 is busy for a while before
it sends its part, and a ``call`` on device 0 made once device 0's part is held: the call
waits for the joined tap (its device's order), however long device 1 is busy. Prints one
JSON line: the order the host functions ran in, and whether the call was seen held.

    python busy_device.py KIND SECONDS MODE

KIND: ``sleep`` (device 1 waits in a ``pure_callback``) or ``loop`` (device 1 computes in a
``while_loop`` sized to take about SECONDS here); MODE: ``async`` or ``sync`` taps.
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time

kind, seconds, mode = sys.argv[1], float(sys.argv[2]), sys.argv[3]
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

from hostfeed import host_callback as hcb  # noqa: E402
from hostfeed._src.dispatcher import dispatcher  # noqa: E402

hcb.set_sync_taps(mode == "sync")
devices = jax.devices()
mesh = Mesh(np.array(devices), ("x",))
order: list = []


def wait_until(predicate, timeout: float = 120.0) -> bool:
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while not predicate():
        if time.monotonic() > deadline:
            return False
        pause.wait(0.005)
    return True


def joined(a, transforms):
    order.append(["joined", np.asarray(a).ravel().tolist()])


def host(a):
    order.append(["call", int(a)])
    return a


def sleep_on_device_1(v):
    if int(np.asarray(v).ravel()[0]) == 1:
        time.sleep(seconds)  # device 1 is busy (the scenario itself, not the test waiting)
    return v


def iterations() -> int:
    """How many steps of the busy loop take about ``seconds`` here (sized on a short run)."""
    step = jax.jit(lambda n, v: lax.fori_loop(0, n, lambda i, c: jnp.sin(c) * 1.0001 + 1e-4, v))
    n = 200_000
    step(n, jnp.float32(0)).block_until_ready()
    t0 = time.perf_counter()
    step(n, jnp.float32(0)).block_until_ready()
    return max(n, int(n * seconds / (time.perf_counter() - t0)))


steps = iterations() if kind == "loop" else 0


def busy(v):
    if kind == "sleep":
        return jax.pure_callback(sleep_on_device_1, jax.ShapeDtypeStruct(v.shape, v.dtype), v)
    n = jnp.where(lax.axis_index("x") == 1, steps, 0)
    c = lax.fori_loop(0, n, lambda i, c: jnp.sin(c) * 1.0001 + 1e-4, jnp.float32(0))
    return v + (c * 0).astype(v.dtype)


@jax.jit
def step(x):
    y = jax.shard_map(busy, mesh=mesh, in_specs=P("x"), out_specs=P("x"))(x)
    return hcb.id_tap(joined, y, result=y + 1)


call_on_0 = jax.jit(lambda v: hcb.call(host, v, result_shape=jax.ShapeDtypeStruct((), jnp.int32)))
x = jax.device_put(np.arange(2, dtype=np.int32), NamedSharding(mesh, P("x")))
v0 = jax.device_put(np.int32(7), devices[0])
step.lower(x).compile()
call_on_0.lower(v0).compile()


def call_held() -> bool:
    try:
        h = dispatcher.held.get(0)
        return h is not None and any(m.reply is not None for m, _ in list(h.waiting))
    except RuntimeError:  # (changed while read: read again)
        return False


# (From a thread: with some JAX releases the dispatch itself runs device 1's part, so it
# returns only once device 1 is done.)
stepped: list = []
stepper = threading.Thread(target=lambda: stepped.append(step(x).block_until_ready()))
stepper.start()
device_0_held = wait_until(lambda: 0 in dispatcher.held or bool(order))
out: list = []
worker = threading.Thread(target=lambda: out.append(int(call_on_0(v0))))
worker.start()
seen = {"call_held": False}


def call_held_or_ran() -> bool:
    if call_held():
        seen["call_held"] = True
        return True
    return any(o[0] == "call" for o in order)


wait_until(call_held_or_ran)
worker.join(seconds + 120)
stepper.join(seconds + 120)
hcb.barrier_wait()
print(json.dumps({"order": order, "out": out, "device_0_held": device_0_held, **seen}))
