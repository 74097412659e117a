"""Selective recording and on-device summaries: ``Recorder.record(..., every=, start=,
stop=)`` records exactly the selected steps (under jit, scan, vmap, grad, eagerly), and
``reduce="stats"`` / ``reduce=hostfeed.Histogram(...)`` record rows that match numpy on the
same data (eager, jit, vmap, and sharded over 4 devices in a subprocess, where no
all-gather of the value is compiled)."""
from __future__ import annotations

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

from conftest import ON_TPU
from helpers.reading import read
from helpers.stats_reference import stats_of


def hist_of(v, edges):
    v = np.asarray(v, np.float64).ravel()
    v = v[~np.isnan(v)]
    inside, _ = np.histogram(v, bins=edges)
    return [int((v < edges[0]).sum()), *inside.tolist(), int((v > edges[-1]).sum())]


def attributes(path, name):
    with open(os.path.join(path, name, "zarr.json")) as f:
        return json.load(f)["attributes"]["hostfeed"]


def data(shape, seed=0):
    return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


def test_every_start_stop_under_jit_and_scan_record_exactly_the_selected_steps(store):
    x = jnp.asarray(data((3, 4)))
    with hostfeed.Recorder(store) as rec:
        def body(c, s):
            rec.record("every3", x + s, step=s, every=3, start=1, stop=11)
            rec.record("from5", x + s, step=s, start=5)
            rec.record("until4", x + s, step=s, stop=4)
            rec.record("even", x + s, step=s, every=2)
            return c + 1, None
        jax.jit(lambda: jax.lax.scan(body, 0, jnp.arange(14)))()
        # The same function again (cached): the selection is decided at run time.
        jax.jit(lambda: jax.lax.scan(body, 0, jnp.arange(14, 20)))()
    expect = {"every3": [1, 4, 7, 10], "from5": list(range(5, 20)), "until4": [0, 1, 2, 3],
              "even": list(range(0, 20, 2))}
    for name, steps in expect.items():
        rows, got = read(store, name)
        assert got == steps, name
        np.testing.assert_array_equal(rows, np.stack([np.asarray(x) + s for s in steps]))


def test_a_concrete_step_is_decided_at_the_call_and_result_is_returned(store):
    with hostfeed.Recorder(store) as rec:
        outs = []
        for s in range(7):
            outs.append(rec.record("e", np.full(2, s, np.int32), step=s, every=3,
                                   result=s * 10))
            rec.record("js", jnp.full(2, s), step=s, start=2, stop=4)
        assert outs == [s * 10 for s in range(7)]
        assert rec.record("rs", np.ones(3, np.float32), reduce="stats", result=7) == 7
        x = np.ones(3, np.float32)
        assert rec.record("rs", x, reduce="stats") is x
        f = jax.jit(lambda x, s: rec.record("r", x, step=s, every=2, result=x * 2))
        np.testing.assert_array_equal(f(jnp.ones(2), 3), 2 * np.ones(2))
        np.testing.assert_array_equal(f(jnp.ones(2), 4), 2 * np.ones(2))
    assert read(store, "e")[1] == [0, 3, 6]
    assert read(store, "js")[1] == [2, 3]
    assert read(store, "r")[1] == [4]


def test_vmap_with_one_step_for_all_lanes_and_a_batched_step_is_refused(store):
    x = jnp.asarray(data((2, 3)))
    with hostfeed.Recorder(store) as rec:
        f = jax.jit(jax.vmap(lambda v, s: rec.record("v", v, step=s, every=2),
                             in_axes=(0, None)))
        for s in range(4):
            f(x, s)
        g = jax.vmap(lambda v, s: rec.record("b", v, step=s, every=2))
        with pytest.raises(ValueError, match="differs between the lanes"):
            jax.jit(g)(x, jnp.arange(2))
        with pytest.raises(ValueError, match="differs between the lanes"):
            jax.vmap(jax.jit(lambda v, s: rec.record("b", v, step=s, every=2)))(
                x, jnp.arange(2))
    rows, steps = read(store, "v")
    assert steps == [0, 0, 2, 2]
    np.testing.assert_array_equal(rows, np.concatenate([np.asarray(x)] * 2))


