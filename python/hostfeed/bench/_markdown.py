"""Markdown tables of ``python -m hostfeed bench`` results, for the README and the docs.

Every performance figure the README and the documentation give is one of these tables,
generated from committed runs (``docs/bench.json``, the run they cite, and the full runs
under ``docs/bench-repeats/``, which give each ratio's range): ``docs/figures.py``
rewrites them and CI checks that they match.
"""
from __future__ import annotations

import datetime
import math
import pprint
import statistics
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from . import _processor
from ._markdown_tpu import TPU_RECORD_TABLES, TPU_TABLES, tpu_machine  # noqa: F401 (figures.py)
from ._timing import balanced, paired

Run = dict[str, Any]

#: The JAX callbacks a row of hostfeed is compared with (the fastest one measured wins).
JAX_CALLBACKS = ("buffer_callback", "pure_callback", "io_callback", "io_callback(ordered)",
                 "debug.callback")


class Figure(NamedTuple):
    """One row: hostfeed's value, the baseline's value and name, hostfeed's time ratio
    (NaN for a row without a baseline, whose range is then of ``value``, in µs), and where
    the run measured it round by round, the ratio (or the value) in each round: the
    figure is then their median, and :func:`~hostfeed.bench._timing.paired` says how far
    it can be trusted (a *noisy* figure: two runs may differ by more than 15%)."""
    hostfeed: str
    baseline: str
    ratio: float
    value: float = math.nan
    rounds: tuple[float, ...] = ()

    @property
    def noisy(self) -> bool:
        """Whether its rounds say two runs may differ by more than
        :data:`~hostfeed.bench._timing.AGREEMENT` (False without rounds)."""
        return bool(self.rounds) and paired(self.rounds).noisy


def _us(v: float) -> str:
    return f"{v:.3g} µs" if v < 10 else f"{v:.0f} µs" if v >= 100 else f"{v:.1f} µs"


def paired_rounds(run: Run) -> bool:
    """Whether a run's figures are the medians of its rounds' ratios: every run since the
    bench recorded the processor. A run from before (its header has no ``processor``) keeps
    the figures it was published with: each method's fastest round.

    Example:
        >>> paired_rounds({"header": {"processor": {"model": "AMD EPYC"}}})
        True
        >>> paired_rounds({"header": {"cpu": "Intel(R) Xeon(R) Processor"}})
        False
    """
    return "processor" in run["header"]


def _median(values: Sequence[float]) -> float:
    return statistics.median(values)


def _best(values: dict[str, float]) -> tuple[str, float]:
    """The fastest JAX callback among ``values`` (name, value)."""
    name = min((k for k in JAX_CALLBACKS if values.get(k)), key=values.__getitem__)
    return name, values[name]


def round_ratios(mine: Sequence[float], base: Sequence[float]) -> tuple[float, ...]:
    """``mine``'s time over ``base``'s in each round (both measured in the same rounds).

    Example:
        >>> round_ratios([2.0, 3.0], [1.0, 2.0])
        (2.0, 1.5)
    """
    return tuple(a / b for a, b in zip(mine, base) if b)


def _against_best(values: dict[str, float], mine: str,
                  rounds: dict[str, Sequence[float] | None] | None = None,
                  show: Callable[[float], str] | None = None,
                  center: Callable[[Sequence[float]], float] | None = None) -> Figure:
    """Method ``mine`` against the fastest JAX callback. With ``rounds`` (each method's
    figure in each interleaved round, for every method in ``values``), the fastest by its
    median round, the ratio the median of the rounds' ratios (or ``center`` of them);
    otherwise the single figures of ``values``."""
    show = show or _us
    if rounds and all(rounds.get(k) for k in values):
        given = {k: v for k, v in rounds.items() if k in values and v}
        medians = {k: _median(v) for k, v in given.items()}
        name, best = _best(medians)
        ratios = round_ratios(given[mine], given[name])
        return Figure(show(medians[mine]), f"{show(best)} (`{name}`)",
                      (center or _median)(ratios), rounds=ratios)
    name, best = _best(values)
    return Figure(show(values[mine]), f"{show(best)} (`{name}`)", values[mine] / best)


