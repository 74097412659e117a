"""Behaviour that used to surprise without a word (issue 57, part 5), each now a rule that
is documented and tested: legacy prints in order with the program's own lines on request,
a record's cotangent chosen per call, reading a store a recorder still writes says so, a
name recorded twice in one step keeps both rows, numpy values that do not fit JAX's dtype
are refused, ``Histogram``'s default range, the demo's store, what exit reports (and the
exit status), and a Python int step that compiles the function at every step."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hostfeed
from hostfeed._src.record.unflushed import UnflushedReadWarning
from hostfeed._src.record.roles import ROW_METADATA

from conftest import run_python

X64 = bool(jax.config.jax_enable_x64)


def names_in(path):
    import zarr
    meta = tuple("." + m for m in ROW_METADATA)
    return sorted(k for k in zarr.open_group(path, mode="r").array_keys()
                  if not k.endswith(meta))


# ---- 1. legacy id_print in order with the program's own output ----------------------------


def test_sync_taps_setting_prints_id_print_in_order_with_the_programs_own_lines():
    code = """
        import jax, jax.numpy as jnp
        from hostfeed import host_callback as hcb
        f = jax.jit(lambda x: hcb.id_print(x * 2, what="tap") + 1)
        for i in range(20):
            print(f"before {i}", flush=True)
            print(f"after {int(f(jnp.int32(i)))}", flush=True)
    """
    r = run_python(code, env={"HOSTFEED_SYNC_TAPS": "1"})
    assert r.returncode == 0, r.stderr
    expected = []
    for i in range(20):
        expected += [f"before {i}", "what: tap", str(2 * i), f"after {2 * i + 1}"]
    assert r.stdout.splitlines() == expected


# ---- 2. cotangents per record --------------------------------------------------------------


def _grad_with(rec, name, cotangents):
    def loss(w):
        h = rec.record(name, jnp.tanh(w), step=7, cotangents=cotangents)
        return jnp.sum(h ** 2)
    return jax.jit(jax.grad(loss))(jnp.arange(3.0))


@pytest.mark.parametrize("cotangents", [True, False, None])
def test_record_under_grad_writes_the_cotangent_as_the_call_chooses(store, mode, cotangents):
    with hostfeed.Recorder(store) as rec:
        g = _grad_with(rec, "h", cotangents)
    # Against the same computation on the same device without a record (a TPU's tanh is
    # not numpy's to 1e-6).
    w = jnp.arange(3.0)
    np.testing.assert_allclose(g, jax.jit(jax.grad(lambda w: jnp.sum(jnp.tanh(w) ** 2)))(w),
                               rtol=1e-5)
    tanh = np.asarray(jax.jit(jnp.tanh)(w))
    written = cotangents if cotangents is not None else mode == "transforms"
    assert names_in(store) == (["h", "h.cotangent"] if written else ["h"])
    rows, meta = hostfeed.read_recording(store, "h")
    np.testing.assert_allclose(rows, [tanh], rtol=1e-5)
    if written:
        ct, ct_meta = hostfeed.read_recording(store, "h.cotangent")
        np.testing.assert_allclose(ct, [2 * tanh], rtol=1e-5)
        assert ct_meta["step"].tolist() == [7]


def test_record_cotangents_false_under_jvp_records_no_tangent(store, transforms_mode):
    with hostfeed.Recorder(store) as rec:
        jax.jvp(lambda w: rec.record("h", w * 2, cotangents=False), (jnp.ones(2),),
                (jnp.ones(2),))
        jax.jvp(lambda w: rec.record("t", w * 2, cotangents=True), (jnp.ones(2),),
                (jnp.ones(2),))
    assert names_in(store) == ["h", "t", "t.tangent"]


def test_record_cotangents_must_be_a_bool_or_none(store):
    with hostfeed.Recorder(store) as rec, pytest.raises(
            TypeError, match=r"cotangents=\.\.\.\) must be True, False or None.*got 'no'"):
        rec.record("h", jnp.ones(2), cotangents="no")


def test_record_cotangents_false_with_every_records_no_cotangent(store, transforms_mode):
    with hostfeed.Recorder(store) as rec:
        jax.jit(jax.grad(lambda w, s: jnp.sum(rec.record("h", w, step=s, every=2,
                                                          cotangents=False))))(
            jnp.ones(2), 4)
    assert names_in(store) == ["h"]


# ---- 3. reading a store a recorder still writes ----------------------------------------------


def test_reading_an_open_store_with_unflushed_rows_warns_naming_flush(store):
    rec = hostfeed.Recorder(store)
    try:
        for step in range(3):
            rec.record("x", jnp.full(2, step, jnp.float32), step=step)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            hostfeed.read_recording(store, "x")
            hostfeed.open_recording(store)
        assert [type(w.message) for w in caught] == [UnflushedReadWarning] * 2, \
            [str(w.message) for w in caught]
        first = str(caught[0].message)
        assert "hostfeed.read_recording: a Recorder of this process still has" in first
        assert "rec.flush()" in first and "hostfeed.follow()" in first
        assert caught[0].filename == __file__
        rec.flush()
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # neither ours nor zarr-python's (.hostfeed.lock)
            rows, meta = hostfeed.read_recording(store, "x")
            assert hostfeed.open_recording(store).names == ["x"]
        assert rows[:, 0].tolist() == [0.0, 1.0, 2.0] and meta["step"].tolist() == [0, 1, 2]
        jax.jit(lambda v: rec.record("x", v, step=3))(jnp.ones(2)).block_until_ready()
        with pytest.warns(UnflushedReadWarning, match=r"rec\.flush\(\)"):
            hostfeed.read_recording(store, "x")
    finally:
        rec.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert hostfeed.read_recording(store, "x")[1]["step"].tolist() == [0, 1, 2, 3]


# ---- 4. the same name twice in one step ------------------------------------------------------


def test_a_name_recorded_twice_in_one_step_keeps_both_rows_in_run_order(store):
    with hostfeed.Recorder(store) as rec:
        def forward(x, step):
            return rec.record("h", jnp.tanh(x), step=step)

        @jax.jit
        def train_and_eval(x, step):
            return forward(x, step), forward(-x, step)  # one forward pass for each

        for step in range(2):
            train_and_eval(jnp.ones(2), step)
    rows, meta = hostfeed.read_recording(store, "h")
    t = float(jax.jit(jnp.tanh)(jnp.float32(1)))  # this device's tanh
    np.testing.assert_allclose(rows[:, 0], [t, -t, t, -t], rtol=1e-6)
    assert meta["step"].tolist() == [0, 0, 1, 1]
    assert np.all(np.diff(meta["seq"]) > 0)


# ---- 5. numpy values JAX would convert -------------------------------------------------------


@pytest.mark.skipif(X64, reason="with x64 on, numpy's 64-bit types are recorded as they are")
def test_an_eager_numpy_value_that_fits_is_recorded_as_jit_converts_it(store):
    with hostfeed.Recorder(store) as rec:
        rec.record("i", np.array([2**31 - 1, -2**31, 1], np.int64))
        rec.record("f", np.array([0.5, np.inf, -1e30], np.float64))
    i, _ = hostfeed.read_recording(store, "i")
    f, _ = hostfeed.read_recording(store, "f")
    assert i.dtype == np.int32 and i.tolist() == [[2**31 - 1, -2**31, 1]]
    assert f.dtype == np.float32 and f.tolist() == [[0.5, np.inf, np.float32(-1e30)]]


@pytest.mark.skipif(X64, reason="with x64 on, numpy's 64-bit types are recorded as they are")
@pytest.mark.parametrize("value, message", [
    (np.array([2**40, 1], np.int64), r"numpy int64 value that does not fit in int32.*"
                                     r"1099511627776 would be stored as 0"),
    (np.array([1.0, 1e300]), r"numpy float64 value that does not fit in float32.*"
                             r"1e\+300 would be stored as inf"),
    (np.uint64(2**33), r"numpy uint64 value that does not fit in uint32"),
])
def test_an_eager_numpy_value_that_does_not_fit_is_refused(store, value, message):
    with hostfeed.Recorder(store) as rec:
        with pytest.raises(OverflowError, match=message + r".*jax_enable_x64"):
            rec.record("v", value)
        with pytest.raises(OverflowError, match=message):
            rec.record("s", value, reduce="stats")
        assert rec.stats()["rows"] == 0
    assert names_in(store) == []


# ---- 6. Histogram's default, the demo's store, what exit reports ------------------------------


def test_histogram_without_range_is_the_log_histogram():
    assert hostfeed.Histogram(16).range == hostfeed.Histogram(16, range="log").range
    assert hostfeed.Histogram(16).log
    assert 'or ``"log"`` (the default' in hostfeed.Histogram.__doc__


def test_demo_with_a_temporary_store_says_it_is_deleted():
    r = run_python("from hostfeed.__main__ import main; "
                   "raise SystemExit(main(['demo', '--steps', '4']))")
    assert r.returncode == 0, r.stderr
    assert ("the recording was in a temporary store, deleted at the end of the demo "
            "(--store PATH keeps it)") in r.stdout.splitlines()
    assert "hostfeed-demo-" not in r.stdout


def test_exit_does_not_repeat_a_call_failure_the_program_caught():
    r = run_python("""
        import jax, jax.numpy as jnp
        from hostfeed import host_callback as hcb
        def bad(x):
            raise ValueError("call went wrong")
        try:
            jax.jit(lambda x: hcb.call(bad, x, result_shape=x))(jnp.ones(2)).block_until_ready()
        except Exception as e:
            print("caught:", "call went wrong" in str(e))
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["caught: True"]
    # Logged once when it happened; nothing at exit.
    assert r.stderr.count("call went wrong") == 1, r.stderr
    assert "CallbackException" not in r.stderr and "atexit" not in r.stderr, r.stderr


