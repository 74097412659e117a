"""hostfeed on a CUDA GPU vs JAX's own callbacks, side by side in one run, with the issue's
targets checked as ratios (run by .ci/accelerators/gpu_check.sh; needs a GPU):

* small taps, end to end (from the call until every callback ran: barrier_wait /
  effects_barrier), float32[4]: N_SMALL taps in straight-line code (a jitted function with
  that many taps in sequence; the target: hostfeed at least 20x cheaper per tap than
  io_callback(ordered=True)) and, for information, in a fori_loop, where XLA reads the
  loop predicate back on the host every iteration, for every variant alike (the rows
  "added" subtract the same loop without a callback).
* 64 MiB taps, end to end, in GB/s, against the floor of a device-to-host copy into
  pinned memory (cuMemcpyDtoHAsync + synchronise, driver API; and jax.device_put to the
  pinned_host memory kind where JAX supports it). Target: hostfeed at least 80% of the
  pinned copy floor.
* call round trip float32[4] -> float32[4] in straight-line code (target: hcb.call at
  least 5x faster than io_callback) and, for information, in a fori_loop; with
  buffer_callback on CUDA too, whose callback must copy the operand from device memory and
  the result back on XLA's stream (benches/_cuda_floor.StreamCopies).
* recording: a training step with a 4 MiB activation (hostfeed.bench._training, the
  TPU bench's section), recorded in the computation and through ``Recorder.step`` (its
  default here, ``outputs=True`` and ``outputs=False``), every step, ``every=10`` and
  ``reduce="stats"``, against the step alone, returned + ``copy_to_host_async``
  overlapped, returned + ``device_get`` and ``io_callback``. Targets (time ratios, at
  most): ``Recorder.step`` 1.0x returned + ``copy_to_host_async``; ``every=10`` 1.1x the
  step; stats every step 1.2x the step. Which way ``Recorder.step`` takes by default on a
  GPU is to follow what this section measures.
* for information, the dispatch of a jitted function with one call, waited for, against
  the same function without a callback, pure_callback and buffer_callback.

Run: JAX_PLATFORMS=cuda,cpu python benches/gpu.py   (JAX's own callbacks run their function
on a CPU device: without the CPU backend the bench stops at once, saying so; writes
gpu_bench.json to $OUT if set, after each section, so that a run cut off keeps what it
measured)
Environment: HOSTFEED_BENCH_N_SMALL, _N_LARGE, _N_CALLS, _REPEATS; GPU_CHECK_BENCH_S (the
step's limit: every thread's stack is dumped 10 s before it).
GPU_CHECK_PLATFORM=cpu (with JAX_PLATFORMS=cpu): the dry run of .ci/accelerators/gpu_check.sh, every
section with small sizes on CPU, a host memcpy standing in for the pinned copy floor; no
target is judged.
"""
from __future__ import annotations

import faulthandler
import json
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import io_callback
from jax.experimental.buffer_callback import buffer_callback

import hostfeed
from hostfeed import host_callback as hcb
from hostfeed._src.transports import native
from hostfeed.bench._sections import Config
from hostfeed.bench._timing import interleaved, table
from hostfeed.bench._training import record as record_section

from _cuda_floor import StreamCopies, copy_floor  # benches/: the script's own directory

hcb.set_sync_taps(False)  # asynchronous taps, as measured here (the default is synchronous)

DRY_RUN = os.environ.get("GPU_CHECK_PLATFORM") == "cpu"
#: Which GPU: cuda or rocm (.ci/accelerators/rocm_check.sh sets GPU_CHECK_KIND=rocm).
KIND = os.environ.get("GPU_CHECK_KIND", "cuda")


def gpu(what: str):
    """This GPU's native function ``what`` (``hostfeed._src.transports.native``)."""
    return native.platform(KIND).status if what == "status" else getattr(
        native.platform(KIND).driver, what)


