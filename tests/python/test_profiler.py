"""Taps on jax.profiler's timeline: while a trace is collected, each host callback runs
inside a trace event named after it, on the consumer thread."""
from __future__ import annotations

import gzip
import json

import jax
import jax.numpy as jnp

from hostfeed import host_callback as hcb


def _trace_events(log_dir) -> list[dict]:
    (path,) = log_dir.rglob("perfetto_trace.json.gz")
    with gzip.open(path) as f:
        data = json.loads(f.read())
    return data["traceEvents"] if isinstance(data, dict) else data


def profiled_tap(arg, transforms):
    del arg, transforms


def profiled_call(arg):
    return arg * 2


def test_taps_and_calls_are_events_named_after_their_callbacks_on_the_consumer_thread(
        tmp_path):
    f = jax.jit(lambda x: hcb.call(profiled_call, hcb.id_tap(profiled_tap, x),
                                   result_shape=x))
    f(jnp.float32(1)).block_until_ready()  # compiled before tracing
    hcb.barrier_wait()
    jax.profiler.start_trace(str(tmp_path), create_perfetto_trace=True)
    try:
        for i in range(3):
            f(jnp.float32(i)).block_until_ready()
        hcb.barrier_wait()
    finally:
        jax.profiler.stop_trace()
    events = _trace_events(tmp_path)
    taps = [e for e in events if e.get("name") == "hostfeed tap: profiled_tap"]
    calls = [e for e in events if e.get("name") == "hostfeed call: profiled_call"]
    assert len(taps) == 3 and len(calls) == 3
    assert all(e["ph"] == "X" and e["dur"] >= 0 for e in taps + calls)
    # In program order, each tap before its call.
    starts = sorted([(e["ts"], e["name"]) for e in taps + calls])
    assert [n for _, n in starts] == ["hostfeed tap: profiled_tap",
                                      "hostfeed call: profiled_call"] * 3
    threads = {e["tid"]: e["args"]["name"] for e in events
               if e.get("ph") == "M" and e.get("name") == "thread_name"}
    assert {threads.get(e["tid"], "")[:15] for e in taps + calls} == {"hostfeed-consum"}


def test_no_events_when_not_tracing(tmp_path):
    got = []
    f = jax.jit(lambda x: hcb.id_tap(lambda a, tr: got.append(float(a)), x))
    f(jnp.float32(1))
    hcb.barrier_wait()
    jax.profiler.start_trace(str(tmp_path), create_perfetto_trace=True)
    jax.profiler.stop_trace()
    f(jnp.float32(2))  # after the trace: runs, and is in no trace
    hcb.barrier_wait()
    assert got == [1.0, 2.0]
    assert not [e for e in _trace_events(tmp_path) if "hostfeed tap" in str(e.get("name"))]
