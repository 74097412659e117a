"""What a capture reaches, and what it says when it records nothing.

- Arrays inside any registered pytree a module returns or takes are recorded, named by
  their path (a dataclass's fields), a named array's (Haliax's ``NamedArray``: its array
  and axis names; here a pytree class of the test's own shaped like it, since Haliax's
  PyPI release does not import on JAX 0.10+) under the module's own name with its axis
  names in the array's attributes, in an Equinox stack run by ``lax.scan`` under ``grad``
  as in Haliax's ``Stacked``, and in Flax NNX; an output with no array is an error.
- A Linen model that wraps an NNX model (``nnx.bridge.ToLinen``) captures the NNX model's
  submodules by their NNX names; a copy of the wrapper the capture cannot reach into is
  refused, saying what to capture instead.
- A capture that recorded no row says so (``hostfeed.CaptureWarning``): never used (the
  original model called), at the next ``barrier_wait``; only traced, at ``close``; an
  ``every=`` that selected none of the steps run, at ``close`` but not at a barrier
  before; at interpreter exit for a recorder never closed. A store with no array is an
  error that says nothing was recorded, not a traceback from difflib.
"""
from __future__ import annotations

import collections
import dataclasses
import warnings

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax import lax

import hostfeed

from conftest import run_python

pytest.importorskip("zarr", reason="reading back needs zarr-python")

B, D, L = 2, 3, 2
Axis = collections.namedtuple("Axis", "name size")  # as Haliax's Axis


@jax.tree_util.register_pytree_node_class
class Named:
    """A named array as Haliax's ``NamedArray`` is one: the array, and the axes as the
    pytree's static data (``register_pytree_node_class``, no keys)."""

    def __init__(self, array, axes):
        self.array, self.axes = array, tuple(axes)

    def tree_flatten(self):
        return (self.array,), self.axes

    @classmethod
    def tree_unflatten(cls, axes, children):
        return cls(children[0], axes)


AXES = (Axis("batch", B), Axis("embed", D))


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Out:
    hidden: Named
    gate: jax.Array
    note: str = dataclasses.field(default="", metadata=dict(static=True))


def attrs(path, name):
    return hostfeed.open_recording(path)[name].attrs


# ---- pytrees --------------------------------------------------------------------------------

def equinox_stacked():
    import equinox as eqx

    class Mlp(eqx.Module):  # takes and returns named arrays, as Haliax's modules do
        w: jax.Array

        def __call__(self, x):
            h = jnp.tanh(x.array @ self.w)
            return Out(Named(h, x.axes), jax.nn.sigmoid(h), note="a static field")

    class Layer(eqx.Module):
        mlp: Mlp

        def __call__(self, x):
            out = self.mlp(x)
            return Named(x.array + out.hidden.array - out.gate, x.axes)

    class Stacked(eqx.Module):  # as Haliax's Stacked: one layer, stacked, folded by a scan
        layers: Layer

        def __call__(self, x):
            params, static = eqx.partition(self.layers, eqx.is_array)
            x, _ = lax.scan(lambda x, p: (eqx.combine(p, static)(x), None), x, params)
            return x

    w = 0.8 * jax.random.normal(jax.random.key(0), (L, D, D))
    return Stacked(Layer(Mlp(w))), Mlp