def _dispatch(what: str) -> Callable[[Run], Figure | None]:
    def figure(run: Run) -> Figure | None:
        d = run.get("dispatch")
        if not d or what not in d:
            return None
        rows = {k: v for k, v in d.items() if isinstance(v, dict)}
        us = {k: v["us"] for k, v in rows.items()}
        rounds = {k: v["rounds_us"] for k, v in rows.items()
                  if v.get("rounds_us") and paired_rounds(run)}
        f = _against_best(us, what, rounds)
        none = _median(rounds["no callback"]) if rounds else us["no callback"]
        return f._replace(hostfeed=f"{f.hostfeed} (no callback: {_us(none)})")
    return figure


def _tap_methods(run: Run) -> dict[str, Any] | None:
    methods = run.get("latency", {}).get("methods")
    return {k: m for k, m in methods.items() if k != "hostfeed (spaced taps)"} \
        if methods else None


def _small_tap(key: str) -> Callable[[Run], Figure | None]:
    rounds_key = {"device_side_per_tap_us": "rounds_device_us",
                  "end_to_end_per_tap_us": "rounds_end_to_end_us"}[key]

    def figure(run: Run) -> Figure | None:
        methods = _tap_methods(run)
        if not methods:
            return None
        return _against_best({k: m[key] for k, m in methods.items()}, "hostfeed",
                             {k: m.get(rounds_key) for k, m in methods.items()}
                             if paired_rounds(run) else None)
    return figure


def _handover(method: str) -> Callable[[Run], Figure | None]:
    def figure(run: Run) -> Figure | None:
        m = run.get("latency", {}).get("methods", {}).get(method)
        rounds = tuple((m or {}).get("rounds_handover_p50_us") or ())
        p50 = _median(rounds) if rounds else ((m or {}).get("handover_us") or {}).get("p50")
        if p50 is None:
            return None
        return Figure(_us(p50), "none: a JAX callback runs its function inside the "
                      "computation (as `sync=True` does: the synchronous row)", math.nan, p50,
                      rounds)
    return figure


def _sync_tap(run: Run) -> Figure | None:
    methods = _tap_methods(run)
    if not methods or "hostfeed (sync)" not in methods:
        return None
    return _against_best({k: m["device_us"]["p50"] for k, m in methods.items()},
                         "hostfeed (sync)",
                         {k: m.get("rounds_device_p50_us") for k, m in methods.items()}
                         if paired_rounds(run) else None)


def _gb(v: float) -> str:
    return f"{v:.1f} GB/s"


def _large_taps(floor: bool) -> Callable[[Run], Figure | None]:
    def figure(run: Run) -> Figure | None:
        sweep = run.get("sweep")
        if not sweep or 4194304 not in sweep["sizes"]:
            return None
        i = sweep["sizes"].index(4194304)
        points = {k: pts[i] for k, pts in sweep["methods"].items()}
        gbps = {k: p["gb_per_s"] for k, p in points.items()}
        if floor:
            base = "numpy copy, 2 buffers"
            what = "numpy copy into two buffers, alternately: the copy an asynchronous tap makes"
        else:
            base = max((k for k in JAX_CALLBACKS if gbps.get(k)), key=gbps.__getitem__)
            what = f"`{base}`"
        # A byte's time: the baseline's GB/s over hostfeed's, round by round.
        ratios = round_ratios(points[base].get("rounds_gb_per_s") or [],
                              points["hostfeed"].get("rounds_gb_per_s") or []
                              ) if paired_rounds(run) else ()
        if ratios:
            mine = _median(points["hostfeed"]["rounds_gb_per_s"])
            theirs = _median(points[base]["rounds_gb_per_s"])
            return Figure(_gb(mine), f"{_gb(theirs)} ({what})", _median(ratios),
                          rounds=ratios)
        return Figure(_gb(gbps["hostfeed"]), f"{_gb(gbps[base])} ({what})",
                      gbps[base] / gbps["hostfeed"])
    return figure


def _throughput(function: str, method: str = "hostfeed") -> Callable[[Run], Figure | None]:
    def figure(run: Run) -> Figure | None:
        t = (run.get("throughput") or {}).get("functions", {}).get(function)
        if not t:
            return None
        floor = "numpy copy"
        ratios = round_ratios(t[floor]["rounds_gb_per_s"], t[method]["rounds_gb_per_s"])
        return Figure(_gb(_median(t[method]["rounds_gb_per_s"])),
                      f"{_gb(_median(t[floor]['rounds_gb_per_s']))} (numpy copy passed to "
                      f"the same function: the floor)", _median(ratios), rounds=ratios)
    return figure


