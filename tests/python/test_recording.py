"""hostfeed.Recorder: values recorded in JAX computations, written to a Zarr v3 store by
Rust, read back with zarr-python and compared bit for bit."""
from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax

import hostfeed
from hostfeed import host_callback as hcb
from hostfeed._src import compat, dispatcher

from conftest import ON_TPU, queue_bound, run_python, skip_if_the_tpu_alters

zarr = pytest.importorskip("zarr")


def read(path, name):
    return np.asarray(zarr.open_group(path, mode="r")[name][:])


def same_bits(a, b):
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def random_bits(shape, dtype, seed=0):
    """Arbitrary bit patterns of ``dtype`` (NaN payloads included for floats)."""
    dtype = np.dtype(dtype)
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=int(np.prod(shape)) * dtype.itemsize, dtype=np.uint8)
    if dtype == np.bool_:
        raw &= 1
    return raw.view(dtype).reshape(shape)


# ---------------------------------------------------------------------------------------
# Rows, dtypes, metadata.

def test_jit_rows_are_bit_exact_with_step_device_and_order(store):
    rows = random_bits((5, 3, 4), np.float32)
    with hostfeed.Recorder(store) as rec:
        f = jax.jit(lambda x, s: rec.record("layer1/h", x, step=s) + 1)
        for i, r in enumerate(rows):
            f(r, 10 * i)
        rec.flush()
        assert same_bits(read(store, "layer1/h"), rows)
    got, meta = hostfeed.read_recording(store, "layer1/h")
    assert same_bits(got, rows)
    assert meta["step"].tolist() == [0, 10, 20, 30, 40]
    assert meta["device"].tolist() == [0] * 5
    assert np.all(np.diff(meta["seq"]) > 0) and np.all(np.diff(meta["time_ns"]) >= 0)
    assert meta["transforms"] == [[]] and meta["transform_index"].tolist() == [0] * 5
    g = zarr.open_group(store, mode="r")
    assert g.attrs["hostfeed"]["format"] == "hostfeed-recording"
    assert g["layer1/h"].attrs["hostfeed"]["name"] == "layer1/h"


DTYPES = [np.bool_, np.int8, np.int16, np.int32, np.uint8, np.uint16, np.uint32,
          np.float16, np.float32, np.complex64, ml_dtypes.bfloat16] + [
    getattr(ml_dtypes, n) for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3",
                                    "float8_e3m4", "float8_e4m3fnuz", "float8_e5m2fnuz",
                                    "float8_e4m3b11fnuz", "float8_e8m0fnu")
    if hasattr(ml_dtypes, n)]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_every_dtype_round_trips_with_the_plain_zarr_one_liner(store, dtype):
    skip_if_the_tpu_alters(dtype)
    rows = random_bits((4, 2, 3), dtype, seed=3)
    with hostfeed.Recorder(store) as rec:
        f = jax.jit(lambda x: rec.record("v", x))
        for r in rows:
            f(r)
    # After `import hostfeed`, zarr-python knows bfloat16 and the float8 types.
    got = zarr.open_group(store, mode="r")["v"][:]
    assert same_bits(got, rows), (got.dtype, rows.dtype)


def test_64_bit_dtypes_with_x64(store):
    code = f"""
        import jax, numpy as np, zarr, hostfeed
        jax.config.update("jax_enable_x64", True)
        vals = [np.arange(3, dtype=d) * 7 - 5 for d in (np.int64, np.uint64, np.float64,
                                                          np.complex128)]
        with hostfeed.Recorder({store!r}) as rec:
            for i, v in enumerate(vals):
                jax.jit(lambda x, i=i: rec.record(f"v{{i}}", x))(v)
        for i, v in enumerate(vals):
            got = zarr.open_group({store!r}, mode="r")[f"v{{i}}"][:]
            assert got.dtype == v.dtype and got.tobytes() == v.tobytes(), (got, v)
        print("ok")
    """
    r = run_python(code)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-2000:]


def test_sub_byte_dtypes_are_refused_at_trace_time(store):
    with hostfeed.Recorder(store) as rec, pytest.raises(TypeError, match="cannot be recorded"):
        jax.jit(lambda x: rec.record("q", x))(jnp.zeros(4, jnp.int4))


