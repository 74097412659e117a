"""The README and the documentation as a reader meets them: every Python block of each page
runs, in order, and prints what its comments say; every performance figure is one the
committed bench runs produced (docs/figures.py); the site builds with warnings as errors."""
from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

from conftest import flax_scan_refuses_effects

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _load(path: pathlib.Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


readme_check = _load(ROOT / ".ci" / "readme_check.py", "readme_check")
figures = _load(ROOT / "docs" / "figures.py", "figures")

#: What the blocks print, by page and (0-based) Python block: the comments beside their
#: print calls, as lines.
EXPECTED = {
    ("README.md", 0): ["8.0", "[2.0, 4.0, 8.0]"],
    ("README.md", 2): ["(5, 2, 3) [0 1 2 3 4]"],
    ("README.md", 3): ["['layers.0/output', 'layers.1/output', 'layers.2/output']",
                       "(15, 8) [0 0 0 0 0 1 1 1 1 1 2 2 2 2 2]"],
    ("index.md", 0): ["8.0", "[2.0, 4.0, 8.0]"],
    ("migrating.md", 1): ["True"],
    ("migrating.md", 2): ["[0. 1. 2.]"],
    ("migrating.md", 3): ["what: x,x^2", "( 3 9 )"],
    ("behaviour.md", 0): ["[1]", "what: two", "2"],
    ("recording.md", 0): ["(100, 64, 32) float32 [0 1 2]", "(100, 64, 32) (100,)"],
    ("recording.md", 2): ["(10, 12) ('count', 'mean', 'std')", "[0, 5] [0, 24, 8, 8, 24, 0]",
                          "[8, 9]"],
    ("recording.md", 3): ["32 (32, 8, 4) [3.0, 0.0]", "4 (64, 4)", "True"],
    ("recording.md", 4): ["[1.0, 0.5, 0.3333333432674408]"],
    ("recording.md", 5): ["[0, 1, 2, 3, 4, 5, 6, 7]", "[3.0, 1.92, 1.23, 0.79]",
                          "(8,) [3.0, 1.92]"],
    ("recording-reference.md", 0): ["[[7.0, 7.0], [9.0, 5.0]] [[1, 2], [3, 0]]",
                                    "(array([0, 1]), array([1, 0]))"],
    ("recording-reference.md", 1): ["2.0 1.0 1.0 21.97"],
    ("quickstart.md", 1): ["(30, 8, 4) [0 1 2]", "[ 0 10 20]"],
    ("looking.md", 0): ["[1.0, 0.5, 0.33, 0.25, 0.2]"],
    # The captures' examples train (the loss goes down) and record finite values.
    ("capture.md", 0): ["['blocks.0.mlp/output', 'blocks.0.mlp/output.cotangent']",
                        "(3, 8, 12, 16) [0, 10, 20]", "True True"],
    ("capture.md", 1): ["(30, 12) ('mean', 'std')", "True True"],
    ("capture.md", 2): ["(24, 12, 16) [0, 10, 20]", "True True"],
    ("capture.md", 3): ["(12, 8, 12, 16) [0, 0, 0, 0, 10, 10, 10, 10]", "True True"],
    ("capture.md", 4): ["(12, 8, 12, 16) [0, 0, 0, 0, 10, 10, 10, 10]", "True True"],
    ("capture.md", 5): ["(96, 12, 16) [0, 0, 0, 0, 10, 10, 10, 10, 20, 20, 20, 20]",
                        "True True"],
    # A stack's summaries and their cotangents', a row per layer and step, under grad.
    ("capture.md", 6): ["['blocks.down/output.cotangent.hist', 'blocks.down/output.cotangent."
                        "stats', 'blocks.down/output.cotangent.topk']",
                        "80 True [0, 0, 0, 0, 1, 1, 1, 1]",
                        "(8, 16) [0, 0, 0, 0, 10, 10, 10, 10]"],
    ("debugging.md", 0): ["stopped: 200 blocks.0/output", "169 200",
                          "nonfinite 200 169 202 {}"],
    ("troubleshooting.md", 0): ["[1.0]"],
    ("troubleshooting.md", 1): ["ValueError negative: -1.0"],
}


def _python_blocks(page: pathlib.Path):
    return [b for b in readme_check.blocks(page.read_text()) if b.lang == "python"]


@pytest.mark.parametrize("page", [p for p in PAGES if _python_blocks(p)],
                         ids=lambda p: p.name)
def test_every_python_block_runs_in_order_and_prints_what_it_says(page, tmp_path,
                                                                 monkeypatch):
    monkeypatch.delenv("HOSTFEED_SYNC_TAPS", raising=False)  # the default mode, as a reader's
    pytest.importorskip("zarr")
    pytest.importorskip("matplotlib")
    blocks = _python_blocks(page)
    assert not [b for b in blocks if b.skip]  # none needs a GPU yet; the marker is for later
    # The Linen example that records inside an nn.scan, which Flax 0.12.12 refuses for any
    # effect (docs/capture.md says so): where it does, that block must fail with Flax's
    # refusal, and the others run.
    refused = []
    if page.name == "capture.md" and flax_scan_refuses_effects():
        refused = [i for i, b in enumerate(blocks) if "nn.scan(" in b.code]
        assert refused, "capture.md's Linen nn.scan example is gone: update this test"
        blocks = [b._replace(skip="this Flax's nn.scan refuses effects") if i in refused
                  else b for i, b in enumerate(blocks)]
    outputs = readme_check.run_python_blocks(blocks, workdir=str(tmp_path),
                                             source=str(page.relative_to(ROOT)))
    for (name, i), lines in EXPECTED.items():
        if name == page.name and i not in refused:
            assert outputs[i].splitlines() == lines, (page.name, i, outputs[i])
    for i in refused:
        r = subprocess.run([sys.executable, "-c", blocks[i].code], cwd=tmp_path,
                           capture_output=True, text=True, timeout=600,
                           env=dict(os.environ, JAX_PLATFORMS="cpu"))
        assert r.returncode != 0 and "data dependency on the scan body" in r.stderr, (
            r.returncode, r.stderr[-2000:])
    if page.name == "recording.md":
        assert (tmp_path / "activations.png").stat().st_size > 0


def test_every_expectation_names_a_block():
    for name, i in EXPECTED:
        page = next(p for p in PAGES if p.name == name)
        assert i < len(_python_blocks(page)), (name, i)


def test_every_figure_comes_from_the_committed_bench_runs(capsys):
    assert figures.main(["--check"]) == 0, capsys.readouterr().err


def test_a_figure_outside_a_generated_table_is_caught():
    text = ("intro 3.5 µs\n<!-- bench:summary -->\n| 2.0x | 1 GB/s |\n<!-- /bench:summary -->\n"
            "then 0.25x and 12-40 ms, but not 64 MiB, 10 s or 2^47 bytes\n")
    assert figures.stray_figures(text) == [(1, "3.5 µs"), (5, "0.25x"), (5, "12-40 ms")]


def test_a_table_that_differs_from_the_runs_is_caught():
    runs = figures.runs()
    page = "<!-- bench:summary -->\nold table\n<!-- /bench:summary -->\n"
    regenerated = figures.regenerate(page, runs)
    assert regenerated != page and "| small tap" in regenerated
    assert figures.regenerate(regenerated, runs) == regenerated


def test_the_summary_says_its_runs_are_quiet_and_shows_runs_on_a_busy_machine():
    from hostfeed.bench import _markdown
    runs = figures.runs()
    busy = json.loads(json.dumps(runs[0]))
    busy["header"].update(quick=True, load_average=5.1, load_average_end=6.25)
    call = busy["call"]["methods"]["hostfeed call"]
    call["p50_us"] *= 3  # three times slower in every round: three times the ratio
    call["rounds_p50_us"] = [3 * v for v in call["rounds_p50_us"]]
    del busy["sweep"]
    table = figures.render("summary", runs, [busy])
    assert f"a quiet machine: load {_markdown.loads(runs)} when each run started" in table
    rows = {ln.split(" | ")[0].strip("| "): ln.strip(" |").split(" | ")
            for ln in table.splitlines() if ln.startswith("| ")}
    assert rows[""][-1] == "quick run, load 5.10-6.25"
    quiet = rows["`call` round trip, float32[4], p50"]
    ratio = float(quiet[3].split("x")[0])
    busy_ratio = rows["`call` round trip, float32[4], p50"][-1]
    assert busy_ratio.startswith("**") and float(busy_ratio.strip("*x")) == pytest.approx(
        3 * ratio, rel=0.02)  # outside the quiet runs' range: bold
    same = rows["the same with one `call`"]  # unchanged from the cited run: as there
    assert same[-1] == same[3].split()[0]
    assert rows["4 MiB taps in a loop until every function ran (per byte)"][-1] == "-"
    # The README shows the committed busy runs (docs/bench-loaded/) the same way.
    readme = (ROOT / "README.md").read_text()
    assert figures.loaded_runs() and "| quick run, load " in readme


def test_the_rows_the_bench_prints_are_the_committed_runs(tmp_path, monkeypatch, capsys):
    stale = tmp_path / "_committed.py"
    stale.write_text(figures.COMMITTED.read_text().replace("'runs': 3,", "'runs': 2,", 1))
    monkeypatch.setattr(figures, "COMMITTED", stale)
    assert figures.main(["--check"]) == 1
    assert "_committed.py is not the README's rows of the committed runs" in \
        capsys.readouterr().err


def test_the_site_builds_with_warnings_as_errors(tmp_path):
    pytest.importorskip("sphinx")
    pytest.importorskip("myst_parser")
    pytest.importorskip("furo")
    r = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
                        str(ROOT / "docs"), str(tmp_path)], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    index = (tmp_path / "index.html").read_text()
    assert "<title>hostfeed" in index and "troubleshooting.html" in index


