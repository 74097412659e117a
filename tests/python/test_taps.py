"""id_tap / id_print values and order: eager, jit, nested jit, control flow, pytrees."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from hostfeed import host_callback as hcb

from conftest import ON_TPU


class Recorder:
    """A tap function that records (tag, value as Python data, transforms)."""

    def __init__(self):
        self.calls = []

    def __call__(self, tag):
        def tap(arg, transforms):
            self.calls.append((tag, jax.tree_util.tree_map(lambda a: a.tolist(), arg),
                               transforms))
        return tap

    def values(self, tag=None):
        return [v for t, v, _ in self.calls if tag is None or t == tag]

    def tags(self):
        return [t for t, _, _ in self.calls]


def test_eager_tap_returns_arg_and_calls_host():
    rec = Recorder()
    y = hcb.id_tap(rec("x"), jnp.arange(3.0))
    hcb.barrier_wait()
    np.testing.assert_array_equal(y, [0.0, 1.0, 2.0])
    assert rec.calls == [("x", [0.0, 1.0, 2.0], ())]


def test_eager_python_scalar_and_numpy_args():
    rec = Recorder()
    hcb.id_tap(rec("s"), 3)
    hcb.id_tap(rec("n"), np.float32(1.5))
    hcb.id_tap(rec("a"), np.array([[1, 2]], dtype=np.int16))
    hcb.barrier_wait()
    assert rec.calls == [("s", 3, ()), ("n", 1.5, ()), ("a", [[1, 2]], ())]


def test_jit_tap_values_and_result():
    rec = Recorder()

    @jax.jit
    def f(x):
        y = hcb.id_tap(rec("y"), x * 2)
        return y + 1

    np.testing.assert_array_equal(f(jnp.arange(3.0)), [1.0, 3.0, 5.0])
    hcb.barrier_wait()
    assert rec.values() == [[0.0, 2.0, 4.0]]


def test_tap_runs_when_output_unused():
    rec = Recorder()

    @jax.jit
    def f(x):
        hcb.id_tap(rec("unused"), x)
        return x + 1

    f(1.0)
    hcb.barrier_wait()
    assert rec.values() == [1.0]


def test_result_is_returned_and_tap_still_runs():
    rec = Recorder()

    @jax.jit
    def f(x):
        r = hcb.id_tap(rec("x"), x, result=(x * 3, {"k": x + 1}))
        return r

    r0, r1 = f(2.0)
    hcb.barrier_wait()
    assert float(r0) == 6.0 and float(r1["k"]) == 3.0
    assert rec.values() == [2.0]


def test_id_print_result_returns_result():
    import io
    s = io.StringIO()
    out = jax.jit(lambda x: hcb.id_print(x, result=x * 10, output_stream=s))(jnp.int32(4))
    hcb.barrier_wait()
    assert int(out) == 40
    assert s.getvalue() == "4\n"


def test_nested_jit_in_program_order():
    rec = Recorder()
    inner = jax.jit(lambda x: hcb.id_tap(rec("inner"), x + 1))

    @jax.jit
    def outer(x):
        x = hcb.id_tap(rec("before"), x)
        x = inner(x)
        x = inner(x)
        return hcb.id_tap(rec("after"), x * 2)

    assert float(outer(1.0)) == 6.0
    hcb.barrier_wait()
    assert rec.calls == [("before", 1.0, ()), ("inner", 2.0, ()), ("inner", 3.0, ()),
                         ("after", 6.0, ())]


@pytest.mark.parametrize("pred_value, expected", [(1.0, "true"), (-1.0, "false")])
def test_cond_taps_only_taken_branch(pred_value, expected):
    rec = Recorder()

    @jax.jit
    def f(x):
        return lax.cond(x > 0, lambda v: hcb.id_tap(rec("true"), v * 2),
                        lambda v: hcb.id_tap(rec("false"), v * 3), x)

    f(pred_value)
    hcb.barrier_wait()
    assert rec.tags() == [expected]


def test_while_loop_body_and_predicate_in_order():
    rec = Recorder()

    @jax.jit
    def f(x):
        def cond(c):
            hcb.id_tap(rec("pred"), c[0])
            return c[0] < 3

        def body(c):
            i, v = c
            hcb.id_tap(rec("body"), (i, v))
            return i + 1, v * 2

        return lax.while_loop(cond, body, (0, x))

    i, v = f(1.0)
    hcb.barrier_wait()
    assert (int(i), float(v)) == (3, 8.0)
    assert rec.calls == [
        ("pred", 0, ()), ("body", (0, 1.0), ()),
        ("pred", 1, ()), ("body", (1, 2.0), ()),
        ("pred", 2, ()), ("body", (2, 4.0), ()),
        ("pred", 3, ()),
    ]


def test_scan_taps_every_iteration_in_order():
    rec = Recorder()

    def step(c, a):
        hcb.id_tap(rec("scan"), {"carry": c, "x": a})
        return c + a, c * a

    c, ys = jax.jit(lambda xs: lax.scan(step, 0.0, xs))(jnp.arange(4.0))
    hcb.barrier_wait()
    assert float(c) == 6.0
    assert rec.values() == [{"carry": 0.0, "x": 0.0}, {"carry": 0.0, "x": 1.0},
                            {"carry": 1.0, "x": 2.0}, {"carry": 3.0, "x": 3.0}]


def test_fori_loop_with_result():
    rec = Recorder()

    @jax.jit
    def f(x):
        return lax.fori_loop(0, 5, lambda i, c: hcb.id_tap(rec("i"), i, result=c + i), x)

    assert int(f(0)) == 10
    hcb.barrier_wait()
    assert rec.values() == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("arg, expected", [
    ((1, 2.0), (1, 2.0)),
    ([np.int32(3), (4.0, 5.0)], [3, (4.0, 5.0)]),
    ({"b": 2, "a": [1.0, {"c": 3}]}, {"a": [1.0, {"c": 3}], "b": 2}),
    (((), [], {}), ((), [], {})),
])
def test_pytree_args_round_trip(arg, expected):
    got = []
    out = jax.jit(lambda t: hcb.id_tap(lambda a, tr: got.append(a), t))(arg)
    hcb.barrier_wait()
    assert jax.tree_util.tree_structure(out) == jax.tree_util.tree_structure(arg)
    assert len(got) == 1
    assert jax.tree_util.tree_map(lambda a: a.tolist(), got[0]) == expected


def test_tap_func_receives_numpy_arrays():
    got = []
    jax.jit(lambda x: hcb.id_tap(lambda a, tr: got.append(a), x))(jnp.ones((2, 3), jnp.int32))
    hcb.barrier_wait()
    assert isinstance(got[0], np.ndarray)
    assert got[0].shape == (2, 3) and got[0].dtype == np.int32


def test_tap_with_device_passes_the_device():
    got = []

    def tap(a, transforms, *, device):
        got.append((a.tolist(), device))

    jax.jit(lambda x: hcb.id_tap(tap, x, tap_with_device=True))(jnp.float32(1.0))
    hcb.barrier_wait()
    assert got == [(1.0, jax.devices()[0])]


def test_ten_thousand_taps_arrive_complete_and_in_order():
    got = []

    @jax.jit
    def f(x):
        return lax.fori_loop(0, 10_000, lambda i, c: hcb.id_tap(
            lambda a, tr: got.append(int(a)), i, result=c + 1), x)

    assert int(f(0)) == 10_000
    hcb.barrier_wait()
    assert got == list(range(10_000))


def test_taps_from_two_computations_keep_dispatch_order():
    got = []
    f = jax.jit(lambda x: hcb.id_tap(lambda a, tr: got.append(("f", int(a))), x))
    g = jax.jit(lambda x: hcb.id_tap(lambda a, tr: got.append(("g", int(a))), x))
    for i in range(20):
        f(i)
        g(i)
    hcb.barrier_wait()
    assert got == [(n, i) for i in range(20) for n in ("f", "g")]


def test_ahead_of_time_compiled_function_taps_on_every_call_in_order():
    """``jit(f).lower(x).compile()``: every call of the compiled object passes the effect's
    token (JAX's C++ fast path for compiled objects forgot ordered effects, so the second
    call failed with "Execution supplied 1 arguments but compiled program expected 2")."""
    got = []
    f = jax.jit(lambda x: hcb.id_tap(lambda a, tr: got.append(("aot", int(a))), x) + 1)
    g = jax.jit(lambda x: hcb.id_tap(lambda a, tr: got.append(("jit", int(a))), x))
    co = f.lower(jnp.int32(0)).compile()
    outs = []
    for i in range(5):
        outs.append(int(co(jnp.int32(i))))
        g(jnp.int32(i))
    hcb.barrier_wait()
    assert outs == [1, 2, 3, 4, 5]
    assert got == [(n, i) for i in range(5) for n in ("aot", "jit")]


def test_dispatches_alternating_between_computations_keep_order_with_tokens_reused():
    """The effect's token passed on as it is between dispatches (the dispatch fast path)
    still orders taps: many short computations, interleaved with eager taps."""
    got = []
    f = jax.jit(lambda x: hcb.id_tap(lambda a, tr: got.append(("f", int(a))), x))
    for i in range(200):
        f(jnp.int32(i))
        hcb.id_tap(lambda a, tr: got.append(("eager", int(a))), i)
    hcb.barrier_wait()
    assert got == [(n, i) for i in range(200) for n in ("f", "eager")]


def test_second_call_does_not_recompile():
    traces = []

    @jax.jit
    def f(x):
        traces.append(1)
        return hcb.id_tap(lambda a, tr: None, x)

    f(1.0)
    f(2.0)
    hcb.barrier_wait()
    assert len(traces) == 1
    assert f._cache_size() == 1


def test_not_callable_tap_func_is_rejected():
    with pytest.raises(TypeError, match="tap_func must be callable"):
        hcb.id_tap(42, 1.0)


def test_non_jax_leaf_is_rejected():
    with pytest.raises(TypeError, match="leaf 1 of `arg` has type str"):
        hcb.id_tap(lambda a, tr: None, (1.0, "text"))


def test_unsupported_dtype_is_rejected_at_trace_time():
    with pytest.raises(TypeError, match="dtype int4"):
        jax.jit(lambda x: hcb.id_tap(lambda a, tr: None, x.astype(jnp.int4)))(jnp.ones(4))


def test_unknown_keyword_is_rejected_with_the_legacy_message():
    with pytest.raises(TypeError) as e:
        hcb.id_tap(lambda a, tr: None, 1.0, y=2)
    # The legacy sentence, word for word (existing code and tests match on it).
    assert "Support for **kwargs in ``id_tap`` has been removed" in str(e.value)
    assert "functools.partial(tap_func, **kwargs)" in str(e.value)
    assert "['y']" in str(e.value)


def test_negative_device_index_is_rejected():
    with pytest.raises(ValueError, match="device_index"):
        hcb.id_tap(lambda a, tr: None, 1.0, device_index=-1)


@pytest.mark.skipif(ON_TPU, reason="about XLA CPU's fusion and the add-dependency a TPU cannot "
                    "compile (there 12 taps compiled 15 sines; compile time: the bench)")
def test_taps_along_an_elementwise_chain_compile_each_op_once():
    """XLA CPU's fusion duplicates a chain of elementwise ops into every side consumer;
    when the tapped values are used, the taps' outputs carry a dependency on the tap, so
    each op is compiled once, not once per later tap (compile time was quadratic)."""
    n = 12

    def f(y):
        for i in range(n):
            y = hcb.id_tap(lambda a, tr: None, jnp.sin(y) * 1.5 + i)
        return y

    text = jax.jit(f).lower(jnp.arange(4.0)).compile().as_text()
    assert text.count(" sine(") == n


@pytest.mark.skipif(ON_TPU, reason="about XLA CPU's fusion and the add-dependency a TPU cannot "
                    "compile (there 12 taps compiled 15 sines; compile time: the bench)")
def test_ignored_taps_along_an_elementwise_chain_compile_each_op_once():
    """``id_print(y)`` with the result unused, as legacy code prints: later ops read the
    tap's output (the same value, ordered after the tap), so XLA CPU's fusion does not
    duplicate the chain that produced it into every later op and tap (200 such taps
    compiled 8x slower than with the results used); values and taps are unchanged."""
    n = 12
    got = []

    def f(y):
        for i in range(n):
            y = jnp.sin(y) * 1.5 + i
            hcb.id_tap(lambda a, tr, i=i: got.append((i, a.tolist())), y)
        return y

    def plain(y):
        for i in range(n):
            y = jnp.sin(y) * 1.5 + i
        return y

    x = jnp.arange(4.0)
    compiled = jax.jit(f).lower(x).compile()
    assert compiled.as_text().count(" sine(") == n
    np.testing.assert_allclose(compiled(x), jax.jit(plain)(x), rtol=1e-6)
    hcb.barrier_wait()
    assert [i for i, _ in got] == list(range(n))
    y = x
    for i, v in got:
        y = jnp.sin(y) * 1.5 + i
        np.testing.assert_allclose(v, y, rtol=1e-5)


def test_ignored_tap_in_a_loop_body_and_a_branch_keeps_values_and_order():
    """Later uses redirected to a tap's output inside a loop body and a cond branch."""
    got = []

    def body(i, c):
        y = jnp.sin(c) + i
        hcb.id_tap(lambda a, tr: got.append(("body", float(a))), y)
        z = lax.cond(y > 0, lambda v: v * 2.0, lambda v: v - 1.0, y)
        hcb.id_tap(lambda a, tr: got.append(("after", float(a))), z)
        return z + y

    out = jax.jit(lambda c: lax.fori_loop(0, 4, body, c))(jnp.float32(0.5))
    expect, c = [], 0.5
    for i in range(4):
        y = np.sin(np.float32(c)) + i
        z = y * 2.0 if y > 0 else y - 1.0
        expect += [("body", y), ("after", z)]
        c = z + y
    hcb.barrier_wait()
    assert [t for t, _ in got] == [t for t, _ in expect]
    np.testing.assert_allclose([v for _, v in got], [v for _, v in expect], rtol=1e-5)
    np.testing.assert_allclose(float(out), c, rtol=1e-5)


