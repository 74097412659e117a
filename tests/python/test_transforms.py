"""Taps under JAX transformations, with the `transforms` record, in both autodiff modes
('transforms': the legacy module's documented behaviour; 'primals': JAX 0.4.x's)."""
from __future__ import annotations

import io

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from hostfeed import host_callback as hcb

from conftest import run_python

JVP = ("jvp", {})
TRANSPOSE = ("transpose", {})


def batch(*dims):
    return ("batch", {"batch_dims": tuple(dims)})


class Rec:
    """Records (value as Python data, transforms) for every tap, in order."""

    def __init__(self):
        self.calls = []

    def __call__(self, arg, transforms):
        self.calls.append((jax.tree_util.tree_map(lambda a: a.tolist(), arg), transforms))

    def run(self, fn, *args):
        self.calls = []
        out = fn(*args)
        hcb.barrier_wait()
        return out, self.calls


def make_power3(rec):
    def power3(x):
        y = x * x
        _, y = hcb.id_tap(rec, (x, y))
        return y * x
    return power3


def approx(calls):
    """Rounds floats so float32 values compare with decimal literals."""
    def r(v):
        if isinstance(v, float):
            return round(v, 5)
        if isinstance(v, (list, tuple)):
            return type(v)(r(x) for x in v)
        return v
    return [(r(v), t) for v, t in calls]


# ---------------------------------------------------------------------------------------
# The seed docstring's examples (transforms mode), printed exactly as documented.

def printed(fn, *args):
    s = io.StringIO()

    def power3(x):
        y = x * x
        _, y = hcb.id_print((x, y), what="x,x^2", output_stream=s)
        return y * x

    out = fn(power3)(*args)
    hcb.barrier_wait()
    return out, s.getvalue()


def test_docstring_power3(transforms_mode):
    assert printed(lambda f: f, 3.0)[1] == "what: x,x^2\n( 3. 9. )\n"


def test_docstring_vmap(transforms_mode):
    _, out = printed(jax.vmap, np.arange(3.0))
    assert out == ("transforms: [('batch', {'batch_dims': (0, 0)})] what: x,x^2\n"
                   "( [0. 1. 2.] [0. 1. 4.] )\n")


def test_docstring_jvp(transforms_mode):
    _, out = printed(lambda f: lambda x, t: jax.jvp(f, (x,), (t,)), 3.0, 0.1)
    assert out == ("transforms: ['jvp'] what: x,x^2\n"
                   "( ( 3. 9. ) ( 0.1 0.6 ) )\n")


def test_docstring_grad(transforms_mode):
    res, out = printed(jax.grad, 3.0)
    assert float(res) == 27.0
    assert out == ("what: x,x^2\n( 3. 9. )\n"
                   "transforms: ['jvp', 'transpose'] what: x,x^2\n( 0. 3. )\n")


def test_docstring_vmap_of_grad(transforms_mode):
    _, out = printed(lambda f: jax.vmap(jax.grad(f)), np.array([2.0, 3.0]))
    assert out == ("transforms: [('batch', {'batch_dims': (0, 0)})] what: x,x^2\n"
                   "( [2. 3.] [4. 9.] )\n"
                   "transforms: ['jvp', 'transpose', ('batch', {'batch_dims': (None, 0)})] "
                   "what: x,x^2\n( 0. [2. 3.] )\n")


# ---------------------------------------------------------------------------------------
# Autodiff in transforms mode: values, transforms, count and order.

def test_jvp_taps_primals_and_tangents_once(transforms_mode):
    rec = Rec()
    (p, t), calls = rec.run(lambda: jax.jvp(make_power3(rec), (3.0,), (0.1,)))
    assert (float(p), round(float(t), 5)) == (27.0, 2.7)
    assert approx(calls) == [(((3.0, 9.0), (0.1, 0.6)), (JVP,))]


def test_vjp_taps_forward_primals_then_cotangents(transforms_mode):
    rec = Rec()
    (p, vjp_fn), calls = rec.run(lambda: jax.vjp(make_power3(rec), 3.0))
    assert calls == [((3.0, 9.0), ())]
    (ct,), calls = rec.run(lambda: vjp_fn(1.0))
    assert float(ct) == 27.0
    assert calls == [((0.0, 3.0), (JVP, TRANSPOSE))]


def test_linearize_taps_forward_then_jvp_on_each_application(transforms_mode):
    rec = Rec()
    (p, f_jvp), calls = rec.run(lambda: jax.linearize(make_power3(rec), 3.0))
    assert calls == [((3.0, 9.0), ())]
    t, calls = rec.run(lambda: f_jvp(0.1))
    assert round(float(t), 5) == 2.7
    assert approx(calls) == [(((3.0, 9.0), (0.1, 0.6)), (JVP,))]


