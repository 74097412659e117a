"""Taps and records lowered inside control flow and under autodiff, each case checked here,
in a process of its own, so that a crash while lowering (a segmentation fault in JAX's
MLIR bindings, as jax 0.12.1's late-inlined ``cond`` caused) fails the case that crashed
instead of ending the test run (tests/python/test_lowering_in_control_flow.py).

Usage: python lowering_cases.py STORE_DIR CASE... ; for each case, prints one line
``START name`` before it runs and one JSON line ``{"case": name, "result": ...}`` after
(``result`` is "ok" or a failure's traceback). faulthandler writes the stack of a crash
to stderr.
"""
from __future__ import annotations

import faulthandler
import json
import os
import sys
import traceback

os.environ.setdefault("JAX_PLATFORMS", "cpu")
faulthandler.enable()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402

import hostfeed  # noqa: E402
from hostfeed import host_callback as hcb  # noqa: E402

STORE_DIR = sys.argv[1]
CASES = {}


def case(fn):
    CASES[fn.__name__] = fn
    return fn


def logger(tag, got):
    return lambda a, transforms: got.append((tag, np.asarray(a).tolist(),
                                             [t[0] for t in transforms]))


def store(name):
    return os.path.join(STORE_DIR, name + ".zarr")


@case
def tap_in_both_branches_of_cond():
    got = []

    @jax.jit
    def f(x):
        return lax.cond(x.sum() > 0,
                        lambda y: hcb.id_tap(logger("true", got), y * 2),
                        lambda y: hcb.id_tap(logger("false", got), y - 1), x)

    assert f(jnp.ones(3)).tolist() == [2.0, 2.0, 2.0]
    assert f(-jnp.ones(3)).tolist() == [-2.0, -2.0, -2.0]
    hcb.barrier_wait()
    assert got == [("true", [2.0] * 3, []), ("false", [-2.0] * 3, [])], got


@case
def ignored_taps_in_both_branches_of_two_conds():
    """id_print-style taps with their results unused in both branches of a cond, then the
    same branches again in a second cond (jax 0.12.1 reuses their lowered function)."""
    got = []

    def on_true(y):
        hcb.id_tap(logger("t", got), y)
        return y * 2

    def on_false(y):
        hcb.id_tap(logger("f", got), y)
        return y - 1

    @jax.jit
    def f(x):
        z = lax.cond(x.sum() > 0, on_true, on_false, x)
        hcb.id_tap(logger("z", got), z)
        return lax.cond(z.sum() > 0, on_true, on_false, z)

    assert f(jnp.ones(2)).tolist() == [4.0, 4.0]
    assert f(-jnp.ones(2)).tolist() == [-3.0, -3.0]
    hcb.barrier_wait()
    assert [g[:2] for g in got] == [("t", [1.0, 1.0]), ("z", [2.0, 2.0]), ("t", [2.0, 2.0]),
                                     ("f", [-1.0, -1.0]), ("z", [-2.0, -2.0]),
                                     ("f", [-2.0, -2.0])], got


@case
def ignored_taps_before_in_and_after_a_cond():
    """id_print-style taps whose results are unused, around and inside a cond's branches:
    later uses of the tapped values are redirected to the taps' outputs (the lowering's
    dependency walk), across the branch functions jax 0.12.1 lowers apart."""
    got = []

    @jax.jit
    def f(x):
        y = jnp.sin(x)
        hcb.id_tap(logger("before", got), y)

        def branch(tag, k):
            def g(v):
                w = v * k
                hcb.id_tap(logger(tag, got), w)
                return w + 1
            return g

        z = lax.cond(y.sum() > 0, branch("t", 2.0), branch("f", -2.0), y)
        hcb.id_tap(logger("after", got), z)
        return z + y

    x = jnp.arange(3.0)
    out = f(x)
    hcb.barrier_wait()
    y = np.sin(np.arange(3.0, dtype=np.float32))
    np.testing.assert_allclose(out, y * 2 + 1 + y, rtol=1e-6)
    assert [g[0] for g in got] == ["before", "t", "after"], got
    np.testing.assert_allclose(got[1][1], y * 2, rtol=1e-6)


@case
def tap_in_every_branch_of_switch():
    got = []
    branches = [lambda y, k=k: hcb.id_tap(logger(f"b{k}", got), y + k) for k in range(3)]
    f = jax.jit(lambda i, x: lax.switch(i, branches, x))
    assert [float(f(i, jnp.float32(10))) for i in (2, 0, 1)] == [12.0, 10.0, 11.0]
    hcb.barrier_wait()
    assert [g[:2] for g in got] == [("b2", 12.0), ("b0", 10.0), ("b1", 11.0)], got


@case
def tap_in_while_body_and_predicate():
    got = []

    def cond_fun(c):
        return hcb.id_tap(logger("pred", got), c[0]) < 3

    def body(c):
        i, s = c
        s = hcb.id_tap(logger("body", got), s + i)
        return i + 1, s

    out = jax.jit(lambda: lax.while_loop(cond_fun, body, (0, 0)))()
    hcb.barrier_wait()
    assert [int(v) for v in out] == [3, 3]
    assert [g[:2] for g in got] == [("pred", 0), ("body", 0), ("pred", 1), ("body", 1),
                                     ("pred", 2), ("body", 3), ("pred", 3)], got


