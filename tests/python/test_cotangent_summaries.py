"""Summaries under ``grad``: ``rec.record(name, h, reduce=...)`` in a layer stack run
plainly, by ``lax.scan`` and by a scan of a ``jax.checkpoint``-ed layer writes the
summary of each layer's value in the forward pass and, with cotangents on (the default),
the same summary of its cotangent under ``name.cotangent`` in the backward pass (at the
same steps, for ``every=``; per lane under ``vmap``), equal to numpy on the values and on
the cotangents ``jax.grad`` gives; ``every=`` with ``cotangents=False`` records its rows
there too. ``show`` and the TensorBoard export draw the cotangents' summaries beside the
values'."""
from __future__ import annotations

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax import lax

import hostfeed

pytest.importorskip("zarr", reason="reading back needs zarr-python")

B, D, L = 2, 3, 2
HIST = hostfeed.Histogram(4, range=(-1.0, 1.0))
TOPK = hostfeed.TopK(2)
REDUCTIONS = {"s": "stats", "hh": HIST, "t": TOPK}  # name -> reduce


def weights():
    return 0.7 * jax.random.normal(jax.random.key(0), (L, D, D))


def xs():
    return jax.random.normal(jax.random.key(1), (B, D))


def stack(rec, layout, step, every=None, cotangents=None, recorded=REDUCTIONS):
    """``loss(W, eps)`` of L layers ``h = tanh(x @ W[l]) + eps[l]; x = x + h`` recording
    each ``h`` (before ``eps``: the gradient with respect to ``eps`` is its cotangent)
    under every name of ``recorded``, run as ``layout``; returns (loss, hs)."""
    def layer(x, w, e, name_of):
        h = jnp.tanh(x @ w)
        for name, reduce in recorded.items():
            h = rec.record(name_of(name), h, step=step, reduce=reduce, every=every,
                           cotangents=cotangents)
        h = h + e
        return x + h, h

    def loss(W, eps, x):
        if layout == "plain":
            hs = []
            for i in range(L):
                x, h = layer(x, W[i], eps[i], lambda n, i=i: f"{n}{i}")
                hs.append(h)
            hs = jnp.stack(hs)
        else:
            def body(x, we):
                return layer(x, we[0], we[1], lambda n: n)
            if layout == "remat":
                body = jax.checkpoint(body)
            x, hs = lax.scan(body, x, (W, eps))
        return jnp.sum(x ** 2), hs
    return loss


def numpy_row(reduce, v):
    v = np.asarray(v)
    if reduce == "stats":
        f = v.astype(np.float64)
        want = {"count": f.size, "mean": f.mean(), "std": f.std(), "min": f.min(),
                "max": f.max(), "absmax": np.abs(f).max(), "l2": np.sqrt((f * f).sum()),
                "nan_count": 0, "inf_count": 0}
        return {c: want[c] for c in hostfeed.STATS if c in want}
    if isinstance(reduce, hostfeed.Histogram):
        inside, _ = np.histogram(v, bins=reduce.edges())
        return [int((v < -1).sum()), *inside.tolist(), int((v > 1).sum())]
    order = np.argsort(-v.reshape(-1), kind="stable")[:reduce.k]
    return np.stack([v.reshape(-1)[order], order.astype(np.float32)])


def assert_row(reduce, row, v, what):
    want = numpy_row(reduce, v)
    if isinstance(want, dict):
        np.testing.assert_allclose([row[hostfeed.STATS.index(c)] for c in want],
                                   list(want.values()), rtol=2e-6, atol=1e-7, err_msg=what)
    else:
        np.testing.assert_array_equal(np.asarray(row), np.asarray(want), err_msg=what)


def arrays(path):
    return sorted(hostfeed.open_recording(path).names)