def test_grad_records_the_selected_steps_and_summaries_carry_no_gradient(store):
    x = jnp.asarray(data((2, 3)))

    def loss(v, s):
        v = rec.record("g", v, step=s, every=2)
        rec.record("gs", v, step=s, reduce="stats")
        return (v ** 2).sum()

    with hostfeed.Recorder(store) as rec:
        step = jax.jit(jax.grad(loss))
        for s in range(4):
            np.testing.assert_allclose(step(x, s), 2 * np.asarray(x), rtol=1e-6)
    assert read(store, "g")[1] == [0, 2]
    cot, steps = read(store, "g.cotangent")
    assert steps == [0, 2]
    np.testing.assert_allclose(cot, np.stack([2 * np.asarray(x)] * 2), rtol=1e-6)
    assert read(store, "gs")[1] == [0, 1, 2, 3]
    with pytest.raises(KeyError):
        hostfeed.read_recording(store, "gs.cotangent")


@pytest.mark.parametrize("how", ["eager", "jit", "vmap"])
def test_stats_match_numpy(store, how):
    x = data((4, 6, 8))
    x[0, 0, :3] = [np.nan, np.inf, -np.inf]
    with hostfeed.Recorder(store) as rec:
        if how == "eager":
            rec.record("s", x, step=0, reduce="stats")
            rec.record("pc", x, step=0, reduce="stats", axis=(0, 1))
        elif how == "jit":
            jax.jit(lambda v: (rec.record("s", v, step=0, reduce="stats"),
                               rec.record("pc", v, step=0, reduce="stats", axis=(0, 1))))(x)
        else:
            # Each lane (a slice along axis 0) is a row of its own statistics.
            jax.jit(jax.vmap(lambda v: rec.record("s", v, step=0, reduce="stats")))(x)
    rows, _ = read(store, "s")
    want = [stats_of(x)] if how != "vmap" else [stats_of(v) for v in x]
    np.testing.assert_allclose(rows, np.array(want), rtol=2e-5, atol=1e-6)
    assert attributes(store, "s")["reduce"]["columns"] == list(hostfeed.STATS)
    if how != "vmap":
        pc, _ = read(store, "pc")
        assert pc.shape == (1, 8, len(hostfeed.STATS))
        np.testing.assert_allclose(pc[0], np.array([stats_of(x[:, :, c]) for c in range(8)]),
                                   rtol=2e-5, atol=1e-6)


def test_stats_of_a_row_with_no_finite_value_and_of_integers(store):
    with hostfeed.Recorder(store) as rec:
        rec.record("nan", np.full(3, np.nan, np.float32), reduce="stats")
        rec.record("int", np.arange(5, dtype=np.int32), reduce="stats")
    rows, _ = read(store, "nan")
    assert rows[0, 0] == 3 and rows[0, 7] == 3 and np.isnan(rows[0, [1, 2, 3, 4, 5, 11]]).all()
    np.testing.assert_allclose(read(store, "int")[0][0], stats_of(np.arange(5)), rtol=1e-6)


def extreme_columns():
    """Columns (64 values each) whose squares or sum overflow float32, or whose squares
    underflow it: values near 1e20, near float32's maximum, near 1e-25; and ordinary
    ones."""
    rng = np.random.default_rng(5)
    normal = rng.normal(size=64)
    near_max = np.where(np.arange(64) % 2, 3.0e38, 3.3e38)
    return np.stack([normal * 7e19, near_max, -near_max, normal * 1e-25, normal,
                     normal + 1e4], axis=1).astype(np.float32)


