"""Synchronous taps (the default on CPUs and GPUs, ``HOSTFEED_SYNC_TAPS``,
``set_sync_taps``, ``sync_taps()``, ``id_tap(..., sync=True)``): the tap function has run
once the computation's results are ready, as with the legacy module's CPU default; and the
switch to asynchronous taps."""
from __future__ import annotations

import io
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import run_python
from hostfeed import host_callback as hcb

N_CALLS = 200

#: The default mode (synchronous on CPUs), whatever the suite's.
pytestmark = pytest.mark.usefixtures("default_tap_mode")


def _busy_tap(seen: list):
    # A tap function with some work in it, so that an asynchronous tap would often still
    # be pending when the result is ready.
    def tap(x, transforms):
        np.linalg.svd(np.ones((24, 24)) * float(np.asarray(x).sum()))
        seen.append(int(np.asarray(x).ravel()[0]))
    return tap


def test_sync_taps_have_run_when_results_are_ready_over_many_calls():
    seen: list[int] = []
    f = jax.jit(lambda x: hcb.id_tap(_busy_tap(seen), x, sync=True) * 2)
    missing = []
    for i in range(N_CALLS):
        f(jnp.int32(i)).block_until_ready()
        if seen[-1:] != [i]:
            missing.append(i)
    assert missing == []
    assert seen == list(range(N_CALLS))


def test_sync_taps_context_manager_retraces_and_applies_to_the_block():
    seen: list[int] = []
    tap = _busy_tap(seen)
    f = jax.jit(lambda x: hcb.id_tap(tap, x) + 1)
    with hcb.sync_taps(False):
        f(jnp.int32(-1))
        hcb.barrier_wait()
        seen.clear()
        assert not hcb.get_sync_taps()
        with hcb.sync_taps():
            assert hcb.get_sync_taps()
            for i in range(50):
                f(jnp.int32(i)).block_until_ready()
                assert seen[-1] == i  # the cached asynchronous trace was not reused
        assert not hcb.get_sync_taps()
    assert hcb.get_sync_taps()  # the default again (CPU: synchronous)


def test_set_sync_taps_makes_id_print_synchronous():
    s = io.StringIO()
    f = jax.jit(lambda x: hcb.id_print(x, what="x", output_stream=s))
    hcb.set_sync_taps(False)
    hcb.set_sync_taps(True)
    try:
        for i in range(20):
            f(jnp.int32(i)).block_until_ready()
            assert s.getvalue().splitlines()[-2:] == ["what: x", str(i)]
    finally:
        hcb.set_sync_taps(None)
    assert "sync" not in s.getvalue()  # the keyword is id_tap's, not printed


def test_sync_false_per_tap_overrides_the_mode():
    release = threading.Event()
    ran = threading.Event()

    def slow(x, transforms):
        release.wait(60)
        ran.set()

    with hcb.sync_taps():
        # Would deadlock (the tap waits for `release`, set only after the call returns)
        # if this tap were synchronous.
        jax.jit(lambda x: hcb.id_tap(slow, x, sync=False))(jnp.int32(1)).block_until_ready()
    release.set()
    hcb.barrier_wait()
    assert ran.is_set()


def test_sync_eager_tap_has_run_when_id_tap_returns():
    seen: list[int] = []
    tap = _busy_tap(seen)
    for i in range(50):
        hcb.id_tap(tap, jnp.int32(i), sync=True)
        assert seen[-1] == i


def test_sync_taps_keep_program_order_under_scan_vmap_and_grad():
    seen: list = []

    def tap(x, transforms):
        seen.append((np.asarray(x).tolist(), [t[0] for t in transforms]))

    def body(c, _):
        return hcb.id_tap(tap, c, sync=True) + 1.0, None

    with hcb.sync_taps():
        out = jax.jit(lambda x: jax.lax.scan(body, x, None, length=3)[0])(0.0)
        assert float(out) == 3.0
        assert seen == [(0.0, []), (1.0, []), (2.0, [])]
        seen.clear()
        jax.jit(jax.vmap(lambda x: hcb.id_tap(tap, x)))(jnp.arange(2.0)).block_until_ready()
        assert seen == [([0.0, 1.0], ["batch"])]
        seen.clear()
        g = jax.jit(jax.grad(lambda x: hcb.id_tap(tap, x * 2.0) ** 2))(1.0)
        assert float(g) == 8.0
        assert [t for _, t in seen] == [[], ["jvp", "transpose"]]