def test_a_batch_mixing_taps_calls_and_failures_runs_each_once_in_program_order():
    # The dispatcher runs runs of plain taps in Rust and everything else in Python: taps of
    # several functions, taps with the device, calls and a failing tap interleave in one
    # loop, and each runs once, in program order; the failure is raised by barrier_wait
    # and does not stop the taps after it.
    seen = []

    def plain(tag):
        return lambda a, transforms: seen.append((tag, int(a)))

    def with_device(a, transforms, *, device):
        seen.append(("dev", int(a)))

    def host_call(a):
        seen.append(("call", int(a)))
        return a + 1

    def fails(a, transforms):
        seen.append(("fails", int(a)))
        if int(a) == 3:
            raise ValueError("tap 3 failed")

    @jax.jit
    def f(x):
        def body(i, x):
            x = hcb.id_tap(plain("a"), x)
            x = hcb.id_tap(plain("b"), x)
            x = hcb.id_tap(with_device, x, tap_with_device=True)
            x = hcb.id_tap(fails, x)
            x = hcb.id_tap(plain("a"), x)
            return hcb.call(host_call, x, result_shape=x)
        return lax.fori_loop(0, 6, body, x)

    assert int(f(jnp.int32(0))) == 6
    with pytest.raises(hcb.CallbackException) as info:
        hcb.barrier_wait()
    assert "tap 3 failed" in str(info.value.__cause__ or info.value)
    expected = [(tag, i) for i in range(6)
                for tag in ("a", "b", "dev", "fails", "a", "call")]
    assert seen == expected


