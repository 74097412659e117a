"""Shared test setup: CPU-only JAX (unless ``JAX_PLATFORMS`` says otherwise, e.g. ``cuda`` on
a GPU machine), and a check after every test that the receiver has processed everything
and no callback exception was left unreported."""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pytest

from hostfeed import host_callback as hcb

#: The suite runs on a GPU (``JAX_PLATFORMS=cuda``, see ``.ci/accelerators/gpu_check.sh``).
_FIRST_PLATFORM = os.environ["JAX_PLATFORMS"].split(",")[0].strip()
#: The suite runs on a ROCm GPU (.ci/accelerators/rocm_check.sh).
ON_ROCM = _FIRST_PLATFORM == "rocm"
#: The suite runs on a GPU: CUDA (.ci/accelerators/gpu_check.sh) or ROCm.
ON_GPU = _FIRST_PLATFORM in ("cuda", "gpu") or ON_ROCM
#: Which GPU's native functions the GPU tests use (``lowering.gpu_driver``).
GPU_KIND = "rocm" if ON_ROCM else "cuda"


#: The suite runs on a TPU (``JAX_PLATFORMS=tpu``, see ``.ci/accelerators/tpu_check.sh``).
ON_TPU = _FIRST_PLATFORM == "tpu"
#: The suite runs on one accelerator (one device; CI runs the several-device tests on CPU).
ON_ACCELERATOR = ON_GPU or ON_TPU

#: The callbacks take the portable transport (JAX's host-callback lowering): forced with
#: ``HOSTFEED_TRANSPORT=jax``, or on a TPU, which has no hostfeed handlers.
PORTABLE = os.environ.get("HOSTFEED_TRANSPORT", "").strip().lower() == "jax" or ON_TPU


#: The files whose tests do not depend on which JAX release lowers and runs the
#: computations: the Recorder's stores and writers, object stores, reading back, appends,
#: settings and inputs checked before JAX is reached, the docs and the examples, the
#: bench's machinery, packaging, the structure, the dispatcher's joining logic. The one
#: list of what runs where: with ``pytest --scope=jax`` these are left out (CI's sessions
#: of the older JAX releases, and the portable pass); with ``--scope=host`` they alone run;
#: with ``all`` (the default: plain ``pytest``) everything does. CI runs them in the newest
#: JAX's session (noxfile.py's MATRIX), and ``nox -s full`` everywhere.
HOST_SIDE_FILES = frozenset({
    "test_object_store.py", "test_append.py", "test_reading_back.py",
    "test_recorder_integrity.py", "test_docs.py", "test_examples.py", "test_bench.py",
    "test_bad_settings_and_inputs.py", "test_packaging.py", "test_install.py",
    "test_structure.py", "test_shard_assembly.py",
})
_SCOPES = ("all", "jax", "host")


def pytest_addoption(parser):
    parser.addoption("--scope", choices=_SCOPES, default="all",
                     help="which tests run: all; jax (those whose result may depend on the "
                          "JAX release: all but conftest.HOST_SIDE_FILES); host (only those)")