def test_stats_of_values_near_float32s_limits_match_numpy_in_the_jax_operations(store):
    """Issue 54.5: reduced over a leading axis, reduce="stats" is computed by the JAX
    operations (the path of a GPU, a TPU, and a value sharded over devices): squares of
    values near 1e20 overflowed float32 (std and l2 inf), the sum of values near float32's
    maximum too (mean inf), squares of values near 1e-25 underflowed (std 0). Scaled by a
    power of two, they match numpy in float64 rounded to float32, as the core's one-pass
    kernel (the trailing axis of the transpose) does (it scales a block of tiny values up
    before squaring)."""
    x = extreme_columns()
    with hostfeed.Recorder(store) as rec:
        @jax.jit
        def both(v):
            rec.record("jax", v, reduce="stats", axis=0)
            rec.record("core", v.T, reduce="stats", axis=1)
        both(x)
    with np.errstate(over="ignore"):  # l2 of the values near float32's maximum: inf
        want = np.float32([stats_of(x[:, c]) for c in range(x.shape[1])])
    assert np.isfinite(want[0]).all() and np.isinf(want[1:3, 6]).all()
    np.testing.assert_allclose(read(store, "jax")[0][0], want, rtol=2e-5)
    np.testing.assert_allclose(read(store, "core")[0][0], want, rtol=2e-5)


def test_stats_of_subnormal_and_zero_size_values_in_the_jax_operations(store):
    """Issue 54.7: min, max and absmax of subnormal values are exact (compared as ordered
    integer keys: XLA's CPU threads flush subnormals to zero in float comparisons, which
    reported 0 for all three); a reduction over no value records the row the core's
    kernel records (count 0, NaN statistics) instead of raising JAX's zero-size error."""
    sub = np.float32([[1e-45, 2e-45, -3e-40, 5e-41], [-1e-45, -1e-40, -1e-38, -2e-45],
                      [-0.0, 1e-45, 0.0, 1.5e-38]]).T  # a column a row of statistics
    sub[0, 0] = np.nan  # and through the statistics over the finite values
    empty = np.zeros((0, 3), np.float32)
    with hostfeed.Recorder(store) as rec:
        jax.jit(lambda v, e: (rec.record("sub", v, reduce="stats", axis=0),
                              rec.record("sub_core", v.T, reduce="stats", axis=1),
                              rec.record("empty", e, reduce="stats", axis=0),
                              rec.record("empty_core", e.T, reduce="stats", axis=1)))(
            sub, empty)
    f = [c[np.isfinite(c)] for c in sub.T]
    for name in ("sub", "sub_core"):  # the JAX operations and the core's kernel
        got = read(store, name)[0][0]
        np.testing.assert_array_equal(got[:, 3:6], [[c.min(), c.max(), np.abs(c).max()]
                                                   for c in f], err_msg=name)
        np.testing.assert_array_equal(got[:, 7], [1, 0, 0], err_msg=name)
    core = read(store, "empty_core")[0][0]
    np.testing.assert_array_equal(core, [[0, np.nan, np.nan, np.nan, np.nan, np.nan, 0, 0,
                                          0, 0, 0, np.nan]] * 3)
    np.testing.assert_array_equal(read(store, "empty")[0][0], core)