def test_named_arrays_and_dataclass_outputs_of_a_scanned_equinox_stack_are_recorded(tmp_path):
    pytest.importorskip("equinox")
    import equinox as eqx
    model, _ = equinox_stacked()
    x = Named(jax.random.normal(jax.random.key(1), (B, D)), AXES)
    path = tmp_path / "run.zarr"
    with hostfeed.Recorder(path) as rec:
        @eqx.filter_jit
        def grads(model, s):
            def loss(model):
                captured = hostfeed.capture(model, rec, "layers.mlp", step=s, inputs=True)
                return jnp.sum(captured(x).array ** 2)
            return eqx.filter_grad(loss)(model)
        grads(model, jnp.int32(4))
    assert sorted(hostfeed.open_recording(path).names) == [
        "layers.mlp/input.0", "layers.mlp/input.0.cotangent", "layers.mlp/output.gate",
        "layers.mlp/output.gate.cotangent", "layers.mlp/output.hidden",
        "layers.mlp/output.hidden.cotangent"]
    # the values, layer by layer, as the model computes them without a capture
    h, want_in, want_hidden, want_gate = x.array, [], [], []
    for i in range(L):
        out = jax.tree.map(lambda p: p[i], model.layers).mlp(Named(h, AXES))
        want_in.append(h)
        want_hidden.append(out.hidden.array)
        want_gate.append(out.gate)
        h = h + out.hidden.array - out.gate
    for name, want in (("input.0", want_in), ("output.hidden", want_hidden),
                       ("output.gate", want_gate)):
        rows, meta = hostfeed.read_recording(path, f"layers.mlp/{name}")
        np.testing.assert_array_equal(rows, np.stack(want), err_msg=name)
        assert meta["step"].tolist() == [4] * L
    # a named array's axis names go with it, its cotangent's too; a plain array has none
    for name in ("input.0", "output.hidden", "output.hidden.cotangent"):
        assert attrs(path, f"layers.mlp/{name}")["axes"] == ["batch", "embed"], name
    assert "axes" not in attrs(path, "layers.mlp/output.gate")


def test_a_named_array_output_of_an_nnx_module_is_recorded_under_its_name(tmp_path):
    pytest.importorskip("flax")
    from flax import nnx

    class Proj(nnx.Module):
        def __init__(self, rngs):
            self.lin = nnx.Linear(D, D, rngs=rngs)

        def __call__(self, x):
            return Named(self.lin(x.array), x.axes)

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.proj = Proj(rngs)

        def __call__(self, x):
            return self.proj(x).array.sum()

    model = Net(nnx.Rngs(0))
    x = Named(jnp.ones((B, D)), AXES)
    path = tmp_path / "run.zarr"
    with hostfeed.Recorder(path) as rec:
        hostfeed.capture(model, rec, "proj", reduce="stats")(x)
        hostfeed.capture(model, rec, "proj", prefix="raw")(x)
    assert sorted(hostfeed.open_recording(path).names) == ["proj/output.stats",
                                                            "raw/proj/output"]
    rows, _ = hostfeed.read_recording(path, "raw/proj/output")
    np.testing.assert_array_equal(rows[0], model.proj(x).array)
    assert attrs(path, "raw/proj/output")["axes"] == ["batch", "embed"]
    assert "axes" not in attrs(path, "proj/output.stats")  # a summary's rows have others


def test_an_output_with_no_array_is_an_error_not_an_empty_store(tmp_path):
    pytest.importorskip("equinox")
    import equinox as eqx

    class Count(eqx.Module):
        def __call__(self, x):
            return {"calls": 1, "none": None}

    class Net(eqx.Module):
        count: Count

        def __call__(self, x):
            self.count(x)
            return x

    with hostfeed.Recorder(tmp_path / "run.zarr") as rec, \
            pytest.raises(ValueError, match=r"the output of 'count' \(a dict of int\) holds "
                                            r"no array, so there is nothing to record"):
        hostfeed.capture(Net(Count()), rec, "count")(jnp.ones(2))


# ---- Linen wrappers of NNX models ---------------------------------------------------------

def nnx_net(seen):
    from flax import nnx

    class Mlp(nnx.Module):
        def __init__(self, rngs):
            self.up = nnx.Linear(D, 2 * D, rngs=rngs)
            self.down = nnx.Linear(2 * D, D, rngs=rngs)

        def __call__(self, x):
            out = self.down(jax.nn.gelu(self.up(x)))
            seen.append(out)
            return out

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.blocks = nnx.List([Mlp(rngs) for _ in range(L)])

        def __call__(self, x):
            for block in self.blocks:
                x = x + block(x)
            return x

    return Net