def test_jacfwd_and_jacrev(transforms_mode):
    rec = Rec()
    j, calls = rec.run(lambda: jax.jacfwd(make_power3(rec))(3.0))
    assert float(j) == 27.0
    assert calls == [(((3.0, 9.0), ([1.0], [6.0])), (JVP, batch(None, None, 0, 0)))]
    j, calls = rec.run(lambda: jax.jacrev(make_power3(rec))(3.0))
    assert float(j) == 27.0
    assert calls == [((3.0, 9.0), ()), ((0.0, [3.0]), (JVP, TRANSPOSE, batch(None, 0)))]


def test_hessian(transforms_mode):
    rec = Rec()
    h, calls = rec.run(lambda: jax.hessian(make_power3(rec))(3.0))
    assert float(h) == 18.0
    assert calls == [
        (((3.0, 9.0), ([1.0], [6.0])), (JVP, batch(None, None, 0, 0))),
        (((0.0, [3.0]), (0.0, [[1.0]])),
         (JVP, TRANSPOSE, batch(None, 0), JVP, batch(None, None, None, 0))),
    ]


def test_grad_of_grad(transforms_mode):
    rec = Rec()
    g, calls = rec.run(lambda: jax.grad(jax.grad(make_power3(rec)))(3.0))
    assert float(g) == 18.0
    assert calls == [((3.0, 9.0), ()), ((0.0, 3.0), (JVP, TRANSPOSE)),
                     ((1.0, 6.0), (JVP, TRANSPOSE, JVP, TRANSPOSE)),
                     ((0.0, 1.0), (JVP, TRANSPOSE))]


def test_integer_inputs_send_float0_tangents_as_false(transforms_mode):
    rec = Rec()

    def f(x, i):
        x, i = hcb.id_tap(rec, (x, i))
        return x * i

    g, calls = rec.run(lambda: jax.grad(f)(5.0, 2))
    assert float(g) == 2.0
    assert calls == [((5.0, 2), ()), ((2.0, False), (JVP, TRANSPOSE))]
    (p, t), calls = rec.run(lambda: jax.jvp(f, (5.0, 2), (0.5, np.zeros((), jax.dtypes.float0))))
    assert (float(p), float(t)) == (10.0, 1.0)
    assert calls == [(((5.0, 2), (0.5, False)), (JVP,))]


def test_symbolic_zero_tangents_are_instantiated(transforms_mode):
    rec = Rec()

    def f(x, y):
        return hcb.id_tap(rec, (x, y))[0] * 2

    # Only x is differentiated: y's tangent is a symbolic zero, sent as zeros.
    (_, t), calls = rec.run(lambda: jax.jvp(lambda x: f(x, jnp.ones(2)), (1.0,), (1.0,)))
    assert float(t) == 2.0
    assert calls == [(((1.0, [1.0, 1.0]), (1.0, [0.0, 0.0])), (JVP,))]


def test_result_under_grad_and_jvp(transforms_mode):
    rec = Rec()
    f = lambda x: hcb.id_tap(rec, x * 2, result=x * 3)
    g, calls = rec.run(lambda: jax.grad(f)(1.0))
    assert float(g) == 3.0
    assert calls == [(2.0, ()), (0.0, (JVP, TRANSPOSE))]
    (p, t), calls = rec.run(lambda: jax.jvp(f, (1.0,), (1.0,)))
    assert (float(p), float(t)) == (3.0, 3.0)
    assert calls == [((2.0, 2.0), (JVP,))]


# ---------------------------------------------------------------------------------------
# Primals mode (JAX 0.4.x): only primal values, no autodiff transforms, no backward taps.

@pytest.mark.parametrize("transform", ["jvp", "grad", "vjp", "jacfwd", "jacrev", "linearize",
                                       "hessian", "grad_of_grad"])
def test_primals_mode_taps_only_primals(primals_mode, transform):
    rec = Rec()
    f = make_power3(rec)
    run = {
        "jvp": lambda: jax.jvp(f, (3.0,), (0.1,)),
        "grad": lambda: jax.grad(f)(3.0),
        "vjp": lambda: jax.vjp(f, 3.0)[1](1.0),
        "jacfwd": lambda: jax.jacfwd(f)(3.0),
        "jacrev": lambda: jax.jacrev(f)(3.0),
        "linearize": lambda: jax.linearize(f, 3.0)[1](0.1),
        "hessian": lambda: jax.hessian(f)(3.0),
        "grad_of_grad": lambda: jax.grad(jax.grad(f))(3.0),
    }[transform]
    _, calls = rec.run(run)
    assert calls == [((3.0, 9.0), ())]


