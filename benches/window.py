"""The flight recorder's cost: a 4 MiB activation per step kept in a window
(``Recorder(window=32)``, ``keep="window"``) against the same bytes tapped, recorded to
disk every step, and not recorded, side by side in one run.

The step: ``h = x * 1.0001 + s`` with ``x`` float32[1 << 20] (4 MiB), jitted, called from
a Python loop as a training loop calls its step (after ``WARMUP`` steps not timed, which
fill the window and bring the buffer pool to its size), then a wait for everything to
have reached the host (``barrier_wait``; for a recorder, ``flush``: its rows written and
announced). Cases:

* ``no record``: the step alone.
* ``tap``: ``hcb.id_tap`` of ``(h, s)`` whose host function does nothing: the cost of
  moving the same bytes to the host (the device's copy into the queue, the consumer's
  call). Its
  buffer comes back at once, and the next step's copy goes into it while the cache still
  holds it.
* ``tap, keeps 32``: the same tap whose host function keeps the last 32 arrays it got
  (views of their message buffers): what keeping 32 steps costs a tap, each step's copy
  going to memory the cache let go, as a window's does.
* ``window``: ``rec.record("h", h, step=s, keep="window")``: the rows wait in the window,
  in host memory, no disk I/O (nothing fires).
* ``disk``: ``rec.record("h", h, step=s)`` into a store on a local disk (the page cache
  takes the writes: the disk itself is the bottleneck only once the kernel writes back).
* ``disk, durable``: the same with ``durable=True`` (every chunk fsynced): the disk is.
* ``tmpfs``: the same into ``/dev/shm`` (memory: writing every row, no disk at all).

1. The window against the tap (and no record): chunks of ``CHUNK`` steps of each case in
   turn, after four rounds not timed (the buffer pool settles), each chunk's ratio against
   the tap's chunk just before (the load of a shared machine changes from one second to
   the next).
2. Every row to a store against the window: rounds of ``STEPS`` steps, each case in a
   fresh directory (``os.sync()`` before each, so that one case's write-back does not
   slow the next).

Printed: ms per step (median, best) and the ratios (median, range), with the targets:
``window / tap`` at most 1.1, ``disk / window`` at least 3 where the disk is the
bottleneck.

Run: python benches/window.py [DISK_DIR]   (default /work/tmp, else the system temp dir)
Environment: HOSTFEED_BENCH_REPEATS (default 5), HOSTFEED_BENCH_STEPS (default 200).
"""
from __future__ import annotations

import collections
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp

import hostfeed
from hostfeed import host_callback as hcb

REPEATS = int(os.environ.get("HOSTFEED_BENCH_REPEATS", 5))
STEPS = int(os.environ.get("HOSTFEED_BENCH_STEPS", 200))
#: Steps run (not timed) before each timed run: twice the window.
WARMUP = 64
#: Steps of one chunk when the window and the tap run in turn.
CHUNK = 25
ELEMENTS = 1 << 20  # float32: 4 MiB


def make(kind: str, where: str) -> tuple[Callable[[int], float], Callable[[], None]]:
    """A case: a recorder in a fresh directory under ``where`` if it records, and the
    jitted step, warmed up; returns the timed run (``n`` steps and the final wait, in
    seconds per step) and the clean-up."""
    d = tempfile.mkdtemp(dir=where)
    path = os.path.join(d, "r.zarr")
    rec = None
    if kind == "window":
        rec = hostfeed.Recorder(path, window=32)
    elif kind.startswith(("disk", "tmpfs")):
        rec = hostfeed.Recorder(path, durable=kind == "disk, durable")

    kept: collections.deque = collections.deque(maxlen=32)

    def body(x, s):
        h = x * 1.0001 + s.astype(jnp.float32)
        # The taps send the step too, as a record does: the same message (and buffer size,
        # so that the cases' buffers are interchangeable in the pool).
        if kind == "tap":
            h = hcb.id_tap(lambda *a: None, (h, s))[0]
        elif kind == "tap, keeps 32":  # the arrays it gets are views of the message buffers
            h = hcb.id_tap(lambda v, t: kept.append(v), (h, s))[0]
        elif kind == "window":
            h = rec.record("h", h, step=s, keep="window")
        elif rec is not None:
            h = rec.record("h", h, step=s)
        return h

    step = jax.jit(body)
    x = jnp.ones(ELEMENTS, jnp.float32)
    # Compiled, and the window full (its buffers come warm from the pool from then on, as
    # in a long run); the stores get the same rows first.
    for s in range(-WARMUP, 0):
        step(x, jnp.int32(s))
    hcb.barrier_wait()
    if rec is not None:
        rec.flush()

    def run(n: int) -> float:
        start = time.perf_counter()
        h = x
        for s in range(n):
            h = step(x, jnp.int32(s))
        h.block_until_ready()
        if rec is None:
            hcb.barrier_wait()
        else:
            rec.flush()
        return (time.perf_counter() - start) / n

    def done() -> None:
        if rec is not None:
            rec.close()
        shutil.rmtree(d, ignore_errors=True)
    return run, done


