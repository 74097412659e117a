"""Everything hostfeed needs from JAX that differs between the JAX releases it supports.

hostfeed supports jax/jaxlib 0.10.0 through 0.12.x. Every difference between those
releases lives in this package: ``versions.py`` has the one table of which release changed
what (``CHANGES``), and the gates here follow it (``since(name)``, or a look at the
feature itself that the table names); every other hostfeed module imports JAX's
internals from here. Public homes (``jax.extend.core``, ``jax.interpreters.*``,
``jax.ffi``) are used where they exist in the whole range; ``jax._src`` only for what has
none.
"""
from __future__ import annotations

import dataclasses
import warnings
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import jax

from .versions import JAX_VERSION, _version_tuple, since  # noqa: F401 - JAX_VERSION: API

#: The oldest (major, minor) JAX that hostfeed supports; older is refused at import.
MINIMUM = (0, 10)
#: The newest (major, minor) JAX that hostfeed is tested with; newer imports with a warning.
NEWEST_TESTED = (0, 12)


def _tested_range() -> str:
    return f"{MINIMUM[0]}.{MINIMUM[1]}.0 through {NEWEST_TESTED[0]}.{NEWEST_TESTED[1]}.x"


def check_jax_version(version: str = jax.__version__) -> None:
    """Refuses a JAX older than hostfeed supports; warns about one newer than it was
    tested with.

    Raises:
      ImportError: ``version`` is older than 0.10, with the command that upgrades JAX.

    Warns:
      UserWarning: ``version`` is newer than the newest tested minor release (it may well
        work; the message says how to install a tested release if it does not).

    Example:
        >>> check_jax_version("0.10.2")
        >>> check_jax_version("0.12.0.1")
    """
    v = _version_tuple(version)[:2]
    lo, hi = MINIMUM, NEWEST_TESTED
    if v < lo:
        raise ImportError(
            f"hostfeed needs jax >= {lo[0]}.{lo[1]} (supported and tested: jax "
            f"{_tested_range()}); found jax {version}. Upgrade JAX with: "
            f"pip install -U 'jax>={lo[0]}.{lo[1]}' 'jaxlib>={lo[0]}.{lo[1]}'")
    if v > hi:
        warnings.warn(
            f"hostfeed was tested with jax {_tested_range()}; found jax {version}, which is "
            f"newer. It may well work. If it does not, install a tested release: "
            f"pip install 'jax>={lo[0]}.{lo[1]},<{hi[0]}.{hi[1] + 1}' "
            f"'jaxlib>={lo[0]}.{lo[1]},<{hi[0]}.{hi[1] + 1}'",
            UserWarning, stacklevel=2)


check_jax_version()

# ----------------------------------------------------------------------------------------
# Public homes, the same in every supported release.
from jax import ffi as _public_ffi  # noqa: E402
from jax.extend import core as _ext_core  # noqa: E402
from jax.interpreters import ad as _public_ad  # noqa: E402
from jax.interpreters import mlir  # noqa: E402
from jax.interpreters import partial_eval as _public_pe  # noqa: E402

Primitive = _ext_core.Primitive
Effect = _ext_core.Effect
DropVar = _ext_core.DropVar
Zero = _public_ad.Zero
is_undefined_primal = _public_ad.is_undefined_primal
float0 = jax.dtypes.float0
build_ffi_lowering_function = _public_ffi.build_ffi_lowering_function


def register_lowering(prim: Any, rule: Any, platform: str | None = None,
                      cacheable: bool = True) -> None:
    """``mlir.register_lowering``; ``cacheable=False`` (jax 0.10-0.12: lowered in place
    instead of as a cached function inlined into its caller) where JAX has the option."""
    if not cacheable:
        try:
            mlir.register_lowering(prim, rule, platform=platform, cacheable=False)
            _in_place.add(prim)
            _wrap_lower_per_platform()
            return
        except TypeError:  # a JAX without the option: its lowerings are all in place
            pass
    mlir.register_lowering(prim, rule, platform=platform)


# jax 0.10.2: a primitive lowered in place (cacheable=False) into a module for several
# platforms at once reaches `lower_per_platform` with `avals_out` as a tuple, which it
# concatenates to a list ("can only concatenate list (not "tuple") to list"). For
# hostfeed's primitives it gets a list, and the tokens it sets are passed back.
_in_place: set = set()