def test_the_api_page_lists_every_public_name_in_plain_markdown():
    """docs/api.md reads on a code host: every public name in a table, no Sphinx role or
    directive (the docstrings' detail is docs/reference.md, built into the site)."""
    import hostfeed
    from hostfeed import host_callback as hcb

    text = (ROOT / "docs" / "api.md").read_text()
    assert "{eval-rst}" not in text and "{doc}" not in text and "autofunction" not in text
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    listed = " ".join(row.split("|")[1] for row in rows)
    for name in [*hostfeed.__all__, *hcb.__all__]:
        assert f"`{name}" in listed or f" `{name}(" in listed or f"`{name}`" in listed, name
    for method in ("record", "step", "flush", "close", "stats"):
        assert f"`Recorder.{method}" in listed, method


def test_pages_the_readme_links_to_use_no_sphinx_role():
    """Read on a code host or in an editor, a role shows as raw text: the README and the
    pages it links to use Markdown links instead."""
    import re
    readme = (ROOT / "README.md").read_text()
    pages = {ROOT / "README.md"} | {ROOT / m for m in re.findall(r"\]\((docs/[\w-]+\.md)", readme)}
    for page in sorted(pages):
        text = page.read_text()
        assert not re.search(r"\{(doc|class|func|ref|meth)\}`", text), page


