"""The first step of tpu_check.sh: every hostfeed feature once on this machine's TPU,
each check's values compared, and which dtypes the TPU's host transfers carry (hostfeed's
tap and call, and ``io_callback`` beside them).

Prints one line per check and writes ``$OUT/tpu_smoke.json`` (``{check: ["ok", seconds,
detail] | ["FAIL", traceback]}``); every check runs whatever happened to the one before.
A hang dumps every thread's stack and exits (faulthandler) before the step's time is up.

Run: JAX_PLATFORMS=tpu python .ci/accelerators/tpu_smoke.py   (JAX_PLATFORMS=cpu: the dry run)
Exit status: 0 when every check passed, 1 otherwise.
"""
from __future__ import annotations

import contextlib
import faulthandler
import io
import os
import sys
import tempfile
from typing import Any

LIMIT_S = float(os.environ.get("TPU_CHECK_SMOKE_S", 120))
faulthandler.dump_traceback_later(max(LIMIT_S - 5, 1), exit=True)

import jax  # noqa: E402 - after the watchdog: initialising the backend may hang too
import jax.numpy as jnp  # noqa: E402
import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402
from jax.experimental import io_callback  # noqa: E402

import hostfeed  # noqa: E402
from hostfeed import host_callback as hcb  # noqa: E402
from smoke_lib import Checks, recorded, recorder_checks, tap_checks  # noqa: E402

OUT = os.environ.get("OUT", ".")
CHECKS = Checks(json_path=os.path.join(OUT, "tpu_smoke.json"))
RESULTS = CHECKS.results
check = CHECKS.check


X = jnp.arange(4, dtype=jnp.float32)
SPEC = jax.ShapeDtypeStruct((4,), jnp.float32)
print(f"smoke: hostfeed {hostfeed.__version__}, jax {jax.__version__}, {jax.devices()}, "
      f"transports {hostfeed.transports()}", flush=True)


@check("several operands and dtypes in one tap")
def _() -> Any:
    got: list = []
    args = (X, jnp.int8(-3), jnp.array([True, False]), jnp.zeros((0, 2)),
            jnp.arange(6, dtype=jnp.bfloat16).reshape(2, 3), {"k": jnp.uint16(7)})
    jax.jit(lambda *a: hcb.id_tap(lambda v, t: got.append(v), a))(*args)
    hcb.barrier_wait()
    (v,) = got
    for a, b in zip(jax.tree.leaves(args), jax.tree.leaves(v)):
        assert np.asarray(a).dtype == b.dtype and np.array_equal(np.asarray(a), b), (a, b)
    return "ok"


@check("id_print")
def _() -> Any:
    buf = io.StringIO()
    jax.jit(lambda v: hcb.id_print(v, what="x", output_stream=buf))(X)
    hcb.barrier_wait()
    assert "what: x" in buf.getvalue(), buf.getvalue()
    return buf.getvalue().strip()


@check("call: results of several dtypes, none, and a pytree")
def _() -> Any:
    shape = (SPEC, jax.ShapeDtypeStruct((), jnp.int8), jax.ShapeDtypeStruct((2,), jnp.bool_))
    y = jax.jit(lambda v: hcb.call(
        lambda a: (np.asarray(a) * 10, np.int8(5), np.array([True, False])), v,
        result_shape=shape))(X)
    assert np.asarray(y[0]).tolist() == [0, 10, 20, 30] and int(y[1]) == 5, y
    assert np.asarray(y[2]).tolist() == [True, False], y
    seen: list = []
    jax.jit(lambda v: hcb.call(lambda a: seen.append(1), v))(X)
    hcb.barrier_wait()
    assert seen == [1]
    return "ok"


@check("call failure fails the computation, the next call works")
def _() -> Any:
    def bad(a: Any) -> Any:
        raise ValueError("smoke boom")
    try:
        np.asarray(jax.jit(lambda v: hcb.call(bad, v, result_shape=SPEC))(X))
        raise AssertionError("no error")
    except jax.errors.JaxRuntimeError as exc:
        assert "smoke boom" in str(exc), exc
    with contextlib.suppress(hcb.CallbackException, jax.errors.JaxRuntimeError):
        hcb.barrier_wait()
    assert np.asarray(jax.jit(lambda v: hcb.call(lambda a: a, v, result_shape=SPEC))(X)
                      ).tolist() == [0, 1, 2, 3]
    return "ok"


