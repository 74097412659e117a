"""Eager taps (outside any trace): they skip XLA entirely, yet keep the semantics of taps
that go through a device: ordered after the taps of computations already dispatched, run
on the receiver thread, exceptions raised by barrier_wait, byte bound honoured."""
from __future__ import annotations

import io
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hostfeed
from hostfeed import _receiver
from hostfeed._src import consumers
from hostfeed import host_callback as hcb

from conftest import queue_bound, wait_until


def test_eager_tap_runs_after_the_taps_of_computations_already_dispatched():
    got = []
    f = jax.jit(lambda x: hcb.id_tap(lambda a, tr: got.append("dispatched"),
                                     (x @ x @ x @ x)[0, 0]))
    x = jnp.ones((1200, 1200), jnp.float32)
    f(x).block_until_ready()
    hcb.barrier_wait()
    got.clear()
    f(x)  # dispatched asynchronously: its tap is sent once the matrix products are done
    # A numpy operand: nothing about it has to wait for the device.
    hcb.id_tap(lambda a, tr: got.append("eager"), np.int32(1))
    hcb.barrier_wait()
    assert got == ["dispatched", "eager"]


def test_eager_taps_with_fresh_functions_compile_and_register_nothing():
    compiles = []

    def listener(event, duration, **kw):
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append(event)

    x = jnp.arange(3.0)
    hcb.id_print(x, output_stream=io.StringIO())  # warm up whatever is lazily set up
    hcb.barrier_wait()
    entries = consumers.registered_consumers()
    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        s = io.StringIO()
        for i in range(50):
            hcb.id_print(x, what=i, output_stream=s)  # a fresh tap function every call
            hcb.id_tap(lambda a, tr, i=i: None, x)
        hcb.barrier_wait()
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    assert compiles == []
    assert consumers.registered_consumers() == entries
    assert s.getvalue().count("what: ") == 50


def test_eager_tap_runs_on_the_receiver_thread():
    threads = []
    hcb.id_tap(lambda a, tr: threads.append(threading.current_thread()), jnp.float32(1))
    hcb.barrier_wait()
    assert threads[0] is not threading.main_thread()


def test_eager_tap_exception_is_raised_by_barrier_wait():
    def bad(a, tr):
        raise ValueError("eager boom")

    hcb.id_tap(bad, jnp.float32(1))
    with pytest.raises(hcb.CallbackException, match="eager boom"):
        hcb.barrier_wait()
    hcb.barrier_wait()


def test_eager_tap_sees_the_value_at_the_time_of_the_call():
    got = []
    release = threading.Event()
    hcb.id_tap(lambda a, tr: release.wait(30), np.float32(0))  # the receiver is busy
    a = np.arange(4, dtype=np.float32)
    y = hcb.id_tap(lambda v, tr: got.append(v), a)
    a[:] = -1  # the caller changes its array before the callback runs
    release.set()
    hcb.barrier_wait()
    np.testing.assert_array_equal(got[0], [0.0, 1.0, 2.0, 3.0])
    assert got[0].flags.writeable and got[0].dtype == np.float32
    assert isinstance(y, jax.Array)


def test_eager_numpy_float64_is_canonicalized_like_a_computation():
    got = []
    hcb.id_tap(lambda v, tr: got.append(v), np.arange(3, dtype=np.float64))
    hcb.barrier_wait()
    assert got[0].dtype == jnp.asarray(np.float64(0)).dtype


def test_eager_taps_wait_for_space_with_the_gil_released():
    bound, n, elems = 4096, 16, 256
    release = threading.Event()
    got = []

    def slow(a, tr):
        release.wait(60)
        got.append(int(a[0]))

    with queue_bound(bound):
        _receiver.host.reset_peak()
        blocked = hostfeed.receiver_stats()["producer_blocked_count"]

        def producer():
            for i in range(n):
                hcb.id_tap(slow, np.full(elems, i, np.float32))

        worker = threading.Thread(target=producer)
        worker.start()
        wait_until(lambda: hostfeed.receiver_stats()["producer_blocked_count"] > blocked)
        # The producer waits without holding the GIL: this thread keeps running Python.
        assert worker.is_alive()
        release.set()
        worker.join(60)
        assert not worker.is_alive()
        hcb.barrier_wait()
        assert got == list(range(n))
        assert hostfeed.receiver_stats()["peak_queued_bytes"] <= bound + elems * 4


def test_eager_tap_with_device_and_transforms_under_vmap():
    got = []

    def tap(a, transforms, *, device):
        got.append((a.tolist(), transforms, device))

    jax.vmap(lambda v: hcb.id_tap(tap, v, tap_with_device=True))(jnp.arange(2.0))
    hcb.barrier_wait()
    assert got == [([0.0, 1.0], (("batch", {"batch_dims": (0,)}),), jax.devices()[0])]


def test_eager_tap_after_stop_restarts_the_receiver():
    got = []
    hcb.stop_outfeed_receiver()
    assert not _receiver.host.is_running()
    hcb.id_tap(lambda a, tr: got.append(int(a)), jnp.int32(3))
    hcb.barrier_wait()
    assert got == [3] and _receiver.host.is_running()
