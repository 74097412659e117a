"""Many processes (`jax.distributed` on loopback, gloo CPU collectives): 2 and 4 processes
of 2 CPU devices each, under both partitioners. Each process runs the scenarios of
helpers/multiprocess_cases.py; the tests check, in every process, the values, device ids,
counts and order its callbacks saw: taps of sharded values all arrive, per-device taps
run in every process, and calls under jit over a multi-process mesh return (and honour
SIGTERM)."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import pytest

from conftest import skip_gspmd_where_gone

pytestmark = pytest.mark.several_devices

HELPER = os.path.join(os.path.dirname(__file__), "helpers", "multiprocess_cases.py")
LAUNCH_TIMEOUT = 180.0  # seconds for a whole group of processes (2 cores, shared)
CONFIGS = [(2, 2, True), (2, 2, False), (4, 2, True)]
_cache: dict = {}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Group:
    """Processes 0..n-1 of one `jax.distributed` program, each in its own process group
    (so a failure kills everything they started), with output in files."""

    def __init__(self, n_proc: int, local: int, shardy: bool, cases: tuple = (),
                 env: dict | None = None):
        self.dir = tempfile.TemporaryDirectory(prefix="hostfeed-mp-")
        port = _free_port()
        full_env = dict(os.environ, JAX_PLATFORMS="cpu", **(env or {}))
        self.procs = []
        self.outs = []
        for i in range(n_proc):
            out = os.path.join(self.dir.name, f"{i}.out")
            err = os.path.join(self.dir.name, f"{i}.err")
            self.outs.append((out, err))
            with open(out, "w") as o, open(err, "w") as e:
                self.procs.append(subprocess.Popen(
                    [sys.executable, HELPER, str(i), str(n_proc), str(port), str(local),
                     "1" if shardy else "0", *cases],
                    stdout=o, stderr=e, stdin=subprocess.DEVNULL, env=full_env,
                    start_new_session=True))

    def wait(self, timeout: float = LAUNCH_TIMEOUT) -> list[tuple[int | None, str, str]]:
        deadline = time.monotonic() + timeout
        for p in self.procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                break
        return self.results()

    def results(self) -> list[tuple[int | None, str, str]]:
        res = []
        for p, (out, err) in zip(self.procs, self.outs):
            with open(out) as o, open(err) as e:
                res.append((p.poll(), o.read(), e.read()))
        return res

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        self.dir.cleanup()


def _report(results) -> str:
    return "\n".join(f"--- process {i} rc={rc}\n{out[-2000:]}\n{err[-4000:]}"
                     for i, (rc, out, err) in enumerate(results))


def run_group(n_proc: int, local: int, shardy: bool) -> list[dict]:
    """Runs every scenario in n_proc processes; returns each process's results."""
    group = Group(n_proc, local, shardy)
    try:
        results = group.wait()
    finally:
        group.kill()
    assert all(rc == 0 for rc, _, _ in results), _report(results)
    per_process = []
    for _, out, _ in results:
        lines = out.splitlines()
        found = [json.loads(line[len("RESULT "):]) for line in lines
                 if line.startswith("RESULT ")]
        assert found, _report(results)
        exit_taps: dict = {}
        for line in lines:
            if line.startswith("EXIT "):
                _, dev, i = line.split()
                exit_taps.setdefault(int(dev), []).append(int(i))
        per_process.append(dict(found[0], exit_taps=exit_taps))
    return per_process


class Procs:
    """Accessors over the results of every process of one group."""

    def __init__(self, n_proc: int, results: list[dict]):
        self.n_proc = n_proc
        self.results = results
        info = results[0]["info"]
        self.position = {int(k): v for k, v in info["position"].items()}  # device id -> k
        self.process_of = {int(k): v for k, v in info["process_of"].items()}
        self.devices = sorted(self.position, key=self.position.__getitem__)  # mesh order
        self.n = len(self.devices)

    def get(self, p: int, name: str):
        res = self.results[p][name]
        assert "error" not in res, res["error"]
        return res

    def local(self, p: int) -> list[int]:
        return self.results[p]["info"]["local"]

    def owner(self, k: int) -> int:
        """The process that owns the device at mesh position k."""
        return self.process_of[self.devices[k]]


