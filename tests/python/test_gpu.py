"""Taps and calls on a GPU: CUDA (run with ``JAX_PLATFORMS=cuda``, see
``.ci/accelerators/gpu_check.sh``) or ROCm (``JAX_PLATFORMS=rocm``,
``.ci/accelerators/rocm_check.sh``; not
yet run on ROCm hardware); skipped elsewhere. The rest of the suite runs on the GPU too
there; these tests check what is particular to it: the handlers are registered, the device
never waits for a tap's host function, pinned buffers are reused, results come back in
stream order, failures keep the process alive.

Issue: "GPUs: taps and calls on CUDA devices, the device never waiting for Python".
"""
from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from hostfeed import host_callback as hcb
from hostfeed._src.transports import native

from conftest import GPU_KIND, ON_GPU, queue_bound

pytestmark = pytest.mark.skipif(
    not ON_GPU, reason="needs a GPU (JAX_PLATFORMS=cuda or JAX_PLATFORMS=rocm)")


def gpu(what):
    """This GPU's native function ``what`` (``hostfeed._src.transports.native``)."""
    return native.platform(GPU_KIND).status if what == "status" else getattr(
        native.platform(GPU_KIND).driver, what)


def test_gpu_handlers_are_registered_and_the_driver_answers():
    assert gpu("status")() is None
    assert gpu("driver_error")() is None
    version = gpu("driver_version")()
    # CUDA 12 is 12000; ROCm 5's HIP runtime 50000000 and more.
    assert version is not None and version >= (12000 if GPU_KIND == "cuda" else 50000000)
    assert jax.devices()[0].platform == "gpu"


def test_the_computation_finishes_while_the_tap_function_is_still_blocked():
    release = threading.Event()
    entered = threading.Event()

    def slow(x, transforms):
        entered.set()
        assert release.wait(60)

    f = jax.jit(lambda x: jnp.sum(hcb.id_tap(slow, x * 2)) + 1)
    out = f(jnp.ones(1024))
    out.block_until_ready()  # the device did not wait for the host function
    assert float(out) == 2049.0
    assert entered.wait(60)
    release.set()
    hcb.barrier_wait()


def test_values_and_order_of_many_taps_in_a_loop():
    got = []

    def body(i, c):
        c = c + 1.0
        return hcb.id_tap(lambda a, t: got.append(a.copy()), c)

    n = 500
    out = jax.jit(lambda x: lax.fori_loop(0, n, body, x))(jnp.zeros((3, 5)))
    hcb.barrier_wait()
    assert out.tolist() == np.full((3, 5), float(n)).tolist()
    assert [float(a[0, 0]) for a in got] == [float(i + 1) for i in range(n)]


def test_tap_with_device_names_the_gpu():
    got = []
    jax.jit(lambda x: hcb.id_tap(lambda a, t, *, device: got.append(device), x,
                                 tap_with_device=True))(jnp.int32(1))
    hcb.barrier_wait()
    assert got == [jax.devices()[0]]


def test_pinned_buffers_are_reused_in_steady_state():
    f = jax.jit(lambda x: hcb.id_tap(lambda a, t: None, x))
    x = jnp.ones(1 << 18)  # 1 MiB

    def rounds():
        for _ in range(30):
            f(x)
        hcb.barrier_wait()

    # A bound of 4 MiB keeps at most a few taps in flight, a peak the warm-up reaches.
    with queue_bound(4 << 20):
        rounds()
        rounds()
        before = gpu("pool_stats")()
        rounds()
        after = gpu("pool_stats")()
    assert after["blocks_taken"] >= before["blocks_taken"] + 30
    assert after["allocations"] == before["allocations"], (before, after)
    assert after["in_use_bytes"] == 0


def test_the_driver_is_the_library_xla_loaded():
    path = gpu("driver_path")()
    assert path is not None and ("libcuda" if GPU_KIND == "cuda" else "libamdhip64") in path, path
    assert gpu("driver_error")() is None  # on CUDA, includes the check against libcuda.so.1


