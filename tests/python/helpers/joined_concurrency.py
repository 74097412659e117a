"""Joined (sharded, global-view) taps and calls mixed with single-device taps and calls
from several threads, on N CPU devices: counts every callback and checks each source's
order. Prints one JSON line of figures.

    python joined_concurrency.py DEVICES --rounds R [--seconds S] [--single-threads T]
                                 [--sharded-threads K] [--barrier-threads B]
                                 [--stop-threads S] [--record DIR]

K threads (default 1) each dispatch R sharded computations (a value sharded over every
device, tapped as a whole, then a global-view call); T threads each dispatch 5
single-device computations per sharded one (a tap and a call), on device
1 + t mod (DEVICES - 1), all at once. With ``--seconds`` the threads keep going for that
long instead (the soak), and with ``--record`` every thread also records a row per
computation into a Recorder (``--sharded-taps-only``: the sharded computations make no
call, so they run ahead of their taps). B threads loop on ``barrier_wait`` and S threads on
``stop_outfeed_receiver`` meanwhile: neither may lose a callback or reorder one.
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
parser.add_argument("--sharded-threads", type=int, default=1)
parser.add_argument("--barrier-threads", type=int, default=0)
parser.add_argument("--stop-threads", type=int, default=0)
parser.add_argument("--sharded-taps-only", action="store_true",
                    help="the sharded computations tap and make no call")
parser.add_argument("--record", default="")
args = parser.parse_args()

os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={args.devices}"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

import hostfeed  # noqa: E402
from hostfeed import host_callback as hcb  # noqa: E402

devices = jax.devices()
mesh = Mesh(np.array(devices), ("x",))
lock = threading.Lock()
joined: dict[int, list[int]] = {}  # sharded thread -> its rounds, in arrival order
joined_bad: list = []
single: dict[int, list[int]] = {}  # thread -> its sequence numbers, in arrival order
single_bad: list = []
calls_bad: list = []
recorder = hostfeed.Recorder(args.record) if args.record else None


def joined_tap(a, transforms):
    v, r, k = a
    r, k = int(r), int(k)
    if not np.array_equal(v, np.arange(v.size, dtype=np.float32).reshape(v.shape) + r):
        joined_bad.append((k, r))
    joined.setdefault(k, []).append(r)


def joined_host(x):
    return x * 2


def shard_fn(v, r, k):
    v = v + r.astype(v.dtype)
    v = hcb.id_tap(joined_tap, (v, r, k), result=v)
    w = hcb.call(joined_host, v, result_shape=jax.ShapeDtypeStruct(v.shape, v.dtype))
    if recorder is not None:
        recorder.record(f"sharded{k}", v, step=r)
    return w + 1


def taps_only_fn(k: int):
    """The sharded computation of thread ``k`` with ``--sharded-taps-only``: it taps only
    the sharded value (its round is its first element), so every device sends a part."""

    def tap(v, transforms):
        joined_tap((v, v.flat[0], k), transforms)

    def fn(v, r, _k):
        v = hcb.id_tap(tap, v + r.astype(v.dtype))
        if recorder is not None:
            recorder.record(f"sharded{k}", v, step=r)
        return v * 2 + 1

    return jax.jit(fn)


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
dispatching = threading.Event()  # set when every dispatching thread has finished


def going(i: int, per_round: int = 1) -> bool:
    if deadline is not None:
        return time.monotonic() < deadline
    return i < args.rounds * per_round


def sharded_thread(k: int):
    sharding = NamedSharding(mesh, P("x"))
    base = np.arange(len(devices) * 8, dtype=np.float32).reshape(len(devices), 8)
    v = jax.device_put(base, sharding)
    fn = taps_only_fn(k) if args.sharded_taps_only else sharded
    r = 0
    while going(r):
        out = fn(v, np.int32(r), np.int32(k))
        if r % 50 == 0 and not np.array_equal(np.asarray(out), (base + r) * 2 + 1):
            calls_bad.append(("sharded", k, r))
        r += 1
    with lock:
        counts["sharded"] += r
        counts[f"sharded{k}"] = r


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


control_rounds = {"barrier": 0, "stop": 0}


def control_thread(what: str):
    """Barriers (or stops) from another thread, over and over, while computations are
    dispatched: each returns or raises nothing (no callback raises here)."""
    n = 0
    while not dispatching.is_set():
        if what == "barrier":
            hcb.barrier_wait(timeout=120)
        else:
            hcb.stop_outfeed_receiver()
        n += 1
    with lock:
        control_rounds[what] += n


t0 = time.perf_counter()
threads = [threading.Thread(target=sharded_thread, args=(k,))
           for k in range(args.sharded_threads)]
threads += [threading.Thread(target=single_thread, args=(t,))
            for t in range(args.single_threads)]
controls = [threading.Thread(target=control_thread, args=("barrier",))
            for _ in range(args.barrier_threads)]
controls += [threading.Thread(target=control_thread, args=("stop",))
             for _ in range(args.stop_threads)]
for th in threads + controls:
    th.start()
for th in threads:
    th.join()
dispatching.set()
for th in controls:
    th.join()
hcb.barrier_wait()
seconds = time.perf_counter() - t0

result = {
    "sharded_sent": counts["sharded"],
    "sharded_seen": sum(len(v) for v in joined.values()),
    "sharded_unique": sum(len(set(v)) for v in joined.values()),
    "sharded_in_order": all(v == list(range(counts[f"sharded{k}"]))
                            for k, v in joined.items()),
    "sharded_bad_values": joined_bad[:10],
    "single_sent": counts["single"],
    "single_seen": sum(len(v) for v in single.values()),
    "single_in_order": all(v == list(range(counts[f"single{t}"])) for t, v in single.items()),
    "single_bad": single_bad[:10],
    "calls_bad": calls_bad[:10],
    "seconds": round(seconds, 2),
    "barriers": control_rounds["barrier"],
    "stops": control_rounds["stop"],
}
if recorder is not None:
    recorder.close()
    result["recorded_sharded"] = 0
    result["recorded_sharded_steps_ok"] = True
    for k in range(args.sharded_threads):
        rows, meta = hostfeed.read_recording(args.record, f"sharded{k}")
        result["recorded_sharded"] += int(rows.shape[0])
        result["recorded_sharded_steps_ok"] &= sorted(meta["step"].tolist()) == list(
            range(counts[f"sharded{k}"]))
    rows, meta = hostfeed.read_recording(args.record, "single")
    result["recorded_single"] = int(rows.shape[0])
print(json.dumps(result))
sys.stdout.flush()
