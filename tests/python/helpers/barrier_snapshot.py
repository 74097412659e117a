"""Does ``barrier_wait()`` from one thread wait for every tap dispatched (from any thread)
before it started? On N CPU devices (default 4), for ``--seconds`` seconds:

- one thread per device dispatches a computation committed to that device that taps its
  own index; on the last two devices through an AOT-compiled object with a donated
  argument (``jax.jit(..., donate_argnums=0).lower(...).compile()``);
- ``--sharded-threads`` threads dispatch a computation over every device that taps a
  sharded value as a whole (a joined tap: each device sends a part);
- a thread loops on ``barrier_wait()``: before each, it takes a snapshot of the last index
  whose dispatch had returned on every dispatching thread, and after it returns it checks
  that those taps ran;
- one thread loops on ``jax.effects_barrier()`` followed by the wait for the queue, one on
  ``stop_outfeed_receiver()`` (``--no-stops``: none).

Prints one JSON line: the barriers checked, the ones that returned early (with the
snapshot, what had run, and the devices the dispatcher held then), the taps sent and seen,
and whether each source's taps ran in order.

With ``--blocked-call``, instead, the deterministic form of the second way a barrier
returned early: one thread dispatches a sharded computation that makes a global-view call
(whose host function waits for an event) and then taps; once that dispatch returned, a
barrier in another thread must not return before the tap ran. (JAX chains the effect
tokens of each thread apart: a barrier waited for its own thread's computations only.)
Prints ``{"returned_before_release": ..., "seen_at_barrier": [...]}``.

    python barrier_snapshot.py [DEVICES] [--seconds S] [--sharded-threads K] [--no-stops]
    python barrier_snapshot.py [DEVICES] --blocked-call
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

parser = argparse.ArgumentParser()
parser.add_argument("devices", type=int, nargs="?", default=4)
parser.add_argument("--seconds", type=float, default=5.0)
parser.add_argument("--sharded-threads", type=int, default=1)
parser.add_argument("--no-stops", action="store_true")
parser.add_argument("--blocked-call", action="store_true")
args = parser.parse_args()

os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={args.devices}"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

from hostfeed import host_callback as hcb  # noqa: E402
from hostfeed._src import lifecycle  # noqa: E402
from hostfeed._src.dispatcher import dispatcher  # noqa: E402

devices = jax.devices()


def blocked_call() -> None:
    """See ``--blocked-call`` in the module's docstring."""
    sharding = NamedSharding(Mesh(np.array(devices), ("x",)), P("x"))
    release = threading.Event()
    seen: list = []

    def host(v):
        release.wait(120)
        return v

    def fn(v):
        w = hcb.call(host, v, result_shape=jax.ShapeDtypeStruct(v.shape, v.dtype))
        return hcb.id_tap(lambda a, transforms: seen.append(a.tolist()), w) * 2

    fn = jax.jit(fn)
    x = jax.device_put(np.arange(2.0 * len(devices), dtype=np.float32), sharding)
    release.set()
    fn(x)
    hcb.barrier_wait()  # compiled, and its first run done
    seen.clear()
    release.clear()
    dispatcher_thread = threading.Thread(target=fn, args=(x,))
    dispatcher_thread.start()
    dispatcher_thread.join()  # dispatched: the computation waits for the call's reply
    at_barrier: list = []
    barrier = threading.Thread(target=lambda: (hcb.barrier_wait(), at_barrier.append(seen[:])))
    barrier.start()
    barrier.join(0.5)  # a barrier that waits for the computation is still waiting
    early = not barrier.is_alive()
    release.set()
    barrier.join(120)
    print(json.dumps({"returned_before_release": early, "seen_at_barrier": at_barrier}))
    sys.stdout.flush()


if args.blocked_call:
    blocked_call()
    sys.exit(0)

n_single = len(devices)
sources = [f"single{i}" for i in range(n_single)]
sources += [f"sharded{k}" for k in range(args.sharded_threads)]
# The last index whose dispatch returned, and the last index whose tap ran, per source
# (-1: none). Each is written by one thread only.
dispatched = dict.fromkeys(sources, -1)
ran = dict.fromkeys(sources, -1)
out_of_order: list = []
deadline = time.monotonic() + args.seconds
done = threading.Event()


def saw(source: str, index: int) -> None:
    if index != ran[source] + 1:
        out_of_order.append((source, ran[source], index))
    ran[source] = index


def single_tap(a, transforms):
    saw(f"single{int(a[0])}", int(a[1]))


def single_fn(x):
    return hcb.id_tap(single_tap, x, result=x) + 1


def single_thread(i: int) -> None:
    d = devices[i]
    source = f"single{i}"
    aot = i >= n_single - 2
    if aot:
        example = jax.device_put(np.zeros(2, np.int32), d)
        call = jax.jit(single_fn, donate_argnums=0).lower(example).compile()
    else:
        call = jax.jit(single_fn)
    s = 0
    while time.monotonic() < deadline:
        call(jax.device_put(np.array([i, s], np.int32), d))
        dispatched[source] = s
        s += 1


def sharded_thread(k: int) -> None:
    sharding = NamedSharding(Mesh(np.array(devices), ("x",)), P("x"))
    source = f"sharded{k}"
    v = jax.device_put(np.zeros((len(devices), 4), np.float32), sharding)

    def tap(a, transforms):
        saw(source, int(a[0, 0]))

    fn = jax.jit(lambda v, r: hcb.id_tap(tap, v + r.astype(v.dtype)) * 2)
    r = 0
    while time.monotonic() < deadline:
        fn(v, np.int32(r))
        dispatched[source] = r
        r += 1


early: list = []
rounds = {"barrier": 0, "effects": 0, "stop": 0}


def barrier_thread() -> None:
    while not done.is_set():
        snapshot = dict(dispatched)
        hcb.barrier_wait(timeout=120)
        seen = dict(ran)
        missing = {s: (snapshot[s], seen[s]) for s in sources if seen[s] < snapshot[s]}
        if missing:
            early.append({"missing": missing, "held": sorted(dispatcher.held)})
        rounds["barrier"] += 1


def effects_thread() -> None:
    while not done.is_set():
        jax.effects_barrier()
        lifecycle.wait_processed()
        rounds["effects"] += 1


def stop_thread() -> None:
    while not done.is_set():
        hcb.stop_outfeed_receiver()
        rounds["stop"] += 1


workers = [threading.Thread(target=single_thread, args=(i,)) for i in range(n_single)]
workers += [threading.Thread(target=sharded_thread, args=(k,))
            for k in range(args.sharded_threads)]
controls = [threading.Thread(target=barrier_thread), threading.Thread(target=effects_thread)]
if not args.no_stops:
    controls.append(threading.Thread(target=stop_thread))
for th in workers + controls:
    th.start()
for th in workers:
    th.join()
done.set()
for th in controls:
    th.join()
hcb.barrier_wait()
result = {
    "barriers": rounds["barrier"],
    "effects_barriers": rounds["effects"],
    "stops": rounds["stop"],
    "early": len(early),
    "early_details": early[:5],
    "sent": sum(v + 1 for v in dispatched.values()),
    "seen": sum(v + 1 for v in ran.values()),
    "out_of_order": out_of_order[:10],
}
print(json.dumps(result))
sys.stdout.flush()
