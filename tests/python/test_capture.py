"""``hostfeed.capture``: a model's submodules recorded by name, without editing the model,
for a small transformer written in Flax NNX, Flax Linen and Equinox, each trained for a few
steps of its library's jitted step with its blocks' MLP outputs captured (raw every other
step, their statistics, a histogram at some steps). Each step is also run from the same
parameters without hostfeed, the MLP outputs taken out through a hook of the test's own
(``tap``): what is read back equals those values bit for bit, the cotangents equal
``jax.vjp``'s (the gradient with respect to a zero added to the output), the losses are
the same bit for bit and the gradients the same up to rounding (exactly those of the same
step with hand-placed ``rec.record`` calls), and the captured step compiles once."""
from __future__ import annotations

import importlib.util
import sys

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import hostfeed

from helpers.reading import read

pytest.importorskip("zarr", reason="reading back needs zarr-python")

B, T, F, D, BLOCKS = 2, 4, 3, 8, 2  # batch, tokens, input features, width, blocks
STEPS, EVERY = 6, 2
RECORDED = list(range(0, STEPS, EVERY))
HIST = (6, (-1.5, 1.5))  # bins, range
HIST_STEPS = [1, 2, 3]  # start=1, stop=4

# The test's own hook at the end of each model's MLP: the identity, or (while a `Taps` is
# on) the output plus a perturbation, kept.
_TAP: list = [None]


def tap(h):
    return h if _TAP[0] is None else _TAP[0](h)


class Taps:
    """While on: each MLP output, in call order, plus ``eps[i]`` (zeros: the gradient with
    respect to it is the output's cotangent), kept in ``seen``; ``record(i, h)``, if given,
    records it by hand."""

    def __init__(self, eps, record=None):
        self.eps, self.record, self.seen = list(eps), record, []

    def __enter__(self):
        _TAP[0] = self._tap
        return self

    def __exit__(self, *exc):
        _TAP[0] = None

    def _tap(self, h):
        h = h + self.eps[len(self.seen)]
        if self.record is not None:
            h = self.record(len(self.seen), h)
        self.seen.append(h)
        return h


def data():
    kx, ky = jax.random.split(jax.random.key(1))
    return jax.random.normal(kx, (B, T, F)), jax.random.normal(ky, (B, T, 1))


def names_in(path):
    return sorted(hostfeed.open_recording(path).names)


def assert_stats_of(row, values, what):
    """``row`` (of ``reduce="stats"``) holds numpy's statistics of ``values``, column by
    column as ``hostfeed.STATS`` names them (columns this test does not know are left)."""
    v = np.asarray(values, np.float64)
    want = {"count": v.size, "mean": v.mean(), "std": v.std(), "min": v.min(),
            "max": v.max(), "absmax": np.abs(v).max(), "l2": np.sqrt((v ** 2).sum()),
            "nan_count": 0, "inf_count": 0}
    columns = [c for c in hostfeed.STATS if c in want]
    assert len(columns) >= 7, hostfeed.STATS
    np.testing.assert_allclose([row[hostfeed.STATS.index(c)] for c in columns],
                               [want[c] for c in columns], rtol=2e-6, atol=1e-7, err_msg=what)


def assert_bits_equal(a, b, what):
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape and a.dtype == b.dtype, (what, a.shape, b.shape)
    np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32), err_msg=what)


# ---- the three models --------------------------------------------------------------------

def nnx_model():
    from flax import nnx

    class MLP(nnx.Module):
        def __init__(self, rngs):
            self.up = nnx.Linear(D, 2 * D, rngs=rngs)
            self.down = nnx.Linear(2 * D, D, rngs=rngs)

        def __call__(self, x):
            return tap(self.down(jax.nn.gelu(self.up(x))))

    class Block(nnx.Module):
        def __init__(self, rngs):
            self.norm1 = nnx.LayerNorm(D, rngs=rngs)
            self.attn = nnx.MultiHeadAttention(num_heads=2, in_features=D, decode=False,
                                               rngs=rngs)
            self.norm2 = nnx.LayerNorm(D, rngs=rngs)
            self.mlp = MLP(rngs)

        def __call__(self, x):
            x = x + self.attn(self.norm1(x))
            return x + self.mlp(self.norm2(x))

    class Transformer(nnx.Module):
        def __init__(self, rngs):
            self.embed = nnx.Linear(F, D, rngs=rngs)
            self.blocks = nnx.List([Block(rngs) for _ in range(BLOCKS)])
            self.head = nnx.Linear(D, 1, rngs=rngs)

        def __call__(self, x):
            x = self.embed(x)
            for block in self.blocks:
                x = block(x)
            return self.head(x)

    return Transformer(nnx.Rngs(0))


