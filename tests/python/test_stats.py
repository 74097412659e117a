"""Statistics for low precision: the ``l1``, ``zeros`` and ``absmin_nonzero`` columns of
``reduce="stats"`` and the ``underflow`` and ``overflow`` counts of
``hostfeed.Stats(dtype=...)`` equal numpy's (and ``ml_dtypes``' casts) in the core's one-pass
kernel and in the JAX operations (the transport forced either way), for every float input
dtype, with NaN, infinities, signed zeros, subnormals and the values beside each cast's
thresholds; under vmap, ``every=``, and sharded over devices; ``show`` and the TensorBoard
export draw them; a store written with the earlier nine columns still reads, draws and
exports; an unknown dtype is refused at the call."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import hostfeed
from hostfeed._src import transports
from hostfeed._src.record.summaries import summarize
from hostfeed._src.reductions.stats import CASTS, COLUMNS, thresholds

from conftest import ON_TPU
from helpers.reading import read
from helpers.stats_reference import stats_of

pytest.importorskip("zarr", reason="needs zarr-python")

#: Columns whose value is a count or one of the values itself: equal to numpy's, exactly.
EXACT = [0, 3, 4, 5, 7, 8, 10, 11, 12, 13]


def dt(name):
    return np.dtype(getattr(ml_dtypes, name, name))


def flushed(v):
    """``v`` as a TPU may compute with it: values below float32's least normal magnitude
    (float32's subnormals, a bfloat16's) zeros of their sign."""
    w = np.asarray(v)
    wide = w.astype(np.float64)
    with np.errstate(invalid="ignore"):
        small = np.abs(wide) < np.finfo(np.float32).tiny
    return np.where(small, np.copysign(np.zeros_like(wide), wide).astype(w.dtype), w)


def assert_rows_equal_numpy(got, rows, cast=None, what=""):
    """Each row of ``got`` (stored statistics) against numpy's of the values ``rows``:
    counts, extremes and the least non-zero magnitude exactly (as float32), mean, std, l2
    and l1 to float32's rounding of the values' magnitude (in the JAX operations, XLA's
    CPU arithmetic flushes subnormals to zero: each of them may count as 0 there). On a
    TPU, which flushes float32's subnormals to zero in some of its operations (a
    bfloat16's as it converts it), a row may instead be that of the values so flushed."""
    for i, (g, v) in enumerate(zip(np.asarray(got), rows)):
        try:
            _assert_row_equal_numpy(g, v, cast, f"{what} row {i}")
        except AssertionError:
            if not ON_TPU:
                raise
            _assert_row_equal_numpy(g, flushed(v), cast, f"{what} row {i} (flushed)")


def _assert_row_equal_numpy(g, v, cast, what):
    with np.errstate(over="ignore"):
        want = np.float32(stats_of(v, cast))
    assert g.shape == want.shape, what
    cols = [c for c in EXACT if c < len(want)]
    np.testing.assert_array_equal(g[cols], want[cols], err_msg=what)
    scale = float(want[5]) if np.isfinite(want[5]) else 1.0
    lost = np.finfo(np.float32).tiny * np.isfinite(v).sum()  # subnormals flushed
    for c in (1, 2, 6, 9):  # mean, std, l2, l1
        np.testing.assert_allclose(g[c], want[c], rtol=2e-5, atol=max(scale * 1e-6, lost),
                                   err_msg=f"{what} column {COLUMNS[c]}")


def beside_thresholds(cast):
    """float32 values at and beside where a cast to ``cast`` rounds to zero (half its
    least subnormal) and beyond its largest value (a few steps of its own spacing
    above it), both signs; from ``ml_dtypes.finfo``, not from hostfeed."""
    if cast is None:
        return np.zeros(0, np.float32)
    fi = ml_dtypes.finfo(dt(cast))
    half = np.float32(float(fi.smallest_subnormal) / 2)
    top = float(fi.max)
    spacing = 2.0 ** (np.floor(np.log2(top)) - fi.nmant)  # between the largest two values
    points = [half, np.float32(half * 3), *(np.float32(min(top + k * spacing / 2, 3.4e38))
                                             for k in range(3))]  # the tie above the top
    near = [np.nextafter(np.float32(p), np.float32(d)) for p in points
            for d in (-np.inf, np.inf)]
    v = np.float32(points + near)
    return np.concatenate([v, -v])


