"""Where a CPU ``call``'s host function runs: on the device's own thread when nothing else
is pending and the call has no timeout, else on the receiver thread; the guarantees that
hold either way (order after the device's taps, one host function at a time, errors,
Ctrl-C). See docs/behaviour.md."""
from __future__ import annotations

import os
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from hostfeed import _receiver
from hostfeed import host_callback as hcb

from conftest import PORTABLE, run_python

pytestmark = pytest.mark.native_transport("the device's thread runs hostfeed's own handler")

SPEC = jax.ShapeDtypeStruct((4,), jnp.float32)


def _receiver_thread_id() -> int:
    """The native id of the receiver thread (where tap functions run)."""
    seen = []
    jax.jit(lambda x: hcb.id_tap(lambda a, tr: seen.append(threading.get_native_id()), x))(1.0)
    hcb.barrier_wait()
    return seen[0]


def _call_threads(n: int) -> list[int]:
    """The native ids of the threads that ran ``n`` calls of a jitted loop."""
    ran = []

    def host(a):
        ran.append(threading.get_native_id())
        return np.asarray(a) + np.float32(1)

    f = jax.jit(lambda v: lax.fori_loop(0, n, lambda i, a: hcb.call(host, a, result_shape=SPEC), v))
    out = f(jnp.zeros(4, jnp.float32))
    np.testing.assert_array_equal(np.asarray(out), np.full(4, n, np.float32))
    return ran


def test_calls_run_on_the_device_thread_when_nothing_is_pending():
    receiver = _receiver_thread_id()
    ran = _call_threads(200)
    assert len(ran) == 200
    assert receiver not in ran, "every call found nothing pending, yet one ran on the receiver"


def test_calls_run_on_the_receiver_thread_when_asked(calls_on_receiver_thread):
    receiver = _receiver_thread_id()
    assert set(_call_threads(50)) == {receiver}


def test_a_call_with_a_timeout_runs_on_the_receiver_thread(monkeypatch):
    monkeypatch.setenv("HOSTFEED_CALL_TIMEOUT", "30")
    receiver = _receiver_thread_id()
    assert set(_call_threads(20)) == {receiver}


def test_a_call_runs_after_the_taps_its_device_made_before():
    # Each tap function waits until the main thread lets it go, so the call behind it
    # finds it pending; the call must still run after it (on whichever thread).
    order, gates = [], [threading.Event() for _ in range(3)]

    def tap(a, transforms):
        i = int(a)
        assert gates[i].wait(60)
        order.append(("tap", i))

    def host(a):
        order.append(("call", int(a)))
        return a

    def step(i, c):
        c = hcb.id_tap(tap, i, result=c)
        return c + hcb.call(host, i, result_shape=jax.ShapeDtypeStruct((), jnp.int32))

    f = jax.jit(lambda: lax.fori_loop(0, 3, step, jnp.int32(0)))
    worker_out = []
    worker = threading.Thread(target=lambda: worker_out.append(int(f())))
    worker.start()
    for g in gates:
        g.set()
    worker.join(60)
    assert worker_out == [3]
    assert order == [("tap", 0), ("call", 0), ("tap", 1), ("call", 1), ("tap", 2), ("call", 2)]


