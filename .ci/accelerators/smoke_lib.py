"""What the accelerator smokes (gpu_smoke.py, tpu_smoke.py) share: checks that each run
once, whatever happened to the one before, printing one line each, and the Recorder's
checks, each read back and compared with numpy.

    checks = Checks(json_path=None)             # or a file the results are rewritten to
    @checks.check("one tap")
    def _(): ...                                # runs now; a failure is recorded, not raised
    recorder_checks(checks, x)                  # every=/start=/stop=, stats, Histogram, ...
    sys.exit(checks.summary())
"""
from __future__ import annotations

import contextlib
import json
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np

import hostfeed
from hostfeed import host_callback as hcb

T0 = time.perf_counter()


class Checks:
    """Named checks run at once, each outcome kept (``{name: ["ok", seconds, detail] |
    ["FAIL", traceback]}``) and, with ``json_path``, rewritten to that file after each."""

    def __init__(self, prefix: str = "smoke", json_path: Optional[str] = None) -> None:
        self.prefix = prefix
        self.json_path = json_path
        self.results: dict[str, Any] = {}

    def say(self, what: str) -> None:
        print(f"{self.prefix} {time.perf_counter() - T0:6.1f}s  {what}", flush=True)

    def check(self, name: str) -> Callable[[Callable[[], Any]], None]:
        """Runs the decorated function now as the check ``name``, recording its outcome."""
        def run(fn: Callable[[], Any]) -> None:
            t = time.perf_counter()
            try:
                detail = fn()
                self.results[name] = ["ok", round(time.perf_counter() - t, 2), detail]
            except BaseException as exc:  # noqa: BLE001 - recorded; the next checks still run
                self.results[name] = ["FAIL", "".join(traceback.format_exception(exc))[-3000:]]
                # A failure left for the next barrier is this check's, not the next one's.
                with contextlib.suppress(BaseException):
                    hcb.barrier_wait()
            status = self.results[name][0]
            shown = (self.results[name][2] if status == "ok"
                     else self.results[name][1].strip().splitlines()[-1])
            self.say(f"{name}: {status}  {str(shown)[:200]}")
            if status != "ok":  # the failure's last frames, for a summary without the file
                for line in self.results[name][1].strip().splitlines()[-8:-1]:
                    print(f"    {line}", flush=True)
            if self.json_path:
                with open(self.json_path, "w") as f:
                    json.dump(self.results, f, indent=1, default=str)
        return run

    def failed(self) -> list[str]:
        return [k for k, v in self.results.items() if v[0] != "ok"]

    def summary(self) -> int:
        """Prints how many passed; the exit status (1 if any failed)."""
        failed = self.failed()
        print(f"{self.prefix}: {len(self.results) - len(failed)} of {len(self.results)} checks "
              f"passed" + (f"; FAILED: {', '.join(failed)}" if failed else ""), flush=True)
        return 1 if failed else 0


def tap_checks(checks: Checks, x: Any) -> None:
    """Taps on this device: in order in a loop, a tap function's exception raised by the
    next barrier, a 64 MiB tap arriving whole (``x``: a float32[4] array)."""
    @checks.check("taps in order in a loop")
    def _() -> Any:
        got: list[int] = []
        f = jax.jit(lambda v: jax.lax.fori_loop(
            0, 100, lambda i, c: hcb.id_tap(lambda a, t: got.append(int(a)), c + 1), v))
        assert int(f(jnp.int32(0))) == 100
        hcb.barrier_wait()
        assert got == list(range(1, 101)), got[:10]
        return len(got)

    @checks.check("a tap function's exception is raised by barrier_wait")
    def _() -> Any:
        def bad(a: Any, t: Any) -> None:
            raise ValueError("smoke boom")
        jax.jit(lambda v: hcb.id_tap(bad, v))(x)
        try:
            hcb.barrier_wait()
        except hcb.CallbackException:
            return "raised"
        raise AssertionError("barrier_wait did not raise")

    @checks.check("64 MiB tap")
    def _() -> Any:
        sizes: list = []
        n = 16 << 20  # float32: 64 MiB
        big = jnp.arange(n, dtype=jnp.float32)
        t = time.perf_counter()
        jax.jit(lambda v: hcb.id_tap(lambda a, _: sizes.append((a.nbytes, float(a[-1]))),
                                     v))(big)
        hcb.barrier_wait()
        assert sizes == [(n * 4, float(n - 1))], sizes
        return f"{n * 4 / (time.perf_counter() - t) / 1e9:.2f} GB/s end to end, compiling included"


def recorded(name: str, steps: int, x: Any, *, wrap: Optional[Callable] = None,
             **kw: Any) -> tuple[np.ndarray, dict]:
    """``rec.record(name, x * i, step=i, **kw)`` in a jitted step (or one made by
    ``wrap(rec, fn)``) for ``i < steps``; the rows and metadata read back."""
    folder = tempfile.mkdtemp(prefix="hostfeed-smoke-")
    with hostfeed.Recorder(f"{folder}/r.zarr", mode="w") as rec:
        def fn(v: Any, i: Any) -> Any:
            return rec.record(name, v * i, step=i, **kw) + 0
        step = jax.jit(fn) if wrap is None else wrap(rec, fn)
        for i in range(steps):
            step(x, i)
    return hostfeed.read_recording(f"{folder}/r.zarr", name)