@pytest.mark.skipif(ON_TPU, reason="about the CPU's one-pass custom call")
def test_summaries_on_one_cpu_are_one_pass_in_the_core_and_match_numpy(store):
    """On one CPU device, reduce="stats" over trailing axes is the core's one-pass custom
    call (the value read once): rows spanning many of its blocks, non-finite values in
    some, a mean far from zero (the std must not cancel), and a row of only NaNs; and so is
    a histogram. Where JAX's lowering is forced (HOSTFEED_TRANSPORT=jax) they are JAX's
    reductions, with the same rows."""
    from hostfeed._src import transports

    core = transports.for_platform("cpu").native_kernels
    x = data((4, 20000))
    x[1] += 1e4
    x[2, [5, 4099, 8200]] = [np.nan, np.inf, -np.inf]
    x[3] = np.nan
    f = jax.jit(lambda rec, v: rec.record("s", v, step=0, reduce="stats", axis=1),
                static_argnums=0)
    with hostfeed.Recorder(store) as rec:
        assert ("hostfeed_stats" in f.lower(rec, x).as_text()) == core
        f(rec, x)
        # Reduced over leading axes: the JAX reductions, no custom call.
        g = jax.jit(lambda v: rec.record("c", v, step=0, reduce="stats", axis=0))
        assert "hostfeed_stats" not in g.lower(x[:, :10]).as_text()
        g(x[:, :10])
        # Histograms too: linear and powers of two, per row, NaNs and infinities included.
        lin, log = hostfeed.Histogram(16, (-3.0, 3.0)), hostfeed.Histogram(40, "log")
        x[0, :4] = [0.0, -3.0, 3.0, 1e-30]
        h = jax.jit(lambda v: (rec.record("lin", v, step=0, reduce=lin, axis=1),
                               rec.record("log", v, step=0, reduce=log, axis=1)))
        assert ("hostfeed_histogram" in h.lower(x).as_text()) == core
        h(x)
    np.testing.assert_array_equal(read(store, "lin")[0][0],
                                  [hist_of(v, lin.edges()) for v in x])
    np.testing.assert_array_equal(read(store, "log")[0][0],
                                  [hist_of(np.abs(v), log.edges()) for v in x])
    x[0, :4] = data((4, 20000))[0, :4]
    rows, _ = read(store, "s")
    want = np.array([stats_of(v) for v in x])
    np.testing.assert_allclose(rows[0], want, rtol=2e-5, atol=1e-5)
    assert rows[0, 1, 2] == pytest.approx(x[1].astype(np.float64).std(), rel=1e-4)
    np.testing.assert_allclose(read(store, "c")[0][0],
                               np.array([stats_of(x[:, c]) for c in range(10)]),
                               rtol=2e-5, atol=1e-5)


@pytest.mark.parametrize("how", ["eager", "jit", "vmap"])
def test_histograms_match_numpy(store, how):
    x = data((3, 1000)) * 2
    x[0, :4] = [np.nan, -2.0, 2.0, 0.0]  # an edge at each end, and a zero
    lin, log = hostfeed.Histogram(16, (-2.0, 2.0)), hostfeed.Histogram(12, "log")
    with hostfeed.Recorder(store) as rec:
        def both(v):
            rec.record("lin", v, reduce=lin)
            rec.record("log", v, reduce=log)
        if how == "eager":
            both(x)
        elif how == "jit":
            jax.jit(both)(x)
        else:
            jax.jit(jax.vmap(both))(x)
    parts = [x] if how != "vmap" else list(x)
    np.testing.assert_array_equal(read(store, "lin")[0],
                                  [hist_of(p, lin.edges()) for p in parts])
    np.testing.assert_array_equal(read(store, "log")[0],
                                  [hist_of(np.abs(p), log.edges()) for p in parts])
    assert attributes(store, "lin")["reduce"]["edges"] == lin.edges().tolist()
    assert read(store, "lin")[0].dtype == np.int32


@pytest.mark.parametrize("hist", [hostfeed.Histogram(16, (-2.0, 2.0)),
                                  hostfeed.Histogram(10, (-0.3, 0.7)),
                                  hostfeed.Histogram(7, (-1.0, 3.0)),
                                  hostfeed.Histogram(12, "log")], ids=repr)
