"""Run issue 65's thread scenarios (points 2 and 3) run after run, each in a fresh process
bounded by a timeout, and count the runs that pass, fail and hang; for a hang, the Python
stack of every thread (faulthandler) and, where gdb can attach, the native ones.

    nice -n 15 python benches/soak_threads.py [--minutes M] [--runs N] [--seconds S]
                 [--scenario NAME ...] [--hang-after H] [--logs DIR]

Scenarios (each picked in turn, round robin):

- ``portable``: tests/python/helpers/joined_concurrency.py on 4 CPU devices with
  ``HOSTFEED_TRANSPORT=jax``: two threads dispatching sharded taps, three tapping and
  calling on single devices, one looping on ``barrier_wait()``, one on
  ``stop_outfeed_receiver()`` (issue 65.2's mix, as test_joined_concurrency's soak);
- ``native``: the same mix on the native transport;
- ``snapshot``: tests/python/helpers/barrier_snapshot.py on 4 devices with two sharded
  threads (issue 65.3: a barrier from another thread must not return before a tap
  dispatched before it ran);
- ``snapshot-portable``: the same with ``HOSTFEED_TRANSPORT=jax``;
- ``native-sync``, ``portable-sync``: the ``native`` and ``portable`` mixes with the
  default tap mode (synchronous taps on CPU); the others run asynchronous taps
  (``HOSTFEED_SYNC_TAPS=0``), as issue 65's did.

A run passes when its helper exits 0 and its figures hold (every tap seen once, in order,
no barrier early); it hangs when it has not ended ``--hang-after`` seconds (default 90)
after it started: gdb's ``thread apply all bt`` and ``py-bt`` are tried, then its
threads' Python stacks are dumped (faulthandler, on SIGUSR1), and it is killed. The logs
of every run that did not pass go to ``--logs`` (default soak-logs/ under the current
folder). Prints a line per run (with the reason and log of one that did not pass) and, at
the end, one JSON line of counts per scenario (with the runs in which the dispatcher ran a
callback out of its device's order, and those in which it let a device go on before its
synchronous global-view tap ran, which it warns about). Not run by CI (the short forms of
these scenarios are tests in tests/python/test_joined_concurrency.py; the hangs it found,
issue 65.2's, are test_shard_assembly's test_calls_held_behind_crossed_executions_* and
test_a_call_held_in_a_circle_through_the_runtime_*).

On this project's shared 2-core machine: ``nice -n 15``, one soak at a time, e.g.
``nice -n 15 python benches/soak_threads.py --minutes 40 --scenario portable --scenario
portable --scenario native --scenario snapshot`` (portable twice as often).
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
HELPERS = ROOT / "tests" / "python" / "helpers"
MIX = ["--sharded-threads", "2", "--sharded-taps-only", "--single-threads", "3",
       "--barrier-threads", "1", "--stop-threads", "1"]
ASYNC = {"HOSTFEED_SYNC_TAPS": "0"}
SCENARIOS = {
    "portable": ("joined_concurrency.py", {"HOSTFEED_TRANSPORT": "jax", **ASYNC}, MIX),
    "native": ("joined_concurrency.py", ASYNC, MIX),
    "snapshot": ("barrier_snapshot.py", ASYNC, ["--sharded-threads", "2"]),
    "snapshot-portable": ("barrier_snapshot.py", {"HOSTFEED_TRANSPORT": "jax", **ASYNC},
                          ["--sharded-threads", "2"]),
    # The default tap mode (synchronous on CPU): joined taps and single-device taps that
    # the devices wait for, with the same calls, barriers and stops.
    "native-sync": ("joined_concurrency.py", {"HOSTFEED_SYNC_TAPS": ""}, MIX),
    "portable-sync": ("joined_concurrency.py",
                      {"HOSTFEED_TRANSPORT": "jax", "HOSTFEED_SYNC_TAPS": ""}, MIX),
}
#: Runs the helper with faulthandler set to dump every thread's stack on SIGUSR1 (sent on
#: a hang only: a dump while threads run can crash the process).
WRAPPER = ("import faulthandler, runpy, signal, sys; "
           "faulthandler.register(signal.SIGUSR1, all_threads=True); "
           "path = sys.argv[1]; sys.argv = sys.argv[1:]; "
           "runpy.run_path(path, run_name='__main__')")


def judge(helper: str, stdout: str, stderr: str) -> str:
    """'' when the run's figures hold, else what is wrong."""
    try:
        res = json.loads(stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return "no result line"
    if helper == "barrier_snapshot.py":
        if res["early"] or res["seen"] != res["sent"] or res["out_of_order"]:
            return f"early/lost/out of order: {json.dumps(res)[:600]}"
        return ""
    bad = []
    if not res["sharded_seen"] == res["sharded_unique"] == res["sharded_sent"] > 0:
        bad.append("sharded counts")
    if not res["sharded_in_order"] or res["sharded_bad_values"]:
        bad.append("sharded order/values")
    if not res["single_seen"] == res["single_sent"] > 0 or not res["single_in_order"]:
        bad.append("single counts/order")
    if res["single_bad"] or res["calls_bad"]:
        bad.append("single/calls bad")
    for needle in ("dropped an incomplete", "no barrier_wait() raised", "LookupError"):
        if needle in stderr:
            bad.append(needle)
    return f"{', '.join(bad)}: {json.dumps(res)[:600]}" if bad else ""


#: Run in a hung helper through gdb (PyRun_SimpleString): writes the dispatcher's state
#: (held devices, what each holds back, the joiners' incomplete sets) as JSON to {path}.
STATE = """
import json
try:
    from hostfeed._src.dispatcher import dispatcher as d
    from hostfeed._src.consumers import registry
    def desc(m):
        c = registry.consumers.get(m.consumer_id)
        return [m.consumer_id, m.device, m.run_id, str(getattr(c, 'kind', None)),
                getattr(c, 'name', None), None if m.reply is None else bool(m.reply.pending)]
    state = {{
        'held': {{str(o): {{'run': h.run, 'set': getattr(h.joiner, 'name', None),
                          'senders': sorted(h.joiner.senders(h.run, o)),
                          'waiting': [desc(m) for m, _ in h.waiting]}}
                 for o, h in d.held.items()}},
        'orphans': d.held.orphaned(),
        'incomplete': {{c.name: {{str(r): [sorted(p.ordinal for p in parts.values())
                                          for parts in sets.values()]
                                 for r, sets in c.invoke._runs.items()}}
                       for c in list(registry.consumers.values())
                       if str(c.kind).endswith('JOINED')}}}}
except Exception as e:
    state = {{'error': repr(e)}}
open({path!r}, 'w').write(json.dumps(state, default=str))
"""


def gdb_state(pid: int, path: pathlib.Path) -> str:
    """The dispatcher's state in the hung process ``pid`` (:data:`STATE`), or why not."""
    snippet = path.with_suffix(".py")
    snippet.write_text(STATE.format(path=str(path)))
    run = f"exec(open({str(snippet)!r}).read())".replace('"', '\\"')
    try:
        r = subprocess.run(["gdb", "-p", str(pid), "-batch", "-nx",
                        "-ex", "call (int)PyGILState_Ensure()",
                        "-ex", f'call (int)PyRun_SimpleString("{run}")',
                        "-ex", "call (void)PyGILState_Release($1)"],
                       capture_output=True, text=True, timeout=60)
    except (subprocess.TimeoutExpired, OSError) as e:
        return f"(no state: {e})"
    if path.exists():
        return path.read_text()
    return "(no state written)\n" + "\n".join(r.stdout.splitlines()[-5:]
                                               + r.stderr.splitlines()[-5:])


def gdb_stacks(pid: int) -> str:
    if shutil.which("gdb") is None:
        return "(no gdb)"
    try:
        # python-gdb.py, where the interpreter has one, adds py-bt (Python frames).
        r = subprocess.run(["gdb", "-p", str(pid), "-batch", "-nx",
                            "-iex", "set auto-load safe-path /",
                            "-ex", "thread apply all bt 30", "-ex", "thread apply all py-bt"],
                           capture_output=True, text=True, timeout=120)
        return r.stdout + r.stderr
    except subprocess.TimeoutExpired:
        return "(gdb timed out)"


def one_run(name: str, seconds: float, hang_after: float,
            state_path: pathlib.Path) -> tuple[str, str, str]:
    """('pass' | 'fail' | 'hang', reason, log) for one run of scenario ``name``."""
    helper, extra_env, args = SCENARIOS[name]
    env = dict(os.environ, JAX_PLATFORMS="cpu", HOSTFEED_FAST_DISPATCH="1", **extra_env)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT / "python")] + [p for p in [env.get("PYTHONPATH")] if p])
    cmd = [sys.executable, "-c", WRAPPER, str(HELPERS / helper), "4",
           "--seconds", str(seconds), *args]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=env, start_new_session=True)
    try:
        out, err = p.communicate(timeout=hang_after)
    except subprocess.TimeoutExpired:
        native = gdb_stacks(p.pid)
        if shutil.which("gdb") is not None:
            native += "\n--- dispatcher state ---\n" + gdb_state(p.pid, state_path)
        os.kill(p.pid, signal.SIGUSR1)
        try:
            out, err = p.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, err = p.communicate()
        return "hang", f"no end after {hang_after} s", f"{err}\n--- gdb ---\n{native}\n{out}"
    if p.returncode != 0:
        return "fail", f"exit {p.returncode}: {err.strip().splitlines()[-1:]}", err + out
    reason = judge(helper, out, err)
    return ("fail" if reason else "pass"), reason, err + out  # (err: the warnings too)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--runs", type=int, default=0, help="stop after N runs (0: none)")
    parser.add_argument("--seconds", type=float, default=2.5, help="each run's dispatching")
    parser.add_argument("--scenario", action="append", choices=sorted(SCENARIOS))
    parser.add_argument("--hang-after", type=float, default=90.0)
    parser.add_argument("--logs", default="soak-logs")
    a = parser.parse_args()
    names = a.scenario or ["portable", "native", "snapshot"]
    logs = pathlib.Path(a.logs)
    logs.mkdir(parents=True, exist_ok=True)
    counts = {n: {"runs": 0, "pass": 0, "fail": 0, "hang": 0, "out_of_order": 0,
                  "went_on_early": 0} for n in names}
    end = time.monotonic() + 60 * a.minutes
    i = 0
    while time.monotonic() < end and (not a.runs or i < a.runs):
        name = names[i % len(names)]
        t0 = time.monotonic()
        verdict, reason, log = one_run(name, a.seconds, a.hang_after,
                                       logs / f"{i:04d}-{name}-state.json")
        counts[name]["runs"] += 1
        counts[name][verdict] += 1
        # Runs where the dispatcher ran something out of its device's order (a warning),
        # or let a device go on before its synchronous global-view tap ran (another).
        counts[name]["out_of_order"] += "out of its order" in log
        counts[name]["went_on_early"] += "goes on before its synchronous" in log
        line = (f"{time.strftime('%H:%M:%S')} run {i} {name}: {verdict} after "
                f"{time.monotonic() - t0:.1f} s")
        if verdict != "pass":
            path = logs / f"{i:04d}-{name}-{verdict}.log"
            path.write_text(log)
            line += f": {reason} (log: {path})"
        print(line, flush=True)
        i += 1
    print(json.dumps(counts), flush=True)


if __name__ == "__main__":
    main()
