"""Many devices (4 and 8 CPU devices, in subprocesses), under both partitioners: pmap,
shard_map, jit on a chosen device, and jit over sharded arrays (global view)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from hostfeed._src import compat as _compat

from conftest import run_python, skip_gspmd_where_gone

pytestmark = pytest.mark.several_devices

HELPER = os.path.join(os.path.dirname(__file__), "helpers", "multidevice_cases.py")
COMBOS = [(4, True), (4, False), (8, True), (8, False)]
_cache: dict = {}


@pytest.fixture(params=COMBOS, ids=lambda c: f"{c[0]}dev-{'shardy' if c[1] else 'gspmd'}")
def run(request):
    n, shardy = request.param
    skip_gspmd_where_gone(shardy)
    if request.param not in _cache:
        r = subprocess.run([sys.executable, HELPER, str(n), "1" if shardy else "0"],
                           capture_output=True, text=True, timeout=600,
                           env=dict(os.environ, JAX_PLATFORMS="cpu"))
        assert r.returncode == 0, r.stderr[-3000:]
        _cache[request.param] = json.loads(r.stdout.strip().splitlines()[-1])
    results = _cache[request.param]

    def get(name):
        res = results[name]
        assert "error" not in res, res.get("error")
        return res
    get.n, get.shardy = n, shardy
    return get


def test_pmap_taps_and_calls_per_device(run):
    n = run.n
    r = run("pmap_tap_and_call")
    expected = []
    for d in range(n):
        expected += [["call", 2.0 * d, d], ["pmap", 2.0 * d, d, []]]
    assert r["taps"] == expected
    assert r["out"] == [2.0 * d + 100.0 for d in range(n)]


def test_pmap_of_vmap(run):
    r = run("pmap_of_vmap")
    expected = []
    for d in range(run.n):
        # vmap of a call makes one call per batch element, on the element's device.
        expected += [["pv", [2.0 * d, 2.0 * d + 1], d, ["batch"]],
                     ["pvcall", 2.0 * d, d], ["pvcall", 2.0 * d + 1, d]]
    assert r["taps"] == sorted(expected, key=lambda g: (g[2], str(g)))
    assert r["out"] == [[2.0 * d + 0.5, 2.0 * d + 1.5] for d in range(run.n)]


def test_shard_map_full_manual_taps_each_shard_and_calls_return_per_shard(run):
    r = run("shard_map_full_manual")
    expected = []
    for d in range(run.n):
        expected += [["sm", [2.0 * d, 2.0 * d + 1], d, []],
                     ["smcall", [2.0 * d, 2.0 * d + 1], d]]
    assert r["taps"] == expected
    assert r["shards"] == [[d, [2.0 * d + 1, 2.0 * d + 2]] for d in range(run.n)]


def test_shard_map_partial_manual(run):
    r = run("shard_map_partial_manual")
    half = run.n // 2
    if run.shardy and not _compat.SHARDY_COMPILES_NESTED_MANUAL_TOKENS:  # XLA would abort
        assert r["error_type"] == "NotImplementedError"
        assert "partially manual shard_map" in r["message"]
        return
    # One callback per manual shard ('a'), with the operand whole over the automatic axis.
    row0 = [[float(i) for i in range(half)]]
    row1 = [[float(i) for i in range(half, 2 * half)]]
    assert r["taps"] == [["pm", row0, 0, []], ["pmcall", row0, 0],
                         ["pm", row1, half, []], ["pmcall", row1, half]]
    assert r["out"] == [[v + 10.0 for v in row0[0]], [v + 10.0 for v in row1[0]]]


def test_jit_on_a_chosen_device(run):
    r = run("jit_on_chosen_device")
    last = run.n - 1
    assert r["taps"] == [["dev", [0.0, 1.0, 2.0], last, []], ["devcall", [0.0, 1.0, 2.0], last]]
    assert r["out_devices"] == [last]


@pytest.mark.parametrize("case, scale, offset", [("global_1d_explicit", 2.0, 0.0),
                                                 ("global_1d_auto", 1.0, 1.0)])
def test_global_view_taps_the_whole_operand_once(run, case, scale, offset):
    r = run(case)
    whole = [i * scale + offset for i in range(2 * run.n)]
    assert r["taps"] == [[r["taps"][0][0], whole, 0, []]]
    assert r["out"] == whole


def test_global_view_taps_are_assembled_from_shards_without_collectives(run):
    n = run.n
    r = run("global_shardwise_pytree_loop_and_fallback")
    a = [float(i) for i in range(2 * n)]
    b = [[3 * i, 3 * i + 1, 3 * i + 2] for i in range(n)]
    assert r["tree"]["out"] == 3
    assert r["tree"]["taps"] == [
        ["tree", {"a": [v + k for v in a], "b": b}, 0, []] for k in range(3)]
    assert r["tree_collectives"] == 0
    assert r["mixed"]["taps"] == [["mixed", [a, sum(a)], 0, []]]
    assert r["mixed_gathers"]
    assert r["unmeshed"]["taps"] == [["unmeshed", [a, list(range(n))], 0, []]]


def test_device_index_chooses_the_collecting_device(run):
    r = run("global_device_index")
    assert r["taps"] == [["gk", [float(i) for i in range(2 * run.n)], 2, []]]
    bad = run("global_device_index_out_of_range")
    assert bad["error_type"] == "ValueError"
    assert f"device_index={run.n} is outside the {run.n} device(s)" in bad["message"]


def test_global_view_on_2d_meshes(run):
    r = run("global_2d")
    whole = [[float(i * run.n + j) for j in range(run.n)] for i in range(4)]
    for name in ("both", "one", "replicated", "auto_both"):
        assert r[name]["taps"] == [[name, whole, 0, []]], name
        assert r[name]["out"] == whole


def test_global_call_results_land_on_the_right_shards(run):
    n = run.n
    r = run("global_call_results_on_shards")
    assert r["taps"] == [["gcall", [float(i) for i in range(2 * n)], 0]]
    assert r["shards"] == [[d, [2 * (2 * d + 1000.0), 2 * (2 * d + 1 + 1000.0)]]
                           for d in range(n)]
    # 2-D: (4, n) on a (2, n/2) mesh, result = call(v) + v with call(v) = v + 0.5.
    half = n // 2
    per = n // half
    expected = []
    for d in range(n):
        a, b = divmod(d, half)
        rows = range(2 * a, 2 * a + 2)
        cols = range(b * per, b * per + per)
        expected.append([d, [[2 * (i * n + j) + 0.5 for j in cols] for i in rows]])
    assert r["shards_2d"] == expected
    assert r["spec_2d"] == "P('a', 'b')"


def test_taps_in_scan_and_while_under_sharding(run):
    n = run.n
    r = run("scan_and_while_under_sharding")
    base = [float(i) for i in range(n)]
    assert r["taps_in_order"] == [
        ["scan", base, 0, []], ["scan", [v + 1 for v in base], 0, []],
        ["while", [2 * (v + 1) for v in base], 0, []],
        ["while", [4 * (v + 1) for v in base], 0, []]]


def test_vmap_and_grad_of_sharded_function(run):
    n = run.n
    r = run("vmap_and_grad_of_sharded")
    assert r["vmap"]["taps"] == [["vmap", [3.0 * i for i in range(n)], 0, ["batch"]]]
    assert r["grad"]["taps"] == [["grad", [float(i * i) for i in range(n)], 0, []],
                                 ["grad", [1.0] * n, 0, ["jvp", "transpose"]]]
    assert r["grad"]["out"] == [2.0 * i for i in range(n)]


def test_barrier_waits_for_all_devices(run):
    r = run("barrier_waits_for_all_devices")
    assert r["count"] == 250 * run.n
    assert r["per_device"] == [[d, 250] for d in range(run.n)]
    assert r["in_order"]


def test_failing_call_fails_every_device_and_the_receiver_recovers(run):
    r = run("failing_calls_fail_every_device_and_recover")
    for name in ("global", "global_gathered", "pmap"):
        assert r[name] == {"raised": ["JaxRuntimeError", True],
                           "barrier": ["CallbackException", True],
                           "after": [1.0, 2.0, 3.0]}, name


def test_atexit_drains_outstanding_work_on_all_devices():
    r = run_python("""
        import sys
        import jax, jax.numpy as jnp
        from jax import lax
        from hostfeed import host_callback as hcb
        def tap(a, tr, *, device):
            sys.stdout.write(f"{device.id} {int(a)}\\n")
        f = jax.pmap(lambda x: lax.fori_loop(0, 100, lambda i, c: hcb.id_tap(
            tap, i, result=c, tap_with_device=True), x))
        f(jnp.zeros(4))
    """, env={"XLA_FLAGS": "--xla_force_host_platform_device_count=4"})
    assert r.returncode == 0, r.stderr
    lines = [tuple(map(int, line.split())) for line in r.stdout.splitlines()]
    for d in range(4):
        assert [i for dev, i in lines if dev == d] == list(range(100))