def call_p50(m: dict[str, Any]) -> float:
    """A call method's median round trip: its fastest round's (``p50_us``), or in runs
    without rounds the median of all its calls.

    Example:
        >>> call_p50({"p50_us": 2.5, "round_trip_us": {"p50": 3.0}})
        2.5
    """
    return float(m.get("p50_us") or m["round_trip_us"]["p50"])


def _round_trip(loaded: bool) -> Callable[[Run], Figure | None]:
    def figure(run: Run) -> Figure | None:
        call = run.get("call")
        if not call or (loaded and "loaded" not in call):
            return None
        methods = (call["loaded"] if loaded else call)["methods"]
        return _against_best({k: call_p50(m) for k, m in methods.items()}, "hostfeed call",
                             {k: m.get("rounds_p50_us") for k, m in methods.items()}
                             if paired_rounds(run) else None)
    return figure


def _eager(run: Run) -> Figure | None:
    e = run.get("eager")
    if not e:
        return None
    rows = {k: v for k, v in e.items() if isinstance(v, dict)}
    # Its rounds alternate their order, and hostfeed's after the others' differ from
    # those after its own: the two orders weigh alike.
    return _against_best({k: v["per_tap_us"] for k, v in rows.items()}, "hostfeed",
                         {k: v.get("rounds_us") for k, v in rows.items()}
                         if paired_rounds(run) else None, center=balanced)


def _s(v: float) -> str:
    return f"{v:.2f} s"


def _compile(run: Run) -> Figure | None:
    c = run.get("compile")
    if not c:
        return None
    rows = {k: v for k, v in c.items() if isinstance(v, dict)}
    return _against_best({k: v["seconds"] for k, v in rows.items()}, "hostfeed",
                         {k: v.get("rounds_seconds") for k, v in rows.items()}
                         if paired_rounds(run) else None, _s)


def _barrier_pair(run: Run, base_name: str, label: str) -> Figure | None:
    b = run.get("barrier")
    base = next((v for k, v in (b or {}).items() if k.startswith(base_name)), None)
    if base is None:
        return None
    mine = b["hostfeed barrier_wait"]  # type: ignore[index]
    ratios = round_ratios(mine.get("rounds_us") or [], base.get("rounds_us") or []
                          ) if paired_rounds(run) else ()
    if ratios:
        return Figure(_us(_median(mine["rounds_us"])),
                      f"{_us(_median(base['rounds_us']))} ({label})", _median(ratios),
                      rounds=ratios)
    return Figure(_us(mine["us"]), f"{_us(base['us'])} ({label})", mine["us"] / base["us"])


def _barrier(run: Run) -> Figure | None:
    return _barrier_pair(run, "jax.effects_barrier", "`jax.effects_barrier`")


def _barrier_floor(run: Run) -> Figure | None:
    return _barrier_pair(run, "one dispatch of a trivial", "one dispatch of a trivial jitted "
                         "function: the marker's floor")


class Row(NamedTuple):
    """A row of the README's table: what a user asks (the row's name, the same in the
    bench's report), how a run answers it, and where the bench's report shows that
    figure (``"section: method, column"``: the section as ``--only`` names it, the row of
    the method and the column's header)."""
    question: str
    figure: Callable[[Run], Figure | None]
    source: str