def test_zero_size_and_scalar_rows(store):
    with hostfeed.Recorder(store) as rec:
        f = jax.jit(lambda x, y: (rec.record("empty", x), rec.record("loss", y)))
        for i in range(3):
            f(jnp.zeros((0, 5)), jnp.float32(i) / 2)
    assert read(store, "empty").shape == (3, 0, 5)
    assert read(store, "loss").tolist() == [0.0, 0.5, 1.0]


def test_eager_records_and_python_scalars(store):
    with hostfeed.Recorder(store) as rec:
        y = rec.record("e", np.arange(3, dtype=np.int32), step=7)
        np.testing.assert_array_equal(y, [0, 1, 2])
        rec.record("e", jnp.arange(3, dtype=jnp.int32) + 3)
        assert float(rec.record("s", 1.5)) == 1.5
    rows, meta = hostfeed.read_recording(store, "e")
    assert rows.tolist() == [[0, 1, 2], [3, 4, 5]]
    assert meta["step"].tolist() == [7, -1]
    assert read(store, "s").tolist() == [1.5]


def test_result_is_returned_and_the_row_recorded(store):
    with hostfeed.Recorder(store) as rec:
        out = jax.jit(lambda x: rec.record("x", x, result=(x + 1, {"k": 2.0})))(
            jnp.float32(3))
        assert float(out[0]) == 4.0 and float(out[1]["k"]) == 2.0
    assert read(store, "x").tolist() == [3.0]


# ---------------------------------------------------------------------------------------
# Control flow and transformations.

def test_scan_while_and_fori_record_every_iteration_in_order(store):
    with hostfeed.Recorder(store) as rec:
        def scan_body(c, x):
            return rec.record("scan", c + x, step=x), None

        def while_body(c):
            return rec.record("while", c + 1)

        def fori_body(i, c):
            return rec.record("fori", c * 2, step=i)

        @jax.jit
        def f(x):
            a, _ = lax.scan(scan_body, x, jnp.arange(4))
            b = lax.while_loop(lambda c: c < 3, while_body, x)
            c = lax.fori_loop(0, 3, fori_body, x + 1)
            return a, b, c

        f(jnp.int32(0))
    rows, meta = hostfeed.read_recording(store, "scan")
    assert rows.tolist() == [0, 1, 3, 6] and meta["step"].tolist() == [0, 1, 2, 3]
    assert read(store, "while").tolist() == [1, 2, 3]
    rows, meta = hostfeed.read_recording(store, "fori")
    assert rows.tolist() == [2, 4, 8] and meta["step"].tolist() == [0, 1, 2]


def test_vmap_records_one_row_per_lane_in_lane_order(store):
    with hostfeed.Recorder(store) as rec:
        f = jax.jit(jax.vmap(lambda x, s: rec.record("h", x * 2, step=s), in_axes=(1, 0)))
        x = jnp.arange(6.0).reshape(3, 2)
        f(x, jnp.array([5, 6]))
        # The same name outside vmap has the same row shape.
        jax.jit(lambda x: rec.record("h", x))(jnp.ones(3))
    rows, meta = hostfeed.read_recording(store, "h")
    np.testing.assert_array_equal(rows, [[0.0, 4.0, 8.0], [2.0, 6.0, 10.0], [1.0, 1.0, 1.0]])
    assert meta["step"].tolist() == [5, 6, -1]
    assert [meta["transforms"][i] for i in meta["transform_index"]] == [
        [["batch", {"batch_dims": [0, 0]}]]] * 2 + [[]]