def test_a_linen_wrapper_of_an_nnx_model_captures_its_submodules_by_their_nnx_names(
        tmp_path):
    pytest.importorskip("flax")
    from flax import linen as nn, nnx
    seen = []
    Net = nnx_net(seen)
    x = jax.random.normal(jax.random.key(1), (B, D))
    wrapped = nnx.bridge.ToLinen(Net)

    class Outer(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.Dense(D)(nnx.bridge.ToLinen(Net, name="inner")(x))

    outer = Outer()
    variables = jax.jit(wrapped.init)(jax.random.key(0), x)  # jitted: an NNX model's
    outer_variables = jax.jit(outer.init)(jax.random.key(0), x)  # eager init compiles a lot
    path = tmp_path / "run.zarr"
    def seen_by(fn):  # fn's result and the MLP outputs it computed, jitted
        def run(*args):
            seen.clear()
            return fn(*args), list(seen)
        return jax.jit(run)

    with hostfeed.Recorder(path) as rec:
        y, at_root = seen_by(lambda v, x: hostfeed.capture(
            wrapped, rec, "blocks.*.down", step=1).apply(v, x))(variables, x)
        _, nested = seen_by(lambda v, x: hostfeed.capture(
            outer, rec, "inner/blocks.1").apply(v, x))(outer_variables, x)
        with pytest.raises(ValueError, match=r"'no_such_module' selects no submodule.*its "
                                             r"submodules are: blocks\.0, blocks\.0\.down"):
            jax.jit(hostfeed.capture(wrapped, rec, "no_such_module").apply)(variables, x)
    np.testing.assert_array_equal(y, jax.jit(wrapped.apply)(variables, x))  # unchanged
    assert sorted(hostfeed.open_recording(path).names) == [
        "blocks.0.down/output", "blocks.1.down/output", "inner/blocks.1/output"]
    for i in range(L):
        rows, meta = hostfeed.read_recording(path, f"blocks.{i}.down/output")
        np.testing.assert_array_equal(rows[0], at_root[i])
        assert meta["step"].tolist() == [1]
    rows, _ = hostfeed.read_recording(path, "inner/blocks.1/output")
    np.testing.assert_array_equal(rows[0], nested[1])


def test_a_wrapper_the_capture_cannot_reach_into_is_refused_saying_what_to_capture(tmp_path):
    pytest.importorskip("flax")
    from flax import linen as nn, nnx
    Net = nnx_net([])

    class MyToLinen(nn.Module):  # a copy of ToLinen without its nnx_method
        nnx_class: type

        @nn.compact
        def __call__(self, x):
            return self.nnx_class(rngs=nnx.Rngs(0))(x)

    model = MyToLinen(Net)
    with hostfeed.Recorder(tmp_path / "run.zarr") as rec, pytest.raises(
            ValueError, match=r"MyToLinen \(the model\) is a Linen module that wraps the "
                              r"NNX module Net .* capture the NNX model itself"):
        hostfeed.capture(model, rec, "blocks.*").apply({}, jnp.ones((B, D)))


# ---- no silent capture ----------------------------------------------------------------------

def models():
    """One tiny model per library: (library, model, how to call it, a selection)."""
    out = []
    x = jnp.ones((B, D))
    try:
        from flax import linen as nn, nnx
    except ImportError:
        pass
    else:
        net = nnx_net([])(nnx.Rngs(0))
        out.append(("nnx", net, lambda m: m(x), "blocks.*.down"))

        class Lin(nn.Module):
            @nn.compact
            def __call__(self, x):
                return nn.Dense(D)(x)
        lin = Lin()
        variables = lin.init(jax.random.key(0), x)
        out.append(("linen", lin, lambda m: m.apply(variables, x), "Dense_0"))
    try:
        import equinox as eqx
    except ImportError:
        pass
    else:
        class Net(eqx.Module):
            lin: eqx.nn.Linear

            def __call__(self, x):
                return self.lin(x)
        out.append(("equinox", Net(eqx.nn.Linear(D, D, key=jax.random.key(0))),
                    lambda m: m(jnp.ones(D)), "lin"))
    return out


def _no_warning():
    return warnings.catch_warnings(action="error", category=hostfeed.CaptureWarning)


def test_a_capture_never_used_says_so_at_the_next_barrier_naming_its_patterns(tmp_path):
    cases = models()
    if not cases:
        pytest.skip("needs flax or equinox")
    with hostfeed.Recorder(tmp_path / "run.zarr") as rec:
        for library, model, call, select in cases:
            captured = hostfeed.capture(model, rec, select, step=0)
            call(model)  # the original model: records nothing
            with pytest.warns(hostfeed.CaptureWarning) as said:
                hostfeed.barrier_wait()
            text = str(said[0].message)
            assert f"hostfeed.capture({type(model).__name__}, {select!r}) recorded no row by " \
                   f"barrier_wait" in text and "never used" in text, (library, text)
            assert "a call of the original model records nothing" in text
            with _no_warning():  # said once
                hostfeed.barrier_wait()
                call(captured)  # used now: it records, and says nothing more
                hostfeed.barrier_wait()
    recorded = {"nnx": ["blocks.0.down/output", "blocks.1.down/output"],
                "linen": ["Dense_0/output"], "equinox": ["lin/output"]}
    assert sorted(hostfeed.open_recording(tmp_path / "run.zarr").names) == sorted(
        name for library, *_ in cases for name in recorded[library])


def test_a_capture_only_traced_says_so_and_every_with_no_step_at_close_only(tmp_path):
    cases = models()
    if not cases:
        pytest.skip("needs flax or equinox")
    library, model, call, select = cases[0]
    rec = hostfeed.Recorder(tmp_path / "run.zarr")
    jax.eval_shape(lambda: call(hostfeed.capture(model, rec, select)))
    skipped = jax.jit(lambda s: call(hostfeed.capture(model, rec, select, step=s, every=5,
                                                      prefix="every")))
    skipped(jnp.int32(1))
    with pytest.warns(hostfeed.CaptureWarning) as said:
        hostfeed.barrier_wait()  # not the every= capture: its step may come
    assert len(said) == 1, [str(w.message) for w in said]
    assert "were traced but none was compiled into a computation that ran: the function " \
        "was only traced (jax.eval_shape" in str(said[0].message)
    with pytest.warns(hostfeed.CaptureWarning) as said:
        rec.close()
    assert len(said) == 1, [str(w.message) for w in said]
    assert "prefix='every'" in str(said[0].message) and "no step run was selected by its " \
        "every=/start=/stop=" in str(said[0].message)
    with hostfeed.Recorder(tmp_path / "empty.zarr"):
        pass
    with pytest.raises(KeyError, match=r"holds no array, so no 'x': nothing was recorded"):
        hostfeed.read_recording(tmp_path / "empty.zarr", "x")


def test_a_capture_never_used_with_its_recorder_never_closed_says_so_at_exit(tmp_path):
    pytest.importorskip("equinox")
    done = run_python(f"""
        import equinox as eqx, jax, hostfeed
        rec = hostfeed.Recorder({str(tmp_path / "run.zarr")!r})
        model = eqx.nn.MLP(2, 2, 4, 1, key=jax.random.key(0))
        captured = hostfeed.capture(model, rec, "layers.0")
        model(jax.numpy.ones(2))
        print("ran")
    """)
    assert done.returncode == 0 and "ran" in done.stdout, done.stderr
    assert "CaptureWarning: hostfeed.capture(MLP, 'layers.0') recorded no row by its " \
           "recorder's close" in done.stderr and "never used" in done.stderr, done.stderr