def _wrap_lower_per_platform() -> None:
    orig = getattr(_mlir_src, "lower_per_platform", None)
    if orig is None or getattr(orig, "_hostfeed", False):
        return

    def lower_per_platform(ctx: Any, *args: Any, **kwargs: Any) -> Any:
        if ctx.primitive not in _in_place or not isinstance(ctx.avals_out, tuple):
            return orig(ctx, *args, **kwargs)
        inner = ctx.replace(avals_out=list(ctx.avals_out))
        out = orig(inner, *args, **kwargs)
        if inner.tokens_out is not None:
            ctx.set_tokens_out(inner.tokens_out)
        return out

    lower_per_platform._hostfeed = True  # type: ignore[attr-defined]
    _mlir_src.lower_per_platform = lower_per_platform


def lower_fun(ctx: Any, fn: Callable, avals_in: Sequence[Any], avals_out: Sequence[Any],
              args: Sequence[Any], *, pass_tokens: bool = True) -> list:
    """``fn`` (a JAX function of several values returning a list) lowered inline in rule
    context ``ctx`` on operands of ``avals_in`` giving ``avals_out`` (``mlir.lower_fun`` on
    a context with those avals), passing the effect tokens on unless ``pass_tokens`` is
    False (``fn`` has no effect, and the rule sets the tokens out itself)."""
    sub_ctx = dataclasses.replace(ctx, avals_in=list(avals_in), avals_out=list(avals_out))
    outs = mlir.lower_fun(fn, multiple_results=True)(sub_ctx, *args)
    if pass_tokens:
        ctx.set_tokens_out(sub_ctx.tokens_out)
    return outs
# Sharding contexts a lowering rule can find itself in.
SPMDAxisContext = mlir.SPMDAxisContext
ShardingContext = mlir.ShardingContext
custom_partial_eval_rules = _public_pe.custom_partial_eval_rules
partial_eval_jaxpr_custom_rules = _public_pe.partial_eval_jaxpr_custom_rules

# ----------------------------------------------------------------------------------------
# No public home in the whole range: jax._src.
from jax._src import compiler as _compiler  # noqa: E402
from jax._src import config as _config  # noqa: E402
from jax._src import core as _core  # noqa: E402
from jax._src import dispatch as _dispatch  # noqa: E402
from jax._src import effects as _effects  # noqa: E402
from jax._src.interpreters import mlir as _mlir_src  # noqa: E402
from jax._src.interpreters import partial_eval as _pe_src  # noqa: E402

runtime_tokens = _dispatch.runtime_tokens  # the effect tokens JAX chains between computations
apply_primitive = _dispatch.apply_primitive
# versions.CHANGES["public_abstract_token"]: jax.ffi's from 0.11, jax._src.core's before.
abstract_token = getattr(_public_ffi, "abstract_token", None) or _core.abstract_token
enum_state = _config.enum_state
bool_state = _config.bool_state
no_effects = _core.no_effects
int_state = _config.int_state
ensure_enum = _pe_src.ensure_enum
RecomputeType = _pe_src.RecomputeType

EFFECT_SETS = (
    _effects.ordered_effects,
    _effects.lowerable_effects,
    _effects.control_flow_allowed_effects,
    _effects.shardable_ordered_effects,
    _effects.remat_allowed_effects,
    _effects.custom_derivatives_allowed_effects,
    # Partial evaluation (JaxprTrace) keeps a staged equation whose outputs are unused only
    # if its effect is here: a record's (a summary, a selected step) are often unused.
    _effects.partial_eval_kept_effects,
)
# What a partial-evaluation rule appends to `trace.effect_handles` to keep such a staged
# equation (JAX's cond rule does not), and the outputs of a ClosedJaxpr that partial
# evaluation with `unknowns` leaves unknown (both the same in 0.10.2-0.12).
EffectHandle = _pe_src.EffectHandle


def partial_eval_out_unknowns(jaxpr: Any, unknowns: Sequence[bool]) -> list[bool]:
    return list(_pe_src.partial_eval_jaxpr_nounits_fwd(jaxpr, unknowns, False)[2])


def is_tracer(x: object) -> bool:
    """Whether ``x`` is a JAX tracer (abstract value under a transformation)."""
    return isinstance(x, _core.Tracer)


