"""Records under pmap, shard_map and jit over sharded arrays (4 CPU devices), read back
with zarr-python. Usage: python recording_cases.py STORE_DIR SHARDY(0|1); prints "all ok"."""
from __future__ import annotations

import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import jax.numpy as jnp
import numpy as np
import zarr
from jax.sharding import NamedSharding, PartitionSpec as P

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
print("all ok")
