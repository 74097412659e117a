"""The first step of .ci/accelerators/gpu_check.sh: is hostfeed usable on this machine's GPU at all?

Checks, in about a minute, what every later step needs: the CUDA handlers are registered
(else it stops at once, exit status 3, so that the check does not spend its time on a
suite that cannot pass), one small tap, one call, one 64 MiB tap and a barrier, each with
its values checked. Prints one line per check; a hang dumps every thread's stack and
exits (faulthandler) before the step's time is up.

Run: JAX_PLATFORMS=cuda python .ci/accelerators/gpu_smoke.py   (JAX_PLATFORMS=cpu: the dry run,
where the CPU handlers serve and the CUDA handlers are not required)
Environment: GPU_CHECK_SMOKE_S (default 60): seconds before the stack dump and exit;
GPU_CHECK_REQUIRE_CUDA=1: require the CUDA handlers on CPU too (to try the early stop).
"""
from __future__ import annotations

import faulthandler
import os
import sys
import time

LIMIT_S = float(os.environ.get("GPU_CHECK_SMOKE_S", 60))
# Leave the step's outer timeout a few seconds to report.
faulthandler.dump_traceback_later(max(LIMIT_S - 5, 1), exit=True)

import jax  # noqa: E402 - after the watchdog: initialising the backend may hang too
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import hostfeed  # noqa: E402
from hostfeed import host_callback as hcb  # noqa: E402
from hostfeed._src.transports import native  # noqa: E402

ON_CPU = os.environ.get("JAX_PLATFORMS", "").split(",")[0].strip() == "cpu"
REQUIRE_CUDA = not ON_CPU or os.environ.get("GPU_CHECK_REQUIRE_CUDA") == "1"
#: Which GPU's handlers: cuda or rocm (.ci/accelerators/rocm_check.sh sets GPU_CHECK_KIND=rocm).
KIND = os.environ.get("GPU_CHECK_KIND", "cuda")
NAME = {"cuda": "CUDA", "rocm": "ROCm"}[KIND]


def gpu(what: str):
    """This GPU's native function ``what`` (``hostfeed._src.transports.native``)."""
    return native.platform(KIND).status if what == "status" else getattr(
        native.platform(KIND).driver, what)
T0 = time.perf_counter()


def say(what: str) -> None:
    print(f"smoke {time.perf_counter() - T0:6.1f}s  {what}", flush=True)


def main() -> int:
    say(f"hostfeed {hostfeed.__version__} from {os.path.dirname(hostfeed.__file__)}, "
        f"jax {jax.__version__}, devices {jax.devices()}")
    say(f"{NAME} driver library: {gpu('driver_path')() or gpu('driver_error')()}"
        f" | version {gpu('driver_version')()}")
    # Lowering registers the handlers (the status function does it once the backend is up).
    status = gpu("status")()
    say(f"{NAME} handlers: {status or 'registered'}")
    if status is not None and REQUIRE_CUDA:
        say(f"HANDLERS MISSING: {status}")
        return 3

    got: list = []
    x = jnp.arange(4, dtype=jnp.float32)
    out = jax.jit(lambda v: hcb.id_tap(lambda a, t: got.append(np.array(a)), v * 2) + 1)(x)
    hcb.barrier_wait()
    assert np.array_equal(np.asarray(out), [1, 3, 5, 7]), out
    assert len(got) == 1 and np.array_equal(got[0], [0, 2, 4, 6]), got
    say("one tap: ok")

    spec = jax.ShapeDtypeStruct((4,), jnp.float32)
    y = jax.jit(lambda v: hcb.call(lambda a: np.asarray(a) * 10, v, result_shape=spec))(x)
    assert np.array_equal(np.asarray(y), [0, 10, 20, 30]), y
    say("one call: ok")

    sizes: list = []
    n = 16 << 20  # float32: 64 MiB
    big = jnp.arange(n, dtype=jnp.float32)
    t = time.perf_counter()
    jax.jit(lambda v: hcb.id_tap(lambda a, _: sizes.append((a.nbytes, float(a[-1]))), v))(big)
    hcb.barrier_wait()
    assert sizes == [(n * 4, float(n - 1))], sizes
    say(f"one 64 MiB tap: ok ({time.perf_counter() - t:.2f}s with compilation)")

    hcb.barrier_wait()
    say(f"barrier: ok; pinned pool {gpu('pool_stats')()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
