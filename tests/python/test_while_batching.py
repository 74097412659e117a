"""``vmap`` of ``while_loop`` whose predicate taps or calls the host.

JAX 0.10-0.12 lower a while loop whose cond function has an ordered effect by ORing a
batched predicate into one, with no per-lane select, so hostfeed batches such loops itself
(``rules._while_batching``). Semantics checked here, lane by lane:

* results equal the same function without taps and a Python loop over the lanes;
* every iteration, every lane computes the body (body taps see all lanes); lanes that are
  done then keep their carry;
* the cond's taps run once before the loop and once per iteration, with the batched
  carry, where a lane that is done shows its final carry again.
"""
from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.extend.core.primitives import while_p
from jax.interpreters import batching

from hostfeed import host_callback as hcb
from hostfeed._src import rules

from conftest import run_python

JVP = ("jvp", {})


def batch(*dims):
    return ("batch", {"batch_dims": tuple(dims)})


B0 = batch(0)


def tolist(tree):
    return jax.tree_util.tree_map(lambda a: np.asarray(a).tolist(), tree)


class Rec:
    """Records ``(tag, value as Python data, transforms)`` for every tap, in order."""

    def __init__(self):
        self.calls = []

    def tap(self, tag):
        return lambda arg, transforms: self.calls.append((tag, tolist(arg), transforms))

    def run(self, fn, *args):
        self.calls = []
        out = fn(*args)
        hcb.barrier_wait()
        return out, self.calls


def no_tap(arg, transforms):
    del arg, transforms


def python_while(cond, body, carry):
    """The reference: an unbatched loop in plain Python, for one lane."""
    while cond(carry):
        carry = body(carry)
    return carry


def lockstep(cond, body, lanes):
    """What the batched loop computes and taps, in plain Python over the lanes: the carries
    the cond sees before the loop and after each iteration, and the body's results (for
    every lane) in each iteration."""
    preds = [bool(cond(c)) for c in lanes]
    cond_seen, body_seen = [list(lanes)], []
    while any(preds):
        new = [body(c) for c in lanes]
        body_seen.append(new)
        lanes = [n if p else c for n, p, c in zip(new, preds, lanes)]
        preds = [bool(cond(c)) for c in lanes]
        cond_seen.append(list(lanes))
    return lanes, cond_seen, body_seen


def stack(lanes):
    """Per-lane pytrees (of Python values) -> one pytree of lists (lanes first)."""
    return jax.tree_util.tree_map(lambda *xs: list(xs), *lanes)


# ---------------------------------------------------------------------------------------
# The example, exactly.

def test_tapped_predicate_stops_each_lane_where_an_unbatched_loop_would():
    def g(x):
        return lax.while_loop(lambda c: hcb.id_tap(no_tap, c < 2), lambda c: c + 1, x)

    x = np.arange(4, dtype=np.int32)
    out = jax.vmap(g)(x)
    hcb.barrier_wait()
    assert out.tolist() == [2, 2, 2, 3]
    untapped = jax.vmap(lambda x: lax.while_loop(lambda c: c < 2, lambda c: c + 1, x))(x)
    assert out.tolist() == untapped.tolist()
    assert out.tolist() == [python_while(lambda c: c < 2, lambda c: c + 1, int(v)) for v in x]


def test_tapped_predicate_records_exactly():
    rec = Rec()

    def g(x):
        return lax.while_loop(lambda c: hcb.id_tap(rec.tap("cond"), c < 2),
                              lambda c: hcb.id_tap(rec.tap("body"), c + 1), x)

    out, calls = rec.run(jax.vmap(g), np.arange(4, dtype=np.int32))
    assert out.tolist() == [2, 2, 2, 3]
    assert calls == [
        ("cond", [True, True, False, False], (B0,)),
        ("body", [1, 2, 3, 4], (B0,)),  # every lane computes the body ...
        ("cond", [True, False, False, False], (B0,)),  # ... lanes that are done keep theirs
        ("body", [2, 3, 3, 4], (B0,)),
        ("cond", [False, False, False, False], (B0,)),
    ]