def outer_trace(x: Any) -> tuple[Any, str]:
    """The outermost trace tracer ``x`` belongs to (a top-level ``jit``'s, through the
    ``vmap``/``grad``/nested ``jit`` traces inside it: each has a ``parent_trace``), and
    the function it traces (``"train_step at run.py:12"``, or '' when unknown)."""
    trace: Any = getattr(x, "_trace", None)
    while not isinstance(getattr(trace, "parent_trace", None), (type(None), _core.EvalTrace)):
        trace = trace.parent_trace
    info = getattr(getattr(trace, "frame", None), "debug_info", None)
    return trace, str(getattr(info, "func_src_info", "") or "")


# ----------------------------------------------------------------------------------------
# Differences between supported releases, each gated on the release that made it.

# Partitioners and shardings: compat/sharding.py.
from .sharding import (  # noqa: E402,F401
    _NESTED_SHARD_MAP_CONTEXT_OMITS_OUTER_AXES, _SET_SHARDING_TAKES_CTX, _SHARDY_ALWAYS,
    SHARDY_COMPILES_NESTED_MANUAL_TOKENS, manual_axes, manual_op_sharding, set_sharding,
    shardy_partitioner)

# `live_ins` (from 0.12): for each input Ref, whether its contents are read after the
# equation. hostfeed's primitives take no Refs, so its rules ignore it.
_DCE_RULES_TAKE_LIVE_INS = since("dce_rules_take_live_ins")
_dce_rules: dict[Any, Any] = _public_pe.dce_rules  # typed for one calling convention only
DCERule = Callable[[list, Any], tuple]


def register_dce_rule(primitive: Any, rule: DCERule) -> None:
    """Registers ``rule(used_outputs, eqn) -> (used_inputs, new_eqn)`` as the DCE rule of
    ``primitive``, in the calling convention of the installed JAX."""
    if _DCE_RULES_TAKE_LIVE_INS:
        def adapted(used_outs: list, live_ins: Any, eqn: Any) -> tuple:
            del live_ins
            return rule(used_outs, eqn)

        _dce_rules[primitive] = adapted
    else:
        _dce_rules[primitive] = rule


# ---- Batching of while loops whose predicate taps (rules._while_batching) ----------------
# JAX 0.10.2, 0.11.2 and 0.12.0.1 alike: `_while_lowering` (lax/control_flow/loops.py), for
# a cond function with an ordered effect, ORs a batched predicate into one and never
# selects per lane, so hostfeed batches such loops itself. It needs JAX's jaxpr batching:
# `batch_jaxpr` (never public) and `batch_jaxpr_axes` (public in jax.interpreters.batching
# from 0.11 only); same signatures in 0.10-0.12.
from jax._src.interpreters import batching as _batching  # noqa: E402

batch_jaxpr = _batching.batch_jaxpr
batch_jaxpr_axes = _batching.batch_jaxpr_axes


# ---- Typed PRNG keys (dtypes.py) ---------------------------------------------------------
_WRAP_KEY_DATA_TAKES_DTYPE = since("wrap_key_data_takes_dtype")
_wrap_key_data: Any = jax.random.wrap_key_data  # typed for one signature only


def wrap_key_data(data: Any, dtype: Any) -> Any:
    """Typed PRNG keys of key dtype ``dtype`` from their raw key data."""
    if _WRAP_KEY_DATA_TAKES_DTYPE:
        return _wrap_key_data(data, dtype=dtype)
    return _wrap_key_data(data, impl=dtype._impl)


# ---- Eager taps without a computation (primitives.outside_call, _tap_eager) -------------
# jax 0.10-0.12: `core.trace_ctx.trace` is the active trace; an `EvalTrace` means eager.
def eval_trace_active() -> bool:
    """Whether no transformation or trace is active (eager evaluation), i.e. a primitive
    bound now would run its evaluation rule."""
    return type(_core.trace_ctx.trace) is _core.EvalTrace


from jax._src import dtypes as _dtypes  # noqa: E402

canonicalize_value = _dtypes.canonicalize_value  # what `Primitive.bind` applies to operands


