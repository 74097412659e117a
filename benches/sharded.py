"""Cost of the global-view lowering: one tap and one call of an array sharded over 8 CPU
devices, each sent shard by shard or (when a leaf does not split evenly) gathered.
Prints the collectives XLA compiled in (and the bytes they move), and end-to-end
time per tap next to the same computation without the tap, under both partitioners.

Run: python benches/sharded.py
"""
from __future__ import annotations

import os
import re

N_DEV = 8
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={N_DEV}"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

from hostfeed import host_callback as hcb  # noqa: E402
from hostfeed.bench import interleaved  # noqa: E402

hcb.set_sync_taps(False)  # asynchronous taps, as measured here (the default is synchronous)

ELEMS = 1 << 20  # float32: 4 MiB logical array, 512 KiB per device
ITEMSIZE = {"f32": 4, "s32": 4, "u32": 4, "pred": 1, "u8": 1}


def collectives(compiled_text: str) -> list[tuple[str, str, int]]:
    """(op, result shape, result bytes) of every collective in the compiled HLO."""
    out = []
    for m in re.finditer(r"= (\w+)\[([\d,]*)\]\{?[^ ]* (all-gather|all-reduce|"
                         r"collective-permute|all-to-all|reduce-scatter)(-start)?\(",
                         compiled_text):
        dtype, dims, op = m.group(1), m.group(2), m.group(3)
        n = int(np.prod([int(d) for d in dims.split(",") if d])) if dims else 1
        out.append((op, f"{dtype}[{dims}]", n * ITEMSIZE.get(dtype, 4)))
    return out


def main() -> None:
    mesh = jax.make_mesh((N_DEV,), ("x",))
    x = jax.device_put(jnp.arange(ELEMS, dtype=jnp.float32), NamedSharding(mesh, P("x")))
    logical = ELEMS * 4
    print(f"jax {jax.__version__}, {N_DEV} CPU devices, operand float32[{ELEMS}] = "
          f"{logical / 2**20:.0f} MiB sharded {N_DEV} ways")
    for shardy in (True, False):
        jax.config.update("jax_use_shardy_partitioner", shardy)
        seen = []
        tap = jax.jit(lambda v: hcb.id_tap(lambda a, tr: seen.append(a.nbytes), v * 2))
        # A leaf that does not split evenly over the devices (a scalar here) makes the tap
        # take the gathering path.
        tap_g = jax.jit(lambda v: hcb.id_tap(lambda a, tr: seen.append(a[0].nbytes),
                                             (v * 2, jnp.float32(1.0))))
        call = jax.jit(lambda v: hcb.call(lambda a: a, v, result_shape=v) * 2)
        # A scalar result cannot be split over the devices: the gathering path.
        call_g = jax.jit(lambda v: hcb.call(lambda a: a.sum(), v, result_shape=1.0))
        plain = jax.jit(lambda v: v * 2)
        name = "Shardy" if shardy else "GSPMD"
        for label, fn in (("tap (shard by shard)", tap), ("tap (gathered)", tap_g),
                          ("call (shard by shard)", call), ("call (gathered)", call_g)):
            cols = collectives(fn.lower(x).compile().as_text())
            print(f"[{name}] {label}: collectives {[(op, shape) for op, shape, _ in cols]}")
            for op, shape, nbytes in cols:
                if op == "all-gather":
                    moved = nbytes * (N_DEV - 1) // N_DEV
                    print(f"    all-gather {shape}: each device receives {moved / 2**20:.2f} "
                          f"MiB; {N_DEV * moved / 2**20:.1f} MiB in total "
                          f"({N_DEV - 1}x the logical operand)")
                elif op == "all-reduce":
                    print(f"    all-reduce {shape}: {nbytes / 2**20:.2f} MiB per device")

        def run_tap():
            tap(x).block_until_ready()
            hcb.barrier_wait()

        def run_tap_g():
            tap_g(x)[0].block_until_ready()
            hcb.barrier_wait()

        def run_call():
            call(x).block_until_ready()

        def run_call_g():
            call_g(x).block_until_ready()

        def run_plain():
            plain(x).block_until_ready()

        res = interleaved({"no tap": run_plain, "tap": run_tap, "tap (gathered)": run_tap_g,
                           "call": run_call, "call (gathered)": run_call_g},
                          repeats=20, warmup=3)
        assert seen and all(b == logical for b in seen)
        base = res["no tap"]["min"]
        for k, v in res.items():
            print(f"    {k:<15} {v['min'] * 1e3:8.3f} ms  (+{(v['min'] - base) * 1e3:.3f} ms "
                  f"vs no tap)")


if __name__ == "__main__":
    main()
