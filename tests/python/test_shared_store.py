"""Many processes recording into one Zarr store: under `jax.distributed` (gloo
CPU collectives on loopback, a shared temporary directory) every process opens the same
`hostfeed.Recorder(path)` and writes the chunks of the shards its own devices hold.

Two processes each opening the store must not lose rows (by replacing each other's
files), and a sharded record must not move its shards to process 0 (collectives in the
compiled step). The stores written by 2 and 4 processes are compared file by file
with the single-process recording of the same program (4 devices): every file is the
same, bit for bit, except the per-row arrival times and record numbers (`.time_ns`,
`.seq`), which depend on timing; the faults (a process killed, one raising) end within a
time bound with the rows every process committed in the store.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile

import numpy as np
import pytest

pytestmark = pytest.mark.several_devices

HELPER = os.path.join(os.path.dirname(__file__), "helpers", "shared_store_cases.py")
LAUNCH_TIMEOUT = 180.0  # a whole group (2 cores, shared)
FAULT_TIMEOUT = 8.0  # the helper's coordination_timeout for the fault scenarios
DEVICES = 4  # in every configuration, so that one reference run serves all
_cache: dict = {}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(n_proc: int, scenario: str, path: str) -> list[tuple[int | None, dict, str]]:
    """Runs `scenario` in `n_proc` processes (0: one, without jax.distributed) recording
    to `path`; returns (exit status, RESULT, stderr) per process."""
    port = _free_port()
    local = DEVICES // max(n_proc, 1)
    procs, files = [], []
    out_dir = tempfile.mkdtemp(prefix="hostfeed-shared-")
    for i in range(max(n_proc, 1)):
        out, err = os.path.join(out_dir, f"{i}.out"), os.path.join(out_dir, f"{i}.err")
        files.append((out, err))
        with open(out, "w") as o, open(err, "w") as e:
            procs.append(subprocess.Popen(
                [sys.executable, HELPER, str(i), str(n_proc), str(port), str(local), path,
                 scenario], stdout=o, stderr=e, stdin=subprocess.DEVNULL,
                env=dict(os.environ, JAX_PLATFORMS="cpu"), start_new_session=True))
    try:
        for p in procs:
            p.wait(LAUNCH_TIMEOUT)
    except subprocess.TimeoutExpired:
        pass
    finally:
        for p in procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    results = []
    for p, (out, err) in zip(procs, files):
        with open(out) as o, open(err) as e:
            text, errors = o.read(), e.read()
        found = [json.loads(line[len("RESULT "):]) for line in text.splitlines()
                 if line.startswith("RESULT ")]
        results.append((p.returncode, found[0] if found else {}, errors[-3000:]))
    shutil.rmtree(out_dir)
    return results


def _report(results) -> str:
    return "\n".join(f"--- process {i} rc={rc} {res}\n{err}"
                     for i, (rc, res, err) in enumerate(results))


def _store_files(path: str) -> dict[str, bytes]:
    """Every file of a store by relative path, but the timing-dependent per-row arrays'
    chunks (their `zarr.json` are compared)."""
    out = {}
    for root, _, names in os.walk(path):
        for n in names:
            rel = os.path.relpath(os.path.join(root, n), path)
            timing = any(part.endswith((".time_ns", ".seq")) for part in rel.split(os.sep))
            if timing and n != "zarr.json":
                continue
            with open(os.path.join(root, n), "rb") as f:
                out[rel] = f.read()
    return out


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("ref") / "run.zarr")
    results = run(0, "program", path)
    assert results[0][0] == 0, _report(results)
    return path


def _zarr_root(path: str):
    zarr = pytest.importorskip("zarr")
    from hostfeed import zarr_dtypes
    zarr_dtypes.register()
    return zarr.open_group(path, mode="r")


@pytest.mark.parametrize("n_proc", [2, 4])
def test_processes_write_one_store_the_same_bit_for_bit(n_proc, reference, tmp_path):
    path = str(tmp_path / "run.zarr")
    results = run(n_proc, "program", path)
    assert all(rc == 0 for rc, _, _ in results), _report(results)
    for _, res, _ in results:
        # The record adds no collective to the step: no recorded byte crosses processes.
        assert res["collectives"] == 0, res
        # A second Recorder on the open path, in the same process, is refused.
        assert "locked" in res["second_open"] or "could not open" in res["second_open"], res
    ref, mine = _store_files(reference), _store_files(path)
    # `dev/` and `many/` are recorded with many processes only.
    shared = {k: v for k, v in mine.items() if not k.startswith(("dev", "many"))}
    assert sorted(shared) == sorted(ref)
    different = [k for k in ref if ref[k] != shared[k]]
    assert not different, different
    root = _zarr_root(path)
    h = np.asarray(root["act/h"][:])
    whole = np.arange(2 * DEVICES * 3, dtype=np.float32).reshape(-1, 3)
    np.testing.assert_array_equal(h, np.stack([whole * 2 + s for s in range(6)]))
    assert root["act/h"].chunks == (2, 2, 3), "a chunk never spans two devices' shards"
    np.testing.assert_array_equal(np.asarray(root["act/h.step"][:]), np.arange(6))
    np.testing.assert_array_equal(np.asarray(root["act/r"][:]),
                                  np.arange(4)[None] + np.arange(6)[:, None])
    # Per-device records of every process: axis 1 is the device's place in the mesh.
    v = np.asarray(root["dev/v"][:])
    assert v.shape == (2, DEVICES, 2, 3)
    np.testing.assert_array_equal(v[1], (whole + 1).reshape(DEVICES, 2, 3))
    # pmap: the same, the devices in jax.devices() order (each process passed its own).
    ids = results[0][1]["pmap_ids"]
    p = np.asarray(root["dev/p"][:])
    np.testing.assert_array_equal(p, (np.array(ids)[:, None] * 10 * np.ones(3, int))[None])
    assert not os.path.exists(os.path.join(path, ".hostfeed.lock")), "released at close"
    # Agreement through the coordination service: a declaration that clashes with another
    # process's, and a name another process writes, are refused at the call.
    for _, res, _ in results[1:]:
        clash = res["clash"]
        assert "declared by another process" in clash["declare"], clash
        assert "written by process 0" in clash["eager"], clash
        assert "written by process 0" in clash["jit"], clash
    np.testing.assert_array_equal(np.asarray(root["many/e"][:]), np.ones((1, 2)))
    np.testing.assert_array_equal(np.asarray(root["many/s"][:]), np.ones((1, 3)))


def _arrays(group, prefix=""):
    """Every array of a zarr group by path, read whole."""
    out = {}
    for name, node in group.members():
        path = f"{prefix}{name}"
        if hasattr(node, "shape"):
            out[path] = np.asarray(node[:])
        else:
            out.update(_arrays(node, path + "/"))
    return out


def test_processes_share_an_object_store(reference):
    """The same program, its processes recording to one store in an S3 bucket (moto, on
    127.0.0.1): process 0 holds the lock object naming the run, each process uploads its own
    parts' shards (sharded by default in an object store), and the store holds the same
    values as the single-process reference run on disk."""
    pytest.importorskip("moto.server", reason="needs moto[server]")
    obstore = pytest.importorskip("obstore")
    from helpers.s3_server import S3Server, restore, setenv
    server = S3Server()
    server.start()
    old = setenv(server.env())
    try:
        bucket = server.new_bucket()
        url = f"s3://{bucket}/shared/run.zarr"
        results = run(2, "program", url)
        assert all(rc == 0 for rc, _, _ in results), _report(results)
        assert "locked" in results[1][1]["second_open"], results[1][1]
        keys = server.keys(bucket, "shared/run.zarr/")
        assert "shared/run.zarr/.hostfeed.lock" not in keys, "released at close"
        # Each device's slice of act/h in its own shard: c/<shard>/<device>/0.
        assert sorted(k for k in keys if k.startswith("shared/run.zarr/act/h/c/")) == [
            f"shared/run.zarr/act/h/c/0/{d}/0" for d in range(DEVICES)]
        zarr = pytest.importorskip("zarr")
        from hostfeed import zarr_dtypes
        zarr_dtypes.register()
        store = zarr.storage.ObjectStore(obstore.store.from_url(
            f"s3://{bucket}", config={"endpoint": server.endpoint},
            client_options={"allow_http": True}), read_only=True)
        mine = _arrays(zarr.open_group(store, path="shared/run.zarr", mode="r"))
    finally:
        restore(old)
        server.close()
    ref = _arrays(_zarr_root(reference))
    timing = [k for k in ref if k.endswith((".time_ns", ".seq"))]
    assert set(ref) <= set(mine)
    for k in sorted(set(ref) - set(timing)):
        np.testing.assert_array_equal(mine[k], ref[k], err_msg=k)
    for k in timing:
        assert mine[k].shape == ref[k].shape, k
    np.testing.assert_array_equal(mine["many/e"], np.ones((1, 2)))


@pytest.mark.parametrize("fault", ["killed", "raising"])
def test_a_failing_process_leaves_the_committed_rows_and_others_get_an_error(fault, tmp_path):
    path = str(tmp_path / "run.zarr")
    results = run(2, fault, path)
    survivor = results[0][1]
    assert "RecordingError" in survivor.get("error", ""), _report(results)
    assert survivor["seconds"] < FAULT_TIMEOUT + 20, survivor
    if fault == "killed":
        assert results[1][0] == -signal.SIGKILL, _report(results)
        assert "did not" in survivor["error"] or "not every process" in survivor["error"]
    else:
        assert "process 1 fails" in results[1][1].get("error", ""), _report(results)
        assert "different numbers of rows" in survivor["error"], _report(results)
    # Process 1 flushed 3 rows before failing: those are in the store, and no more.
    root = _zarr_root(path)
    whole = np.arange(2 * DEVICES * 3, dtype=np.float32).reshape(-1, 3)
    np.testing.assert_array_equal(np.asarray(root["act/h"][:]),
                                  np.stack([whole * 2 + s for s in range(3)]))
    np.testing.assert_array_equal(np.asarray(root["act/h.step"][:]), np.arange(3))


def test_another_run_on_an_open_shared_store_is_refused(tmp_path):
    """The lock of a store shared by one run's processes refuses an unrelated process, as
    a plain recorder or as a member of another run, naming who holds it."""
    from hostfeed import _receiver
    from hostfeed._src.record.options import options
    path = str(tmp_path / "run.zarr")
    held = _receiver.record.Recorder(path, **options(path, mode="w").native(), shared="run-a",
                                     leader=True)
    script = (
        "import sys, hostfeed\n"
        "from hostfeed import _receiver\n"
        "from hostfeed._src.record.options import options\n"
        "for kw in ({}, {'shared': 'run-b', 'leader': False}):\n"
        "    try:\n"
        "        _receiver.record.Recorder(sys.argv[1], **options(sys.argv[1], mode='w')"
        ".native(), **kw)\n"
        "    except hostfeed.RecordingError as exc:\n"
        "        print('REFUSED', exc.errno, exc)\n")
    try:
        out = subprocess.run([sys.executable, "-c", script, path], capture_output=True,
                             text=True, timeout=120, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    finally:
        held.close()
    refused = [line for line in out.stdout.splitlines() if line.startswith("REFUSED 16 ")]
    assert len(refused) == 2, out.stdout + out.stderr
    assert all("another jax.distributed run" in line and f"process {os.getpid()}" in line
               for line in refused), refused
    assert os.listdir(path) == ["zarr.json"], "refused opens changed nothing; close released"