def values_for(cast, n=5000, seed=0):
    """Rows of ``n`` float32 values (several kernel blocks): special values (signed zeros,
    subnormals, float32's extremes, the values beside the cast's thresholds) then normal
    values over many decades; row 0 also holds a NaN and infinities (the statistics over
    the finite values), row 3 no finite value at all."""
    rng = np.random.default_rng(seed)
    special = np.float32([0.0, -0.0, 0.0, 1e-45, -1e-45, 3e-40, -1.1754942e-38, 1e-30,
                          3.4028235e38, -3.4028235e38, 1e30, 448.0, -57344.0, 65504.0])
    special = np.concatenate([special, beside_thresholds(cast)])
    spread = rng.normal(size=(4, n)) * 10.0 ** rng.integers(-12, 12, size=(4, n))
    x = spread.astype(np.float32)
    x[:3, :special.size] = special
    x[0, [special.size, n * 2 // 5, n * 9 // 10]] = [np.nan, np.inf, -np.inf]
    x[3] = np.where(np.arange(n) % 2, np.nan, np.inf)
    return x


@pytest.mark.parametrize("cast", [None, *CASTS], ids=str)
def test_columns_and_cast_counts_equal_numpy_in_the_kernel_and_the_jax_operations(
        store, cast):
    """Over the trailing axis on one CPU device the core's one-pass kernel computes the
    row (with the native transport), over the leading one the JAX operations (and both
    with JAX's lowering forced, the path of a TPU): each equal to numpy's and to
    ``x.astype(dtype)``'s counts."""
    x = values_for(cast)
    r = hostfeed.Stats(dtype=cast)
    assert r.row_shape() == (12 if cast is None else 14,)
    for transport in ["jax"] if ON_TPU else ["native", "jax"]:
        path = f"{store}-{transport}"
        with transports.forcing(transport), hostfeed.Recorder(path) as rec:
            f = jax.jit(lambda v: (rec.record("core", v, reduce=r, axis=1),
                                   rec.record("ops", v.T, reduce=r, axis=0)))
            assert ("hostfeed_stats" in f.lower(x).as_text()) == (transport == "native")
            f(x)
        for name in ("core", "ops"):
            assert_rows_equal_numpy(read(path, name)[0][0], x, cast, f"{transport} {name}")
        attrs = hostfeed.open_recording(path)["core"].attrs["reduce"]
        assert attrs["columns"] == list(hostfeed.STATS) + (
            [] if cast is None else list(hostfeed.CAST_STATS))
        assert attrs.get("dtype") == cast


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16", "float8_e4m3fn",
                                   "float8_e5m2", "float64"])
def test_stats_of_every_float_input_dtype_equal_numpy(store, dtype):
    """Values of each float dtype (its own subnormals, largest value, NaN and infinities
    where it has them, signed zeros); float64 (with x64) summarized as it is: its values
    beyond float32's range are neither zeros nor infinities (the row itself is float32:
    numpy's statistics rounded to it)."""
    rng = np.random.default_rng(1)
    d = dt(dtype)
    fi = ml_dtypes.finfo(d)
    special = [0.0, -0.0, float(fi.smallest_subnormal), -3 * float(fi.smallest_subnormal),
               float(fi.max), -float(fi.max), float(fi.tiny), np.nan, np.inf, -np.inf]
    if dtype == "float64":
        special += [1e-50, -1e300, 5e-324, 1e-40]
    x = np.concatenate([np.array(special), rng.normal(size=600) * 10.0 ** rng.integers(
        -4, 4, size=600)]).astype(d)[None].repeat(2, 0)
    x[1, 7:10] = x[1, 11:14]  # a row without NaN or infinities
    prev = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", dtype == "float64")
    try:
        r = hostfeed.Stats(dtype=jnp.float8_e4m3fn)
        with hostfeed.Recorder(store) as rec:
            f = jax.jit(lambda v: (rec.record("core", v, reduce=r, axis=1),
                                   rec.record("ops", v.T, reduce=r, axis=0)))
            if ON_TPU and dtype == "float64":  # refused where it would run, not a crash
                with pytest.raises(ValueError, match=r"'core'.*TPU emulates float64"):
                    f(jnp.asarray(x))
                return
            f(jnp.asarray(x))
    finally:
        jax.config.update("jax_enable_x64", prev)
    for name in ("core", "ops"):
        assert_rows_equal_numpy(read(store, name)[0][0], x, "float8_e4m3fn", f"{dtype} {name}")
    if dtype == "float64":  # 1e-50 is neither zero (in float64) nor representable in float32
        got = read(store, "core")[0][0][0]
        assert got[hostfeed.STATS.index("zeros")] == 2 and got[-2] > 4