def test_every_bin_counts_what_numpy_histogram_counts_at_and_beside_each_edge(store, hist):
    """Each edge, the float32 next to it on either side, its negation, signed zeros and
    subnormals: binned as ``numpy.histogram`` bins them against the same (float64)
    edges, in the core's one-pass kernel (trailing axes on a CPU device) and in the JAX
    operations (another axis), the values outside in the below and above columns."""
    edges = hist.edges()
    e32 = edges.astype(np.float32)
    tiny = np.float32([0.0, -0.0, 1e-45, -1e-45, 1e-40, -1e-40])
    special = np.concatenate([e32, np.nextafter(e32, np.float32(-np.inf)),
                              np.nextafter(e32, np.float32(np.inf)), -e32, tiny])
    x = np.stack([special, np.resize(data((1, 400))[0] * 2, special.shape)])
    with hostfeed.Recorder(store) as rec:
        @jax.jit
        def both(v):
            rec.record("core", v, reduce=hist, axis=1)
            rec.record("jax", v.T, reduce=hist, axis=0)
        both(x)
    magnitude = np.abs if hist.log else (lambda v: v)
    want = [hist_of(magnitude(r), edges) for r in x]
    np.testing.assert_array_equal(read(store, "core")[0][0], want)
    np.testing.assert_array_equal(read(store, "jax")[0][0], want)
    assert attributes(store, "core")["reduce"]["columns"][0] == "below"
    assert attributes(store, "core")["reduce"]["columns"][-1] == "above"


def test_bad_arguments_are_refused_at_the_call(store):
    x = jnp.ones(3)
    with hostfeed.Recorder(store) as rec:
        with pytest.raises(ValueError, match="pass the step"):
            rec.record("a", x, every=2)
        with pytest.raises(ValueError, match="every must be >= 1"):
            rec.record("a", x, step=1, every=0)
        with pytest.raises(TypeError, match="start must be an int"):
            rec.record("a", x, step=1, start=1.5)
        with pytest.raises(ValueError, match="reduce must be 'stats' or a hostfeed.Histogram"):
            rec.record("a", x, reduce="mean")
        with pytest.raises(ValueError, match="axis= says what reduce= reduces over"):
            rec.record("a", x, axis=0)
        with pytest.raises(ValueError, match="out of range"):
            rec.record("a", x, reduce="stats", axis=1)
        with pytest.raises(TypeError, match="summarizes real values"):
            rec.record("a", jnp.ones(3, jnp.complex64), reduce="stats")
        with pytest.raises(ValueError, match="bins must be"):
            hostfeed.Histogram(0)
        with pytest.raises(ValueError, match="lo < hi"):
            hostfeed.Histogram(4, (1.0, 1.0))
        rec.record("h", x, reduce=hostfeed.Histogram(4, (0.0, 1.0)))
        with pytest.raises(ValueError, match="one kind of summary"):
            rec.record("h", x, reduce=hostfeed.Histogram(8, (0.0, 1.0)))


@pytest.mark.parametrize("bins, rng, match", [
    (1000, (0.0, 1e-38), r"bins 1e-41 wide are too narrow .*overflows float32"),
    (1000, (1e30, 1e30 + 1e25), r"too narrow .*use at most 332 bins over this range"),
    (1000, (0.0, 3e-36), r"too narrow .*a range at least 4.7\d*e-35 wide"),
    (3, (-1.5e38, 1.5e38), "below float32's smallest normal number"),
    (4, (-3e38, 3e38), "within float32's range"),
    (4, (-1e39, 0.0), "within float32's range"),
    (4, (np.nan, 1.0), "must be finite"),
    (4, (0.0, np.inf), "must be finite"),
    (4, (1.0, 0.0), "lo < hi"),
    (1.5, (0.0, 1.0), "bins must be an int"),
    (True, (0.0, 1.0), "bins must be an int"),
    (-1, (0.0, 1.0), "bins must be an int"),
    (2047, "log", "at most 2046 bins"),
], ids=lambda v: repr(v)[:24])
def test_histogram_bins_float32_cannot_compute_are_refused_at_construction(bins, rng, match):
    """Issue 54.6: a value's bin is guessed in float32 and corrected by one bin at most, so
    bins narrower than float32 resolves there (bins / (hi - lo) overflowing float32, lo's
    rounding to float32 or the flush of subnormals to zero over a bin or more), a range
    beyond float32's, or a scale below its normal numbers, binned values wrongly with only
    a numpy warning. They are refused, saying what would do."""
    with pytest.raises(ValueError, match=match):
        hostfeed.Histogram(bins, rng)


