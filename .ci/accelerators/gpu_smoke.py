"""The first step of .ci/accelerators/gpu_check.sh: is hostfeed usable on this machine's GPU?

Checks, in under a minute, what every later step needs, each check's values compared: the
CUDA handlers are registered (else it stops at once, exit status 3, so that the check does
not spend its time on a suite that cannot pass), ``hostfeed.transports()`` names the
platform as JAX lowers for it (``cuda``, not the device's ``gpu``), taps in order, a call,
a 64 MiB tap, a barrier; then the Recorder (raw rows, every=/start=/stop=, stats, a
Histogram), a raw 4 MiB row per step inside the computation and through
``Recorder.step`` both ways, and a captured Flax NNX model in a training step, each read
back and compared with numpy (``smoke_lib.py``, which the TPU's smoke shares). Every
check runs whatever happened to the one before; one line each (a failure's last frames
below it). A hang dumps every thread's stack and exits (faulthandler) before the step's
time is up.

Run: JAX_PLATFORMS=cuda,cpu python .ci/accelerators/gpu_smoke.py   (JAX_PLATFORMS=cpu: the dry
run, where the CPU handlers serve and the CUDA handlers are not required)
Environment: GPU_CHECK_SMOKE_S (default 60): seconds before the stack dump and exit;
GPU_CHECK_REQUIRE_CUDA=1: require the CUDA handlers on CPU too (to try the early stop).
Exit status: 0 when every check passed, 1 otherwise, 3 when the handlers are missing.
"""
from __future__ import annotations

import faulthandler
import os
import sys
from typing import Any

LIMIT_S = float(os.environ.get("GPU_CHECK_SMOKE_S", 60))
# Leave the step's outer timeout a few seconds to report.
faulthandler.dump_traceback_later(max(LIMIT_S - 5, 1), exit=True)

import jax  # noqa: E402 - after the watchdog: initialising the backend may hang too
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import hostfeed  # noqa: E402
from hostfeed import host_callback as hcb  # noqa: E402
from hostfeed._src.transports import native  # noqa: E402
from smoke_lib import (Checks, capture_check, recorder_checks, step_checks,  # noqa: E402
                       tap_checks)

ON_CPU = os.environ.get("JAX_PLATFORMS", "").split(",")[0].strip() == "cpu"
REQUIRE_CUDA = not ON_CPU or os.environ.get("GPU_CHECK_REQUIRE_CUDA") == "1"
#: Which GPU's handlers: cuda or rocm (.ci/accelerators/rocm_check.sh sets GPU_CHECK_KIND=rocm).
KIND = os.environ.get("GPU_CHECK_KIND", "cuda")
NAME = {"cuda": "CUDA", "rocm": "ROCm"}[KIND]


def gpu(what: str) -> Any:
    """This GPU's native function ``what`` (``hostfeed._src.transports.native``)."""
    return native.platform(KIND).status if what == "status" else getattr(
        native.platform(KIND).driver, what)


def main() -> int:
    checks = Checks()
    checks.say(f"hostfeed {hostfeed.__version__} from {os.path.dirname(hostfeed.__file__)}, "
               f"jax {jax.__version__}, devices {jax.devices()}, default backend "
               f"{jax.default_backend()}, CPU backend "
               f"{'yes' if jax.devices('cpu') else 'no'}")
    checks.say(f"{NAME} driver library: {gpu('driver_path')() or gpu('driver_error')()}"
               f" | version {gpu('driver_version')()}")
    # Lowering registers the handlers (the status function does it once the backend is up).
    status = gpu("status")()
    checks.say(f"{NAME} handlers: {status or 'registered'}")
    if status is not None and REQUIRE_CUDA:
        checks.say(f"HANDLERS MISSING: {status}")
        return 3
    x = jnp.arange(4, dtype=jnp.float32)

    @checks.check("transports() names the platform as JAX lowers for it")
    def _() -> Any:
        table = hostfeed.transports()
        assert "gpu" not in table, table
        if not ON_CPU:
            assert table.get(KIND) == "native", table
        return table

    @checks.check("one tap of a computed value, the result used")
    def _() -> Any:
        got: list = []
        out = jax.jit(lambda v: hcb.id_tap(lambda a, t: got.append(np.array(a)), v * 2) + 1)(x)
        hcb.barrier_wait()
        assert np.array_equal(np.asarray(out), [1, 3, 5, 7]), out
        assert len(got) == 1 and np.array_equal(got[0], [0, 2, 4, 6]), got
        return "ok"

    @checks.check("one call")
    def _() -> Any:
        spec = jax.ShapeDtypeStruct((4,), jnp.float32)
        y = jax.jit(lambda v: hcb.call(lambda a: np.asarray(a) * 10, v, result_shape=spec))(x)
        assert np.array_equal(np.asarray(y), [0, 10, 20, 30]), y
        return "ok"

    tap_checks(checks, x)
    recorder_checks(checks, x)
    step_checks(checks)
    capture_check(checks)
    hcb.barrier_wait()
    checks.say(f"pinned pool {gpu('pool_stats')()}")
    return checks.summary()


if __name__ == "__main__":
    sys.exit(main())