#: The summary's rows: what a user asks, and how a run answers it. Each compares hostfeed
#: with the fastest JAX way measured for the same work (the report's "best JAX"), but for
#: the rows that say why not. The words of a row are those of the bench report's columns
#: it comes from ("computation per tap", "until every function ran, per tap", ...).
SUMMARY: list[Row] = [
    Row("dispatch of a small jitted function with one `id_tap`, waited for (per call)",
        _dispatch("hostfeed id_tap"), "dispatch: hostfeed id_tap, / best JAX"),
    Row("the same with one `call`", _dispatch("hostfeed call"),
        "dispatch: hostfeed call, / best JAX"),
    Row("small tap (float32[4]) in a loop: computation per tap (the loop's time until it "
        "returns, over its taps)", _small_tap("device_side_per_tap_us"),
        "latency: hostfeed, computation per tap / best JAX"),
    Row("the same loop: until every function ran, per tap (throughput, not latency)",
        _small_tap("end_to_end_per_tap_us"),
        "latency: hostfeed, until every function ran / best JAX"),
    Row("a tap's hand-over p50: queued until its function starts (taps spaced apart)",
        _handover("hostfeed (spaced taps)"), "latency: hostfeed (spaced taps), hand-over p50"),
    Row("the same in a burst of taps (behind those queued before it)", _handover("hostfeed"),
        "latency: hostfeed, hand-over p50"),
    Row("synchronous tap (the default on CPUs and GPUs): each tap p50 (what the computation "
        "spends on a tap)",
        _sync_tap, "latency: hostfeed (sync), each tap p50 / best JAX"),
    Row("4 MiB taps in a loop until every function ran (per byte)", _large_taps(False),
        "sweep: 4194304, hostfeed / best JAX"),
    Row("the same, against the copy it makes (why it loses to `buffer_callback` there)",
        _large_taps(True), "sweep: 4194304, hostfeed / 2 buffers"),
    Row("4 MiB taps whose function reads every byte (a sum), until every function ran",
        _throughput("sums the array"), "throughput: sums the array, / numpy copy"),
    Row("`call` round trip, float32[4], p50", _round_trip(False),
        "call: hostfeed call, p50 / best JAX"),
    Row("`call` round trip p50, every core busy", _round_trip(True),
        "call, every core busy: hostfeed call, p50 / best JAX"),
    Row("eager `id_tap` until its function ran (per tap)", _eager,
        "eager: hostfeed, / best JAX"),
    Row("compile a function with 200 taps", _compile, "compile: hostfeed, / best JAX"),
    Row("idle `barrier_wait()` after computations that tapped", _barrier,
        "barrier: hostfeed barrier_wait, jax.effects_barrier"),
    Row("the same, against its own floor (why it loses to `jax.effects_barrier`)",
        _barrier_floor, "barrier: barrier_wait, one dispatch of a trivial jitted function"),
]


def _ratio(v: float) -> str:
    return f"{v:.2f}x" if math.isfinite(v) else "-"


def _range(values: Sequence[float]) -> str:
    lo, hi = min(values), max(values)
    wide = " **wide**" if hi > 1.5 * lo else ""
    return f"{lo:.2f}-{hi:.2f}x{wide}"


def machine(run: Run) -> str:
    """The run's machine and versions, in a phrase.

    Example:
        >>> machine({"header": {"cores": 2, "cpu": "AMD EPYC", "jax": "0.10.2",
        ...          "python": "3.11.7", "load_average": 0.5,
        ...          "started": "2026-12-02T18:40:10+00:00"}})
        'a 2-core AMD EPYC machine, jax 0.10.2, Python 3.11.7, load 0.50, 2026-12-02'
    """
    h = run["header"]
    day = datetime.datetime.fromisoformat(h["started"]).date().isoformat()
    return (f"a {h['cores']}-core {_processor.name(h)} machine, jax {h['jax']}, "
            f"Python {h['python']}, load {h['load_average']:.2f}, {day}")


def verdict(ratios: Sequence[float]) -> str:
    """Whether hostfeed is faster or slower than the baseline in every run (by more than
    5%), or neither.

    Example:
        >>> verdict([0.5, 0.7]), verdict([0.9, 1.2]), verdict([1.3, 1.8])
        ('faster', 'on par', '**slower**')
    """
    if max(ratios) < 0.95:
        return "faster"
    if min(ratios) > 1.05:
        return "**slower**"
    return "on par"


def load(run: Run) -> str:
    """The machine's load average while the run ran: at its start, and at its end where the
    run recorded it.

    Example:
        >>> load({"header": {"load_average": 5.1}})
        'load 5.10'
        >>> load({"header": {"load_average": 17.21, "load_average_end": 18.4}})
        'load 17.21-18.40'
    """
    h = run["header"]
    if h.get("load_average") is None:
        return "load unknown"
    end = h.get("load_average_end")
    return f"load {h['load_average']:.2f}" + (f"-{end:.2f}" if end is not None else "")


def loads(runs: Sequence[Run]) -> str:
    """The range of the load averages ``runs`` started at (``0.51-1.45``)."""
    values = [r["header"]["load_average"] for r in runs]
    lo, hi = min(values), max(values)
    return f"{lo:.2f}" if lo == hi else f"{lo:.2f}-{hi:.2f}"