@pytest.fixture(params=CONFIGS,
                ids=lambda c: f"{c[0]}proc-{c[1]}dev-{'shardy' if c[2] else 'gspmd'}")
def procs(request):
    skip_gspmd_where_gone(request.param[2])
    if request.param not in _cache:
        _cache[request.param] = run_group(*request.param)
    return Procs(request.param[0], _cache[request.param])


def test_devices_are_numbered_globally(procs):
    for p in range(procs.n_proc):
        assert all(procs.process_of[d] == p for d in procs.local(p))
    assert procs.n == 2 * procs.n_proc


def test_pmap_taps_and_calls_run_in_the_process_of_each_device(procs):
    for p in range(procs.n_proc):
        r = procs.get(p, "pmap_tap_and_call")
        expected = []
        for d in procs.local(p):
            k = procs.position[d]
            expected += [["pmap", 2.0 * k, d, []], ["pcall", 2.0 * k, d]]
        assert sorted(r["taps"], key=str) == sorted(expected, key=str)
        for d in procs.local(p):  # each device: its tap, then its call
            mine = [t[0] for t in r["taps"] if t[2] == d]
            assert mine == ["pmap", "pcall"]
        assert r["out"] == sorted([[d, [2.0 * procs.position[d] + 100]]
                                   for d in procs.local(p)])


def test_shard_map_taps_and_calls_per_device_with_global_devices(procs):
    for p in range(procs.n_proc):
        r = procs.get(p, "shard_map_taps_and_calls")
        for d in procs.local(p):
            k = procs.position[d]
            shard = [2.0 * k, 2.0 * k + 1]
            assert [t for t in r["taps"] if t[2] == d] == [["sm", shard, d, []],
                                                          ["smcall", shard, d]]
        assert {t[2] for t in r["taps"]} == set(procs.local(p))
        assert r["out"] == sorted([[d, [2.0 * procs.position[d] + 1,
                                        2.0 * procs.position[d] + 2]]
                                   for d in procs.local(p)])


def test_sharded_jit_taps_run_once_with_the_whole_value_in_the_owner_process(procs):
    n = procs.n
    a = [float(i) for i in range(2 * n)]
    b = list(range(3 * n))
    for p in range(procs.n_proc):
        r = procs.get(p, "jit_taps_whole_value_once")
        first, last = procs.devices[0], procs.devices[-1]
        expected = [["tree", {"a": [v + i for v in a], "b": b}, first, []] for i in range(3)]
        assert r["tree"]["taps"] == (expected if procs.owner(0) == p else [])
        assert r["tree"]["out"] == 3
        assert r["last"]["taps"] == ([["last", [2 * v for v in a], last, []]]
                                     if procs.owner(n - 1) == p else [])
        assert r["mixed"]["taps"] == ([["mixed", [a, sum(a)], first, []]]
                                      if procs.owner(0) == p else [])
        # Slices move only to the owner process (no all-gather).
        assert r["collectives"] == ["collective-permute"]
        # A mesh in reverse device order: its position 0 is the last process's device.
        reversed_first = procs.devices[-1]
        assert r["reversed"]["taps"] == (
            [["reversed", a, reversed_first, []]]
            if procs.process_of[reversed_first] == p else [])


def test_sharded_jit_calls_run_once_and_return_each_process_its_part(procs):
    n = procs.n
    whole = [float(i) for i in range(2 * n)]
    for p in range(procs.n_proc):
        r = procs.get(p, "jit_calls_return_each_process_its_part")
        pos = procs.position
        assert r["split"]["taps"] == ([["gcall", whole, procs.devices[0]]]
                                      if procs.owner(0) == p else [])
        assert r["split"]["out"] == sorted(
            [[d, [2 * (2 * pos[d] + 1000.0), 2 * (2 * pos[d] + 1 + 1000.0)]]
             for d in procs.local(p)])
        assert r["last"]["taps"] == ([["last", whole, procs.devices[-1]]]
                                     if procs.owner(n - 1) == p else [])
        assert r["last"]["out"] == sorted([[d, [2 * pos[d] + 0.5, 2 * pos[d] + 1.5]]
                                           for d in procs.local(p)])
        assert r["gathered"]["out"] == sum(whole)


