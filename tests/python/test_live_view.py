"""Watching a run while it records: with no flush in the program, every row a Recorder
receives is announced within its ``commit_interval`` (a partial chunk written by the
recorder's live cycles), so ``hostfeed.follow`` and ``to_tensorboard(follow=True)`` (the
``tensorboard --follow`` command) see a loss recorded every 0.2 s within 2 s of each row,
on a local store and on an S3 server (moto, in a process of its own); a process killed
while its live cycles write leaves a store that reads back exactly."""
from __future__ import annotations

import contextlib
import json
import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hostfeed

pytest.importorskip("zarr", reason="needs zarr-python")

ROWS = 6
PACE = 0.2  # seconds between two records: the workload
WITHIN = 2.0  # seconds within which each row must be seen


@pytest.fixture(params=["local", "s3"])
def live_store(request, tmp_path):
    """A local path, or a URL on a moto S3 server the test starts (announced every second
    there too: the object store's default interval is longer)."""
    if request.param == "local":
        yield str(tmp_path / "live.zarr")
        return
    pytest.importorskip("moto.server", reason="needs moto[server]: pip install 'moto[server]'")
    pytest.importorskip("obstore", reason="needs obstore: pip install obstore")
    from helpers.s3_server import S3Process, restore, setenv
    server = S3Process("moto")
    server.start()
    old = setenv(server.env())
    try:
        yield f"s3://{server.new_bucket()}/live.zarr"
    finally:
        restore(old)
        server.close()


def test_a_loss_recorded_every_0_2_s_is_seen_by_follow_and_tensorboard_within_2_s(
        live_store, tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    from hostfeed._src.readback import tensorboard as tb
    logdir = str(tmp_path / "logs")
    seen = {"follow": 0, "tensorboard": 0}
    cond = threading.Condition()
    errors: list[BaseException] = []
    write = tb._Exporter.write

    def exported(self, name, *args):  # the exporter has the rows once it writes them
        write(self, name, *args)
        with cond:
            seen["tensorboard"] = sum(self.rows.values())
            cond.notify_all()

    monkeypatch.setattr(tb._Exporter, "write", exported)
    followed: list[float] = []

    def follow():
        try:
            for rows in hostfeed.follow(live_store, "loss", poll=0.1, timeout=120):
                with cond:
                    followed.extend(rows.tolist())
                    seen["follow"] = len(followed)
                    cond.notify_all()
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            errors.append(exc)

    def export():
        try:
            hostfeed.to_tensorboard(live_store, logdir, follow=True, poll=0.1, timeout=120)
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            errors.append(exc)

    rec = hostfeed.Recorder(live_store, mode="w", commit_interval=1.0)
    readers = [threading.Thread(target=follow), threading.Thread(target=export)]
    try:
        for t in readers:
            t.start()
        train_step = jax.jit(lambda loss, step: rec.record("loss", loss, step=step))
        pace = threading.Event()  # the workload's pacing, not a wait for a result
        recorded = []
        for s in range(ROWS):
            if s:
                pace.wait(PACE)
            train_step(jnp.float32(1 / (s + 1)), jnp.int32(s))
            recorded.append(time.monotonic())
        # Row s seen by each reader within 2 s of its record (waited for in order: a row
        # found seen here was seen before the last deadline, which is before its own).
        with cond:
            for s, at in enumerate(recorded):
                for who in ("follow", "tensorboard"):
                    left = max(0.0, at + WITHIN - time.monotonic())
                    assert cond.wait_for(lambda w=who, n=s + 1: seen[w] >= n, timeout=left), \
                        (f"{who} had not seen row {s} {WITHIN} s after it was recorded "
                         f"({seen}, {errors})")
    finally:
        rec.close()
        for t in readers:
            t.join(60)
    assert not errors and not any(t.is_alive() for t in readers), errors
    want = [float(np.float32(1 / (s + 1))) for s in range(ROWS)]
    assert followed == want
    ea_mod = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    ea = ea_mod.EventAccumulator(logdir, size_guidance={ea_mod.SCALARS: 0})
    ea.Reload()
    assert [(e.step, e.value) for e in ea.Scalars("loss")] == list(zip(range(ROWS), want))


def test_a_process_killed_while_its_rows_are_announced_live_reads_back(tmp_path):
    """Rows made visible every 50 ms, no flush: a compressed partial chunk put again whole
    (rewritten by rename, its announced rows read back first), again and again, while rows
    keep coming; killed at any moment, the store holds every row it announced, each
    exactly, chunks filled after being shown partial too. (Uncompressed, a partial chunk
    is appended to in place, as at a flush: ``test_rows_flushed_before_a_kill_survive_it``.)"""
    path = str(tmp_path / "killed.zarr")
    code = f"""
        import jax, jax.numpy as jnp, hostfeed
        rec = hostfeed.Recorder({path!r}, chunk_bytes=5 * 1024 * 4, compression="zstd",
                                commit_interval=0.05)
        f = jax.jit(lambda x, s: rec.record("h", x + s.astype(x.dtype), step=s))
        x = jnp.zeros(1024, jnp.float32)
        for i in range(1_000_000):
            f(x, jnp.int32(i)).block_until_ready()
    """
    log = tmp_path / "stderr.txt"
    with open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], stderr=err,
                                env=dict(os.environ, JAX_PLATFORMS="cpu"))
    doc = pathlib.Path(path, "h", "zarr.json")
    announced = 0
    try:
        deadline = time.monotonic() + 120
        while announced < 23:  # past several chunks of 5 rows, most shown partial first
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "nothing announced without a flush"
            with contextlib.suppress(FileNotFoundError, ValueError):  # not declared yet
                announced = json.loads(doc.read_text())["shape"][0]
            threading.Event().wait(0.01)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    rows, meta = hostfeed.read_recording(path, "h")
    n = rows.shape[0]
    assert n >= announced
    np.testing.assert_array_equal(rows, np.repeat(np.arange(n, dtype=np.float32)[:, None],
                                                  1024, axis=1))
    assert meta["step"].tolist() == list(range(n))