# ---- Eager loops and conditionals that tap (eager.py) -----------------------------------
# jax 0.10-0.12: outside jit, `while_p`, `cond_p` and `scan_p` run through their `impl`
# (`dispatch.apply_primitive`: compiled, dispatched, returned before they ran).
def install_eager_control_flow_hook(after: Callable[[Any, dict, Any], Any]) -> None:
    """Has eager ``lax.while_loop``, ``lax.cond`` and ``lax.scan`` (and what builds on
    them) return ``after(primitive, params, outputs)``."""
    from jax.extend.core import primitives as prims

    for p in (prims.while_p, prims.cond_p, prims.scan_p):
        impl = p.impl

        def hooked(*args: Any, _p: Any = p, _impl: Any = impl, **params: Any) -> Any:
            return after(_p, params, _impl(*args, **params))

        p.def_impl(hooked)


# ---- Tap outputs that depend on the tap (lowering) ---------------------------------------
# jax 0.10-0.12: StableHLO has no add-dependency; MHLO's (registered in JAX's MLIR
# context) converts to HLO's kAddDependency and accepts StableHLO's token type.
from jax._src.lib.mlir.dialects import mhlo as _mhlo  # noqa: E402


def add_dependency(value: Any, token: Any) -> Any:
    """``value``, made to depend on ``token`` in the HLO (XLA's ``kAddDependency``): a no-op
    that only orders; the result aliases ``value``'s buffer."""
    return _mhlo.AddDependencyOp(value, token, results=[value.type]).result


# jax 0.10-0.12: an aval's `memory_space` (`core.MemorySpace`) is `Host` for a value placed
# in host memory (a `pinned_host` or `unpinned_host` sharding); XLA:GPU's host offloading
# accepts such an entry parameter only through a few operations, kAddDependency not one.
def in_host_memory(aval: Any) -> bool:
    """Whether ``aval`` is a value in host memory (a ``pinned_host`` or ``unpinned_host``
    memory kind) in the computation being lowered."""
    return getattr(aval, "memory_space", None) is _core.MemorySpace.Host


# ---- Platform names (transports) ------------------------------------------------------------
# jax 0.10-0.12: a CUDA or ROCm device's `platform` and `jax.default_backend()` read "gpu";
# computations lower for "cuda" or "rocm" (`xla_bridge.canonicalize_platform`, which
# raises for an alias none of whose platforms has a backend here).
from jax._src import xla_bridge as _xla_bridge  # noqa: E402


def canonical_platform(platform: str) -> str:
    """The platform JAX lowers for, for a name a device or backend reports: ``"gpu"`` is
    ``"cuda"`` or ``"rocm"`` (whichever has a backend here); other names are themselves."""
    try:
        return _xla_bridge.canonicalize_platform(platform)
    except RuntimeError:
        return platform


def lowering_platforms(ctx: Any) -> Sequence[str]:
    """The platforms the rule context ``ctx`` lowers for (a branch of
    ``mlir.lower_per_platform`` sees its own; else the module's)."""
    return ctx.platforms or ctx.module_context.platforms


# The other transports' lowerings (a TPU's host transfers, JAX's own host callbacks) and
# many processes' client (split off by concern).
from .transfers import (  # noqa: E402,F401
    PYTHON_CALLBACK_PLATFORMS, add_host_transfer_callback, after_all, callback_op_sharding,
    distributed_client, emit_python_callback, jax_ordered_io_effect, partition_id,
    receive_from_host, require_devices_during_lowering, send_to_host, xla_shape)
# Re-evaluating a traced jaxpr (the recorder's hoisting of records into outputs).
from . import jaxprs  # noqa: E402,F401


def mesh_devices(mesh: Any) -> tuple | None:
    """The devices of a concrete mesh in row-major order (None for an abstract mesh or
    none). jax 0.10-0.12: reading ``AbstractMesh.devices`` raises ``ValueError``."""
    try:
        devices: Any = getattr(mesh, "devices", None)
    except ValueError:
        return None
    flat = getattr(devices, "flat", None)
    return tuple(flat) if flat is not None else None


# ---- Dispatch of computations that tap (pxla, dispatch) ---------------------------------
# jax 0.10.2-0.12: `MeshExecutable.create_cpp_call` (what `Compiled.__call__` uses, the
# ahead-of-time path) builds JAX's C++ fast path unless the executable has *unordered*
# effects or host callbacks, but never checks its *ordered* effects: the first call goes
# through Python and passes the runtime token, later calls take the C++ path without it
# ("Execution supplied 1 arguments but compiled program expected 2"). io_callback escapes
# this only because its executables also have host callbacks. Executables with ordered
# effects keep the Python path (with the token) on every call.
from jax._src.interpreters import pxla as _pxla  # noqa: E402


