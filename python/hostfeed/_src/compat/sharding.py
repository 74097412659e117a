"""Partitioners and shardings in the supported JAX releases: the GSPMD sharding of an
operation in a manual region, whether Shardy partitions, and the manual axes of a lowering
context. Part of :mod:`hostfeed._src.compat` (re-exported there), the only importer of
``jax._src``.
"""
from __future__ import annotations

from typing import Any

from jax._src import config as _config
from jax._src.interpreters import mlir as _mlir_src
from jax._src.lib import xla_client as _xc

from .versions import since


def manual_op_sharding() -> _xc.OpSharding:
    """A GSPMD ``OpSharding`` of type MANUAL (ops inside a fully manual region)."""
    proto = _xc.OpSharding()
    proto.type = _xc.OpSharding.Type.MANUAL
    return proto


_SET_SHARDING_TAKES_CTX = since("set_sharding_takes_ctx")
_set_sharding: Any = _mlir_src.set_sharding  # typed for one signature only


def set_sharding(ctx: Any, op: Any, sharding: Any) -> None:
    """Sets ``sharding`` (a GSPMD ``OpSharding``) on the MLIR operation ``op``."""
    if _SET_SHARDING_TAKES_CTX:
        _set_sharding(ctx, op, sharding)
    else:
        _set_sharding(op, sharding)


_SHARDY_ALWAYS = since("shardy_always")


def shardy_partitioner() -> bool:
    """Whether Shardy partitions the computations being lowered (always from jax 0.12.1,
    where ``jax_use_shardy_partitioner`` is ignored; before, as that flag says)."""
    return _SHARDY_ALWAYS or bool(_config.use_shardy_partitioner.value)


_NESTED_SHARD_MAP_CONTEXT_OMITS_OUTER_AXES = not since("nested_shard_map_names_outer_axes")


def manual_axes(axis_context: Any) -> tuple[str, ...]:
    """The mesh axes that are manual where a lowering rule runs, in mesh order (none
    outside a manual region)."""
    axes = set(getattr(axis_context, "manual_axes", ()))
    mesh = getattr(axis_context, "mesh", None)
    if _NESTED_SHARD_MAP_CONTEXT_OMITS_OUTER_AXES:
        axes |= set(getattr(mesh, "manual_axes", ()))
    order = list(getattr(mesh, "axis_names", ()))
    return tuple(sorted(axes, key=lambda a: (order.index(a) if a in order else len(order), a)))


# Callbacks in a partially manual shard_map under the Shardy partitioner: hostfeed nests a
# token-carrying manual region in the partially manual one, which it refuses with a clear
# error where XLA would abort compiling it.
SHARDY_COMPILES_NESTED_MANUAL_TOKENS = since("shardy_compiles_nested_manual_tokens")