def test_one_host_function_at_a_time_between_the_device_thread_and_the_receiver():
    # Taps of one computation (receiver thread) and calls of another (device thread, when
    # idle) run from two Python threads at once; each function yields the GIL while it
    # counts itself running, so two running together would be seen.
    running, overlaps = [0], []
    lock = threading.Lock()

    def enter():
        with lock:
            running[0] += 1
            if running[0] > 1:
                overlaps.append(running[0])
        os.sched_yield()  # releases the GIL: another host function could run now
        with lock:
            running[0] -= 1

    def tap(a, transforms):
        enter()

    def host(a):
        enter()
        return a

    taps = jax.jit(lambda v: lax.fori_loop(
        0, 300, lambda i, c: hcb.id_tap(tap, i, result=c), v))
    scalar = jax.ShapeDtypeStruct((), jnp.int32)
    calls = jax.jit(lambda v: lax.fori_loop(
        0, 300, lambda i, c: hcb.call(host, c, result_shape=scalar), v))
    errors = []

    def run(f):
        try:
            for _ in range(5):
                np.asarray(f(jnp.int32(0)))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(f,)) for f in (taps, calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    hcb.barrier_wait()
    assert not errors
    assert not overlaps


def test_the_receiver_waits_while_a_call_runs_on_the_device_thread():
    receiver = _receiver_thread_id()
    entered, release, tapped = threading.Event(), threading.Event(), threading.Event()
    log = []

    def held(a):
        log.append(("call", threading.get_native_id()))
        entered.set()
        assert release.wait(60)
        log.append(("call returns", threading.get_native_id()))
        return a

    def tap(a, transforms):
        log.append(("tap", threading.get_native_id()))
        tapped.set()

    f = jax.jit(lambda x: hcb.call(held, x, result_shape=x))
    out = []
    worker = threading.Thread(target=lambda: out.append(float(f(1.0))))
    worker.start()
    assert entered.wait(60)
    jax.jit(lambda x: hcb.id_tap(tap, x))(2.0)  # another computation's tap, queued now
    assert not tapped.wait(0.3), "a tap function ran while a call's host function ran"
    release.set()
    worker.join(60)
    hcb.barrier_wait()
    assert out == [1.0]
    assert [what for what, _ in log] == ["call", "call returns", "tap"]
    assert log[0][1] != receiver and log[2][1] == receiver


def test_an_exception_on_the_device_thread_fails_the_call_and_is_recorded():
    receiver = _receiver_thread_id()
    where = []

    def bad(a):
        where.append(threading.get_native_id())
        raise ValueError("no good")

    f = jax.jit(lambda x: hcb.call(bad, x, result_shape=x))
    with pytest.raises(Exception,
                       match=r"host callback \S*bad of hcb.call raised ValueError: no good"):
        np.asarray(f(1.0))
    assert where and where[0] != receiver
    with pytest.raises(hcb.CallbackException, match="no good"):
        hcb.barrier_wait()


def test_a_bad_result_on_the_device_thread_names_what_was_expected():
    f = jax.jit(lambda x: hcb.call(lambda a: np.zeros(3, np.float32), x, result_shape=SPEC))
    with pytest.raises(Exception, match=r"shape"):
        np.asarray(f(jnp.zeros(4, jnp.float32)))
    with pytest.raises(hcb.CallbackException):
        hcb.barrier_wait()


def test_results_that_need_converting_work_on_the_device_thread():
    # A Python float for a float32 scalar, and a tuple of results: not the one exact array,
    # so they go through the same checks as on the receiver thread.
    f = jax.jit(lambda x: hcb.call(lambda a: 2.5, x, result_shape=x))
    assert float(f(jnp.float32(1))) == 2.5
    g = jax.jit(lambda x: hcb.call(lambda a: (a + 1, a * 2), x, result_shape=(x, x)))
    assert [float(v) for v in g(jnp.float32(3))] == [4.0, 6.0]


def test_barrier_wait_inside_a_call_on_the_device_thread_raises():
    seen = []

    def host(a):
        try:
            hcb.barrier_wait()
        except Exception as e:  # noqa: BLE001 - inspected below
            seen.append(str(e))
        return a

    assert float(jax.jit(lambda x: hcb.call(host, x, result_shape=x))(1.0)) == 1.0
    assert seen and "inside" in seen[0]


def test_stopping_does_not_wait_for_a_call_running_on_the_device_thread():
    _receiver_thread_id()  # the receiver runs, so the call may run on its device's thread
    entered, release = threading.Event(), threading.Event()

    def held(a):
        entered.set()
        assert release.wait(60)
        return a + 1

    f = jax.jit(lambda x: hcb.call(held, x, result_shape=x))
    out = []
    worker = threading.Thread(target=lambda: out.append(float(f(1.0))))
    worker.start()
    assert entered.wait(60)
    hcb.stop_outfeed_receiver()  # nothing queued: returns without the host function
    assert worker.is_alive()
    release.set()
    worker.join(60)
    assert out == [2.0]


@pytest.mark.skipif(PORTABLE, reason="the device's thread runs hostfeed's own handler")
@pytest.mark.parametrize("where", ["initial thread", "another thread"])
def test_ctrl_c_interrupts_a_host_function_running_on_the_device_thread(where):
    r = run_python(f"""
        import os, signal, threading, time, jax, numpy as np
        from hostfeed import host_callback as hcb
        hcb.barrier_wait()
        float(jax.jit(lambda x: hcb.call(lambda a: a, x, result_shape=x))(1.0))
        entered, outcome = threading.Event(), []
        def spin(x):
            entered.set()
            t = time.monotonic()
            while time.monotonic() - t < 60:  # Python code: interruptible
                pass
            return x
        f = jax.jit(lambda x: hcb.call(spin, x, result_shape=x))
        def run():
            try:
                outcome.append(float(f(1.0)))
            except BaseException as e:
                outcome.append(type(e).__name__ + ": " + str(e).splitlines()[0])
        if {where!r} == "initial thread":
            threading.Thread(target=lambda: entered.wait(60)
                             and os.kill(os.getpid(), signal.SIGINT)).start()
            t0 = time.monotonic()
            try:
                run()
            except KeyboardInterrupt:
                outcome.append("KeyboardInterrupt")
        else:
            worker = threading.Thread(target=run)
            worker.start()
            assert entered.wait(60)
            t0 = time.monotonic()
            try:
                os.kill(os.getpid(), signal.SIGINT)
                worker.join(60)
            except KeyboardInterrupt:   # Python's own handler, on this thread
                worker.join(60)
        print("seconds", round(time.monotonic() - t0))
        print("outcome", outcome)
        hcb.barrier_wait()  # nothing recorded: the interruption is not the function's error
        print("then", float(jax.jit(lambda x: hcb.call(lambda a: a + 1, x, result_shape=x))(2.0)))
    """, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "seconds 0" in r.stdout, r.stdout
    # The call fails as interrupted; if JAX ran the computation on another thread while the
    # initial thread waited for its result, the wait there may see KeyboardInterrupt first.
    assert ("interrupted (KeyboardInterrupt: SIGINT)" in r.stdout
            or (where == "initial thread" and "KeyboardInterrupt" in r.stdout)), r.stdout
    assert "then 3.0" in r.stdout, r.stdout


def test_the_call_thread_setting_is_read_at_import():
    code = """
        import threading, jax, numpy as np
        from hostfeed import host_callback as hcb
        seen = []
        jax.jit(lambda x: hcb.id_tap(lambda a, tr: seen.append(threading.get_native_id()), x))(1.0)
        hcb.barrier_wait()
        ran = []
        def host(a):
            ran.append(threading.get_native_id())
            return a
        f = jax.jit(lambda x: hcb.call(host, x, result_shape=x))
        for _ in range(5):
            float(f(1.0))
        print("receiver" if set(ran) == {seen[0]} else "device" if seen[0] not in ran else "mixed")
    """
    assert run_python(code).stdout.split() == ["device"]
    r = run_python(code, env={"HOSTFEED_CALL_THREAD": "Receiver"})
    assert r.stdout.split() == ["receiver"], r.stderr
    r = run_python("import hostfeed", env={"HOSTFEED_CALL_THREAD": "main"})
    assert r.returncode != 0 and "HOSTFEED_CALL_THREAD='main'" in r.stderr
    assert _receiver.host.set_inline_calls(True) is True  # the suite's own default