@case
def tap_in_cond_inside_scan_under_grad():
    got = []

    def f(x):
        def body(c, xs):
            c = lax.cond(xs > 0, lambda v: hcb.id_tap(logger("pos", got), v * xs),
                         lambda v: hcb.id_tap(logger("neg", got), v - xs), c)
            return c, None
        return lax.scan(body, x, jnp.array([1.0, -1.0, 2.0]))[0]

    g = jax.jit(jax.grad(f))(jnp.float32(3.0))
    hcb.barrier_wait()
    assert float(g) == 2.0
    forward = [x for x in got if x[2] == []]
    assert [x[:2] for x in forward] == [("pos", 3.0), ("neg", 4.0), ("pos", 8.0)], got
    assert any(x[2] == ["jvp", "transpose"] for x in got), got


@case
def nested_conds_with_taps_under_vmap():
    got = []

    def f(x):
        def inner(v):
            return lax.cond(v > 1, lambda u: hcb.id_tap(logger("big", got), u * 10),
                            lambda u: u, v)
        return lax.cond(x > 0, inner, lambda v: hcb.id_tap(logger("neg", got), -v), x)

    out = jax.jit(jax.vmap(f))(jnp.array([-1.0, 0.5, 2.0]))
    hcb.barrier_wait()
    assert out.tolist() == [1.0, 0.5, 20.0]
    assert got and all(t[2] == ["batch"] for t in got), got


@case
def chained_every_records_under_jit_grad():
    """Three chained records with every=2 and a traced step under jit(grad): rows at steps
    0 and 2, forward values and cotangents (the example that crashed on jax 0.12.1)."""
    path = store("every_cot")
    rec = hostfeed.Recorder(path, mode="w")

    def f(w, s):
        h = jnp.ones((4,))
        for j in range(3):
            h = rec.record("h", jnp.tanh(h * w[j]), step=s, every=2)
        return h.sum()

    g = jax.jit(jax.grad(f))
    w = jnp.full((3, 4), 0.5)
    for s in range(4):
        g(w, s)
    rec.close()
    rows, meta = hostfeed.read_recording(path, "h")
    assert meta["step"].tolist() == [0, 0, 0, 2, 2, 2], meta["step"]
    h, expect = np.ones(4, np.float32), []
    for _ in range(3):
        h = np.tanh(h * 0.5)
        expect.append(h)
    np.testing.assert_allclose(rows, np.stack(expect * 2), rtol=1e-6)
    cot, cmeta = hostfeed.read_recording(path, "h.cotangent")
    assert cmeta["step"].tolist() == [0, 0, 0, 2, 2, 2], cmeta["step"]
    assert cot.shape == (6, 4)


@case
def stats_records_in_cond_under_checkpointed_grad():
    """reduce="stats" and every= records inside a cond branch of a checkpointed function,
    differentiated under jit: one row per selected step, equal to numpy's statistics of the
    forward value."""
    path = store("stats_remat")
    rec = hostfeed.Recorder(path, mode="w")

    @jax.checkpoint
    def layer(x, s):
        def on(v):
            v = rec.record("stats", jnp.sin(v), step=s, reduce="stats")
            return rec.record("every", v * 2, step=s, every=2)
        return lax.cond(x.sum() > -100, on, lambda v: v * 2, x)

    g = jax.jit(jax.grad(lambda x, s: layer(x, s).sum()))
    x = jnp.linspace(-1.0, 1.0, 8)
    for s in range(3):
        g(x, s)
    rec.close()
    rows, meta = hostfeed.read_recording(path, "stats")
    assert meta["step"].tolist() == [0, 1, 2], meta["step"]
    v = np.sin(np.linspace(-1.0, 1.0, 8, dtype=np.float32))
    names = hostfeed.open_recording(path)["stats"].attrs["reduce"]["columns"]
    row = dict(zip(names, rows[0].tolist()))
    np.testing.assert_allclose(row["mean"], v.mean(), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(row["max"], v.max(), rtol=1e-6)
    every, emeta = hostfeed.read_recording(path, "every")
    assert emeta["step"].tolist() == [0, 2], emeta["step"]
    np.testing.assert_allclose(every, np.stack([v * 2, v * 2]), rtol=1e-6)


@case
def records_in_scan_body_forward():
    path = store("scan_fwd")
    rec = hostfeed.Recorder(path, mode="w")

    def body(c, w):
        c = rec.record("layer", jnp.tanh(c * w), step=0)
        rec.record("layer_stats", c, step=0, reduce="stats")
        return c, None

    out = jax.jit(lambda x: lax.scan(body, x, jnp.array([0.5, 2.0]))[0])(jnp.ones(4))
    rec.close()
    rows, _ = hostfeed.read_recording(path, "layer")
    a = np.tanh(np.ones(4, np.float32) * 0.5)
    np.testing.assert_allclose(rows, np.stack([a, np.tanh(a * 2)]), rtol=1e-6)
    np.testing.assert_allclose(out, rows[-1], rtol=1e-6)
    stats, _ = hostfeed.read_recording(path, "layer_stats")
    assert stats.shape[0] == 2


def main(names):
    for name in names:
        print(f"START {name}", flush=True)
        try:
            CASES[name]()
            result = "ok"
        except Exception:  # noqa: BLE001 - reported to the test
            result = traceback.format_exc()
        print(json.dumps({"case": name, "result": result}), flush=True)


if __name__ == "__main__":
    main(sys.argv[2:] or list(CASES))