@pytest.mark.parametrize("hist", [hostfeed.Histogram(332, (1e30, 1e30 + 1e25)),
                                  hostfeed.Histogram(63, (0.0, 3e-36)),
                                  hostfeed.Histogram(4, (-1.5e38, 1.5e38))], ids=repr)
def test_histograms_at_the_limits_of_float32_count_what_numpy_counts(store, hist):
    """What the refusals above suggest is accepted and binned as ``numpy.histogram`` bins
    it, in the core's kernel and in the JAX operations."""
    edges = hist.edges()
    e32 = edges.astype(np.float32)
    lo, hi = hist.range
    x = np.concatenate([np.float32(lo + np.linspace(-0.1, 1.1, 4001) * (hi - lo)), e32,
                        np.nextafter(e32, np.float32(np.inf)),
                        np.nextafter(e32, np.float32(-np.inf)),
                        np.float32([0.0, -0.0, 1e-45, -1e-45, 1e-39, 1.1e-38])])
    x = x[np.isfinite(x)]
    with hostfeed.Recorder(store) as rec:
        jax.jit(lambda v: (rec.record("core", v[None], reduce=hist, axis=1),
                           rec.record("jax", v[:, None], reduce=hist, axis=0)))(x)
    want = hist_of(x, edges)
    np.testing.assert_array_equal(read(store, "core")[0][0][0], want)
    np.testing.assert_array_equal(read(store, "jax")[0][0][0], want)


def test_a_summary_survives_appending(store):
    with hostfeed.Recorder(store) as rec:
        rec.record("s", np.ones(4, np.float32), step=0, reduce="stats")
    with hostfeed.Recorder(store, mode="a") as rec:
        rec.record("s", np.ones(4, np.float32), step=1, reduce="stats")
    assert attributes(store, "s")["reduce"]["kind"] == "stats"
    assert read(store, "s")[1] == [0, 1]


@pytest.mark.several_devices
@pytest.mark.parametrize("mode", ["explicit", "auto"])
def test_sharded_summaries_reduce_where_the_shards_are(tmp_path, mode):
    """Over 4 devices: each device reduces its slice; the compiled step has no all-gather
    (the value never moves), and the rows match numpy on the whole value."""
    code = textwrap.dedent(f"""
        import json, re, sys, numpy as np, jax, jax.numpy as jnp, hostfeed
        from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
        # Sharding in the types (make_mesh: explicit axes), or left to XLA (auto axes).
        mesh = (jax.make_mesh((4,), ("x",)) if sys.argv[1] == "explicit"
                else Mesh(np.array(jax.devices()), ("x",)))
        x = np.random.default_rng(1).normal(size=(8, 64, 32)).astype(np.float32)
        xs = jax.device_put(x, NamedSharding(mesh, P("x")))
        path = {str(tmp_path)!r} + "/" + sys.argv[1] + ".zarr"
        with hostfeed.Recorder(path) as rec:
            h = hostfeed.Histogram(10, (-3.0, 3.0))
            def step(v, s):
                rec.record("stats", v, step=s, reduce="stats", every=2)
                rec.record("chan", v, step=s, reduce="stats", axis=(0, 1))
                rec.record("hist", v, step=s, reduce=h)
                return v * 2
            f = jax.jit(step)
            hlo = f.lower(xs, 0).compile().as_text()
            for s in range(3):
                f(xs, s)
        assert "hostfeed_stats" not in hlo  # a custom call would gather the value
        gathered = [int(np.prod([int(d) for d in m.split(",") if d]))
                    for m in re.findall(r"= f32\\[([0-9,]*)\\][^=]*all-gather\\(", hlo)]
        out = dict(gathered=gathered,
                   stats=hostfeed.read_recording(path, "stats")[0].tolist(),
                   steps=hostfeed.read_recording(path, "stats")[1]["step"].tolist(),
                   chan=hostfeed.read_recording(path, "chan")[0][0].tolist(),
                   hist=hostfeed.read_recording(path, "hist")[0].tolist(),
                   edges=h.edges().tolist())
        print("RESULT", json.dumps(out))
    """)
    r = subprocess.run([sys.executable, "-c", code, mode], capture_output=True, text=True,
                       timeout=180, env=dict(os.environ, JAX_PLATFORMS="cpu",
                                             XLA_FLAGS="--xla_force_host_platform_device_count=4"))
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.split("RESULT ", 1)[1])
    x = np.random.default_rng(1).normal(size=(8, 64, 32)).astype(np.float32)
    # Nothing of the value's size moves: at most the per-channel means (32 numbers).
    assert all(n <= 32 for n in out["gathered"]), out["gathered"]
    assert out["steps"] == [0, 2]
    np.testing.assert_allclose(out["stats"], [stats_of(x)] * 2, rtol=2e-5, atol=1e-5)
    np.testing.assert_allclose(out["chan"], [stats_of(x[:, :, c]) for c in range(32)],
                               rtol=2e-5, atol=1e-5)
    assert out["hist"] == [hist_of(x, np.array(out["edges"]))] * 3


