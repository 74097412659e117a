"""The ``throughput`` section of ``python -m hostfeed bench``: 4 MiB taps in a loop until
every function ran, against the floor of what an asynchronous tap does with them (copy the
bytes, then call the same function with the copy), with a tap function that reads every
byte (a sum, as a function that logs statistics or writes the array does) and with one
that touches none.

hostfeed runs three times: as it ships; with the device's thread running on after each
tap where it would otherwise let the receiver thread catch up on a CPU the two share
(``measuring.cpu_share(keep_in_step=False)``), what that saves where the two take turns
on one core (a machine whose other cores are busy); and with a device's thread on another
core than the receiver's copying large taps with non-temporal stores (``stream=True``, off
by default: the bytes then go to memory, and a function that reads them reads them from
there). The scheduler decides where the threads run; a run shows what this machine's
placement gave it.

``--n-64mb N`` sets how many bytes each method moves per round: N times 64 MiB (16 taps
of 4 MiB per 64 MiB). Every method runs once per round, in interleaved rounds whose order
alternates (ABC, then CBA), so that a slow stretch of the machine hits all of them; each
ratio is the median over the rounds of that round's time ratio.

The section measures the steady state. A process's first 4 MiB taps find the buffer pool
empty: each buffer the device's thread copies into is fresh memory, whose pages the
kernel faults in and zeroes at the first write (on this project's EPYC virtual machines,
tens of times a warm buffer's copy). The pool keeps the buffers when their functions
return, so the cost is paid once per buffer of the working set (as many as the device's
thread runs ahead of the tap functions), but the working set grows over a few runs, and a
round that grows it is that much slower. Before the rounds, hostfeed's methods therefore
run until the pool stops growing (:data:`WARM_STABLE` runs in a row without a new
buffer, at most :data:`WARM_MAX` runs); the output says how many runs that took and how
many bytes the pool then held.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._src import measuring
from .. import host_callback as hcb
from ._sections import Config, loop, tap_step
from ._text import grid
from ._timing import AGREEMENT, interleaved, paired

#: Bytes of one tap.
PAYLOAD = 4 << 20
#: The tap functions: what each does with the array it is given.
FUNCTIONS: dict[str, Callable[[np.ndarray], object]] = {
    "sums the array": lambda a: a.sum(),
    "does nothing": lambda a: None,
}
#: hostfeed as it ships, without the device thread's yield on a shared CPU, and with
#: streaming copies on another.
HOSTFEED = "hostfeed"
NO_YIELD = "hostfeed, device thread runs on"
STREAMING = "hostfeed, streaming copies"
#: The floors: a copy into a fresh array (freed before the next: one hot buffer), and
#: alternately into two (what an asynchronous tap needs at least), each then passed to the
#: same function.
FLOOR = "numpy copy"
FLOOR_2 = "numpy copy, 2 buffers"
METHODS = (HOSTFEED, NO_YIELD, STREAMING, FLOOR, FLOOR_2)
#: Warm-up: runs in a row that leave the pool's idle bytes where they were, and the most
#: runs of hostfeed's methods (each method once per run) before the rounds.
WARM_STABLE = 2
WARM_MAX = 12


def throughput(cfg: Config) -> dict:
    """Each tap function's rounds: every method's GB/s, in each round and at its median."""
    per_64mb = (64 << 20) // PAYLOAD
    n = max(1, cfg.n_64mb if cfg.n_64mb is not None else cfg.n(1, 4)) * per_64mb
    rounds = cfg.n(7, 9)
    x = jnp.zeros(PAYLOAD // 4, jnp.float32)
    out: dict[str, Any] = {"payload_bytes": PAYLOAD, "taps": n, "rounds": rounds,
                           "functions": {}, "warm_up": {}}
    for name, func in FUNCTIONS.items():
        cfg.progress(f"throughput: {name}")
        cases = _cases(n, x, func)
        warm_runs, pool = warm_pool([cases[m] for m in (HOSTFEED, NO_YIELD, STREAMING)])
        res = interleaved(cases, repeats=rounds, alternate=True)
        out["functions"][name] = {
            m: {"gb_per_s": n * PAYLOAD / r["median"] / 1e9,
                "rounds_gb_per_s": [n * PAYLOAD / t / 1e9 for t in r["all"]]}
            for m, r in res.items()}
        out["warm_up"][name] = {"runs": warm_runs, "pool_bytes": pool}
    return out


def warm_pool(runs: list[Callable[[], object]], stable: int = WARM_STABLE,
              most: int = WARM_MAX) -> tuple[int, int]:
    """Runs every one of ``runs`` in turn until the buffer pool's idle bytes after a turn
    are those of the turn before ``stable`` times in a row (or ``most`` turns ran);
    returns the turns and the pool's idle bytes then.

    Example:
        >>> warm_pool([lambda: None], stable=2, most=5)[0]
        2
    """
    idle = measuring.stats()["buffer_pool_idle_bytes"]
    turns = same = 0
    while turns < most and same < stable:
        for run in runs:
            run()
        turns += 1
        now = measuring.stats()["buffer_pool_idle_bytes"]
        same = same + 1 if now <= idle else 0
        idle = max(idle, now)
    return turns, idle


def _cases(n: int, x: jax.Array, func: Callable[[np.ndarray], object]
           ) -> dict[str, Callable[[], object]]:
    host_x = np.asarray(x)
    sink: list[object] = []

    def record(a: Any) -> None:
        sink.append(func(a))

    f = loop(n, tap_step("hostfeed", record))
    tap_fn = lambda a, tr: record(a)  # what hostfeed's tap calls

    def taps(keep_in_step: bool = True, stream: bool = False) -> Callable[[], None]:
        def go() -> None:
            with measuring.cpu_share(keep_in_step, stream):
                f(x).block_until_ready()
                hcb.barrier_wait()
            sink.clear()
        return go

    def copy() -> None:
        for _ in range(n):
            tap_fn(np.array(host_x, copy=True), ())
        sink.clear()

    two = [np.empty_like(host_x), np.empty_like(host_x)]

    def copy_two() -> None:
        for i in range(n):
            np.copyto(two[i % 2], host_x)
            tap_fn(two[i % 2], ())
        sink.clear()

    return {HOSTFEED: taps(), NO_YIELD: taps(keep_in_step=False), STREAMING: taps(stream=True),
            FLOOR: copy, FLOOR_2: copy_two}


def ratios(methods: dict[str, Any], method: str, floor: str = FLOOR) -> list[float]:
    """``method``'s time over ``floor``'s in each round (a byte's time: the floor's GB/s
    over the method's).

    Example:
        >>> ratios({"a": {"rounds_gb_per_s": [5.0, 10.0]},
        ...         "b": {"rounds_gb_per_s": [10.0, 10.0]}}, "a", "b")
        [2.0, 1.0]
    """
    return [b / a for a, b in zip(methods[method]["rounds_gb_per_s"],
                                  methods[floor]["rounds_gb_per_s"], strict=True)]


def render(r: dict) -> list[str]:
    """The section as text lines."""
    rows = []
    for name, methods in r["functions"].items():
        for m, v in methods.items():
            cells = [name, m, f"{v['gb_per_s']:.3g}"]
            for floor in (FLOOR, FLOOR_2):
                s = paired(ratios(methods, m, floor))
                cells += [f"{s.median:.2f}x", s.spread()]
            rows.append(cells)
    mb = r["taps"] * r["payload_bytes"] >> 20
    warm = [f"  before the rounds ({name}): hostfeed's methods ran {w['runs']} time(s) until "
            f"the buffer pool stopped growing, then holding {w['pool_bytes'] >> 20} MiB"
            for name, w in r.get("warm_up", {}).items()]
    return [f"throughput: {r['taps']} taps of {r['payload_bytes'] >> 20} MiB in a loop "
            f"({mb} MiB per method per round, {r['rounds']} interleaved rounds), GB/s until "
            f"every function ran (the median round); time ratios over the floor (a numpy "
            f"copy of the same bytes passed to the same function), the median of the "
            f"rounds' ratios, and the interval it lies in ('~': wider than "
            f"{AGREEMENT:.0%}, two runs may differ by more)",
            *grid(["tap function", "method", "GB/s", "/ numpy copy", "interval",
                   "/ 2 buffers", "interval"], rows), *warm]
