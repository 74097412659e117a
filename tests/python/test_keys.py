"""Typed PRNG keys in taps and calls.

The host receives a key as its key data (the numpy array ``jax.random.key_data`` gives);
the computation gets the typed key back, from the identity, from ``result=`` and from a
``call`` whose ``result_shape`` has a key dtype. Other extended dtypes are refused with a
``TypeError`` that names the leaf and its dtype.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from hostfeed import host_callback as hcb

B0 = ("batch", {"batch_dims": (0,)})
JVP, TRANSPOSE = ("jvp", {}), ("transpose", {})

IMPLS = ["threefry2x32", "rbg"]


class Rec:
    def __init__(self):
        self.calls = []

    def __call__(self, arg, transforms):
        self.calls.append((arg, transforms))

    def run(self, fn, *args):
        self.calls = []
        out = fn(*args)
        hcb.barrier_wait()
        return out, self.calls


def data(k):
    return np.asarray(jax.random.key_data(k))


def assert_same_keys(got, want):
    assert got.dtype == want.dtype  # the typed key, with its implementation
    assert jnp.issubdtype(got.dtype, jax.dtypes.prng_key)
    assert got.shape == want.shape
    np.testing.assert_array_equal(data(got), data(want))


def assert_host_data(received, key):
    assert isinstance(received, np.ndarray)
    assert received.dtype == np.uint32
    np.testing.assert_array_equal(received, data(key))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("staging", ["eager", "jit"])
def test_tap_of_a_key_sends_its_data_and_returns_the_key(impl, staging):
    rec = Rec()
    key = jax.random.key(7, impl=impl)
    f = (lambda k: hcb.id_tap(rec, k))
    out, calls = rec.run(f if staging == "eager" else jax.jit(f), key)
    assert_same_keys(out, key)
    [(received, transforms)] = calls
    assert transforms == ()
    assert_host_data(received, key)


def test_issue_example_result_is_the_typed_key():
    rec = Rec()
    key = jax.random.key(0)
    out, calls = rec.run(jax.jit(lambda k: hcb.id_tap(rec, k, result=k)), key)
    assert_same_keys(out, key)
    assert_host_data(calls[0][0], key)


def test_legacy_prng_key_under_enable_custom_prng():
    rec = Rec()
    with jax.enable_custom_prng():
        key = jax.random.PRNGKey(3)
        out, calls = rec.run(jax.jit(lambda k: hcb.id_tap(rec, k, result=k)), key)
    assert jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
    assert_same_keys(out, key)
    assert_host_data(calls[0][0], key)


def test_keys_in_a_pytree_with_arrays_and_as_result():
    rec = Rec()
    k1, k2 = jax.random.key(1), jax.random.key(2, impl="rbg")
    x = jnp.arange(3.0)

    @jax.jit
    def f(k1, k2, x):
        tree = hcb.id_tap(rec, {"a": k1, "b": (x, k2)})
        y = hcb.id_tap(rec, x * 2, result=(k2, x))
        return tree, y

    (tree, (rk2, rx)), calls = rec.run(f, k1, k2, x)
    assert_same_keys(tree["a"], k1)
    assert_same_keys(tree["b"][1], k2)
    assert_same_keys(rk2, k2)
    assert rx.tolist() == tree["b"][0].tolist() == [0.0, 1.0, 2.0]
    sent, _ = calls[0]
    assert_host_data(sent["a"], k1)
    assert_host_data(sent["b"][1], k2)
    assert sent["b"][0].tolist() == [0.0, 1.0, 2.0]
    assert calls[1][0].tolist() == [0.0, 2.0, 4.0]


def test_tapped_keys_still_draw_the_same_numbers():
    key = jax.random.key(11)
    f = jax.jit(lambda k: jax.random.normal(hcb.id_tap(lambda *a: None, k), (3,)))
    assert f(key).tolist() == jax.random.normal(key, (3,)).tolist()


def test_vmap_of_a_tapped_key():
    rec = Rec()
    keys = jax.random.split(jax.random.key(0), 3)
    out, calls = rec.run(jax.vmap(lambda k: hcb.id_tap(rec, k)), keys)
    assert_same_keys(out, keys)
    [(received, transforms)] = calls
    assert transforms == (B0,)
    assert_host_data(received, keys)


def test_scan_taps_each_key():
    rec = Rec()
    keys = jax.random.split(jax.random.key(5), 3)
    (_, ys), calls = rec.run(jax.jit(lambda ks: lax.scan(
        lambda c, k: (c, hcb.id_tap(rec, k)), 0, ks)), keys)
    assert_same_keys(ys, keys)
    assert [t for _, t in calls] == [()] * 3
    for (received, _), k in zip(calls, keys):
        assert_host_data(received, k)


def test_key_in_the_carry_of_a_while_loop_with_a_tapped_predicate_under_vmap():
    rec = Rec()

    def g(stop, key):
        def cond(c):
            return hcb.id_tap(rec, c[0]) < stop

        def body(c):
            return c[0] + 1, jax.random.fold_in(c[1], c[0])

        return lax.while_loop(cond, body, (0, key))

    stops = jnp.array([0, 2, 1])
    keys = jax.random.split(jax.random.key(9), 3)
    (n, out), calls = rec.run(jax.vmap(g), stops, keys)
    assert n.tolist() == [0, 2, 1]
    want = [keys[0], jax.random.fold_in(jax.random.fold_in(keys[1], 0), 1),
            jax.random.fold_in(keys[2], 0)]
    for got, w in zip(out, want):
        assert_same_keys(got, w)
    assert [c.tolist() for c, _ in calls] == [[0, 0, 0], [0, 1, 1], [0, 2, 1]]


def test_grad_of_a_function_that_taps_a_key_alongside_floats(mode):
    rec = Rec()
    key = jax.random.key(4)

    def f(x, k):
        y, k2 = hcb.id_tap(rec, (x * 2.0, k))
        return y * jax.random.uniform(k2)

    u = float(jax.random.uniform(key))
    g, calls = rec.run(jax.grad(f), 1.5, key)
    assert float(g) == pytest.approx(2.0 * u)
    (fwd, fwd_tr), *back = calls
    assert fwd_tr == ()
    assert float(fwd[0]) == 3.0
    assert_host_data(fwd[1], key)
    if mode == "primals":
        assert back == []
    else:
        [(cts, tr)] = back
        assert tr == (JVP, TRANSPOSE)
        assert float(cts[0]) == pytest.approx(u)
        # Keys have no tangent (float0): their key data's cotangent arrives as bool zeros.
        assert cts[1].dtype == np.bool_ and cts[1].shape == (2,) and not cts[1].any()


def test_call_with_key_arguments_and_a_key_result():
    seen = []
    key = jax.random.key(21, impl="rbg")

    def host(arg):
        k, x = arg
        seen.append(k)
        return (k[::-1].copy(), x + 1)  # key data for the key result

    f = jax.jit(lambda k, x: hcb.call(host, (k, x), result_shape=(k, x)))
    new_key, y = f(key, jnp.float32(1.0))
    assert float(y) == 2.0
    assert new_key.dtype == key.dtype
    np.testing.assert_array_equal(data(new_key), data(key)[::-1])
    assert_host_data(seen[0], key)


def test_call_result_shape_with_a_shape_dtype_struct_of_keys():
    template = jax.random.split(jax.random.key(0), 2)
    spec = jax.ShapeDtypeStruct(template.shape, template.dtype)
    out = jax.jit(lambda x: hcb.call(
        lambda v: np.stack([np.full(2, v, np.uint32), np.full(2, v + 1, np.uint32)]),
        x, result_shape=spec))(jnp.uint32(5))
    assert out.dtype == template.dtype and out.shape == (2,)
    assert data(out).tolist() == [[5, 5], [6, 6]]


def test_call_key_result_of_the_wrong_shape_fails_clearly():
    key = jax.random.key(0)
    f = jax.jit(lambda k: hcb.call(lambda d: np.zeros(3, np.uint32), k, result_shape=k))
    # A key result is transferred as its key data: the message names that type.
    with pytest.raises(Exception, match=r"abstract values uint32\[2\] but returned "
                                        r"uint32\[3\]"):
        f(key).block_until_ready()
    with pytest.raises(hcb.CallbackException):
        hcb.barrier_wait()


def test_vmap_of_call_with_keys():
    seen = []
    keys = jax.random.split(jax.random.key(2), 3)

    def host(k):
        seen.append(k)
        return k

    out = jax.vmap(lambda k: hcb.call(host, k, result_shape=jax.ShapeDtypeStruct(
        (), k.dtype)))(keys)
    hcb.barrier_wait()
    assert_same_keys(out, keys)
    assert len(seen) == 3
    for received, k in zip(seen, keys):
        assert_host_data(received, k)


def test_id_print_of_a_key_prints_its_data():
    import io

    s = io.StringIO()
    jax.jit(lambda k: hcb.id_print(k, what="key", output_stream=s))(jax.random.key(0))
    hcb.barrier_wait()
    assert s.getvalue() == "what: key\n[0 0]\n"


def _semaphore_dtype():
    pltpu = pytest.importorskip("jax.experimental.pallas.tpu")
    dtype = pltpu.SemaphoreType.REGULAR.dtype
    assert jax.dtypes.issubdtype(dtype, jax.dtypes.extended)
    assert not jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)
    return dtype


def test_other_extended_dtypes_are_refused_naming_the_leaf_and_dtype():
    dtype = _semaphore_dtype()
    spec = jax.ShapeDtypeStruct((2,), dtype)
    with pytest.raises(TypeError, match=r"id_tap: leaf 1 of `arg` has the extended dtype "
                                        r"semaphore"):
        jax.make_jaxpr(lambda s: hcb.id_tap(lambda *a: None, (1.0, s)))(spec)
    with pytest.raises(TypeError, match=r"id_tap: leaf 0 of `result` has the extended "
                                        r"dtype semaphore"):
        jax.make_jaxpr(lambda s: hcb.id_tap(lambda *a: None, 1.0, result=s))(spec)
    with pytest.raises(TypeError, match=r"call: leaf 2 of `arg` has the extended dtype "
                                        r"semaphore"):
        jax.make_jaxpr(lambda s: hcb.call(lambda *a: None, (1.0, 2.0, s)))(spec)
    with pytest.raises(TypeError, match=r"hcb.call: leaf 0 of `result_shape` has the "
                                        r"extended dtype semaphore"):
        hcb.call(lambda *a: None, 1.0, result_shape=spec)
