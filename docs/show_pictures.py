"""The pictures of ``python -m hostfeed show`` in the docs, made again from their runs:

- ``show-5-layers.png``: a 5-layer MLP trained 200 steps, each layer's output recorded
  (and, under ``grad``, its cotangent), a histogram of the last layer every 5 steps, the
  loss;
- ``show-48-layers.png``: 48 layers' statistics and histograms over 300 steps and the loss
  (``benches/show.py``'s store, fewer steps);
- ``run1.png`` and ``capture-nnx.png``: the runs of the first examples of recording.md and
  capture.md, as those pages draw them.

    python docs/show_pictures.py [--only NAME ...]    # needs zarr, matplotlib, flax

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
PICTURES = ("show-5-layers", "show-48-layers", "run1", "capture-nnx")


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", choices=PICTURES, default=PICTURES)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="hostfeed-pictures-") as tmp:
        for name in args.only:
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
