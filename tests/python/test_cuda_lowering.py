"""The CUDA platform without a GPU: the build and import without CUDA, registration
skipped cleanly, and the lowering for CUDA (JAX lowers for a platform it does not have).
The tests that hold for every GPU platform run for ROCm too (the ``gpu`` fixture);
test_rocm_lowering.py has what is particular to ROCm.

Issue: "GPUs: taps and calls on CUDA devices, the device never waiting for Python".
"""
from __future__ import annotations

import re
import shutil
import subprocess
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import hostfeed
from hostfeed import host_callback as hcb
from hostfeed._src.transports import native
from hostfeed._src import devices

from conftest import ON_GPU, run_python

TARGET = re.compile(
    r"stablehlo\.custom_call @(hostfeed_\w+)\((.*?)\) \{(.*?)\} : \((.*?)\) -> (.*)")


def custom_calls(f, *args, platforms=("cuda",)) -> list[tuple[str, str, str, str]]:
    """(target, attributes, operand types, result types) of every hostfeed custom call in
    the StableHLO of ``f`` lowered for ``platforms``."""
    text = jax.jit(f).trace(*args).lower(lowering_platforms=platforms).as_text()
    return [(m[1], m[3], m[4], m[5]) for m in TARGET.finditer(text)]


def noop(x, transforms):
    pass


#: XLA's name of each GPU platform (JAX's lowering platform -> FFI registration platform).
XLA_PLATFORM = {"cuda": "CUDA", "rocm": "ROCM"}


@pytest.fixture(params=sorted(XLA_PLATFORM))
def gpu(request):
    """Each GPU platform hostfeed has handlers for: ``"cuda"``, ``"rocm"``."""
    return request.param


# The portable transport lowers through JAX's host callbacks, which JAX cannot lower for
# a platform whose backend is absent: lowering for CUDA without a GPU is native only.
native_only = pytest.mark.native_transport(
    "checks the native custom calls lowered for CUDA; JAX cannot lower its own host "
    "callbacks for a platform without its backend")


@pytest.mark.skipif(ON_GPU, reason="checks the machine without a GPU")
def test_without_cuda_registration_is_skipped_with_a_reason(gpu):
    reason = native.platform(gpu).status()
    assert isinstance(reason, str)
    assert XLA_PLATFORM[gpu] in reason
    # The driver check answers (a reason or None) rather than raising.
    why = native.platform(gpu).driver.driver_error()
    assert why is None or {"cuda": "CUDA", "rocm": "libamdhip64"}[gpu] in why
    assert native.platform(gpu).driver.pool_stats()["allocations"] == 0
    # Taps still run on CPU.
    got = []
    jax.jit(lambda x: hcb.id_tap(lambda a, t: got.append(a.tolist()), x))(jnp.arange(3))
    hcb.barrier_wait()
    assert got == [[0, 1, 2]]


@pytest.mark.skipif(ON_GPU, reason="checks the machine without a GPU")
def test_a_cuda_plugin_without_a_driver_is_skipped_with_the_driver_named(tmp_path, gpu):
    # A stand-in JAX plugin (found by name, never initialised by hostfeed).
    name = {"cuda": "xla_cuda13", "rocm": "xla_rocm7"}[gpu]
    plugin = tmp_path / "jax_plugins" / name
    plugin.mkdir(parents=True)
    (plugin / "__init__.py").write_text("def initialize():\n    pass\n")
    r = run_python(f"""
        import sys
        sys.path.insert(0, {str(tmp_path)!r})
        import jax, jax.numpy as jnp
        from hostfeed import host_callback as hcb
        from hostfeed._src.transports import native
        print(native.platform({gpu!r}).status())
        got = []
        jax.jit(lambda x: hcb.id_tap(lambda a, t: got.append(int(a)), x))(jnp.int32(5))
        hcb.barrier_wait()
        print(got)
    """)
    assert r.returncode == 0, r.stderr
    reason, got = r.stdout.splitlines()[-2:]
    if native.platform(gpu).driver.driver_error() is None:  # a driver, no GPU
        assert reason == "None"
    else:
        assert {"cuda": "driver library", "rocm": "HIP runtime library (libamdhip64) was "
                "not found"}[gpu] in reason and name in reason
    assert got == "[5]"


