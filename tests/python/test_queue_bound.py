"""The byte bound: with a small bound and a slow callback, devices wait, the held bytes stay
within the bound plus one message, and nothing is lost."""
from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import pytest
from jax import lax

import hostfeed
from hostfeed import _receiver
from hostfeed import host_callback as hcb

from conftest import queue_bound, wait_until


@pytest.fixture
def small_bound(request):
    with queue_bound(request.param):
        yield request.param


@pytest.mark.parametrize("small_bound, n, elems", [(4096, 64, 256), (100, 20, 256)],
                         indirect=["small_bound"])
def test_bound_holds_with_a_slow_callback_and_nothing_is_lost(small_bound, n, elems):
    bound = small_bound
    msg_bytes = elems * 4 + 1024  # data plus what a message holds besides (< 1 KiB)
    _receiver.host.reset_peak()
    release = threading.Event()
    got = []

    def slow_tap(a, transforms):
        release.wait(60)  # the host is slow until the test has seen the device wait
        got.append(int(a[0]))

    @jax.jit
    def f(x):
        return lax.fori_loop(0, n, lambda i, c: hcb.id_tap(slow_tap, c + i, result=c), x)

    blocked_before = hostfeed.receiver_stats()["producer_blocked_count"]
    worker = threading.Thread(target=lambda: f(jnp.zeros(elems, jnp.float32)).block_until_ready())
    worker.start()
    wait_until(lambda: hostfeed.receiver_stats()["producer_blocked_count"] > blocked_before)
    stats = hostfeed.receiver_stats()
    assert stats["queued_bytes"] <= max(bound, msg_bytes)
    release.set()
    worker.join(120)
    assert not worker.is_alive()
    hcb.barrier_wait()
    stats = hostfeed.receiver_stats()
    assert got == list(range(n))
    assert stats["peak_queued_bytes"] <= bound + msg_bytes
    assert stats["producer_blocked_ns"] > 0