def test_nested_vmap_with_an_unbatched_value_and_grad(store):
    with hostfeed.Recorder(store) as rec:
        def f(x, s):
            return (rec.record("h", jnp.sin(x), step=s) ** 2).sum()

        g = jax.jit(jax.vmap(jax.vmap(jax.grad(f), in_axes=(0, None)), in_axes=(None, 0)))
        x = jnp.arange(6.0).reshape(2, 3)
        g(x, jnp.array([1, 2, 3]))  # 3 x 2 lanes
    rows, meta = hostfeed.read_recording(store, "h")
    want = np.sin(np.asarray(x))
    np.testing.assert_allclose(rows, np.concatenate([want] * 3), rtol=1e-6)
    assert meta["step"].tolist() == [1, 1, 2, 2, 3, 3]
    ct, ct_meta = hostfeed.read_recording(store, "h.cotangent")
    np.testing.assert_allclose(ct, 2 * np.concatenate([want] * 3), rtol=1e-6)
    assert ct_meta["step"].tolist() == [1, 1, 2, 2, 3, 3]


def test_grad_records_primals_forward_and_cotangents_under_a_derived_name(store):
    hcb.set_ad_taps("transforms")
    with hostfeed.Recorder(store) as rec:
        def f(x):
            h = rec.record("h", jnp.sin(x), step=5)
            return (h * h).sum(), h

        (_, h), _ = jax.jit(jax.value_and_grad(f, has_aux=True))(jnp.arange(3.0))
    rows, meta = hostfeed.read_recording(store, "h")
    assert same_bits(rows, np.asarray(h)[None])
    ct, ct_meta = hostfeed.read_recording(store, "h.cotangent")
    assert same_bits(ct, 2 * np.asarray(h)[None])  # d sum(h^2) / dh, exact
    assert ct_meta["step"].tolist() == [5]
    names = [t[0] for t in ct_meta["transforms"][ct_meta["transform_index"][0]]]
    assert names == ["jvp", "transpose"]


def test_grad_in_primals_mode_records_no_cotangents(store):
    hcb.set_ad_taps("primals")
    try:
        with hostfeed.Recorder(store) as rec:
            jax.jit(jax.grad(lambda x: (rec.record("h", x) ** 2).sum()))(jnp.ones(2))
    finally:
        hcb.set_ad_taps("transforms")
    assert read(store, "h").tolist() == [[1.0, 1.0]]
    assert "h.cotangent" not in zarr.open_group(store, mode="r")


def test_jvp_records_tangents_under_a_derived_name(store):
    with hostfeed.Recorder(store) as rec:
        jax.jit(lambda x, t: jax.jvp(lambda y: rec.record("h", y * 3), (x,), (t,)))(
            jnp.ones(2), jnp.full(2, 0.5))
    assert read(store, "h").tolist() == [[3.0, 3.0]]
    assert read(store, "h.tangent").tolist() == [[1.5, 1.5]]


@pytest.mark.parametrize("writers", [0, -1, 1.5, "2", True])
def test_a_bad_writer_count_is_refused_at_open(store, writers):
    with pytest.raises(ValueError, match=r"writers must be a positive number of threads, got"):
        hostfeed.Recorder(store, writers=writers)
    assert not os.path.exists(store), "nothing is created"


def test_reserved_and_invalid_names_are_refused(store):
    with hostfeed.Recorder(store) as rec:
        for bad in ["h.step", "a/h.cotangent", "h.tangent", "a//b", "__x", "a b", ""]:
            with pytest.raises(ValueError):
                jax.jit(lambda x: rec.record(bad, x))(1.0)
        with pytest.raises(TypeError, match=r"got a dict with 2 leaves \(keys \['a', 'b'\]\); "
                                            r"record each entry under its own name, e\.g\. "
                                            r"rec\.record\('tree/a', value\['a'\]\)"):
            rec.record("tree", {"a": 1.0, "b": 2.0})
        with pytest.raises(TypeError, match=r"got a dict with 1 leaf \(keys \['w'\]\)"):
            rec.record("one", {"w": 1.0})
        with pytest.raises(TypeError, match=r"got a tuple of 2 elements \(2 leaves\)"):
            rec.record("pair", (1.0, 2.0))
        with pytest.raises(TypeError, match="integer scalar"):
            rec.record("x", 1.0, step=1.5)
        jax.jit(lambda x: rec.record("g/x", x))(1.0)
        with pytest.raises(ValueError, match="both an array and a group"):
            jax.jit(lambda x: rec.record("g", x))(1.0)