def _wrap_create_cpp_call() -> bool:
    cls = getattr(_pxla, "MeshExecutable", None)
    orig = getattr(cls, "create_cpp_call", None)
    if orig is None or getattr(orig, "_hostfeed", False):
        return orig is not None

    def create_cpp_call(self: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(getattr(self, "unsafe_call", None), "ordered_effects", None):
            return None  # Compiled.__call__ then calls through Python, tokens included
        return orig(self, *args, **kwargs)

    create_cpp_call._hostfeed = True  # type: ignore[attr-defined]
    create_cpp_call.__doc__ = orig.__doc__
    cls.create_cpp_call = create_cpp_call  # type: ignore[union-attr]
    return True


AOT_CALLS_KEEP_TOKENS = _wrap_create_cpp_call()


# jax 0.10.2-0.12: every dispatch of a computation with an ordered effect passes the
# effect's token from the previous one through `RuntimeTokenSet.get_token_input`, which
# `device_put`s it onto a fresh `NamedSharding(Mesh(devices))` each time, even when it
# already lies on exactly those devices, which is about half the Python dispatch of a small
# computation that taps. For hostfeed's effect, a token already on the
# executable's devices, in order, is passed as it is (the executable only reads its
# per-device buffers); any other case goes through JAX's own function.
def install_token_fast_path(effect_type: type) -> bool:
    """Makes JAX pass ``effect_type``'s runtime token on unchanged when it already lies on
    the dispatched computation's devices; returns whether JAX has the hook."""
    cls = getattr(_dispatch, "RuntimeTokenSet", None)
    orig = getattr(cls, "get_token_input", None)
    if orig is None:
        return False
    if getattr(orig, "_hostfeed", False):
        return True
    token_type = _core.Token

    def get_token_input(self: Any, eff: Any, devices: Any) -> Any:
        if type(eff) is effect_type:
            tok = self.current_tokens.get(eff)
            if type(tok) is token_type:
                assignment = getattr(getattr(tok._buf, "sharding", None),
                                     "_device_assignment", None)
                if assignment is not None and tuple(assignment) == tuple(devices):
                    return tok
        return orig(self, eff, devices)

    get_token_input._hostfeed = True  # type: ignore[attr-defined]
    get_token_input.__doc__ = orig.__doc__
    cls.get_token_input = get_token_input  # type: ignore[union-attr]
    return True


# jax 0.10.2-0.12: `RuntimeTokenSet` is a `threading.local`: each thread chains the effect
# tokens of its own computations, and `jax.effects_barrier()` waits for the calling
# thread's only. Every dispatch of a computation with an ordered effect ends with
# `runtime_tokens.set_token_result(effect, token)` (`pxla.ExecuteReplicated`).
def install_token_result_hook(effect_type: type, record: Callable[[Any], None]) -> bool:
    """Makes JAX call ``record(token)``, on the dispatching thread, with the token that
    every dispatched computation with an ``effect_type`` effect returns; returns whether
    JAX has the hook (installed once: a second call changes nothing)."""
    cls = getattr(_dispatch, "RuntimeTokenSet", None)
    orig = getattr(cls, "set_token_result", None)
    if orig is None:
        return False
    if getattr(orig, "_hostfeed", False):
        return True

    def set_token_result(self: Any, eff: Any, token: Any) -> None:
        orig(self, eff, token)
        if type(eff) is effect_type:
            record(token)

    set_token_result._hostfeed = True  # type: ignore[attr-defined]
    set_token_result.__doc__ = orig.__doc__
    cls.set_token_result = set_token_result  # type: ignore[union-attr]
    return True


# ---- Fast dispatch of computations that tap on one device (primitives.token_scope_p) ----
# jax 0.10.2-0.12: `pjit._get_fastpath_data` keeps every computation with an effect, ordered
# or not, off JAX's C++ dispatch path; each call of such a jitted function runs JAX's Python
# dispatch, which is most of the time of a small call that taps. The
# executable's effects are the ones `pxla._cached_lowering_to_hlo` reads off the jaxpr it
# lowers: it takes (jaxpr, module_name, backend, num_const_args, in_avals, [out_avals,]
# in_shardings, out_shardings, in_layouts, out_layouts, num_devices, device_assignment,
# ...) positionally (jax 0.11 added out_avals; 0.10.2 has none) and lowers a ClosedJaxpr
# in jax 0.10, a Jaxpr (constants inlined) in 0.11 and 0.12. A rewrite can hand it a jaxpr
# with the same inputs and outputs but fewer effects: hostfeed's taps nested in a
# token-creating scope.
_LOWERING_ARGS_HAVE_OUT_AVALS = since("lowering_to_hlo_takes_out_avals")
LoweringRewrite = Callable[[Any, int, Any], Any]
_lowering_rewrites: list[LoweringRewrite] = []


def install_lowering_rewrite(rewrite: LoweringRewrite) -> bool:
    """Makes JAX lower ``rewrite(jaxpr, num_devices, device_assignment)`` instead of a
    computation's top-level jaxpr where it returns one (None: lower it unchanged);
    ``device_assignment`` is the tuple of devices, or None where JAX does not pass it.
    Returns whether JAX has the hook."""
    orig: Any = getattr(_pxla, "_cached_lowering_to_hlo", None)
    if orig is None:
        return False
    _lowering_rewrites.append(rewrite)
    if getattr(orig, "_hostfeed", False):
        return True
    at = 10 if _LOWERING_ARGS_HAVE_OUT_AVALS else 9

    def cached_lowering_to_hlo(jaxpr: Any, *args: Any, **kwargs: Any) -> Any:
        if len(args) > at:
            num_devices, assignment = args[at - 1], args[at]
            if type(num_devices) is int and (assignment is None or type(assignment) is tuple):
                for rw in _lowering_rewrites:
                    new = rw(jaxpr, num_devices, assignment)
                    if new is not None:
                        jaxpr = new
                        break
        return orig(jaxpr, *args, **kwargs)

    cached_lowering_to_hlo._hostfeed = True  # type: ignore[attr-defined]
    pxla_module: Any = _pxla  # typed for JAX's own signature only
    pxla_module._cached_lowering_to_hlo = cached_lowering_to_hlo
    return True


# jax 0.10.2-0.12: `jax.effects_barrier()` is `dispatch.runtime_tokens.block_until_ready()`
# (`RuntimeTokenSet.block_until_ready`, also run by JAX at exit): it waits for the
# computations with effects that JAX's token chain covers.
def install_effects_barrier_hook(wait: Callable[[], None]) -> Callable[[], None]:
    """Makes ``jax.effects_barrier()`` (and JAX's own exit wait) also call ``wait()``
    before JAX's tokens; returns JAX's barrier without the hook (what hostfeed itself
    calls after its own waits)."""
    cls: Any = _dispatch.RuntimeTokenSet
    orig = cls.block_until_ready
    if getattr(orig, "_hostfeed", False):
        orig = orig._hostfeed_orig
    else:
        def block_until_ready(self: Any) -> None:
            wait()
            orig(self)

        block_until_ready._hostfeed = True  # type: ignore[attr-defined]
        block_until_ready._hostfeed_orig = orig  # type: ignore[attr-defined]
        block_until_ready.__doc__ = orig.__doc__
        cls.block_until_ready = block_until_ready
    tokens = runtime_tokens
    return lambda: orig(tokens)


# versions.CHANGES["no_closed_jaxpr"]: ClosedJaxprs in jax 0.10 and 0.11, gone in 0.12.
_ClosedJaxpr: Any = getattr(_core, "ClosedJaxpr", None)


def open_jaxpr(jaxpr: Any) -> tuple[Any, Callable[[Any], Any]]:
    """``jaxpr``'s Jaxpr and the function that turns a Jaxpr with the same constvars back
    into what ``jaxpr`` was (a ClosedJaxpr with its constants, or a Jaxpr)."""
    if _ClosedJaxpr is not None and isinstance(jaxpr, _ClosedJaxpr):
        return jaxpr.jaxpr, lambda new: jaxpr.replace(jaxpr=new)
    return jaxpr, lambda new: new


def param_jaxpr(jaxpr: Any) -> Any:
    """A Jaxpr without constvars as an equation parameter (a ClosedJaxpr before 0.12)."""
    return _ClosedJaxpr(jaxpr, ()) if _ClosedJaxpr is not None else jaxpr


Var = _core.Var
new_jaxpr_eqn = _core.new_jaxpr_eqn
convert_constvars_jaxpr = _pe_src.convert_constvars_jaxpr
ordered_effects = _effects.ordered_effects
TokenSet = _mlir_src.TokenSet
create_token = _mlir_src.create_token


def lower_jaxpr_inline(ctx: Any, jaxpr: Any, tokens: Any, *args: Any) -> tuple:
    """Lowers ``jaxpr`` (a Jaxpr without constvars) in place where the lowering rule of
    context ``ctx`` runs, with the effect tokens ``tokens`` (a TokenSet); returns (its
    results, the tokens after it). Same `jaxpr_subcomp` signature in 0.10.2-0.12."""
    return _mlir_src.jaxpr_subcomp(
        ctx.module_context, jaxpr, ctx.name_stack, tokens, [], *args,
        dim_var_values=ctx.dim_var_values, const_lowering=ctx.const_lowering,
        outer_traceback=None)


def lowering_memo(ctx: Any) -> dict:
    """A dict that lives exactly as long as the lowering of the module that rule context
    ``ctx`` lowers into, for what one rule keeps for the next (no MLIR object may go into
    it: JAX may lower a region as a function of its own and drop it). jax 0.10-0.12: the
    module context's ``cached_primitive_lowerings``, one dict per module lowered, which the
    module contexts JAX derives for manual regions and per-platform branches share, and
    which JAX only reads and writes by its own keys (hostfeed's keys are of its own types).
    A context without one (a stand-in, or a JAX that drops it): a new dict each time, so
    that nothing is kept, not kept wrongly.

    Example:
        >>> class Ctx: pass
        >>> lowering_memo(Ctx()) is lowering_memo(Ctx())
        False
    """
    memo = getattr(getattr(ctx, "module_context", None), "cached_primitive_lowerings", None)
    return memo if isinstance(memo, dict) else {}


# ---- Host callbacks on the profiler's timeline (the dispatcher) --------------------
# jax 0.10-0.12: `jax.profiler.TraceAnnotation` is this TraceMe; its static `is_enabled()`
# (about 16 ns) says whether a trace is being collected (jax.profiler.start_trace, or a
# profiler server's capture), so callbacks pay for events only while tracing.
from jax._src.lib import _profiler as _profiler_lib  # noqa: E402

TraceMe = _profiler_lib.TraceMe
host_tracing = _profiler_lib.TraceMe.is_enabled


# ---- Compile failures of computations that tap (compiler) --------------------------------
# jax 0.10-0.12: `compiler.compile_or_get_cached(backend, computation, ...)` compiles every
# jitted computation (pxla calls it through the module attribute) with the `ir.Module`
# that the lowering rules built. A failure of one that holds hostfeed's operations gets a
# note naming the platform and the operations, so that a platform or JAX release that no
# longer accepts hostfeed's lowering says so at the first use.
_lowered_here: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def note_lowered(ctx: Any, what: str) -> None:
    """Notes that the module ``ctx`` lowers holds hostfeed's ``what`` (named in a note if
    its compilation fails)."""
    _lowered_here.setdefault(ctx.module_context.module, set()).add(what)


def compile_failure_note(module: Any, platform: str) -> str | None:
    """The note a compile failure of ``module`` on ``platform`` gets (None: it holds none
    of hostfeed's operations)."""
    ops = _lowered_here.get(module)
    if not ops:
        return None
    return (f"hostfeed: the computation that failed to compile for {platform} holds "
            f"hostfeed's {', '.join(sorted(ops))} (jax {jax.__version__}); if the error is "
            f"about those operations, this platform or JAX release does not accept hostfeed's "
            f"lowering of them: please report it with this message, and meanwhile run the "
            f"computation on another platform, e.g. under jax.default_device(jax.devices("
            f"'cpu')[0]).")


def _wrap_compile() -> bool:
    orig = getattr(_compiler, "compile_or_get_cached", None)
    if orig is None or getattr(orig, "_hostfeed", False):
        return orig is not None

    def compile_or_get_cached(backend: Any, computation: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return orig(backend, computation, *args, **kwargs)
        except Exception as exc:
            note = compile_failure_note(computation, getattr(backend, "platform", "?"))
            if note is not None:
                exc.add_note(note)
            raise

    compile_or_get_cached._hostfeed = True  # type: ignore[attr-defined]
    _compiler.compile_or_get_cached = compile_or_get_cached
    return True


COMPILE_FAILURES_NAMED = _wrap_compile()