def test_primals_mode_checkpoint_retaps_in_backward_pass(primals_mode):
    rec = Rec()
    power3 = make_power3(rec)
    g, calls = rec.run(lambda: jax.grad(lambda x: power3(jax.checkpoint(power3)(x)))(3.0))
    assert float(g) == 59049.0
    assert calls == [((3.0, 9.0), ()), ((27.0, 729.0), ()), ((3.0, 9.0), ())]


def test_primals_mode_custom_jvp_taps_tangents(primals_mode):
    rec = Rec()

    @jax.custom_jvp
    def f(x):
        return hcb.id_tap(rec, x) * 2

    @f.defjvp
    def f_jvp(primals, tangents):
        (x,), (t,) = primals, tangents
        return f(x), hcb.id_tap(rec, t) * 2

    (p, t), calls = rec.run(lambda: jax.jvp(f, (3.0,), (0.5,)))
    assert (float(p), float(t)) == (6.0, 1.0)
    assert calls == [(3.0, ()), (0.5, ())]
    g, calls = rec.run(lambda: jax.grad(f)(3.0))
    assert float(g) == 2.0
    # The tangent tap is linear; in the backward pass it taps the cotangent.
    assert calls == [(3.0, ()), (2.0, (TRANSPOSE,))]


def test_custom_vjp_taps_primal_and_cotangent_in_both_modes(mode):
    rec = Rec()

    @jax.custom_vjp
    def f(x):
        return hcb.id_tap(rec, x) * 2

    f.defvjp(lambda x: (f(x), None), lambda _, ct: (hcb.id_tap(rec, ct) * 2,))
    g, calls = rec.run(lambda: jax.grad(f)(3.0))
    assert float(g) == 2.0
    # The rules run as written: the fwd rule's primal tap, the bwd rule's cotangent tap.
    assert calls == [(3.0, ()), (1.0, ())]


def test_custom_jvp_primal_tap_in_transforms_mode(transforms_mode):
    rec = Rec()

    @jax.custom_jvp
    def h(x):
        return hcb.id_tap(rec, x) * 2

    h.defjvp(lambda p, t: (h(p[0]), t[0] * 2))
    (_, t), calls = rec.run(lambda: jax.jvp(h, (3.0,), (1.0,)))
    assert float(t) == 2.0 and calls == [(3.0, ())]


@pytest.mark.parametrize("transform", ["jvp", "grad", "vmap", "checkpoint"])
def test_result_under_transformations_in_both_modes(mode, transform):
    rec = Rec()

    def f(x):
        return hcb.id_tap(rec, x * 2, result=x * 3)

    if transform == "jvp":
        out, calls = rec.run(lambda: jax.jvp(f, (1.0,), (1.0,)))
        assert (float(out[0]), float(out[1])) == (3.0, 3.0)
        expected = [(2.0, ())] if mode == "primals" else [((2.0, 2.0), (JVP,))]
    elif transform == "grad":
        out, calls = rec.run(lambda: jax.grad(f)(1.0))
        assert float(out) == 3.0
        expected = [(2.0, ())] + ([] if mode == "primals" else [(0.0, (JVP, TRANSPOSE))])
    elif transform == "vmap":
        out, calls = rec.run(lambda: jax.vmap(f)(jnp.arange(2.0)))
        assert out.tolist() == [0.0, 3.0]
        expected = [([0.0, 2.0], (batch(0),))]
    else:
        out, calls = rec.run(lambda: jax.grad(lambda x: jax.checkpoint(f)(x) * x)(1.0))
        assert float(out) == 6.0
        # Rematerialised: the primal tap runs again in the backward pass; the cotangent of
        # the tapped value, which nothing uses (all zeros), is tapped as without
        # checkpointing (the effect keeps the tap through partial evaluation).
        expected = [(2.0, ()), (2.0, ())] + (
            [] if mode == "primals" else [(0.0, (JVP, TRANSPOSE))])
    assert calls == expected


# ---------------------------------------------------------------------------------------
# Checkpoint policies (both modes).