def test_a_clash_of_shape_or_dtype_raises_at_the_call_site(store):
    with hostfeed.Recorder(store) as rec:
        f = jax.jit(lambda x: rec.record("x", x))
        f(jnp.zeros(3))
        with pytest.raises(ValueError, match=r"as float32 \[3\], now as float32 \[4\]"):
            f(jnp.zeros(4))
        with pytest.raises(ValueError, match="now as int32"):
            f(jnp.zeros(3, jnp.int32))
        f(jnp.ones(3))
    assert read(store, "x").tolist() == [[0.0] * 3, [1.0] * 3]


# ---------------------------------------------------------------------------------------
# Lifecycle, errors, durability.

def test_barrier_wait_means_written(store):
    rec = hostfeed.Recorder(store)
    try:
        f = jax.jit(lambda x: rec.record("x", x))
        for i in range(5):
            f(jnp.float32(i))
        hcb.barrier_wait()
        assert read(store, "x").tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    finally:
        rec.close()


def test_close_flushes_and_later_records_are_refused(store):
    rec = hostfeed.Recorder(store)
    f = jax.jit(lambda x: rec.record("x", x))
    f(1.0)
    rec.close()
    assert rec.closed
    assert read(store, "x").tolist() == [1.0]
    with pytest.raises(ValueError, match="closed"):
        rec.record("x", 2.0)
    rec.close()  # twice is fine


def test_an_unwritable_or_existing_path_is_an_oserror(tmp_path, store):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(hostfeed.RecordingError) as info:
        hostfeed.Recorder(str(blocker / "deeper" / "run.zarr"))
    assert isinstance(info.value, OSError) and info.value.errno is not None
    # The message names what stands in the way, not the OS error alone.
    assert f"{blocker} is a file, not a folder" in str(info.value), info.value
    if pathlib.Path("/proc/self").is_dir():  # a folder that takes no new folder
        with pytest.raises(hostfeed.RecordingError, match="/proc exists, but no folder could "
                                                          "be made in it"):
            hostfeed.Recorder("/proc/run.zarr")
    with hostfeed.Recorder(store) as rec:
        rec.record("x", 1.0)
    with pytest.raises(hostfeed.RecordingError, match="exists"):
        hostfeed.Recorder(store)
    with hostfeed.Recorder(store, mode="w") as rec:  # replaces the earlier recording
        rec.record("y", 2.0)
    assert "x" not in zarr.open_group(store, mode="r")
    with pytest.raises(hostfeed.RecordingError, match="not a hostfeed recording"):
        hostfeed.Recorder(str(tmp_path), mode="w")
    assert blocker.exists()


def test_a_failing_disk_is_a_recording_error_at_the_next_barrier(store):
    # RLIMIT_FSIZE makes writes past 1 MB fail with EFBIG, like a full disk does with
    # ENOSPC, without needing a small file system.
    code = f"""
        import resource, signal
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        import jax, jax.numpy as jnp, numpy as np, zarr, hostfeed
        from hostfeed import host_callback as hcb
        rec = hostfeed.Recorder({store!r}, chunk_bytes=1 << 16)
        f = jax.jit(lambda x: rec.record("x", x))
        for i in range(4):
            f(jnp.full(1 << 14, i, jnp.float32))  # 64 KiB rows, one per chunk
        rec.flush()
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
        jax.jit(lambda x: rec.record("big", x))(jnp.ones(1 << 19))  # a 2 MiB row fails
        for i in range(4, 6):
            f(jnp.full(1 << 14, i, jnp.float32))
        try:
            hcb.barrier_wait()
        except hostfeed.RecordingError as e:
            print("ERR", e.errno, e)
        else:
            print("no error")
        hcb.barrier_wait()  # reported once
        print("rows", zarr.open_group({store!r}, mode="r")["x"].shape[0])
        rec.close()
    """
    r = run_python(code)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "ERR 27" in r.stdout, r.stdout + r.stderr[-2000:]
    assert "rows 6" in r.stdout, r.stdout


