"""Records under pmap, shard_map, jit over sharded arrays and vmap of sharded values (4 CPU
devices), read back with zarr-python. Usage: python recording_cases.py STORE_DIR
SHARDY(0|1); prints "all ok"."""
from __future__ import annotations

import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import jax.numpy as jnp
import numpy as np
import zarr
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import hostfeed

jax.config.update("jax_use_shardy_partitioner", sys.argv[2] == "1")
N = 4
path = os.path.join(sys.argv[1], "run.zarr")
mesh = jax.make_mesh((N,), ("d",))
x = jnp.arange(N * 6, dtype=jnp.float32).reshape(N * 2, 3)  # rows split evenly
odd = jnp.arange(N * 5 + 1, dtype=jnp.float32)  # does not split evenly: gathered

with hostfeed.Recorder(path) as rec:
    jax.pmap(lambda v: rec.record("pmap", v * 2, step=7))(x.reshape(N, 2, 3))
    sharded = jax.device_put(x, NamedSharding(mesh, P("d")))
    jax.jit(jax.shard_map(lambda v: rec.record("shard_map", v + 1), mesh=mesh,
                          in_specs=P("d"), out_specs=P("d")))(sharded)
    jax.jit(lambda v: rec.record("global", v - 1, step=3))(sharded)
    jax.jit(lambda v: rec.record("gathered", v * 3))(
        jax.device_put(odd, NamedSharding(mesh, P())))

    # vmap of a sharded value with a step (issue 65.1): the step, unbatched, is broadcast
    # to one per lane, an array with no mesh that used to enter the explicit mesh's region
    # unresharded, so shard_map refused it and nothing compiled.
    explicit = jax.make_mesh((N,), ("d",), axis_types=(AxisType.Explicit,))
    lanes = jax.device_put(jnp.arange(N * N, dtype=jnp.float32).reshape(N, N),
                           NamedSharding(explicit, P("d")))
    per_lane = jax.device_put(jnp.arange(N, dtype=jnp.int32) + 10,
                              NamedSharding(explicit, P("d")))
    nested = jax.device_put(x.reshape(N, 2, 3), NamedSharding(explicit, P("d")))

    @jax.jit  # one compile for these cases
    def lanes_step(v, per_lane, nested, s):
        jax.vmap(lambda e: rec.record("vmap/const", e, step=5))(v)
        jax.vmap(lambda e: rec.record("vmap/traced", e, step=s))(v)
        jax.vmap(lambda e, t: rec.record("vmap/per_lane", e, step=t))(v, per_lane)
        jax.vmap(jax.vmap(lambda e: rec.record("vmap/nested", e, step=3)))(nested)
        jax.vmap(lambda e: rec.record("vmap/stats", e, step=s, reduce="stats"))(v)

    # (every= apart: with GSPMD, a stats record and a selected record in one computation
    # over a sharded value abort XLA, vmap or not; not this case's subject.)
    every = jax.jit(jax.vmap(lambda v, s: rec.record("vmap/every", v, step=s, every=2),
                             in_axes=(0, None)))
    for s in (7, 8):  # every=2 records step 8 only
        lanes_step(lanes, per_lane, nested, s)
        every(lanes, s)
    try:  # a per-lane step cannot select per lane: refused at trace time, nothing declared
        jax.jit(jax.vmap(lambda v, s: rec.record("vmap/every_per_lane", v, step=s,
                                                 every=2)))(lanes, per_lane)
        raise AssertionError("a per-lane step with every= was not refused")
    except ValueError as e:
        assert "differs between the lanes" in str(e), e

    # A global record whose lowering fails leaves no empty array behind (the failure
    # injected where the region is traced).
    from hostfeed._src import placement

    def broken(*args, **kwargs):
        raise RuntimeError("injected lowering failure")

    in_region, placement._in_region = placement._in_region, broken
    try:
        jax.jit(jax.vmap(lambda v: rec.record("vmap/failed", v, step=5)))(lanes)
        raise AssertionError("the injected lowering failure did not raise")
    except RuntimeError as e:
        assert "injected" in str(e), e
    finally:
        placement._in_region = in_region

g = zarr.open_group(path, mode="r")
xs = np.asarray(x)

rows, meta = hostfeed.read_recording(path, "pmap")
order = np.argsort(meta["device"], kind="stable")
assert sorted(meta["device"].tolist()) == list(range(N)), meta["device"]
np.testing.assert_array_equal(rows[order], xs.reshape(N, 2, 3) * 2)
assert meta["step"].tolist() == [7] * N

rows, meta = hostfeed.read_recording(path, "shard_map")
order = np.argsort(meta["device"], kind="stable")
np.testing.assert_array_equal(rows[order], xs.reshape(N, 2, 3) + 1)

rows, meta = hostfeed.read_recording(path, "global")  # shards joined: the whole value once
np.testing.assert_array_equal(rows, [xs - 1])
assert meta["step"].tolist() == [3]

rows, _ = hostfeed.read_recording(path, "gathered")
np.testing.assert_array_equal(rows, [np.asarray(odd) * 3])

# Under vmap each lane is a row, in lane order, with its step.
ls = np.arange(N * N, dtype=np.float32).reshape(N, N)
for name, want, steps in [
        ("vmap/const", np.concatenate([ls, ls]), [5] * (2 * N)),
        ("vmap/traced", np.concatenate([ls, ls]), [7] * N + [8] * N),
        ("vmap/per_lane", np.concatenate([ls, ls]), [10, 11, 12, 13] * 2),
        ("vmap/nested", np.concatenate([xs, xs]), [3] * (4 * N)),
        ("vmap/every", ls, [8] * N)]:
    rows, meta = hostfeed.read_recording(path, name)
    np.testing.assert_array_equal(rows, want, err_msg=name)
    assert meta["step"].tolist() == steps, (name, meta["step"])
    assert np.all(np.diff(meta["seq"]) > 0), (name, meta["seq"])
rows, meta = hostfeed.read_recording(path, "vmap/stats")
assert meta["step"].tolist() == [7] * N + [8] * N, meta["step"]
assert rows.shape == (2 * N, len(hostfeed.STATS)), rows.shape
np.testing.assert_allclose(rows[:N, 1], ls.mean(axis=1))  # column 1: the mean
np.testing.assert_array_equal(rows[:N, 3], ls.min(axis=1))  # column 3: the min
assert "every_per_lane" not in g["vmap"] and "failed" not in g["vmap"], list(g["vmap"])
print("all ok")
