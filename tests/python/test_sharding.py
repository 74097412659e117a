"""Sharded recordings (Zarr's ``sharding_indexed``, ``Recorder(shard_bytes=...)``) on a file
system: rows read back bit for bit by zarr-python, tensorstore and zarrs (the Rust
implementation, through its zarr-python codec pipeline), after flushes in the middle of
inner chunks and of shards, and after appending (object stores, sharded by default:
test_object_store.py)."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import hostfeed

zarr = pytest.importorskip("zarr", reason="needs zarr-python")


def _read_with_zarrs(path: str) -> np.ndarray:
    pytest.importorskip("zarrs", reason="needs zarrs (pip install zarrs)")
    with zarr.config.set({"codec_pipeline.path": "zarrs.ZarrsCodecPipeline"}):
        a = zarr.open_array(path, mode="r")
        assert type(a._async_array.codec_pipeline).__name__ == "ZarrsCodecPipeline"
        return a[:]


def _read_with_tensorstore(path: str) -> np.ndarray:
    ts = pytest.importorskip("tensorstore", reason="needs tensorstore")
    return ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": path + "/"}}
                   ).result().read().result()


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_sharded_rows_read_back_with_zarr_python_and_tensorstore(tmp_path, compression):
    path = str(tmp_path / "run.zarr")
    row = 4 * 4  # float32[4]
    # Inner chunks of 5 rows, shards of 15: flushes in the middle of both.
    with hostfeed.Recorder(path, compression=compression, chunk_bytes=5 * row,
                           shard_bytes=15 * row) as rec:
        f = jax.jit(lambda x, s: rec.record("g/h", x, step=s))
        for s in range(23):
            f(jnp.arange(4, dtype=jnp.float32) + s, s)
            if s in (2, 7, 16, 19):
                rec.flush()
                assert zarr.open_array(path + "/g/h", mode="r").shape == (s + 1, 4)
    want = np.arange(4)[None, :] + np.arange(23)[:, None]
    meta = json.loads((tmp_path / "run.zarr" / "g" / "h" / "zarr.json").read_text())
    assert meta["codecs"][0]["name"] == "sharding_indexed"
    assert meta["chunk_grid"]["configuration"]["chunk_shape"] == [15, 4]
    a = zarr.open_array(path + "/g/h", mode="r")
    assert a.shards == (15, 4) and a.chunks == (5, 4)
    np.testing.assert_array_equal(a[:], want)
    np.testing.assert_array_equal(_read_with_tensorstore(path + "/g/h"), want)
    np.testing.assert_array_equal(_read_with_zarrs(path + "/g/h"), want)
    assert sorted(os.listdir(tmp_path / "run.zarr" / "g" / "h" / "c")) == ["0", "1"]
    # Appending goes on inside the last shard.
    with hostfeed.Recorder(path, mode="a", resume_after_step=20) as rec:
        for s in range(21, 32):
            rec.record("g/h", jnp.arange(4, dtype=jnp.float32) + s, step=s)
    want = np.arange(4)[None, :] + np.arange(32)[:, None]
    np.testing.assert_array_equal(zarr.open_array(path + "/g/h", mode="r")[:], want)
    np.testing.assert_array_equal(_read_with_tensorstore(path + "/g/h"), want)
    np.testing.assert_array_equal(_read_with_zarrs(path + "/g/h"), want)


def test_shard_bytes_is_checked(tmp_path):
    for bad in (-1, 1.5, True, "big"):
        with pytest.raises(ValueError, match="shard_bytes must be a number of bytes"):
            hostfeed.Recorder(tmp_path / f"x{bad}.zarr", shard_bytes=bad)