def committed(runs: Sequence[Run]) -> list[tuple[str, str, float, float, float]]:
    """Each row of the summary that the cited run (``runs[0]``) answers: (question, unit,
    the cited run's figure, the lowest and the highest over ``runs``); the unit is ``"x"``
    for a time ratio, ``"us"`` for a row without a baseline (its own figure, in µs)."""
    out = []
    for row in SUMMARY:
        first = row.figure(runs[0])
        if first is None:
            continue
        found = [f for f in map(row.figure, runs) if f is not None]
        if math.isnan(first.ratio):
            values = [f.value for f in found]
            out.append((row.question, "us", first.value, min(values), max(values)))
        else:
            ratios = [f.ratio for f in found]
            out.append((row.question, "x", first.ratio, min(ratios), max(ratios)))
    return out


def _literal(text: str, indent: int, width: int = 96) -> str:
    """``text`` as a Python string literal, cut at spaces into adjacent literals on lines
    of ``indent`` spaces where it is longer than ``width`` allows.

    Example:
        >>> print(_literal("one two three", 4, width=14))
        'one two '
            'three'
    """
    chunks = [""]
    for word in text.split(" "):
        if chunks[-1] and len(repr(chunks[-1] + word)) + indent > width:
            chunks.append("")
        chunks[-1] += word + " "
    chunks[-1] = chunks[-1][:-1]
    return ("\n" + " " * indent).join(repr(c) for c in chunks)


def committed_module(sets: Sequence[tuple[str, Sequence[Run]]]) -> str:
    """The source of ``hostfeed.bench._committed``: for each set of committed runs, one per
    processor (``(folder, runs)``, the README's first), the README's rows as the runs
    answer them (:func:`committed`), which the bench's report prints beside its own
    figures for a run on the same processor (``docs/figures.py --write`` writes it,
    ``--check`` compares)."""
    entries = []
    for folder, runs in sets:
        rows = "".join(f"         ({_literal(q, 9)},\n          {unit!r}, {c:.6g}, {lo:.6g}, "
                       f"{hi:.6g}),\n" for q, unit, c, lo, hi in committed(runs))
        processor = _processor.of(runs[0]["header"])
        shown = pprint.pformat(processor, width=80, sort_dicts=False).replace("\n", "\n" + " " * 18)
        entries.append(
            f"    {{'processor': {shown},\n"
            f"     'name': {_processor.name(runs[0]['header'])!r},\n"
            f"     'folder': {folder!r},\n"
            f"     'runs': {len(runs)},\n"
            f"     'machine': ({_literal(machine(runs[0]), 17)}),\n"
            f"     'loads': {loads(runs)!r},\n"
            f"     'rows': [\n{rows}     ]}},\n")
    return ('"""The README\'s bench table as committed, for ``python -m hostfeed bench`` to '
            'print beside\na run\'s own figures on the same processor. Generated from the '
            'committed runs (docs/bench.json,\ndocs/bench-repeats/; another processor\'s '
            'under docs/bench-NAME/) by\n``python docs/figures.py --write`` (``--check`` '
            'fails where it differs): do not edit."""\n'
            "from __future__ import annotations\n\n"
            "from typing import Any\n\n"
            "#: One set of committed full runs per processor, the README's first: the "
            "processor (as the\n#: runs' headers record it), its name, the folder of the "
            "runs, how many, the machine and\n#: the load averages when each started, and "
            "the rows: (the row, its unit: \"x\" a time ratio,\n#: \"us\" its own figure "
            "in µs; the cited run\'s figure, the lowest and the highest over the runs)\n"
            f"SETS: list[dict[str, Any]] = [\n{''.join(entries)}]\n")


#: How far outside the quiet runs' range a figure under load must lie to be marked.
SLACK = 0.10


def outside(value: float, quiet: Sequence[float]) -> bool:
    """Whether ``value`` lies outside the range of ``quiet`` widened by :data:`SLACK`.

    Example:
        >>> outside(0.94, [0.18, 0.24]), outside(0.25, [0.18, 0.24])
        (True, False)
    """
    return not min(quiet) * (1 - SLACK) <= value <= max(quiet) * (1 + SLACK)


def _marked(cell: str, value: float, quiet: Sequence[float]) -> str:
    return f"**{cell}**" if outside(value, quiet) else cell