def test_several_operands_of_one_tap_arrive_each_in_place():
    # Operands XLA may pack side by side on the device go in one copy; each must arrive
    # with its own values, whatever their sizes (multiples of 16 bytes or not).
    got = []

    def f(x):
        parts = (x[:8], x[8:12] * 2, x[12:13], x[13:] + 1)
        hcb.id_tap(lambda a, t: got.append([np.array(v) for v in a]), parts)
        return x

    x = jnp.arange(40, dtype=jnp.float32)
    jax.jit(f)(x)
    hcb.barrier_wait()
    want = [np.arange(8), np.arange(8, 12) * 2, [12], np.arange(13, 40) + 1]
    assert [v.tolist() for v in got[0]] == [np.asarray(w, np.float32).tolist() for w in want]


def test_a_tap_of_an_array_in_pinned_host_memory_arrives_intact():
    # Its operand is a host pointer: the copy must infer the direction.
    dev = jax.devices()[0]
    try:
        host = jax.sharding.SingleDeviceSharding(dev, memory_kind="pinned_host")
        x = jax.device_put(jnp.arange(1000, dtype=jnp.int32), host)
    except Exception as exc:  # noqa: BLE001 - a JAX without memory kinds here
        pytest.skip(f"no pinned_host memory kind: {exc}")
    got = []
    f = jax.jit(lambda v: hcb.id_tap(lambda a, t: got.append(a.copy()), v),
                in_shardings=host, out_shardings=host)
    f(x)
    hcb.barrier_wait()
    np.testing.assert_array_equal(got[0], np.arange(1000, dtype=np.int32))


def test_a_large_tap_arrives_intact():
    got = []
    x = jnp.arange(16 << 20, dtype=jnp.float32)  # 64 MiB
    jax.jit(lambda v: hcb.id_tap(lambda a, t: got.append(a.copy()), v * 2))(x)
    hcb.barrier_wait()
    np.testing.assert_array_equal(got[0], np.arange(16 << 20, dtype=np.float32) * 2)


def test_a_call_result_feeds_the_rest_of_the_computation():
    def host(a):
        return (a * 3).astype(np.int32)

    def f(x):
        y = hcb.call(host, x, result_shape=jax.ShapeDtypeStruct(x.shape, jnp.int32))
        return jnp.sum(y * 2)

    for n in (1, 7, 1 << 20):
        x = jnp.arange(n, dtype=jnp.float32)
        assert int(jax.jit(f)(x)) == int(np.sum((np.arange(n) * 3) * 2))


def test_a_failing_call_fails_the_computation_and_the_process_goes_on():
    def bad(a):
        raise ValueError("no result on the host")

    f = jax.jit(lambda x: hcb.call(bad, x, result_shape=x))
    with pytest.raises(Exception, match="no result on the host"):
        f(jnp.ones(3)).block_until_ready()
    with pytest.raises(hcb.CallbackException):
        hcb.barrier_wait()
    g = jax.jit(lambda x: hcb.call(lambda a: a + 1, x, result_shape=x))
    assert g(jnp.ones(3)).tolist() == [2.0, 2.0, 2.0]


@pytest.mark.skipif(ON_GPU and jax.local_device_count() < 2, reason="needs several GPUs")
def test_each_gpu_keeps_its_order_and_names_itself():
    got = []

    def record(a, transforms, *, device):
        got.append((device, int(a[0])))

    n = jax.local_device_count()

    def step(x):
        for k in range(20):
            x = hcb.id_tap(record, x + k, tap_with_device=True)
        return x

    jax.pmap(step)(jnp.arange(n, dtype=jnp.int32)[:, None] * 1000)
    hcb.barrier_wait()
    for i, d in enumerate(jax.local_devices()):
        mine = [v for dev, v in got if dev == d]
        expected, v = [], i * 1000
        for k in range(20):
            v += k
            expected.append(v)
        assert mine == expected, d
