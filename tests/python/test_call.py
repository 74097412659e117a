"""hcb.call: results back to the device, errors that explain themselves."""
from __future__ import annotations

import os
import re
import traceback
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from hostfeed import _receiver
from hostfeed import host_callback as hcb

from conftest import (ON_TPU, cpu_device_or_skip, queue_bound, run_python,
                      skip_if_the_tpu_alters, wait_until)
from test_dtypes import DTYPES, random_array, x64  # noqa: F401  (fixture)

RuntimeErr = jax.errors.JaxRuntimeError


def test_scalar_array_and_pytree_results_eager_and_jit():
    def host(arg):
        x, y = arg
        return {"sum": x + y, "both": [x * 2, np.float32(7)]}

    shape = {"sum": jax.ShapeDtypeStruct((3,), jnp.float32),
             "both": [jax.ShapeDtypeStruct((3,), jnp.float32), 1.0]}
    x = jnp.arange(3.0)
    for fn in (lambda a: hcb.call(host, a, result_shape=shape),
               jax.jit(lambda a: hcb.call(host, a, result_shape=shape))):
        out = fn((x, x + 1))
        np.testing.assert_array_equal(out["sum"], [1.0, 3.0, 5.0])
        np.testing.assert_array_equal(out["both"][0], [0.0, 2.0, 4.0])
        assert out["both"][1].dtype == jnp.float32 and float(out["both"][1]) == 7.0


def test_result_shape_from_numpy_array_and_scalars():
    out = jax.jit(lambda x: hcb.call(lambda a: (a.sum(), a.astype(np.int32)), x,
                                     result_shape=(1.0, np.zeros(4, np.int32))))(jnp.arange(4.0))
    assert float(out[0]) == 6.0
    assert out[1].dtype == jnp.int32 and out[1].tolist() == [0, 1, 2, 3]


def test_results_are_canonicalised_like_jax():
    # float64 results are accepted when x64 is off and arrive as float32.
    out = jax.jit(lambda x: hcb.call(lambda a: np.float64(a) * 2, x, result_shape=x))(
        jnp.float32(1.5))
    assert out.dtype == jnp.float32 and float(out) == 3.0


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_every_dtype_round_trips_bit_exactly(x64, dtype):  # noqa: F811
    skip_if_the_tpu_alters(dtype)
    x = random_array(dtype, (2, 3), seed=11)
    out = jax.jit(lambda a: hcb.call(lambda v: v.copy(), a, result_shape=a))(x)
    assert np.asarray(out).tobytes() == x.tobytes()


@pytest.mark.parametrize("result_shape", [None, ()])
def test_no_results(result_shape):
    seen = []
    out = jax.jit(lambda x: hcb.call(lambda a: seen.append(float(a)), x,
                                     result_shape=result_shape))(2.0)
    hcb.barrier_wait()  # no result to wait on: the computation may still run (TPU)
    assert out == result_shape and seen == [2.0]


def test_empty_results_work():
    out = jax.jit(lambda x: hcb.call(lambda a: (np.zeros((0, 3), np.float32), a), x,
                                     result_shape=(jax.ShapeDtypeStruct((0, 3), jnp.float32),
                                                   x)))(jnp.float32(4))
    assert out[0].shape == (0, 3) and float(out[1]) == 4.0


def test_call_with_device_passes_the_device():
    got = []

    def host(a, *, device):
        got.append(device)
        return a

    jax.block_until_ready(
        jax.jit(lambda x: hcb.call(host, x, result_shape=x, call_with_device=True))(1.0))
    assert got == [jax.devices()[0]]


def barrier_after_a_reported_failure(match):
    """``barrier_wait`` once a computation failed and its caller saw the failure: nothing is
    left, except where JAX reports a failed computation with host callbacks once more
    through its runtime tokens (a TPU's host transfers)."""
    if ON_TPU:
        with pytest.raises(RuntimeErr, match=match):
            hcb.barrier_wait()
    hcb.barrier_wait()


