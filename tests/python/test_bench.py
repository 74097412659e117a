"""`python -m hostfeed bench`: the quick run writes JSON in the documented schema, with
finite figures, and a valid PNG; options are checked; the receiver's histograms."""
from __future__ import annotations

import json
import math
import os
import pathlib
import re
import statistics
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest
from jax import lax

import hostfeed
from hostfeed import bench
from hostfeed._src import lifecycle
from hostfeed import host_callback as hcb
from hostfeed.bench import _portable, _report, _text, _timing

from conftest import run_python

DISTRIBUTION = {"count", "mean", "p50", "p90", "p99", "p999", "max"}
#: A full run's result, committed (the input of docs/bench.png).
FULL_RUN = pathlib.Path(__file__).resolve().parents[2] / "docs" / "bench.json"
#: The figure's panel for each section it draws.
PANELS = {"latency": "What a tap costs the device", "sweep": "Throughput by payload size",
          "dispatch": "Dispatch with one callback", "call": "Round trip of a call"}


def numbers(tree, path="$"):
    """Every number in a JSON tree, with its path."""
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from numbers(v, f"{path}.{k}")
    elif isinstance(tree, list):
        for i, v in enumerate(tree):
            yield from numbers(v, f"{path}[{i}]")
    elif isinstance(tree, (int, float)) and not isinstance(tree, bool):
        yield path, tree


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    json_path, png_path = out / "bench.json", out / "bench.png"
    r = subprocess.run([sys.executable, "-m", "hostfeed", "bench", "--quick", "--json",
                        str(json_path), "--plot", str(png_path)],
                       capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout, json.loads(json_path.read_text()), png_path, r.stderr


def test_quick_run_writes_every_section_in_the_schema(quick_run):
    _, result, _, _ = quick_run
    assert result["schema"] == bench.SCHEMA == "hostfeed-bench/1"
    assert set(result) == {"schema", "header", *bench.SECTIONS}
    h = result["header"]
    assert {"hostfeed", "jax", "jaxlib", "numpy", "python", "backend", "devices", "cpu",
            "processor", "cores", "env", "quick"} <= set(h)
    assert h["processor"]["model"] == h["cpu"]
    assert h["quick"] is True and h["backend"] == "cpu" and h["jax"] == jax.__version__
    lat = result["latency"]["methods"]
    assert set(lat) == {"hostfeed", "hostfeed (sync)", "hostfeed (spaced taps)",
                        *bench._sections.TAP_METHODS}
    for name, m in lat.items():
        assert set(m["device_us"]) == DISTRIBUTION, name
        assert m["device_us"]["count"] > 0 and m["device_cdf_us"][-1][1] == 1.0
    assert set(lat["hostfeed"]["handover_us"]) == DISTRIBUTION
    assert lat["io_callback"]["handover_us"] is None
    for name in ("hostfeed", "hostfeed (spaced taps)"):  # each round's median hand-over
        assert len(lat[name]["rounds_handover_p50_us"]) >= 5, name
    sweep = result["sweep"]
    assert {"hostfeed", "buffer_callback", *bench._sections.FLOORS} <= set(sweep["methods"])
    for name, points in sweep["methods"].items():
        assert [p["bytes"] for p in points] == sweep["sizes"], name
    # 4 MiB taps, each function's methods in the same rounds (a quick run: 64 MiB a round).
    t = result["throughput"]
    assert (t["payload_bytes"], t["taps"]) == (4 << 20, 16) and t["rounds"] >= 5
    assert set(t["functions"]) == {"sums the array", "does nothing"}
    for methods in t["functions"].values():
        assert list(methods) == list(bench._throughput.METHODS)
        for m in methods.values():
            assert len(m["rounds_gb_per_s"]) == t["rounds"] and m["gb_per_s"] > 0
    # The figures that swing from run to run are kept round by round (for the medians of
    # the rounds' ratios and the interval that says whether a figure is noisy).
    assert len(result["eager"]["hostfeed"]["rounds_us"]) >= 9
    assert len(result["compile"]["hostfeed"]["rounds_seconds"]) >= 3
    assert len(result["dispatch"]["hostfeed id_tap"]["rounds_us"]) >= 9
    calls = result["call"]["methods"]
    assert set(calls) == {"hostfeed call", "host function alone",
                          bench._sections.RECEIVER_CALL, *bench._sections.CALL_METHODS}
    loaded = result["call"]["loaded"]
    assert set(loaded["methods"]) == set(calls) and loaded["busy_processes"] >= 1
    assert set(result["dispatch"]) == {"calls", *bench._sections.DISPATCH_METHODS,
                                       "hostfeed id_tap, compiled ahead of time",
                                       "hostfeed id_tap, synchronous",
                                       "hostfeed id_tap, token chain",
                                       "hostfeed call, token chain",
                                       bench._sections.RECEIVER_CALL}
    assert set(result["barrier"]) == {"calls", "marked devices", "hostfeed barrier_wait",
                                      "jax.effects_barrier",
                                      "hostfeed barrier_wait, no device to mark",
                                      bench._receiver_sections.TRIVIAL_DISPATCH}
    assert result["barrier"]["marked devices"] == 1  # the bench's computations ran on one
    # Each interleaved round is kept, so that each ratio's range over them can be shown.
    for section in ("dispatch", "barrier"):
        for name, row in result[section].items():
            if isinstance(row, dict):
                assert len(row["rounds_us"]) >= 3 and min(row["rounds_us"]) == row["us"], name
    # The other sections' comparisons are interleaved rounds too, their figures the
    # fastest round's.
    rounds = result["latency"]["rounds"]
    assert rounds >= 2
    for name, m in lat.items():
        if name != "hostfeed (spaced taps)":
            assert len(m["rounds_device_us"]) == len(m["rounds_end_to_end_us"]) == rounds
            assert len(m["rounds_device_p50_us"]) == rounds, name
            assert min(m["rounds_device_us"]) == m["device_side_per_tap_us"], name
            assert min(m["rounds_end_to_end_us"]) == m["end_to_end_per_tap_us"], name
    for name, points in sweep["methods"].items():
        for p in points:
            assert p["rounds_gb_per_s"] and max(p["rounds_gb_per_s"]) == p["gb_per_s"], name
    for section in (calls, loaded["methods"]):
        for name, m in section.items():
            assert len(m["rounds_p50_us"]) >= 2 and min(m["rounds_p50_us"]) == m["p50_us"]
            assert m["round_trip_us"]["count"] >= len(m["rounds_p50_us"]) * 100, name
    runs = result["backpressure"]["runs"]
    assert [r["method"] for r in runs] == ["hostfeed"] * 3 + ["io_callback(ordered)"]
    # The smallest bound holds the device back: it waited, and held little.
    assert runs[0]["blocked_count"] > 0
    assert runs[0]["peak_queued_bytes"] <= runs[0]["bound_bytes"] + 2 * 16384


def test_portable_section_has_its_rows_beside_native_and_io_callback(quick_run):
    stdout, result, _, _ = quick_run
    r = result["portable"]
    rows = {"hostfeed (native)", "hostfeed (portable)", "io_callback(ordered)"}
    assert set(r["taps"]) == rows and set(r["calls"]) == rows
    assert all(t["device_side_per_tap_us"] > 0 for t in r["taps"].values())
    slow = r["slow_taps"]
    assert slow["taps"] == 1000 and slow["host_ms_per_tap"] == 0.2
    assert slow["slow_device_s"] > 0 and slow["noop_device_s"] > 0
    assert len(slow["rounds_ratio"]) == 15
    assert slow["ratio"] == statistics.median(slow["rounds_ratio"])
    assert "portable transport" in stdout and "slow taps (portable)" in stdout


def test_every_figure_is_finite_and_the_measured_ones_positive(quick_run):
    _, result, _, _ = quick_run
    for path, value in numbers(result):
        assert math.isfinite(value), path
        assert value >= 0 or path.endswith(("cost_us_per_tap", "growth")), path
    positive = [m["device_us"]["p50"] for m in result["latency"]["methods"].values()]
    positive += [p["gb_per_s"] for pts in result["sweep"]["methods"].values() for p in pts]
    positive += [m["round_trip_us"]["p50"] for m in result["call"]["methods"].values()]
    positive += [r["device_s"] for r in result["backpressure"]["runs"]]
    positive += [v["seconds"] for k, v in result["compile"].items() if k != "taps"]
    assert all(v > 0 for v in positive)


def test_terminal_report_has_ratios_and_the_plot_is_a_png(quick_run):
    stdout, _, png, _ = quick_run
    assert "per-tap latency" in stdout and "payload sweep" in stdout
    assert "hostfeed / 2 buffers" in stdout
    # Next to the ratios of the interleaved sections, their range over the rounds.
    assert "per tap / best JAX" in stdout and "interval (each round's p50)" in stdout
    assert re.search(r"\d+\.\d\d-\d+\.\d\dx", stdout)
    assert "call round trip" in stdout and "back-pressure" in stdout
    # Ratios to the best JAX callback measured in the same run.
    assert re.search(r"best JAX: (buffer_callback|io_callback|debug\.callback|"
                     r"pure_callback)", stdout)
    assert "Ratios are time ratios" in stdout
    assert re.search(r"\d+\.\d\dx", stdout)
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_plot_without_matplotlib_is_a_clear_error(tmp_path):
    fake = tmp_path / "matplotlib"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('matplotlib is not installed')\n")
    r = subprocess.run([sys.executable, "-m", "hostfeed", "bench", "--quick", "--only",
                        "barrier", "--plot", str(tmp_path / "x.png")],
                       capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, JAX_PLATFORMS="cpu",
                                PYTHONPATH=f"{tmp_path}{os.pathsep}"
                                           f"{os.environ.get('PYTHONPATH', '')}"))
    assert r.returncode == 2
    assert "--plot needs matplotlib: pip install matplotlib" in r.stderr
    assert not (tmp_path / "x.png").exists()


