"""Bad settings and bad input fail clearly where they are given, and nothing pending is
lost at exit whatever goes wrong on the way: every HOSTFEED_* and JAX_HOST_CALLBACK_*
variable is parsed when hostfeed is imported; each step of the exit path runs even when
another fails; shapes too large for any host, bad id_print options, an eager device_index
outside the operands' devices, a non-positive coordination timeout and a bench output
path that cannot be written are refused at the call."""
from __future__ import annotations

import contextlib
import io
import math
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hostfeed
from hostfeed import host_callback as hcb
from hostfeed._src import settings

from conftest import run_python

BAD = [
    ("HOSTFEED_STOP_TIMEOUT", "abc"),
    ("HOSTFEED_CALL_TIMEOUT", "-1"),
    ("HOSTFEED_BUFFER_POOL_BYTES", "lots"),
    ("JAX_HOST_CALLBACK_MAX_QUEUE_BYTE_SIZE", "0"),
    ("JAX_HOST_CALLBACK_INLINE", "maybe"),
    ("HOSTFEED_AD_TAPS", "tangents"),
    ("HOSTFEED_SYNC_TAPS", "sometimes"),
    ("HOSTFEED_TRANSPORT", "carrier-pigeon"),
    ("HOSTFEED_FAST_DISPATCH", "2"),
    ("HOSTFEED_CALL_THREAD", "main"),
    ("HOSTFEED_RECORD_PARTS", "halves"),
    ("HOSTFEED_CALLBACK_ERROR_EXIT", "-1"),
]


def test_the_table_covers_every_variable():
    assert sorted(settings.PARSERS) == sorted(name for name, _ in BAD)


@pytest.mark.parametrize("name,value", BAD, ids=[n for n, _ in BAD])
def test_a_bad_value_fails_the_import_naming_the_variable(name, value):
    r = run_python("import hostfeed", env={name: value})
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith(f"ValueError: {name}={value!r}"), r.stderr[-2000:]


