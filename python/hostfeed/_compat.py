"""The one place hostfeed imports JAX internals (``jax._src``), gated on the JAX version.

Everything else in hostfeed imports from here, so a JAX release that moves an internal
needs a fix in this file only.
"""
from __future__ import annotations

import jax

SUPPORTED = ((0, 10), (0, 11))  # [lowest, highest) as (major, minor)


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def check_jax_version(version: str = jax.__version__) -> None:
    """Raises ImportError with an actionable message if ``version`` is unsupported.

    Example:
        >>> check_jax_version("0.10.2")
    """
    v = _version_tuple(version)[:2]
    lo, hi = SUPPORTED
    if not (lo <= v < hi):
        raise ImportError(
            f"hostfeed 0.1 supports jax {lo[0]}.{lo[1]}.x; found jax {version}. "
            f"Install a supported version with: pip install 'jax>={lo[0]}.{lo[1]},"
            f"<{hi[0]}.{hi[1]}' 'jaxlib>={lo[0]}.{lo[1]},<{hi[0]}.{hi[1]}'"
        )


check_jax_version()

# Internals used by hostfeed; jax 0.10.x layout.
from jax._src import config as _config  # noqa: E402
from jax._src import core  # noqa: E402
from jax._src import dispatch  # noqa: E402
from jax._src import dtypes  # noqa: E402
from jax._src import effects  # noqa: E402
from jax._src import ffi as _ffi  # noqa: E402
from jax._src.interpreters import ad  # noqa: E402
from jax._src.interpreters import mlir  # noqa: E402
from jax._src.interpreters import partial_eval as pe  # noqa: E402
from jax._src import sharding_impls  # noqa: E402
from jax._src.lib import xla_client as _xc  # noqa: E402

Primitive = core.Primitive
runtime_tokens = dispatch.runtime_tokens  # the effect tokens JAX chains between computations
abstract_token = core.abstract_token
apply_primitive = dispatch.apply_primitive
Effect = effects.Effect
build_ffi_lowering_function = _ffi.build_ffi_lowering_function
register_lowering = mlir.register_lowering

EFFECT_SETS = (
    effects.ordered_effects,
    effects.lowerable_effects,
    effects.control_flow_allowed_effects,
    effects.shardable_ordered_effects,
    effects.remat_allowed_effects,
    effects.custom_derivatives_allowed_effects,
)


enum_state = _config.enum_state
use_shardy = _config.use_shardy_partitioner

# Sharding contexts a lowering rule can find itself in.
SPMDAxisContext = sharding_impls.SPMDAxisContext
ShardingContext = sharding_impls.ShardingContext
lower_fun = mlir.lower_fun
set_sharding = mlir.set_sharding


def manual_op_sharding():
    """A GSPMD ``OpSharding`` of type MANUAL (ops inside a fully manual region)."""
    proto = _xc.OpSharding()
    proto.type = _xc.OpSharding.Type.MANUAL
    return proto

# Autodiff and partial-evaluation pieces used by the transformation rules.
Zero = ad.Zero
is_undefined_primal = ad.is_undefined_primal
float0 = dtypes.float0
DropVar = core.DropVar
custom_partial_eval_rules = pe.custom_partial_eval_rules
partial_eval_jaxpr_custom_rules = pe.partial_eval_jaxpr_custom_rules
dce_rules = pe.dce_rules
ensure_enum = pe.ensure_enum
RecomputeType = pe.RecomputeType


def is_tracer(x: object) -> bool:
    """Whether ``x`` is a JAX tracer (abstract value under a transformation)."""
    return isinstance(x, core.Tracer)


# ---- Batching of while loops whose predicate taps (rules._while_batching) ----------------
# JAX 0.10.2, 0.11.2 and 0.12.0.1 alike: `_while_lowering` (lax/control_flow/loops.py), for
# a cond function with an ordered effect, ORs a batched predicate into one and never
# selects per lane, so hostfeed batches such loops itself. It needs JAX's jaxpr batching:
# `batch_jaxpr` (never public) and `batch_jaxpr_axes` (public in jax.interpreters.batching
# from 0.11 only); same signatures in 0.10-0.12.
from jax._src.interpreters import batching as _batching  # noqa: E402

batch_jaxpr = _batching.batch_jaxpr
batch_jaxpr_axes = _batching.batch_jaxpr_axes


# ---- Many processes (placement.py) ------------------------------------------------------
# The global-view lowering must know which process owns each device of the computation
# (`ShardingContext.device_assignment`), which JAX 0.10-0.12 fills in only for
# computations containing a primitive of this registry (as io_callback's). Same name in
# 0.10.2 through 0.12.
def require_devices_during_lowering(*prims: Primitive) -> None:
    """Makes JAX pass the physical devices to the lowering of computations using ``prims``."""
    dispatch.prim_requires_devices_during_lowering.update(prims)


# ---- Eager taps without a computation (primitives.outside_call, _tap_eager) -------------
# jax 0.10-0.12: `core.trace_ctx.trace` is the active trace; an `EvalTrace` means eager.


def eval_trace_active() -> bool:
    """Whether no transformation or trace is active (eager evaluation), i.e. a primitive
    bound now would run its evaluation rule."""
    return type(core.trace_ctx.trace) is core.EvalTrace


canonicalize_value = dtypes.canonicalize_value  # what `Primitive.bind` applies to operands


# ---- Tap outputs that depend on the tap (lowering) ---------------------------------------
def add_dependency(value, token):
    """``value``, made to depend on ``token`` in the HLO (XLA's ``kAddDependency``).

    StableHLO has no such op; the MHLO one (``mhlo.add_dependency``, registered in JAX's
    MLIR context) converts to HLO's ``add-dependency``, a no-op that only orders: the
    result aliases ``value``'s buffer.
    """
    return _mhlo.AddDependencyOp(value, token, results=[value.type]).result


from jax._src.lib.mlir.dialects import mhlo as _mhlo  # noqa: E402