def test_exit_reports_a_tap_failure_no_barrier_raised_with_its_traceback():
    r = run_python("""
        import jax, jax.numpy as jnp
        from hostfeed import host_callback as hcb
        def bad(x):
            raise ValueError("call went wrong")
        def bad_tap(a, tr):
            raise RuntimeError("tap went wrong")
        try:
            jax.jit(lambda x: hcb.call(bad, x, result_shape=x))(jnp.ones(2)).block_until_ready()
        except Exception:
            pass
        jax.jit(lambda x: hcb.id_tap(bad_tap, x))(1.0).block_until_ready()
    """)
    # As an uncaught exception in the main thread would: status 1, the report on stderr.
    assert r.returncode == 1, r.stderr
    assert r.stderr.endswith(
        "hostfeed: for it, the program exits with status 1 where it would exit with 0, as "
        "for an uncaught exception (HOSTFEED_CALLBACK_ERROR_EXIT=0 keeps status 0, as the "
        "legacy module did)\n"), r.stderr[-2000:]
    exit_report = r.stderr[r.stderr.index("Traceback (most recent call last)"):]
    # The tap function's frame, then its exception (Python 3.13 prints the source line
    # between them, 3.11 cannot read it from -c code).
    assert re.search(r'File "<string>", line 7, in bad_tap\n(?:    .*\n)*'
                     r'RuntimeError: tap went wrong', exit_report), exit_report
    assert ("hostfeed.CallbackException: There were exceptions during callback processing "
            "that no barrier_wait() raised. Last one was: RuntimeError: tap went wrong") \
        in exit_report
    assert "call went wrong" not in exit_report and "atexit" not in r.stderr


