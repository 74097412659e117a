"""Every dtype hostfeed supports round-trips bit-exactly, including 0-d and 0-size arrays."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from hostfeed import host_callback as hcb

from conftest import skip_if_the_tpu_alters

DTYPES = [np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32,
          np.uint64, np.float16, ml_dtypes.bfloat16, np.float32, np.float64, np.complex64,
          np.complex128]
DTYPES += [getattr(ml_dtypes, n) for n in (
    "float8_e4m3fn", "float8_e5m2", "float8_e4m3b11fnuz", "float8_e4m3fnuz", "float8_e5m2fnuz",
    "float8_e3m4", "float8_e4m3", "float8_e8m0fnu") if hasattr(ml_dtypes, n)]

SHAPES = [(), (0,), (3, 0, 2), (7,), (2, 3, 5)]


@pytest.fixture
def x64():
    prev = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    try:
        yield
    finally:
        jax.config.update("jax_enable_x64", prev)


def random_array(dtype, shape, seed):
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    raw = rng.integers(0, 256, size=int(np.prod(shape)) * dt.itemsize, dtype=np.uint8)
    if dt == np.bool_:
        raw = raw % 2
    return raw.view(dt).reshape(shape)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_dtype_round_trips_bit_exactly_under_jit(x64, dtype, shape):
    skip_if_the_tpu_alters(dtype)
    x = random_array(dtype, shape, seed=hash((np.dtype(dtype).name, shape)) % 2**32)
    got = []
    jax.jit(lambda a: hcb.id_tap(lambda v, tr: got.append(v), a))(x)
    hcb.barrier_wait()
    (v,) = got
    assert v.dtype == np.dtype(dtype)
    assert v.shape == shape
    assert v.tobytes() == x.tobytes()


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_dtype_round_trips_eagerly_in_a_pytree(x64, dtype):
    xs = {"scalar": random_array(dtype, (), 1), "empty": random_array(dtype, (0, 4), 2),
          "matrix": random_array(dtype, (4, 3), 3)}
    got = []
    hcb.id_tap(lambda v, tr: got.append(v), xs)
    hcb.barrier_wait()
    for k, x in xs.items():
        assert got[0][k].dtype == x.dtype and got[0][k].shape == x.shape
        assert got[0][k].tobytes() == x.tobytes()


def test_received_arrays_are_aligned_and_writeable():
    got = []
    jax.jit(lambda a, b: hcb.id_tap(lambda v, tr: got.append(v), (a, b)))(
        jnp.ones(3, jnp.int8), jnp.ones(5, jnp.complex64))
    hcb.barrier_wait()
    a, b = got[0]
    assert a.flags.aligned and b.flags.aligned and b.flags.c_contiguous
    b[0] = 5  # the host owns its copy
    assert b[0] == 5