@pytest.mark.several_devices
@pytest.mark.parametrize("mode", ["explicit", "auto"])
def test_sharded_stats_of_extreme_subnormal_and_zero_size_values(tmp_path, mode):
    """Issue 54.5 and 54.7 over 2 devices, where each device reduces its slice with the
    JAX operations: values near float32's limits match numpy (no overflow), subnormals
    have exact min, max and absmax, and a zero-size value records the one-device row
    (count 0, NaN statistics) instead of raising JAX's zero-size error at trace time."""
    x = extreme_columns()
    np.save(tmp_path / "extreme.npy", x.T)
    code = textwrap.dedent(f"""
        import json, sys, numpy as np, jax, hostfeed
        from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
        mesh = (jax.make_mesh((2,), ("x",)) if sys.argv[1] == "explicit"
                else Mesh(np.array(jax.devices()), ("x",)))
        values = dict(extreme=(np.load({str(tmp_path / "extreme.npy")!r}), 1),
                      sub=(np.float32([[1e-45, 2e-45, -3e-40, 5e-41]] * 2), 1),
                      empty=(np.zeros((0, 4), np.float32), None),
                      empty_rows=(np.zeros((2, 0), np.float32), 1))
        path = {str(tmp_path)!r} + "/" + sys.argv[1] + ".zarr"
        with hostfeed.Recorder(path) as rec:
            for name, (x, axis) in values.items():
                xs = jax.device_put(x, NamedSharding(mesh, P("x")))
                jax.jit(lambda v: rec.record(name, v, reduce="stats", axis=axis))(xs)
        out = {{name: hostfeed.read_recording(path, name)[0][0].tolist() for name in values}}
        print("RESULT", json.dumps(out))
    """)
    r = subprocess.run([sys.executable, "-c", code, mode], capture_output=True, text=True,
                       timeout=180, env=dict(os.environ, JAX_PLATFORMS="cpu",
                                             XLA_FLAGS="--xla_force_host_platform_device_count=2"))
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.split("RESULT ", 1)[1])
    with np.errstate(over="ignore"):
        want = np.float32([stats_of(x[:, c]) for c in range(x.shape[1])])
    np.testing.assert_allclose(np.float32(out["extreme"]), want, rtol=2e-5)
    np.testing.assert_array_equal(np.float32(out["sub"])[:, 3:6],
                                  np.float32([[-3e-40, 5e-41, 3e-40]] * 2))
    empty = [0, np.nan, np.nan, np.nan, np.nan, np.nan, 0, 0, 0, 0, 0, np.nan]
    np.testing.assert_array_equal(out["empty"], empty)
    np.testing.assert_array_equal(out["empty_rows"], [empty] * 2)


