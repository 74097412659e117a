"""Joined (sharded, global-view) taps and calls mixed with single-device taps and calls
from several threads, on N CPU devices: counts every callback and checks each source's
order. Prints one JSON line of figures.

    python joined_concurrency.py DEVICES --rounds R [--seconds S] [--single-threads T]
                                 [--record DIR]

One thread dispatches R sharded computations (a value sharded over every device, tapped
as a whole, then a global-view call); T threads each dispatch 5 single-device computations
per sharded one (a tap and a call), on device 1 + t mod (DEVICES - 1), all at once. With
``--seconds`` the threads keep going for that long instead (the soak), and with
``--record`` every thread also records a row per computation into a Recorder.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

parser = argparse.ArgumentParser()
parser.add_argument("devices", type=int)
parser.add_argument("--rounds", type=int, default=300)
parser.add_argument("--seconds", type=float, default=0.0)
parser.add_argument("--single-threads", type=int, default=1)
parser.add_argument("--record", default="")
args = parser.parse_args()

os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={args.devices}"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

import hostfeed  # noqa: E402
from hostfeed import host_callback as hcb  # noqa: E402

devices = jax.devices()
mesh = Mesh(np.array(devices), ("x",))
lock = threading.Lock()
joined: list[int] = []  # sharded rounds, in arrival order
joined_bad: list = []
single: dict[int, list[int]] = {}  # thread -> its sequence numbers, in arrival order
single_bad: list = []
calls_bad: list = []
recorder = hostfeed.Recorder(args.record) if args.record else None


def joined_tap(a, transforms):
    v, r = a
    r = int(r)
    if not np.array_equal(v, np.arange(v.size, dtype=np.float32).reshape(v.shape) + r):
        joined_bad.append(r)
    joined.append(r)


def joined_host(x):
    return x * 2


def shard_fn(v, r):
    v = hcb.id_tap(joined_tap, (v, r), result=v)
    w = hcb.call(joined_host, v, result_shape=jax.ShapeDtypeStruct(v.shape, v.dtype))
    if recorder is not None:
        recorder.record("sharded", v, step=r)
    return w + 1


sharded = jax.jit(shard_fn)


def single_tap(a, transforms, *, device):
    t, s = (int(x) for x in a)
    if device.id != single_device(t):
        single_bad.append((t, s, device.id))
    single.setdefault(t, []).append(s)


def single_host(x):
    return x + 1


def single_fn(ts):
    ts = hcb.id_tap(single_tap, ts, result=ts, tap_with_device=True)
    out = hcb.call(single_host, ts, result_shape=jax.ShapeDtypeStruct(ts.shape, ts.dtype))
    if recorder is not None:
        recorder.record("single", ts, step=ts[1])
    return out


single_jit = jax.jit(single_fn)


def single_device(t: int) -> int:
    return (1 + t % (len(devices) - 1)) if len(devices) > 1 else 0


counts = {"sharded": 0, "single": 0}
deadline = time.monotonic() + args.seconds if args.seconds else None


def going(i: int, per_round: int = 1) -> bool:
    if deadline is not None:
        return time.monotonic() < deadline
    return i < args.rounds * per_round


def sharded_thread():
    sharding = NamedSharding(mesh, P("x"))
    base = np.arange(len(devices) * 8, dtype=np.float32).reshape(len(devices), 8)
    r = 0
    while going(r):
        v = jax.device_put(base + r, sharding)
        out = sharded(v, jnp.int32(r))
        if r % 50 == 0 and not np.array_equal(np.asarray(out), (base + r) * 2 + 1):
            calls_bad.append(("sharded", r))
        r += 1
    counts["sharded"] = r


def single_thread(t: int):
    d = devices[single_device(t)]
    s = 0
    outs = []
    while going(s, 5):
        ts = jax.device_put(np.array([t, s], np.int32), d)
        outs.append((s, single_jit(ts)))
        if len(outs) >= 64:
            for s0, o in outs:
                if np.asarray(o).tolist() != [t + 1, s0 + 1]:
                    calls_bad.append(("single", t, s0))
            outs.clear()
        s += 1
    for s0, o in outs:
        if np.asarray(o).tolist() != [t + 1, s0 + 1]:
            calls_bad.append(("single", t, s0))
    with lock:
        counts["single"] += s
        counts[f"single{t}"] = s


t0 = time.perf_counter()
threads = [threading.Thread(target=sharded_thread)]
threads += [threading.Thread(target=single_thread, args=(t,))
            for t in range(args.single_threads)]
for th in threads:
    th.start()
for th in threads:
    th.join()
hcb.barrier_wait()
seconds = time.perf_counter() - t0

result = {
    "sharded_sent": counts["sharded"],
    "sharded_seen": len(joined),
    "sharded_unique": len(set(joined)),
    "sharded_in_order": joined == sorted(joined),
    "sharded_bad_values": joined_bad[:10],
    "single_sent": counts["single"],
    "single_seen": sum(len(v) for v in single.values()),
    "single_in_order": all(v == list(range(counts[f"single{t}"])) for t, v in single.items()),
    "single_bad": single_bad[:10],
    "calls_bad": calls_bad[:10],
    "seconds": round(seconds, 2),
}
if recorder is not None:
    recorder.close()
    rows, meta = hostfeed.read_recording(args.record, "sharded")
    result["recorded_sharded"] = int(rows.shape[0])
    result["recorded_sharded_steps_ok"] = sorted(meta["step"].tolist()) == list(
        range(counts["sharded"]))
    rows, meta = hostfeed.read_recording(args.record, "single")
    result["recorded_single"] = int(rows.shape[0])
print(json.dumps(result))
sys.stdout.flush()