def test_sync_tap_failure_is_reported_by_barrier_wait_and_the_computation_goes_on():
    def bad(x, transforms):
        raise ValueError("sync tap failed")

    f = jax.jit(lambda x: hcb.id_tap(bad, x, sync=True) + 1)
    assert int(f(jnp.int32(1))) == 2
    assert int(f(jnp.int32(2))) == 3
    with pytest.raises(hcb.CallbackException, match="sync tap failed"):
        hcb.barrier_wait()


def test_sync_argument_and_mode_are_checked():
    with pytest.raises(TypeError, match="sync must be True, False or None"):
        hcb.id_tap(lambda x, tr: None, 1, sync="yes")
    with pytest.raises(TypeError, match=r"expected True, False or None \(the default\)"):
        hcb.set_sync_taps(1)
    with pytest.raises(TypeError, match="sync_taps"), hcb.sync_taps("on"):
        pass


def test_asynchronous_taps_from_the_environment():
    # HOSTFEED_SYNC_TAPS=0: the tap function runs on the receiver's thread after the
    # computation went on (it waits here until the computation's result is ready).
    r = run_python("""
        import threading
        import jax, jax.numpy as jnp
        from hostfeed import host_callback as hcb
        returned = threading.Event()
        seen = []
        def tap(v, tr):
            seen.append((int(v), returned.wait(60)))
        f = jax.jit(lambda x: hcb.id_tap(tap, x) + 1)
        for i in range(3):
            returned.clear()
            f(jnp.int32(i)).block_until_ready()
            returned.set()
            hcb.barrier_wait()
        print(hcb.get_sync_taps(), seen)
    """, env={"HOSTFEED_SYNC_TAPS": "0"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False [(0, True), (1, True), (2, True)]"
    r = run_python("import hostfeed", env={"HOSTFEED_SYNC_TAPS": "maybe"})
    assert r.returncode != 0
    assert "HOSTFEED_SYNC_TAPS='maybe' is not a boolean" in r.stderr


@pytest.mark.several_devices
def test_sync_taps_on_many_devices_per_device_and_global_view():
    r = run_python("""
        import jax, jax.numpy as jnp, numpy as np
        from jax.sharding import NamedSharding, PartitionSpec as P
        from hostfeed import host_callback as hcb
        seen = []
        tap = lambda v, tr, device: seen.append((device.id, np.asarray(v).tolist()))
        f = jax.pmap(lambda x: hcb.id_tap(tap, x, tap_with_device=True, sync=True))
        for i in range(10):
            f(jnp.arange(4) + i).block_until_ready()
            assert sorted(seen[-4:]) == [(d, d + i) for d in range(4)], seen[-4:]
        mesh = jax.make_mesh((4,), ("x",))
        x = jax.device_put(jnp.arange(8.0), NamedSharding(mesh, P("x")))
        g = jax.jit(lambda x: hcb.id_tap(tap, x * 2, tap_with_device=True, sync=True))
        for i in range(10):
            seen.clear()
            g(x + i).block_until_ready()
            assert seen == [(0, [2.0 * (k + i) for k in range(8)])], seen
        print("ok")
    """, env={"XLA_FLAGS": "--xla_force_host_platform_device_count=4"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip() == "ok"


def test_a_computation_with_sync_taps_inside_a_callback_is_refused_not_deadlocked():
    inner = jax.jit(lambda x: hcb.id_tap(lambda v, tr: None, x, sync=True))

    def outer(x, transforms):
        inner(x).block_until_ready()

    jax.jit(lambda x: hcb.id_tap(outer, x))(1.0)
    with pytest.raises(hcb.CallbackException,
                       match="a computation with synchronous taps was called from inside a "
                             "host callback"):
        hcb.barrier_wait()
