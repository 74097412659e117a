"""Taps and records lowered inside ``cond``, ``switch``, ``while_loop`` and ``scan``, and
under ``grad``, ``checkpoint`` and ``vmap`` with ``every=`` and ``reduce=``: each case runs
in a child process (tests/python/helpers/lowering_cases.py), so that a crash while lowering
fails the case that crashed, naming the signal and the stack, instead of ending the test
run (jax 0.12.1 lowers a ``cond`` as a function of its own, and hostfeed's lowering once
crashed the process there). The remaining cases run in a fresh child."""
from __future__ import annotations

import ast
import json
import os
import pathlib
import subprocess
import sys

import pytest

from conftest import describe_exit

pytest.importorskip("zarr")

HELPER = pathlib.Path(__file__).parent / "helpers" / "lowering_cases.py"


def _case_names() -> list[str]:
    """The helper's cases, read from its source (importing it would start JAX here)."""
    tree = ast.parse(HELPER.read_text())
    return [f.name for f in tree.body if isinstance(f, ast.FunctionDef)
            and any(isinstance(d, ast.Name) and d.id == "case" for d in f.decorator_list)]


NAMES = _case_names()


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[str, str]:
    """Each case's result: "ok", its traceback, or how the process running it died."""
    out: dict[str, str] = {}
    pending = list(NAMES)
    store_dir = tmp_path_factory.mktemp("lowering_cases")
    while pending:
        r = subprocess.run([sys.executable, str(HELPER), str(store_dir), *pending],
                           capture_output=True, text=True, timeout=600,
                           env=dict(os.environ, JAX_PLATFORMS="cpu"))
        running = None
        for line in r.stdout.splitlines():
            if line.startswith("START "):
                running = line[len("START "):]
            elif line.startswith("{"):
                done = json.loads(line)
                out[done["case"]] = done["result"]
                running = None
        if running is None:
            for name in pending:
                out.setdefault(name, f"the child {describe_exit(r.returncode)} before this "
                                     f"case ran:\n{r.stderr[-3000:]}")
            break
        out[running] = (f"the child process {describe_exit(r.returncode)} while running "
                        f"this case:\n{r.stderr[-6000:]}")
        pending = [n for n in pending if n not in out]
    return out


def test_the_cases_are_found():
    assert len(NAMES) >= 8 and "tap_in_both_branches_of_cond" in NAMES


@pytest.mark.parametrize("name", NAMES)
def test_lowered_in_control_flow(results, name):
    assert results[name] == "ok", results[name]
