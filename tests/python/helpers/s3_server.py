"""Real S3 servers on 127.0.0.1 for the object store tests and benches, started and stopped
by them: moto in server mode, in this process (``S3Server``: ``ThreadedMotoServer``) or in
a process of its own (``S3Process("moto")``), and s3s-fs (``S3Process("s3s-fs")``, a second,
independent implementation in Rust, serving a local folder; ``cargo install s3s-fs``).
moto honours conditional writes (``If-None-Match: *`` and ``If-Match``), which the
recorder's lock and commits use. ``CountingProxy`` counts the bytes a client sends a server
and gets back."""
from __future__ import annotations

import contextlib
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any

#: The credentials the tests give the server's clients (moto accepts any).
ACCESS_KEY_ID = "hostfeed-test-key-id"
SECRET_ACCESS_KEY = "hostfeed-test-secret-3f9a1c"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Client:
    """What a test or bench needs of a running server: its environment, a boto3 client,
    fresh buckets, the objects under a prefix."""
    port: int

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        """The provider's standard environment variables for this server."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": ACCESS_KEY_ID,
                "AWS_SECRET_ACCESS_KEY": SECRET_ACCESS_KEY, "AWS_REGION": "us-east-1",
                "AWS_ALLOW_HTTP": "true"}

    def client(self) -> Any:
        import boto3
        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=ACCESS_KEY_ID,
                            aws_secret_access_key=SECRET_ACCESS_KEY, region_name="us-east-1")

    def new_bucket(self) -> str:
        name = f"hf-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name

    def keys(self, bucket: str, prefix: str = "") -> dict[str, int]:
        """Every object under ``prefix``: key -> size."""
        out = {}
        for page in self.client().get_paginator("list_objects_v2").paginate(
                Bucket=bucket, Prefix=prefix):
            out.update({o["Key"]: o["Size"] for o in page.get("Contents", [])})
        return out

    def remove_bucket(self, bucket: str) -> None:
        """Deletes every object of ``bucket``, then the bucket (one request per object:
        s3s-fs has no bulk delete). A server keeps what it stores until then: moto in temporary
        files, so a bench that writes a GiB a case would fill the disk otherwise."""
        s3 = self.client()
        for key in self.keys(bucket):
            s3.delete_object(Bucket=bucket, Key=key)
        s3.delete_bucket(Bucket=bucket)

    def objects(self, bucket: str, prefix: str = "") -> dict[str, bytes]:
        """Every object under ``prefix``: key -> bytes."""
        s3 = self.client()
        return {k: s3.get_object(Bucket=bucket, Key=k)["Body"].read()
                for k in self.keys(bucket, prefix)}


class S3Process(_Client):
    """An S3 server in a process of its own: ``"moto"`` (``python -m moto.server``) or
    ``"s3s-fs"`` (its binary on PATH or in ``$S3S_FS``, serving a temporary folder)."""

    def __init__(self, kind: str):
        self.kind = kind
        self.port = free_port()
        self._proc: subprocess.Popen | None = None
        self._dir = ""

    def env(self) -> dict[str, str]:
        env = super().env()
        if self.kind == "s3s-fs":
            # s3s-fs lacks S3's bulk DeleteObjects: single DELETEs (an object_store setting).
            env["AWS_DISABLE_BULK_DELETE"] = "true"
        return env

    @staticmethod
    def s3s_fs() -> str | None:
        """The s3s-fs binary, if there is one."""
        return os.environ.get("S3S_FS") or shutil.which("s3s-fs")

    def start(self, timeout: float = 30.0) -> None:
        if self.kind == "moto":
            cmd = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)]
        else:
            binary = self.s3s_fs()
            if binary is None:
                raise FileNotFoundError("s3s-fs not found: cargo install s3s-fs --version 0.14.1 "
                                        "--features binary, or set S3S_FS")
            self._dir = self._dir or tempfile.mkdtemp(prefix="s3s-fs-")
            cmd = [binary, "--host", "127.0.0.1", "--port", str(self.port),
                   "--access-key", ACCESS_KEY_ID, "--secret-key", SECRET_ACCESS_KEY, self._dir]
        self._proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if self._proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"{self.kind} did not start on port {self.port}") from None
                time.sleep(0.05)

    def stop(self) -> None:
        """Stops the server; what it stores stays for the next :meth:`start`."""
        if self._proc is not None:
            self._proc.terminate()
            self._proc.wait(timeout=30)
            self._proc = None

    def close(self) -> None:
        """Stops the server and removes what it stored."""
        self.stop()
        if self._dir:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = ""


class S3Server(_Client):
    """moto's S3 on ``127.0.0.1:port``, in this process."""

    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer
        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        self.port = free_port()
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port,
                                          verbose=False)
        self.running = False

    def start(self) -> None:
        self._server.start()
        self.running = True

    def stop(self) -> None:
        """Stops the server; what it stores stays (moto keeps it in this process)."""
        if self.running:
            self._server.stop()
            self.running = False

    def close(self) -> None:
        self.stop()