def only(*sections):
    """The committed full run's result, cut down to ``sections`` (as ``--only`` writes)."""
    full = json.loads(FULL_RUN.read_text())
    return {"schema": full["schema"], "header": full["header"],
            **{s: full[s] for s in sections}}


@pytest.mark.parametrize("sections", [
    ["sweep"], ["latency"], ["dispatch", "barrier"], ["latency", "timing", "call"],
    ["sweep", "dispatch", "call"], list(bench.SECTIONS)])
def test_plot_draws_one_panel_per_section_with_data(tmp_path, sections):
    pytest.importorskip("matplotlib")
    png = tmp_path / "p.png"
    titles = _report.plot(only(*sections), str(png))
    assert titles == [PANELS[s] for s in ("latency", "sweep", "dispatch", "call")
                      if s in sections]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_of_a_result_with_nothing_to_draw_names_what_it_draws(tmp_path):
    pytest.importorskip("matplotlib")
    empty_sweep = only("barrier", "timing") | {"sweep": {"sizes": [], "methods": {}}}
    with pytest.raises(SystemExit) as info:
        _report.plot(empty_sweep, str(tmp_path / "p.png"))
    assert str(info.value) == ("--plot: nothing to draw from barrier, timing, sweep; the "
                               "figure plots the sections latency, sweep, dispatch, call")
    assert not (tmp_path / "p.png").exists()


