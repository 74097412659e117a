"""``python -m hostfeed demo``: train a tiny model with taps on its activations.

Prints what the host received for each step and the receiver's counters.
"""
from __future__ import annotations

import argparse
import sys

import jax
import jax.numpy as jnp
import numpy as np

import hostfeed
from hostfeed import bench
from hostfeed import host_callback as hcb


def demo(steps: int = 5) -> int:
    """Trains a 2-layer MLP on synthetic data for ``steps`` steps, tapping activations."""
    received: list[tuple[str, dict]] = []

    def log_hidden(h, transforms):
        # Runs on the host with numpy arrays. Under jax.grad the forward pass taps the
        # activations; the backward pass taps their cotangents (dloss/dh), marked by
        # 'transpose' in `transforms`.
        if any(name == "transpose" for name, _ in transforms):
            received.append(("dloss/dhidden", {"norm": float(np.linalg.norm(h))}))
        else:
            received.append(("hidden", {"mean": float(h.mean()), "std": float(h.std()),
                                        "max|h|": float(np.abs(h).max())}))

    def log_step(arg, transforms):
        step, loss = arg
        received.append(("step", {"step": int(step), "loss": float(loss)}))

    def loss_fn(params, x, y):
        h = jnp.tanh(x @ params["w1"] + params["b1"])
        h = hcb.id_tap(log_hidden, h)  # identity on h; the device only copies it out
        return jnp.mean((h @ params["w2"] + params["b2"] - y) ** 2)

    @jax.jit
    def train_step(params, step, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        hcb.id_tap(log_step, (step, loss))
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
    for step in range(steps):
        params = train_step(params, step, x, y)
    hcb.barrier_wait("demo")

    print(f"hostfeed {hostfeed.__version__} demo: {steps} training steps of a 2-layer MLP")
    for kind, values in received:
        text = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                         for k, v in values.items())
        print(f"  host received {kind:<12} {text}")
    print("receiver counters:")
    for k, v in hostfeed.receiver_stats().items():
        print(f"  {k:<24} {v}")
    losses = [v["loss"] for k, v in received if k == "step"]
    return 0 if len(losses) == steps and losses[-1] < losses[0] else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hostfeed",
                                     description="hostfeed: JAX host callbacks in Rust")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("demo", help="train a tiny model with taps on its activations")
    p.add_argument("--steps", type=int, default=5, help="training steps (default 5)")
    b = sub.add_parser("bench", help="latency and throughput against JAX's own callbacks")
    bench.add_arguments(b)
    args = parser.parse_args(argv)
    if args.command == "bench":
        return bench.run_command(args)
    if args.command == "demo":
        if args.steps < 1:
            parser.error("--steps must be at least 1")
        return demo(args.steps)
    return 2  # pragma: no cover - argparse enforces the choices


if __name__ == "__main__":
    sys.exit(main())
