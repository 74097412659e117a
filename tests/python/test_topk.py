"""``reduce=hostfeed.TopK(k)``: the k largest values over the reduced axes for each kept
position and their flat row-major indices into the reduced axes, equal to numpy's
stable-argsort answer (ties to the lowest index, NaN below every number), under jit,
eagerly, vmap, with ``every=``, sharded over several devices in a subprocess (explicit and
auto sharding), read back, drawn by ``python -m hostfeed show`` and exported to TensorBoard."""
from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hostfeed


def topk_of(x, axis, k):
    """numpy's answer: for each kept position, the first k of a stable argsort of -x over
    the reduced axes flattened in row-major order (the kept axes first)."""
    x = np.asarray(x, np.float32)
    axis = (axis,) if isinstance(axis, int) else axis
    axes = sorted(a % x.ndim for a in axis) if axis is not None else list(range(x.ndim))
    kept = [d for d in range(x.ndim) if d not in axes]
    flat = np.transpose(x, kept + axes).reshape(*(x.shape[d] for d in kept), -1)
    idx = np.argsort(-flat, axis=-1, kind="stable")[..., :k]
    return np.take_along_axis(flat, idx, -1), idx


def signed_zeros(rng, shape):
    """Small integers: a rare 3, zeros (0.0 and -0.0, as many of each) and negative ones,
    so that the k largest hold zeros of both signs, tied."""
    x = (-np.abs(rng.integers(-3, 4, size=shape))).astype(np.float32)
    x = np.where(rng.random(shape) < 0.002, np.float32(3.0), x)
    return np.where((x == 0) & (rng.random(shape) < 0.5), np.float32(-0.0), x)


def ties(shape, seed=0):
    """Small integers: many equal values, so the order of ties is tested everywhere."""
    return np.random.default_rng(seed).integers(-3, 4, size=shape).astype(np.float32)


def check(rows, x, axis, k):
    values, index = hostfeed.TopK.split(rows)
    want_v, want_i = topk_of(x, axis, k)
    np.testing.assert_array_equal(index, want_i)
    np.testing.assert_array_equal(values, want_v)
    # bit for bit: -0.0 is kept as -0.0 (assert_array_equal takes it for 0.0)
    np.testing.assert_array_equal(values.view(np.uint32), want_v.view(np.uint32))


@pytest.mark.parametrize("axis", [None, 0, 1, (0, 1), (0, 2), (1, 2), -1])
def test_topk_matches_numpy_stable_argsort_under_jit_and_eagerly(store, axis):
    x = ties((4, 6, 5))
    k = 3
    with hostfeed.Recorder(store) as rec:
        rec.record("eager", x, reduce=hostfeed.TopK(k), axis=axis)
        jax.jit(lambda v: rec.record("jit", v, reduce=hostfeed.TopK(k), axis=axis))(x)
    for name in ("eager", "jit"):
        rows, _ = hostfeed.read_recording(store, name)
        check(rows[0], x, axis, k)


def test_the_indices_are_flat_row_major_into_the_reduced_axes(store):
    # axis=(0, 1) of [batch, seq, d] keeps d: each of the d positions gets the k largest
    # over batch and seq, and np.unravel_index(i, (batch, seq)) says where they were.
    x = np.zeros((3, 4, 2), np.float32)
    x[2, 1, 0], x[0, 3, 0], x[1, 2, 1] = 9.0, 8.0, 7.0
    with hostfeed.Recorder(store) as rec:
        rec.record("t", x, reduce=hostfeed.TopK(2), axis=(0, 1))
    values, index = hostfeed.TopK.split(hostfeed.read_recording(store, "t")[0][0])
    assert values.tolist() == [[9.0, 8.0], [7.0, 0.0]]
    assert [np.unravel_index(int(i), (3, 4)) for i in index[:, 0]] == [(2, 1), (1, 2)]
    assert index.tolist() == [[9, 3], [6, 0]]  # the tie at 0.0: the lowest index first


def test_nan_ranks_below_every_number_and_zeros_and_subnormals_compare_as_numpy(store):
    x = np.float32([[np.nan, 1.0, -np.inf, np.nan, np.inf, -0.0, 0.0, 1e-45, -1e-45, 3e-45],
                    [np.nan] * 8 + [5.0, -np.inf]])
    with hostfeed.Recorder(store) as rec:
        jax.jit(lambda v: rec.record("t", v, reduce=hostfeed.TopK(10), axis=1))(x)
    rows, _ = hostfeed.read_recording(store, "t")
    values, index = hostfeed.TopK.split(rows[0])
    want_v, want_i = topk_of(x, (1,), 10)
    np.testing.assert_array_equal(index, want_i)
    assert index.tolist() == [[4, 1, 9, 7, 5, 6, 8, 2, 0, 3], [8, 9, 0, 1, 2, 3, 4, 5, 6, 7]]
    np.testing.assert_array_equal(values, want_v)  # NaNs at the end, where numpy has them
    assert np.signbit(values[0, 4]) and not np.signbit(values[0, 5])  # -0.0 kept as is


