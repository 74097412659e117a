"""Markdown tables of ``python -m hostfeed bench`` results, for the README and the docs.

Every performance figure the README and the documentation give is one of these tables,
generated from committed runs (``docs/bench.json``, the run they cite, and the full runs
under ``docs/bench-repeats/``, which give each ratio's range): ``docs/figures.py``
rewrites them and CI checks that they match.
"""
from __future__ import annotations

import datetime
import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

Run = dict[str, Any]

#: The JAX callbacks a row of hostfeed is compared with (the fastest one measured wins).
JAX_CALLBACKS = ("buffer_callback", "pure_callback", "io_callback", "io_callback(ordered)",
                 "debug.callback")


class Figure(NamedTuple):
    """One row: hostfeed's value, the baseline's value and name, hostfeed's time ratio
    (NaN for a row without a baseline, whose range is then of ``value``, in µs)."""
    hostfeed: str
    baseline: str
    ratio: float
    value: float = math.nan


def _us(v: float) -> str:
    return f"{v:.3g} µs" if v < 10 else f"{v:.0f} µs" if v >= 100 else f"{v:.1f} µs"


def _best(values: dict[str, float]) -> tuple[str, float]:
    """The fastest JAX callback among ``values`` (name, value)."""
    name = min((k for k in JAX_CALLBACKS if values.get(k)), key=values.__getitem__)
    return name, values[name]


def _against_best(values: dict[str, float], mine: str) -> Figure:
    """Method ``mine`` of ``values`` against the fastest JAX callback among them."""
    name, best = _best(values)
    return Figure(_us(values[mine]), f"{_us(best)} (`{name}`)", values[mine] / best)


def _dispatch(what: str) -> Callable[[Run], Figure | None]:
    def figure(run: Run) -> Figure | None:
        d = run.get("dispatch")
        if not d or what not in d:
            return None
        us = {k: v["us"] for k, v in d.items() if isinstance(v, dict)}
        name, best = _best(us)
        return Figure(f"{_us(us[what])} (no callback: {_us(us['no callback'])})",
                      f"{_us(best)} (`{name}`)", us[what] / best)
    return figure


def _small_tap(key: str) -> Callable[[Run], Figure | None]:
    def figure(run: Run) -> Figure | None:
        methods = run.get("latency", {}).get("methods")
        if not methods:
            return None
        return _against_best({k: m[key] for k, m in methods.items()}, "hostfeed")
    return figure


def _handover(method: str) -> Callable[[Run], Figure | None]:
    def figure(run: Run) -> Figure | None:
        m = run.get("latency", {}).get("methods", {}).get(method)
        p50 = ((m or {}).get("handover_us") or {}).get("p50")
        if p50 is None:
            return None
        return Figure(_us(p50), "none: a JAX callback runs its function inside the "
                      "computation (as `sync=True` does: the synchronous row)", math.nan, p50)
    return figure


def _sync_tap(run: Run) -> Figure | None:
    methods = run.get("latency", {}).get("methods")
    if not methods or "hostfeed (sync)" not in methods:
        return None
    return _against_best({k: m["device_us"]["p50"] for k, m in methods.items()},
                         "hostfeed (sync)")


def _large_taps(floor: bool) -> Callable[[Run], Figure | None]:
    def figure(run: Run) -> Figure | None:
        sweep = run.get("sweep")
        if not sweep or 4194304 not in sweep["sizes"]:
            return None
        i = sweep["sizes"].index(4194304)
        gbps = {k: pts[i]["gb_per_s"] for k, pts in sweep["methods"].items()}
        if floor:
            base = gbps["numpy copy, 2 buffers"]
            what = "numpy copy into two buffers, alternately: the copy an asynchronous tap makes"
        else:
            what, base = max(((k, gbps[k]) for k in JAX_CALLBACKS if gbps.get(k)),
                             key=lambda kv: kv[1])
            what = f"`{what}`"
        return Figure(f"{gbps['hostfeed']:.1f} GB/s", f"{base:.1f} GB/s ({what})",
                      base / gbps["hostfeed"])
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
        return _against_best({k: call_p50(m) for k, m in methods.items()}, "hostfeed call")
    return figure


