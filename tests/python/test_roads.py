"""The two roads ARCHITECTURE.md draws, held to the code: a plain tap's message reaches its
function from the receiver with no Python frame of hostfeed's but the invoker (no
dispatcher between), and its lowering never asks about records; a record goes
``Recorder.record`` -> selection -> the plain record, never back into the recorder's
modules, and its lowering reaches the recorder only through its spec."""
from __future__ import annotations

import os
import sys

import jax
import jax.numpy as jnp
import pytest

import hostfeed
from hostfeed import host_callback as hcb

PACKAGE = os.path.dirname(hostfeed.__file__) + os.sep


def _own(filename: str) -> str | None:
    """``filename`` relative to the package, None if it is not hostfeed's."""
    return filename[len(PACKAGE):] if filename.startswith(PACKAGE) else None


def _profiled(fn, *args):
    """Runs ``fn(*args)`` with a profile of this thread; returns the hostfeed files whose
    functions were called, in call order (repeats included)."""
    calls: list[str] = []

    def profile(frame, event, arg):
        if event == "call":
            own = _own(frame.f_code.co_filename)
            if own is not None:
                calls.append(own)

    sys.setprofile(profile)
    try:
        fn(*args)
    finally:
        sys.setprofile(None)
    return calls


def test_a_plain_taps_function_runs_from_the_receiver_with_no_dispatcher_frame():
    stacks = []

    def tap(x, transforms):
        frames, f = [], sys._getframe(1)
        while f is not None:
            own = _own(f.f_code.co_filename)
            if own is not None:
                frames.append(own)
            f = f.f_back
        stacks.append(frames)

    f = jax.jit(lambda x: hcb.id_tap(tap, hcb.id_tap(tap, x * 2, sync=False), sync=False))
    calls = _profiled(f, jnp.ones(3))
    hcb.barrier_wait()
    # The receiver's thread enters Python once per tap, in its invoker: nothing between.
    assert stacks == [["_src/consumers.py"], ["_src/consumers.py"]]
    # Lowering a plain tap never goes to the recorder's side.
    assert "_src/lowering.py" in calls
    assert not [c for c in calls if c.startswith("_src/record/")], sorted(set(calls))


def test_a_record_goes_down_from_the_recorder_and_never_back(tmp_path):
    with hostfeed.Recorder(tmp_path / "r.zarr") as rec:
        f = jax.jit(lambda x, s: rec.record("h", x * 2, step=s, every=1))
        calls = _profiled(f, jnp.ones(3), 1)
        hcb.barrier_wait()
        assert rec.stats()["rows"] == 1
    road = list(dict.fromkeys(calls))
    # The public method, then selection, then the plain record that binds.
    assert road.index("_src/record/recording.py") < road.index("_src/record/selection.py") \
        < road.index("_src/record/plain.py") < road.index("_src/record/lowering.py")
    after = calls[calls.index("_src/record/selection.py"):]
    assert not {"_src/record/recorder.py", "_src/record/recording.py"} & set(after)
    # Lowering reads the spec's catalogue; the host function (the target) is never called.
    lowering = calls[calls.index("_src/lowering.py"):]
    assert "_src/record/catalogue.py" in lowering and "_src/record/target.py" not in lowering


#: The Python files a plain tap's trace, lowering and dispatch pass through (a receiver
#: already running), as ARCHITECTURE.md draws them: a file added to the road must be drawn
#: there too.
PLAIN_TAP_ROAD = {
    "host_callback.py", "_src/settings.py", "_src/dtypes.py", "_src/primitives.py",
    "_src/compat/__init__.py", "_src/fast_dispatch.py", "_src/lowering.py",
    "_src/transports/__init__.py", "_src/transports/native.py", "_src/placement.py",
    "_src/consumers.py", "_src/lifecycle.py"}


@pytest.mark.native_transport("the road drawn is the native transport's")
def test_a_plain_taps_python_road_is_the_drawn_one():
    # The receiver runs already: its start (the dispatcher's delivery) is not the road.
    jax.jit(lambda x: hcb.id_tap(lambda a, t: None, x, sync=False))(jnp.ones(2))
    hcb.barrier_wait()
    f = jax.jit(lambda x: hcb.id_tap(lambda a, t: None, x * 3, sync=False))
    road = set(_profiled(f, jnp.ones(5)))
    hcb.barrier_wait()
    assert road == PLAIN_TAP_ROAD, (sorted(road - PLAIN_TAP_ROAD),
                                    sorted(PLAIN_TAP_ROAD - road))
    # Not on it: the JAX-callback transports' own module, the transformation rules (no
    # transformation here), the eager rules, the call invokers and joins.
    assert not {"_src/transports/common.py", "_src/rules.py", "_src/eager.py",
                "_src/runtime.py"} & road
