"""A real S3 server on 127.0.0.1 for the object store tests: moto in server mode
(``ThreadedMotoServer``, in this process), started and stopped by the tests themselves.
It honours conditional writes (``If-None-Match: *`` and ``If-Match``), which the
recorder's lock and commits use."""
from __future__ import annotations

import logging
import os
import socket
import uuid
from typing import Any

#: The credentials the tests give the server's clients (moto accepts any).
ACCESS_KEY_ID = "hostfeed-test-key-id"
SECRET_ACCESS_KEY = "hostfeed-test-secret-3f9a1c"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class S3Server:
    """moto's S3 on ``127.0.0.1:port``; :meth:`env` gives the variables a client needs."""

    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer
        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        self.port = free_port()
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port,
                                          verbose=False)
        self.running = False

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self._server.start()
        self.running = True

    def stop(self) -> None:
        if self.running:
            self._server.stop()
            self.running = False

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

    def objects(self, bucket: str, prefix: str = "") -> dict[str, bytes]:
        """Every object under ``prefix``: key -> bytes."""
        s3 = self.client()
        out = {}
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            for o in page.get("Contents", []):
                out[o["Key"]] = s3.get_object(Bucket=bucket, Key=o["Key"])["Body"].read()
        return out


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