N_SMALL = int(os.environ.get("HOSTFEED_BENCH_N_SMALL", 20 if DRY_RUN else 200))
N_LARGE = int(os.environ.get("HOSTFEED_BENCH_N_LARGE", 2 if DRY_RUN else 10))
N_CALLS = int(os.environ.get("HOSTFEED_BENCH_N_CALLS", 20 if DRY_RUN else 200))
REPEATS = int(os.environ.get("HOSTFEED_BENCH_REPEATS", 1 if DRY_RUN else 5))
LARGE_ELEMS = (1 << 18) if DRY_RUN else (16 << 20)  # float32 -> 64 MiB (1 MiB in the dry run)
# On ROCm the floor is JAX's own copy into pinned host memory (no HIP floor is written;
# benches/_cuda_floor.py is CUDA's).
FLOOR = ("host memcpy (dry run)" if DRY_RUN else "pinned copy floor (driver)" if KIND == "cuda"
         else "pinned copy floor (jax.device_put)")

#: Speed-ups (the other way's time over hostfeed's): each must be at least this.
TARGETS = {
    "small tap vs io_callback(ordered), straight-line": 20.0,
    "64 MiB tap vs pinned copy floor": 0.8,
    "call vs io_callback, straight-line": 5.0,
}
#: Time ratios (hostfeed's time over the reference's): each must be at most this.
TIME_TARGETS = {
    "rec.step vs returned + copy_to_host_async": 1.0,
    "rec.step every=10 vs the step": 1.1,
    "rec.step stats vs the step": 1.2,
}
#: The record section's activation: 1024 x 1024 float32 (4 MiB); smaller in the dry run,
#: where a CPU's matrix products would take most of the check's time.
RECORD_SIZE = 256 if DRY_RUN else 1024


class Sink:
    """A callback that counts calls and bytes (touches no data, like a logger's enqueue)."""

    def __init__(self) -> None:
        self.calls = 0
        self.nbytes = 0

    def tap(self, x, transforms=None):
        self.calls += 1
        self.nbytes += x.nbytes

    def io(self, x):
        self.calls += 1
        self.nbytes += np.asarray(x).nbytes


def emitter(kind: str, sink: Sink):
    if kind == "hostfeed":
        return lambda c: hcb.id_tap(sink.tap, c)
    if kind == "io_callback(ordered)":
        return lambda c: io_callback(sink.io, None, c, ordered=True)
    if kind == "debug.callback":
        return lambda c: jax.debug.callback(sink.io, c)
    if kind == "no callback":
        return lambda c: None
    raise ValueError(kind)


def finish(kind: str) -> None:
    if kind == "hostfeed":
        hcb.barrier_wait()
    else:
        jax.effects_barrier()


def tap_case(kind: str, n: int, x, sink: Sink, shape: str):
    emit = emitter(kind, sink)
    if shape == "fori_loop":
        # The tapped array is loop-invariant; the loop carries only a counter.
        @jax.jit
        def f(x):
            def body(i, count):
                emit(x)
                return count + 1
            return lax.fori_loop(0, n, body, 0)
    else:
        @jax.jit
        def f(x):
            for _ in range(n):
                emit(x)
            return jnp.sum(x)

    def go():
        f(x).block_until_ready()
        finish(kind)
    return go


def buffer_step(host, spec):
    """A host call through ``buffer_callback``: on a GPU its buffers are device memory, so
    the callback copies the operand to the host and the result back, on XLA's stream (what
    a user must write); in the dry run on CPU they are host memory."""
    if DRY_RUN:
        def cb(ctx, out, a):
            del ctx
            np.asarray(out)[...] = host(np.asarray(a))
    else:
        copies = StreamCopies()
        operand = np.empty(spec.shape, spec.dtype)

        def cb(ctx, out, a):
            copies.to_host(a, operand, ctx.stream)
            copies.to_device(np.ascontiguousarray(host(operand), spec.dtype), out, ctx.stream)
    return lambda c: buffer_callback(cb, spec)(c)


#: The JAX callbacks a ``call`` is compared with; ``buffer_callback`` needs CUDA's copies
#: (none written for HIP).
CALL_KINDS = ["hostfeed call", "io_callback", "io_callback(ordered)", "pure_callback",
              *(["buffer_callback"] if DRY_RUN or KIND == "cuda" else [])]


