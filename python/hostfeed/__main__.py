"""``python -m hostfeed demo``: train a tiny model with taps on its activations.

The host follows the jitted training loop through taps (a progress line driven by the
loss each step sends), records the hidden layer's statistics with a ``Recorder`` and reads
a few rows back, then says in one line what the taps cost the device.
"""
from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile
from typing import Any, Optional, TextIO

import jax
import jax.numpy as jnp
import numpy as np

import hostfeed
from hostfeed import bench
from hostfeed import host_callback as hcb


class _Progress:
    """A one-line progress bar on ``out``, redrawn in place on a terminal; elsewhere (a
    pipe, a log) one line per quarter of the run."""

    def __init__(self, total: int, out: TextIO):
        self.total, self.out = total, out
        self.tty = out.isatty()
        self.shown = 0  # quarters shown

    def update(self, step: int, loss: float) -> None:
        done = step + 1
        quarter = 4 * done // self.total
        if not self.tty:
            if quarter <= self.shown:
                return
            self.shown = quarter
        bar = "#" * (24 * done // self.total)
        line = f"  step {done:>{len(str(self.total))}}/{self.total} [{bar:<24}] loss {loss:.4f}"
        self.out.write(("\r" + line) if self.tty else line + "\n")
        if self.tty and done == self.total:
            self.out.write("\n")
        self.out.flush()


def _us(value: float) -> str:
    return f"{value:.2f} µs" if value < 10 else f"{value:.0f} µs"


def demo(steps: int = 100, out: Optional[TextIO] = None, store: Any = None) -> int:
    """Trains a 2-layer MLP on synthetic data for ``steps`` steps: each step taps its loss
    (the host draws a progress line) and records the hidden layer's mean, standard
    deviation and gradient norm into a Zarr store, read back at the end: ``store`` (kept,
    and its path printed), or a temporary folder deleted at the end (the output says
    so). Prints on ``out`` (``sys.stdout`` as it is at the call). Returns 0, or 1 when the
    loss did not fall."""
    out = sys.stdout if out is None else out
    progress = _Progress(steps, out)
    losses: list[float] = []

    def on_step(arg: Any, transforms: Any) -> None:
        step, loss = int(arg[0]), float(arg[1])
        losses.append(loss)
        progress.update(step, loss)

    folder = None
    if store is None:
        folder = tempfile.TemporaryDirectory(prefix="hostfeed-demo-")
        store = pathlib.Path(folder.name) / "demo.zarr"
    rec = hostfeed.Recorder(store, mode="w")

    def loss_fn(params: Any, x: Any, y: Any, step: Any) -> Any:
        h = jnp.tanh(x @ params["w1"] + params["b1"])
        rec.record("hidden/mean", h.mean(), step=step)
        rec.record("hidden/std", h.std(), step=step)
        return jnp.mean((h @ params["w2"] + params["b2"] - y) ** 2)

    @jax.jit
    def train_step(params: Any, step: Any, x: Any, y: Any) -> Any:
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y, step)
        gnorm = jnp.sqrt(sum(jnp.sum(g * g) for g in jax.tree_util.tree_leaves(grads)))
        rec.record("grad_norm", gnorm, step=step)
        hcb.id_tap(on_step, (step, loss))  # identity; the device only copies it out
        return jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, params, grads)

    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(64, 8)), jnp.float32)
    y = jnp.asarray(np.sin(np.asarray(x).sum(axis=1, keepdims=True)), jnp.float32)
    params = {
        "w1": jnp.asarray(rng.normal(size=(8, 16)) * 0.3, jnp.float32),
        "b1": jnp.zeros(16, jnp.float32),
        "w2": jnp.asarray(rng.normal(size=(16, 1)) * 0.3, jnp.float32),
        "b2": jnp.zeros(1, jnp.float32),
    }
    print(f"hostfeed {hostfeed.__version__} demo: {steps} jitted training steps of a 2-layer "
          f"MLP; the host follows them through taps", file=out)
    hostfeed.receiver_stats()  # start the receiver before timing anything
    for step in range(steps):
        params = train_step(params, jnp.int32(step), x, y)
    hcb.barrier_wait("demo")
    rec.close()

    try:
        rows, meta = hostfeed.read_recording(store, "grad_norm")
        means, _ = hostfeed.read_recording(store, "hidden/mean")
        stds, _ = hostfeed.read_recording(store, "hidden/std")
        shown = sorted({0, len(rows) // 2, len(rows) - 1})
        print(f"recorded {len(rows)} rows each of hidden/mean, hidden/std and grad_norm; "
              f"read back:", file=out)
        print(f"  {'step':>6} {'hidden/mean':>12} {'hidden/std':>11} {'grad_norm':>10}",
              file=out)
        for i in shown:
            print(f"  {int(meta['step'][i]):>6} {float(means[i]):>12.4f} "
                  f"{float(stds[i]):>11.4f} {float(rows[i]):>10.4f}", file=out)
    except ImportError:
        print("reading the recording back needs zarr-python: pip install '.[zarr]' in "
              "hostfeed's checkout (or pip install 'zarr>=3.1')",
              file=out)
    if folder is None:
        print(f"the recording is kept in {store}", file=out)
        print(f"look at it: python -m hostfeed show {store} (every array over its steps, "
              f"into a PNG), or python -m hostfeed tensorboard {store} LOGDIR (for "
              f"TensorBoard: pip install tensorboard)", file=out)
    else:  # said before it goes, so that no path is printed that will not exist
        print("the recording was in a temporary store, deleted at the end of the demo "
              "(--store PATH keeps it)", file=out)
        print("with --store PATH, python -m hostfeed show PATH draws what it recorded and "
              "python -m hostfeed tensorboard PATH LOGDIR exports it for TensorBoard",
              file=out)
    stats = hostfeed.receiver_stats()
    device, handover = stats["device_us"], stats["handover_us"]
    print(f"the device spent {_us(device['p50'])} per tap or record (p50; p99 "
          f"{_us(device['p99'])}) for {stats['messages_processed']:,} messages of "
          f"{stats['bytes_processed'] / 1024:,.1f} KiB; the host took each "
          f"{_us(handover['p50'])} after it was sent (p50)", file=out)
    if folder is not None:
        folder.cleanup()
    if len(losses) != steps or not losses[-1] < losses[0]:
        print(f"the loss did not fall ({losses[0]:.4f} -> {losses[-1]:.4f} over "
              f"{len(losses)} steps): the demo's model is broken", file=sys.stderr)
        return 1
    print(f"loss {losses[0]:.4f} -> {losses[-1]:.4f}", file=out)
    return 0


def parser() -> argparse.ArgumentParser:
    """The parser of ``python -m hostfeed`` and its commands (docs/cli.md is generated from
    it: ``python docs/reference.py --write``)."""
    top = argparse.ArgumentParser(prog="python -m hostfeed",
                                  description="hostfeed's commands: a demo, the benchmark, "
                                  "and looking at a recording")
    sub = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p = sub.add_parser("demo", help="train a tiny model with taps on its activations",
                       description="Trains a 2-layer MLP for a few seconds: each step taps its "
                       "loss (the host draws a progress line) and records the hidden layer's "
                       "statistics and the gradient norm, read back at the end; then says what "
                       "the taps cost the device")
    p.add_argument("--steps", type=int, default=100, metavar="N",
                   help="training steps (default 100)")
    p.add_argument("--store", metavar="PATH",
                   help="keep the recording in this Zarr store (default: a temporary one, "
                   "deleted at the end)")
    p.set_defaults(parser=p)
    b = sub.add_parser("bench", help="latency and throughput against JAX's own callbacks",
                       description=bench.DESCRIPTION.rstrip("."))
    bench.add_arguments(b)
    b.set_defaults(parser=b)
    s = sub.add_parser("show", help="a recording's table, and a picture of its arrays over "
                       "their steps (PNG or HTML)",
                       description="Prints a recording's table (names, rows, steps, dtype, row "
                       "shape, bytes, summary), then draws the arrays over their steps: a grid "
                       "of panels, each module's arrays side by side, into a PNG or one "
                       "self-contained HTML page")
    s.add_argument("store", metavar="STORE",
                   help="the recording: a directory or an object store's URL")
    s.add_argument("patterns", nargs="*", metavar="PATTERN",
                   help="the arrays to draw: an array's name, or glob patterns split on '/' "
                   "and '.' as capture matches names ('blocks.*', '**.cotangent'); "
                   "default: every array")
    s.add_argument("-o", "--output", "--png", dest="output", metavar="FILE",
                   help="where to draw: FILE.png, or FILE.html (one self-contained page); "
                   "default: NAME.png for one array's name, else the store's name .png, in "
                   "the current directory (the command prints the path)")
    s.set_defaults(parser=s)
    t = sub.add_parser("tensorboard", help="write a recording as TensorBoard event files "
                       "(scalars and histograms), or follow a run that is writing it",
                       description="Writes a recording as TensorBoard event files: statistics "
                       "as scalars, histograms as histograms, each row at its recorded step "
                       "and time; with --follow, a run while it records, until its recorder "
                       "closes the store")
    t.add_argument("store", metavar="STORE",
                   help="the recording: a directory or an object store's URL")
    t.add_argument("logdir", metavar="LOGDIR",
                   help="the directory of the event files (TensorBoard's run; made if "
                   "missing, refused if it holds event files)")
    t.add_argument("patterns", nargs="*", metavar="PATTERN",
                   help="the arrays to export (as show takes them); default: every array")
    t.add_argument("--follow", action="store_true",
                   help="follow a store a recorder is still writing, until it closes")
    t.add_argument("--poll", type=float, default=0.5, metavar="SECONDS",
                   help="with --follow: seconds between looks at the store (default 0.5)")
    t.set_defaults(parser=t)
    return top


def main(argv: list[str] | None = None) -> int:
    """``python -m hostfeed``; returns the exit status."""
    args = parser().parse_args(argv)
    if args.command == "bench":
        return bench.run_command(args)
    if args.command == "show":
        from ._src.readback import show
        try:
            return show.main(args.store, args.patterns, args.output)
        except (KeyError, ValueError, FileNotFoundError, ImportError) as exc:
            said = str(exc).strip(chr(34)).removeprefix("hostfeed.open_recording: ")
            print(f"python -m hostfeed show: {said.removeprefix('hostfeed: ')}",
                  file=sys.stderr)
            return 2
    if args.command == "tensorboard":
        from ._src.readback import tensorboard
        return tensorboard.main(args.store, args.logdir, args.patterns, args.follow, args.poll)
    if args.command == "demo":
        if args.steps < 1:
            args.parser.error(f"--steps must be at least 1, got {args.steps}")
        return demo(args.steps, store=args.store)
    return 2  # pragma: no cover - argparse enforces the choices


if __name__ == "__main__":
    sys.exit(main())