def test_checkpoint_policies(mode):
    rec = Rec()
    power3 = make_power3(rec)

    def run(policy):
        inner = jax.checkpoint(power3, policy=policy)
        return rec.run(lambda: jax.grad(lambda x: power3(inner(x)))(3.0))

    _, default = run(None)
    _, saved = run(jax.checkpoint_policies.everything_saveable)
    if mode == "primals":
        assert default == [((3.0, 9.0), ()), ((27.0, 729.0), ()), ((3.0, 9.0), ())]
        assert saved == [((3.0, 9.0), ()), ((27.0, 729.0), ())]
    else:
        bwd_outer = ((0.0, 27.0), (JVP, TRANSPOSE))
        bwd_inner = ((0.0, 6561.0), (JVP, TRANSPOSE))
        assert default == [((3.0, 9.0), ()), ((27.0, 729.0), ()), bwd_outer,
                           ((3.0, 9.0), ()), bwd_inner]
        assert saved == [((3.0, 9.0), ()), ((27.0, 729.0), ()), bwd_outer, bwd_inner]


# ---------------------------------------------------------------------------------------
# vmap (both modes behave the same).

def test_vmap_records_batch_dims_per_argument(mode):
    rec = Rec()
    _, calls = rec.run(lambda: jax.vmap(lambda x, y: hcb.id_tap(rec, (x, y)),
                                        in_axes=(0, None))(jnp.arange(2.0), 5.0))
    assert calls == [(([0.0, 1.0], 5.0), (batch(0, None),))]


def test_vmap_in_axes_1_and_nested(mode):
    rec = Rec()
    x = jnp.arange(6.0).reshape(2, 3)
    _, calls = rec.run(lambda: jax.vmap(lambda v: hcb.id_tap(rec, v), in_axes=1)(x))
    assert calls == [(x.tolist(), (batch(1),))]
    _, calls = rec.run(lambda: jax.vmap(jax.vmap(lambda v: hcb.id_tap(rec, v)))(x))
    assert calls == [(x.tolist(), (batch(0), batch(0)))]


def test_vmap_with_spmd_axis_name(mode):
    rec = Rec()
    out, calls = rec.run(lambda: jax.vmap(lambda v: hcb.id_tap(rec, v) + 1,
                                          spmd_axis_name="b")(jnp.arange(3.0)))
    assert out.tolist() == [1.0, 2.0, 3.0]
    assert calls == [([0.0, 1.0, 2.0], (batch(0),))]


def test_vmap_of_cond_with_batched_predicate_taps_both_branches(mode):
    rec = Rec()
    out, calls = rec.run(lambda: jax.vmap(lambda x: lax.cond(
        x > 1, lambda v: hcb.id_tap(rec, v * 10), lambda v: hcb.id_tap(rec, -v), x))(
        jnp.arange(3.0)))
    assert out.tolist() == [0.0, -1.0, 20.0]
    assert calls == [([-0.0, -1.0, -2.0], (batch(0),)), ([0.0, 10.0, 20.0], (batch(0),))]


def test_vmap_of_while_with_batched_predicate_runs_until_all_done(mode):
    rec = Rec()
    out, calls = rec.run(lambda: jax.vmap(lambda x: lax.while_loop(
        lambda c: c < 3, lambda c: hcb.id_tap(rec, c + 1), x))(jnp.array([0.0, 2.0])))
    assert out.tolist() == [3.0, 3.0]
    # Every iteration of the batched loop taps all lanes (finished lanes keep their value
    # in the result, but the body still runs for them).
    assert calls == [([1.0, 3.0], (batch(0),)), ([2.0, 4.0], (batch(0),)),
                     ([3.0, 4.0], (batch(0),))]


def test_vmap_result(mode):
    rec = Rec()
    out, calls = rec.run(lambda: jax.vmap(lambda x: hcb.id_tap(rec, x, result=x + 1))(
        jnp.arange(2.0)))
    assert out.tolist() == [1.0, 2.0] and calls == [([0.0, 1.0], (batch(0),))]


# ---------------------------------------------------------------------------------------
# Control flow under transformations.

def test_scan_under_grad(mode):
    rec = Rec()
    f = lambda x: lax.scan(lambda c, a: (hcb.id_tap(rec, c * a), None), x,
                           jnp.arange(1.0, 3.0))[0]
    g, calls = rec.run(lambda: jax.grad(f)(2.0))
    assert float(g) == 2.0
    fwd = [(2.0, ()), (4.0, ())]
    if mode == "primals":
        assert calls == fwd
    else:
        assert calls == fwd + [(1.0, (JVP, TRANSPOSE)), (2.0, (JVP, TRANSPOSE))]


