"""The ROCm platform without an AMD GPU: registration skipped cleanly without a JAX ROCm
plugin, the reason named without the HIP runtime (libamdhip64), the runtime loaded by its
versioned names, and the lowering for ``rocm`` emitting hostfeed's custom calls (JAX
lowers for a platform it does not have), as for CUDA in test_cuda_lowering.py.

Implemented, not verified on ROCm hardware (benches/rocm_check.sh runs these there).

Issue: "ROCm GPUs: native HIP handlers beside the CUDA ones".
"""
from __future__ import annotations

import re
import shutil
import subprocess

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import hostfeed
from hostfeed import host_callback as hcb
from hostfeed import lowering, receiver

from conftest import ON_ROCM, run_python
from test_cuda_lowering import custom_calls, noop

# JAX cannot lower its own host callbacks for a platform without its backend.
native_only = pytest.mark.native_transport(
    "checks the native custom calls lowered for ROCm; JAX cannot lower its own host "
    "callbacks for a platform without its backend")
no_rocm = pytest.mark.skipif(ON_ROCM, reason="checks the machine without ROCm")


def rocm_calls(f, *args, platforms=("rocm",)):
    return custom_calls(f, *args, platforms=platforms)


@no_rocm
def test_without_a_rocm_plugin_registration_is_skipped_with_a_reason():
    reason = lowering.rocm_status()
    assert isinstance(reason, str) and "ROCM" in reason
    assert "plugin" in reason or "libamdhip64" in reason
    why = receiver.rocm_driver_error()
    assert why is None or "libamdhip64" in why
    assert receiver.rocm_pool_stats() == receiver.rocm_pool_stats() | {"allocations": 0}
    got = []
    jax.jit(lambda x: hcb.id_tap(lambda a, t: got.append(a.tolist()), x))(jnp.arange(3))
    hcb.barrier_wait()
    assert got == [[0, 1, 2]]


@no_rocm
def test_a_rocm_plugin_without_libamdhip64_is_skipped_with_the_runtime_named(tmp_path):
    # A stand-in JAX ROCm plugin (found by name, never initialised by hostfeed).
    plugin = tmp_path / "jax_plugins" / "xla_rocm7"
    plugin.mkdir(parents=True)
    (plugin / "__init__.py").write_text("def initialize():\n    pass\n")
    r = run_python(f"""
        import sys
        sys.path.insert(0, {str(tmp_path)!r})
        import jax, jax.numpy as jnp
        from hostfeed import host_callback as hcb, lowering
        print(lowering.rocm_status())
        got = []
        jax.jit(lambda x: hcb.id_tap(lambda a, t: got.append(int(a)), x))(jnp.int32(5))
        hcb.barrier_wait()
        print(got)
    """)
    assert r.returncode == 0, r.stderr
    reason, got = r.stdout.splitlines()[-2:]
    if receiver.rocm_driver_error() is None:  # a HIP runtime without a GPU
        assert reason == "None"
    else:
        assert "HIP runtime library (libamdhip64) was not found" in reason, reason
        assert "libamdhip64.so.6" in reason and "xla_rocm7" in reason
    assert got == "[5]"


@native_only
def test_tap_lowers_for_rocm_to_the_custom_call_with_a_token():
    calls = rocm_calls(lambda x: hcb.id_tap(noop, x * 2) + 1, jnp.ones(3))
    assert len(calls) == 1
    target, attrs, operands, results = calls[0]
    assert target == "hostfeed_tap"
    assert "has_side_effect = true" in attrs
    assert re.search(r"consumer_id = \d+ : i64", attrs) and "flags = 0 : i64" in attrs
    assert operands == "!stablehlo.token, tensor<3xf32>"
    assert results == "!stablehlo.token"


@native_only
def test_call_and_its_check_lower_for_rocm_with_results_and_attributes():
    def f(x):
        return hcb.call(lambda v: v.astype(np.int32), x,
                        result_shape=jax.ShapeDtypeStruct((2, 2), jnp.int32))

    calls = rocm_calls(f, jnp.ones((2, 2)))
    assert [c[0] for c in calls] == ["hostfeed_call"]
    _, attrs, operands, results = calls[0]
    assert "timeout_ms = " in attrs
    assert operands == "!stablehlo.token, tensor<2x2xf32>"
    assert results == "(!stablehlo.token, tensor<2x2xi32>)"


@native_only
def test_taps_under_transformations_lower_for_rocm_in_one_token_chain():
    def f(x):
        def body(c, _):
            return hcb.id_tap(noop, c * 2), None
        y, _ = lax.scan(body, x, None, length=3)
        return hcb.id_print(jnp.sum(y), what="sum")

    calls = rocm_calls(jax.vmap(jax.grad(lambda x: f(x).astype(jnp.float32))), jnp.ones((4,)))
    assert calls and all(c[0] == "hostfeed_tap" for c in calls)
    assert all(c[2].startswith("!stablehlo.token") for c in calls)


@native_only
def test_lowering_for_cuda_and_rocm_at_once_uses_the_same_custom_call_on_both():
    calls = rocm_calls(lambda x: hcb.id_tap(noop, x) + 1, jnp.arange(3.0),
                       platforms=("cuda", "rocm"))
    assert [c[0] for c in calls] == ["hostfeed_tap"] * 2