def expect_failure_then_recovery(fn, arg, match):
    with pytest.raises(RuntimeErr, match=match):
        np.asarray(fn(arg))
    with pytest.raises(hcb.CallbackException):
        hcb.barrier_wait()
    ok = jax.jit(lambda x: hcb.call(lambda a: a + 1, x, result_shape=x))(jnp.float32(1))
    assert float(ok) == 2.0


def test_wrong_pytree_is_an_error_in_the_caller():
    f = jax.jit(lambda x: hcb.call(lambda a: (a, a), x, result_shape=x))
    expect_failure_then_recovery(f, 1.0, r"Callback func .* should have returned a result "
                                         r"with pytree PyTreeDef\(\*\) but returned")


def test_wrong_shape_is_an_error_naming_expected_and_received():
    f = jax.jit(lambda x: hcb.call(lambda a: np.ones(4, np.float32), x, result_shape=x))
    expect_failure_then_recovery(f, jnp.ones(3), r"with abstract values float32\[3\] but "
                                                 r"returned float32\[4\]")


def test_wrong_dtype_is_an_error():
    f = jax.jit(lambda x: hcb.call(lambda a: a.astype(np.int32), x, result_shape=x))
    expect_failure_then_recovery(f, jnp.ones(3), r"float32\[3\] but returned int32\[3\]")


def test_non_array_result_is_an_error():
    f = jax.jit(lambda x: hcb.call(lambda a: np.array("text"), x, result_shape=x))
    expect_failure_then_recovery(f, 1.0, r"a value of dtype <U4")
    g = jax.jit(lambda x: hcb.call(lambda a: "text", x, result_shape=x))
    expect_failure_then_recovery(g, 1.0, r"but returned <str> \(a non-array value of type str")


def test_raising_callback_is_an_error_with_the_exception_text():
    def host(a):
        raise ZeroDivisionError("host side went wrong")

    f = jax.jit(lambda x: hcb.call(host, x, result_shape=x))
    expect_failure_then_recovery(
        f, 1.0, r"host callback \S*host of hcb.call raised ZeroDivisionError: host side went wrong"
                r" \(at \S*test_call.py:\d+ in host\) \(expected results: float32\[\]\)")


@pytest.mark.parametrize("bad", ["text", object(), [1.0, "x"]])
def test_invalid_result_shape_is_a_value_error_at_trace_time(bad):
    with pytest.raises(ValueError, match="must be either numeric scalars, or must have "
                                         "'shape' and 'dtype' attributes"):
        jax.jit(lambda x: hcb.call(lambda a: a, x, result_shape=bad))(1.0)


def test_call_in_control_flow_interleaved_with_taps_in_order():
    events = []

    def host(a):
        events.append(("call", int(a)))
        return a * 10

    @jax.jit
    def f(x):
        def body(i, c):
            hcb.id_tap(lambda a, tr: events.append(("tap", int(a))), i)
            r = hcb.call(host, i, result_shape=i)
            return c + r

        s = lax.fori_loop(0, 3, body, x)
        s = lax.cond(s > 0, lambda v: hcb.call(host, v, result_shape=v), lambda v: v, s)
        _, ys = lax.scan(lambda c, a: (c, hcb.call(host, a, result_shape=a)), 0, jnp.arange(2))

        def wbody(c):
            return c + hcb.call(host, c, result_shape=c)

        w = lax.while_loop(lambda c: c < 5, wbody, 1)
        return s, ys, w

    s, ys, w = f(0)
    hcb.barrier_wait()
    assert int(s) == 300 and ys.tolist() == [0, 10] and int(w) == 11
    assert events == [("tap", 0), ("call", 0), ("tap", 1), ("call", 1), ("tap", 2),
                      ("call", 2), ("call", 30), ("call", 0), ("call", 1), ("call", 1)]


