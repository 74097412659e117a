"""``python -m hostfeed bench``: callback latency and throughput, hostfeed against JAX's own
callbacks, side by side in one run, on the current backend.

    python -m hostfeed bench [--quick] [--json FILE] [--plot FILE.png] [--only SECTION ...]

Sections (all by default, in this order):

``latency``
    per-tap device-side cost and hand-over latency of a ``float32[4]`` tap in a loop, as
    distributions: hostfeed, ``buffer_callback`` (an identity tap:
    ``input_output_aliases={0: 0}``, ``has_side_effect=True``), ``io_callback(ordered=True)``,
    ``io_callback``, ``jax.debug.callback``, ``pure_callback``; and hostfeed with device work
    between taps (``hostfeed (spaced taps)``), whose hand-over latency is that of an idle
    receiver.
``sweep``
    GB/s from 16 B to 64 MiB per tap, end to end, against a numpy copy of the same bytes.
``throughput``
    4 MiB taps until every function ran, with a function that sums the array and one that
    does nothing, against the floor (a numpy copy passed to the same function); hostfeed
    also with the device's thread running on where it lets the receiver thread catch up on
    a shared CPU, and with streaming copies (off by default;
    :mod:`hostfeed.bench._throughput`). ``--n-64mb N``: the bytes each method moves per
    round, N times 64 MiB.
``call``
    round trip of ``float32[4] -> float32[4]`` host calls: ``hcb.call``, ``buffer_callback``,
    ``pure_callback``, ``io_callback`` (ordered and not), and the host function alone (the
    floor); then again with the machine loaded by one busy process per core.
``dispatch``
    a small jitted function with one callback, dispatched and waited for, per call: no
    callback, ``id_tap``, ``call``, each JAX callback, and the ``id_tap`` function compiled
    ahead of time.
``backpressure``
    a slow host function with several queue bounds: device time, blocked time, peak queued
    bytes.
``eager``, ``compile``, ``barrier``
    an eager tap; compile time with many taps (result used and ignored); an idle
    ``barrier_wait``.
``timing``
    what recording the latency histograms costs a small tap, and the profiler check.
``portable``
    the portable transport (JAX's host-callback lowering, what TPUs and ROCm use) forced
    here, beside the native one and ``io_callback(ordered=True)``: taps, calls, and 100
    slow (10 ms) taps against 100 no-op taps (see :mod:`hostfeed.bench._portable`).

On a TPU (``--suite tpu``, chosen by default when JAX's default backend is a TPU) the
sections are those of :mod:`hostfeed.bench._tpu` instead (``taps``, ``slow_taps``,
``call``, ``dispatch``, ``record``, ``sweep``, ``barrier``, ``compile``, ``paths``):
against JAX's callbacks only, on the scale of a TPU's host transfers, with the issue's
targets as ratios at the end. ``--suite tpu`` on a CPU runs them as a dry run (the raw
transfers of ``paths`` record that the CPU has none).

Every ratio in the report is a time ratio (a row's time over the named baseline's; below
1.00x is faster), against the fastest JAX callback of that row unless named otherwise.
The sections that compare (latency, sweep, throughput, call, dispatch, barrier, ...) run
their cases in interleaved rounds, so that a slow stretch of the machine hits them alike
(the order alternating between rounds where the figures swing most); a ratio is the
median of the rounds' ratios, printed with the interval that median lies in (90%
confidence) and marked ``~`` (noisy) where that interval is wider than 15%: two runs may
then differ by more. The report ends with the README's table: each of its rows (named as
there), this run's figure beside the committed one of the same processor and its range
over those committed runs, and where in the report the figure comes from.
``--quick`` takes about a minute on 2 cores; the full run takes 3-5 minutes there
(the compile section alone compiles 200-tap functions six ways, twice).

JSON schema (``--json``), version ``hostfeed-bench/1``: an object with ``schema``,
``header`` (``hostfeed``, ``jax``, ``jaxlib``, ``numpy``, ``python``, ``platform``,
``backend``, ``devices``, ``device_count``, ``cpu`` (the processor's model name),
``processor`` (``model``, and where the system gives them ``vendor``, ``family``,
``model_number``, ``stepping``, ``caches_kib``: absent from runs before it was recorded),
``cores``, ``load_average`` (the
1-minute load average when the run started; ``load_average_end`` when it ended: absent
from runs before it was recorded), ``env``, ``quick``, ``started``) and one key per section
run. A *distribution* is ``{"count", "mean", "p50", "p90", "p99", "p999", "max"}``; a *CDF*
is ``[[value, fraction], ...]``.

* ``latency``: ``{"payload", "taps", "rounds", "methods": {name: {"device_us":
  distribution, "device_cdf_us": CDF, "handover_us": distribution or null,
  "handover_cdf_us": CDF (hostfeed only), "device_side_per_tap_us",
  "end_to_end_per_tap_us", "rounds_device_us", "rounds_end_to_end_us",
  "rounds_device_p50_us", "rounds_handover_p50_us" (hostfeed, and hostfeed (spaced
  taps) with the per-tap figures and distributions alone)}}, "floors":
  {"xla_custom_call", "numpy"}}`` (per tap: the fastest round's, and each round's; each
  round's median cost of a tap and hand-over;
  floors in µs per tap: XLA calling a handler that does nothing in the same loop;
  copying the bytes and calling the function in Python)
* ``sweep``: ``{"sizes": [bytes, ...], "methods": {name: [{"bytes", "taps", "taps_per_s",
  "gb_per_s", "rounds_gb_per_s"}, ...]}}`` (the fastest round's, and each round's;
  ``numpy copy`` is the floor; ``numpy copy, 2 buffers`` the floor of a tap that copies
  asynchronously: alternately into two buffers)
* ``throughput``: ``{"payload_bytes", "taps", "rounds", "functions": {function: {method:
  {"gb_per_s", "rounds_gb_per_s"}}}}`` (taps per round; GB/s of the median round, and
  each round's; methods ``hostfeed``, ``hostfeed, device thread runs on``, ``hostfeed,
  streaming copies``, ``numpy copy``, ``numpy copy, 2 buffers``; functions ``sums the
  array``, ``does nothing``; ``"warm_up": {function: {"runs", "pool_bytes"}}``: the runs of
  hostfeed's methods before the rounds, until the buffer pool stopped growing, and its
  idle bytes then)
* ``call``: ``{"calls", "methods": {name: {"p50_us", "rounds_p50_us", "round_trip_us":
  distribution, "round_trip_cdf_us": CDF, "per_call_us"}}, "loaded": {"calls",
  "busy_processes", "methods": ...}}`` (``p50_us``: the median round trip of the fastest
  round; the distribution pools every round; ``host function alone`` is the floor)
* ``dispatch``: ``{"calls", name: {"us", "rounds_us"}, ...}`` (per call, waited for: the
  fastest round's, and each round's)
* ``backpressure``: ``{"host_us_per_tap", "tap_bytes", "taps", "runs": [{"method",
  "bound_bytes", "device_s", "end_to_end_s", "blocked_s", "blocked_count",
  "peak_queued_bytes"}, ...]}`` (null where a method has no queue)
* ``eager``: ``{"taps", "hostfeed": {"per_tap_us", "rounds_us"}, "debug.callback": ...,
  "buffer_callback": ..., "hostfeed, fresh function": ..., "debug.callback, fresh
  function": ..., "rss_growth_mb", "registered_consumers_growth"}`` (per tap: the median
  round's, and each round's)
* ``compile``: ``{"taps", name: {"seconds", "rounds_seconds"}, ...}`` (the fastest round's,
  and each round's)
* ``barrier``: ``{"calls", "marked devices", "hostfeed barrier_wait": {"us"},
  "jax.effects_barrier": {"us"}, "hostfeed barrier_wait, no device to mark": {"us"}}``
  (``marked devices``: the fast-dispatch devices a barrier runs a marker on)
* ``timing``: ``{"taps", "per_tap_us_timing_on", "per_tap_us_timing_off", "cost_us_per_tap",
  "profiler_check_us_per_batch"}``
* ``portable``: ``{"payload", "taps_per_run", "calls_per_run", "taps": {name:
  {"device_side_per_tap_us", "end_to_end_per_tap_us", "rounds_device_us"}}, "calls": {name:
  {"per_call_us"}}, "slow_taps": {"taps", "host_ms_per_tap", "slow_device_s",
  "noop_device_s", "ratio", "rounds_ratio"}}`` (medians of rounds; see
  :mod:`hostfeed.bench._portable`)

The helpers every benchmark under ``benches/`` shares (``interleaved``, ``timeit``,
``table``, distributions) live here too, so there is one benchmark implementation.

Example:
    >>> from hostfeed import bench
    >>> sorted(bench.SECTIONS)[:3]
    ['backpressure', 'barrier', 'call']
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, TextIO

import jax

from .. import host_callback as hcb
from .._src import measuring
from . import _report, _tpu
from ._portable import portable_section
from ._receiver_sections import backpressure, barrier, compile_time, eager
from ._sections import Config, call, dispatch, latency, sweep, timing_cost
from ._throughput import throughput

from ._timing import (cdf_of_buckets, cdf_of_samples, interleaved, summary_of_buckets,
                      summary_of_samples, table, timeit)

#: The sections, in the order they run and print.
SECTIONS: dict[str, Callable[[Config], dict]] = {
    "latency": latency, "sweep": sweep, "throughput": throughput, "call": call,
    "dispatch": dispatch,
    "backpressure": backpressure, "eager": eager, "compile": compile_time, "barrier": barrier,
    "timing": timing_cost, "portable": portable_section,
}


__all__ = [
    "SECTIONS", "SCHEMA", "run", "main", "interleaved", "timeit", "table",
    "summary_of_samples", "summary_of_buckets", "cdf_of_samples", "cdf_of_buckets",
]

SCHEMA = "hostfeed-bench/1"
#: What the command measures, in one line (``--help``).
DESCRIPTION = ("Times hostfeed's taps, calls, barriers and compiles side by side with JAX's "
               "own callbacks in one run, and prints time ratios (below 1.00x: faster).")


def _progress(total: int, out: TextIO | None = None
              ) -> tuple[Callable[[str], None], Callable[[], None]]:
    """A progress reporter on ``out`` (``sys.stderr`` as it is at the call): on a terminal a
    tqdm bar when tqdm is installed, else a line a step; elsewhere (output redirected to a
    file or a pipe, a CI log) a line a section, as it starts, so that a log stays short.
    A step is named ``"section: detail"``."""
    out = sys.stderr if out is None else out
    tty = hasattr(out, "isatty") and out.isatty()
    if not tty:
        start, seen = time.perf_counter(), [""]  # the sections said, the last at the end

        def section(step: str) -> None:
            name = step.split(":", maxsplit=1)[0]
            if seen[-1] != name:
                seen.append(name)
                print(f"bench: {name} ({time.perf_counter() - start:.0f} s in)", file=out,
                      flush=True)

        return section, lambda: None
    try:
        from tqdm import tqdm
    except ImportError:
        count = [0]

        def line(step: str) -> None:
            count[0] += 1
            print(f"[{count[0]}/{total}] {step}", file=out, flush=True)

        return line, lambda: None
    bar = tqdm(total=total, unit="step", file=out, leave=False)

    def step(name: str) -> None:
        bar.set_description(name)
        bar.update(1)

    return step, bar.close


#: The suites of sections: ``cpu`` (any backend with ``buffer_callback``) and ``tpu``.
SUITES: dict[str, dict[str, Callable[[Config], dict]]] = {"cpu": SECTIONS,
                                                          "tpu": _tpu.SECTIONS}


def suite_for(suite: str = "auto") -> str:
    """The suite that ``suite`` names (``"auto"``: ``tpu`` when JAX's default backend is
    a TPU, else ``cpu``).

    Example:
        >>> suite_for("tpu"), suite_for("auto") in SUITES
        ('tpu', True)
    """
    if suite == "auto":
        return "tpu" if jax.default_backend() == "tpu" else "cpu"
    if suite not in SUITES:
        raise ValueError(f"unknown bench suite {suite!r}; choose from auto, {', '.join(SUITES)}")
    return suite


def _steps(sections: Sequence[str], quick: bool, suite: str) -> int:
    if suite == "tpu":
        return len(sections) + (3 if quick else 4)  # the sweep counts a step a size
    per = {"latency": 9, "sweep": 4 if quick else 12, "throughput": 2, "call": 10,
           "dispatch": 1,
           "backpressure": 4, "eager": 1, "compile": 1, "barrier": 1, "timing": 1,
           "portable": 3}
    return sum(per[s] for s in sections)


def run(sections: Sequence[str] | None = None, *, quick: bool = False,
        progress: Callable[[str], None] | None = None, suite: str = "auto",
        n_64mb: int | None = None) -> dict[str, Any]:
    """Runs the given sections (all of the suite by default) and returns the result (the
    JSON schema above; on the ``tpu`` suite a section that fails holds its ``error``).
    ``n_64mb``: the bytes each method of the throughput section moves per round, in 64 MiB
    (None: 1 quick, 4 full)."""
    quick = measuring.flag(quick, "hostfeed.bench.run: quick")
    suite = suite_for(suite)
    table = SUITES[suite]
    chosen = list(sections or table)
    unknown = [s for s in chosen if s not in table]
    if unknown:
        raise ValueError(f"unknown bench sections {unknown} (the {suite} suite); choose "
                         f"from {list(table)}")
    header = _report.header(quick)
    header["suite"] = suite
    result: dict[str, Any] = {"schema": SCHEMA, "header": header}
    if n_64mb is not None and (isinstance(n_64mb, bool) or not isinstance(n_64mb, int)
                               or n_64mb < 1):
        raise ValueError(f"n_64mb must be a whole number of 64 MiB, at least 1; got {n_64mb!r}")
    cfg = Config(quick=quick, progress=progress or (lambda step: None), n_64mb=n_64mb)
    # hostfeed's taps as the sections measure them: asynchronous, unless a row says
    # synchronous (the latency section's "hostfeed (sync)", the dispatch section's
    # "hostfeed id_tap, synchronous": the default mode on CPUs and GPUs).
    with hcb.sync_taps(False):
        for name in chosen:
            result[name] = _tpu.run_section(name, cfg) if suite == "tpu" else table[name](cfg)
    header["load_average_end"] = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    if suite == "tpu":
        result["targets"] = _tpu.targets(result)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    """The ``bench`` command; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m hostfeed bench",
        description=DESCRIPTION)
    add_arguments(parser)
    return run_command(parser.parse_args(argv))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``bench`` command's options (shared with ``python -m hostfeed``)."""
    parser.add_argument("--quick", action="store_true",
                        help="fewer sizes and repeats: about a minute")
    parser.add_argument("--json", metavar="FILE", help="write the results as JSON")
    parser.add_argument("--plot", metavar="FILE.png",
                        help="write a figure (needs matplotlib: pip install matplotlib)")
    every = list(dict.fromkeys([*SECTIONS, *_tpu.SECTIONS]))
    parser.add_argument("--only", nargs="+", metavar="SECTION", choices=every,
                        help=f"sections to run (default: all of the suite): "
                             f"{', '.join(SECTIONS)}; on a TPU {', '.join(_tpu.SECTIONS)}")
    parser.add_argument("--n-64mb", type=_positive, metavar="N", default=None,
                        help="throughput section: bytes each method moves per round, N "
                             "times 64 MiB (default: 1 with --quick, else 4)")
    parser.add_argument("--suite", choices=["auto", *SUITES], default="auto",
                        help="the sections of a CPU or GPU (cpu) or of a TPU (tpu); auto: "
                             "by JAX's default backend")


