"""Every row a recorder drops reaches the program: rows that compiled code sends to a
recorder after its close() are raised by the next barrier_wait (or reported at exit), a
step of a closed recorder is refused at the call, and a step that fails at run time keeps
the rows the documentation says it keeps, records inside or as outputs."""
from __future__ import annotations

import re

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import hostfeed
from hostfeed import host_callback as hcb

from conftest import ON_TPU, run_python

pytest.importorskip("zarr", reason="needs zarr-python")


def test_rows_sent_after_close_are_raised_by_the_next_barrier_wait(tmp_path):
    path = tmp_path / "run.zarr"
    rec = hostfeed.Recorder(path)
    f = jax.jit(lambda x: rec.record("x", x, step=1) + rec.record("y/z", x))  # compiled open
    f(jnp.float32(1))
    rec.close()
    f(jnp.float32(2))
    f(jnp.float32(3))
    with pytest.raises(hostfeed.RecordingError,
                       match=r"hostfeed: 2 rows of 'x', 2 rows of 'y/z' reached the recorder "
                             rf"of {re.escape(str(path))} after it was closed and were dropped "
                             r"\(a computation "
                             r"compiled while it was open ran after its close\(\)\)"):
        hcb.barrier_wait()
    hcb.barrier_wait()  # raised once
    f(jnp.float32(4))
    with pytest.raises(hostfeed.RecordingError, match=r"1 row of 'x', 1 row of 'y/z' "):
        hcb.barrier_wait()
    rows, meta = hostfeed.read_recording(path, "x")
    assert rows.tolist() == [1.0] and meta["step"].tolist() == [1]


@pytest.mark.parametrize("outputs", [True, False])
def test_a_step_of_a_closed_recorder_is_refused_at_the_call(tmp_path, outputs):
    rec = hostfeed.Recorder(tmp_path / "run.zarr")
    step = rec.step(lambda x: rec.record("x", x) * 2, outputs=outputs)
    assert float(step(jnp.float32(1))) == 2.0
    rec.close()
    with pytest.raises(ValueError, match=r"\.step\(<lambda>\) was called after "
                                         r"hostfeed\.Recorder\(.*, closed\) was closed"):
        step(jnp.float32(2))
    hcb.barrier_wait()  # nothing ran, nothing dropped
    assert hostfeed.read_recording(tmp_path / "run.zarr", "x")[0].tolist() == [1.0]


def test_a_step_recording_as_outputs_to_another_closed_recorder_is_refused(tmp_path):
    other = hostfeed.Recorder(tmp_path / "other.zarr")
    with hostfeed.Recorder(tmp_path / "run.zarr") as rec:
        step = rec.step(lambda x: other.record("x", rec.record("y", x)), outputs=True)
        step(jnp.float32(1))
        other.close()
        with pytest.raises(ValueError, match=r"after hostfeed\.Recorder\('.*other\.zarr', "
                                             r"closed\) was closed"):
            step(jnp.float32(2))
    assert hostfeed.read_recording(tmp_path / "run.zarr", "y")[0].tolist() == [1.0]
    assert hostfeed.read_recording(tmp_path / "other.zarr", "x")[0].tolist() == [1.0]


def test_rows_no_barrier_raised_are_in_the_exit_report(tmp_path):
    path = tmp_path / "run.zarr"
    proc = run_python(f"""
        import jax, jax.numpy as jnp, hostfeed
        rec = hostfeed.Recorder({str(path)!r})
        f = jax.jit(lambda x: rec.record("h", x))
        f(jnp.zeros(3))
        rec.close()
        for i in range(3):
            f(jnp.ones(3))
        """)
    assert proc.returncode == 0, proc.stderr
    assert (f"hostfeed: 3 rows of 'h' reached the recorder of {path} after it was closed "
            f"and were dropped") in proc.stderr, proc.stderr
    assert "(reported at exit: no barrier_wait() raised it)" in proc.stderr, proc.stderr
    assert hostfeed.read_recording(path, "h")[0].tolist() == [[0.0] * 3]


def _failing_at(bad):
    def host(i):
        if int(i) == bad:
            raise RuntimeError("the host function failed")
        return np.int32(i)
    return host


@pytest.mark.parametrize("outputs", [False, True])
def test_a_step_that_fails_at_run_time(tmp_path, outputs):
    """As docs/recording-reference.md says: with the records inside the computation, a
    call that fails at run time keeps the rows recorded before the failing call in its
    program (``a`` of step 1), not those after it (``b``); with the records as outputs,
    that call writes none of its rows (it has no outputs)."""
    path = tmp_path / "run.zarr"
    with hostfeed.Recorder(path) as rec:
        def fn(x, i):
            rec.record("a", x, step=i)
            j = hcb.call(_failing_at(1), i, result_shape=jax.ShapeDtypeStruct((), jnp.int32))
            rec.record("b", x + j, step=i)
            return x + 1

        step = rec.step(fn, outputs=outputs)
        failed = 0
        for i in range(4):
            try:
                jax.block_until_ready(step(jnp.float32(i), jnp.int32(i)))
            except Exception as exc:  # noqa: BLE001 - the failing call's, checked below
                assert "the host function failed" in str(exc), exc
                failed += 1
        assert failed == 1
        with pytest.raises(hcb.CallbackException, match="the host function failed"):
            hcb.barrier_wait()
    steps = {n: hostfeed.read_recording(path, n)[1]["step"].tolist() for n in ("a", "b")}
    # A TPU's program runs on past a failed call (the failure ends it after it has run):
    # inside, the rows after the call are written too, as the reference says.
    inside_after = [0, 1, 2, 3] if ON_TPU else [0, 2, 3]
    assert steps == {"a": [0, 2, 3] if outputs else [0, 1, 2, 3],
                     "b": [0, 2, 3] if outputs else inside_after}