def test_stats_of_float64_lowered_for_a_tpu_are_refused_naming_the_record(store):
    """A TPU emulates float64 and cannot bitcast it, which the statistics need (XLA's TPU
    compiler aborted the process on them): lowering them for a TPU raises, naming the
    record; a histogram of float64 (no bits read) and the statistics lowered for the CPU
    are not refused, and record as before, under vmap too. (The summary alone is lowered
    for the TPU here: a record's host callback cannot be lowered for a TPU without its
    backend.)"""
    prev = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    try:
        x = jnp.asarray(np.array([1e-300, 2.0, -3.0]))

        def summary(reduce):
            return jax.jit(lambda v: summarize(v, reduce, None, "wide")[0]).trace(x)
        with pytest.raises(ValueError, match=r"record\('wide'\).*TPU emulates float64"):
            summary("stats").lower(lowering_platforms=("tpu",))
        summary("stats").lower(lowering_platforms=("cpu",))
        summary(hostfeed.Histogram(4)).lower(lowering_platforms=("tpu",))
        with hostfeed.Recorder(store) as rec:
            lanes = jax.jit(jax.vmap(lambda v: rec.record("wide", v, step=0, reduce="stats")))
            if ON_TPU:  # run there: refused at the call
                with pytest.raises(ValueError, match=r"'wide'.*TPU emulates float64"):
                    lanes(x[None].repeat(2, 0))
                return
            lanes(x[None].repeat(2, 0))
    finally:
        jax.config.update("jax_enable_x64", prev)
    rows, steps = read(store, "wide")
    assert steps == [0, 0] and rows.shape == (2, len(hostfeed.STATS))  # a row per lane
    np.testing.assert_array_equal(rows[:, hostfeed.STATS.index("min")], [-3.0, -3.0])
    np.testing.assert_array_equal(rows[:, hostfeed.STATS.index("zeros")], [0, 0])


def test_stats_with_a_cast_under_vmap_and_every_equal_numpy(store):
    """Each lane of a vmap is a row of its own; ``every=`` with a traced step records the
    selected steps, each the statistics of that step's value."""
    xs = values_for("float16", n=300)[:3]
    r = hostfeed.Stats(dtype=jnp.float16)
    with hostfeed.Recorder(store) as rec:
        jax.jit(jax.vmap(lambda v: rec.record("lanes", v, step=0, reduce=r)))(xs)

        def body(c, sv):
            s, v = sv
            rec.record("every", v, step=s, reduce=r, every=2)
            return c, None
        jax.jit(lambda xs: jax.lax.scan(body, 0, (jnp.arange(3), xs)))(xs)
    rows, steps = read(store, "lanes")
    assert steps == [0, 0, 0]
    assert_rows_equal_numpy(rows, xs, "float16", "vmap")
    rows, steps = read(store, "every")
    assert steps == [0, 2]
    assert_rows_equal_numpy(rows, xs[[0, 2]], "float16", "every")