def test_no_page_shows_a_sphinx_directive_on_a_code_host():
    """On a code host a directive block (a toctree, an included file, autodoc) shows as raw
    text: no page has one. The front page's navigation is its lists of links
    (docs/navigation.py makes them toctrees on the site), the API reference is generated
    Markdown (docs/reference.py), the bench's whole report a generated block."""
    for page in PAGES:
        text = page.read_text()
        found = re.findall(r"^(?:```|:::)\{[\w-]+\}.*$", text, re.M)
        assert not found and "{eval-rst}" not in text, (page.name, found)


def test_the_front_pages_links_are_the_sites_whole_navigation():
    """Every page but the front page is linked from one of its marked lists, once; the
    site's hidden toctrees are those lists (a page left out would fail the site's build,
    which CI runs with warnings as errors)."""
    navigation = _load(ROOT / "docs" / "navigation.py", "navigation")
    import doctest
    assert doctest.testmod(navigation).failed == 0
    index = (ROOT / "docs" / "index.md").read_text()
    listed = [name for _, _, pages in navigation.toctrees(index) for name in pages]
    assert [caption for caption, _, _ in navigation.toctrees(index)] == ["User guide",
                                                                          "Reference"]
    everything = sorted(p.stem for p in (ROOT / "docs").glob("*.md") if p.stem != "index")
    assert sorted(listed) == everything and len(set(listed)) == len(listed)
    assert "```{toctree}" in navigation.expand(index)


