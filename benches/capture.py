"""What ``hostfeed.capture`` costs a training step against the same records written in the
model by hand: a small transformer's jitted training step (Flax NNX, Flax Linen, Equinox:
each library installed) recording every block's MLP output at every step (and, under
``grad``, its cotangent), side by side in one run.

``linen-scan-remat`` is the Linen transformer with its blocks as a stack under
``nn.scan`` of ``nn.remat`` (one row per layer and step, the recomputation recording
nothing).

Per library, three cases of the same step: the step without recording; ``rec.record`` calls
written in the blocks (``hand``); ``hostfeed.capture(model, rec, ...)`` of the blocks' MLPs
(``capture``), which records the same arrays under the same names. The cases run in turn,
round after round, each first in turn (so that a slow stretch of the shared machine hits
them all); a round of a case is ``--steps`` steps, each waited for, then ``rec.flush()``
(every row written), timed together. Each case's figure is its median round, per step; the
ratio ``capture / hand`` is taken round by round (each round's capture against the same
round's hand) and its median printed with its range. The target: at most 1.05. The two
compile to the same computation (but for the source locations in its metadata): what differs
is the Python that traces them, once.

Run: python benches/capture.py [--rounds N] [--steps N] [--only nnx linen equinox]
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

import hostfeed

B, T, D, DEPTH = 8, 32, 64, 4  # batch, tokens, width, blocks: MLP outputs of 64 KiB

# Hand-placed records: (recorder, step) while the "hand" case's step is traced.
_HAND: list[Any] = [None]


def hand(name: str, h: Any) -> Any:
    """What a user writes in the model: ``rec.record(name, h, step=step)``."""
    if _HAND[0] is None:
        return h
    rec, step = _HAND[0]
    return rec.record(name, h, step=step)


def data() -> tuple[Any, Any]:
    kx, ky = jax.random.split(jax.random.key(1))
    return jax.random.normal(kx, (B, T, D)), jax.random.normal(ky, (B, T, 1))


def _sgd(params: Any, grads: Any) -> Any:
    return jax.tree.map(lambda p, g: p - 0.01 * g, params, grads)


# ---- the models and their steps: make(kind, rec) -> a callable of the step number ----------

def nnx_case(kind: str, rec: Any) -> Callable[[int], Any]:
    from flax import nnx

    class MLP(nnx.Module):
        def __init__(self, rngs: Any):
            self.up, self.down = nnx.Linear(D, 4 * D, rngs=rngs), nnx.Linear(4 * D, D, rngs=rngs)

        def __call__(self, x: Any) -> Any:
            return self.down(jax.nn.gelu(self.up(x)))

    class Block(nnx.Module):
        def __init__(self, i: int, rngs: Any):
            self.i = i
            self.norm = nnx.LayerNorm(D, rngs=rngs)
            self.attn = nnx.MultiHeadAttention(num_heads=4, in_features=D, decode=False,
                                               rngs=rngs)
            self.mlp = MLP(rngs)

        def __call__(self, x: Any) -> Any:
            x = x + self.attn(self.norm(x))
            return x + hand(f"blocks.{self.i}.mlp/output", self.mlp(x))

    class Transformer(nnx.Module):
        def __init__(self, rngs: Any):
            self.blocks = nnx.List([Block(i, rngs) for i in range(DEPTH)])
            self.head = nnx.Linear(D, 1, rngs=rngs)

        def __call__(self, x: Any) -> Any:
            for block in self.blocks:
                x = block(x)
            return self.head(x)

    model, (x, y) = Transformer(nnx.Rngs(0)), data()

    @nnx.jit
    def step(model: Any, s: Any) -> Any:
        def loss_fn(model: Any) -> Any:
            m = hostfeed.capture(model, rec, "blocks.*.mlp", step=s) if kind == "capture" \
                else model
            return jnp.mean((m(x) - y) ** 2)
        _HAND[0] = (rec, s) if kind == "hand" else None
        try:
            loss, grads = nnx.value_and_grad(loss_fn)(model)
        finally:
            _HAND[0] = None
        nnx.update(model, _sgd(nnx.state(model, nnx.Param), grads))
        return loss
    return lambda s: step(model, s)


def _linen_training(model: Any, pattern: str, kind: str, rec: Any) -> Callable[[int], Any]:
    """One SGD step of the Linen ``model`` per call: without records (``plain``), with
    the modules ``pattern`` selects captured (``capture``), or with the records the model
    places by hand (``hand``)."""
    x, y = data()
    state = [model.init(jax.random.key(0), x)["params"]]

    @jax.jit
    def step(params: Any, s: Any) -> Any:
        def loss_fn(params: Any) -> Any:
            m = hostfeed.capture(model, rec, pattern, step=s) if kind == "capture" else model
            return jnp.mean((m.apply({"params": params}, x) - y) ** 2)
        _HAND[0] = (rec, s) if kind == "hand" else None
        try:
            loss, grads = jax.value_and_grad(loss_fn)(params)
        finally:
            _HAND[0] = None
        return _sgd(params, grads), loss

    def one(s: int) -> Any:
        state[0], loss = step(state[0], s)
        return loss
    return one


def linen_case(kind: str, rec: Any) -> Callable[[int], Any]:
    from flax import linen as nn

    class MLP(nn.Module):
        @nn.compact
        def __call__(self, x: Any) -> Any:
            return nn.Dense(D)(nn.gelu(nn.Dense(4 * D)(x)))

    class Block(nn.Module):
        i: int

        @nn.compact
        def __call__(self, x: Any) -> Any:
            x = x + nn.MultiHeadDotProductAttention(num_heads=4)(nn.LayerNorm()(x))
            return x + hand(f"Block_{self.i}/MLP_0/output", MLP()(x))

    class Transformer(nn.Module):
        @nn.compact
        def __call__(self, x: Any) -> Any:
            for i in range(DEPTH):
                x = Block(i, name=f"Block_{i}")(x)
            return nn.Dense(1)(x)

    return _linen_training(Transformer(), "Block_*/MLP_0", kind, rec)


def equinox_case(kind: str, rec: Any) -> Callable[[int], Any]:
    import equinox as eqx

    class MLP(eqx.Module):
        up: eqx.nn.Linear
        down: eqx.nn.Linear

        def __init__(self, key: Any):
            k1, k2 = jax.random.split(key)
            self.up, self.down = eqx.nn.Linear(D, 4 * D, key=k1), eqx.nn.Linear(4 * D, D, key=k2)

        def __call__(self, x: Any) -> Any:
            return jax.vmap(self.down)(jax.nn.gelu(jax.vmap(self.up)(x)))

    class Block(eqx.Module):
        norm: eqx.nn.LayerNorm
        attn: eqx.nn.MultiheadAttention
        mlp: MLP
        i: int = eqx.field(static=True)

        def __init__(self, i: int, key: Any):
            k1, k2 = jax.random.split(key)
            self.i = i
            self.norm = eqx.nn.LayerNorm(D)
            self.attn = eqx.nn.MultiheadAttention(4, D, key=k1)
            self.mlp = MLP(k2)

        def __call__(self, x: Any) -> Any:
            h = jax.vmap(self.norm)(x)
            x = x + self.attn(h, h, h)
            return x + hand(f"blocks.{self.i}.mlp/output", self.mlp(x))

    class Transformer(eqx.Module):
        blocks: list
        head: eqx.nn.Linear

        def __init__(self, key: Any):
            keys = jax.random.split(key, DEPTH + 1)
            self.blocks = [Block(i, k) for i, k in enumerate(keys[:-1])]
            self.head = eqx.nn.Linear(D, 1, key=keys[-1])

        def __call__(self, x: Any) -> Any:
            for block in self.blocks:
                x = block(x)
            return jax.vmap(self.head)(x)

    (x, y) = data()
    state = [Transformer(jax.random.key(0))]

    @eqx.filter_jit
    def step(model: Any, s: Any) -> Any:
        def loss_fn(model: Any) -> Any:
            m = hostfeed.capture(model, rec, "blocks.*.mlp", step=s) if kind == "capture" \
                else model
            return jnp.mean((jax.vmap(m)(x) - y) ** 2)
        _HAND[0] = (rec, s) if kind == "hand" else None
        try:
            loss, grads = eqx.filter_value_and_grad(loss_fn)(model)
        finally:
            _HAND[0] = None
        return eqx.apply_updates(model, jax.tree.map(lambda g: -0.01 * g, grads)), loss

    def one(s: int) -> Any:
        state[0], loss = step(state[0], jnp.asarray(s))
        return loss
    return one


def linen_stack_case(kind: str, rec: Any) -> Callable[[int], Any]:
    """The Linen transformer's blocks as a stack: ``nn.scan`` over ``nn.remat`` of a
    block (one row per layer and step; the recomputation in the backward pass records
    nothing)."""
    from flax import linen as nn

    class MLP(nn.Module):
        @nn.compact
        def __call__(self, x: Any) -> Any:
            return nn.Dense(D)(nn.gelu(nn.Dense(4 * D)(x)))

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x: Any, _: Any) -> Any:
            x = x + nn.MultiHeadDotProductAttention(num_heads=4)(nn.LayerNorm()(x))
            return x + hand("layers/MLP_0/output", MLP()(x)), None

    class Transformer(nn.Module):
        @nn.compact
        def __call__(self, x: Any) -> Any:
            layers = nn.scan(nn.remat(Block), variable_axes={"params": 0},
                             split_rngs={"params": True}, length=DEPTH)
            x, _ = layers(name="layers")(x, None)
            return nn.Dense(1)(x)

    return _linen_training(Transformer(), "layers/MLP_0", kind, rec)


LIBRARIES = {"nnx": ("flax", nnx_case), "linen": ("flax", linen_case),
             "equinox": ("equinox", equinox_case),
             "linen-scan-remat": ("flax", linen_stack_case)}
KINDS = ("no record", "hand", "capture")


def bench(library: str, rounds: int, steps: int, base: str) -> dict[str, list[float]]:
    """Seconds per step of each case, one figure per round."""
    make = LIBRARIES[library][1]
    recs = {k: hostfeed.Recorder(os.path.join(base, f"{library}-{k.replace(' ', '_')}.zarr"))
            for k in KINDS[1:]}
    cases = {k: make(k, recs.get(k)) for k in KINDS}
    counter = dict.fromkeys(KINDS, 0)

    def run(kind: str, n: int) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            cases[kind](counter[kind]).block_until_ready()
            counter[kind] += 1
        if kind in recs:
            recs[kind].flush()
        return (time.perf_counter() - t0) / n

    for kind in KINDS:  # compiled and warm, not timed
        run(kind, 2)
    times: dict[str, list[float]] = {k: [] for k in KINDS}
    for r in range(rounds):
        for kind in KINDS[r % 3:] + KINDS[:r % 3]:  # each case first in a round in turn
            times[kind].append(run(kind, steps))
    for rec in recs.values():
        rec.close()
    names = sorted(hostfeed.open_recording(recs["capture"].path).names)
    assert names == sorted(hostfeed.open_recording(recs["hand"].path).names), names
    return times


def report(library: str, times: dict[str, list[float]]) -> float:
    med = {k: statistics.median(v) for k, v in times.items()}
    ratios = [c / h for c, h in zip(times["capture"], times["hand"])]
    ratio = statistics.median(ratios)
    print(f"\n{library}: {DEPTH} blocks, MLP outputs float32[{B}, {T}, {D}] and their "
          f"cotangents recorded every step")
    print(f"  {'case':<12}{'ms per step':>14}")
    for kind in KINDS:
        print(f"  {kind:<12}{med[kind] * 1e3:>14.3f}")
    print(f"  capture / hand: {ratio:.3f}x (rounds: {min(ratios):.3f}-{max(ratios):.3f}x); "
          f"target at most 1.05x")
    return ratio


def _arguments(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (``--help`` prints it)."""
    p = argparse.ArgumentParser(
        prog="benches/capture.py", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=int(os.environ.get(
        "HOSTFEED_BENCH_REPEATS", 15)), help="rounds of each case (default 15)")
    p.add_argument("--steps", type=int, default=10, help="steps a round (default 10)")
    p.add_argument("--only", nargs="+", choices=sorted(LIBRARIES), default=sorted(LIBRARIES),
                   help="libraries to measure (default: each one installed)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    print(f"hostfeed.capture against hand-placed rec.record: jax {jax.__version__}, "
          f"Python {sys.version.split()[0]}, {os.cpu_count()} CPUs, "
          f"{args.rounds} rounds of {args.steps} steps")
    base = tempfile.mkdtemp(prefix="hfcapture-", dir="/dev/shm" if os.path.isdir(
        "/dev/shm") else None)
    worst = 0.0
    try:
        for library in args.only:
            dist = LIBRARIES[library][0]
            if importlib.util.find_spec(dist) is None:
                print(f"\n{library}: skipped ({dist} is not installed: "
                      f"pip install {dist}, or pip install '.[{dist}]' in hostfeed's checkout)")
                continue
            worst = max(worst, report(library, bench(library, args.rounds, args.steps, base)))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(f"\nworst capture / hand: {worst:.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