def test_rows_flushed_before_a_kill_survive_it(store):
    """A process killed mid-run leaves a store that opens and holds every flushed row."""
    code = f"""
        import sys, jax, jax.numpy as jnp, numpy as np, hostfeed
        rec = hostfeed.Recorder({store!r}, chunk_bytes=3 * 4096 * 4, compression=sys.argv[1])
        f = jax.jit(lambda x, s: rec.record("act/h", x, step=s))
        i = 0
        while True:
            for _ in range(1 + i % 4):
                f(jnp.full(4096, i, jnp.float32), i)
                i += 1
            rec.flush()
            print("flushed", i, flush=True)
    """
    for compression in ("none", "zstd"):
        path = store + compression
        src = textwrap.dedent(code).replace(repr(store), repr(path))
        p = subprocess.Popen([sys.executable, "-c", src, compression], stdout=subprocess.PIPE,
                             text=True, env=dict(os.environ, JAX_PLATFORMS="cpu"))
        flushed = 0
        assert p.stdout is not None
        for line in p.stdout:
            flushed = int(line.split()[1])
            if flushed >= 40:
                break
        p.send_signal(signal.SIGKILL)
        p.wait()
        p.stdout.close()
        rows, meta = hostfeed.read_recording(path, "act/h")
        n = rows.shape[0]
        assert n >= flushed, (compression, n, flushed)
        np.testing.assert_array_equal(rows, np.repeat(np.arange(n, dtype=np.float32)[:, None],
                                                      4096, axis=1))
        assert meta["step"].tolist() == list(range(n))


def test_interpreter_exit_writes_every_row(store):
    code = f"""
        import jax, jax.numpy as jnp, hostfeed
        rec = hostfeed.Recorder({store!r}, compression="zstd", commit_interval=1e6)
        f = jax.jit(lambda x: rec.record("x", x))
        for i in range(100):
            f(jnp.full(100, i, jnp.int32))
        del rec  # dropped without close: exit still writes everything
    """
    r = run_python(code)
    assert r.returncode == 0, r.stderr[-2000:]
    np.testing.assert_array_equal(read(store, "x"), np.repeat(np.arange(100)[:, None], 100, 1))


@pytest.mark.skipif(ON_TPU, reason="hung on the TPU machine (2026-12-05), the main thread "
                    "in XLA's compile while a computation waited for room in a 1-4 MiB "
                    "queue; not yet understood (docs/platforms.md)")