def loaded_note(loaded: Sequence[Run], where: str = "docs/") -> str:
    """The sentence that says what the summary's columns of ``loaded`` runs are (kept in
    ``where``, the set's folder)."""
    if not loaded:
        return ""
    columns = "columns" if len(loaded) > 1 else "column"
    return (f" The last {columns}: `python -m hostfeed bench --quick` on the same machine "
            f"while other processes kept it busy (`{where}bench-loaded/`; the load average "
            "when the run started and when it ended), in bold where outside the quiet runs' "
            f"range by more than {SLACK:.0%}; a quick run measures fewer taps, calls and "
            "rounds, and no 4 MiB taps in its payload sweep (-: not measured).")


def summary(runs: Sequence[Run], loaded: Sequence[Run] = ()) -> str:
    """The README's table: for each question, hostfeed's figure and the fastest JAX way's
    ("best JAX", as the bench's report names it) in the cited run (``runs[0]``), hostfeed's
    time ratio in it (the median of its rounds' ratios where it measured rounds; ``~``
    after it where those say two runs may differ by more than 15%), the ratio's range over
    every run (marked **wide** where its ends differ by more than 1.5x), and whether
    hostfeed wins or loses in every run; then the
    ratio in each of the ``loaded`` runs (quick runs on a busy machine: a column each). A
    row without a baseline gives the range of its own figure (and its own figure under
    load)."""
    extra = [f"quick run, {load(r)}" for r in loaded]
    lines = ["| | hostfeed | best JAX (or the baseline named) | ratio | "
             f"over {len(runs)} runs | hostfeed is |" + "".join(f" {e} |" for e in extra),
             "|---|---|---|---|---|---|" + "---|" * len(extra)]
    for row in SUMMARY:
        first = row.figure(runs[0])
        if first is None:
            continue
        found = [f for f in map(row.figure, runs) if f is not None]
        under_load = [row.figure(r) for r in loaded]
        if math.isnan(first.ratio):
            values = [f.value for f in found]
            cells = [first.hostfeed, first.baseline, "-",
                     f"{_us(min(values))} to {_us(max(values))}", "-",
                     *[_marked(_us(f.value), f.value, values) if f else "-"
                       for f in under_load]]
        else:
            ratios = [f.ratio for f in found]
            noisy = " ~" if first.noisy else ""
            cells = [first.hostfeed, first.baseline, _ratio(first.ratio) + noisy, _range(ratios),
                     verdict(ratios),
                     *[_marked(_ratio(f.ratio), f.ratio, ratios) if f else "-"
                       for f in under_load]]
        lines.append(f"| {row.question} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def portable(runs: Sequence[Run], loaded: Sequence[Run] = ()) -> str:
    """The portable transport forced on CPU, against the native one and
    ``io_callback(ordered=True)`` (the cited run, with the ratios' ranges; ``loaded`` is
    not shown)."""
    del loaded
    rows = [("small tap, computation per tap", "taps",
             "device_side_per_tap_us"),
            ("`call`, per call in a loop", "calls", "per_call_us")]
    lines = ["| | native | portable | `io_callback(ordered)` | portable / native | "
             f"over {len(runs)} runs |", "|---|---|---|---|---|---|"]
    for what, section, key in rows:
        values = [{k: v[key] for k, v in r["portable"][section].items()}
                  for r in runs if r.get("portable")]
        if not values:
            continue
        v = values[0]
        ratios = [x["hostfeed (portable)"] / x["hostfeed (native)"] for x in values]
        lines.append(f"| {what} | {_us(v['hostfeed (native)'])} | "
                     f"{_us(v['hostfeed (portable)'])} | {_us(v['io_callback(ordered)'])} | "
                     f"{_ratio(ratios[0])} | {_range(ratios)} |")
    slow_runs = [r["portable"]["slow_taps"] for r in runs if r.get("portable")]
    slow = [s["ratio"] for s in slow_runs]
    if slow:
        s = slow_runs[0]
        lines.append(f"| {s['taps']} taps of a {s['host_ms_per_tap']:g} ms function, against "
                     f"{s['taps']} no-op taps (device side) | | | | {_ratio(slow[0])} | "
                     f"{_range(slow)} |")
    return "\n".join(lines)


#: The tables ``docs/figures.py`` generates, by the name their markers use (from the cited
#: run and the repeats, and the quick runs on a busy machine).
TABLES: dict[str, Callable[[Sequence[Run], Sequence[Run]], str]] = {"summary": summary,
                                                                     "portable": portable}