@check("tap_with_device, sync tap, eager tap")
def _() -> Any:
    got: list = []
    jax.jit(lambda v: hcb.id_tap(lambda a, t, device: got.append(device), v,
                                 tap_with_device=True))(X)
    jax.jit(lambda v: hcb.id_tap(lambda a, t: got.append("sync"), v, sync=True))(X)
    hcb.id_tap(lambda a, t: got.append("eager"), X)
    hcb.barrier_wait()
    assert got == [jax.devices()[0], "sync", "eager"], got
    return str(got)


@check("transformations: jvp, grad, vmap, scan, cond, while")
def _() -> Any:
    got: list = []

    def f(v: Any) -> Any:
        return jnp.sum(hcb.id_tap(lambda a, t: got.append(t), v * v))

    jax.jit(jax.grad(f))(X)
    jax.jit(jax.vmap(f))(jnp.ones((3, 4)))
    jax.jit(lambda v: jax.jvp(f, (v,), (v,)))(X)
    jax.jit(lambda v: lax.scan(lambda c, x: (hcb.id_tap(lambda a, t: got.append("s"), c + x),
                                             None), v, jnp.ones((3, 4)))[0])(X)
    jax.jit(lambda v: lax.cond(v[0] < 1, lambda u: hcb.id_tap(lambda a, t: got.append("c"), u),
                               lambda u: u, v))(X)
    jax.jit(lambda v: lax.while_loop(lambda c: hcb.id_tap(lambda a, t: got.append("w"), c)[0] < 3,
                                     lambda c: c + 1, v))(X)
    hcb.barrier_wait()
    assert got.count("s") == 3 and got.count("c") == 1 and got.count("w") == 4, got
    return str(got[:4])


tap_checks(CHECKS, X)
recorder_checks(CHECKS, X)


if RESULTS["Recorder: reduce='stats', every=2"][0] != "ok":
    @check("diagnosis: reduce='stats', every=2, without the cond inside the statistics")
    def _() -> Any:
        from hostfeed._src.reductions import stats as summaries

        def careful_only(finite: Any, fast: Any, slow: Any, v: Any) -> Any:
            return slow(v)
        saved, summaries._choose = summaries._choose, careful_only
        try:
            h, meta = recorded("h", 5, X, reduce="stats", every=2)
        finally:
            summaries._choose = saved
        assert meta["step"].tolist() == [0, 2, 4], meta["step"]
        return "ok"

    @check("diagnosis: reduce='stats' of a step that is not traced, every=2")
    def _() -> Any:
        folder = tempfile.mkdtemp(prefix="hostfeed-smoke-")
        with hostfeed.Recorder(f"{folder}/r.zarr", mode="w") as rec:
            for i in range(5):
                jax.jit(lambda v, i=i: rec.record("h", v * i, step=i, reduce="stats",
                                                  every=2) + 0)(X)
        return hostfeed.read_recording(f"{folder}/r.zarr", "h")[1]["step"].tolist()


# Which dtypes travel: hostfeed's tap and call, and io_callback, each on its own.
DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float16", "bfloat16", "float32", "float64", "complex64", "complex128",
          "float8_e4m3fn", "float8_e5m2", "float8_e3m4", "float8_e4m3", "float8_e8m0fnu"]


def _dtype(name: str) -> Any:
    return getattr(ml_dtypes, name, None) or np.dtype(name)


@check("dtypes the host transfers carry (tap, call, io_callback)")
def _() -> Any:
    table = {}
    jax.config.update("jax_enable_x64", True)
    try:
        for name in DTYPES:
            x = np.arange(6).reshape(2, 3).astype(_dtype(name))
            row = {}
            for how in ("tap", "call", "io_callback"):
                try:
                    got: list = []
                    if how == "tap":
                        jax.jit(lambda v: hcb.id_tap(lambda a, t: got.append(a.copy()), v))(x)
                        hcb.barrier_wait()
                        (back,) = got
                    elif how == "call":
                        back = np.asarray(jax.jit(lambda v: hcb.call(
                            lambda a: a.copy(), v, result_shape=v))(x))
                    else:
                        back = np.asarray(jax.jit(lambda v: io_callback(
                            lambda a: a.copy(), jax.ShapeDtypeStruct(v.shape, v.dtype), v))(x))
                    row[how] = "ok" if back.tobytes() == x.tobytes() else "WRONG VALUES"
                except Exception as exc:  # noqa: BLE001 - the table says why
                    row[how] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:150]}"
                    with contextlib.suppress(BaseException):
                        hcb.barrier_wait()
            table[name] = row
    finally:
        jax.config.update("jax_enable_x64", False)
    return table


sys.exit(CHECKS.summary())
