"""JAX's persistent compilation cache (``jax_compilation_cache_dir``): a second process
that gets hostfeed's computations from the cache compiles nothing for them, and every tap
and call reaches the function it was written with, whatever order the processes lower
(and so register) their callbacks in."""
from __future__ import annotations

import json

import pytest

from conftest import run_python

# JAX never puts computations with Python host callbacks (the portable transport's, like
# io_callback's) into its persistent cache: the callbacks are Python objects.
pytestmark = pytest.mark.native_transport(
    "JAX's persistent compilation cache skips computations with Python host callbacks")

# Run in two fresh processes sharing one cache directory. ORDER says which jitted functions
# run, in which order; the output is one JSON object: per function its result and the
# cache hits and misses JAX reported while running it, and what the host functions saw.
PROGRAM = """
import json, os
import jax
import numpy as np

jax.config.update("jax_compilation_cache_dir", os.environ["CACHE_DIR"])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)

from hostfeed import host_callback as hcb

events = []
jax.monitoring.register_event_listener(lambda name, **kwargs: events.append(name))
got = []

def log_a(x, transforms):
    got.append(["log_a", x.tolist()])

def log_b(x, transforms):
    got.append(["log_b", x.tolist()])

def unrelated(x, transforms):
    got.append(["unrelated", x.tolist()])

def host_triple(x):
    got.append(["host_triple", x.tolist()])
    return x * 3

def make_logger(tag):  # closures of one factory: hostfeed cannot tell them apart by name
    def log(x, transforms):
        got.append([tag, x.tolist()])
    return log

functions = {
    "tap_a": jax.jit(lambda x: hcb.id_tap(log_a, x) + 1),
    "tap_b_then_call": jax.jit(
        lambda x: hcb.call(host_triple, hcb.id_tap(log_b, x * 2), result_shape=x) + 3),
    "closure_x": jax.jit(lambda x: hcb.id_tap(make_logger("closure_x"), x) * 5),
    "closure_y": jax.jit(lambda x: hcb.id_tap(make_logger("closure_y"), x) * 5),
    "unrelated": jax.jit(lambda x: hcb.id_tap(unrelated, x) - 1),
}
inputs = {"tap_a": [1.0, 2.0], "tap_b_then_call": [3.0, 4.0], "closure_x": [5.0, 6.0],
          "closure_y": [7.0, 8.0], "unrelated": [9.0, 10.0]}
report = {}
for name in os.environ["ORDER"].split(","):
    start = len(events)
    out = functions[name](np.asarray(inputs[name], np.float32))
    np.asarray(out)
    seen = events[start:]  # the computation's own compile (barrier_wait compiles a marker)
    hcb.barrier_wait()
    report[name] = {"result": np.asarray(out).tolist(),
                    "hits": seen.count("/jax/compilation_cache/cache_hits"),
                    "misses": seen.count("/jax/compilation_cache/cache_misses")}
print(json.dumps({"functions": report, "got": got}))
"""

EXPECTED_RESULTS = {"tap_a": [2.0, 3.0], "tap_b_then_call": [21.0, 27.0],
                    "closure_x": [25.0, 30.0], "closure_y": [35.0, 40.0],
                    "unrelated": [8.0, 9.0]}
EXPECTED_HOST = {"tap_a": [["log_a", [1.0, 2.0]]],
                 "tap_b_then_call": [["log_b", [6.0, 8.0]], ["host_triple", [6.0, 8.0]]],
                 "closure_x": [["closure_x", [5.0, 6.0]]],
                 "closure_y": [["closure_y", [7.0, 8.0]]],
                 "unrelated": [["unrelated", [9.0, 10.0]]]}


def _run(cache_dir, order: list[str]) -> dict:
    r = run_python(PROGRAM, env={"CACHE_DIR": str(cache_dir), "ORDER": ",".join(order)})
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_second_process_hits_the_cache_and_calls_its_own_functions(tmp_path):
    first_order = ["tap_a", "tap_b_then_call", "closure_x", "closure_y"]
    first = _run(tmp_path, first_order)
    for name in first_order:
        assert first["functions"][name] == {
            "result": EXPECTED_RESULTS[name], "hits": 0, "misses": 1}, name
    assert first["got"] == [e for name in first_order for e in EXPECTED_HOST[name]]

    # Another process lowers its callbacks in another order, after an unrelated one, and
    # the two closures the other way round (so closure_y gets the id closure_x had in the
    # first process, and runs the executable compiled for closure_x: the same program).
    second_order = ["unrelated", "closure_y", "tap_b_then_call", "closure_x", "tap_a"]
    second = _run(tmp_path, second_order)
    assert second["functions"]["unrelated"] == {
        "result": EXPECTED_RESULTS["unrelated"], "hits": 0, "misses": 1}
    for name in second_order[1:]:
        assert second["functions"][name] == {
            "result": EXPECTED_RESULTS[name], "hits": 1, "misses": 0}, name
    assert second["got"] == [e for name in second_order for e in EXPECTED_HOST[name]]