def test_the_reference_pages_are_what_the_package_says(capsys):
    """docs/reference.md (the docstrings) and docs/cli.md (the commands' parsers) are
    generated, plain Markdown: stale after a docstring or an option changed until
    `python docs/reference.py --write` is run."""
    reference = _load(ROOT / "docs" / "reference.py", "reference")
    assert reference.main(["--check"]) == 0, capsys.readouterr().err
    import hostfeed
    from hostfeed import host_callback as hcb
    text = (ROOT / "docs" / "reference.md").read_text()
    for name in hostfeed.__all__:
        where = "hostfeed.host_callback" if name == "host_callback" else None
        assert f"### `hostfeed.{name}`" in text or f"## `{where}`" in text or (
            f"### `hostfeed.host_callback.{name}`" in text and name in hcb.__all__), name
    for name in hcb.__all__:
        assert f"### `hostfeed.host_callback.{name}`" in text, name
    assert "```{" not in text and ":func:`" not in text and "``" not in text.replace("```", "")
    # Every option of every command, spelled as --help spells it.
    from hostfeed.__main__ import parser
    import argparse
    cli = (ROOT / "docs" / "cli.md").read_text()
    commands = next(a for a in parser()._actions if isinstance(a, argparse._SubParsersAction))
    for name, sub in commands.choices.items():
        assert f"## `python -m hostfeed {name}`" in cli, name
        for action in sub._actions:
            for option in action.option_strings:
                assert f"`{option}" in cli, (name, option)
    # A stale page is caught.
    stale = ROOT / "docs" / "cli.md"
    original = stale.read_text()
    try:
        stale.write_text(original.replace("--follow", "--tail"))
        assert reference.main(["--check"]) == 1
        assert "docs/cli.md is not what the package says" in capsys.readouterr().err
    finally:
        stale.write_text(original)


def test_install_hints_name_commands_that_work_without_a_package_index(monkeypatch):
    """hostfeed is on no package index: no hint anywhere says `pip install
    'hostfeed[...]'`. A hint names the package itself (`pip install tensorboard`) or the
    checkout's extra (`pip install '.[tensorboard]'`)."""
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
             *sorted((ROOT / "docs").glob("*.py")), *sorted((ROOT / "python").rglob("*.py")),
             *sorted((ROOT / "benches").glob("*.py"))]
    found = [(f.relative_to(ROOT), n) for f in files
             for n, line in enumerate(f.read_text().splitlines(), 1) if "hostfeed[" in line]
    assert not found, found
    from hostfeed._src.readback import tensorboard
    monkeypatch.setitem(sys.modules, "tensorboard.compat.proto.event_pb2", None)  # missing
    with pytest.raises(ImportError, match=r"pip install tensorboard \(or, in hostfeed's "
                                          r"checkout, pip install '\.\[tensorboard\]'\)"):
        tensorboard._tb()


def test_the_recording_guide_is_short_and_starts_with_its_recipes():
    guide = (ROOT / "docs" / "recording.md").read_text()
    reference = (ROOT / "docs" / "recording-reference.md").read_text()
    assert len(guide.split()) < 2000, len(guide.split())
    heads = [ln for ln in guide.splitlines() if ln.startswith("## ")]
    assert heads[:2] == ["## Record a training run",
                         "## Record less: every N steps, statistics, histograms"]
    # What the guide leaves out is in the reference: nothing was lost in the split.
    for part in ("coordination_timeout", "single_put_bytes", "resume_after_step",
                 "iter_batches(name, batch_size", "bench:tpu_record", "`durable=True`"):
        assert part in reference, part
    # `rec` is the Recorder in every example; a recording opened for reading is `data`.
    for text in (guide, reference):
        assert not re.search(r"rec\s*=\s*hostfeed\.open_recording|`rec\.(names|table|"
                             r"iter_batches)|rec\[name\]", text)


def test_each_set_of_committed_runs_holds_the_runs_of_one_processor():
    sets = [(figures._where(folder), figures.runs(folder) + figures.loaded_runs(folder))
            for folder in figures.SETS.values()]
    assert figures.mixed(sets) == []
    names = {figures.runs(folder)[0]["header"].get("cpu") for folder in figures.SETS.values()}
    assert len(names) == len(figures.SETS)  # a processor per set
    # A run of another processor slipped into a set is named.
    (where, runs), (_, other) = sets[0], sets[1]
    problems = figures.mixed([(where, [*runs, other[0]])])
    assert len(problems) == 1 and problems[0].startswith(f"{where}: a run on ")
