"""The README's examples and every docstring example run as written."""
from __future__ import annotations

import doctest
import importlib
import pathlib
import re

import pytest

from conftest import run_python

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODULES = ["hostfeed", "hostfeed.host_callback", "hostfeed.printing", "hostfeed.primitives",
           "hostfeed.runtime", "hostfeed.settings", "hostfeed.receiver", "hostfeed._compat",
           "hostfeed.keys", "hostfeed.placement", "hostfeed.bench", "hostfeed.bench._timing",
           "hostfeed.recording", "hostfeed.zarr_dtypes", "hostfeed.lowering"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0


def readme_blocks():
    text = (ROOT / "README.md").read_text()
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_readme_has_two_commands_first():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert lines[3].startswith("pip install . && python -m hostfeed demo")
    assert lines[4].startswith("pip install '.[test]' && cargo test && python -m pytest")


def test_readme_example_prints_what_it_says():
    block = readme_blocks()[0]
    r = run_python(block)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["8.0", "[2.0, 4.0, 8.0]", "what: x,x^2", "( 3 9 )"]


def test_readme_install_example_runs():
    r = run_python(readme_blocks()[1] + "\nprint(hcb.id_tap.__module__)\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "hostfeed.host_callback"


def test_demo_runs_and_reports_counters():
    r = run_python("from hostfeed.__main__ import main; raise SystemExit(main(['demo']))")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("host received step") == 5
    assert r.stdout.count("host received dloss/dhidden") == 5
    assert "messages_processed       15" in r.stdout


def test_readme_call_example_prints_what_it_says():
    r = run_python(readme_blocks()[2])
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[0. 1. 2.]"


def _recording_blocks():
    return [b for b in readme_blocks() if "hostfeed.Recorder" in b or "run1.zarr" in b]


def test_readme_recording_example_trains_records_and_reads(tmp_path):
    block = _recording_blocks()[0]
    r = run_python(f"import os; os.chdir({str(tmp_path)!r})\n" + block)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.splitlines() == ["(100, 64, 32) float32 [0 1 2]",
                                     "(100, 64, 32) (100,)"]


def test_readme_recording_plot_example(tmp_path):
    pytest.importorskip("matplotlib")
    train, plot = _recording_blocks()[:2]
    r = run_python(f"import os; os.chdir({str(tmp_path)!r})\n" + train + "\n" + plot,
                   env={"MPLBACKEND": "Agg"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert (tmp_path / "activations.png").stat().st_size > 0