def _eager(run: Run) -> Figure | None:
    e = run.get("eager")
    if not e:
        return None
    return _against_best({k: v["per_tap_us"] for k, v in e.items() if isinstance(v, dict)},
                         "hostfeed")


def _compile(run: Run) -> Figure | None:
    c = run.get("compile")
    if not c:
        return None
    secs = {k: v["seconds"] for k, v in c.items() if isinstance(v, dict)}
    name, base = _best(secs)
    return Figure(f"{secs['hostfeed']:.2f} s", f"{base:.2f} s (`{name}`)",
                  secs["hostfeed"] / base)


def _barrier(run: Run) -> Figure | None:
    b = run.get("barrier")
    if not b:
        return None
    mine = b["hostfeed barrier_wait"]["us"]
    base = b["jax.effects_barrier"]["us"]
    return Figure(_us(mine), f"{_us(base)} (`jax.effects_barrier`)", mine / base)


def _barrier_floor(run: Run) -> Figure | None:
    b = run.get("barrier")
    trivial = next((v for k, v in (b or {}).items()
                    if k.startswith("one dispatch of a trivial")), None)
    if trivial is None:
        return None
    mine = b["hostfeed barrier_wait"]["us"]  # type: ignore[index]
    return Figure(_us(mine), f"{_us(trivial['us'])} (one dispatch of a trivial jitted "
                  "function: the marker's floor)", mine / trivial["us"])


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
    return (f"a {h['cores']}-core {h['cpu']} machine, jax {h['jax']}, Python {h['python']}, "
            f"load {h['load_average']:.2f}, {day}")


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


def committed_module(runs: Sequence[Run]) -> str:
    """The source of ``hostfeed.bench._committed``: the README's rows as the committed
    ``runs`` answer them (:func:`committed`), which the bench's report prints beside its
    own figures (``docs/figures.py --write`` writes it, ``--check`` compares)."""
    rows = "".join(f"    ({_literal(q, 5)},\n     {unit!r}, {c:.6g}, {lo:.6g}, {hi:.6g}),\n"
                   for q, unit, c, lo, hi in committed(runs))
    return ('"""The README\'s bench table as committed, for ``python -m hostfeed bench`` to '
            'print beside\na run\'s own figures. Generated from docs/bench.json and '
            'docs/bench-repeats/ by\n``python docs/figures.py --write`` (``--check`` fails '
            'where it differs): do not edit."""\n'
            "from __future__ import annotations\n\n"
            "#: How many full runs, on what machine, at which load averages (when each "
            f"started).\nRUNS = {len(runs)}\nMACHINE = ({_literal(machine(runs[0]), 11)})\n"
            f"LOADS = {loads(runs)!r}\n"
            "#: (the row, its unit: \"x\" a time ratio, \"us\" its own figure in µs; the "
            "cited run\'s\n#: figure, the lowest and the highest over the runs)\n"
            f"ROWS: list[tuple[str, str, float, float, float]] = [\n{rows}]\n")


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


def loaded_note(loaded: Sequence[Run]) -> str:
    """The sentence that says what the summary's columns of ``loaded`` runs are."""
    if not loaded:
        return ""
    columns = "columns" if len(loaded) > 1 else "column"
    return (f" The last {columns}: `python -m hostfeed bench --quick` on the same machine "
            "while other processes kept it busy (`docs/bench-loaded/`; the load average when "
            "the run started and when it ended), in bold where outside the quiet runs' range "
            f"by more than {SLACK:.0%}; a quick run measures fewer taps, calls and rounds, "
            "and no 4 MiB taps (-).")