def test_cond_taps_see_each_lanes_carry_and_body_taps_all_lanes():
    rec = Rec()

    def cond(c):
        return hcb.id_tap(rec.tap("cond"), c) < 2

    def g(x):
        return lax.while_loop(cond, lambda c: hcb.id_tap(rec.tap("body"), c + 1), x)

    x = np.arange(4, dtype=np.int32)
    out, calls = rec.run(jax.vmap(g), x)
    lanes, cond_seen, body_seen = lockstep(lambda c: c < 2, lambda c: c + 1,
                                           [int(v) for v in x])
    assert out.tolist() == lanes == [2, 2, 2, 3]
    assert cond_seen == [[0, 1, 2, 3], [1, 2, 2, 3], [2, 2, 2, 3]]
    assert body_seen == [[1, 2, 3, 4], [2, 3, 3, 4]]
    expected = [("cond", cond_seen[0], (B0,))]
    for b, c in zip(body_seen, cond_seen[1:]):
        expected += [("body", b, (B0,)), ("cond", c, (B0,))]
    assert calls == expected


# ---------------------------------------------------------------------------------------
# Carries of several kinds.

def collatz_cond(c):
    n, steps, _ = c
    return (n != 1) & (steps < 20)


def collatz_body(c):
    n, steps, total = c
    return (jnp.where(n % 2 == 0, n // 2, 3 * n + 1), steps + 1, total + n * 0.5)


def py_collatz_body(c):
    n, steps, total = c
    return (n // 2 if n % 2 == 0 else 3 * n + 1, steps + 1, total + n * 0.5)


def test_several_carries_of_different_dtypes():
    rec = Rec()

    def cond(c):
        return collatz_cond(hcb.id_tap(rec.tap("cond"), c))

    def body(c):
        return hcb.id_tap(rec.tap("body"), collatz_body(c))

    def g(n):
        return lax.while_loop(cond, body, (n, jnp.int32(0), jnp.float32(0)))

    def g_plain(n):
        return lax.while_loop(collatz_cond, collatz_body, (n, jnp.int32(0), jnp.float32(0)))

    ns = np.array([1, 6, 7, 3, 2], np.int32)
    out, calls = rec.run(jax.vmap(g), ns)
    plain = jax.vmap(g_plain)(ns)
    assert tolist(out) == tolist(plain)
    start = [(int(n), 0, 0.0) for n in ns]
    lanes, cond_seen, body_seen = lockstep(collatz_cond, py_collatz_body, start)
    assert tolist(out) == stack(lanes)
    assert stack(lanes) == stack([python_while(collatz_cond, py_collatz_body, c)
                                  for c in start])
    expected = [("cond", list(stack(cond_seen[0])), (batch(0, 0, 0),))]
    for b, c in zip(body_seen, cond_seen[1:]):
        expected += [("body", list(stack(b)), (batch(0, 0, 0),)),
                     ("cond", list(stack(c)), (batch(0, 0, 0),))]
    assert [(t, list(v), tr) for t, v, tr in calls] == expected


def test_pytree_carry():
    rec = Rec()

    def cond(c):
        c = hcb.id_tap(rec.tap("cond"), c)
        return c["i"] < c["stop"][0]

    def body(c):
        return {"i": c["i"] + 1, "acc": (c["acc"][0] * 2.0, c["acc"][1] + c["i"]),
                "stop": c["stop"]}

    def g(stop, x):
        init = {"i": jnp.int32(0), "acc": (x, jnp.zeros(2, jnp.int32)), "stop": (stop,)}
        return lax.while_loop(cond, body, init)

    stops = np.array([0, 3, 1], np.int32)
    xs = np.array([1.0, 1.5, -2.0], np.float32)
    out, calls = rec.run(jax.vmap(g), stops, xs)
    plain = jax.vmap(lambda s, x: lax.while_loop(
        lambda c: c["i"] < c["stop"][0], body,
        {"i": jnp.int32(0), "acc": (x, jnp.zeros(2, jnp.int32)), "stop": (s,)}))(stops, xs)
    assert tolist(out) == tolist(plain)
    assert tolist(out) == {"acc": ([1.0, 12.0, -4.0], [[0, 0], [3, 3], [0, 0]]),
                           "i": [0, 3, 1], "stop": ([0, 3, 1],)}
    assert [v["i"] for _, v, _ in calls] == [[0, 0, 0], [0, 1, 1], [0, 2, 1], [0, 3, 1]]
    assert [tr for _, _, tr in calls] == [(batch(0, 0, 0, 0),)] * 4
    assert calls[1][1] == {"acc": ([1.0, 3.0, -4.0], [[0, 0], [0, 0], [0, 0]]),
                           "i": [0, 1, 1], "stop": ([0, 3, 1],)}


def test_taps_in_cond_and_body_keep_program_order():
    rec = Rec()

    def cond(c):
        hcb.id_tap(rec.tap("cond-a"), c[0])
        p = c[0] < 2
        return hcb.id_tap(rec.tap("cond-b"), p)

    def body(c):
        i, v = hcb.id_tap(rec.tap("body"), c)
        return i + 1, v * 2.0

    out, calls = rec.run(jax.vmap(lambda i, v: lax.while_loop(cond, body, (i, v))),
                         np.array([0, 2, 1], np.int32), np.array([1.0, 5.0, 3.0], np.float32))
    assert tolist(out) == ([2, 2, 2], [4.0, 5.0, 6.0])
    assert tolist(out) == stack([python_while(lambda c: c[0] < 2, lambda c: (c[0] + 1, c[1] * 2),
                                              (i, v)) for i, v in [(0, 1.0), (2, 5.0), (1, 3.0)]])
    assert [t for t, _, _ in calls] == ["cond-a", "cond-b", "body"] * 2 + ["cond-a", "cond-b"]
    assert calls[0][1:] == ([0, 2, 1], (B0,))
    assert calls[1][1:] == ([True, False, True], (B0,))
    assert calls[2][1:] == (([0, 2, 1], [1.0, 5.0, 3.0]), (batch(0, 0),))
    assert calls[3][1] == [1, 2, 2]
    assert calls[5][1] == ([1, 2, 2], [2.0, 5.0, 6.0])
    assert calls[6][1] == [2, 2, 2] and calls[7][1] == [False, False, False]


@pytest.mark.parametrize("seed", range(3))
def test_random_lanes_match_an_explicit_loop(seed):
    rng = np.random.default_rng(seed)
    ns = rng.integers(1, 30, size=7).astype(np.int32)
    rec = Rec()

    def cond(c):
        return collatz_cond(hcb.id_tap(rec.tap("cond"), c))

    out, calls = rec.run(jax.vmap(lambda n: lax.while_loop(
        cond, collatz_body, (n, jnp.int32(0), jnp.float32(0)))), ns)
    start = [(int(n), 0, 0.0) for n in ns]
    lanes, cond_seen, _ = lockstep(collatz_cond, py_collatz_body, start)
    assert tolist(out) == stack(lanes)
    assert stack(lanes) == stack([python_while(collatz_cond, py_collatz_body, c)
                                  for c in start])
    assert [list(v) for _, v, _ in calls] == [list(stack(c)) for c in cond_seen]


# ---------------------------------------------------------------------------------------
# Composition with other transformations.

def example(rec):
    def g(x):
        return lax.while_loop(lambda c: hcb.id_tap(rec.tap("cond"), c) < 2,
                              lambda c: hcb.id_tap(rec.tap("body"), c + 1), x)
    return g


EXAMPLE_CALLS = [("cond", [0, 1, 2, 3], (B0,)), ("body", [1, 2, 3, 4], (B0,)),
                 ("cond", [1, 2, 2, 3], (B0,)), ("body", [2, 3, 3, 4], (B0,)),
                 ("cond", [2, 2, 2, 3], (B0,))]


@pytest.mark.parametrize("wrap", ["vmap", "jit(vmap)", "vmap(jit)", "jit(vmap(jit))"])
def test_vmap_and_jit_in_either_order(wrap):
    rec = Rec()
    g = example(rec)
    fn = {"vmap": jax.vmap(g), "jit(vmap)": jax.jit(jax.vmap(g)),
          "vmap(jit)": jax.vmap(jax.jit(g)),
          "jit(vmap(jit))": jax.jit(jax.vmap(jax.jit(g)))}[wrap]
    out, calls = rec.run(fn, np.arange(4, dtype=np.int32))
    assert out.tolist() == [2, 2, 2, 3]
    assert calls == EXAMPLE_CALLS


def test_nested_vmap():
    rec = Rec()
    x = np.arange(6, dtype=np.int32).reshape(2, 3) - 2
    out, calls = rec.run(jax.vmap(jax.vmap(example(rec))), x)
    plain = jax.vmap(jax.vmap(lambda x: lax.while_loop(lambda c: c < 2, lambda c: c + 1, x)))(x)
    assert out.tolist() == plain.tolist() == [[2, 2, 2], [2, 2, 3]]
    bb = (B0, B0)
    lanes, cond_seen, body_seen = lockstep(lambda c: c < 2, lambda c: c + 1,
                                           x.reshape(-1).tolist())
    assert lanes == out.reshape(-1).tolist()
    expected = [("cond", np.reshape(cond_seen[0], (2, 3)).tolist(), bb)]
    for b, c in zip(body_seen, cond_seen[1:]):
        expected += [("body", np.reshape(b, (2, 3)).tolist(), bb),
                     ("cond", np.reshape(c, (2, 3)).tolist(), bb)]
    assert calls == expected


def test_nested_vmap_with_the_predicate_batched_only_by_the_outer_vmap():
    rec = Rec()

    def g(stop, x):
        return lax.while_loop(lambda c: hcb.id_tap(rec.tap("cond"), c[0]) < stop,
                              lambda c: (c[0] + 1, c[1] + 1.0), (0, x))

    stops = np.array([1, 3], np.int32)
    xs = np.zeros((2, 3), np.float32)
    out, calls = rec.run(jax.vmap(jax.vmap(g, in_axes=(None, 0))), stops, xs)
    assert tolist(out) == ([[1, 1, 1], [3, 3, 3]], [[1.0] * 3, [3.0] * 3])
    per_lane = [[python_while(lambda c: c[0] < int(s), lambda c: (c[0] + 1, c[1] + 1.0),
                              (0, float(x))) for x in row] for s, row in zip(stops, xs)]
    assert tolist(out) == ([[c[0] for c in r] for r in per_lane],
                           [[c[1] for c in r] for r in per_lane])
    # The inner vmap leaves the predicate unbatched (JAX's own rule); the outer one
    # batches it.
    assert calls == [("cond", [0, 0], (B0,)), ("cond", [1, 1], (B0,)),
                     ("cond", [1, 2], (B0,)), ("cond", [1, 3], (B0,))]


def test_in_axes_with_unbatched_predicate_operands_keep_an_unbatched_predicate():
    rec = Rec()

    def h(stop, x):
        return lax.while_loop(lambda c: hcb.id_tap(rec.tap("cond"), c[0]) < stop,
                              lambda c: (c[0] + 1, c[1] * 2.0), (0, x))

    out, calls = rec.run(jax.vmap(h, in_axes=(None, 0)), 2, jnp.arange(3.0))
    assert tolist(out) == ([2, 2, 2], [0.0, 4.0, 8.0])
    assert tolist(out) == stack([python_while(lambda c: c[0] < 2,
                                              lambda c: (c[0] + 1, c[1] * 2.0), (0, x))
                                 for x in [0.0, 1.0, 2.0]])
    assert calls == [("cond", 0, ()), ("cond", 1, ()), ("cond", 2, ())]


def test_in_axes_with_batched_predicate_constant_and_unbatched_carry():
    rec = Rec()

    def h(stop, x):
        return lax.while_loop(lambda c: hcb.id_tap(rec.tap("cond"), c[0]) < stop,
                              lambda c: (c[0] + 1, c[1] * 2.0), (0, x))

    stops = jnp.array([0, 2, 1])
    out, calls = rec.run(jax.vmap(h, in_axes=(0, None)), stops, 1.0)
    plain = jax.vmap(lambda s, x: lax.while_loop(lambda c: c[0] < s,
                                                 lambda c: (c[0] + 1, c[1] * 2.0), (0, x)),
                     in_axes=(0, None))(stops, 1.0)
    assert tolist(out) == tolist(plain) == ([0, 2, 1], [1.0, 4.0, 2.0])
    assert calls == [("cond", [0, 0, 0], (B0,)), ("cond", [0, 1, 1], (B0,)),
                     ("cond", [0, 2, 1], (B0,))]


def test_batch_axis_other_than_zero_and_per_lane_axis_index():
    rec = Rec()

    def g(row):
        stop = lax.axis_index("i") + 1
        return lax.while_loop(lambda c: hcb.id_tap(rec.tap("cond"), c[0]) < stop,
                              lambda c: (c[0] + 1, c[1] + c[0]), (0, row))

    rows = np.arange(6, dtype=np.float32).reshape(2, 3)  # lanes on axis 1
    out, calls = rec.run(jax.vmap(g, in_axes=1, axis_name="i"), rows)
    assert tolist(out) == ([1, 2, 3], [[0.0, 3.0], [2.0, 5.0], [5.0, 8.0]])
    per_lane = [python_while(lambda c, s=lane + 1: c[0] < s,
                             lambda c: (c[0] + 1, [v + c[0] for v in c[1]]),
                             (0, rows[:, lane].tolist())) for lane in range(3)]
    assert tolist(out) == ([n for n, _ in per_lane], [v for _, v in per_lane])
    assert [v for _, v, _ in calls] == [[0, 0, 0], [1, 1, 1], [1, 2, 2], [1, 2, 3]]


def test_call_in_the_predicate_sees_each_lane_once_per_iteration():
    seen = []

    def below_two(v):
        seen.append(int(v))
        return np.asarray(v < 2)

    def g(x):
        return lax.while_loop(
            lambda c: hcb.call(below_two, c, result_shape=jax.ShapeDtypeStruct((), jnp.bool_)),
            lambda c: c + 1, x)

    x = np.arange(4, dtype=np.int32)
    out = jax.vmap(g)(x)
    hcb.barrier_wait()
    assert out.tolist() == [2, 2, 2, 3]
    assert out.tolist() == jax.vmap(
        lambda x: lax.while_loop(lambda c: c < 2, lambda c: c + 1, x))(x).tolist()
    assert out.tolist() == [python_while(lambda c: c < 2, lambda c: c + 1, int(v)) for v in x]
    # One host call per lane (vmap of call is sequential); lanes that are done show their
    # final value again, never a value past it.
    assert seen == [0, 1, 2, 3, 1, 2, 2, 3, 2, 2, 2, 3]


def test_jit_of_vmap_compiles_once_and_reruns_correctly():
    rec = Rec()
    f = jax.jit(jax.vmap(example(rec)))
    for x in (np.arange(4, dtype=np.int32), np.array([3, 0, 1, 5], np.int32)):
        out, _ = rec.run(f, x)
        assert out.tolist() == [python_while(lambda c: c < 2, lambda c: c + 1, int(v))
                                for v in x]
    assert f._cache_size() == 1


@pytest.mark.parametrize("axis_type", ["Auto", "Explicit"])
@pytest.mark.several_devices
def test_lanes_sharded_over_four_devices(axis_type):
    r = run_python(f"""
        import json
        import jax, numpy as np
        from jax import lax
        from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
        from hostfeed import host_callback as hcb
        seen = []
        def g(x):
            return lax.while_loop(
                lambda c: hcb.id_tap(lambda a, t: seen.append(a.tolist()), c) < 2,
                lambda c: c + 1, x)
        mesh = jax.make_mesh((4,), ("b",), axis_types=(AxisType.{axis_type},))
        jax.set_mesh(mesh)
        x = jax.device_put(np.arange(8, dtype=np.int32) - 2, NamedSharding(mesh, P("b")))
        outs = [jax.jit(jax.vmap(g))(x).tolist(),
                jax.jit(jax.vmap(g, spmd_axis_name="b"))(x).tolist()]
        hcb.barrier_wait()
        print(json.dumps([outs, seen]))
    """, env={"XLA_FLAGS": "--xla_force_host_platform_device_count=4"})
    assert r.returncode == 0, r.stderr
    outs, seen = json.loads(r.stdout.splitlines()[-1])
    lanes, cond_seen, _ = lockstep(lambda c: c < 2, lambda c: c + 1, list(range(-2, 6)))
    assert outs == [lanes, lanes] == [[2, 2, 2, 2, 2, 3, 4, 5]] * 2
    assert seen == cond_seen + cond_seen  # each tap sees all lanes, once


# ---------------------------------------------------------------------------------------
# Autodiff, in both tap modes.

def test_vmap_of_jvp_through_a_tapped_predicate(mode):
    rec = Rec()

    def w(x):
        return lax.while_loop(lambda c: hcb.id_tap(rec.tap("cond"), c[0]) < 2.0,
                              lambda c: (c[0] + 1.0, hcb.id_tap(rec.tap("body"), c[1] * c[0])),
                              (x, x))

    def w_plain(x):
        return lax.while_loop(lambda c: c[0] < 2.0, lambda c: (c[0] + 1.0, c[1] * c[0]), (x, x))

    xs, ts = jnp.array([0.0, 1.0, 3.0, 0.5]), jnp.ones(4)
    out, calls = rec.run(jax.vmap(lambda x, t: jax.jvp(w, (x,), (t,))), xs, ts)
    plain = jax.vmap(lambda x, t: jax.jvp(w_plain, (x,), (t,)))(xs, ts)
    assert tolist(out) == tolist(plain)
    assert tolist(out) == (([2.0, 2.0, 3.0, 2.5], [0.0, 1.0, 3.0, 0.375]),
                           ([1.0, 1.0, 1.0, 1.0], [0.0, 2.0, 1.0, 1.75]))
    # The predicate sees primals only (JAX differentiates the body, not the cond).
    assert [v for t, v, _ in calls if t == "cond"] == [
        [0.0, 1.0, 3.0, 0.5], [1.0, 2.0, 3.0, 1.5], [2.0, 2.0, 3.0, 2.5]]
    assert [tr for t, _, tr in calls if t == "cond"] == [(B0,)] * 3
    body = [(v, tr) for t, v, tr in calls if t == "body"]
    if mode == "primals":
        assert body == [([0.0, 1.0, 9.0, 0.25], (B0,)), ([0.0, 2.0, 9.0, 0.375], (B0,))]
    else:
        assert body == [(([0.0, 1.0, 9.0, 0.25], [0.0, 2.0, 6.0, 1.0]), (JVP, batch(0, 0))),
                        (([0.0, 2.0, 9.0, 0.375], [0.0, 5.0, 6.0, 1.75]), (JVP, batch(0, 0)))]


def test_vmap_of_grad_of_a_function_with_a_tapped_loop_count(mode):
    rec = Rec()

    def count(stop):
        return lax.while_loop(lambda c: hcb.id_tap(rec.tap("cond"), c) < stop,
                              lambda c: c + 1, 0)

    def f(x, stop):
        return x ** 2 * count(stop).astype(jnp.float32)

    def f_plain(x, stop):
        return x ** 2 * lax.while_loop(lambda c: c < stop, lambda c: c + 1, 0).astype(
            jnp.float32)

    xs, stops = jnp.array([1.0, 2.0, 3.0]), jnp.array([2, 0, 1])
    out, calls = rec.run(jax.vmap(jax.grad(f)), xs, stops)
    assert out.tolist() == jax.vmap(jax.grad(f_plain))(xs, stops).tolist() == [4.0, 0.0, 6.0]
    assert calls == [("cond", [0, 0, 0], (B0,)), ("cond", [1, 0, 1], (B0,)),
                     ("cond", [2, 0, 1], (B0,))]


def test_vmap_of_grad_through_a_fori_loop_with_taps(mode):
    rec = Rec()

    def f(x):
        return lax.fori_loop(0, 3, lambda i, c: hcb.id_tap(rec.tap("body"), c * x + i), x)

    def f_plain(x):
        return lax.fori_loop(0, 3, lambda i, c: c * x + i, x)

    xs = jnp.array([1.0, 2.0, -1.0])
    out, calls = rec.run(jax.vmap(jax.grad(f)), xs)
    assert out.tolist() == jax.vmap(jax.grad(f_plain))(xs).tolist() == [
        float(jax.grad(f_plain)(x)) for x in xs]
    fwd = [("body", [1.0, 4.0, 1.0], (B0,)), ("body", [2.0, 9.0, 0.0], (B0,)),
           ("body", [4.0, 20.0, 2.0], (B0,))]
    assert calls[:3] == fwd
    if mode == "primals":
        assert len(calls) == 3
    else:
        assert [tr for _, _, tr in calls[3:]] == [(JVP, ("transpose", {}), B0)] * 3


def test_vmap_of_fori_loop_with_batched_trip_count_and_taps(mode):
    rec = Rec()

    def f(n, x):
        return lax.fori_loop(0, n, lambda i, c: hcb.id_tap(rec.tap("body"), c + i), x)

    ns, xs = jnp.array([0, 3, 1]), jnp.array([1.0, 1.0, 5.0])
    out, calls = rec.run(jax.vmap(lambda n, x, t: jax.jvp(lambda x: f(n, x), (x,), (t,))),
                         ns, xs, jnp.ones(3))
    assert tolist(out) == ([1.0, 4.0, 5.0], [1.0, 1.0, 1.0])
    plain = jax.vmap(lambda n, x, t: jax.jvp(
        lambda x: lax.fori_loop(0, n, lambda i, c: c + i, x), (x,), (t,)))(ns, xs, jnp.ones(3))
    assert tolist(out) == tolist(plain)
    assert len(calls) == 3  # the batched loop runs for the longest lane


# ---------------------------------------------------------------------------------------
# Nothing changes for loops whose predicate has no hostfeed effect.

def _jaxpr_text(fn, *args):
    return str(jax.make_jaxpr(fn)(*args))


@pytest.mark.parametrize("case", ["no_taps", "body_tap", "cond_tap_unbatched_predicate"])
def test_other_loops_batch_exactly_as_jax_does(case, monkeypatch):
    def cond(c):
        i = hcb.id_tap(no_tap, c[0]) if case == "cond_tap_unbatched_predicate" else c[0]
        return i < 3

    def body(c):
        v = hcb.id_tap(no_tap, c[1]) if case == "body_tap" else c[1]
        return c[0] + 1, v * 2.0

    if case == "cond_tap_unbatched_predicate":
        fn = jax.vmap(lambda x: lax.while_loop(cond, body, (0, x)))
        x = jnp.arange(3.0)
    else:
        fn = jax.vmap(lambda i, x: lax.while_loop(cond, body, (i, x)))
        x = (jnp.array([0, 2, 1]), jnp.arange(3.0))
    args = x if isinstance(x, tuple) else (x,)
    ours = _jaxpr_text(fn, *args)
    monkeypatch.setitem(batching.fancy_primitive_batchers, while_p, rules._jax_while_batching)
    assert _jaxpr_text(fn, *args) == ours


def test_while_batching_rule_is_installed_once_over_jaxs():
    assert batching.fancy_primitive_batchers[while_p] is rules._while_batching
    assert rules._jax_while_batching.__module__.startswith("jax.")
