"""The ROCm platform without an AMD GPU: what is particular to it. What holds for every
GPU platform (registration skipped cleanly without a JAX plugin or without the driver
library, the reason naming libamdhip64; the lowering for ``rocm`` emitting hostfeed's
custom calls; pool counters and the copy floor without a GPU) runs for ROCm in
test_cuda_lowering.py (its ``gpu`` fixture).

Implemented, not verified on ROCm hardware (.ci/accelerators/rocm_check.sh runs these there).

Issue: "ROCm GPUs: native HIP handlers beside the CUDA ones".
"""
from __future__ import annotations

import shutil

import jax.numpy as jnp
import pytest

import hostfeed
from hostfeed import host_callback as hcb
from hostfeed import _receiver, lowering
from hostfeed._src.transports import native

from conftest import ON_ROCM, run_python
from test_cuda_lowering import custom_calls, fake_library, noop, probe_driver

# JAX cannot lower its own host callbacks for a platform without its backend.
native_only = pytest.mark.native_transport(
    "checks the native custom calls lowered for ROCm; JAX cannot lower its own host "
    "callbacks for a platform without its backend")
no_rocm = pytest.mark.skipif(ON_ROCM, reason="checks the machine without ROCm")


def rocm_calls(f, *args, platforms=("rocm",)):
    return custom_calls(f, *args, platforms=platforms)


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
    if hostfeed._src.transports.forced() is None:
        assert hostfeed.transports()["rocm"] == "native"
    with hostfeed._src.transports.forcing("jax"):
        assert hostfeed._src.transports.row("rocm").name == "jax"
        # The portable lowering was reached: JAX cannot lower its host callback for a
        # platform without its backend.
        with pytest.raises(ValueError, match="lowering platform rocm"):
            rocm_calls(lambda x: hcb.id_tap(noop, x), 1.0)


# ---- the HIP runtime, faked: a stand-in libamdhip64 built here -------------------------
_HIP_FUNCTIONS = ["hipInit", "hipGetErrorName", "hipGetErrorString", "hipRuntimeGetVersion",
    "hipGetDevice", "hipSetDevice", "hipStreamGetDevice", "hipStreamIsCapturing",
    "hipStreamQuery", "hipStreamSynchronize", "hipEventCreateWithFlags", "hipEventRecord",
    "hipEventQuery", "hipEventSynchronize", "hipHostMalloc", "hipHostFree", "hipMemcpyAsync"]


def _fake_hip(directory, name, lacking=None, version=60342134):
    """A stand-in HIP runtime ``name`` in ``directory``: every function hostfeed resolves
    (but ``lacking``), answering hipSuccess, except hipRuntimeGetVersion (``version``); the
    error words come as strings (HIP returns them, CUDA writes them through a pointer)."""
    return fake_library(directory, name, _HIP_FUNCTIONS, {
        "hipRuntimeGetVersion": f"int hipRuntimeGetVersion(int *v) {{ *v = {version}; return 0; }}",
        "hipGetErrorName": 'const char *hipGetErrorName(int e) { return "hipErrorFake"; }',
        "hipGetErrorString": 'const char *hipGetErrorString(int e) { return "a stand-in"; }',
    }, lacking)


@no_rocm
@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
def test_the_runtime_is_found_by_a_versioned_name_with_every_function_hostfeed_calls(tmp_path):
    # Only the versioned name of a ROCm 6 install (no unversioned development link).
    versioned = _fake_hip(tmp_path / "v6", "libamdhip64.so.6")
    lacking = _fake_hip(tmp_path / "lacking", "libamdhip64.so", lacking="hipStreamGetDevice")
    error, path, version = probe_driver("rocm", versioned)
    assert error == "None"
    assert path == str(versioned / "libamdhip64.so.6")
    assert version == "60342134"
    assert (probe_driver("rocm", lacking)[0]
            == "the HIP runtime library (libamdhip64) lacks hipStreamGetDevice")


def test_registrations_name_the_cpu_targets_for_rocm():
    rocm = _receiver.gpu.GPU_PLATFORMS["rocm"]
    assert (rocm.name, rocm.xla_platform) == ("rocm", "ROCM")
    assert sorted(rocm.registrations()) == sorted(_receiver.host.registrations())
    # The GPU check and its bench reach either platform's functions by name.
    assert native.platform("rocm").driver is rocm
    assert native.platform("rocm").status() == lowering.rocm_status()