def summary(runs: Sequence[Run], loaded: Sequence[Run] = ()) -> str:
    """The README's table: for each question, hostfeed's figure and the fastest JAX way's
    ("best JAX", as the bench's report names it) in the cited run (``runs[0]``), hostfeed's
    time ratio in it, the ratio's range over every run (marked **wide** where its ends
    differ by more than 1.5x), and whether hostfeed wins or loses in every run; then the
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
            cells = [first.hostfeed, first.baseline, _ratio(first.ratio), _range(ratios),
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
    slow = [r["portable"]["slow_taps"]["ratio"] for r in runs if r.get("portable")]
    if slow:
        lines.append(f"| 100 taps of a 10 ms function, against 100 no-op taps (device side) "
                     f"| | | | {_ratio(slow[0])} | {_range(slow)} |")
    return "\n".join(lines)


def _ms(v: float) -> str:
    return f"{v:.2f} ms" if v < 10 else f"{v:.1f} ms"


def tpu_machine(run: Run) -> str:
    """A TPU run's device and versions, in a phrase.

    Example:
        >>> tpu_machine({"header": {"devices": ["TPU_0"], "jax": "0.10.2",
        ...              "python": "3.11.7", "started": "2026-12-05T13:00:48+00:00"}})
        'TPU_0, jax 0.10.2, Python 3.11.7, 2026-12-05'
    """
    h = run["header"]
    day = datetime.datetime.fromisoformat(h["started"]).date().isoformat()
    return f"{', '.join(h['devices'])}, jax {h['jax']}, Python {h['python']}, {day}"


def tpu(runs: Sequence[Run]) -> str:
    """The TPU's targets (the cited TPU run, ``runs[0]``): hostfeed against JAX's callbacks
    on the same chip, each ratio against the bound it must stay under."""
    r = runs[0]
    taps = r["taps"]["methods"]
    tap = taps["hostfeed"]["device_side_per_tap_us"]
    slow = r["slow_taps"]["device_ms"]
    calls = r["call"]["methods"]
    rec = r["record"]["ms"]
    d = r["dispatch"]["methods"]
    rows = [
        ("a tap (float32[4]) in a loop, what the device spends per tap", _us(tap),
         f"{_us(taps['io_callback']['device_side_per_tap_us'])} (`io_callback`)",
         tap / taps["io_callback"]["device_side_per_tap_us"], "1.00x"),
        ("the same", _us(tap),
         f"{_us(taps['io_callback(ordered)']['device_side_per_tap_us'])} "
         "(`io_callback(ordered)`)",
         tap / taps["io_callback(ordered)"]["device_side_per_tap_us"], "0.50x"),
        ("50 taps of a 10 ms function, device side", _ms(slow["hostfeed"]),
         f"{_ms(slow['io_callback(ordered)'])} (`io_callback(ordered)`)",
         slow["hostfeed"] / slow["io_callback(ordered)"], "0.10x"),
        ("`call` round trip (float32[4]) in a loop", _us(calls["hcb.call"]["per_call_us"]),
         f"{_us(calls['pure_callback']['per_call_us'])} (`pure_callback`)",
         calls["hcb.call"]["per_call_us"] / calls["pure_callback"]["per_call_us"], "1.00x"),
        ("recording a 4 MiB activation, per training step", _ms(rec["hostfeed Recorder"]),
         f"{_ms(rec['returned + device_get'])} (returned and `device_get`; the step alone "
         f"{_ms(rec['step'])})", rec["hostfeed Recorder"] / rec["returned + device_get"],
         "1.00x"),
        ("the same, the aim", _ms(rec["hostfeed Recorder"]),
         f"{_ms(1.2 * (rec['step'] + rec['one device_get of 4 MiB']))} (1.2x the step and "
         "one 4 MiB `device_get`)",
         rec["hostfeed Recorder"] / (1.2 * (rec["step"] + rec["one device_get of 4 MiB"])),
         "1.00x"),
        ("dispatch of a small jitted function with one `id_tap`, waited for",
         _us(d["hostfeed id_tap"]["us"]),
         f"{_us(d['io_callback']['us'])} (`io_callback`; no callback: "
         f"{_us(d['no callback']['us'])})", d["hostfeed id_tap"]["us"] / d["io_callback"]["us"],
         ""),
    ]
    lines = ["| | hostfeed | compared with | ratio | at most |", "|---|---|---|---|---|"]
    lines += [f"| {what} | {mine} | {base} | {_ratio(ratio)} | {bound} |"
              for what, mine, base, ratio, bound in rows]
    order = "kept" if r["taps"].get("order_kept") else "**not kept**"
    lines.append(f"| taps from three places in a loop, three computations dispatched back "
                 f"to back | order {order} | | | |")
    return "\n".join(lines)


def tpu_paths(runs: Sequence[Run]) -> str:
    """The TPU's ways to the host measured raw (the cited TPU run's ``paths`` section)."""
    p = runs[0]["paths"]
    lines = ["| path | per loop step | GB/s |", "|---|---|---|"]

    def row(what: str, v: dict, unit: str) -> str:
        if "unavailable" in v:
            return f"| {what} | n/a | |"
        value = _us(v["us"]) if unit == "us" else _ms(v["ms"])
        rate = f"{v['gb_per_s']:.2f} GB/s" if "gb_per_s" in v else ""
        return f"| {what} | {value} | {rate} |"

    lines += [row(f"float32[4]: {k}", v, "us") for k, v in p["small_us_per_step"].items()]
    lines += [row(f"device work, a send, both: {k}", v, "us")
              for k, v in p["overlap_us_per_step"].items()]
    for size, rows in p["large"].items():
        lines += [row(f"{size} operand as {k}", v, "us") for k, v in rows.items()]
    lines += [row(f"4 MiB outside a computation: {k}", v, "ms")
              for k, v in p["outside_a_computation"].items()]
    return "\n".join(lines)


def tpu_record(runs: Sequence[Run]) -> str:
    """Logging a 4 MiB activation each training step on a TPU, every way (the record
    section of the cited TPU record run, ``docs/tpu/record-*.json``)."""
    ms = runs[0]["record"]["ms"]
    step, copy = ms["step"], ms["returned + copy_to_host_async, overlapped"]
    rows = [
        ("the step alone", ms["step"], "", None, ""),
        ("the activation returned, `copy_to_host_async`, overlapped with the next step",
         copy, "", None, ""),
        ("the activation returned, `device_get` every step", ms["returned + device_get"],
         "", None, ""),
        ("`io_callback` of it", ms["io_callback"], "", None, ""),
        ("`rec.record` inside the computation", ms["hostfeed Recorder"],
         "returned + `device_get`", ms["hostfeed Recorder"] / ms["returned + device_get"],
         "1.00x"),
        ("`rec.step`: the row leaves as an output, written to disk",
         ms["rec.step, written to disk"], "returned + `copy_to_host_async`",
         ms["rec.step, written to disk"] / copy, "1.00x"),
        ("the same", ms["rec.step, written to disk"], "max(step, one 4 MiB `device_get`)",
         ms["rec.step, written to disk"] / max(step, ms["one device_get of 4 MiB"]), "1.10x"),
        ("`rec.step`, `every=10` (the step a host int)", ms["rec.step, every=10"],
         "the step alone", ms["rec.step, every=10"] / step, "1.10x"),
        ("`rec.step`, `reduce=\"stats\"` every step", ms["rec.step, reduce='stats'"],
         "the step alone", ms["rec.step, reduce='stats'"] / step, "1.20x"),
    ]
    lines = ["| way | ms per step | compared with | ratio | at most |",
             "|---|---|---|---|---|"]
    lines += [f"| {what} | {_ms(v)} | {base} | {_ratio(r) if r is not None else ''} | {b} |"
              for what, v, base, r, b in rows]
    return "\n".join(lines)


#: The tables ``docs/figures.py`` generates, by the name their markers use (from the cited
#: run and the repeats, and the quick runs on a busy machine).
TABLES: dict[str, Callable[[Sequence[Run], Sequence[Run]], str]] = {"summary": summary,
                                                                     "portable": portable}
#: The tables of TPU runs (``docs/tpu/bench-*.json``, the newest cited).
TPU_TABLES: dict[str, Callable[[Sequence[Run]], str]] = {"tpu": tpu, "tpu_paths": tpu_paths,
                                                         "tpu_record": tpu_record}
#: TPU tables read from the record runs (``docs/tpu/record-*.json``), not the full ones.
TPU_RECORD_TABLES = frozenset({"tpu_record"})