def test_empty_values_are_unset_and_words_ignore_case():
    env = {name: "" for name, _ in BAD}
    r = run_python("""
        import hostfeed
        from hostfeed._src import primitives, settings
        print(primitives.get_ad_taps(), primitives.sync_taps_mode(), settings.stop_timeout(),
              settings.transport(), settings.fast_dispatch())
        """, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["transforms", "legacy", "10.0", "None", "True"]
    r = run_python("""
        import hostfeed
        from hostfeed._src import primitives, settings
        print(primitives.get_ad_taps(), primitives.sync_taps_mode(), settings.transport(),
              settings.fast_dispatch())
        """, env={"HOSTFEED_AD_TAPS": " PRIMALS", "HOSTFEED_SYNC_TAPS": "Yes",
                  "HOSTFEED_TRANSPORT": "Native", "HOSTFEED_FAST_DISPATCH": "OFF"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["primals", "sync", "native", "False"]


EXIT_PROGRAM = """
    import atexit, os, sys, threading
    import jax, jax.numpy as jnp
    import hostfeed
    from hostfeed import host_callback as hcb

    ran = []
    release = threading.Event()

    def slow(x, transforms):
        release.wait(60)  # until the program exits
        ran.append(int(x))

    def tap(x, transforms):
        ran.append(int(x))

    # Runs after hostfeed's exit handler (atexit runs the last registered first).
    atexit.register(lambda: print("taps run:", len(ran), flush=True))
    rec = hostfeed.Recorder(sys.argv[1])  # never closed by the program
    f = jax.jit(lambda i: rec.record("x", hcb.id_tap(tap, i), step=i))
    jax.jit(lambda i: hcb.id_tap(slow, i))(jnp.int32(-1))
    for i in range(500):
        f(jnp.int32(i))
    # Runs before hostfeed's exit handler: the slow tap lets go once exit has begun.
    atexit.register(release.set)
    {spoil}
    print("queued", flush=True)
"""


@pytest.mark.parametrize("spoil", [
    "",
    # A setting spoiled after the import (it was valid then).
    "os.environ['HOSTFEED_STOP_TIMEOUT'] = 'abc'",
    # An exit hook that fails.
    "from hostfeed._src import lifecycle; lifecycle.add_exit_hook(lambda: 1 / 0)",
], ids=["plain", "setting-spoiled-after-import", "failing-exit-hook"])
def test_exit_runs_every_pending_tap_and_closes_recorders(tmp_path, spoil):
    store = tmp_path / "run.zarr"
    code = EXIT_PROGRAM.replace("{spoil}", spoil)
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code), str(store)],
                       capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert "queued" in r.stdout, r.stderr[-3000:]
    assert "taps run: 501" in r.stdout, (r.stdout, r.stderr[-3000:])
    rows, meta = hostfeed.read_recording(store, "x")
    assert sorted(meta["step"].tolist()) == list(range(500))
    if "1 / 0" in spoil:
        assert "ZeroDivisionError" in r.stderr


def test_a_value_larger_than_any_host_is_refused_at_the_call(tmp_path):
    x = jnp.ones(3)
    huge = jax.ShapeDtypeStruct((2**62,), jnp.float32)
    with pytest.raises(ValueError, match="more than any host can hold"):
        hcb.call(np.sin, x, result_shape=huge)
    with pytest.raises(ValueError, match="more than any host can hold"):
        jax.jit(lambda x: hcb.call(np.sin, x, result_shape=huge))(x)
    with pytest.raises(ValueError, match=r"leaf 0 of `arg` has shape \(1125899906842624,\)"):
        jax.jit(lambda v: hcb.id_tap(lambda a, t: None, v)).lower(
            jax.ShapeDtypeStruct((2**50,), jnp.float32))
    with hostfeed.Recorder(tmp_path / "r.zarr") as rec, \
            pytest.raises(ValueError, match="more than any host can hold"):
        jax.jit(lambda v: rec.record("v", v)).lower(jax.ShapeDtypeStruct((2**46, 4), jnp.float32))


def test_id_print_options_are_checked_at_the_call():
    x = jnp.ones(2)
    with pytest.raises(TypeError, match="output_stream must have a write"):
        hcb.id_print(x, output_stream=5)
    with pytest.raises(TypeError, match="threshold must be a non-negative int"):
        hcb.id_print(x, threshold="a")
    s = io.StringIO()
    hcb.id_print(x, output_stream=s, threshold=3)
    hcb.barrier_wait()
    assert "[1. 1.]" in s.getvalue()


@pytest.mark.parametrize("device_index", [1, 2**70])
def test_an_eager_device_index_follows_the_jit_rule(device_index):
    x = jnp.ones(2)
    msg = f"device_index={device_index} is outside the 1 device"
    with pytest.raises(ValueError, match=msg):
        hcb.id_tap(lambda a, t: None, x, device_index=device_index)
    with pytest.raises(ValueError, match=msg):
        jax.jit(lambda v: hcb.id_tap(lambda a, t: None, v, device_index=device_index))(x)
    with pytest.raises(ValueError, match=msg):
        hcb.call(lambda v: v, x, result_shape=x, device_index=device_index)


@pytest.mark.parametrize("timeout", [-1, 0, math.inf, math.nan, "60"])
def test_recorder_refuses_a_coordination_timeout_that_is_not_positive(tmp_path, timeout):
    with pytest.raises(ValueError, match="coordination_timeout must be a positive"):
        hostfeed.Recorder(tmp_path / "r.zarr", coordination_timeout=timeout)
    assert not (tmp_path / "r.zarr").exists()


#: Each argument of hostfeed.Recorder refused at the call, with what its message names.
BAD_RECORDER_ARGUMENTS = [
    (dict(mode="r"), ValueError, r"mode must be \"w-\" .* got 'r'"),
    (dict(mode=1), ValueError, r"mode must be .* got 1"),
    (dict(compression="gzip"), ValueError, r"compression must be None or \"zstd\", got 'gzip'"),
    (dict(compression="zstd", compression_level=30), ValueError,
     r"compression_level must be an int from -7 to 22 .* got 30"),
    (dict(compression="zstd", compression_level=1.5), ValueError,
     r"compression_level must be an int .* got 1.5"),
    (dict(chunk_bytes=0), ValueError, r"chunk_bytes must be a positive number of bytes, got 0"),
    (dict(chunk_bytes=-1), ValueError, r"chunk_bytes must be a positive .* got -1"),
    (dict(chunk_bytes=1.5), ValueError, r"chunk_bytes must be a positive .* got 1.5"),
    (dict(writers=0), ValueError, r"writers must be a positive number of threads, got 0"),
    (dict(writers=True), ValueError, r"writers must be a positive .* got True"),
    (dict(separator=":"), ValueError, r"separator must be \"/\" .* or \"\.\" .* got ':'"),
    (dict(commit_interval=-1), ValueError, r"commit_interval must be a number of seconds"),
    (dict(commit_interval=float("nan")), ValueError, r"commit_interval must be a number"),
    (dict(commit_interval=1e12), ValueError, r"commit_interval must be at most 1e\+09"),
    (dict(shard_bytes=-1), ValueError, r"shard_bytes must be a number of bytes .* got -1"),
    (dict(lease=0.01), ValueError, r"lease must be a finite number of seconds, at least 0.1"),
    (dict(resume_after_step=3), ValueError, r"resume_after_step goes with mode=\"a\""),
    (dict(mode="a", resume_after_step="3"), TypeError,
     r"resume_after_step must be an int \(a step\), got '3'"),
    (dict(coordination_timeout=0), ValueError, r"coordination_timeout must be a positive"),
    (dict(window=0), ValueError, r"window"),
]


@pytest.mark.parametrize("kwargs,error,message", BAD_RECORDER_ARGUMENTS,
                         ids=[",".join(k) + f"-{i}" for i, (k, _, _) in
                              enumerate(BAD_RECORDER_ARGUMENTS)])
def test_recorder_arguments_are_refused_at_the_call_before_anything_is_written(
        tmp_path, kwargs, error, message):
    # Checked once, in Python (the binding takes what was checked): each message starts
    # with hostfeed.Recorder and names the argument and what it takes.
    with pytest.raises(error, match=r"^hostfeed\.Recorder: .*" + message):
        hostfeed.Recorder(tmp_path / "r.zarr", **kwargs)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("flag", ["--json", "--plot"])
def test_bench_checks_its_output_paths_before_the_run(tmp_path, flag):
    missing = tmp_path / "nowhere" / "out.file"
    r = subprocess.run([sys.executable, "-m", "hostfeed", "bench", "--only", "barrier",
                        flag, str(missing)], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert r.returncode == 2
    assert r.stderr.strip() == f"{flag} {missing}: the folder {missing.parent} does not exist"
    assert "Traceback" not in r.stderr


def test_a_misspelt_keyword_is_named():
    with pytest.raises(TypeError, match=r"reslt= looks like a misspelt result=\. Support for "
                                        r"\*\*kwargs"):
        hcb.id_tap(lambda a, t: None, 1.0, reslt=2)


def test_read_recording_names_the_store_and_the_nearest_names(tmp_path):
    path = tmp_path / "r.zarr"
    with hostfeed.Recorder(path) as rec:
        rec.record("loss", jnp.float32(1), step=0)
        rec.record("layer1/h", jnp.ones(2), step=0)
        rec.record("lr", jnp.float32(1), step=0)
    with pytest.raises(KeyError) as info:
        hostfeed.read_recording(path, "los")
    assert f"the store {path} has no array 'los'; it has ['loss', 'lr', 'layer1/h']" \
        in str(info.value)


@pytest.mark.parametrize("text,expected", [
    ("64 MiB", 64 << 20), ("64MiB", 64 << 20), ("1.5GB", 1_500_000_000), ("2 kib", 2048),
    ("256e6", 256_000_000), ("67108864", 67108864)])
def test_byte_counts_take_the_units_the_readme_writes(text, expected):
    assert settings.byte_count(text, "X") == expected


@pytest.mark.parametrize("text", ["lots", "64 XB", "MiB", "1.5 B", "-1 MiB"])
def test_byte_counts_refuse_what_they_cannot_read(text):
    with pytest.raises(ValueError, match="X="):
        settings.byte_count(text, "X")


def test_a_failing_lambda_is_named_by_file_and_line(caplog):
    f = jax.jit(lambda v: hcb.id_tap(lambda a, t: 1 / 0, v))
    line = f.__wrapped__.__code__.co_firstlineno
    f(1.0)
    with pytest.raises(hcb.CallbackException):
        hcb.barrier_wait()
    logged = "\n".join(r.getMessage() for r in caplog.records if r.name == "hostfeed")
    assert f"in host callback <lambda> at test_bad_settings_and_inputs.py:{line};" in logged
    assert "<locals>" not in logged


def test_a_misspelt_variable_name_is_reported_at_import_with_the_nearest_name():
    r = run_python("import hostfeed", env={"HOSTFEED_CALL_TIMEOT": "5",
                                           "HOSTFEED_SOAK": "1"})  # a test's own: quiet
    assert r.returncode == 0, r.stderr
    warned = [line for line in r.stderr.splitlines() if "is not a hostfeed setting" in line]
    assert len(warned) == 1, r.stderr
    assert ("HOSTFEED_CALL_TIMEOT is not a hostfeed setting (did you mean "
            "HOSTFEED_CALL_TIMEOUT?); it is ignored") in warned[0]
    assert settings.unknown_variables({"HOSTFEED_ZZZ": "1"}) == [
        "HOSTFEED_ZZZ is not a hostfeed setting (hostfeed reads "
        + ", ".join(k for k in settings.PARSERS if k.startswith("HOSTFEED_"))
        + "); it is ignored"]


def test_a_recorder_url_is_refused_before_anything_is_created_and_file_urls_work(
        tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # (Object store URLs, s3:// gs:// az://, are tests/python/test_object_store.py's.)
    for url in ("ftp://host/run.zarr", "HTTP://host/run.zarr", b"sftp://host/run.zarr",
                "file://otherhost/tmp/run.zarr"):
        with pytest.raises(ValueError, match=r"stores are not supported; hostfeed writes to "
                                             r"a local or shared file system"):
            hostfeed.Recorder(url)
    assert list(tmp_path.iterdir()) == []  # no ./ftp:/host/run.zarr
    target = tmp_path / "via url.zarr"
    with hostfeed.Recorder(target.as_uri()) as rec:
        rec.record("x", jnp.arange(3.0))
    rows, _ = hostfeed.read_recording(target, "x")
    assert rows.tolist() == [[0.0, 1.0, 2.0]]
    # A local folder whose name looks like a URL, written as the message says.
    with hostfeed.Recorder("./s3://bkt/run.zarr") as rec:
        rec.record("x", jnp.arange(2.0))
    assert (tmp_path / "s3:" / "bkt" / "run.zarr" / "zarr.json").exists()


# Every storage option the object_store crate (0.14) knows, by provider, its client's, and
# hostfeed's own: each given a wrong type and wrong values must be an ordinary exception
# (TypeError, ValueError, RecordingError), never the crate's panic (a PanicException is a
# BaseException: `except Exception` does not catch it). "not a url" as aws_endpoint, and a
# control character in a credential, panicked inside the crate's request signing.
_S3_KEYS = ["aws_access_key_id", "aws_secret_access_key", "aws_region", "aws_bucket",
    "aws_endpoint", "aws_endpoint_url_s3", "aws_session_token", "aws_imdsv1_fallback",
    "aws_virtual_hosted_style_request", "aws_s3_express", "aws_default_region",
    "aws_metadata_endpoint", "aws_unsigned_payload", "aws_checksum_algorithm",
    "aws_container_credentials_relative_uri", "aws_container_credentials_full_uri",
    "aws_container_authorization_token_file", "aws_web_identity_token_file", "aws_role_arn",
    "aws_role_session_name", "aws_endpoint_url_sts", "aws_skip_signature",
    "aws_copy_if_not_exists", "aws_conditional_put", "aws_disable_tagging",
    "aws_disable_bulk_delete", "aws_request_payer"]
_GCS_KEYS = ["google_service_account", "google_service_account_key", "google_bucket",
    "google_base_url", "google_application_credentials", "google_bearer_token",
    "google_skip_signature"]
_AZURE_KEYS = ["azure_storage_account_name", "azure_storage_account_key",
    "azure_storage_client_id", "azure_storage_client_secret", "azure_storage_tenant_id",
    "azure_storage_authority_host", "azure_storage_sas_key", "azure_storage_token",
    "azure_storage_use_emulator", "azure_use_fabric_endpoint", "azure_storage_endpoint",
    "azure_msi_endpoint", "azure_object_id", "azure_msi_resource_id", "azure_federated_token_file",
    "azure_use_azure_cli", "azure_skip_signature", "azure_container_name", "azure_disable_tagging",
    "azure_fabric_token_service_url", "azure_fabric_workload_host", "azure_fabric_session_token",
    "azure_fabric_cluster_identifier", "azure_credential_type", "azure_storage_encryption_key"]
_CLIENT_KEYS = ["allow_http", "allow_invalid_certificates", "disable_system_certificates",
    "connect_timeout", "default_content_type", "http1_only", "http2_only",
    "http2_keep_alive_interval", "http2_keep_alive_timeout", "http2_keep_alive_while_idle",
    "http2_max_frame_size", "pool_idle_timeout", "pool_max_idle_per_host", "proxy_url",
    "proxy_ca_certificate", "proxy_excludes", "randomize_addresses", "read_timeout", "timeout",
    "user_agent"]
_OWN_KEYS = ["retry_timeout", "max_retries", "single_put_bytes"]
# A closed port on loopback: nothing leaves the machine; retry_timeout 0 fails at once.
_NOWHERE = "http://127.0.0.1:9"
_PROVIDERS = {
    "s3://bucket/run.zarr": (_S3_KEYS, {"aws_endpoint": _NOWHERE, "aws_access_key_id": "key",
                                        "aws_secret_access_key": "secret",
                                        "aws_region": "us-east-1"}),
    "gs://bucket/run.zarr": (_GCS_KEYS, {"google_base_url": _NOWHERE,
                                         "google_skip_signature": "true"}),
    "az://container/run.zarr": (_AZURE_KEYS, {"azure_storage_account_name": "account",
                                              "azure_storage_endpoint": _NOWHERE,
                                              "azure_storage_account_key": "c2VjcmV0"}),
}


@pytest.mark.parametrize("url", list(_PROVIDERS))
def test_no_storage_option_value_reaches_a_rust_panic(url):
    keys, base = _PROVIDERS[url]
    for key in keys + _CLIENT_KEYS + _OWN_KEYS:
        for wrong_type in (None, [1], {"a": 1}, float("nan")):
            with pytest.raises(TypeError, match=f"storage_options\\['{key}'\\]"):
                hostfeed.Recorder(url, storage_options={**base, key: wrong_type})
        for wrong in ("not a url", "", "-1", "nope", "http://", "1e400", "a\x00b", "\n"):
            options = {**base, "retry_timeout": 0, key: wrong}
            # anything but these (a PanicException above all) fails the test
            with contextlib.suppress(TypeError, ValueError, hostfeed.RecordingError):
                hostfeed.Recorder(url, storage_options=options).close()


def test_an_endpoint_that_is_no_url_is_named():
    with pytest.raises(ValueError, match='"aws_endpoint" must be an http:// or https:// URL'):
        hostfeed.Recorder("s3://bucket/run.zarr",
                          storage_options={"aws_endpoint": "not a url", "aws_region": "x"})


@pytest.mark.parametrize("lease", [-1, 0.0, float("nan"), float("inf"), "60", True])
def test_a_bad_lease_is_refused_on_a_local_path_too(tmp_path, lease):
    with pytest.raises(ValueError, match="lease must be a finite number of seconds"):
        hostfeed.Recorder(tmp_path / "run.zarr", lease=lease)


@pytest.mark.parametrize("text, fixed", [("s3:/bucket/run.zarr", "s3://bucket/run.zarr"),
                                         ("gs:bucket/run.zarr", "gs://bucket/run.zarr"),
                                         ("file:/tmp/run.zarr", "file://tmp/run.zarr")])
def test_a_url_missing_a_slash_is_no_local_folder(tmp_path, monkeypatch, text, fixed):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=f"missing a slash; write '{fixed}'"):
        hostfeed.Recorder(text)
    assert list(tmp_path.iterdir()) == [], "no folder was made"


def test_reading_what_hostfeed_did_not_write_says_so(tmp_path):
    import zarr
    g = zarr.open_group(str(tmp_path / "v2.zarr"), mode="w", zarr_format=2)
    g.create_array("h", shape=(3, 2), dtype="float32")[:] = 1
    with pytest.raises(ValueError, match="Zarr v2, and hostfeed writes Zarr v3"):
        hostfeed.read_recording(tmp_path / "v2.zarr", "h")
    with pytest.raises(ValueError, match="Zarr v2, and hostfeed writes Zarr v3"):
        hostfeed.open_recording(tmp_path / "v2.zarr")["h"]


def test_a_truncated_chunk_is_named_when_read(tmp_path):
    path = tmp_path / "run.zarr"
    with hostfeed.Recorder(path) as rec:
        for s in range(8):
            rec.record("h", np.full(4, s, np.float32), step=s)
    chunk = next(p for p in (path / "h").rglob("*") if p.is_file() and p.name != "zarr.json")
    chunk.write_bytes(chunk.read_bytes()[:5])
    for read in (lambda: hostfeed.read_recording(path, "h"),
                 lambda: hostfeed.open_recording(path)["h"][0],
                 lambda: list(hostfeed.follow(path, "h", timeout=30))):
        with pytest.raises(ValueError, match="a chunk of 'h' in .* is truncated or damaged"):
            read()


def test_follow_on_a_damaged_store_raises_at_once(tmp_path):
    path = tmp_path / "run.zarr"
    with hostfeed.Recorder(path) as rec:
        rec.record("h", np.ones(2, np.float32))
    (path / "zarr.json").write_text("{")
    with pytest.raises(ValueError, match=r"run\.zarr is damaged: .*run\.zarr/zarr\.json is no "
                                         r"Zarr metadata"):
        list(hostfeed.follow(path, "h", timeout=600, poll=0.01))  # not the timeout


def _recording(tmp_path):
    path = tmp_path / "flags.zarr"
    with hostfeed.Recorder(path, mode="w") as rec:
        for i in range(5):
            rec.record("x", np.full(2, i, np.float32))
    return hostfeed.open_recording(path)


def _set_sync_taps(v, tmp_path):
    before = hcb.get_sync_taps()
    try:
        hcb.set_sync_taps(v)
    finally:
        hcb.set_sync_taps(before)


def _sync_taps(v, tmp_path):
    with hcb.sync_taps(v):
        pass


def _with_recorder(use):
    def call(v, tmp_path):
        with hostfeed.Recorder(tmp_path / "r.zarr", mode="w") as rec:
            use(rec, v)
    return call


def _capture(flag):
    def call(v, tmp_path):
        eqx = pytest.importorskip("equinox")
        model = eqx.nn.Sequential([eqx.nn.Linear(2, 2, key=jax.random.key(0))])
        with hostfeed.Recorder(tmp_path / "c.zarr", mode="w") as rec:
            hostfeed.capture(model, rec, "layers.0", **{flag: v})(jax.numpy.ones(2))
    return call


def _bench(v, tmp_path):
    from hostfeed import bench
    try:
        bench.run(["no-such-section"], quick=v)
    except ValueError as exc:  # past the flag: the section is refused next
        assert "unknown bench sections" in str(exc)


# Every boolean parameter of the public API (hostfeed.__all__, host_callback's, Recorder's
# methods, open_recording's Recording, capture, the bench's run): (its name, a call).
FLAGS = [
    ("reset", lambda v, t: hostfeed.receiver_stats(reset=v)),
    ("sync", _set_sync_taps),
    ("sync", _sync_taps),
    ("tap_with_device", lambda v, t: hcb.id_tap(lambda x, tr, device=None: None, 1.0,
                                                tap_with_device=v)),
    ("sync", lambda v, t: hcb.id_tap(lambda x, tr: None, 1.0, sync=v)),
    ("tap_with_device", lambda v, t: hcb.id_print(1.0, tap_with_device=v,
                                                  output_stream=io.StringIO())),
    ("sync", lambda v, t: hcb.id_print(1.0, sync=v, output_stream=io.StringIO())),
    ("call_with_device", lambda v, t: hcb.call(lambda x, device=None: x, np.float32(1),
                                               result_shape=np.float32(1),
                                               call_with_device=v)),
    ("durable", lambda v, t: hostfeed.Recorder(t / "d.zarr", mode="w", durable=v).close()),
    ("cotangents", _with_recorder(lambda rec, v: rec.record("x", 1.0, cotangents=v))),
    ("outputs", _with_recorder(lambda rec, v: rec.step(lambda x: x, outputs=v))),
    ("inputs", _capture("inputs")),
    ("outputs", _capture("outputs")),
    ("cotangents", _capture("cotangents")),
    ("shuffle", lambda v, t: list(_recording(t).iter_batches("x", 2, shuffle=v))),
    ("drop_last", lambda v, t: list(_recording(t).iter_batches("x", 2, drop_last=v))),
    ("quick", _bench),
]


@pytest.mark.parametrize("name,call", FLAGS, ids=[
    f"{n}-{i}" for i, (n, _) in enumerate(FLAGS)])
def test_every_public_flag_takes_a_bool_or_refuses_naming_it(tmp_path, name, call):
    for bad in ("no", 1):
        with pytest.raises(TypeError, match=rf"\b{name}\b.*(must be|expected) True.*{bad!r}"):
            call(bad, tmp_path)
    call(np.True_, tmp_path)  # a numpy bool is a bool
    hcb.barrier_wait()
