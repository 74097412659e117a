"""No silent capture, as a matrix: Flax NNX, Flax Linen and Equinox, each with its layers
run plainly (unrolled), by a scan over a stacked layer, and by a scan of a checkpointed
layer; each capture taken in a forward-only call and under ``grad``; raw values, statistics,
a histogram, the top values and raw values at selected steps (``every=`` with
``cotangents=False``), all five at once. Each writes the rows it should, equal to numpy on
the values the model computed and on the cotangents the gradient gives; a capture that
records nothing says so with a ``hostfeed.CaptureWarning`` (the suite turns warnings into
errors, so no case here warned).

The models are tiny (2 layers of width 3, a batch of 2, 2 steps) and each (library,
layout) pair is compiled once, the forward call and the gradient in one jitted step."""
from __future__ import annotations

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax import lax

import hostfeed

from conftest import flax_scan_refuses_effects

pytest.importorskip("zarr", reason="reading back needs zarr-python")

B, D, L, S = 2, 3, 2, 2  # batch, width, layers, steps
HIST = hostfeed.Histogram(4, range=(-1.0, 1.0))
TOPK = hostfeed.TopK(2)
EVERY = 2
KINDS = {  # capture kind -> (capture() arguments, its suffix, whether cotangents are kept)
    "raw": (dict(), "", True),
    "stats": (dict(reduce="stats"), ".stats", True),
    "hist": (dict(reduce=HIST), ".hist", True),
    "topk": (dict(reduce=TOPK), ".topk", True),
    "every": (dict(every=EVERY, cotangents=False), "", False),
}


def capture_all(model, rec, select, step, mode):
    """``model`` under the five captures of the matrix, named under ``mode`` (and ``every``
    under ``mode/every``)."""
    for kind, (kwargs, _, _) in KINDS.items():
        prefix = f"{mode}/every" if kind == "every" else mode
        model = hostfeed.capture(model, rec, select, step=step, prefix=prefix, **kwargs)
    return model


def inputs():
    return jax.random.normal(jax.random.key(1), (B, D)), jnp.zeros((L, B, D))


def _loss(out):
    return jnp.sum(out ** 2)


# ---- each library's model: layer l computes h = mlp(x) + eps[l], x + h; returns (x, hs) --

def nnx_step(layout, rec):
    from flax import nnx

    class MLP(nnx.Module):
        def __init__(self, rngs):
            self.lin = nnx.Linear(D, D, rngs=rngs)

        def __call__(self, x):
            return jnp.tanh(self.lin(x))

    class Layer(nnx.Module):
        def __init__(self, rngs):
            self.mlp = MLP(rngs)

        def __call__(self, x, eps):
            h = self.mlp(x) + eps
            return x + h, h

    class Plain(nnx.Module):
        def __init__(self, rngs):
            self.layers = nnx.List([Layer(rngs) for _ in range(L)])

        def __call__(self, x, eps):
            hs = []
            for i, layer in enumerate(self.layers):
                x, h = layer(x, eps[i])
                hs.append(h)
            return x, jnp.stack(hs)

    @nnx.split_rngs(splits=L)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def stacked(rngs):
        return Layer(rngs)

    class Scanned(nnx.Module):
        def __init__(self, rngs):
            self.layers = stacked(rngs)

        def __call__(self, x, eps):
            def body(x, layer, e):
                return layer(x, e)
            if layout == "remat":
                body = nnx.remat(body)
            return nnx.scan(body, in_axes=(nnx.Carry, 0, 0), out_axes=(nnx.Carry, 0))(
                x, self.layers, eps)

    model = (Plain if layout == "plain" else Scanned)(nnx.Rngs(0))
    x, eps = inputs()

    @nnx.jit
    def step(model, s, eps):
        fwd = capture_all(model, rec, "**.mlp", s, "fwd")(x, eps)[1]

        def loss_fn(model, eps):
            out, hs = capture_all(model, rec, "**.mlp", s, "grad")(x, eps)
            return _loss(out), hs
        (_, hs), (grads, deps) = nnx.value_and_grad(loss_fn, argnums=(0, 1),
                                                    has_aux=True)(model, eps)
        nnx.update(model, jax.tree.map(lambda p, g: p - 0.1 * g,
                                       nnx.state(model, nnx.Param), grads))
        return fwd, hs, deps
    return lambda s: step(model, jnp.int32(s), eps)