def test_vmap_and_every_record_the_selected_steps(store):
    xs = ties((6, 4, 5), seed=1)
    with hostfeed.Recorder(store) as rec:
        @jax.jit
        def step(v, s):
            rec.record("t", v, step=s, every=2, reduce=hostfeed.TopK(2), axis=0)
            return jax.vmap(lambda r: rec.record("lanes", r, reduce=hostfeed.TopK(2)))(v)

        for s in range(5):
            step(xs[s], s)
    rows, meta = hostfeed.read_recording(store, "t")
    assert meta["step"].tolist() == [0, 2, 4]
    for r, s in zip(rows, [0, 2, 4]):
        check(r, xs[s], (0,), 2)
    lanes, _ = hostfeed.read_recording(store, "lanes")
    assert lanes.shape == (20, 2, 2)  # a row per lane (batch element) and step
    for j, r in enumerate(lanes):
        check(r, xs[j // 4][j % 4], None, 2)


def test_k_larger_than_the_reduced_size_and_bad_k_are_refused(store):
    x = jnp.ones((3, 4))
    with pytest.raises(ValueError, match="k must be an int of at least 1"):
        hostfeed.TopK(0)
    with pytest.raises(ValueError, match="k must be an int"):
        hostfeed.TopK(2.0)
    with hostfeed.Recorder(store) as rec:
        with pytest.raises(ValueError, match=r"TopK\(5\) of 3 values .*k must be at most"):
            jax.jit(lambda v: rec.record("t", v, reduce=hostfeed.TopK(5), axis=0))(x)
        with pytest.raises(ValueError, match="reduce must be 'stats' or a hostfeed.Histogram"
                                             r"\(\.\.\.\), hostfeed.TopK"):
            rec.record("t", x, reduce="topk")
        rec.record("t", x, reduce=hostfeed.TopK(2))
        with pytest.raises(ValueError, match="one kind of summary"):
            rec.record("t", x, reduce=hostfeed.TopK(3))


def test_a_topk_survives_appending_and_capture_names_it(store):
    with hostfeed.Recorder(store) as rec:
        rec.record("t", ties((8,)), step=0, reduce=hostfeed.TopK(2))
    with hostfeed.Recorder(store, mode="a") as rec:
        rec.record("t", ties((8,), seed=2), step=1, reduce=hostfeed.TopK(2))
    rec = hostfeed.open_recording(store)
    assert rec["t"].attrs["reduce"]["kind"] == "topk" and rec["t"].attrs["reduce"]["k"] == 2
    rows, meta = hostfeed.read_recording(store, "t")
    assert meta["step"].tolist() == [0, 1]
    check(rows[1], ties((8,), seed=2), None, 2)
    from hostfeed._src.capture.calls import summary_suffix
    assert summary_suffix(hostfeed.TopK(4)) == ".topk"


@pytest.mark.several_devices
@pytest.mark.parametrize("mode", ["explicit", "auto"])
def test_sharded_topk_reduces_where_the_shards_are(tmp_path, mode):
    """Over 4 devices, sharded on a reduced axis and on a kept one: each device takes its
    slice's k largest, only candidates move (no all-gather of the value), the rows match
    numpy on the whole value bit for bit (-0.0 stays -0.0), ties to the lowest index across
    the devices."""
    code = textwrap.dedent("""
        import json, re, sys, numpy as np, jax, hostfeed
        from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    """) + textwrap.dedent(inspect.getsource(signed_zeros)) + textwrap.dedent(f"""
        mesh = (jax.make_mesh((2, 2), ("x", "y")) if sys.argv[1] == "explicit"
                else Mesh(np.array(jax.devices()).reshape(2, 2), ("x", "y")))
        x = signed_zeros(np.random.default_rng(3), (8, 16, 6))
        xs = jax.device_put(x, NamedSharding(mesh, P("x", "y")))
        path = {str(tmp_path)!r} + "/" + sys.argv[1] + ".zarr"
        with hostfeed.Recorder(path) as rec:
            def step(v, s):
                rec.record("all", v, step=s, reduce=hostfeed.TopK(5), every=2)
                rec.record("chan", v, step=s, reduce=hostfeed.TopK(3), axis=(0, 1))
                rec.record("rows", v, step=s, reduce=hostfeed.TopK(4), axis=(1, 2))
                return v * 2
            f = jax.jit(step)
            hlo = f.lower(xs, 0).compile().as_text()
            for s in range(3):
                f(xs, s)
        gathered = [int(np.prod([int(d) for d in m.split(",") if d]))
                    for m in re.findall(r"= f32\\[([0-9,]*)\\][^=]*all-gather\\(", hlo)]
        out = dict(gathered=gathered,
                   **{{n: hostfeed.read_recording(path, n)[0].tolist()
                      for n in ("all", "chan", "rows")}},
                   steps=hostfeed.read_recording(path, "all")[1]["step"].tolist())
        print("RESULT", json.dumps(out))
    """)
    r = subprocess.run([sys.executable, "-c", code, mode], capture_output=True, text=True,
                       timeout=180, env=dict(os.environ, JAX_PLATFORMS="cpu",
                                             XLA_FLAGS="--xla_force_host_platform_device_count=4"))
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.split("RESULT ", 1)[1])
    x = signed_zeros(np.random.default_rng(3), (8, 16, 6))
    assert out["steps"] == [0, 2]
    if mode == "explicit":  # the value (768 numbers) never moves: candidates only
        assert all(n < x.size for n in out["gathered"]), out["gathered"]
    for rows in out["all"]:
        check(np.float32(rows), x, None, 5)
    for name, axis, k in (("chan", (0, 1), 3), ("rows", (1, 2), 4)):
        assert len(out[name]) == 3
        for rows in out[name]:
            check(np.float32(rows), x, axis, k)


def test_show_draws_the_k_values_per_step(store, tmp_path):
    pytest.importorskip("matplotlib")
    xs = [ties((4, 6), seed=s) for s in range(4)]
    with hostfeed.Recorder(store) as rec:
        for s, x in enumerate(xs):
            rec.record("acts/out.topk", x, step=s, reduce=hostfeed.TopK(3), axis=0)
            rec.record("acts/out.stats", x, step=s, reduce="stats")
    from hostfeed._src.readback import grid, series
    from hostfeed._src.readback.draw import _what
    recording = hostfeed.open_recording(store)
    panels = {p.name: p for p in grid.load(recording, series.select(recording.names, [],
                                                                      store))}
    p = panels["acts/out.topk"]
    assert (p.kind, p.plot, p.reader) == ("topk", "lines", hostfeed.TopK)
    # Each rank's largest value over the kept positions (the 6 columns), per step.
    want = np.stack([topk_of(x, (0,), 3)[0].max(0) for x in xs])
    np.testing.assert_array_equal(p.values, want)
    assert p.steps.tolist() == [0, 1, 2, 3]
    assert _what(p) == "top 3"  # the panel's title: "acts/out.topk  (top 3, 4 rows)"
    assert panels["acts/out.stats"].plot == "stats"
    # What `python -m hostfeed show STORE -o grid.png` runs (in this process: no second
    # start of JAX).
    import io
    from contextlib import redirect_stdout

    from hostfeed.__main__ import main
    png, out = tmp_path / "grid.png", io.StringIO()
    with redirect_stdout(out):
        assert main(["show", store, "-o", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "acts/out.topk" in out.getvalue() and "topk" in out.getvalue()


@pytest.mark.parametrize("name", ["reductions", "reductions.base", "reductions.stats",
                                  "reductions.histogram", "reductions.topk"])
def test_the_reductions_docstring_examples_run(name):
    import doctest
    import importlib
    module = importlib.import_module(f"hostfeed._src.{name}")
    assert doctest.testmod(module, optionflags=doctest.ELLIPSIS).failed == 0


def test_tensorboard_gets_each_ranks_largest_value_as_a_scalar(store, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    xs = [ties((4, 6), seed=s) for s in range(3)]
    with hostfeed.Recorder(store) as rec:
        for s, x in enumerate(xs):
            rec.record("t", x, step=s, reduce=hostfeed.TopK(2), axis=0)
    assert hostfeed.to_tensorboard(store, str(tmp_path / "logs")) == {"t": 3}
    events = EventAccumulator(str(tmp_path / "logs"))
    events.Reload()
    assert sorted(events.Tags()["scalars"]) == ["t/top1", "t/top2"]
    for rank in (0, 1):
        got = [(e.step, e.value) for e in events.Scalars(f"t/top{rank + 1}")]
        assert got == [(s, float(topk_of(x, (0,), 2)[0][:, rank].max()))
                       for s, x in enumerate(xs)]