_UNRAISED_TAP_ERROR = """
    import sys, jax, jax.numpy as jnp
    from hostfeed import host_callback as hcb
    def bad_tap(a, tr):
        raise RuntimeError("tap went wrong")
    jax.jit(lambda x: hcb.id_tap(bad_tap, x))(1.0).block_until_ready()
    print("finished", flush=True)
    open(sys.argv[1], "w").write("written")  # left for the interpreter to close
    sys.exit(int(sys.argv[2]))
"""


@pytest.mark.parametrize("setting,own,status", [("0", 0, 0), ("", 3, 3), ("5", 0, 5)],
                         ids=["legacy-0", "own-status-kept", "chosen-status"])
def test_the_exit_status_for_an_unraised_callback_error_follows_the_setting(
        tmp_path, setting, own, status):
    """HOSTFEED_CALLBACK_ERROR_EXIT=0 keeps the legacy status 0 (the error still printed);
    a program that exits with a non-zero status of its own keeps it; another value is the
    status. The status changes only after Python finalized: a file left open is written."""
    out = tmp_path / "out.txt"
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(_UNRAISED_TAP_ERROR), str(out),
                        str(own)], capture_output=True, text=True, timeout=180,
                       env=dict(os.environ, JAX_PLATFORMS="cpu",
                                HOSTFEED_CALLBACK_ERROR_EXIT=setting))
    assert r.returncode == status, r.stderr[-2000:]
    assert r.stdout == "finished\n" and out.read_text() == "written"
    assert "no barrier_wait() raised. Last one was: RuntimeError: tap went wrong" in r.stderr
    assert ("where it would exit with 0" in r.stderr) == (setting != "0"), r.stderr[-2000:]


