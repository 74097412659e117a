"""After tpu_check.sh's smoke (a process of its own: one program at a time holds the TPU):
a summary at selected steps traced where the default backend is the CPU and lowered for
the TPU (JAX_PLATFORMS=cpu,tpu, operands placed on the TPU). Tracing then leaves the choice
of where the summary is computed to ``jax.lax.platform_dependent``; lowered for the TPU,
the TPU's way (computed at every step, its record sent in the cond) must be kept, since
the TPU's compiler refuses the other. Checked under ``jax.jit`` and ``Recorder.step``:
the selected steps' rows and their values.

Run: JAX_PLATFORMS=cpu,tpu python .ci/accelerators/tpu_traced_on_cpu.py
Exit status 0 and one line per way when it holds; a traceback otherwise.
"""
from __future__ import annotations

import os
import tempfile

import jax
import numpy as np

import hostfeed

assert jax.default_backend() == "cpu", jax.default_backend()
tpu = jax.devices("tpu")[0]
x0 = np.arange(15, dtype=np.float32).reshape(3, 5)
folder = tempfile.mkdtemp()
for way in ("jit", "Recorder.step"):
    store = os.path.join(folder, f"{way}.zarr")
    with hostfeed.Recorder(store, mode="w") as rec:
        def fn(v, s):
            rec.record("s", v * 2.0, step=s, reduce="stats", every=2)
            return v + 1

        f = jax.jit(fn) if way == "jit" else rec.step(fn, outputs=True)
        v = jax.device_put(x0, tpu)
        for k in range(5):
            v = f(v, jax.device_put(k, tpu))
        jax.block_until_ready(v)
        assert v.devices() == {tpu}, v.devices()
    rows, meta = hostfeed.read_recording(store, "s")
    steps = meta["step"].tolist()
    assert steps == [0, 2, 4], steps
    rows = np.asarray(rows)
    np.testing.assert_array_equal(rows[:, 0], [15, 15, 15])  # count
    np.testing.assert_allclose(rows[:, 1], [2 * (7 + k) for k in steps], rtol=1e-6)  # mean
    print(f"traced on the CPU, lowered for the TPU, {way}: steps {steps}, "
          f"means {rows[:, 1].tolist()}: ok", flush=True)
