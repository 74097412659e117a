"""Taps on jax.profiler's timeline: while a trace is collected, each host callback runs
inside a trace event named after it, on the consumer thread, and each chunk write of a
recorder inside an event named after its record, on the writer thread."""
from __future__ import annotations

import gzip
import json

import jax
import jax.numpy as jnp

import hostfeed
from hostfeed import _receiver
from hostfeed import host_callback as hcb

from conftest import wait_until


def _trace_events(log_dir) -> list[dict]:
    (path,) = log_dir.rglob("perfetto_trace.json.gz")
    with gzip.open(path) as f:
        data = json.loads(f.read())
    return data["traceEvents"] if isinstance(data, dict) else data


def _thread_names(events: list[dict]) -> dict[int, str]:
    return {e["tid"]: e["args"]["name"] for e in events
            if e.get("ph") == "M" and e.get("name") == "thread_name"}


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
    threads = _thread_names(events)
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


WRITE = "hostfeed record write: profiled/h"


def test_recorder_writes_are_events_named_after_the_record_on_the_writer_threads(tmp_path):
    rec = hostfeed.Recorder(tmp_path / "run.zarr")
    f = jax.jit(lambda x: rec.record("profiled/h", x * 2))
    f(jnp.zeros(4, jnp.float32)).block_until_ready()  # compiled before tracing
    rec.flush()  # row 0 written before the trace: not in it
    jax.profiler.start_trace(str(tmp_path / "log"), create_perfetto_trace=True)
    try:
        for i in range(3):
            f(jnp.full(4, i, jnp.float32)).block_until_ready()
        rec.flush()  # the three rows: one write of (partial) chunk 0
        rec.close()
    finally:
        jax.profiler.stop_trace()
    events = _trace_events(tmp_path / "log")
    writes = [e for e in events if e.get("name") == WRITE]
    assert len(writes) == 1
    (w,) = writes
    assert w["ph"] == "X" and w["dur"] >= 0
    assert w["args"] == {"chunk": "0", "bytes": str(3 * 4 * 4)}
    # On a writer thread's row (not the consumer's, nor the thread that flushed).
    assert _thread_names(events).get(w["tid"], "")[:15] == "hostfeed-writer"


def test_writes_between_flushes_are_traced_once_the_trace_is_seen(tmp_path):
    """A trace that starts while rows stream (a profiler server's capture, no flush):
    the poller notices it, and the writes of full chunks are events from then on."""
    rec = hostfeed.Recorder(tmp_path / "run.zarr", chunk_bytes=16)  # one row per chunk
    f = jax.jit(lambda x: rec.record("profiled/h", x))
    f(jnp.zeros(4, jnp.float32)).block_until_ready()
    rec.flush()
    assert not _receiver.record.write_tracing()
    jax.profiler.start_trace(str(tmp_path / "log"), create_perfetto_trace=True)
    try:
        wait_until(_receiver.record.write_tracing, timeout=10)
        for i in range(1, 4):
            f(jnp.full(4, i, jnp.float32)).block_until_ready()
        wait_until(lambda: rec.stats()["chunks_written"] == 4)
    finally:
        jax.profiler.stop_trace()
    wait_until(lambda: not _receiver.record.write_tracing(), timeout=10)
    rec.close()
    events = _trace_events(tmp_path / "log")
    # Two writers: chunks may be written in any order.
    writes = sorted((e["args"]["chunk"], e["args"]["bytes"]) for e in events
                    if e.get("name") == WRITE)
    assert writes == [("1", "16"), ("2", "16"), ("3", "16")]
    threads = _thread_names(events)
    assert {threads.get(e["tid"], "")[:15] for e in events if e.get("name") == WRITE} == {
        "hostfeed-writer"}