@native_only
def test_tap_lowers_for_cuda_to_the_custom_call_with_a_token(gpu):
    calls = custom_calls(lambda x: hcb.id_tap(noop, x * 2) + 1, jnp.ones(3), platforms=(gpu,))
    assert len(calls) == 1
    target, attrs, operands, results = calls[0]
    assert target == "hostfeed_tap"
    assert "has_side_effect = true" in attrs
    assert re.search(r"consumer_id = \d+ : i64", attrs) and "flags = 0 : i64" in attrs
    assert operands == "!stablehlo.token, tensor<3xf32>"
    assert results == "!stablehlo.token"


@native_only
def test_call_lowers_for_cuda_with_its_results_and_attributes(gpu):
    def host(x):
        return x.astype(np.int32)

    def f(x):
        return hcb.call(host, x, result_shape=jax.ShapeDtypeStruct((2, 2), jnp.int32))

    calls = custom_calls(f, jnp.ones((2, 2)), platforms=(gpu,))
    assert [c[0] for c in calls] == ["hostfeed_call"]
    _, attrs, operands, results = calls[0]
    assert "timeout_ms = " in attrs and re.search(r'name = "[^"]*host"', attrs)
    assert operands == "!stablehlo.token, tensor<2x2xf32>"
    assert results == "(!stablehlo.token, tensor<2x2xi32>)"


@native_only
def test_several_taps_under_transformations_lower_for_cuda_in_one_token_chain(gpu):
    def f(x):
        def body(c, _):
            c = hcb.id_tap(noop, c * 2)
            return c, None
        y, _ = lax.scan(body, x, None, length=3)
        return hcb.id_print(jnp.sum(y), what="sum")

    grad = jax.grad(lambda x: f(x).astype(jnp.float32))
    calls = custom_calls(jax.vmap(grad), jnp.ones((4,)), platforms=(gpu,))
    assert calls and all(c[0] == "hostfeed_tap" for c in calls)
    assert all(c[2].startswith("!stablehlo.token") for c in calls), "every tap takes the token"


@native_only
def test_lowering_for_cpu_and_cuda_at_once_uses_the_same_custom_call_on_both():
    def f(x):
        return hcb.id_tap(noop, x) + 1

    lowered = jax.jit(f).trace(jnp.arange(3.0)).lower(lowering_platforms=("cpu", "cuda"))
    text = lowered.as_text()
    # One branch per platform, each with the tap in the token chain.
    assert re.findall(r"custom_call @(hostfeed_\w+)", text) == ["hostfeed_tap"] * 2
    assert "stablehlo.case" in text


def test_other_platforms_take_the_portable_transport_without_refusal():
    # TPUs take their own host transfers through JAX's host-callback machinery (the `tpu`
    # transport): hostfeed does not refuse them. Here, without their backend, JAX itself
    # cannot lower a host callback for them (exactly as for io_callback), which shows
    # that JAX's lowering was reached.
    assert hostfeed.transports()["tpu"] == "tpu" or hostfeed._src.transports.forced() == "native"
    for platform in ("tpu",):
        with pytest.raises(ValueError, match=f"lowering platform {platform}"):
            jax.jit(lambda x: hcb.id_tap(noop, x)).trace(1.0).lower(
                lowering_platforms=(platform,))