def setenv(env: dict[str, str]) -> dict[str, Any]:
    """Sets ``env`` in ``os.environ``; returns what to restore."""
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    return old


def restore(old: dict[str, Any]) -> None:
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


class CountingProxy:
    """A TCP proxy on ``127.0.0.1:port`` in front of a server, counting the bytes that pass
    each way (``sent``: client to server, request lines, headers and bodies; ``received``:
    server to client) and the connections. A client pointed at :attr:`endpoint` (for a
    Recorder: ``storage_options={"aws_endpoint": proxy.endpoint}``) is measured; one at the
    server's own endpoint is not."""

    def __init__(self, upstream_port: int) -> None:
        import threading
        self.upstream = upstream_port
        self.sent = 0
        self.received = 0
        self.connections = 0
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._threads: list[threading.Thread] = []
        self._closed = False
        t = threading.Thread(target=self._accept, name="counting-proxy", daemon=True)
        t.start()
        self._threads.append(t)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def reset(self) -> None:
        with self._lock:
            self.sent = self.received = self.connections = 0

    def _accept(self) -> None:
        import threading
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(("127.0.0.1", self.upstream))
            except OSError:
                client.close()
                continue
            with self._lock:
                self.connections += 1
            for src, dst, up in ((client, server, True), (server, client, False)):
                t = threading.Thread(target=self._pipe, args=(src, dst, up), daemon=True)
                t.start()

    def _pipe(self, src: socket.socket, dst: socket.socket, up: bool) -> None:
        try:
            while True:
                data = src.recv(1 << 16)
                if not data:
                    break
                with self._lock:
                    if up:
                        self.sent += len(data)
                    else:
                        self.received += len(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
            src.close()

    def close(self) -> None:
        self._closed = True
        self._listener.close()


@contextlib.contextmanager
def serving(kind: str) -> Any:
    """A started S3 server of ``kind`` (``"moto"``: in this process; ``"s3s-fs"``), its
    environment (endpoint, credentials) set while the block runs; yields the server. A
    missing s3s-fs skips the test, or fails it where ``HOSTFEED_REQUIRE_S3S=1`` (CI)."""
    import pytest

    server: S3Server | S3Process
    if kind == "moto":
        pytest.importorskip("moto.server", reason="needs moto[server]: pip install 'moto[server]'")
        server = S3Server()
    elif S3Process.s3s_fs() is None:
        why = ("s3s-fs not found (cargo install s3s-fs --version 0.14.1 --features binary, "
               "or set S3S_FS)")
        if os.environ.get("HOSTFEED_REQUIRE_S3S") == "1":
            pytest.fail(why)
        pytest.skip(why)
    else:
        server = S3Process(kind)
    server.start()
    old = setenv(server.env())
    try:
        yield server
    finally:
        restore(old)
        server.close()