def _positive(text: str) -> int:
    """A whole number of at least 1 (an option's value)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"a whole number of at least 1, not {text!r}")
    return value


def _unwritable(path: str) -> str | None:
    """Why ``path`` cannot be written (checked before the run, which takes minutes), or
    None."""
    target = os.path.abspath(path)
    if os.path.isdir(target):
        return "is a folder; name a file"
    folder = os.path.dirname(target)
    if not os.path.isdir(folder):
        return f"the folder {folder} does not exist"
    if not os.access(folder, os.W_OK) or (os.path.exists(target)
                                          and not os.access(target, os.W_OK)):
        return "cannot be written (permission denied)"
    return None


def run_command(args: argparse.Namespace) -> int:
    """Runs the ``bench`` command for parsed ``args``."""
    if args.plot:
        try:
            import matplotlib  # noqa: F401 - fail before measuring, not after
        except ImportError:
            print("--plot needs matplotlib: pip install matplotlib", file=sys.stderr)
            return 2
    for flag, path in (("--json", args.json), ("--plot", args.plot)):
        problem = _unwritable(path) if path else None
        if problem:
            print(f"{flag} {path}: {problem}", file=sys.stderr)
            return 2
    suite = suite_for(args.suite)
    sections = args.only or list(SUITES[suite])
    foreign = [s for s in sections if s not in SUITES[suite]]
    if foreign:
        print(f"--only: {', '.join(foreign)} not in the {suite} suite "
              f"({', '.join(SUITES[suite])})", file=sys.stderr)
        return 2
    if args.plot and (suite == "tpu" or not any(s in _report.PLOTTED for s in sections)):
        print(_report.nothing_to_plot(sections), file=sys.stderr)
        return 2
    step, close = _progress(_steps(sections, args.quick, suite))
    try:
        result = run(sections, quick=args.quick, progress=step, suite=suite,
                     n_64mb=args.n_64mb)
    finally:
        close()
    print(_report.text(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1, allow_nan=False)
    if args.plot:
        _report.plot(result, args.plot)
    failed = [k for k, v in result.items() if isinstance(v, dict) and "error" in v]
    return 1 if failed else 0
