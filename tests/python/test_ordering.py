"""Each device's taps and calls reach the host in that device's program order, whatever
the multi-device strategy (per device, joined shard by shard, gathered), under both
partitioners, on 2, 4 and 8 devices; a joined callback counts, for ordering, at its
position on every device that sent a part.

The programs run in a subprocess (`helpers/ordering_cases.py`) that records, for every
callback, its iteration, its step in the program and the devices it happened on.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

import pytest

from conftest import skip_gspmd_where_gone

pytestmark = pytest.mark.several_devices

HELPER = os.path.join(os.path.dirname(__file__), "helpers", "ordering_cases.py")
ITERATIONS = 25
# step -> which devices it happens on: all (joined), each (per device), or device 0.
STEPS = {0: "all", 1: "each", 2: "first", 3: "all", 4: "each", 5: "each", 6: "all", 7: "each"}


@pytest.fixture(scope="module", params=[(2, True), (2, False), (4, True), (4, False),
                                        (8, True), (8, False)],
                ids=lambda c: f"{c[0]}dev-{'shardy' if c[1] else 'gspmd'}")
def result(request):
    n, shardy = request.param
    skip_gspmd_where_gone(shardy)
    r = subprocess.run([sys.executable, HELPER, str(n), "1" if shardy else "0",
                        str(ITERATIONS)],
                       capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    out["n"] = n
    return out


def test_every_callback_arrives_once_on_the_devices_it_belongs_to(result):
    n = result["n"]
    seen = Counter((it, step, tuple(devs)) for it, step, devs, _ in result["events"])
    expected = Counter()
    for it in range(ITERATIONS):
        for step, where in STEPS.items():
            if where == "all":
                expected[(it, step, tuple(range(n)))] += 1
            elif where == "first":
                expected[(it, step, (0,))] += 1
            else:
                for d in range(n):
                    expected[(it, step, (d,))] += 1
    assert seen == expected


def test_each_device_sees_its_callbacks_in_program_order(result):
    for d in range(result["n"]):
        mine = [(it, step) for it, step, devs, _ in result["events"] if d in devs]
        assert mine == sorted(mine), f"device {d} out of order"
        assert len(mine) == len(set(mine))


def test_the_issue_example_keeps_before_inside_after(result):
    n = result["n"]
    for heads in result["issue_example"]:
        whats = [w for w, _ in heads]
        assert whats == ["before"] + ["inside"] * n + ["after"]
        assert sorted(dev for w, dev in heads if w == "inside") == [
            f"device: cpu:{d}" for d in range(n)]
