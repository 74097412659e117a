"""Every docstring example runs as written; the README's commands and the demo.
(The README's and the docs' code blocks: test_docs.py.)"""
from __future__ import annotations

import doctest
import importlib.util
import importlib
import pathlib
import re
import sys

import pytest

import hostfeed

from conftest import run_python

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODULES = ["hostfeed", "hostfeed.host_callback", "hostfeed.lowering", "hostfeed.zarr_dtypes",
           "hostfeed.bench", "hostfeed.bench._timing", "hostfeed.bench._markdown",
           "hostfeed.bench._markdown_tpu", "hostfeed.bench._processor",
           "hostfeed.bench._throughput",
           "hostfeed.bench._report", "hostfeed.bench._readme",
           *(f"hostfeed._src.{m}" for m in (
               "compat", "compat.versions", "settings", "dtypes", "devices", "errors",
               "consumers", "dispatcher",
               "lifecycle", "printing", "primitives", "eager", "runtime",
               "placement", "fast_dispatch", "measuring", "record.recorder", "record.lowering",
               "record.late",
               "record.cotangents", "record.inputs", "record.options",
               "readback.reading", "readback.series", "readback.tensorboard", "readback.canvas",
               "reductions", "reductions.stats", "reductions.histogram",
               "record.window", "record.watch",
               "record.stores", "record.coordination", "rules", "lowering", "latency",
               "transports", "transports.native", "transports.portable",
               "transports.tpu", "transports.common", "transports.base"))]


#: Modules whose examples need an optional package (a machine without it, as the
#: accelerator machines, skips them, saying which; CI installs them all).
NEEDS = {"hostfeed._src.readback.tensorboard": "tensorboard"}


@pytest.mark.parametrize("name", MODULES)
@pytest.mark.usefixtures("default_tap_mode")  # the mode the examples show
def test_docstring_examples(name):
    if name in NEEDS and importlib.util.find_spec(NEEDS[name]) is None:
        pytest.skip(f"{name}'s examples need the {NEEDS[name]} package, not installed here")
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0


def test_readme_has_two_commands_first():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert lines[3].startswith("pip install . && python -m hostfeed demo")
    assert lines[4].startswith("pip install '.[test]' && cargo test && python -m pytest")


def test_demo_trains_records_reads_back_and_summarises(tmp_path):
    store = tmp_path / "demo.zarr"
    r = run_python("from hostfeed.__main__ import main; "
                   f"raise SystemExit(main(['demo', '--steps', '40', '--store', {str(store)!r}]))")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    # Not a terminal: one progress line per quarter of the run, driven by the taps.
    assert [ln.split("[")[0].strip() for ln in lines if re.match(r" +step +\d+/", ln)] == [
        "step 10/40", "step 20/40", "step 30/40", "step 40/40"]
    assert "recorded 40 rows each of hidden/mean, hidden/std and grad_norm; read back:" in lines
    assert [ln.split()[0] for ln in lines[lines.index("    step  hidden/mean  hidden/std  "
                                                      "grad_norm") + 1:][:3]] == ["0", "20", "39"]
    summary = [ln for ln in lines if ln.startswith("the device spent")]
    assert len(summary) == 1 and "for 240 messages" in summary[0], r.stdout
    first, last = (float(v) for v in lines[-1].removeprefix("loss ").split(" -> "))
    assert last < first
    assert f"the recording is kept in {store}" in lines
    look = lines[lines.index(f"the recording is kept in {store}") + 1]
    assert look.startswith(f"look at it: python -m hostfeed show {store} ")
    assert f"python -m hostfeed tensorboard {store} LOGDIR" in look
    rows, meta = hostfeed.read_recording(store, "grad_norm")
    assert meta["step"].tolist() == list(range(40))


def test_demo_refuses_no_steps_with_its_own_usage():
    r = run_python("from hostfeed.__main__ import main; raise SystemExit(main(['demo', "
                   "'--steps', '0']))")
    assert r.returncode == 2
    assert "usage: python -m hostfeed demo" in r.stderr
    assert "--steps must be at least 1, got 0" in r.stderr



# The README as a new user meets it: every Python block needs only what
# the README installed before it, and the blocks run in order. `.ci/readme_check.py` does
# the same in a fresh virtual environment in CI.

def _readme_check():
    spec = importlib.util.spec_from_file_location("readme_check",
                                                  ROOT / ".ci" / "readme_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# What `pip install .` brings (hostfeed's dependencies), and which README install
# arguments bring the other modules its blocks import.
_BASE_MODULES = {"hostfeed", "jax", "jaxlib", "numpy", "ml_dtypes"}
_PROVIDERS = {"zarr": {"zarr", ".[zarr]"}, "matplotlib": {"matplotlib", ".[bench]"},
              "equinox": {"equinox", ".[equinox]"}}


def _one_extra_each(arg: str) -> set[str]:
    """``'.[equinox,zarr]'`` as ``{'.[equinox]', '.[zarr]'}``; other arguments as they are."""
    if arg.startswith(".[") and arg.endswith("]"):
        return {f".[{extra.strip()}]" for extra in arg[2:-1].split(",")}
    return {arg}


def test_readme_check_doctests():
    assert doctest.testmod(_readme_check()).failed == 0


def test_readme_blocks_need_only_what_the_readme_installed_before_them():
    rc = _readme_check()
    installed: set[str] = set()
    checked = 0
    for block in rc.blocks():
        if block.lang == "bash":
            installed |= {e for cmd in rc.pip_installs(block) for a in cmd
                          for e in _one_extra_each(a)}
            continue
        needed = rc.imported_modules(block.code) - _BASE_MODULES - set(sys.stdlib_module_names)
        if "read_recording" in block.code:
            needed.add("zarr")  # hostfeed.read_recording reads with zarr-python
        for module in needed:
            assert module in _PROVIDERS, (
                f"README.md:{block.line} imports {module}: add its install command to the "
                f"README before the block, and here how it is installed")
            assert installed & _PROVIDERS[module], (
                f"README.md:{block.line} needs {module}, which no install command before it "
                f"in the README installs (installed so far: {sorted(installed)})")
        checked += 1
    assert checked >= 3
    assert "." in installed  # the first command installs hostfeed itself