def call_step(kind: str):
    spec = jax.ShapeDtypeStruct((4,), jnp.float32)

    def host(v):
        return np.asarray(v) + np.float32(1)

    if kind == "hostfeed call":
        step = lambda c: hcb.call(host, c, result_shape=spec)
    elif kind == "io_callback":
        step = lambda c: io_callback(host, spec, c)
    elif kind == "io_callback(ordered)":
        step = lambda c: io_callback(host, spec, c, ordered=True)
    elif kind == "pure_callback":
        step = lambda c: jax.pure_callback(host, spec, c)
    elif kind == "buffer_callback":
        step = buffer_step(host, spec)
    elif kind == "no callback":
        step = lambda c: c + 1
    else:
        raise ValueError(kind)
    return step


def call_case(kind: str, n: int, shape: str):
    step = call_step(kind)
    if shape == "fori_loop":
        f = jax.jit(lambda x: lax.fori_loop(0, n, lambda i, c: step(c), x))
    else:
        def body(x):
            for _ in range(n):
                x = step(x)
            return x
        f = jax.jit(body)
    x = jnp.zeros(4, jnp.float32)

    def go():
        out = f(x)
        assert float(out[0]) == n, (kind, float(out[0]))  # every call ran, in order
    return go


def dispatch_case(kind: str, n: int):
    """``n`` calls of a jitted function holding one callback (``v + 1`` on float32[4]),
    each waited for: what dispatching it costs."""
    f = jax.jit(call_step(kind))
    x = jnp.zeros(4, jnp.float32)
    f(x).block_until_ready()

    def go():
        for _ in range(n):
            f(x).block_until_ready()
    return go


def pinned_floor(nbytes: int) -> dict[str, float]:
    """GB/s of device-to-host copies of ``nbytes`` into pinned memory."""
    floors = {}
    if DRY_RUN:  # no GPU: a host copy stands in, so that the section runs
        src, dst_buf = np.ones(nbytes, np.uint8), np.empty(nbytes, np.uint8)
        ts = []
        for _ in range(3):
            t0 = time.perf_counter()
            np.copyto(dst_buf, src)
            ts.append(time.perf_counter() - t0)
        floors[FLOOR] = nbytes / min(ts) / 1e9
        return floors
    if KIND == "cuda":
        times = copy_floor(0, nbytes, max(5, REPEATS * 2))
        floors[FLOOR] = nbytes / min(times) / 1e9
    try:  # JAX's own transfer into pinned host memory, where supported
        dev = jax.devices()[0]
        x = jnp.ones(nbytes // 4, jnp.float32)
        dst = jax.sharding.SingleDeviceSharding(dev, memory_kind="pinned_host")
        jax.device_put(x, dst).block_until_ready()
        ts = []
        for _ in range(max(5, REPEATS * 2)):
            t0 = time.perf_counter()
            jax.device_put(x, dst).block_until_ready()
            ts.append(time.perf_counter() - t0)
        floors["jax.device_put to pinned_host"] = nbytes / min(ts) / 1e9
        floors.setdefault(FLOOR, floors["jax.device_put to pinned_host"])  # ROCm: no driver floor
    except Exception as exc:  # noqa: BLE001 - reported, the driver floor stands
        print(f"  (jax.device_put to pinned_host not measured: {type(exc).__name__}: {exc})")
    return floors


def show(results: dict, key: str, title: str, rows: list, baseline: str, *,
         higher: bool) -> None:
    """Prints ``rows`` as a table with ratios to ``baseline`` and keeps them under
    ``results["tables"][key]``."""
    print(table(title, rows, baseline=baseline, higher_is_better=higher))
    results["tables"][key] = {r[0]: r[1] for r in rows}


def save(results: dict, section: str) -> None:
    """Rewrites gpu_bench.json under $OUT with what was measured so far."""
    results["sections_done"].append(section)
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "gpu_bench.json"), "w") as fh:
            json.dump(results, fh, indent=2, default=str)