def _deselect_by_scope(config, items) -> None:
    scope = config.getoption("--scope")
    if scope == "all":
        return
    keep, drop = [], []
    for item in items:
        host_side = os.path.basename(str(item.fspath)) in HOST_SIDE_FILES
        (keep if host_side == (scope == "host") else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_collection_modifyitems(config, items):
    """On a GPU or a TPU, tests marked ``several_devices`` (many CPU devices or processes in
    subprocesses) are skipped: the accelerator machine has one device, and CI runs them on
    CPU. With the portable transport (``HOSTFEED_TRANSPORT=jax``, or a TPU), tests marked
    ``native_transport(reason)`` (about hostfeed's native handlers themselves) are skipped
    with their reason. ``--scope`` deselects files (:data:`HOST_SIDE_FILES`)."""
    _deselect_by_scope(config, items)
    if PORTABLE:
        for item in items:
            marker = item.get_closest_marker("native_transport")
            if marker:
                why = marker.args[0] if marker.args else "tests the native transport"
                item.add_marker(pytest.mark.skip(reason=f"native transport only: {why}"))
    if not ON_ACCELERATOR:
        return
    skip = pytest.mark.skip(reason="needs several devices (runs on CPU devices in CI)")
    for item in items:
        if item.get_closest_marker("several_devices"):
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _one_process_holds_the_tpu(monkeypatch):
    """On a TPU, a test that starts another Python process is skipped when it does: one
    process at a time can hold the chip, and this one does (CI runs these tests on CPU)."""
    if not ON_TPU:
        yield
        return
    real_init = subprocess.Popen.__init__

    def init(self, args, *rest, **kwargs):
        first = args if isinstance(args, (str, bytes)) else args[0]
        name = os.path.basename(os.fsdecode(first).split()[0])
        if first == sys.executable or name.startswith("python"):
            pytest.skip("starts another JAX process, and one process at a time can hold a "
                        "TPU (runs on CPU in CI)")
        real_init(self, args, *rest, **kwargs)

    monkeypatch.setattr(subprocess.Popen, "__init__", init)
    yield


@pytest.fixture(autouse=True)
def _receiver_clean_after_test():
    from hostfeed._src.record import recorder as recording

    with recording.open_lock:
        before = set(recording._open)
    yield
    try:
        # Raises (and so fails the test's teardown) if a callback exception went unreported.
        hcb.barrier_wait("test_teardown", timeout=120)
    finally:
        # A recorder the test opened and left open (an assertion failed before its close)
        # is closed here and fails this test: left open, it would keep writing (and renewing
        # its lease on a store this test's server may no longer serve), and every later
        # test's barrier would report its errors.
        with recording.open_lock:
            left = [rec for rec in recording._open if rec not in before]
        for rec in left:
            with contextlib.suppress(Exception):
                rec.close()
        if left:
            pytest.fail(f"the test left {len(left)} recorder(s) open: {left!r}")


def _in_mode(name: str):
    before = hcb.get_ad_taps()
    hcb.set_ad_taps(name)
    try:
        yield name
    finally:
        hcb.set_ad_taps(before)


@pytest.fixture(params=["transforms", "primals"])
def mode(request):
    """Runs the test in each autodiff tap mode."""
    yield from _in_mode(request.param)


@pytest.fixture
def transforms_mode():
    """Runs the test in the 'transforms' autodiff tap mode."""
    yield from _in_mode("transforms")


@pytest.fixture
def primals_mode():
    """Runs the test in the 'primals' autodiff tap mode."""
    yield from _in_mode("primals")


@contextlib.contextmanager
def queue_bound(nbytes: int):
    """Runs the block with the receiver's byte bound set to ``nbytes``, then restores it."""
    import hostfeed

    hcb.barrier_wait()
    old = hostfeed.receiver_stats()["max_queue_bytes"]
    hostfeed.start_receiver(max_queue_byte_size=nbytes)
    try:
        yield
    finally:
        hostfeed.start_receiver(max_queue_byte_size=old)


#: Dtypes a TPU's host transfers do not carry bit for bit (measured 2026-12-05, TPU v5e,
#: jax 0.10.2): a TPU emulates 64-bit floats (a negative zero arrived as a positive one, and
#: complex128[2, 3, 5] failed to compile), and rewrites the NaN encodings of these float8s;
#: and float16 NaN payloads become the canonical NaN in any TPU computation, JAX's own
#: included (measured 2026-12-06: a jitted identity does it too).
TPU_INEXACT_DTYPES = frozenset({"float64", "complex128", "float8_e3m4", "float8_e4m3",
                                "float16"})


def skip_if_the_tpu_alters(dtype) -> None:
    """Skips a bit-exactness test of ``dtype`` on a TPU that does not carry it bit for bit."""
    import numpy as np

    name = np.dtype(dtype).name
    if ON_TPU and name in TPU_INEXACT_DTYPES:
        pytest.skip(f"a TPU does not carry {name} bit for bit (TPU_INEXACT_DTYPES)")


def cpu_device_or_skip():
    """JAX's first CPU device; skips the test where JAX has no CPU backend (a TPU machine
    run with ``JAX_PLATFORMS=tpu``): JAX's own ``io_callback`` and ``pure_callback`` place
    their operands on it, and a host function's computations run there."""
    import jax

    try:
        return jax.devices("cpu")[0]
    except RuntimeError:
        pytest.skip("needs JAX's CPU backend beside the accelerator (JAX_PLATFORMS=tpu,cpu)")


def wait_until(predicate: Callable[[], bool], timeout: float = 30.0,
               interval: float = 0.001) -> None:
    """Waits for a condition (polling every ``interval`` seconds), failing after ``timeout``
    seconds."""
    deadline = time.monotonic() + timeout
    event = threading.Event()
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        event.wait(interval)


def run_python(code: str, env: dict[str, str] | None = None,
               timeout: float = 180) -> subprocess.CompletedProcess:
    """Runs ``code`` in a fresh interpreter (for exit-time and environment behaviour)."""
    full_env = dict(os.environ)
    full_env.setdefault("JAX_PLATFORMS", "cpu")
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=full_env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def calls_on_receiver_thread():
    """Every ``call`` runs on the receiver thread while the test runs (as with
    ``HOSTFEED_CALL_THREAD=receiver``): for what only a host function there can do, be
    abandoned by a stop, or go on after Ctrl-C failed its call."""
    from hostfeed import _receiver

    before = _receiver.set_inline_calls(False)
    yield
    _receiver.set_inline_calls(before)