def test_nested_jit_call():
    inner = jax.jit(lambda x: hcb.call(lambda a: a + 1, x, result_shape=x))
    assert float(jax.jit(lambda x: inner(inner(x)))(1.0)) == 3.0


def test_pmap_each_device_gets_its_own_call():
    got = []

    def host(a, *, device):
        got.append((float(a), device.id))
        return a * 2

    out = jax.pmap(lambda x: hcb.call(host, x, result_shape=x, call_with_device=True))(
        jnp.arange(jax.local_device_count(), dtype=jnp.float32))
    assert out.tolist() == [2.0 * i for i in range(jax.local_device_count())]
    assert sorted(got) == [(float(d.id), d.id) for d in jax.local_devices()]


@pytest.mark.several_devices
def test_pmap_on_four_devices_returns_per_device_results():
    r = run_python("""
        import jax, jax.numpy as jnp
        from hostfeed import host_callback as hcb
        seen = []
        def host(a, *, device):
            seen.append((a.tolist(), device.id))
            return a + device.id * 100
        out = jax.pmap(lambda x: hcb.call(host, x, result_shape=x, call_with_device=True))(
            jnp.arange(8.).reshape(4, 2))
        print(out.tolist())
        print(sorted(seen))
    """, env={"XLA_FLAGS": "--xla_force_host_platform_device_count=4"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "[[0.0, 1.0], [102.0, 103.0], [204.0, 205.0], [306.0, 307.0]]",
        "[([0.0, 1.0], 0), ([2.0, 3.0], 1), ([4.0, 5.0], 2), ([6.0, 7.0], 3)]"]


def test_grad_and_jvp_of_call_raise_the_legacy_error_and_point_to_custom_vjp():
    f = lambda x: hcb.call(np.sin, x, result_shape=x)
    for transform in (lambda: jax.grad(f)(1.0), lambda: jax.jvp(f, (1.0,), (1.0,)),
                      lambda: jax.linearize(f, 1.0)):
        with pytest.raises(NotImplementedError, match="only for id_tap, not for call") as e:
            transform()
        assert "jax.custom_vjp" in str(e.value)


def test_vmap_of_call_works_one_call_per_element():
    got = []
    f = jax.vmap(lambda x: hcb.call(lambda a: got.append(float(a)) or a * 2, x,
                                    result_shape=x))
    assert f(jnp.arange(3.0)).tolist() == [0.0, 2.0, 4.0]
    assert got == [0.0, 1.0, 2.0]


def test_custom_vjp_pattern_from_the_legacy_docstring():
    # Differentiate a host computation by calling the host for the derivative too.
    @jax.custom_vjp
    def host_sin(x):
        return hcb.call(np.sin, x, result_shape=x)

    def fwd(x):
        return host_sin(x), x

    def bwd(x, ct):
        return (hcb.call(np.cos, x, result_shape=x) * ct,)

    host_sin.defvjp(fwd, bwd)
    x = jnp.float32(0.5)
    assert np.isclose(float(jax.jit(jax.grad(host_sin))(x)), np.cos(0.5))
    assert np.isclose(float(jax.grad(lambda v: host_sin(v) ** 2)(x)), 2 * np.sin(0.5) * np.cos(0.5))


def test_vmap_calls_the_host_once_per_element():
    shapes = []

    def host(a):
        shapes.append(a.shape)
        return a * 2

    out = jax.vmap(lambda x: hcb.call(host, x, result_shape=x))(jnp.ones((3, 2)))
    assert out.tolist() == [[2.0, 2.0]] * 3 and shapes == [(2,)] * 3


def test_callback_may_run_a_jitted_jax_function_on_the_host():
    # On the host means on a CPU device: a computation on the accelerator that waits for
    # the call would wait for itself.
    cpu = cpu_device_or_skip()
    on_host = jax.jit(lambda a: jnp.sin(a) * 2)
    f = jax.jit(lambda x: hcb.call(lambda a: np.asarray(on_host(jax.device_put(a, cpu))), x,
                                   result_shape=x))
    assert np.allclose(f(jnp.arange(3.0)), 2 * np.sin(np.arange(3.0)))


def test_call_completes_while_the_queue_is_full_of_taps():
    got = []
    with queue_bound(2048):
        @jax.jit
        def f(x):
            x = lax.fori_loop(0, 50, lambda i, c: hcb.id_tap(
                lambda a, tr: got.append(int(a[0])), c + i, result=c), x)
            return hcb.call(lambda a: (got.append("call"), a + 1)[1], x, result_shape=x)

        out = f(jnp.zeros(256, jnp.int32))
        assert out.tolist() == [1] * 256
        hcb.barrier_wait()
        assert got == list(range(50)) + ["call"]


def test_stop_fails_a_call_whose_callback_never_returns(monkeypatch, calls_on_receiver_thread):
    entered, release = threading.Event(), threading.Event()

    def stuck(a):
        entered.set()
        release.wait(120)
        return a

    f = jax.jit(lambda x: hcb.call(stuck, x, result_shape=x))
    outcome = {}

    def run():
        try:
            outcome["value"] = float(f(1.0))
        except Exception as e:  # noqa: BLE001 - inspected below
            outcome["error"] = e

    worker = threading.Thread(target=run)
    worker.start()
    assert entered.wait(60)
    monkeypatch.setenv("HOSTFEED_STOP_TIMEOUT", "0.2")
    hcb.stop_outfeed_receiver()
    worker.join(60)
    assert not worker.is_alive()
    # The seconds are measured (at least 0.2; more on a loaded machine).
    assert re.search(r"stuck made no progress for \d+\.\d s \(HOSTFEED_STOP_TIMEOUT\)",
                     str(outcome["error"]))
    # The abandoned message is accounted for: nothing is left pending.
    stats = _receiver.host.stats()
    assert stats["messages_processed"] == stats["messages_enqueued"]
    release.set()
    # The receiver restarts for new work.
    assert float(jax.jit(lambda x: hcb.call(lambda a: a + 1, x, result_shape=x))(1.0)) == 2.0
    wait_until(lambda: (_receiver.host.stats()["messages_processed"]
                        == _receiver.host.stats()["messages_enqueued"]))


def test_timeout_fails_a_slow_call_naming_the_callback(monkeypatch):
    monkeypatch.setenv("HOSTFEED_CALL_TIMEOUT", "0.1")
    release = threading.Event()

    def slow_host(a):
        release.wait(120)
        return a

    f = jax.jit(lambda x: hcb.call(slow_host, x, result_shape=x))
    try:
        with pytest.raises(RuntimeErr, match=r"slow_host of hcb.call did not reply within 0.100 s"):
            np.asarray(f(1.0))
    finally:
        release.set()
    barrier_after_a_reported_failure("did not reply within")


def test_a_call_that_timed_out_while_queued_is_not_run(monkeypatch):
    monkeypatch.setenv("HOSTFEED_CALL_TIMEOUT", "0.1")
    started, release = threading.Event(), threading.Event()
    ran = []

    def busy(a, transforms):
        started.set()
        release.wait(60)

    def host(a):
        ran.append(float(a))
        return a

    f = jax.jit(lambda x: hcb.call(host, x, result_shape=x))
    try:
        jax.jit(lambda x: hcb.id_tap(busy, x))(1.0)  # the receiver is busy with it
        assert started.wait(30)
        with pytest.raises(RuntimeErr, match=r"host timed out .* without .*host ever "
                           r"starting: the receiver has been busy .* running .*busy"):
            np.asarray(f(2.0))
    finally:
        release.set()
    barrier_after_a_reported_failure("timed out")
    assert ran == []  # nobody waited for it any more when the receiver got to it
    assert float(f(3.0)) == 3.0 and ran == [3.0]


def test_bad_timeout_setting_is_reported(monkeypatch):
    monkeypatch.setenv("HOSTFEED_CALL_TIMEOUT", "soon")
    with pytest.raises(ValueError, match="HOSTFEED_CALL_TIMEOUT='soon'"):
        jax.jit(lambda x: hcb.call(lambda a: a, x, result_shape=x))(1.0)
    del os.environ["HOSTFEED_CALL_TIMEOUT"]


# Mistakes in `call`, explained in the caller's terms with the fix.

def test_missing_result_shape_says_what_to_pass():
    f = jax.jit(lambda x: hcb.call(lambda a: np.ones(3, np.float32), x))
    expected = (r"result_shape was None or empty, which declares that the host function "
                r"returns nothing; for what it returned, pass "
                r"result_shape=jax\.ShapeDtypeStruct\(\(3,\), jnp\.float32\)")
    # The computation has no result that could carry its failure where the device runs
    # it asynchronously (TPU): there, barrier_wait is where the host function's error
    # shows; a CPU fails the dispatch itself.
    try:
        f(1.0)
    except RuntimeErr as e:
        assert re.search(expected, str(e)), e
    with pytest.raises(hcb.CallbackException) as raised:
        hcb.barrier_wait()
    assert re.search(expected, "".join(traceback.format_exception(raised.value)))
    ok = jax.jit(lambda x: hcb.call(lambda a: a + 1, x, result_shape=x))(jnp.float32(1))
    assert float(ok) == 2.0


def test_result_shape_written_as_a_shape_tuple_is_explained():
    f = jax.jit(lambda x: hcb.call(lambda a: np.ones(3, np.float32), x, result_shape=(3,)))
    expect_failure_then_recovery(
        f, 1.0, r"result_shape was a tuple of integers, which declares that many integer "
                r"scalars .* not an array with that shape.*"
                r"pass result_shape=jax\.ShapeDtypeStruct\(\(3,\), jnp\.float32\)")


def test_failing_call_reports_the_users_frame_not_hostfeed_internals(caplog):
    def host_fn(a):
        raise ValueError("bad input")

    f = jax.jit(lambda x: hcb.call(host_fn, x, result_shape=x))
    with pytest.raises(RuntimeErr, match=r"raised ValueError: bad input \(at .*test_call\.py:"
                                         r"\d+ in host_fn\)"):
        np.asarray(f(1.0))
    with pytest.raises(hcb.CallbackException) as info:
        hcb.barrier_wait()
    logged = [r.getMessage() for r in caplog.records if r.name == "hostfeed"]
    # Said once in full (the computation's error, then the traceback as barrier_wait's
    # cause); the log line refers to both instead of repeating the traceback.
    assert len(logged) == 1 and "Traceback" not in logged[0], logged
    assert "bad input" in logged[0] and "the computation that made the call fails with it" \
        in logged[0], logged
    printed = "".join(traceback.format_exception(info.value))
    assert printed.count('raise ValueError("bad input")') == 1, printed
    # The installed package's own files, wherever the checkout lives (a clone in a folder
    # named hostfeed has "/hostfeed/" in the test file's path too).
    package = os.path.dirname(os.path.abspath(_receiver.__file__)) + os.sep
    cause = "".join(traceback.format_exception(info.value.__cause__))
    frames = [line for line in cause.splitlines() if line.strip().startswith("File ")]
    assert frames and "in host_fn" in frames[0], cause
    assert not [line for line in frames if package in line], cause


def test_call_checks_the_host_function_signature_where_it_is_called():
    with pytest.raises(TypeError, match=r"call: host functions are called as "
                                        r"callback_func\(arg\), but .*two\(a, b\) cannot be"):
        def two(a, b):
            return a
        hcb.call(two, 1.0, result_shape=1.0)
    with pytest.raises(TypeError, match=r"callback_func\(arg, device=dev\)"):
        hcb.call(lambda a: a, 1.0, result_shape=1.0, call_with_device=True)
