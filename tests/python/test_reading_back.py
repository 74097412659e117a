"""Reading a recording back as training data: ``hostfeed.open_recording`` (names, a table,
random access that reads whole chunks), Grain and PyTorch reading an array, shuffled
``iter_batches`` visiting every row once per epoch, ``hostfeed.follow`` seeing every row
of a concurrent writer exactly once, and ``python -m hostfeed show``."""
from __future__ import annotations

import math
import re
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hostfeed

pytest.importorskip("zarr", reason="needs zarr-python")

ROWS, SEQ, D = 100, 6, 4


@pytest.fixture
def store(tmp_path):
    """100 rows of float32[6, 4]: row r holds r * 100 + token * 10 + channel, in chunks of
    8 rows (768 bytes a chunk), steps 10, 11, ..."""
    path = str(tmp_path / "run.zarr")
    base = np.arange(SEQ)[:, None] * 10 + np.arange(D)[None, :]
    with hostfeed.Recorder(path, chunk_bytes=8 * SEQ * D * 4) as rec:
        for r in range(ROWS):
            rec.record("act/h", (r * 100 + base).astype(np.float32), step=10 + r)
        rec.record("loss", np.float32(1.5), step=3)
    return path


def row(r):
    return (r * 100 + np.arange(SEQ)[:, None] * 10 + np.arange(D)[None, :]).astype(np.float32)