@pytest.mark.parametrize("layout", ["plain", "scan", "remat"])
def test_each_summary_of_a_stack_and_of_its_cotangent_is_numpys_under_grad(layout,
                                                                           tmp_path):
    path = tmp_path / "run.zarr"
    eps = jnp.zeros((L, B, D))
    with hostfeed.Recorder(path) as rec:
        grad = jax.jit(jax.grad(lambda W, e, s: stack(rec, layout, s)(W, e, xs()),
                                argnums=(0, 1), has_aux=True))
        (_, cts), hs = jax.device_get(grad(weights(), eps, jnp.int32(7)))
    stacked = layout != "plain"
    names = [f"{n}{part}" if stacked else f"{n}{i}{part}" for n in REDUCTIONS
             for i in (range(1) if stacked else range(L)) for part in ("", ".cotangent")]
    assert arrays(path) == sorted(names)
    for n, reduce in REDUCTIONS.items():
        for i in range(1 if stacked else L):
            name = n if stacked else f"{n}{i}"
            rows, meta = hostfeed.read_recording(path, name)
            layers = list(range(L)) if stacked else [i]
            assert meta["step"].tolist() == [7] * len(layers)
            for row, layer in zip(rows, layers):
                assert_row(reduce, row, hs[layer], f"{name}, layer {layer}")
            rows, meta = hostfeed.read_recording(path, f"{name}.cotangent")
            assert meta["step"].tolist() == [7] * len(layers)
            for row, layer in zip(rows, layers[::-1]):  # the backward pass: last layer first
                assert_row(reduce, row, cts[layer], f"{name}.cotangent, layer {layer}")


@pytest.mark.parametrize("layout", ["scan", "remat"])
def test_every_selects_the_same_steps_for_a_summary_and_its_cotangent_in_a_scan(
        layout, tmp_path):
    path = tmp_path / "run.zarr"
    eps = jnp.zeros((L, B, D))
    with hostfeed.Recorder(path) as rec:
        summary = jax.jit(jax.grad(
            lambda W, e, s: stack(rec, layout, s, every=2, recorded={"s": "stats"})(
                W, e, xs()), argnums=(0, 1), has_aux=True))
        raw = jax.jit(jax.grad(  # every= with cotangents=False: a side effect only
            lambda W, e, s: stack(rec, layout, s, every=2, cotangents=False,
                                  recorded={"raw": None})(W, e, xs()),
            argnums=(0, 1), has_aux=True))
        got = [(ct, hs) for (_, ct), hs in
               (jax.device_get(summary(weights(), eps, jnp.int32(s))) for s in range(3))]
        plain = [jax.device_get(raw(weights(), eps, jnp.int32(s))) for s in range(3)]
    assert arrays(path) == ["raw", "s", "s.cotangent"]
    for name, values in (("s", [hs for _, hs in got]), ("s.cotangent", [ct for ct, _ in got])):
        rows, meta = hostfeed.read_recording(path, name)
        assert meta["step"].tolist() == [0, 0, 2, 2], name
        order = [0, 1] if name == "s" else [1, 0]
        for row, (s, layer) in zip(rows, [(s, i) for s in (0, 2) for i in order]):
            assert_row("stats", row, values[s][layer], f"{name} at step {s}, layer {layer}")
    rows, meta = hostfeed.read_recording(path, "raw")
    assert meta["step"].tolist() == [0, 0, 2, 2]
    np.testing.assert_array_equal(rows, np.concatenate([plain[0][1], plain[2][1]]))


@pytest.mark.parametrize("where", ["grad of vmap", "vmap of grad"])
def test_under_vmap_each_lanes_cotangent_is_summarised_into_its_own_row(where, tmp_path):
    path = tmp_path / "run.zarr"
    w = weights()[0]
    x = xs()

    def f(w, e, x, s):
        h = rec.record("h", jnp.tanh(x @ w), step=s, reduce="stats") + e
        return jnp.sum(h ** 2), h

    with hostfeed.Recorder(path) as rec:
        eps = jnp.zeros((B, D))
        if where == "grad of vmap":
            def summed(w, e, s):
                loss, h = jax.vmap(f, in_axes=(None, 0, 0, None))(w, e, x, s)
                return loss.sum(), h
            (_, cts), hs = jax.jit(jax.grad(summed, argnums=(0, 1), has_aux=True))(w, eps, 3)
        else:
            (_, cts), hs = jax.jit(jax.vmap(jax.grad(f, argnums=(0, 1), has_aux=True),
                                            in_axes=(None, 0, 0, None)))(w, eps, x, 3)
    for name, values in (("h", hs), ("h.cotangent", cts)):
        rows, meta = hostfeed.read_recording(path, name)
        assert meta["step"].tolist() == [3] * B
        for lane in range(B):
            assert_row("stats", rows[lane], values[lane], f"{name}, lane {lane}")