def ratios(times: dict[str, list[float]], name: str, base: str) -> list[float]:
    return [a / b for a, b in zip(times[name], times[base])]


def show(times: dict[str, list[float]], base: str) -> None:
    print(f"{'case':<16}{'ms/step':>10}{'best':>10}   {'/ ' + base:<22}")
    for name, ts in times.items():
        rs = ratios(times, name, base)
        print(f"{name:<16}{statistics.median(ts) * 1e3:>10.3f}{min(ts) * 1e3:>10.3f}   "
              f"{statistics.median(rs):.2f} ({min(rs):.2f}-{max(rs):.2f})")


def main(argv: list[str]) -> int:
    disk = argv[0] if argv else ("/work/tmp" if os.path.isdir("/work/tmp")
                                 else tempfile.gettempdir())
    hostfeed.start_receiver(max_queue_byte_size=256_000_000)
    print(f"{ELEMENTS * 4 >> 20} MiB a step; jax {jax.__version__}, {os.cpu_count()} CPUs")

    # 1. The window against a tap: chunks of CHUNK steps of each case in turn (the machine's
    # load changes from one second to the next; a chunk's ratio is against the tap's chunk
    # just before), warm recorders throughout.
    near = {k: make(k, disk) for k in ("no record", "tap", "tap, keeps 32", "window")}
    times: dict[str, list[float]] = {k: [] for k in near}
    for _ in range(4):  # not timed: the pool settles to the buffers the cases pass around
        for run, _ in near.values():
            run(CHUNK)
    for _ in range(REPEATS * 8):
        for name, (run, _) in near.items():
            times[name].append(run(CHUNK))
    for _, done in near.values():
        done()
    print(f"\nin turn: {REPEATS * 8} chunks of {CHUNK} steps of each case")
    show(times, "tap")
    w_tap = statistics.median(ratios(times, "window", "tap"))
    w_keep = statistics.median(ratios(times, "window", "tap, keeps 32"))
    print(f"window / tap: {w_tap:.2f} (target <= 1.1); window / a tap that keeps the "
          f"last 32: {w_keep:.2f}")

    # 2. Every row to a store against the window: rounds of STEPS steps, each case in a
    # fresh directory (its writes must not slow the next case's; os.sync between).
    kinds = ["window", "disk", "disk, durable"] + (["tmpfs"] if os.path.isdir("/dev/shm")
                                                    else [])
    times = {k: [] for k in kinds}
    for r in range(REPEATS):
        for name in kinds:
            run, done = make(name, "/dev/shm" if name == "tmpfs" else disk)
            os.sync()
            times[name].append(run(STEPS))
            done()
        print(f"round {r + 1}/{REPEATS}: " + ", ".join(
            f"{k} {v[-1] * 1e3:.2f}" for k, v in times.items()), file=sys.stderr)
    print(f"\nrounds: {REPEATS} of {STEPS} steps; disk: {disk}")
    show(times, "window")
    for name in kinds[1:]:
        d_w = statistics.median(ratios(times, name, "window"))
        print(f"{name} / window: {d_w:.2f} (target >= 3 where the disk is the bottleneck)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