def test_id_print_prints_in_the_process_that_owns_the_device(procs):
    for p in range(procs.n_proc):
        r = procs.get(p, "id_print_in_the_owning_process")
        blocks = {f"device: cpu:{d} where: sm\n[{procs.position[d]}.]\n"
                  for d in procs.local(p)}
        text = r["per_device"]
        assert sorted(text.count(b) for b in blocks) == [1] * len(blocks)
        assert len(text) == sum(len(b) for b in blocks)
        whole = np.arange(procs.n, dtype=np.float32)
        assert r["whole"] == (f"what: whole\n{whole}\n" if procs.owner(0) == p else "")


def test_failing_calls_fail_every_process_with_the_same_message(procs):
    for name, ran_everywhere in (("global", False), ("global_gathered", False),
                                 ("shard_map", True), ("pmap", True)):
        messages = set()
        for p in range(procs.n_proc):
            r = procs.get(p, "failing_calls_fail_every_process")[name]
            kind, message = r["raised"]
            assert kind == "JaxRuntimeError", (name, p, r)
            assert "bad of hcb.call raised ValueError: host side failed" in message
            messages.add(message)
            ran_here = ran_everywhere or procs.owner(0) == p
            # barrier_wait raises the callback's exception where it ran, else the failed
            # computation's error (as jax.effects_barrier would).
            assert r["barrier"] == ["CallbackException" if ran_here else "JaxRuntimeError",
                                    True], (name, p)
            assert r["after"] == sorted([[d, [2.0 * procs.position[d] + 1,
                                              2.0 * procs.position[d] + 2]]
                                         for d in procs.local(p)])
        assert len(messages) == 1, (name, messages)


def test_taps_keep_count_and_order_per_device(procs):
    for p in range(procs.n_proc):
        r = procs.get(p, "counts_and_order_per_device")
        assert r == {str(d): True for d in procs.local(p)}


def test_taps_pending_at_exit_all_run(procs):
    for p in range(procs.n_proc):
        assert procs.get(p, "exit_taps") == {d: list(range(100)) for d in procs.local(p)}


def test_sigterm_ends_processes_whose_call_waits_forever():
    """jax.distributed's preemption service catches SIGTERM (it only records a notice);
    a call waiting on a host function that never returns must still let SIGTERM end the
    processes, also where another device of the execution reaches its call only after
    the signal (its peers wait for it in the collective that combines the calls'
    statuses). The host function blocks in a wait, which only the receiver thread can be
    left in (HOSTFEED_CALL_THREAD=receiver; see docs/behaviour.md)."""
    go_dir = tempfile.TemporaryDirectory(prefix="hostfeed-go-")
    go = os.path.join(go_dir.name, "go")
    group = Group(2, 2, True, cases=("hang",),
                  env={"HOSTFEED_STOP_TIMEOUT": "1", "HANG_GO_FILE": go,
                       "HOSTFEED_CALL_THREAD": "receiver"})
    try:
        deadline = time.monotonic() + LAUNCH_TIMEOUT
        waiting = threading.Event()
        while not all("HANGING" in out for _, out, _ in group.results()):
            assert time.monotonic() < deadline, _report(group.results())
            assert all(rc is None for rc, _, _ in group.results()), _report(group.results())
            waiting.wait(0.05)
        for p in group.procs:
            p.send_signal(signal.SIGTERM)
        open(go, "w").close()  # now the late devices make their calls
        results = group.wait(60)
    finally:
        group.kill()
        go_dir.cleanup()
    assert all(rc is not None for rc, _, _ in results), _report(results)
    assert all("interrupted (SIGTERM)" in err for _, _, err in results), _report(results)