def test_cotangents_false_and_forward_mode_record_the_values_summary_only(tmp_path):
    path = tmp_path / "run.zarr"
    eps = jnp.zeros((L, B, D))
    with hostfeed.Recorder(path) as rec:
        jax.grad(lambda W, e: stack(rec, "scan", 0, cotangents=False,
                                    recorded={"off": "stats"})(W, e, xs())[0])(weights(), eps)
        jax.jvp(lambda W: stack(rec, "scan", 0, recorded={"jvp": "stats"})(W, eps, xs())[0],
                (weights(),), (weights(),))
    assert arrays(path) == ["jvp", "off"]


def test_show_and_tensorboard_draw_a_cotangents_summary_beside_the_values(tmp_path):
    from hostfeed._src.readback import grid, series
    path = tmp_path / "run.zarr"
    eps = jnp.zeros((L, B, D))
    with hostfeed.Recorder(path) as rec:
        def loss(W, e, s):
            return stack(rec, "scan", s, recorded={"blocks/out.stats": "stats",
                                                    "blocks/out.hist": HIST})(W, e, xs())
        g = jax.jit(jax.grad(loss, argnums=(0, 1), has_aux=True))
        for s in range(2):
            g(weights(), eps, jnp.int32(s))
    names = series.select(hostfeed.open_recording(path).names, [], str(path))
    assert names == ["blocks/out.hist", "blocks/out.cotangent.hist", "blocks/out.stats",
                     "blocks/out.cotangent.stats"]
    rows = grid.layout(grid.load(hostfeed.open_recording(path), names))
    assert len(rows) == 1 and [p.name for p in rows[0]] == names  # one module, one row
    ct_stats, meta = hostfeed.read_recording(path, "blocks/out.cotangent.stats")
    panel = {p.name: p for p in rows[0]}["blocks/out.cotangent.stats"]
    n = ct_stats.shape[1]  # the panel's further columns (a cast's counts): NaN here
    np.testing.assert_array_equal(panel.values[:, :n], ct_stats)
    assert np.isnan(panel.values[:, n:]).all()

    pytest.importorskip("tensorboard")
    ea_mod = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    logdir = tmp_path / "logs"
    assert hostfeed.to_tensorboard(str(path), str(logdir))["blocks/out.cotangent.stats"] == 4
    ea = ea_mod.EventAccumulator(str(logdir), size_guidance={ea_mod.SCALARS: 0,
                                                             ea_mod.HISTOGRAMS: 0})
    ea.Reload()
    mean = ea.Scalars("blocks/out.cotangent.stats/mean")
    assert [e.step for e in mean] == meta["step"].tolist()
    np.testing.assert_array_equal([e.value for e in mean],
                                  ct_stats[:, hostfeed.STATS.index("mean")])
    counts, _ = hostfeed.read_recording(path, "blocks/out.cotangent.hist")
    assert [e.histogram_value.bucket for e in ea.Histograms("blocks/out.cotangent.hist")] == \
        counts.astype(float).tolist()


def test_through_a_recorded_step_the_cotangents_summaries_are_those_of_jit(tmp_path):
    eps = jnp.zeros((L, B, D))
    got = {}
    for way in ("step", "jit"):
        path = tmp_path / f"{way}.zarr"
        with hostfeed.Recorder(path) as rec:
            def f(W, s):
                grads, _ = jax.grad(lambda W, e: stack(rec, "remat", s, every=2,
                                                       recorded={"s": "stats"})(W, e, xs()),
                                    argnums=(0, 1), has_aux=True)(W, eps)
                return W - 0.1 * grads[0]
            step = rec.step(f, outputs=True) if way == "step" else jax.jit(f)
            W = weights()
            for s in range(3):
                W = step(W, jnp.int32(s))
            jax.block_until_ready(W)
        got[way] = {n: hostfeed.read_recording(path, n) for n in arrays(path)}
    assert sorted(got["step"]) == sorted(got["jit"]) == ["s", "s.cotangent"]
    for name, (rows, meta) in got["jit"].items():
        np.testing.assert_array_equal(got["step"][name][0], rows, err_msg=name)
        assert meta["step"].tolist() == [0, 0, 2, 2]
        assert got["step"][name][1]["step"].tolist() == [0, 0, 2, 2]