# ---- 7. a Python int step that compiles the function again at every step ------------------


def _static_argnums(rec):
    def train_step(x, step):
        return rec.record("loss", x * 2, step=step)
    return jax.jit(train_step, static_argnums=1), "train_step"


def _filter_jit(rec):
    eqx = pytest.importorskip("equinox")

    @eqx.filter_jit
    def train_step(x, step):  # filter_jit: a Python int argument is static
        return rec.record("loss", x * 2, step=step)
    return train_step, "train_step"


@pytest.mark.parametrize("make", [_static_argnums, _filter_jit],
                         ids=["static_argnums", "eqx.filter_jit"])
def test_a_function_traced_again_for_each_python_int_step_warns_once(store, make):
    with hostfeed.Recorder(store) as rec:
        step_fn, name = make(rec)
        for s in range(3):  # three traces: no word yet
            step_fn(jnp.float32(s), s)
        with pytest.warns(UserWarning) as caught:
            for s in range(3, 8):  # the fourth different step warns, once
                step_fn(jnp.float32(s), s)
    assert len(caught) == 1, [str(w.message) for w in caught]
    text = str(caught[0].message)
    assert (f"the function {name} was traced 4 times for hostfeed.Recorder({store!r})"
            f".record('loss', step=...)") in text
    assert "with a Python int step each time (0, 1, 2, 3)" in text
    assert "Pass jnp.int32(step) instead" in text
    assert caught[0].filename == __file__  # the line that records
    np.testing.assert_array_equal(hostfeed.read_recording(store, "loss")[1]["step"],
                                  np.arange(8))


def test_traced_steps_unrolled_loops_and_recorded_steps_do_not_warn(store):
    """A step passed as a traced value, a Python loop unrolled in one trace (several
    concrete steps, one trace; traced again here for another static argument, with the
    same steps), and ``rec.step`` with host int steps (compiled once or twice, not per
    step) are no retrace per step: no warning (pytest turns one into an error)."""
    with hostfeed.Recorder(store) as rec:
        traced = jax.jit(lambda x, s: rec.record("a", x, step=s))
        unrolled = jax.jit(lambda x, k: [rec.record("b", x * k, step=s) for s in range(5)][-1],
                           static_argnums=1)
        stepped = rec.step(lambda x, s: rec.record("c", x, step=s, every=2))
        for s in range(6):
            traced(jnp.float32(s), s)
            unrolled(jnp.float32(1), s)
            stepped(jnp.float32(s), s)
    assert len(hostfeed.read_recording(store, "b")[0]) == 30