@no_rocm
def test_native_transport_forced_lowers_for_rocm_without_a_backend():
    # As for CUDA: without a ROCm backend the handlers are held by JAX until one exists;
    # nothing is refused.
    r = run_python("""
        import re, jax
        from hostfeed import host_callback as hcb
        text = jax.jit(lambda x: hcb.id_tap(lambda a, t: None, x)).trace(1.0).lower(
            lowering_platforms=("rocm",)).as_text()
        print(re.findall(r"custom_call @(hostfeed_\\w+)", text))
    """, env={"HOSTFEED_TRANSPORT": "native"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.splitlines()[-1] == "['hostfeed_tap']"


@no_rocm
def test_rocm_lowers_natively_by_default_and_jax_when_forced():
    if hostfeed.portable.forced() is None:
        assert hostfeed.transports()["rocm"] == "native"
    with hostfeed.portable.forcing("jax"):
        assert hostfeed.portable.transport_for("rocm") == "jax"
        # The portable lowering was reached: JAX cannot lower its host callback for a
        # platform without its backend.
        with pytest.raises(ValueError, match="lowering platform rocm"):
            rocm_calls(lambda x: hcb.id_tap(noop, x), 1.0)


# ---- the HIP runtime, faked: a stand-in libamdhip64 built here -------------------------
_HIP_FUNCTIONS = ["hipInit", "hipGetErrorName", "hipGetErrorString", "hipRuntimeGetVersion",
    "hipGetDevice", "hipSetDevice", "hipStreamGetDevice", "hipStreamIsCapturing",
    "hipStreamQuery", "hipStreamSynchronize", "hipStreamCreateWithFlags", "hipStreamDestroy",
    "hipEventCreateWithFlags", "hipEventRecord", "hipEventQuery", "hipEventSynchronize",
    "hipHostMalloc", "hipHostFree", "hipMalloc", "hipFree", "hipMemcpyAsync"]


def _fake_hip(directory, name, lacking=None, version=60342134):
    """A stand-in HIP runtime ``name`` in ``directory``: every function hostfeed resolves
    (but ``lacking``), answering hipSuccess, except hipRuntimeGetVersion (``version``) and
    hipSetDevice (error 101, hipErrorInvalidDevice, named by hipGetErrorName)."""
    special = {
        "hipRuntimeGetVersion": f"int hipRuntimeGetVersion(int *v) {{ *v = {version}; return 0; }}",
        "hipGetErrorName": 'const char *hipGetErrorName(int e) { return "hipErrorFake"; }',
        "hipGetErrorString": 'const char *hipGetErrorString(int e) { return "a stand-in"; }',
        "hipSetDevice": "int hipSetDevice(int d) { return 101; }",
    }
    source = "\n".join(special.get(n, f"int {n}(void) {{ return 0; }}")
                       for n in _HIP_FUNCTIONS if n != lacking)
    directory.mkdir(exist_ok=True)
    (directory / "hip.c").write_text(source + "\n")
    built = subprocess.run(["cc", "-shared", "-fPIC", "-o", str(directory / name),
                            str(directory / "hip.c")], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    return directory


@no_rocm
@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
def test_the_runtime_is_found_by_a_versioned_name_with_every_function_hostfeed_calls(tmp_path):
    # Only the versioned name of a ROCm 6 install (no unversioned development link).
    versioned = _fake_hip(tmp_path / "v6", "libamdhip64.so.6")
    lacking = _fake_hip(tmp_path / "lacking", "libamdhip64.so", lacking="hipStreamGetDevice")
    code = """
        from hostfeed import receiver
        print(receiver.rocm_driver_error())
        print(receiver.rocm_driver_path())
        print(receiver.rocm_driver_version())
        try:
            receiver.rocm_copy_floor(0, 16, 1)
        except receiver.ReceiverError as exc:
            print(exc)
    """
    r = run_python(code, env={"LD_LIBRARY_PATH": str(versioned)})
    assert r.returncode == 0, r.stderr
    error, path, version, floor = r.stdout.splitlines()[-4:]
    assert error == "None"
    assert path == str(versioned / "libamdhip64.so.6")
    assert version == "60342134"
    assert "HIP hipSetDevice failed: hipErrorFake (a stand-in)" in floor
    r = run_python(code, env={"LD_LIBRARY_PATH": str(lacking)})
    assert r.returncode == 0, r.stderr
    assert ("the HIP runtime library (libamdhip64) lacks hipStreamGetDevice"
            in r.stdout.splitlines()[-4])


def test_rocm_pool_stats_and_copy_floor_answer_without_a_gpu():
    stats = receiver.rocm_pool_stats()
    assert set(stats) == set(receiver.cuda_pool_stats())
    if not ON_ROCM and receiver.rocm_driver_error() is not None:
        with pytest.raises(receiver.ReceiverError, match="cannot use ROCm.*libamdhip64"):
            receiver.rocm_copy_floor(0, 1 << 20, 3)


def test_registrations_name_the_cpu_targets_for_rocm():
    assert sorted(receiver.rocm_registrations()) == sorted(receiver.registrations())
    # The GPU check and its bench reach either platform's functions by name.
    assert lowering.gpu_driver("rocm", "pool_stats") is receiver.rocm_pool_stats
    assert lowering.gpu_driver("rocm", "status")() == lowering.rocm_status()