def test_callbacks_that_describe_alike_get_the_ids_probing_from_zero_would_give(monkeypatch):
    """Consumer ids depend on what a callback describes and on how many alike are
    registered (JAX's persistent cache shares compiled code by them): registering many
    lambdas of one line probes from the first attempt that may be free, not from zero
    (quadratic in their number: 200 taps of one line spent a fifth of their lowering
    there), and gets the same ids; a released id is taken again first, as probing from
    zero would."""
    from hostfeed._src import consumers

    def key():
        return (lambda a, tr: None, "tap", "test_taps describe alike")  # a fresh lambda

    def fresh():
        return consumers.Consumer(lambda arrays, ordinal: None, "alike",
                                  consumers.ConsumerKind.TAP)

    keys = [key() for _ in range(6)]
    description = consumers._describe(keys[0])
    assert all(consumers._describe(k) == description for k in keys)  # alike
    candidate = consumers._id_candidate
    tried = []
    monkeypatch.setattr(consumers, "_id_candidate",
                        lambda d, attempt: tried.append(attempt) or candidate(d, attempt))
    leases = [consumers.register(k, fresh) for k in keys]
    assert [lease.cid for lease in leases] == [candidate(description, i) for i in range(6)]
    assert tried == list(range(6)), "one candidate tried per registration"
    # The second one's last lease dies and the barrier releases it: the next alike
    # callback takes its id again, then the next one the first id after the six.
    freed = leases[1].cid
    del leases[1]
    hcb.barrier_wait()
    assert freed not in consumers.registry.keys
    assert consumers.register(key(), fresh).cid == freed
    assert consumers.register(key(), fresh).cid == candidate(description, 6)


@pytest.mark.skipif(ON_TPU, reason="a TPU's taps emit no add-dependency")
def test_the_taps_of_a_computations_body_redirect_later_uses_in_one_walk(monkeypatch):
    """Each tap of a jitted body once left the redirect of later uses to a walk of the
    whole body (quadratic lowering in the taps of one block); the walk is now made once,
    at the end of the computation's token scope, for every dependency in the body, and a
    later use still reads the tap's output (the chain compiles each op once)."""
    from hostfeed._src import lowering

    walked = []
    redirect = lowering._redirect_uses_after
    monkeypatch.setattr(lowering, "_redirect_uses_after",
                        lambda dep: walked.append(1) or redirect(dep))  # keep no op
    n = 20

    def f(y):
        for i in range(n):
            y = jnp.sin(y) * 1.5 + i
            hcb.id_tap(lambda a, tr: None, y)  # the result ignored: later ops read y
        return y

    text = jax.jit(f).lower(jnp.arange(4.0)).compile().as_text()
    assert len(walked) == n  # one redirect per dependency, not one per earlier tap per tap
    assert text.count(" sine(") == n