def linen_model():
    from flax import linen as nn

    class MLP(nn.Module):
        @nn.compact
        def __call__(self, x):
            return tap(nn.Dense(D)(jax.nn.gelu(nn.Dense(2 * D)(x))))

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = x + nn.MultiHeadDotProductAttention(num_heads=2)(nn.LayerNorm()(x))
            return x + MLP()(nn.LayerNorm()(x))

    class Transformer(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = nn.Dense(D)(x)
            for _ in range(BLOCKS):
                x = Block()(x)
            return nn.Dense(1)(x)

    return Transformer()


def equinox_model():
    import equinox as eqx

    class MLP(eqx.Module):
        up: eqx.nn.Linear
        down: eqx.nn.Linear

        def __init__(self, key):
            k1, k2 = jax.random.split(key)
            self.up = eqx.nn.Linear(D, 2 * D, key=k1)
            self.down = eqx.nn.Linear(2 * D, D, key=k2)

        def __call__(self, x):  # x: [T, D]
            return tap(jax.vmap(self.down)(jax.nn.gelu(jax.vmap(self.up)(x))))

    class Block(eqx.Module):
        norm1: eqx.nn.LayerNorm
        attn: eqx.nn.MultiheadAttention
        norm2: eqx.nn.LayerNorm
        mlp: MLP

        def __init__(self, key):
            k1, k2 = jax.random.split(key)
            self.norm1, self.norm2 = eqx.nn.LayerNorm(D), eqx.nn.LayerNorm(D)
            self.attn = eqx.nn.MultiheadAttention(2, D, key=k1)
            self.mlp = MLP(k2)

        def __call__(self, x):
            h = jax.vmap(self.norm1)(x)
            x = x + self.attn(h, h, h)
            return x + self.mlp(jax.vmap(self.norm2)(x))

    class Transformer(eqx.Module):
        embed: eqx.nn.Linear
        blocks: list
        head: eqx.nn.Linear

        def __init__(self, key):
            keys = jax.random.split(key, BLOCKS + 2)
            self.embed = eqx.nn.Linear(F, D, key=keys[0])
            self.blocks = [Block(k) for k in keys[1:-1]]
            self.head = eqx.nn.Linear(D, 1, key=keys[-1])

        def __call__(self, x):  # one example, [T, F]
            x = jax.vmap(self.embed)(x)
            for block in self.blocks:
                x = block(x)
            return jax.vmap(self.head)(x)

    return Transformer(jax.random.key(0))


# ---- a jitted training step per library --------------------------------------------------
# `make(rec, captures, hand)`: a `Run` of the library's usual jitted training step, each
# dict of `captures` a `hostfeed.capture` of the blocks' MLPs (raw, stats, ...); `hand`:
# record the same outputs by hand instead, through the test's hook.

class Run:
    def __init__(self, step, get, put, traces):
        self._step, self.get, self.put, self.traces = step, get, put, traces

    def __call__(self, s):
        """One step: loss, gradients, MLP outputs and their cotangents (numpy)."""
        eps = [jnp.zeros((B, T, D)) for _ in range(BLOCKS)]
        return jax.device_get(self._step(jnp.int32(s), eps))


def _sgd(params, grads):
    return jax.tree.map(lambda p, g: p - 0.05 * g, params, grads)


def _hand(rec, modules, s):
    return None if rec is None else (
        lambda i, h: rec.record(f"{modules[i]}/output", h, step=s, every=EVERY))


def _captured(model, rec, select, s, captures):
    for kwargs in captures:
        model = hostfeed.capture(model, rec, select, step=s, **kwargs)
    return model


def nnx_run(rec=None, captures=(), hand=None):
    from flax import nnx
    model, (x, y) = nnx_model(), data()
    traces = []

    @nnx.jit
    def step(model, s, eps):
        traces.append(1)

        def loss_fn(model, eps):
            m = _captured(model, rec, "blocks.*.mlp", s, captures)
            with Taps(eps, _hand(hand, MODULES["nnx"], s)) as t:
                return jnp.mean((m(x) - y) ** 2), t.seen
        (loss, seen), (grads, deps) = nnx.value_and_grad(loss_fn, argnums=(0, 1),
                                                         has_aux=True)(model, eps)
        nnx.update(model, _sgd(nnx.state(model, nnx.Param), grads))
        return loss, grads, seen, deps

    def put(state):
        nnx.update(model, jax.tree.map(jnp.asarray, state))
    return Run(lambda s, eps: step(model, s, eps), lambda: jax.device_get(nnx.state(model)),
               put, traces)


def _functional_run(params, step, traces):
    state = [params]

    def one(s, eps):
        state[0], out = step(state[0], s, eps)
        return out

    def put(p):
        state[0] = jax.tree.map(lambda v: jnp.asarray(v) if isinstance(v, np.ndarray) else v,
                                p)
    return Run(one, lambda: jax.device_get(state[0]), put, traces)


def linen_run(rec=None, captures=(), hand=None):
    model, (x, y) = linen_model(), data()
    params = model.init(jax.random.key(0), x)["params"]
    traces = []

    @jax.jit
    def step(params, s, eps):
        traces.append(1)

        def loss_fn(params, eps):
            m = _captured(model, rec, "Block_*/MLP_0", s, captures)
            with Taps(eps, _hand(hand, MODULES["linen"], s)) as t:
                return jnp.mean((m.apply({"params": params}, x) - y) ** 2), t.seen
        (loss, seen), (grads, deps) = jax.value_and_grad(loss_fn, argnums=(0, 1),
                                                         has_aux=True)(params, eps)
        return _sgd(params, grads), (loss, grads, seen, deps)

    run = _functional_run(params, step, traces)
    run.jitted = step
    return run


def equinox_run(rec=None, captures=(), hand=None):
    import equinox as eqx
    model, (x, y) = equinox_model(), data()
    traces = []

    @eqx.filter_jit
    def step(model, s, eps):
        traces.append(1)

        def loss_fn(both):
            model, eps = both
            m = _captured(model, rec, "blocks.*.mlp", s, captures)

            def one(xi, eps_i):  # one example per lane of vmap: a row per example
                with Taps(eps_i, _hand(hand, MODULES["equinox"], s)) as t:
                    return m(xi), t.seen
            out, seen = jax.vmap(one)(x, eps)
            return jnp.mean((out - y) ** 2), seen
        (loss, seen), (grads, deps) = eqx.filter_value_and_grad(loss_fn, has_aux=True)(
            (model, eps))
        return eqx.apply_updates(model, jax.tree.map(lambda g: -0.05 * g, grads)), (
            loss, grads, seen, deps)

    return _functional_run(model, step, traces)


RUNS = {"nnx": nnx_run, "linen": linen_run, "equinox": equinox_run}
MODULES = {"nnx": ["blocks.0.mlp", "blocks.1.mlp"],
           "linen": ["Block_0/MLP_0", "Block_1/MLP_0"],
           "equinox": ["blocks.0.mlp", "blocks.1.mlp"]}
NEEDS = {"nnx": "flax", "linen": "flax", "equinox": "equinox"}


@pytest.fixture(params=sorted(RUNS))
def library(request):
    need = NEEDS[request.param]
    pytest.importorskip(need, reason=f"needs {need} (pip install '.[{need}]')")
    return request.param


def _rows_per_step(rows, library):
    """Equinox's model runs one example per lane of vmap: a row per example, in lane order."""
    return rows.reshape(-1, B, *rows.shape[1:]) if library == "equinox" else rows


def _grad_leaves(grads):
    return [np.asarray(g) for g in jax.tree.leaves(grads)]


def _side_by_side(a, b):
    """Steps of run ``a``, each also run by ``b`` from the same parameters; b's results."""
    out = []
    for s in range(STEPS):
        before = a.get()
        got = a(s)
        b.put(before)
        want = b(s)
        assert_bits_equal(got[0], want[0], f"loss at step {s}")
        out.append((got, want))
    return out


# ---- tests ---------------------------------------------------------------------------------

def test_without_cotangents_the_gradients_are_bit_for_bit_those_without_capture(
        library, tmp_path):
    path = tmp_path / "run.zarr"
    with hostfeed.Recorder(path) as rec:
        captured = RUNS[library](rec, captures=[dict(every=EVERY, cotangents=False)])
        steps = _side_by_side(captured, RUNS[library]())
    for s, ((_, grads, _, _), (_, plain_grads, _, _)) in enumerate(steps):
        for g, p in zip(_grad_leaves(grads), _grad_leaves(plain_grads)):
            assert_bits_equal(np.asarray(g), np.asarray(p), f"a gradient at step {s}")
    assert names_in(path) == sorted(f"{m}/output" for m in MODULES[library])


def test_selected_mlp_outputs_stats_histograms_and_cotangents_equal_the_uncaptured_values(
        library, tmp_path):
    make, modules = RUNS[library], MODULES[library]
    hist = hostfeed.Histogram(HIST[0], range=HIST[1])
    path = tmp_path / "run.zarr"
    with hostfeed.Recorder(path) as rec:
        captured = make(rec, captures=[dict(every=EVERY), dict(reduce="stats", every=EVERY),
                                       dict(reduce=hist, start=1, stop=4)])
        plain = make()
        steps = _side_by_side(captured, plain)
    assert captured.traces == [1] and plain.traces == [1]  # each compiled once
    if library == "linen":
        assert captured.jitted._cache_size() == 1
    for s, ((_, grads, _, _), (_, plain_grads, _, _)) in enumerate(steps):
        # Capturing changed no result (the gradients up to rounding: a cotangent's record
        # in the backward pass changes XLA's fusion as a hand-placed record does; see
        # test_gradients_are_those_of_the_same_step_with_hand_placed_records).
        for g, p in zip(_grad_leaves(grads), _grad_leaves(plain_grads)):
            np.testing.assert_allclose(g, p, rtol=1e-4, atol=1e-4 * np.abs(p).max(),
                                       err_msg=f"step {s}")

    lanes = B if library == "equinox" else 1
    assert names_in(path) == sorted(
        f"{m}/output{c}" for m in modules for c in (
            "", ".cotangent", ".stats", ".hist", ".cotangent.stats", ".cotangent.hist"))
    for i, module in enumerate(modules):
        outputs = {s: want[2][i] for s, (_, want) in enumerate(steps)}
        cotangents = {s: want[3][i] for s, (_, want) in enumerate(steps)}
        rows, got_steps = read(path, f"{module}/output")
        assert got_steps == [s for s in RECORDED for _ in range(lanes)]
        assert_bits_equal(_rows_per_step(rows, library),
                          np.stack([outputs[s] for s in RECORDED]), module)
        rows, got_steps = read(path, f"{module}/output.cotangent")
        assert got_steps == [s for s in RECORDED for _ in range(lanes)]
        assert_bits_equal(_rows_per_step(rows, library),
                          np.stack([cotangents[s] for s in RECORDED]), module + " cotangent")

        # Summaries of the outputs and, at the same steps, of their cotangents: numpy's.
        for part, values in (("", outputs), (".cotangent", cotangents)):
            stats, got_steps = read(path, f"{module}/output{part}.stats")
            assert got_steps == [s for s in RECORDED for _ in range(lanes)]
            for row, s in zip(_rows_per_step(stats, library), RECORDED):
                for lane_row, lane in zip(row if lanes > 1 else [row],
                                          values[s] if lanes > 1 else [values[s]]):
                    assert_stats_of(lane_row, lane, f"{module}{part} stats at step {s}")
            counts, got_steps = read(path, f"{module}/output{part}.hist")
            assert got_steps == [s for s in HIST_STEPS for _ in range(lanes)]
            for row, s in zip(_rows_per_step(counts, library), HIST_STEPS):
                for lane_row, v in zip(row if lanes > 1 else [row],
                                       values[s] if lanes > 1 else [values[s]]):
                    inside, _ = np.histogram(v, bins=hist.edges())
                    assert lane_row.tolist() == [int((v < HIST[1][0]).sum()), *inside.tolist(),
                                                 int((v > HIST[1][1]).sum())], (module, part, s)


def test_gradients_are_those_of_the_same_step_with_hand_placed_records(tmp_path):
    pytest.importorskip("flax")
    with hostfeed.Recorder(tmp_path / "captured.zarr") as rec, \
            hostfeed.Recorder(tmp_path / "hand.zarr") as by_hand:
        steps = _side_by_side(linen_run(rec, captures=[dict(every=EVERY)]),
                              linen_run(hand=by_hand))
    for s, (got, want) in enumerate(steps):
        for g, w in zip(_grad_leaves(got[1]), _grad_leaves(want[1])):
            assert_bits_equal(g, w, f"gradient at step {s}")
    for name in names_in(tmp_path / "hand.zarr"):
        assert_bits_equal(read(tmp_path / "captured.zarr", name)[0],
                          read(tmp_path / "hand.zarr", name)[0], name)
    assert names_in(tmp_path / "captured.zarr") == names_in(tmp_path / "hand.zarr")


def test_under_recorder_step_the_rows_are_those_of_jax_jit(tmp_path):
    """``rec.step`` (the records taken out as outputs, as on a TPU) writes what ``jax.jit``
    writes (the forward pass: test_recorded_step.py covers records under grad)."""
    pytest.importorskip("flax")
    model, (x, y) = linen_model(), data()
    params = model.init(jax.random.key(0), x)["params"]
    out = {}
    for way in ("step", "jit"):
        path = tmp_path / f"{way}.zarr"
        with hostfeed.Recorder(path) as rec:
            def loss(params, s):
                m = hostfeed.capture(model, rec, "Block_*/MLP_0", step=s, every=2)
                return jnp.mean((m.apply({"params": params}, x) - y) ** 2)
            f = rec.step(loss, outputs=True) if way == "step" else jax.jit(loss)
            for s in range(4):
                f(params, s)
        out[way] = {n: read(path, n) for n in names_in(path)}
    assert sorted(out["step"]) == sorted(out["jit"]) and len(out["jit"]) == 2
    for name, (rows, steps) in out["jit"].items():
        assert steps == [0, 2] and out["step"][name][1] == steps, name
        assert_bits_equal(out["step"][name][0], rows, name)

def test_a_pattern_that_selects_nothing_is_an_error_listing_the_names_there_are(library,
                                                                                tmp_path):
    x, _ = data()
    with hostfeed.Recorder(tmp_path / "run.zarr") as rec:
        if library == "nnx":
            model = nnx_model()
            with pytest.raises(ValueError, match=r"'blocks\.\*\.mlpp' selects no submodule of "
                                                 r"a Flax NNX model.*submodules are: "
                                                 r"blocks\.0, blocks\.0\.attn, .*blocks\.1\.mlp"
                                                 r"\.up, .*embed, head"):
                hostfeed.capture(model, rec, ["blocks.*.mlp", "blocks.*.mlpp"])
            with pytest.raises(ValueError, match="the predicate selected no submodule"):
                hostfeed.capture(model, rec, lambda name, m: False)
        elif library == "linen":
            model = linen_model()
            params = model.init(jax.random.key(0), x)
            with pytest.raises(ValueError, match=r"'Block_\*/Mlp_0' selects no submodule of "
                                                 r"a Flax Linen model.*submodules are: "
                                                 r"Block_0, Block_0/LayerNorm_0, .*MLP_0.*"
                                                 r"Dense_0, Dense_1$"):
                hostfeed.capture(model, rec, "Block_*/Mlp_0").apply(params, x)
        else:
            model = equinox_model()
            with pytest.raises(ValueError, match=r"'blocks\.\*\.mlpp' selects no submodule of "
                                                 r"an Equinox model.*submodules are: "
                                                 r"blocks\.0, blocks\.0\.attn, .*head"):
                hostfeed.capture(model, rec, "blocks.*.mlpp")
    assert names_in(tmp_path / "run.zarr") == []


def test_inputs_patterns_predicates_and_prefix_name_the_arrays_as_documented(tmp_path):
    pytest.importorskip("flax")
    from flax import nnx
    model, (x, _) = nnx_model(), data()
    path = tmp_path / "run.zarr"
    with hostfeed.Recorder(path) as rec:
        # '**' reaches any depth; a predicate sees the name and the module.
        m = hostfeed.capture(model, rec, ["**.up", "head"], inputs=True, prefix="acts")
        m = hostfeed.capture(m, rec, lambda name, mod: isinstance(mod, nnx.LayerNorm)
                             and name.endswith("norm2"), step=7, outputs=False, inputs=True)
        y = jax.jit(lambda x: m(x))(x)
    np.testing.assert_array_equal(y, jax.jit(lambda x: model(x))(x))
    assert names_in(path) == sorted(
        [f"acts/blocks.{i}.mlp.up/{r}" for i in range(BLOCKS) for r in ("input.0", "output")]
        + ["acts/head/input.0", "acts/head/output"]
        + [f"blocks.{i}.norm2/input.0" for i in range(BLOCKS)])
    rows, steps = read(path, "blocks.1.norm2/input.0")
    assert steps == [7] and rows.shape == (1, B, T, D)
    rows, steps = read(path, "acts/head/output")
    assert steps == [-1]
    np.testing.assert_array_equal(rows[0], y)


def test_a_capture_is_also_a_context_manager_and_restores_the_classes(tmp_path):
    pytest.importorskip("flax")
    model, (x, _) = nnx_model(), data()
    mlp_class = type(model.blocks[0].mlp)
    before = dict(vars(mlp_class))
    with hostfeed.Recorder(tmp_path / "run.zarr") as rec:
        other = nnx_model()  # another instance of the same classes records nothing
        with hostfeed.capture(model, rec, "blocks.0.mlp", step=3) as m:
            assert m is model
            y = model(x)
            other(x)
        model(x)  # after the block: not recorded
    assert dict(vars(mlp_class)) == before
    rows, steps = read(tmp_path / "run.zarr", "blocks.0.mlp/output")
    assert steps == [3] and names_in(tmp_path / "run.zarr") == ["blocks.0.mlp/output"]
    assert rows.shape == (1, B, T, D) and np.asarray(y).shape == (B, T, 1)


def test_equinox_capture_is_a_pytree_of_the_same_leaves(tmp_path):
    pytest.importorskip("equinox")
    model, (x, _) = equinox_model(), data()
    with hostfeed.Recorder(tmp_path / "run.zarr") as rec:
        captured = hostfeed.capture(model, rec, "blocks.*.mlp")
        # The wrapper's other attributes are the module's.
        assert captured.blocks[0].mlp.up.weight is model.blocks[0].mlp.up.weight
        assert type(captured.blocks[0].mlp).__name__ == "Captured"
        for a, b in zip(jax.tree.leaves(captured), jax.tree.leaves(model)):
            assert a is b
        again = hostfeed.capture(captured, rec, "blocks.1.mlp", reduce="stats")
        np.testing.assert_array_equal(jax.jit(jax.vmap(again))(x), jax.jit(jax.vmap(model))(x))
    path = tmp_path / "run.zarr"
    assert names_in(path) == ["blocks.0.mlp/output", "blocks.1.mlp/output",
                              "blocks.1.mlp/output.stats"]


def test_bad_arguments_are_errors_that_say_what_to_do(tmp_path, monkeypatch):
    with hostfeed.Recorder(tmp_path / "run.zarr") as rec:
        with pytest.raises(TypeError, match=r"Flax NNX module.*Equinox module, got "
                                            r"builtins\.dict: pass the model"):
            hostfeed.capture({"w": jnp.ones(2)}, rec, "w")
        if importlib.util.find_spec("flax") is None:
            return
        model = nnx_model()
        with pytest.raises(ValueError, match="pass the step too"):
            hostfeed.capture(model, rec, "blocks.*.mlp", every=10)
        with pytest.raises(ValueError, match="reduce must be None, 'stats' or a hostfeed"):
            hostfeed.capture(model, rec, "blocks.*.mlp", reduce="mean")
        with pytest.raises(TypeError, match="select must be a glob pattern"):
            hostfeed.capture(model, rec, 3)
        with pytest.raises(ValueError, match="has an empty part"):
            hostfeed.capture(model, rec, "blocks..mlp")
        with pytest.raises(TypeError, match="recorder must be a hostfeed.Recorder"):
            hostfeed.capture(model, "run.zarr", "blocks.*.mlp")
        monkeypatch.setitem(sys.modules, "hostfeed._src.capture.nnx", None)
        # hostfeed is installed from its checkout, not an index: what works is named.
        with pytest.raises(ImportError, match=r"Flax NNX model needs flax: pip install "
                                              r"'flax' \(or, in hostfeed's checkout, pip "
                                              r"install '\.\[flax\]'\)"):
            hostfeed.capture(model, rec, "blocks.*.mlp")


@pytest.mark.parametrize("name", ["hostfeed._src.capture", "hostfeed._src.capture.selection",
                                  "hostfeed._src.capture.calls"])
def test_docstring_examples(name):
    import doctest
    import importlib
    assert doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS).failed == 0