@pytest.mark.several_devices
def test_sharded_stats_with_a_cast_equal_numpy(tmp_path):
    """Over 2 devices, sharding in the types (explicit) and left to XLA (auto): each
    device reduces its slice (the value reduced across the devices, and per row of a
    sharded axis), the partial rows combined: equal to numpy's."""
    x = values_for("float8_e5m2", n=256)
    np.save(tmp_path / "x.npy", x)
    code = textwrap.dedent(f"""
        import json, numpy as np, jax, jax.numpy as jnp, hostfeed
        from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
        x = np.load({str(tmp_path / "x.npy")!r})
        out = {{}}
        for mode in ("explicit", "auto"):
            mesh = (jax.make_mesh((2,), ("x",)) if mode == "explicit"
                    else Mesh(np.array(jax.devices()), ("x",)))
            xs = jax.device_put(x, NamedSharding(mesh, P("x")))
            path = {str(tmp_path)!r} + "/" + mode + ".zarr"
            r = hostfeed.Stats(dtype=jnp.float8_e5m2)
            with hostfeed.Recorder(path) as rec:
                jax.jit(lambda v: (rec.record("all", v, reduce=r),
                                   rec.record("rows", v, reduce=r, axis=1),
                                   rec.record("cols", v, reduce=r, axis=0)))(xs)
            out[mode] = {{n: hostfeed.read_recording(path, n)[0][0].tolist()
                          for n in ("all", "rows", "cols")}}
        print("RESULT", json.dumps(out))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=180, env=dict(os.environ, JAX_PLATFORMS="cpu",
                                             XLA_FLAGS="--xla_force_host_platform_device_count=2"))
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.split("RESULT ", 1)[1])
    for mode, got in out.items():
        assert_rows_equal_numpy([got["all"]], [x], "float8_e5m2", f"{mode} all")
        assert_rows_equal_numpy(got["rows"], x, "float8_e5m2", f"{mode} rows")
        assert_rows_equal_numpy(got["cols"][:40], x.T[:40], "float8_e5m2", f"{mode} cols")


def test_cast_thresholds_are_where_ml_dtypes_casts_change():
    """The magnitudes (as bits) where a cast underflows and overflows are exactly where
    ``ml_dtypes``' cast of the next smaller or larger value stops being zero or starts
    being infinite or NaN, from float32 and from float64."""
    for cast in CASTS:
        for source, uint in (("float32", np.uint32), ("float64", np.uint64)):
            under, over = thresholds(cast, source)

            def cast_of(bits):
                with np.errstate(over="ignore", invalid="ignore"):
                    return np.array(bits, uint).view(source).astype(dt(cast)).astype(float)

            assert cast_of(under) == 0 and cast_of(under + 1) > 0, (cast, source)
            assert np.isfinite(cast_of(over - 1)) and not np.isfinite(cast_of(over))
    half = np.float32(ml_dtypes.finfo(ml_dtypes.float8_e4m3fn).smallest_subnormal) / 2
    assert thresholds("float8_e4m3fn") == (half.view(np.uint32), np.float32(464).view(
        np.uint32) + 1)  # 464 rounds to 448 (to even), anything above to NaN


@pytest.mark.parametrize("dtype", [jnp.float32, "float4_e2m1fn", jnp.int8, "fp8", object(),
                                   ml_dtypes.float8_e4m3fnuz],
                         ids=["float32", "float4", "int8", "fp8", "object", "e4m3fnuz"])
def test_an_unknown_cast_dtype_is_refused_at_the_call(dtype):
    with pytest.raises(ValueError, match=r"hostfeed.Stats: dtype must be one of "
                                         r"float8_e4m3fn, float8_e5m2, bfloat16, float16"):
        hostfeed.Stats(dtype=dtype)


def test_stats_takes_each_cast_dtype_spelt_any_way_and_stats_is_stats():
    from hostfeed._src.capture.calls import summary_suffix
    from hostfeed._src.reductions import resolve
    for a, b in [(jnp.float8_e4m3fn, "float8_e4m3fn"), (ml_dtypes.float8_e5m2, "float8_e5m2"),
                 (jnp.bfloat16, np.dtype(ml_dtypes.bfloat16)), (np.float16, "float16")]:
        assert hostfeed.Stats(dtype=a) == hostfeed.Stats(dtype=b)
        assert hash(hostfeed.Stats(dtype=a)) == hash(hostfeed.Stats(dtype=b))
        assert summary_suffix(hostfeed.Stats(dtype=a)) == ".stats"
    assert resolve("stats", "x") == hostfeed.Stats() == hostfeed.Stats(dtype=None)
    assert hostfeed.Stats() != hostfeed.Stats(dtype="float16")
    assert repr(hostfeed.Stats(dtype=jnp.bfloat16)) == "hostfeed.Stats(dtype=bfloat16)"


def _old_store(path):
    """A store as hostfeed wrote it before ``l1``, ``zeros`` and ``absmin_nonzero``: rows
    of nine statistics per kept position, ``columns`` naming nine. Written as raw rows,
    then given the attributes a statistics array had."""
    rng = np.random.default_rng(2)
    values = [rng.normal(size=(3, 8)).astype(np.float32) for _ in range(4)]
    with hostfeed.Recorder(path) as rec:
        for s, v in enumerate(values):
            rows = np.float32([stats_of(c)[:9] for c in v])  # per channel: [3, 9]
            rec.record("old", rows, step=s)
    meta = os.path.join(path, "old", "zarr.json")
    with open(meta) as f:
        doc = json.load(f)
    doc["attributes"]["hostfeed"]["reduce"] = {"kind": "stats", "axis": [1],
                                              "columns": list(hostfeed.STATS[:9])}
    with open(meta, "w") as f:
        json.dump(doc, f)
    return values


def test_a_store_with_the_earlier_nine_columns_reads_draws_and_exports(tmp_path):
    from hostfeed._src.readback import draw, grid
    path = str(tmp_path / "old.zarr")
    values = _old_store(path)
    rows, _ = hostfeed.read_recording(path, "old")
    assert rows.shape == (4, 3, 9)
    (panel,) = grid.load(hostfeed.open_recording(path), ["old"])
    want = np.float32([stats_of(v) for v in values])
    np.testing.assert_allclose(panel.values[:, :9], want[:, :9], rtol=1e-5, atol=1e-6)
    assert np.isnan(panel.values[:, 9:]).all()  # not recorded: NaN, never a made-up 0
    fig = draw.figure([panel], None, legend=False)
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert any("old  (stats, 4 rows)" in t for t in texts)
    assert "%" not in texts and not any("bits" in t for t in texts)  # nothing to draw there
    pytest.importorskip("tensorboard")
    hostfeed.to_tensorboard(path, str(tmp_path / "logs"))
    from test_look_at_a_run import _accumulator
    tags = set(_accumulator(tmp_path / "logs").Tags()["scalars"])
    # The nine columns it holds, but the counts that never change (written only where
    # they do: Stats.quiet); nothing of the columns it lacks.
    quiet = hostfeed.Stats.quiet
    constant = {c for j, c in enumerate(hostfeed.STATS[:9]) if c in quiet and
                (want[:, j] == (want[0, j] if quiet[c] is None else quiet[c])).all()}
    assert constant >= {"count", "inf_count"}
    assert tags == {f"old/{c}" for c in hostfeed.STATS[:9] if c not in constant}
    # Appending the new columns to it is refused at the record, naming both layouts.
    with hostfeed.Recorder(path, mode="a") as rec, pytest.raises(
            ValueError, match=r"holds .*inf_count.*, not .*absmin_nonzero.*a name keeps one "
                              r"kind of summary"):
        rec.record("old", values[0], step=4, reduce="stats", axis=1)
    assert hostfeed.Stats.held({"columns": list(hostfeed.STATS[:9])})[-1] == "inf_count"


def test_show_and_tensorboard_draw_the_new_columns(tmp_path):
    """TensorBoard gets a scalar per column (the cast's counts too) and the dynamic range
    in bits and the zero, underflow and overflow fractions, each equal to numpy's; ``show``
    draws the least non-zero magnitude, the largest dynamic range and the fractions."""
    path = str(tmp_path / "run.zarr")
    values = [values_for("float8_e4m3fn", n=400, seed=s)[1] for s in range(3)]
    r = hostfeed.Stats(dtype=jnp.float8_e4m3fn)
    with hostfeed.Recorder(path) as rec:
        for s, v in enumerate(values):
            rec.record("h", v.reshape(20, 20), step=s, reduce=r, axis=1)  # per row, pooled
    with np.errstate(over="ignore"):  # l2 and l1: beyond float32's range (inf)
        want = np.float32([stats_of(v, "float8_e4m3fn") for v in values])
    c = {n: want[:, j].astype(np.float64) for j, n in enumerate(COLUMNS)}
    bits = np.log2(c["absmax"] / c["absmin_nonzero"])
    fractions = {f"{k}_fraction": c[n] / c["count"]
                 for k, n in (("zero", "zeros"), ("underflow", "underflow"),
                              ("overflow", "overflow"))}
    pytest.importorskip("tensorboard")
    hostfeed.to_tensorboard(path, str(tmp_path / "logs"))
    from test_look_at_a_run import _accumulator
    ea = _accumulator(tmp_path / "logs")

    def scalars(tag):
        got = ea.Scalars(f"h/{tag}")
        assert [e.step for e in got] == [0, 1, 2], tag
        return np.array([e.value for e in got])

    quiet = hostfeed.Stats.quiet  # written only once they leave that value (None: the first)
    for j, col in enumerate(COLUMNS):
        if col in quiet and (want[:, j] == (want[0, j] if quiet[col] is None
                                            else quiet[col])).all():
            assert f"h/{col}" not in ea.Tags()["scalars"], col  # a flat count: not written
            continue
        got = scalars(col)
        if j in EXACT:
            np.testing.assert_array_equal(got, want[:, j], err_msg=col)
        else:
            np.testing.assert_allclose(got, want[:, j], rtol=2e-5, err_msg=col)
    np.testing.assert_allclose(scalars("dynamic_range_bits"), bits, rtol=1e-6)
    for k, v in fractions.items():
        np.testing.assert_allclose(scalars(k), v, rtol=1e-6, err_msg=k)
    assert fractions["underflow_fraction"].min() > 0 < fractions["overflow_fraction"].min()
    from hostfeed._src.readback import draw, grid
    (panel,) = grid.load(hostfeed.open_recording(path), ["h"])
    fig = draw.figure([panel], None, legend=True)
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert any("h  (stats vs float8_e4m3fn, 3 rows)" in t for t in texts)
    assert f"range up to {bits.max():.1f} bits" in texts and "%" in texts and "|x|" in texts
    assert {"absmin≠0", "zeros %", "underflow %", "overflow %"} <= set(texts)