def linen_step(layout, rec):
    from flax import linen as nn

    class MLP(nn.Module):
        @nn.compact
        def __call__(self, x):
            return jnp.tanh(nn.Dense(D)(x))

    class Layer(nn.Module):
        @nn.compact
        def __call__(self, x, eps):
            h = MLP(name="mlp")(x) + eps
            return x + h, h

    class Plain(nn.Module):
        @nn.compact
        def __call__(self, x, eps):
            hs = []
            for i in range(L):
                x, h = Layer(name=f"layers_{i}")(x, eps[i])
                hs.append(h)
            return x, jnp.stack(hs)

    class Scanned(nn.Module):
        @nn.compact
        def __call__(self, x, eps):
            layer = nn.remat(Layer) if layout == "remat" else Layer
            stack = nn.scan(layer, variable_axes={"params": 0}, split_rngs={"params": True},
                            in_axes=0, out_axes=0, length=L)
            return stack(name="layers")(x, eps)

    model = Plain() if layout == "plain" else Scanned()
    x, eps = inputs()
    params = [model.init(jax.random.key(0), x, eps)["params"]]

    @jax.jit
    def step(params, s, eps):
        fwd = capture_all(model, rec, "**/mlp", s, "fwd").apply({"params": params}, x, eps)[1]

        def loss_fn(params, eps):
            out, hs = capture_all(model, rec, "**/mlp", s, "grad").apply(
                {"params": params}, x, eps)
            return _loss(out), hs
        (_, hs), (grads, deps) = jax.value_and_grad(loss_fn, argnums=(0, 1),
                                                    has_aux=True)(params, eps)
        return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), (fwd, hs, deps)

    def one(s):
        params[0], out = step(params[0], s, eps)
        return out
    return one


def equinox_step(layout, rec):
    import equinox as eqx

    class MLP(eqx.Module):
        lin: eqx.nn.Linear

        def __init__(self, key):
            self.lin = eqx.nn.Linear(D, D, key=key)

        def __call__(self, x):
            return jnp.tanh(jax.vmap(self.lin)(x))

    class Layer(eqx.Module):
        mlp: MLP

        def __init__(self, key):
            self.mlp = MLP(key)

        def __call__(self, x, eps):
            h = self.mlp(x) + eps
            return x + h, h

    class Plain(eqx.Module):
        layers: list

        def __init__(self, key):
            self.layers = [Layer(k) for k in jax.random.split(key, L)]

        def __call__(self, x, eps):
            hs = []
            for i, layer in enumerate(self.layers):
                x, h = layer(x, eps[i])
                hs.append(h)
            return x, jnp.stack(hs)

    class Scanned(eqx.Module):
        layers: Layer

        def __init__(self, key):
            self.layers = eqx.filter_vmap(Layer)(jax.random.split(key, L))

        def __call__(self, x, eps):
            params, static = eqx.partition(self.layers, eqx.is_array)

            def body(x, pe):
                return eqx.combine(pe[0], static)(x, pe[1])
            if layout == "remat":
                body = jax.checkpoint(body)
            return lax.scan(body, x, (params, eps))

    model = [(Plain if layout == "plain" else Scanned)(jax.random.key(0))]
    x, eps = inputs()

    @eqx.filter_jit
    def step(model, s, eps):
        fwd = capture_all(model, rec, "**.mlp", s, "fwd")(x, eps)[1]

        def loss_fn(both):
            out, hs = capture_all(both[0], rec, "**.mlp", s, "grad")(x, both[1])
            return _loss(out), hs
        (_, hs), (grads, deps) = eqx.filter_value_and_grad(loss_fn, has_aux=True)(
            (model, eps))
        return eqx.apply_updates(model, jax.tree.map(lambda g: -0.1 * g, grads)), (
            fwd, hs, deps)

    def one(s):
        model[0], out = step(model[0], jnp.int32(s), eps)
        return out
    return one


