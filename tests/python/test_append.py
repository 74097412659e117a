"""Appending to a recording (``mode="a"``) and resuming after a preemption
(``resume_after_step``), on a file system (object stores: test_object_store.py)."""
from __future__ import annotations

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import hostfeed

pytest.importorskip("zarr", reason="needs zarr-python")


def _train(rec, steps, chunk_scan=False):
    """Records ``h`` (a vector) and ``loss`` (a scalar) for each step, under jit."""
    @jax.jit
    def step(s):
        h = rec.record("layer/h", jnp.arange(3, dtype=jnp.float32) + s, step=s)
        return rec.record("loss", h.sum(), step=s)
    for s in steps:
        step(s)


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_a_resumed_run_records_each_step_once(tmp_path, compression):
    path = tmp_path / "run.zarr"
    # 2 rows a chunk of h: the preempted run stops mid-chunk, after a flush mid-chunk.
    opts = dict(compression=compression, chunk_bytes=24)
    rec = hostfeed.Recorder(path, **opts)
    _train(rec, range(3))
    rec.flush()
    _train(rec, range(3, 7))
    rec.close()
    with hostfeed.Recorder(path, mode="a", resume_after_step=4, **opts) as rec:
        _train(rec, range(5, 10))
    for name in ("layer/h", "loss"):
        rows, meta = hostfeed.read_recording(path, name)
        assert meta["step"].tolist() == list(range(10)), name
        assert meta["seq"].tolist() == sorted(set(meta["seq"].tolist())), "record numbers unique"
    h, _ = hostfeed.read_recording(path, "layer/h")
    np.testing.assert_array_equal(h, np.arange(3)[None, :] + np.arange(10)[:, None])


def test_append_goes_on_after_the_last_row_and_keeps_the_transforms_table(tmp_path):
    path = tmp_path / "run.zarr"
    with hostfeed.Recorder(path) as rec:
        jax.jit(jax.vmap(lambda x: rec.record("v", x)))(jnp.arange(6.0).reshape(2, 3))
        rec.record("plain", jnp.ones(2))
    _, before = hostfeed.read_recording(path, "v")
    with hostfeed.Recorder(path, mode="a") as rec:
        rec.record("v", jnp.full(3, 7.0))                 # no transform this time
        jax.jit(jax.vmap(lambda x: rec.record("v", x)))(jnp.ones((1, 3)))
        rec.record("new/array", jnp.int32(1))            # a new array in the same store
    rows, meta = hostfeed.read_recording(path, "v")
    assert rows.shape == (4, 3) and rows[2].tolist() == [7.0] * 3
    names = [meta["transforms"][i] for i in meta["transform_index"]]
    assert names[:2] == [before["transforms"][i] for i in before["transform_index"]]
    assert names[2] == [], "no transform"
    assert names[3] == names[0], "the same vmap description, same meaning of the index"
    assert hostfeed.read_recording(path, "new/array")[0].tolist() == [1]
    assert hostfeed.read_recording(path, "plain")[0].shape == (1, 2)


def test_append_checks_declarations_and_modes(tmp_path):
    path = tmp_path / "run.zarr"
    with hostfeed.Recorder(path) as rec:
        rec.record("x", jnp.ones(3))
    with hostfeed.Recorder(path, mode="a") as rec:
        with pytest.raises(ValueError, match=r"first recorded as float32 \[3\], now as "
                                             r"float32 \[4\]"):
            rec.record("x", jnp.ones(4))
        with pytest.raises(ValueError, match="cannot be both an array and a group"):
            rec.record("x/y", jnp.ones(4))
    with pytest.raises(ValueError, match='resume_after_step goes with mode="a"'):
        hostfeed.Recorder(tmp_path / "other.zarr", resume_after_step=3)
    with pytest.raises(TypeError, match="resume_after_step must be an int"):
        hostfeed.Recorder(path, mode="a", resume_after_step=2.5)
    (tmp_path / "not-a-recording").mkdir()
    (tmp_path / "not-a-recording" / "data.txt").write_text("x")
    with pytest.raises(hostfeed.RecordingError, match='mode="a" only appends to them'):
        hostfeed.Recorder(tmp_path / "not-a-recording", mode="a")
    # A path with nothing there: mode="a" creates the recording.
    with hostfeed.Recorder(tmp_path / "fresh.zarr", mode="a") as rec:
        rec.record("x", jnp.ones(1))
    assert hostfeed.read_recording(tmp_path / "fresh.zarr", "x")[0].tolist() == [[1.0]]


def test_resume_after_a_step_before_every_row_empties_the_arrays(tmp_path):
    path = tmp_path / "run.zarr"
    with hostfeed.Recorder(path) as rec:
        _train(rec, range(3, 6))
    with hostfeed.Recorder(path, mode="a", resume_after_step=1) as rec:
        pass
    rows, meta = hostfeed.read_recording(path, "layer/h")
    assert rows.shape == (0, 3) and meta["step"].tolist() == []
    with hostfeed.Recorder(path, mode="a") as rec:
        _train(rec, range(2, 4))
    assert hostfeed.read_recording(path, "loss")[1]["step"].tolist() == [2, 3]


def test_append_refuses_a_store_whose_array_metadata_is_corrupt(tmp_path):
    # A truncated h/zarr.json: appending must not take "h" for a new array and write over
    # its chunks (it did: 20 rows became 3), but refuse, saying which array.
    path = tmp_path / "run.zarr"
    with hostfeed.Recorder(path) as rec:
        for s in range(20):
            rec.record("h", jnp.full(2, s, jnp.int32), step=s)
    meta = path / "h" / "zarr.json"
    text = meta.read_text()
    chunks = {p: p.read_bytes() for p in (path / "h").rglob("*") if p.is_file()}
    meta.write_text(text[: len(text) // 2])
    with pytest.raises(hostfeed.RecordingError, match=r"h.*zarr.json is not JSON"):
        hostfeed.Recorder(path, mode="a")
    assert {p: p.read_bytes() for p in chunks if p != meta} == {
        p: b for p, b in chunks.items() if p != meta}, "nothing was written over"
    meta.write_text(text)  # restored: appending works again
    with hostfeed.Recorder(path, mode="a") as rec:
        rec.record("h", jnp.full(2, 20, jnp.int32), step=20)
    rows, m = hostfeed.read_recording(path, "h")
    assert m["step"].tolist() == list(range(21))


def test_append_leaves_another_writers_array_alone(tmp_path):
    import zarr
    path = tmp_path / "run.zarr"
    with hostfeed.Recorder(path) as rec:
        rec.record("h", jnp.ones(2))
    zarr.open_array(str(path / "theirs"), mode="w", shape=(3,), dtype="int32")[:] = [1, 2, 3]
    with hostfeed.Recorder(path, mode="a") as rec:
        rec.record("h", jnp.ones(2))  # its own arrays: appended to
        with pytest.raises(ValueError, match="theirs.*hostfeed did not write"):
            rec.record("theirs", jnp.ones(3, jnp.int32))
    assert zarr.open_array(str(path / "theirs"), mode="r")[:].tolist() == [1, 2, 3]
    rows, _ = hostfeed.read_recording(path, "h")
    assert rows.shape == (2, 2)