def recorder_checks(checks: Checks, x: Any) -> None:
    """The Recorder on this device: raw rows, every=/start=/stop=, reduce="stats", a
    Histogram, each read back and compared with numpy (``x``: a float32[4] array)."""
    xs = np.asarray(x)

    @checks.check("Recorder: raw rows, read back")
    def _() -> Any:
        h, meta = recorded("h", 5, x)
        assert h.shape == (5, 4) and meta["step"].tolist() == list(range(5)), (h.shape, meta)
        np.testing.assert_array_equal(h, np.stack([xs * i for i in range(5)]))
        return "ok"

    @checks.check("Recorder: every=2, start=1, stop=6")
    def _() -> Any:
        h, meta = recorded("h", 8, x, every=2, start=1, stop=6)
        assert meta["step"].tolist() == [1, 3, 5], meta["step"]
        np.testing.assert_array_equal(h, np.stack([xs * i for i in (1, 3, 5)]))
        return "ok"

    @checks.check("Recorder: reduce='stats'")
    def _() -> Any:
        h, _ = recorded("h", 3, x, reduce="stats")
        assert h.shape == (3, len(hostfeed.STATS)), h.shape
        np.testing.assert_allclose(h[2][1], np.mean(xs * 2), rtol=1e-6)
        return "ok"

    @checks.check("Recorder: reduce='stats', every=2")
    def _() -> Any:
        _, meta = recorded("h", 5, x, reduce="stats", every=2)
        assert meta["step"].tolist() == [0, 2, 4], meta["step"]
        return "ok"

    @checks.check("Recorder: Histogram, linear and log, every=2")
    def _() -> Any:
        lin, _ = recorded("h", 3, x, reduce=hostfeed.Histogram(bins=4, range=(0.0, 8.0)))
        log, _ = recorded("h", 3, x, reduce=hostfeed.Histogram(bins=6, range="log"), every=2)
        assert lin.shape == (3, 6) and log.shape == (2, 8), (lin.shape, log.shape)
        # Row 2 holds x * 2 = [0, 2, 4, 6]: one value in each of the 4 bins of width 2.
        assert lin[2].tolist() == [0, 1, 1, 1, 1, 0], lin[2]
        return [lin.tolist(), log.tolist()]


def step_checks(checks: Checks) -> None:
    """A raw 4 MiB row per step, in the computation and through ``Recorder.step`` both ways
    (records as outputs, and inside the computation), read back exactly."""
    big = jnp.arange(1 << 20, dtype=jnp.float32)  # 4 MiB
    want = np.arange(1 << 20, dtype=np.float32)
    ways: dict[str, Optional[Callable]] = {
        "in the computation": None,
        "Recorder.step(outputs=True)": lambda rec, fn: rec.step(fn, outputs=True),
        "Recorder.step(outputs=False)": lambda rec, fn: rec.step(fn, outputs=False),
        "Recorder.step (this platform's default)": lambda rec, fn: rec.step(fn),
    }
    for way, wrap in ways.items():
        @checks.check(f"Recorder: a raw 4 MiB row per step, {way}")
        def _() -> Any:
            t = time.perf_counter()
            h, meta = recorded("big", 3, big, wrap=wrap)
            assert h.shape == (3, 1 << 20) and meta["step"].tolist() == [0, 1, 2], h.shape
            for i in range(3):
                np.testing.assert_array_equal(h[i], want * i)
            return f"ok, {time.perf_counter() - t:.2f}s with compilation"


def capture_check(checks: Checks) -> None:
    """``hostfeed.capture`` of a tiny Flax NNX model in a jitted training step: rows of
    each captured layer equal to the layer's output computed without hostfeed."""
    @checks.check("capture: a tiny Flax NNX model, trained 3 steps")
    def _() -> Any:
        try:
            from flax import nnx
        except ImportError as exc:
            return f"skipped: no flax ({exc})"

        class MLP(nnx.Module):
            def __init__(self, rngs: Any) -> None:
                self.fc1 = nnx.Linear(4, 8, rngs=rngs)
                self.fc2 = nnx.Linear(8, 2, rngs=rngs)

            def __call__(self, v: Any) -> Any:
                return self.fc2(jax.nn.relu(self.fc1(v)))

        folder = tempfile.mkdtemp(prefix="hostfeed-smoke-")
        model = MLP(nnx.Rngs(0))
        batch = jnp.linspace(-1, 1, 12, dtype=jnp.float32).reshape(3, 4)
        want = []
        # Full float32 matmuls (a GPU's default may be TF32), so that the rows can be
        # compared with the layer's output computed apart.
        with jax.default_matmul_precision("float32"), \
                hostfeed.Recorder(f"{folder}/r.zarr", mode="w") as rec:
            @nnx.jit
            def train(m: Any, v: Any, i: Any) -> Any:
                def loss(m: Any) -> Any:
                    captured = hostfeed.capture(m, rec, "fc*", step=i)
                    return jnp.mean(captured(v) ** 2)
                value, grads = nnx.value_and_grad(loss)(m)
                nnx.update(m, jax.tree.map(lambda p, g: p - 0.05 * g,
                                           nnx.state(m, nnx.Param), grads))
                return value

            losses = []
            for i in range(3):
                want.append(np.asarray(model.fc1(batch)))  # before the step changes fc1
                losses.append(float(train(model, batch, i)))
        rows, meta = hostfeed.read_recording(f"{folder}/r.zarr", "fc1/output")
        assert meta["step"].tolist() == [0, 1, 2], meta["step"]
        np.testing.assert_allclose(rows, np.stack(want), rtol=1e-5, atol=1e-6)
        assert losses[-1] < losses[0], losses
        return f"ok, names {sorted(hostfeed.open_recording(f'{folder}/r.zarr').names)[:4]}"
