"""Joined (global-view, shard by shard) taps and calls while the same devices run
single-device computations that tap and call, dispatched from other threads: nothing is
lost and each source's callbacks arrive in its order (helpers/joined_concurrency.py, in
subprocesses with 2 and 4 CPU devices, fast dispatch on and off).

A multi-device execution is not ordered against single-device ones on CPU, so a device
that sent its part of a joined tap often runs other computations before the other devices
send theirs; those later callbacks wait for the joined one, and nothing is dropped.
The soak (``HOSTFEED_SOAK=1``) runs the same mix, with records, from 4 threads on 4
devices for 5 minutes. A barrier from another thread waits for every tap dispatched before
it, also one held behind a joined tap of an execution dispatched after it
(helpers/barrier_snapshot.py; its soak too).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import soak_seconds

pytestmark = pytest.mark.several_devices

HELPER = os.path.join(os.path.dirname(__file__), "helpers", "joined_concurrency.py")


def run_helper(devices: int, fast: bool, *args: str, timeout: float = 600) -> dict:
    env = dict(os.environ, JAX_PLATFORMS="cpu", HOSTFEED_FAST_DISPATCH="1" if fast else "0")
    r = subprocess.run([sys.executable, HELPER, str(devices), *args], capture_output=True,
                       text=True, timeout=timeout, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "dropped an incomplete" not in r.stderr, r.stderr[-3000:]
    assert "out of its order" not in r.stderr or "--sharded-threads" in args, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def check(res: dict) -> None:
    assert res["sharded_seen"] == res["sharded_unique"] == res["sharded_sent"] > 0, res
    assert res["sharded_in_order"] and not res["sharded_bad_values"], res
    assert res["single_seen"] == res["single_sent"] > 0, res
    assert res["single_in_order"] and not res["single_bad"], res
    assert not res["calls_bad"], res


@pytest.mark.parametrize("fast", [True, False], ids=["fast-dispatch", "token-chain"])
@pytest.mark.parametrize("devices", [2, 4])
def test_joined_taps_mixed_with_single_device_work_from_threads(devices, fast):
    res = run_helper(devices, fast, "--rounds", "300", "--single-threads", "2")
    check(res)
    assert res["sharded_sent"] == 300 and res["single_sent"] == 2 * 5 * 300


@pytest.mark.timeout(300)
@pytest.mark.xfail(os.environ.get("HOSTFEED_TRANSPORT", "").strip().lower() == "jax",
                   strict=False,
                   reason="known race on the portable transport (one CI run of two, "
                          "2026-12-06): a stop from another thread let a message reach a "
                          "consumer id no longer registered (LookupError); not yet found")
def test_barriers_and_stops_from_other_threads_lose_no_tap_and_reorder_none():
    # A barrier or a stop from another thread, at any moment, while sharded (joined) and
    # single-device computations are dispatched from several threads. Before: a barrier
    # dropped the joined sets of executions still running (their parts were lost, later
    # parts ran out of order), and each stop stalled every device until the consumer was
    # joined, which deadlocked XLA's CPU client with two threads dispatching sharded
    # computations.
    # 10 s of it once (CI's newest JAX), 3 s in the other sessions (conftest.soak_seconds).
    res = run_helper(4, True, "--seconds", str(soak_seconds(10, 3)), "--sharded-threads", "2",
                     "--sharded-taps-only", "--single-threads", "3", "--barrier-threads", "1",
                     "--stop-threads", "1", timeout=240)
    check(res)
    assert res["barriers"] > 0 and res["stops"] > 0, res


SNAPSHOT = os.path.join(os.path.dirname(__file__), "helpers", "barrier_snapshot.py")


def run_snapshot(seconds: float, *args: str) -> dict:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    r = subprocess.run([sys.executable, SNAPSHOT, "4", "--seconds", str(seconds), *args],
                       capture_output=True, text=True, timeout=seconds + 240, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(300)
def test_barrier_from_another_thread_waits_for_every_tap_dispatched_before_it():
    # Issue 65, point 3: four threads tap on their own device (two through AOT-compiled
    # objects with a donated argument), two dispatch sharded (joined) taps, and other
    # threads loop on barrier_wait(), jax.effects_barrier() and stop_outfeed_receiver().
    # Each barrier_wait checks that the taps whose dispatch returned before it started
    # ran. Before: a tap held back behind a joined tap of a later execution (its device ran
    # that execution's part first) counted as processed, and about one barrier in 600
    # returned before it ran (in 1 run of 2 of 10 s). The short deterministic form is
    # test_shard_assembly's test_barrier_waits_for_a_tap_held_back_behind_...
    res = run_snapshot(soak_seconds(10, 3), "--sharded-threads", "2")
    assert res["early"] == 0, res
    assert res["seen"] == res["sent"] > 0 and not res["out_of_order"], res
    assert res["barriers"] > 0 and res["stops"] > 0, res


def test_barrier_waits_for_another_threads_sharded_computation():
    # Issue 65, point 3, the soak's second finding: JAX chains the effect tokens of each
    # thread apart (its RuntimeTokenSet is a threading.local), so a barrier waited for its
    # own thread's multi-device computations only. Here a thread dispatches a sharded
    # computation that calls (the host function waits for an event) and then taps; once
    # that dispatch returned, a barrier in another thread waits until the tap ran.
    r = subprocess.run([sys.executable, SNAPSHOT, "2", "--blocked-call"], capture_output=True,
                       text=True, timeout=240, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res == {"returned_before_release": False, "seen_at_barrier": [[[0.0, 1.0, 2.0, 3.0]]]}


@pytest.mark.soak
@pytest.mark.timeout(3600)
@pytest.mark.skipif(os.environ.get("HOSTFEED_SOAK") != "1",
                    reason="soak test: set HOSTFEED_SOAK=1 to run")
def test_soak_barriers_from_other_threads_wait_for_every_tap_dispatched_before_them():
    seconds = float(os.environ.get("HOSTFEED_SOAK_SECONDS", "300"))
    res = run_snapshot(seconds, "--sharded-threads", "2")
    print("\nsoak:", json.dumps(res))
    assert res["early"] == 0, res
    assert res["seen"] == res["sent"] > 0 and not res["out_of_order"], res


@pytest.mark.soak
@pytest.mark.timeout(1800)
@pytest.mark.skipif(os.environ.get("HOSTFEED_SOAK") != "1",
                    reason="soak test: set HOSTFEED_SOAK=1 to run")
def test_soak_joined_and_single_device_taps_calls_and_records(tmp_path):
    seconds = float(os.environ.get("HOSTFEED_SOAK_SECONDS", "300"))
    res = run_helper(4, True, "--seconds", str(seconds), "--single-threads", "3",
                     "--record", str(tmp_path / "soak.zarr"), timeout=seconds + 600)
    print("\nsoak:", json.dumps(res))
    check(res)
    assert res["recorded_sharded"] == res["sharded_sent"] and res["recorded_sharded_steps_ok"]
    assert res["recorded_single"] == res["single_sent"]