def test_open_recording_lists_names_and_reads_rows_by_whole_chunks(store):
    rec = hostfeed.open_recording(store)
    assert rec.names == ["act/h", "loss"] and "act/h" in rec
    table = {t["name"]: t for t in rec.table()}
    assert table["act/h"]["rows"] == ROWS and table["act/h"]["steps"] == (10, 10 + ROWS - 1)
    assert table["act/h"]["shape"] == (SEQ, D) and table["act/h"]["bytes"] == ROWS * SEQ * D * 4
    arr = rec["act/h"]
    assert len(arr) == ROWS and arr.shape == (ROWS, SEQ, D) and arr.chunk_rows == 8
    np.testing.assert_array_equal(arr.steps, np.arange(10, 10 + ROWS))
    # In order, row by row: each chunk is read once.
    for r in range(ROWS):
        np.testing.assert_array_equal(arr[r], row(r))
    assert arr.chunk_reads == math.ceil(ROWS / 8)
    np.testing.assert_array_equal(arr[-1], row(ROWS - 1))
    np.testing.assert_array_equal(arr[10:14], np.stack([row(r) for r in range(10, 14)]))
    picks = np.array([[97, 3], [50, 51]])
    np.testing.assert_array_equal(arr[picks], np.stack([[row(97), row(3)], [row(50), row(51)]]))
    arr.refresh()
    got = arr.__getitems__([0, 90, 1, 91, 2])
    assert [int(g[0, 0]) // 100 for g in got] == [0, 90, 1, 91, 2]
    assert arr.chunk_reads == 2, "one read per chunk a batch touches"
    with pytest.raises(IndexError, match="row 100 of 'act/h', which has 100 rows"):
        arr[100]
    with pytest.raises(TypeError, match="indexed by ints"):
        arr[np.array([0.5])]
    with pytest.raises(KeyError, match="no array 'act/g'"):
        rec["act/g"]


def test_grain_reads_an_array(store):
    arr = hostfeed.open_recording(store)["act/h"]
    grain = pytest.importorskip("grain")
    ds = grain.MapDataset.source(arr).shuffle(seed=1).batch(16)
    seen = np.concatenate([np.asarray(b)[:, 0, 0] // 100 for b in ds])
    assert sorted(seen.astype(int).tolist()) == list(range(ROWS))
    assert seen.astype(int).tolist() != list(range(ROWS)), "shuffled"


def test_a_pytorch_dataloader_reads_an_array(store):
    arr = hostfeed.open_recording(store)["act/h"]
    torch = pytest.importorskip("torch")
    loader = torch.utils.data.DataLoader(arr, batch_size=32, shuffle=True)
    seen = torch.cat([b[:, 0, 0] for b in loader]).numpy() // 100
    assert sorted(seen.astype(int).tolist()) == list(range(ROWS))


@pytest.mark.parametrize("flatten", [0, 1])
def test_iter_batches_visits_every_row_once_per_epoch(store, flatten):
    rec = hostfeed.open_recording(store)
    epochs = []
    for seed in (0, 1):
        batches = list(rec.iter_batches("act/h", 7, seed=seed, flatten_axes=flatten,
                                        window=3))
        assert all(len(b) == 7 for b in batches[:-1])
        rows = np.concatenate(batches)
        if flatten:
            assert rows.shape == (ROWS * SEQ, D)
            ids = (rows[:, 0] // 10).astype(int)  # row * 10 + token: one id per token
            assert sorted(ids.tolist()) == sorted(r * 10 + t for r in range(ROWS)
                                                  for t in range(SEQ))
        else:
            assert rows.shape == (ROWS, SEQ, D)
            ids = (rows[:, 0, 0] // 100).astype(int)
            assert sorted(ids.tolist()) == list(range(ROWS))
        epochs.append(ids.tolist())
    assert epochs[0] != epochs[1], "another seed, another order"
    ordered = np.concatenate(list(rec.iter_batches("act/h", 10, shuffle=False)))
    np.testing.assert_array_equal(ordered, np.stack([row(r) for r in range(ROWS)]))
    assert len(list(rec.iter_batches("act/h", 30, drop_last=True))) == ROWS // 30
    with pytest.raises(ValueError, match="batch_size must be a positive int"):
        next(rec.iter_batches("act/h", 0))
    with pytest.raises(ValueError, match="flatten_axes must be from 0 to 2"):
        next(rec.iter_batches("act/h", 4, flatten_axes=3))


WRITER = textwrap.dedent("""
    import sys, numpy as np, jax, jax.numpy as jnp, hostfeed
    rec = hostfeed.Recorder(sys.argv[1], chunk_bytes=64)
    f = jax.jit(lambda s: rec.record("x", jnp.full(4, s, jnp.int32), step=s))
    for block in range(3):
        for s in range(block * 10, block * 10 + 10):
            f(s)
        rec.flush()
        print("flushed", flush=True)
        sys.stdin.readline()  # the follower has seen this block
    rec.close()
""")


def test_follow_sees_every_row_of_a_concurrent_writer_once(tmp_path):
    path = str(tmp_path / "live.zarr")
    seen: list[int] = []
    with subprocess.Popen([sys.executable, "-c", WRITER, path], stdin=subprocess.PIPE,
                          stdout=subprocess.DEVNULL, text=True,
                          env=dict(os.environ, JAX_PLATFORMS="cpu")) as writer:
        try:
            for rows in hostfeed.follow(path, "x", poll=0.05, timeout=120):
                seen += rows[:, 0].tolist()
                if len(seen) % 10 == 0 and writer.poll() is None:
                    writer.stdin.write("go\n")  # the writer waits for it: still open here
                    writer.stdin.flush()
            assert writer.wait(60) == 0
        finally:
            if writer.poll() is None:
                writer.kill()
    assert seen == list(range(30))


def test_follow_keeps_a_writer_that_opens_between_its_look_and_its_read(tmp_path, monkeypatch):
    """follow() looks whether a writer holds the store, then reads it. A run that starts in
    between (its lock taken, its array traced, no row yet) is followed to its end, not
    taken for a closed store (seen once in CI: the follower ended before the first row)."""
    from hostfeed._src.readback import opened

    path = str(tmp_path / "starting.zarr")
    real_look = opened._writer_open
    looks: list[bool] = []
    writer: dict = {}

    def look(where):
        held = real_look(where)
        looks.append(held)
        if len(looks) == 1:  # the run starts right after the follower's first look
            rec = writer["rec"] = hostfeed.Recorder(path, chunk_bytes=64)
            writer["f"] = jax.jit(lambda s: rec.record("x", jnp.full(4, s, jnp.int32), step=s))
            writer["f"].lower(0)  # the array exists, with no row
        elif len(looks) == 4:  # later: five rows, then the run ends
            for s in range(5):
                writer["f"](s)
            writer["rec"].close()
        return held

    monkeypatch.setattr(opened, "_writer_open", look)
    rows = list(hostfeed.follow(path, "x", poll=0.001, timeout=60))
    assert looks[:2] == [False, True], looks  # nobody, then the run that had just started
    assert np.concatenate(rows)[:, 0].tolist() == [0, 1, 2, 3, 4]


def test_follow_ends_at_once_on_a_closed_store_and_times_out_on_a_missing_one(store, tmp_path):
    blocks = list(hostfeed.follow(store, "loss", poll=0.01, timeout=30))
    assert [b.tolist() for b in blocks] == [[1.5]]
    with pytest.raises(TimeoutError, match="no writer closed the store"):
        list(hostfeed.follow(str(tmp_path / "never.zarr"), "x", poll=0.01, timeout=0.2))


def test_follow_of_a_directory_that_is_no_recording_is_an_error_at_once(tmp_path):
    """follow() shares to_tensorboard(follow=True)'s loop: a directory with files of its
    own, no store and no writer is said at once, not waited on until the timeout."""
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "notes.txt").write_text("")
    with pytest.raises(ValueError, match=r"hostfeed\.follow\(.*'x'\): the path is not a "
                                         r"recording \(a directory with files but no "
                                         r"zarr\.json\), and no recorder is writing it"):
        list(hostfeed.follow(tmp_path / "plain", "x", poll=0.01, timeout=5))


def test_show_prints_the_table_and_draws_an_array(store, tmp_path):
    pytest.importorskip("matplotlib")
    with hostfeed.Recorder(store, mode="a") as rec:
        for s in range(5):
            rec.record("stats", np.arange(16, dtype=np.float32) * s, step=s, reduce="stats")
            rec.record("hist", np.arange(16, dtype=np.float32) * s, step=s,
                       reduce=hostfeed.Histogram(4, (0.0, 64.0)))
    for name in ("stats", "hist", "act/h"):
        png = str(tmp_path / f"{name.replace('/', '_')}.png")
        r = subprocess.run([sys.executable, "-m", "hostfeed", "show", store, name, "--png", png],
                           capture_output=True, text=True, timeout=120,
                           env=dict(os.environ, JAX_PLATFORMS="cpu"))
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        assert lines[0].endswith(": 4 arrays")
        assert any(line.split()[:2] == ["act/h", "100"] for line in lines), lines
        assert any(line.split()[0] == "stats" and line.split()[-1] == "stats" for line in lines)
        assert os.path.getsize(png) > 10_000
    r = subprocess.run([sys.executable, "-m", "hostfeed", "show", store, "nope"],
                       capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert r.returncode == 2 and "no array 'nope'" in r.stderr


def test_what_is_no_recording_is_said_with_the_path_and_what_is_there(store, tmp_path):
    """read_recording, open_recording and show on a folder that is no recording, on an
    array's folder and on a recording whose zarr.json is truncated: hostfeed's own message
    naming the path and what is wrong; from the command, status 2 and nothing at exit
    (zarr-python's reads left running after one failed print asyncio's complaints)."""
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "notes.txt").write_text("")
    (tmp_path / "empty").mkdir()
    damaged = {}
    for where in ("zarr.json", "act/h/zarr.json"):
        copy = tmp_path / f"damaged-{where.count('/')}.zarr"
        subprocess.run(["cp", "-r", store, str(copy)], check=True)
        (copy / where).write_bytes((copy / where).read_bytes()[:60])
        damaged[where] = copy
    cases = [
        (tmp_path / "plain", FileNotFoundError,
         r"no recording at .*plain: a directory of 1 entry \(notes\.txt\) without a zarr\.json"),
        (tmp_path / "empty", FileNotFoundError,
         r"no recording at .*empty: an empty directory without a zarr\.json"),
        (tmp_path / "nothing.zarr", FileNotFoundError, r"no recording at .*nothing\.zarr: "
                                                       r"nothing is there"),
        (os.path.join(store, "act", "h"), ValueError,
         r".*run\.zarr/act/h is the array 'act/h' of the recording .*run\.zarr, not a "
         r"recording: open .*run\.zarr and read 'act/h' in it"),
        (os.path.join(store, "loss", "zarr.json"), ValueError,
         r".*run\.zarr/loss/zarr\.json is a file, not a recording"),
        (damaged["zarr.json"], ValueError,
         r"the recording .*damaged-0\.zarr is damaged: .*damaged-0\.zarr/zarr\.json is no "
         r"Zarr metadata \(JSONDecodeError: "),
        (damaged["act/h/zarr.json"], ValueError,
         r"the recording .*damaged-2\.zarr is damaged: .*damaged-2\.zarr/act/h/zarr\.json is "
         r"no Zarr metadata \(JSONDecodeError: "),
    ]
    for path, error, message in cases:
        with pytest.raises(error, match=r"hostfeed\.open_recording: " + message):
            hostfeed.open_recording(path)
        if "damaged-2" not in str(path):  # read_recording reads only the array it names
            with pytest.raises(error, match=r"hostfeed\.read_recording: " + message):
                hostfeed.read_recording(path, "loss")
    with pytest.raises(ValueError, match=r"hostfeed\.read_recording: 'act/h' in the recording "
                                         r".*damaged-2\.zarr cannot be read: its metadata is "
                                         r"damaged \(JSONDecodeError"):
        hostfeed.read_recording(damaged["act/h/zarr.json"], "act/h")
    # The command: every case in one process, whose exit must print nothing more.
    script = textwrap.dedent(f"""
        import sys
        from hostfeed.__main__ import main
        for path in {[str(p) for p, _, _ in cases]!r}:
            print(main(["show", path, "-o", {str(tmp_path / "x.png")!r}]))
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=120, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert r.stdout.split() == ["2"] * len(cases), r.stdout
    said = r.stderr.splitlines()
    assert len(said) == len(cases), r.stderr
    for line, (_, _, message) in zip(said, cases):
        assert re.match(r"python -m hostfeed show: " + message, line), (line, message)