def test_native_transport_forced_refuses_other_platforms_with_a_clear_message():
    r = run_python("""
        import jax
        from hostfeed import host_callback as hcb
        try:
            jax.jit(lambda x: hcb.id_tap(lambda a, t: None, x)).trace(1.0).lower(
                lowering_platforms=("tpu",))
        except NotImplementedError as e:
            print("refused:", e)
    """, env={"HOSTFEED_TRANSPORT": "native"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert "refused:" in r.stdout and "CPU, CUDA and ROCm GPUs only" in r.stdout
    assert "HOSTFEED_TRANSPORT=native" in r.stdout


def test_gpu_device_keys_name_gpu_devices(monkeypatch):
    asked = []

    def fake_devices(platform):
        asked.append(platform)
        return jax.local_devices()

    devices.device_for_ordinal.cache_clear()
    monkeypatch.setattr(devices, "_local_callback_devices", fake_devices)
    try:
        assert devices.device_for_ordinal(-2) == jax.local_devices()[0]  # GPU ordinal 0
        assert devices.device_for_ordinal(0) == jax.local_devices()[0]
    finally:
        devices.device_for_ordinal.cache_clear()
    assert asked == ["gpu", "cpu"]


@native_only
def test_sharded_taps_lower_for_cuda_on_several_devices():
    r = run_python("""
        import re
        import jax, jax.numpy as jnp
        from jax.sharding import NamedSharding, PartitionSpec as P
        from hostfeed import host_callback as hcb
        mesh = jax.make_mesh((4,), ("x",))
        x = jax.device_put(jnp.arange(8.0), NamedSharding(mesh, P("x")))
        def f(x):
            return hcb.id_tap(lambda a, t: None, x * 2)
        text = jax.jit(f).trace(x).lower(lowering_platforms=("cuda",)).as_text()
        print(sorted(set(re.findall(r"custom_call @(hostfeed_\\w+)", text))))
        smap = jax.shard_map(lambda v: hcb.id_tap(lambda a, t: None, v), mesh=mesh,
                             in_specs=P("x"), out_specs=P("x"))
        text = jax.jit(smap).trace(x).lower(lowering_platforms=("cuda",)).as_text()
        print(len(re.findall(r"custom_call @hostfeed_tap", text)))
    """, env={"XLA_FLAGS": "--xla_force_host_platform_device_count=4", "JAX_PLATFORMS": "cpu"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.splitlines()[-2:] == ["['hostfeed_tap']", "1"]


def test_the_package_imports_without_cuda_libraries_in_a_fresh_process():
    r = run_python(textwrap.dedent("""
        import hostfeed
        from hostfeed import lowering  # the alias kept for one release
        print(type(lowering.cuda_status()).__name__, hostfeed.__version__ != "")
        print(type(hostfeed.gpu_status("cuda")).__name__)
    """))
    assert r.returncode == 0, r.stderr
    alias, status = r.stdout.splitlines()[-2:]
    assert alias in ("str True", "NoneType True") and status == alias.split()[0]


_DRIVER_FUNCTIONS = ["cuInit", "cuGetErrorName", "cuGetErrorString", "cuDriverGetVersion",
    "cuStreamGetCtx", "cuStreamIsCapturing", "cuStreamQuery", "cuStreamSynchronize",
    "cuCtxGetCurrent", "cuCtxPushCurrent_v2", "cuCtxPopCurrent_v2", "cuCtxSetCurrent",
    "cuCtxGetDevice", "cuCtxGetId", "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2", "cuEventCreate", "cuEventRecord", "cuEventQuery",
    "cuEventSynchronize", "cuMemHostAlloc", "cuMemFreeHost", "cuMemcpyAsync"]


def fake_library(directory, name, functions, special, lacking=None):
    """A stand-in driver library ``name`` built in ``directory``: each of ``functions``
    (but ``lacking``) answering 0 (success), or as its C text in ``special`` says."""
    source = "\n".join(special.get(n, f"int {n}(void) {{ return 0; }}")
                       for n in functions if n != lacking)
    directory.mkdir(exist_ok=True)
    (directory / "driver.c").write_text(source + "\n")
    built = subprocess.run(["cc", "-shared", "-fPIC", "-o", str(directory / name),
                            str(directory / "driver.c")], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    return directory


def _fake_driver(directory, lacking=None, name="libcuda.so.1", version=13000):
    """A stand-in CUDA driver library ``name`` in ``directory``: every function hostfeed
    resolves (but ``lacking``), answering success, except cuDriverGetVersion
    (``version``)."""
    return fake_library(directory, name, _DRIVER_FUNCTIONS, {
        "cuDriverGetVersion": f"int cuDriverGetVersion(int *v) {{ *v = {version}; return 0; }}",
        "cuGetErrorName": 'int cuGetErrorName(int e, const char **p) '
                          '{ *p = "CUDA_ERROR_FAKE"; return 0; }',
        "cuGetErrorString": 'int cuGetErrorString(int e, const char **p) '
                            '{ *p = "a stand-in driver"; return 0; }',
    }, lacking)


def probe_driver(gpu, directory):
    """What ``gpu``'s native functions answer in a fresh process whose library path is
    ``directory``: driver_error, driver_path, driver_version (as printed)."""
    r = run_python(f"""
        from hostfeed._src.transports import native
        for what in ("driver_error", "driver_path", "driver_version"):
            print(getattr(native.platform({gpu!r}).driver, what)())
    """, env={"LD_LIBRARY_PATH": str(directory)})
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()[-3:]


@pytest.mark.skipif(ON_GPU, reason="replaces the CUDA driver")
@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
def test_the_driver_is_loaded_as_libcuda_so_1_with_every_function_hostfeed_calls(tmp_path):
    full = _fake_driver(tmp_path / "full")
    # A toolkit's stub beside it, as libcuda.so (which cudarc's own loader would try
    # first): hostfeed must take the libcuda.so.1 XLA loads.
    _fake_driver(full, name="libcuda.so", version=11000)
    lacking = _fake_driver(tmp_path / "lacking", lacking="cuCtxGetId")
    error, path, version = probe_driver("cuda", full)
    assert error == "None"
    assert path == str(full / "libcuda.so.1")
    assert version == "13000"
    assert "the CUDA driver library lacks cuCtxGetId" in probe_driver("cuda", lacking)[0]


def test_cuda_pool_stats_answer_without_a_gpu(gpu):
    stats = native.platform(gpu).driver.pool_stats()
    assert set(stats) == {"allocations", "frees", "allocated_bytes", "in_use_bytes",
                          "blocks_taken", "resets"}
    assert all(isinstance(v, int) and v >= 0 for v in stats.values())


def test_the_copy_floor_benchmark_is_not_in_the_shipped_module(gpu):
    # The floor lives in benches/ (ctypes), not in hostfeed._receiver.
    assert not hasattr(hostfeed._receiver.gpu, f"{gpu}_copy_floor")


def _pinned_host_operand():
    dev = jax.devices()[0]
    try:
        host = jax.sharding.SingleDeviceSharding(dev, memory_kind="pinned_host")
        return host, jax.device_put(jnp.arange(8, dtype=jnp.int32), host)
    except Exception as exc:  # noqa: BLE001 - a JAX or device without memory kinds
        pytest.skip(f"no pinned_host memory kind here: {exc}")


@native_only
def test_a_tap_of_an_entry_parameter_in_host_memory_puts_no_op_on_it_but_the_tap(gpu):
    # XLA:GPU's host offloading lets an entry parameter in host memory flow only through a
    # few operations (custom calls among them, kAddDependency not): the tap reads it, and
    # the computation's result is the parameter itself.
    host, x = _pinned_host_operand()
    f = jax.jit(lambda v: hcb.id_tap(noop, v), in_shardings=host, out_shardings=host)
    text = f.trace(x).lower(lowering_platforms=(gpu,)).as_text()
    assert re.search(r"custom_call @hostfeed_tap\(%\w+, %arg0\)", text), text
    assert "add_dependency" not in text, text
    # A value in device memory keeps its dependency on the tap (what orders later uses).
    text = jax.jit(lambda v: hcb.id_tap(noop, v) + 1).trace(jnp.arange(8)).lower(
        lowering_platforms=(gpu,)).as_text()
    assert "add_dependency" in text


@native_only
def test_a_tap_of_a_value_in_host_memory_runs_and_arrives_intact():
    # On CPU, as test_gpu.py's pinned-memory tap does on a GPU.
    host, x = _pinned_host_operand()
    got = []
    f = jax.jit(lambda v: hcb.id_tap(lambda a, t: got.append(a.copy()), v),
                in_shardings=host, out_shardings=host)
    out = f(x)
    hcb.barrier_wait()
    np.testing.assert_array_equal(got[0], np.arange(8, dtype=np.int32))
    np.testing.assert_array_equal(np.asarray(out), np.arange(8, dtype=np.int32))


def test_platforms_are_named_as_jax_lowers_for_them_not_as_a_gpu_device_reads(monkeypatch):
    # A CUDA device's `platform` and jax.default_backend() read "gpu"; computations lower
    # for "cuda". Here a CUDA backend is made to appear beside the CPU one.
    from jax._src import xla_bridge

    from hostfeed._src import transports

    backends = dict(xla_bridge.backends(), cuda=xla_bridge.backends()["cpu"])
    monkeypatch.setattr(xla_bridge, "backends", lambda: backends)
    assert transports.canonical("gpu") == "cuda"
    assert transports.canonical("cpu") == "cpu" and transports.canonical("tpu") == "tpu"

    class GpuDevice:
        platform = "gpu"

    real_devices = jax.devices

    def devices(backend=None):
        # No backend is created for "cuda" (JAX would cache a CPU client under that name).
        if backend in ("gpu", None):
            return [GpuDevice()]
        if backend == "cpu":
            return real_devices(backend)
        raise RuntimeError(f"no {backend} backend in this test")

    monkeypatch.setattr(jax, "devices", devices)
    table = hostfeed.transports()
    assert "gpu" not in table and table["cuda"] == transports.row("cuda").name, table
    assert transports.for_platform("gpu") is transports.for_platform("cuda")