@pytest.mark.parametrize("result", [False, True])
def test_summaries_at_selected_steps_computed_at_every_step_record_the_same(
        store, monkeypatch, result):
    """Where a summary at selected steps is computed at every step (a TPU, whose compiler
    fails on the summary inside the cond), the rows, steps and returned values are the
    same as where it is computed at the selected steps only."""
    import dataclasses

    from hostfeed._src import transports

    x = jnp.asarray(data((3, 5)))
    chosen = transports.for_platform

    def run(path, every_step):
        # The policy of the transport of JAX's default backend (a TPU's says True).
        monkeypatch.setattr(transports, "for_platform", lambda platform=None: dataclasses.replace(
            chosen(platform), summarize_every_step=every_step))
        with hostfeed.Recorder(path, mode="w") as rec:
            @jax.jit
            def step(v, s):
                given = v * 2 if result else None
                out = rec.record("s", v, step=s, reduce="stats", every=2, start=1,
                                 result=given)
                h = rec.record("h", v, step=s, reduce=hostfeed.Histogram(8, (-2.0, 2.0)),
                               every=3)
                return out, h
            outs = [step(x, s) for s in range(7)]
        return outs, read(path, "s"), read(path, "h")

    outs_a, s_a, h_a = run(store, False)
    outs_b, s_b, h_b = run(store + "-every-step", True)
    assert s_a[1] == s_b[1] == [1, 3, 5] and h_a[1] == h_b[1] == [0, 3, 6]
    np.testing.assert_array_equal(s_a[0], s_b[0])
    np.testing.assert_array_equal(h_a[0], h_b[0])
    for (a, ha), (b, hb) in zip(outs_a, outs_b):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(ha, hb)
        np.testing.assert_array_equal(a, np.asarray(x) * (2 if result else 1))



def test_where_a_summary_at_selected_steps_is_computed_is_chosen_for_the_lowering_platform(
        store):
    """Whether a summary at selected steps is computed at every step (a TPU's transport
    says so) or in the cond, at the selected steps only (the other transports), is taken
    when JAX lowers for a platform, not from the default backend while tracing: one trace
    holds both ways, each branch naming the platforms it serves; run on a CPU, the CPU's way
    records the selected steps. Where the default backend is itself such a platform (a TPU),
    the summary is traced its way directly, without the platform cond."""
    from hostfeed._src import transports

    def names(eqns):
        return [e.primitive.name for e in eqns]

    def nested(eqns):
        return [n for e in eqns if e.primitive.name == "cond"
                for b in e.params["branches"] for n in names(b.jaxpr.eqns)]

    on = transports.platforms_where(lambda t: t.summarize_every_step)
    assert "cpu" not in on
    x = jnp.asarray(data((3, 5)))
    with hostfeed.Recorder(store, mode="w") as rec:
        @jax.jit
        def step(v, s):
            return rec.record("s", v, step=s, reduce="stats", every=2)

        jaxpr = step.trace(x, 3).jaxpr
        by_platform = [e for e in jaxpr.eqns
                       if e.primitive.name == "cond" and e.params.get("branches_platforms")]
        if not on:  # HOSTFEED_TRANSPORT=native: no transport computes it at every step
            assert by_platform == []
        elif jax.default_backend() in on:  # on a TPU: traced its way, no platform cond
            assert by_platform == []
            assert "hostfeed_stats" in names(jaxpr.eqns)
            assert "hostfeed_stats" not in nested(jaxpr.eqns)
        else:
            (eqn,) = by_platform
            assert eqn.params["branches_platforms"] == (tuple(on), None)
            every_step, in_cond = (b.jaxpr.eqns for b in eqn.params["branches"])
            assert "hostfeed_stats" in names(every_step)
            assert "hostfeed_stats" not in nested(every_step)
            assert "hostfeed_stats" not in names(in_cond)
            assert "hostfeed_stats" in nested(in_cond)
        for k in range(5):
            np.testing.assert_array_equal(step(x, k), x)
    rows, steps = read(store, "s")
    assert steps == [0, 2, 4]
    np.testing.assert_allclose(rows[0], rows[1])