def test_the_queue_bound_holds_until_rows_are_written(store):
    bound = 4 << 20
    row = 1 << 20  # 1 MiB rows
    with queue_bound(bound):
        hostfeed._receiver.host.reset_peak()
        with hostfeed.Recorder(store, chunk_bytes=2 * row) as rec:
            f = jax.jit(lambda x: rec.record("x", x))
            for i in range(40):
                f(jnp.full(row // 4, i, jnp.float32))
            rec.flush()
            stats = hostfeed.receiver_stats()
    assert stats["queued_bytes"] == 0, "written rows release their bytes"
    assert stats["peak_queued_bytes"] <= bound + row + 4096, stats
    got = read(store, "x")
    np.testing.assert_array_equal(got[:, 0], np.arange(40, dtype=np.float32))


@pytest.mark.skipif("HOSTFEED_BUFFER_POOL_BYTES" in os.environ, reason="a chosen pool limit")
def test_an_open_recorder_keeps_a_burst_of_large_rows_warm(store):
    # Rows stay with the recorder until written, so their buffers return to the pool
    # together; an open recorder raises the pool's limit to the queue bound (what it
    # may hold), so that the next burst reuses them instead of faulting in fresh memory.
    default = hostfeed._receiver.host.DEFAULT_BUFFER_POOL_BYTES
    row = 4 << 20
    with queue_bound(512 << 20):
        assert hostfeed.receiver_stats()["buffer_pool_bytes"] == default
        # Chunks of 32 rows: the 24 rows stay pending, all held at once, until the flush
        # (no live cycle writes them before).
        with hostfeed.Recorder(store, chunk_bytes=32 * row, commit_interval=float("inf")) as rec:
            assert hostfeed.receiver_stats()["buffer_pool_bytes"] == 512 << 20
            f = jax.jit(lambda x: lax.fori_loop(0, 24, lambda i, x: rec.record("x", x + i), x))
            f(jnp.zeros(row // 4, jnp.float32))
            rec.flush()
            assert hostfeed.receiver_stats()["buffer_pool_idle_bytes"] >= 24 * row
        stats = hostfeed.receiver_stats()
    assert stats["buffer_pool_bytes"] == default
    assert stats["buffer_pool_idle_bytes"] <= default, "closing trims the pool back"
    got = read(store, "x")
    np.testing.assert_array_equal(got[:, 0], np.cumsum(np.arange(24)).astype(np.float32))


@pytest.mark.skipif(ON_TPU, reason="hung on the TPU machine (2026-12-05), the main thread "
                    "in XLA's compile while a computation waited for room in a 1-4 MiB "
                    "queue; not yet understood (docs/platforms.md)")
def test_rows_pending_in_partial_chunks_never_deadlock_a_large_tap(store):
    # Rows waiting in partial chunks hold under half the bound; a tap needing more than
    # the other half must still get through (the recorder writes them early: a spill, here
    # where no live cycle writes them first).
    bound = 1 << 20
    seen = []
    with queue_bound(bound), hostfeed.Recorder(store, chunk_bytes=bound,
                                               commit_interval=float("inf")) as rec:
        for i in range(3):  # 300 KB of rows pending in three partial chunks
            jax.jit(lambda x, i=i: rec.record(f"a{i}", x))(jnp.ones(25_000, jnp.float32))
        big = jax.jit(lambda x: hcb.id_tap(lambda v, t: seen.append(v.nbytes), x))
        big(jnp.zeros(200_000, jnp.float32))  # 800 KB
        hcb.barrier_wait()
        assert rec.stats()["spills"] >= 1
    assert seen == [800_000]


@pytest.mark.parametrize("compression", [None, "zstd"])
@pytest.mark.parametrize("separator", ["/", "."])
def test_flushes_in_the_middle_of_chunks(store, compression, separator):
    rows = random_bits((23, 7), np.int16, seed=1)
    with hostfeed.Recorder(store, compression=compression, chunk_bytes=5 * 14,
                           separator=separator, writers=2) as rec:
        f = jax.jit(lambda x: rec.record("g/x", x))
        for i, r in enumerate(rows):
            f(r)
            if i in (3, 4, 11, 17):
                rec.flush()
                assert same_bits(read(store, "g/x"), rows[:i + 1])
    assert same_bits(read(store, "g/x"), rows)
    with open(os.path.join(store, "g", "x", "zarr.json")) as fh:
        meta = json.load(fh)
    assert meta["chunk_grid"]["configuration"]["chunk_shape"] == [5, 7]


def test_taps_and_records_mixed_in_one_computation(store):
    seen = []
    with hostfeed.Recorder(store) as rec:
        @jax.jit
        def f(x):
            for _ in range(3):
                x = rec.record("x", x + 1)
                x = hcb.id_tap(lambda v, t: seen.append(float(v)), x)
            return x

        f(0.0)
        hcb.barrier_wait()
    assert seen == [1.0, 2.0, 3.0]
    assert read(store, "x").tolist() == [1.0, 2.0, 3.0]


def test_a_batch_of_records_alone_does_not_reach_python(store, monkeypatch):
    calls = []
    dispatch = dispatcher.Dispatcher.__call__

    def counting(self, batch):
        calls.append(1)
        return dispatch(self, batch)

    with hostfeed.Recorder(store) as rec:
        f = jax.jit(lambda x: lax.fori_loop(0, 200, lambda i, c: rec.record("x", c + 1), x))
        f(0.0)
        hcb.barrier_wait()
        monkeypatch.setattr(dispatcher.Dispatcher, "__call__", counting)
        f(0.0)
        hcb.barrier_wait()
        monkeypatch.undo()
        assert rec.stats()["rows"] == 400
    assert calls == [], "the consumer routed every record in Rust"
    assert read(store, "x")[-1] == 200.0


def test_zstd_store_reads_back_and_stats(store):
    rows = np.maximum(np.random.default_rng(0).normal(size=(30, 1000)), 0).astype(np.float32)
    with hostfeed.Recorder(store, compression="zstd", compression_level=3,
                           chunk_bytes=8 * 4000) as rec:
        f = jax.jit(lambda x: rec.record("act", x))
        for r in rows:
            f(r)
        rec.flush()
        s = rec.stats()
    assert s["rows"] == 30 and s["bytes_written"] == rows.nbytes and s["rows_dropped"] == 0
    assert same_bits(read(store, "act"), rows)
    with open(os.path.join(store, "act", "zarr.json")) as fh:
        codecs = json.load(fh)["codecs"]
    assert codecs[-1] == {"name": "zstd", "configuration": {"level": 3, "checksum": False}}


def test_multidevice_records_in_a_subprocess(tmp_path):
    helper = os.path.join(os.path.dirname(__file__), "helpers", "recording_cases.py")
    for shardy in ("1", "0")[:1 if compat.since("shardy_always") else 2]:
        r = subprocess.run([sys.executable, helper, str(tmp_path / f"md{shardy}"), shardy],
                           capture_output=True, text=True, timeout=600,
                           env=dict(os.environ, JAX_PLATFORMS="cpu"))
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
        assert r.stdout.strip().splitlines()[-1] == "all ok", r.stdout


def test_registered_dtypes_leave_zarr_python_working_for_other_arrays(tmp_path):
    # zarr-python infers a data type by asking every registered one; ours must decline
    # the others, and can also be used to write.
    plain = zarr.create_array(str(tmp_path / "f.zarr"), shape=(2,), dtype=np.float32)
    plain[:] = [1.0, 2.0]
    assert plain[:].tolist() == [1.0, 2.0]
    bf = zarr.create_array(str(tmp_path / "b.zarr"), shape=(3,), dtype=ml_dtypes.bfloat16)
    bf[:] = np.array([1.5, -2.0, 3.0], ml_dtypes.bfloat16)
    got = zarr.open_array(str(tmp_path / "b.zarr"), mode="r")[:]
    assert got.dtype == ml_dtypes.bfloat16 and got.tolist() == [1.5, -2.0, 3.0]


@pytest.mark.parametrize("order", ["hostfeed, zarr", "zarr, hostfeed"])
def test_zarr_learns_the_ml_dtypes_whatever_the_import_order(store, order):
    with hostfeed.Recorder(store) as rec:
        rec.record("b", jnp.arange(3, dtype=jnp.bfloat16))
    r = run_python(f"""
        import {order}
        print(zarr.open_group({store!r}, mode="r")["b"][:].tolist())
    """)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "[[0.0, 1.0, 2.0]]"


def test_a_chosen_pool_limit_holds_whatever_starts_the_receiver(tmp_path):
    # HOSTFEED_BUFFER_POOL_BYTES applies even when start_receiver(max_queue_byte_size=...)
    # starts the receiver, and open Recorders do not raise it.
    r = run_python(f"""
        import hostfeed
        hostfeed.start_receiver(max_queue_byte_size=512 << 20)
        before = hostfeed.receiver_stats()["buffer_pool_bytes"]
        with hostfeed.Recorder({str(tmp_path / "r.zarr")!r}) as rec:
            during = hostfeed.receiver_stats()["buffer_pool_bytes"]
        print(before, during)
    """, env={"HOSTFEED_BUFFER_POOL_BYTES": str(16 << 20)})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [str(16 << 20)] * 2


def test_a_recorder_is_static_in_a_pytree_and_can_be_a_jitted_argument(tmp_path):
    with hostfeed.Recorder(tmp_path / "a.zarr", mode="w") as a, \
            hostfeed.Recorder(tmp_path / "b.zarr", mode="w") as b:
        assert jax.tree.leaves({"rec": a, "x": 1}) == [1]
        f = jax.jit(lambda rec, x, i: rec.record("h", x * 2, step=i))
        for i in range(2):
            f(a, jnp.ones(2), i)
        f(b, jnp.ones(2), 7)  # another recorder: traced again, recorded there
    assert hostfeed.read_recording(tmp_path / "a.zarr", "h")[1]["step"].tolist() == [0, 1]
    assert hostfeed.read_recording(tmp_path / "b.zarr", "h")[1]["step"].tolist() == [7]