def test_while_and_fori_under_jvp(mode):
    rec = Rec()
    f = lambda x: lax.while_loop(lambda c: c[0] < 2,
                                 lambda c: (c[0] + 1, hcb.id_tap(rec, c[1] * 2.0)), (0, x))[1]
    (p, t), calls = rec.run(lambda: jax.jvp(f, (1.0,), (1.0,)))
    assert (float(p), float(t)) == (4.0, 4.0)
    if mode == "primals":
        assert calls == [(2.0, ()), (4.0, ())]
    else:
        assert calls == [((2.0, 2.0), (JVP,)), ((4.0, 4.0), (JVP,))]
    g = lambda x: lax.fori_loop(0, 2, lambda i, c: hcb.id_tap(rec, c * 3), x)
    d, calls = rec.run(lambda: jax.grad(g)(1.0))
    assert float(d) == 9.0
    fwd = [(3.0, ()), (9.0, ())]
    assert calls == (fwd if mode == "primals" else
                     fwd + [(1.0, (JVP, TRANSPOSE)), (3.0, (JVP, TRANSPOSE))])


def test_cond_under_grad_and_vmap(mode):
    rec = Rec()
    f = lambda x: lax.cond(x > 0, lambda v: hcb.id_tap(rec, v * v), lambda v: v, x)
    g, calls = rec.run(lambda: jax.grad(f)(3.0))
    assert float(g) == 6.0
    assert calls == ([(9.0, ())] if mode == "primals" else
                     [(9.0, ()), (1.0, (JVP, TRANSPOSE))])
    out, calls = rec.run(lambda: jax.vmap(jax.grad(f))(jnp.array([1.0, 2.0])))
    assert out.tolist() == [2.0, 4.0]
    assert calls[0] == ([1.0, 4.0], (batch(0),))


def test_scan_under_vmap(mode):
    rec = Rec()
    f = lambda x: lax.scan(lambda c, a: (hcb.id_tap(rec, c + a), None), x,
                           jnp.arange(2.0))[0]
    out, calls = rec.run(lambda: jax.vmap(f)(jnp.array([10.0, 20.0])))
    assert out.tolist() == [11.0, 21.0]
    assert calls == [([10.0, 20.0], (batch(0),)), ([11.0, 21.0], (batch(0),))]


# ---------------------------------------------------------------------------------------
# jit of each transformed case compiles once.

@pytest.mark.parametrize("transform", ["vmap", "jvp", "grad", "jacfwd", "jacrev",
                                       "vmap_grad", "checkpoint"])
def test_jit_of_transformed_tap_compiles_once(mode, transform):
    rec = Rec()
    traces = []

    def power3(x):
        traces.append(1)
        return make_power3(rec)(x)

    fn = {
        "vmap": jax.vmap(power3),
        "jvp": lambda x: jax.jvp(power3, (x,), (x,)),
        "grad": jax.grad(lambda x: power3(x).sum()),
        "jacfwd": jax.jacfwd(power3),
        "jacrev": jax.jacrev(power3),
        "vmap_grad": jax.vmap(jax.grad(power3)),
        "checkpoint": jax.grad(lambda x: power3(jax.checkpoint(power3)(x)).sum()),
    }[transform]
    jf = jax.jit(fn)
    x = jnp.array([2.0, 3.0]) if transform in ("vmap", "vmap_grad") else jnp.float32(2.0)
    _, first = rec.run(jf, x)
    n_traces = len(traces)
    _, second = rec.run(jf, x)
    assert first and first == second
    assert len(traces) == n_traces
    assert jf._cache_size() == 1


# ---------------------------------------------------------------------------------------
# Mode selection.

def test_mode_from_environment_and_invalid_values():
    r = run_python("""
        import jax
        from hostfeed import host_callback as hcb
        print(hcb.get_ad_taps())
        seen = []
        jax.grad(lambda x: hcb.id_tap(lambda a, tr: seen.append((float(a), tr)), x) * 2)(3.0)
        hcb.barrier_wait()
        print(seen)
    """, env={"HOSTFEED_AD_TAPS": "primals"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["primals", "[(3.0, ())]"]
    r = run_python("import hostfeed", env={"HOSTFEED_AD_TAPS": "tangents"})
    assert r.returncode != 0 and "HOSTFEED_AD_TAPS='tangents' is not a hostfeed" in r.stderr
    with pytest.raises(ValueError, match="'transforms'.*'primals'"):
        hcb.set_ad_taps("both")


def test_switching_mode_retraces_instead_of_reusing_the_old_trace(transforms_mode):
    rec = Rec()
    f = jax.jit(jax.grad(make_power3(rec)))
    _, calls = rec.run(f, 3.0)
    assert len(calls) == 2
    hcb.set_ad_taps("primals")
    _, calls = rec.run(f, 3.0)
    assert calls == [((3.0, 9.0), ())]