STEPS = {"nnx": nnx_step, "linen": linen_step, "equinox": equinox_step}
NEEDS = {"nnx": "flax", "linen": "flax", "equinox": "equinox"}
# The names of the captured modules: one per layer unrolled, one for a stack (scan, remat).
MODULES = {"nnx": (["layers.0.mlp", "layers.1.mlp"], ["layers.mlp"]),
           "linen": (["layers_0/mlp", "layers_1/mlp"], ["layers/mlp"]),
           "equinox": (["layers.0.mlp", "layers.1.mlp"], ["layers.mlp"])}


# ---- what each kind of row is, by numpy --------------------------------------------------

def _stats(v):
    v = np.asarray(v, np.float64)
    want = {"count": v.size, "mean": v.mean(), "std": v.std(), "min": v.min(),
            "max": v.max(), "absmax": np.abs(v).max(), "l2": np.sqrt((v ** 2).sum()),
            "nan_count": 0, "inf_count": 0}
    return {c: want[c] for c in hostfeed.STATS if c in want}


def _assert_row(kind, row, v, what):
    v = np.asarray(v)
    if kind in ("raw", "every"):
        np.testing.assert_array_equal(row.view(np.uint32), v.view(np.uint32), err_msg=what)
    elif kind == "stats":
        want = _stats(v)
        np.testing.assert_allclose([row[hostfeed.STATS.index(c)] for c in want],
                                   list(want.values()), rtol=2e-6, atol=1e-7, err_msg=what)
    elif kind == "hist":
        inside, _ = np.histogram(v, bins=HIST.edges())
        assert row.tolist() == [int((v < -1).sum()), *inside.tolist(),
                                int((v > 1).sum())], what
    else:
        order = np.argsort(-v.reshape(-1), kind="stable")[:TOPK.k]
        np.testing.assert_array_equal(row, np.stack([v.reshape(-1)[order],
                                                     order.astype(np.float32)]), err_msg=what)


def _check(path, library, layout, results):
    """Every array of the matrix holds what it should: rows at the right steps, in layer
    order (cotangents of a stack in reverse layer order), equal to numpy on ``results``
    (per step: the forward call's values, the gradient call's, their cotangents)."""
    modules = MODULES[library][layout != "plain"]
    stack = len(modules) == 1
    expected = set()
    for mode in ("fwd", "grad"):
        for kind, (_, suffix, cotangents) in KINDS.items():
            steps = [0] if kind == "every" else list(range(S))
            group = f"{mode}/every" if kind == "every" else mode
            parts = [("", 0 if mode == "fwd" else 1)]
            if mode == "grad" and cotangents:
                parts.append((".cotangent", 2))
            for part, which in parts:
                for i, module in enumerate(modules):
                    name = f"{group}/{module}/output{part}{suffix}"
                    expected.add(name)
                    rows, meta = hostfeed.read_recording(path, name)
                    layers = list(range(L)) if stack else [i]
                    if part and stack:
                        layers = layers[::-1]  # the backward pass runs the stack backward
                    want = [(s, layer) for s in steps for layer in layers]
                    assert meta["step"].tolist() == [s for s, _ in want], name
                    for row, (s, layer) in zip(rows, want):
                        _assert_row(kind, row, results[s][which][layer],
                                    f"{name} at step {s}, layer {layer}")
    assert sorted(hostfeed.open_recording(path).names) == sorted(expected)


LAYOUTS = ("plain", "scan", "remat")


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("library", sorted(STEPS))
def test_every_capture_kind_records_its_rows_forward_and_under_grad(library, layout,
                                                                     tmp_path):
    pytest.importorskip(NEEDS[library], reason=f"needs hostfeed[{NEEDS[library]}]")
    if library == "linen" and layout != "plain" and flax_scan_refuses_effects():
        pytest.skip("this Flax's nn.scan refuses any effect in its body (docs/capture.md)")
    path = tmp_path / "run.zarr"
    with hostfeed.Recorder(path) as rec:
        step = STEPS[library](layout, rec)
        results = [jax.device_get(step(s)) for s in range(S)]
    _check(path, library, layout, results)
