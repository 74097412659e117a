"""The pictures of ``python -m hostfeed show`` in the docs, made again from their runs:

- ``show-5-layers.png``: a 5-layer MLP trained 200 steps, each layer's output recorded
  (and, under ``grad``, its cotangent), a histogram of the last layer every 5 steps, the
  loss;
- ``show-48-layers.png``: 48 layers' statistics and histograms over 300 steps and the loss
  (``benches/show.py``'s store, fewer steps);
- ``run1.png`` and ``capture-nnx.png``: the runs of the first examples of recording.md and
  capture.md, as those pages draw them;
- ``tensorboard.png``: TensorBoard's Time Series tab showing a run of 100 steps exported by
  ``hostfeed.to_tensorboard`` (the tensorboard package's server on 127.0.0.1, a
  screenshot by headless Chromium).

    python docs/show_pictures.py [--only NAME ...]    # needs zarr, matplotlib, flax,
                                                      # tensorboard, chromium

Each picture is drawn as ``show`` draws it, then stored with 256 colours (a third of the
bytes; the same picture to the eye).
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import pathlib
import subprocess
import sys
import tempfile

DOCS = pathlib.Path(__file__).resolve().parent
ROOT = DOCS.parent
PICTURES = ("show-5-layers", "show-48-layers", "run1", "capture-nnx", "tensorboard")


def five_layers(path: str) -> None:
    """A 5-layer MLP trained 200 steps (jitted), recording each layer's output."""
    import jax
    import jax.numpy as jnp
    import hostfeed

    rec = hostfeed.Recorder(path, mode="w")

    def loss_fn(params, x, y, step):
        h = x
        for i, (w, b) in enumerate(params):
            h = h @ w + b
            h = jnp.tanh(h) if i < len(params) - 1 else h
            h = rec.record(f"blocks.{i}/output", h, step=step)  # and its cotangent
        rec.record("blocks.4/output.hist", h, step=step, every=5,
                   reduce=hostfeed.Histogram(24, (-2.0, 2.0)))
        return jnp.mean((h - y) ** 2)

    @jax.jit
    def train_step(params, x, y, step):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y, step)
        rec.record("loss", loss, step=step)
        return jax.tree.map(lambda p, g: p - 0.05 * g, params, grads)

    keys = jax.random.split(jax.random.key(0), 6)
    sizes = [16, 32, 32, 32, 32, 4]
    params = [(jax.random.normal(k, (a, b)) / jnp.sqrt(a), jnp.zeros(b))
              for k, a, b in zip(keys, sizes, sizes[1:])]
    x = jax.random.normal(keys[-1], (64, 16))
    y = jnp.stack([jnp.sin(x[:, :4].sum(1) * k) for k in range(1, 5)], axis=1)
    for step in range(200):
        params = train_step(params, x, y, jnp.int32(step))
    rec.close()


def forty_eight_layers(path: str) -> None:
    """benches/show.py's store of 48 layers, over 300 steps."""
    os.environ["HOSTFEED_BENCH_STEPS"] = "300"
    spec = importlib.util.spec_from_file_location("show_bench", ROOT / "benches" / "show.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    bench.record(path)


def page_block(page: str, path: str) -> None:
    """The first Python block of a docs page, run in ``path``'s folder (it writes the
    store there)."""
    spec = importlib.util.spec_from_file_location("readme_check", ROOT / ".ci" / "readme_check.py")
    assert spec is not None and spec.loader is not None
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    block = next(b for b in check.blocks((DOCS / page).read_text()) if b.lang == "python")
    subprocess.run([sys.executable, "-c", block.code], cwd=os.path.dirname(path), check=True,
                   env=dict(os.environ, JAX_PLATFORMS="cpu"), stdout=subprocess.DEVNULL)


def draw(store: str, out: pathlib.Path) -> None:
    """``python -m hostfeed show STORE -o OUT`` in the store's folder (its title names the
    store as a reader's would), then 256 colours."""
    from PIL import Image
    subprocess.run([sys.executable, "-m", "hostfeed", "show", os.path.basename(store), "-o",
                    str(out)], check=True, stdout=subprocess.DEVNULL,
                   cwd=os.path.dirname(store), env=dict(os.environ, JAX_PLATFORMS="cpu"))
    with Image.open(out) as im:
        small = im.convert("RGB").quantize(256, method=Image.Quantize.MEDIANCUT)
    small.save(out, optimize=True)
    print(f"{out.relative_to(ROOT)}: {small.size[0]} x {small.size[1]}, "
          f"{out.stat().st_size / 1024:.0f} KiB")


def tensorboard(folder: str, out: pathlib.Path) -> None:
    """A run of 100 steps (statistics, a histogram, the loss) exported for TensorBoard and
    shown by its server, screenshot by headless Chromium."""
    import json
    import socket
    import time
    import urllib.request

    import numpy as np
    import hostfeed

    store, logdir = os.path.join(folder, "run.zarr"), os.path.join(folder, "logs", "run")
    rng = np.random.default_rng(0)
    with hostfeed.Recorder(store, mode="w") as rec:
        for s in range(100):
            h = np.tanh(rng.normal(size=(64, 32)) * (1 + s / 50)).astype(np.float32)
            rec.record("layer1/h.stats", h, step=s, reduce="stats")
            rec.record("layer1/h.hist", h, step=s, reduce=hostfeed.Histogram(20, (-1.0, 1.0)))
            rec.record("loss", np.float32(1 / (1 + s / 10)), step=s)
    hostfeed.to_tensorboard(store, logdir)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "tensorboard.main", "--logdir", os.path.dirname(logdir),
         "--host", "127.0.0.1", "--port", str(port), "--load_fast", "false"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:  # until the server serves the run's scalars
            try:
                with opener.open(f"{url}/data/plugin/scalars/tags", timeout=5) as r:
                    if json.loads(r.read()).get("run"):
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError("TensorBoard served nothing in 120 s")
            time.sleep(0.5)
        with tempfile.TemporaryDirectory() as profile:
            subprocess.run(["chromium", "--headless=new", "--no-sandbox", "--disable-gpu",
                            "--hide-scrollbars", f"--user-data-dir={profile}",
                            "--window-size=1400,1000", "--virtual-time-budget=15000",
                            f"--screenshot={out}", f"{url}/#timeseries"],
                           check=True, capture_output=True, timeout=180)
    finally:
        server.kill()
        server.wait()
    print(f"{out.relative_to(ROOT)}: {out.stat().st_size / 1024:.0f} KiB")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", choices=PICTURES, default=PICTURES)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="hostfeed-pictures-") as tmp:
        for name in args.only:
            if name == "tensorboard":
                tensorboard(tmp, DOCS / "tensorboard.png")
                continue
            if name == "show-5-layers":
                store = os.path.join(tmp, "five.zarr")
                five_layers(store)
            elif name == "show-48-layers":
                store = os.path.join(tmp, "run-48.zarr")
                forty_eight_layers(store)
            else:
                page, store_name = {"run1": ("recording.md", "run1.zarr"),
                                    "capture-nnx": ("capture.md", "nnx.zarr")}[name]
                store = os.path.join(tmp, store_name)
                page_block(page, store)
            draw(store, DOCS / f"{name}.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