def test_plot_of_sections_with_nothing_to_draw_is_refused_before_the_run(tmp_path):
    pytest.importorskip("matplotlib")
    r = subprocess.run([sys.executable, "-m", "hostfeed", "bench", "--only", "barrier",
                        "--plot", str(tmp_path / "x.png")],
                       capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert r.returncode == 2
    assert r.stderr.strip() == ("--plot: nothing to draw from barrier; the figure plots the "
                                "sections latency, sweep, dispatch, call")
    assert r.stdout == "" and not (tmp_path / "x.png").exists()


def test_ratios_are_the_median_of_the_rounds_ratios_with_the_interval_it_lies_in():
    rows = {"no callback": {"us": 4.0, "rounds_us": [4.0, 5.0, 4.5]},
            "hostfeed call": {"us": 6.0, "rounds_us": [6.0, 10.0, 9.0]},
            "pure_callback": {"us": 30.0, "rounds_us": [30.0, 40.0, 36.0]}}
    text = "\n".join(_report._dispatch({"calls": 10, **rows}))
    line = next(ln for ln in text.splitlines() if ln.strip().startswith("hostfeed call"))
    # Each round's ratio: 6/4, 10/5, 9/4.5 -> 1.50, 2.00, 2.00 (median 2.00); 6/30, 10/40,
    # 9/36 -> 0.20, 0.25, 0.25. Three rounds bracket the median only between their extremes,
    # wider than 15% for the first: noisy ('~'). The time per call is the median round's.
    assert line.split()[2:] == ["9.00", "2.00x", "1.50-2.00x", "~", "0.25x", "0.20-0.25x", "~"]
    assert "the median of 3 rounds" in text and "'~'" in text
    old = {k: {"us": v["us"]} for k, v in rows.items()}  # a result from before the rounds
    assert next(ln for ln in _report._dispatch({"calls": 10, **old})
                if ln.strip().startswith("hostfeed call")).split()[2:] == [
                    "6.00", "1.50x", "-", "0.20x", "-"]


def test_a_figure_is_noisy_when_its_rounds_cannot_pin_the_median_within_15_percent():
    steady = [1.0, 1.01, 0.99, 1.02, 0.98, 1.0, 1.01, 0.99, 1.0]
    assert not _timing.paired(steady).noisy
    # A round twice as slow (a hiccup of the machine) moves nothing...
    assert not _timing.paired([1.0, 2.0, 1.0, 1.01, 1.0, 0.99, 1.0, 1.02, 1.0]).noisy
    # ...but not when the rounds split in two.
    assert _timing.paired([1.0, 2.0, 1.0, 2.0, 1.0, 2.0, 1.0, 2.0, 1.5]).noisy
    # Too few rounds say nothing for sure: their whole range is the interval.
    assert _timing.paired([1.0, 1.2]).spread() == "1.00-1.20x ~"
    p = _timing.paired([2.0])
    assert (p.median, p.low, p.high, p.rounds) == (2.0, 2.0, 2.0, 1)


def test_the_whole_report_fits_100_columns_and_every_ratio_is_a_time_ratio():
    # The committed full run (every CPU section) and a TPU run, as the terminal shows them.
    reports = [_report.text(json.loads(FULL_RUN.read_text()))]
    reports += [_report.text(json.loads(p.read_text()))
                for p in sorted((FULL_RUN.parent / "tpu").glob("bench-*.json"))[-1:]]
    for text in reports:
        wide = [ln for ln in text.splitlines() if len(ln) > 100]
        assert not wide, wide[:3]
        # Columns of ratios say "/ baseline": a row's time over the baseline's.
        assert not re.search(r"^ +method .*vs io_callback", text, re.M)
    portable = _portable.render({
        "taps_per_run": 10, "calls_per_run": 10, "payload": "float32[4]",
        "taps": {"hostfeed (native)": {"device_side_per_tap_us": 1.0,
                                       "end_to_end_per_tap_us": 1.5},
                 "io_callback(ordered)": {"device_side_per_tap_us": 50.0,
                                          "end_to_end_per_tap_us": 60.0}},
        "calls": {"hostfeed (native)": {"per_call_us": 4.0},
                  "io_callback(ordered)": {"per_call_us": 100.0}},
        "slow_taps": {"taps": 10, "host_ms_per_tap": 10.0, "slow_device_s": 0.001,
                      "noop_device_s": 0.002, "ratio": 0.5}})
    cells = [c for ln in portable if ln.strip().startswith("hostfeed (native)")
             for c in ln.split()[2:]]
    # hostfeed faster than io_callback: below 1.00x, as the report's header says.
    assert cells == ["1.00", "1.50", "0.020x", "4.00", "0.040x"]


def test_a_table_wider_than_the_terminal_is_cut_into_tables_that_repeat_the_first_column():
    header = ["method"] + [f"column {i}" for i in range(20)]
    lines = _text.grid(header, [["hostfeed"] + [f"{i}.00" for i in range(20)]])
    assert all(len(ln) <= _text.WIDTH for ln in lines)
    heads = [ln for ln in lines if ln.strip().startswith("method")]
    assert len(heads) > 1 and len(lines) == 2 * len(heads)
    cells = [c for ln in lines if ln.strip().startswith("hostfeed") for c in ln.split()[1:]]
    assert cells == [f"{i}.00" for i in range(20)]  # every cell once, in order


def test_a_redirected_run_says_a_line_a_section_and_no_progress_bar(quick_run):
    """Its stderr a pipe (a log, a file): no progress bar redrawn with carriage returns,
    one line as each section starts."""
    *_, stderr = quick_run
    assert "\r" not in stderr
    said = [line for line in stderr.splitlines() if line.startswith("bench: ")]
    assert len(said) == len(bench.SECTIONS), stderr  # "bench: back-pressure (8 s in)"
    assert said[0].startswith("bench: latency (") and said[-1].startswith("bench: portable (")
    assert len(stderr.splitlines()) == len(said), stderr


def test_progress_is_a_line_a_section_off_a_terminal_and_a_line_a_step_on_one(
        monkeypatch):
    import io
    steps = ["latency: hostfeed", "latency: floors", "call: hostfeed", "call: io_callback",
             "dispatch"]
    log = io.StringIO()
    step, close = bench._progress(len(steps), log)
    for s in steps:
        step(s)
    close()
    assert [line.split(" (")[0] for line in log.getvalue().splitlines()] == [
        "bench: latency", "bench: call", "bench: dispatch"]

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setitem(sys.modules, "tqdm", None)  # without tqdm: a line a step
    term = Terminal()
    step, close = bench._progress(len(steps), term)
    for s in steps:
        step(s)
    assert term.getvalue().splitlines() == [f"[{i + 1}/5] {s}" for i, s in enumerate(steps)]


def test_bench_help_says_in_one_line_what_it_measures():
    r = subprocess.run([sys.executable, "-m", "hostfeed", "bench", "--help"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "side by side with JAX's own callbacks" in " ".join(r.stdout.split())
    assert bench.DESCRIPTION.endswith(".") and ". " not in bench.DESCRIPTION  # one sentence


def test_n_64mb_is_a_whole_number_of_at_least_one():
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="n_64mb must be a whole number of 64 MiB"):
            bench.run(["throughput"], n_64mb=bad)
    with pytest.raises(SystemExit):
        bench.main(["--only", "throughput", "--n-64mb", "0"])


def test_a_run_is_set_beside_the_committed_runs_of_its_processor_alone():
    from hostfeed.bench import _committed, _processor, _readme
    run = json.loads(FULL_RUN.read_text())
    head = " ".join(_readme.text(run)[0].split())
    chosen = _readme.committed_set(run["header"])
    assert chosen is _committed.SETS[0]  # the README's: this run's processor
    assert "with the same processor" in head and chosen["machine"] in head
    assert _processor.name(run["header"]) in chosen["machine"]
    # A run on a processor no committed run is of: its figures alone, and why.
    run["header"]["processor"] = {"model": "Some Other CPU", "family": 1, "model_number": 1}
    run["header"]["cpu"] = "Some Other CPU"
    lines = _readme.text(run)
    head = " ".join(" ".join(lines[:6]).split())
    assert "No committed run is of this processor (Some Other CPU (family 1, model 1))" in head
    assert all(s["name"] in head for s in _committed.SETS)
    # The Xeon's committed runs are compared with a Xeon run, not with this machine's.
    xeon = json.loads((FULL_RUN.parent / "bench-xeon" / "bench.json").read_text())
    assert _readme.committed_set(xeon["header"])["folder"] == "docs/bench-xeon/"


def test_unknown_section_is_refused():
    with pytest.raises(ValueError, match="unknown bench sections"):
        bench.run(["nope"])
    with pytest.raises(SystemExit):
        bench.main(["--only", "nope"])


def test_receiver_stats_has_latency_distributions():
    lifecycle.reset_histograms()
    x = jnp.arange(4.0)
    jax.jit(lambda v: lax.fori_loop(0, 100, lambda i, c: hcb.id_tap(lambda *a: None, v,
                                                                     result=c), 0))(x)
    hcb.barrier_wait()
    stats = hostfeed.receiver_stats()
    for key in ("device_us", "handover_us"):
        assert set(stats[key]) == DISTRIBUTION
        assert stats[key]["count"] == 100
        assert 0 < stats[key]["p50"] <= stats[key]["p99"] <= stats[key]["max"]


def test_timing_can_be_turned_off():
    before = lifecycle.set_timing(False)
    try:
        lifecycle.reset_histograms()
        jax.jit(lambda v: hcb.id_tap(lambda *a: None, v))(1.0)
        hcb.barrier_wait()
        assert lifecycle.histograms() == {"device_ns": [], "handover_ns": []}
    finally:
        lifecycle.set_timing(before)


def test_importing_hostfeed_loads_no_benchmark_code():
    # receiver_stats() summarises the histograms with hostfeed._summary, shipped code; the
    # benchmarks (hostfeed.bench) load only when asked for.
    r = run_python("""
        import sys, hostfeed
        s = hostfeed.receiver_stats()
        assert set(s["device_us"]) == {"count", "mean", "p50", "p90", "p99", "p999", "max"}
        print(sorted(m for m in sys.modules if m.startswith("hostfeed.bench")))
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[-2] == "[]", r.stdout


def _readme_table():
    """The README's bench table: the cells of each row, the header's first."""
    text = (FULL_RUN.parents[1] / "README.md").read_text()
    block = text.split("<!-- bench:summary -->")[1].split("<!-- /bench:summary -->")[0]
    return [[c.strip() for c in ln.strip().strip("|").split("|")]
            for ln in block.splitlines() if ln.startswith("|") and not ln.startswith("|---")]


def _readme_section(text):
    """The report's last section as (this run, README, range, row) per row, its wrapped
    lines joined."""
    lines = text.splitlines()
    head = next(i for i, ln in enumerate(lines)
                if ln.split()[:4] == ["this", "run", "README", "over"])
    entries = []
    for ln in lines[head + 1:]:
        if ln.startswith(" " * 37):
            entries[-1][3] += " " + ln.strip()
        else:
            entries.append([ln[2:12].strip(), ln[12:21].strip(), ln[21:35].strip(),
                            ln[37:]])
    return lines[:head], entries


def test_the_report_ends_with_the_readme_rows_beside_the_committed_figures():
    from hostfeed.bench import _markdown
    # A committed run other than the one the README cites, as the terminal shows it.
    run = json.loads((FULL_RUN.parent / "bench-repeats" / "2.json").read_text())
    before, entries = _readme_section(_report.text(run))
    readme = _readme_table()
    assert readme[0][3:5] == ["ratio", "over 3 runs"] and "best JAX" in readme[0][2]
    assert len(entries) == len(readme) - 1 == len(_markdown.SUMMARY)
    body = " ".join(" ".join(before).split())
    for (now, cited, over, row), cells, summary in zip(entries, readme[1:], _markdown.SUMMARY):
        # Named as in the README, then where the report shows the figure.
        assert row == f"{cells[0]} [{summary.source}]"
        section, rest = summary.source.split(": ")
        method, column = rest.split(", ")
        assert section.split(",")[0] in run and method in body and column in body, row
        figure = summary.figure(run)
        # '~' after a figure: noisy in its run (the README marks the cited run's).
        assert now.endswith("~") == figure.noisy, row
        shown = now.removesuffix(" ~").removesuffix(" !")
        if cells[3] == "-":  # no baseline: the row's own figure
            assert cited == cells[1].replace("µ", "u")
            value, unit = shown.split()
            assert unit == "us" and float(value) == pytest.approx(figure.value, rel=0.01)
        else:
            assert cited == cells[3].removesuffix(" ~")
            assert over == cells[4].removesuffix(" **wide**")
            assert shown == f"{figure.ratio:.2f}x"


def test_the_readme_rows_mark_a_figure_outside_the_committed_range_and_name_the_missing():
    run = only("call")
    slow = run["call"]["methods"]["hostfeed call"]  # three times slower in every round
    slow["p50_us"] *= 3
    slow["rounds_p50_us"] = [3 * v for v in slow["rounds_p50_us"]]
    _, entries = _readme_section(_report.text(run))
    rows = {row.split(" [")[0]: (now, cited) for now, cited, _, row in entries}
    now, cited = rows["`call` round trip, float32[4], p50"]
    now = now.removesuffix(" ~")
    assert now.endswith(" !") and float(now[:-3]) == pytest.approx(3 * float(cited[:-1]),
                                                                   abs=0.02)
    assert rows["compile a function with 200 taps"][0] == "-"
    assert not rows["`call` round trip p50, every core busy"][0].endswith("!")


def test_the_eager_row_weighs_the_two_orders_of_its_rounds_alike():
    """The eager section's rounds alternate their order; hostfeed's rounds right after the
    other methods' cost more than those right after its own. The row's ratio weighs the two
    orders alike, so which order holds the middle round does not decide it."""
    import doctest

    from hostfeed.bench import _markdown, _report, _timing
    assert doctest.testmod(_timing).failed == 0

    def run(fast_rounds):
        # Even rounds (hostfeed first, after its own round): 10 us; odd rounds (last,
        # after the others): 30 us, but for `fast_rounds` odd rounds that were fast too.
        hf = [10.0 if i % 2 == 0 or i in fast_rounds else 30.0 for i in range(15)]
        flat = [20.0] * 15
        eager = {"taps": 100, "rss_growth_mb": 0.0, "registered_consumers_growth": 0}
        for name, rounds in [("hostfeed", hf), ("debug.callback", flat),
                             ("buffer_callback", [40.0] * 15),
                             ("hostfeed, fresh function", flat),
                             ("debug.callback, fresh function", flat)]:
            eager[name] = {"per_tap_us": statistics.median(rounds), "rounds_us": rounds}
        return {"header": {"processor": {"model": "test"}}, "eager": eager}

    # The plain median of the round ratios flips between the two orders' figures (0.5x
    # with 8 fast rounds of 15, 1.5x with 7); the row does not.
    a, b = run(fast_rounds=()), run(fast_rounds=(13,))
    ratios_a = _markdown.round_ratios(a["eager"]["hostfeed"]["rounds_us"], [20.0] * 15)
    ratios_b = _markdown.round_ratios(b["eager"]["hostfeed"]["rounds_us"], [20.0] * 15)
    assert statistics.median(ratios_a) == 0.5 and statistics.median(ratios_b) == 0.5
    c = run(fast_rounds=())
    c["eager"]["hostfeed"]["rounds_us"][0] = 30.0  # 7 fast rounds of 15: the median flips
    assert statistics.median(_markdown.round_ratios(c["eager"]["hostfeed"]["rounds_us"],
                                                    [20.0] * 15)) == 1.5
    figures = [_markdown._eager(r).ratio for r in (a, b, c)]
    assert figures == pytest.approx([math.sqrt(0.5 * 1.5)] * 3)
    # The bench's own report prints the same figure.
    line = next(ln for ln in _report._eager(c["eager"]) if ln.lstrip().startswith("hostfeed "))
    assert f"{math.sqrt(0.5 * 1.5):.2f}x" in line