def main() -> None:
    limit = os.environ.get("GPU_CHECK_BENCH_S")
    if limit:  # a hang dumps every thread's stack before the check's timeout ends it unseen
        faulthandler.dump_traceback_later(max(float(limit) - 10, 1), exit=True)
    results: dict = {"targets": {}, "tables": {}, "sections_done": [], "dry_run": DRY_RUN}
    try:
        jax.devices("cpu")
    except RuntimeError as exc:
        raise SystemExit(
            f"benches/gpu.py needs JAX's CPU backend beside the GPU's (io_callback, "
            f"pure_callback and debug.callback run their function on a CPU device): run it "
            f"with JAX_PLATFORMS={KIND},cpu, not {os.environ.get('JAX_PLATFORMS')!r} "
            f"({exc})") from exc
    dev = jax.devices()[0]
    env = {
        "jax": jax.__version__, "hostfeed": hostfeed.__version__, "device": str(dev),
        "device_kind": getattr(dev, "device_kind", "?"), "backend": jax.default_backend(),
        f"{KIND}_driver": gpu("driver_version")(),
        f"{KIND}_handlers": gpu("status")() or "registered",
        "cpus": os.cpu_count(), "jax_platforms": os.environ.get("JAX_PLATFORMS"),
        "transports": hostfeed.transports(),
    }
    results["environment"] = env
    print("environment:", json.dumps(env))
    if DRY_RUN:
        print("dry run on CPU: small sizes, a host copy as the floor; no target is judged")
    elif jax.default_backend() != "gpu" or gpu("status")() is not None:
        raise SystemExit(f"benches/gpu.py needs a {KIND} GPU with hostfeed's {KIND} handlers")
    save(results, "environment")

    # ---- small taps ------------------------------------------------------------------
    kinds = ["hostfeed", "io_callback(ordered)", "debug.callback", "no callback"]
    small = jnp.arange(4, dtype=jnp.float32)
    for shape in ("straight-line", "fori_loop"):
        sinks = {k: Sink() for k in kinds}
        cases = {k: tap_case(k, N_SMALL, small, sinks[k], shape) for k in kinds}
        res = interleaved(cases, repeats=REPEATS)
        for k in kinds[:-1]:
            assert sinks[k].calls == N_SMALL * (REPEATS + 1), (k, sinks[k].calls)
        rows = [(k, res[k]["min"] / N_SMALL * 1e6, "us/tap") for k in kinds]
        show(results, f"small taps, {shape}", f"small taps ({shape}): {N_SMALL} x float32[4], "
             f"end to end (min of {REPEATS})", rows, "io_callback(ordered)", higher=False)
        results["targets"][f"small tap vs io_callback(ordered), {shape}"] = (
            res["io_callback(ordered)"]["min"] / res["hostfeed"]["min"])
        base = res["no callback"]["min"]
        added = {k: max(res[k]["min"] - base, 1e-12) / N_SMALL * 1e6 for k in kinds[:-1]}
        results["tables"][f"small taps, {shape}, added"] = added
        ratio = added["io_callback(ordered)"] / added["hostfeed"]
        print("  added over the same code without a callback (us/tap): "
              + ", ".join(f"{k} {v:.2f}" for k, v in added.items())
              + f"; io_callback(ordered)/hostfeed {ratio:.1f}x")
        save(results, f"small taps, {shape}")

    # ---- 64 MiB taps -----------------------------------------------------------------
    nbytes = LARGE_ELEMS * 4
    floors = pinned_floor(nbytes)
    big = jnp.arange(LARGE_ELEMS, dtype=jnp.float32)
    kinds = ["hostfeed", "io_callback(ordered)", "debug.callback"]
    sinks = {k: Sink() for k in kinds}
    cases = {k: tap_case(k, N_LARGE, big, sinks[k], "fori_loop") for k in kinds}
    res = interleaved(cases, repeats=REPEATS)
    total = N_LARGE * nbytes
    for k in kinds:
        assert sinks[k].nbytes == total * (REPEATS + 1), (k, sinks[k].nbytes)
    rows = [(k, total / res[k]["min"] / 1e9, "GB/s") for k in kinds]
    rows += [(k, v, "GB/s") for k, v in floors.items()]
    show(results, "64 MiB taps", f"64 MiB taps: {N_LARGE} x float32[{LARGE_ELEMS}], end to "
         f"end (min of {REPEATS})", rows, FLOOR, higher=True)
    median_gbps = total / statistics.median(res["hostfeed"]["all"]) / 1e9
    results["tables"]["64 MiB taps"]["hostfeed (median)"] = median_gbps
    results["targets"]["64 MiB tap vs pinned copy floor"] = (
        total / res["hostfeed"]["min"] / 1e9 / floors[FLOOR])
    save(results, "64 MiB taps")

    # ---- calls -----------------------------------------------------------------------
    kinds = CALL_KINDS
    for shape in ("straight-line", "fori_loop"):  # the target's shape first
        res = interleaved({k: call_case(k, N_CALLS, shape) for k in kinds}, repeats=REPEATS)
        rows = [(k, res[k]["min"] / N_CALLS * 1e6, "us/call") for k in kinds]
        show(results, f"calls, {shape}", f"call round trip ({shape}): {N_CALLS} calls "
             f"float32[4] -> float32[4] (min of {REPEATS})", rows, "io_callback", higher=False)
        results["targets"][f"call vs io_callback, {shape}"] = (
            res["io_callback"]["min"] / res["hostfeed call"]["min"])
        if "buffer_callback" in res:
            results["targets"][f"call vs buffer_callback, {shape}"] = (
                res["buffer_callback"]["min"] / res["hostfeed call"]["min"])
        save(results, f"calls, {shape}")

    # ---- recording a training step's activation ----------------------------------------
    r = record_section(Config(quick=DRY_RUN), both_step_ways=True, size=RECORD_SIZE,
                       label="record")
    ms = r["ms"]
    rows = [(k, v, "ms/step") for k, v in ms.items()]
    show(results, "record", f"recording a training step's {r['activation_bytes'] >> 10} KiB "
         f"activation, {r['steps']} steps (min of the rounds)", rows, "step", higher=False)
    copy = ms["returned + copy_to_host_async, overlapped"]
    for way in ("", ", outputs=True", ", outputs=False"):
        name = "rec.step" if not way else f"rec.step{way}"
        results["targets"][f"{name} vs returned + copy_to_host_async"] = ms[name] / copy
        results["targets"][f"{name} every=10 vs the step"] = ms[f"{name}, every=10"] / ms["step"]
        results["targets"][f"{name} stats vs the step"] = (
            ms[f"{name}, reduce='stats'"] / ms["step"])
    results["targets"]["record inside vs returned + device_get"] = (
        ms["hostfeed Recorder"] / ms["returned + device_get"])
    results["targets"]["io_callback vs returned + device_get"] = (
        ms["io_callback"] / ms["returned + device_get"])
    save(results, "record")

    # ---- dispatch of a function with one call ----------------------------------------
    kinds = ["no callback", *CALL_KINDS]
    res = interleaved({k: dispatch_case(k, N_CALLS) for k in kinds}, repeats=REPEATS)
    rows = [(k, res[k]["min"] / N_CALLS * 1e6, "us/call") for k in kinds]
    show(results, "call dispatch", f"dispatch of a jitted function with one call, waited for: "
         f"{N_CALLS} calls (min of {REPEATS})", rows, "pure_callback", higher=False)
    results["targets"]["call dispatch vs pure_callback"] = (
        res["pure_callback"]["min"] / res["hostfeed call"]["min"])
    results["targets"]["call dispatch vs no callback"] = (
        res["no callback"]["min"] / res["hostfeed call"]["min"])
    save(results, "call dispatch")

    results["receiver"] = hostfeed.receiver_stats()
    results["pinned_pool"] = gpu("pool_stats")()
    print("receiver:", results["receiver"])
    print("pinned pool:", results["pinned_pool"])
    print("targets (ratio, wanted, verdict):")
    ok = True
    for name, got in results["targets"].items():
        if name in TARGETS:
            want, met, sign = TARGETS[name], got >= TARGETS[name], ">="
        elif name in TIME_TARGETS:
            want, met, sign = TIME_TARGETS[name], got <= TIME_TARGETS[name], "<="
        else:
            print(f"  {name:<56}{got:>8.2f}x  (for information)")
            continue
        verdict = "not judged (dry run)" if DRY_RUN else "PASS" if met else "MISS"
        ok &= met
        print(f"  {name:<56}{got:>8.2f}x  {sign} {want:<5}  {verdict}")
    if not DRY_RUN:
        results["all_targets_met"] = ok
    save(results, "summary")


if __name__ == "__main__":
    main()
