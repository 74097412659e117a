"""Which JAX release changed what: the one table (:data:`CHANGES`) of the differences
between the JAX releases hostfeed supports that it tells apart, each with the first release
that has it and the gate in ``compat`` that reads it.

Most gates read the version (:func:`since`). A few look at JAX itself instead (an attribute
that appeared or went), which a build of any version answers correctly; their entries
carry that look (``probe``), and the tests check that it agrees with the table on the
installed JAX (tests/python/test_compat.py), so the table stays true for them too.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple, Optional

import jax


def _version_tuple(text: str) -> tuple[int, ...]:
    """The leading numeric release parts of a version string.

    Example:
        >>> _version_tuple("0.12.0.1"), _version_tuple("0.13.0.dev20270101")
        ((0, 12, 0, 1), (0, 13, 0))
    """
    parts = []
    for piece in text.split("."):
        digits = ""
        for ch in piece:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            break
        parts.append(int(digits))
        if digits != piece:
            break
    return tuple(parts)


#: The installed JAX as a tuple, e.g. ``(0, 12, 0, 1)``; :func:`since` compares it.
JAX_VERSION = _version_tuple(jax.__version__)


class Change(NamedTuple):
    """One difference between supported JAX releases."""

    #: The first release with the new behaviour (older supported ones have the old).
    since: tuple[int, ...]
    #: What changed, and the gate in ``compat`` that follows it.
    what: str
    #: Where the gate looks at JAX rather than its version: that look (True: the new
    #: behaviour), which the tests check against ``since``.
    probe: Optional[Callable[[], bool]] = None
    #: False for a change recorded without a gate: hostfeed's code is the same on both
    #: sides of it (its ``what`` says where that code is), and its ``probe`` checks the
    #: table.
    gated: bool = True


def _has(module: str, name: str) -> Callable[[], bool]:
    def probe() -> bool:
        import importlib
        return hasattr(importlib.import_module(module), name)
    return probe


def _scan_has_ft_in() -> bool:
    scan = jax.make_jaxpr(lambda x: jax.lax.scan(lambda c, _: (c, None), x, None, length=1))
    return "ft_in" in scan(0.0).eqns[0].params


def _inlines_late() -> bool:
    from jax._src import core
    return hasattr(getattr(core, "Inline", None), "JAX_LATE")


#: Every difference between the supported JAX releases that hostfeed tells apart, by name.
CHANGES: dict[str, Change] = {
    "set_sharding_takes_ctx": Change(
        (0, 10, 1), "mlir.set_sharding(ctx, op, sharding), the ModuleContext first; 0.10.0: "
        "set_sharding(op, sharding) (compat.set_sharding)"),
    "wrap_key_data_takes_dtype": Change(
        (0, 10, 1), "jax.random.wrap_key_data(data, dtype=...); 0.10.0 takes the key "
        "implementation (impl=) only, which a key dtype carries as _impl "
        "(compat.wrap_key_data)"),
    "nested_shard_map_names_outer_axes": Change(
        (0, 10, 2), "the lowering context of a shard_map nested in a manual region names the "
        "outer manual axes too; 0.10.0 and 0.10.1 name the nested one's only, the outer "
        "ones being its abstract mesh's manual axes (compat.manual_axes)"),
    "python_callbacks_on_oneapi": Change(
        (0, 11), "JAX's host callbacks (so the portable transport) run on Intel GPUs, "
        "'oneapi' (compat.PYTHON_CALLBACK_PLATFORMS)"),
    "lowering_to_hlo_takes_out_avals": Change(
        (0, 11), "pxla._cached_lowering_to_hlo takes out_avals after in_avals, and lowers a "
        "Jaxpr (0.10: a ClosedJaxpr) (compat.install_lowering_rewrite)"),
    "public_abstract_token": Change(
        (0, 11), "jax.ffi.abstract_token; 0.10 has it in jax._src.core only "
        "(compat.abstract_token)", _has("jax.ffi", "abstract_token")),
    "shardy_compiles_nested_manual_tokens": Change(
        (0, 11, 2), "XLA compiles a token-carrying manual region nested in a partially "
        "manual shard_map under Shardy; jaxlib 0.10.0-0.11.1 abort the process (a CHECK in "
        "shape.h), so hostfeed refuses it there (compat.SHARDY_COMPILES_NESTED_MANUAL_TOKENS)"),
    "scan_packs_operand_groups": Change(
        (0, 11), "a scan equation's operand groups packed in its ft_in parameter; 0.10: "
        "num_consts and num_carry (compat.jaxprs.scan_groups)", _scan_has_ft_in),
    "dce_rules_take_live_ins": Change(
        (0, 12), "DCE rules are called rule(used_outs, live_ins, eqn); 0.10 and 0.11 call "
        "rule(used_outs, eqn) (compat.register_dce_rule)"),
    "lowering_inlines_cloned_functions": Change(
        (0, 12, 1), "a cacheable primitive's lowering (lax.cond's among them) is emitted as a "
        "function of its own, outside any module, then inlined into the caller by cloning "
        "(core.Inline.JAX_LATE in mlir._emit_lowering_rule_as_fun); 0.12.0.1 and before "
        "emit it in the module or in place. Operations a rule meets may belong to such a "
        "function and be dropped once cloned, so hostfeed keeps none past the rule "
        "(lowering._depend_later_uses; no gate: the same code runs on every release)",
        _inlines_late, gated=False),
    "shardy_always": Change(
        (0, 12, 1), "Shardy always partitions: jax_use_shardy_partitioner is deprecated and "
        "ignored, and mlir.set_sharding takes Shardy shardings only; 0.12.0.1 and before "
        "also run GSPMD when the flag is off (compat.shardy_partitioner)"),
    "no_closed_jaxpr": Change(
        (0, 12), "core.ClosedJaxpr is gone, jaxprs hold their constants as literals; 0.10 "
        "and 0.11 keep ClosedJaxprs in equation parameters (compat.open_jaxpr, "
        "compat.param_jaxpr)", lambda: not _has("jax._src.core", "ClosedJaxpr")()),
}


def since(name: str) -> bool:
    """Whether the installed JAX has change ``name`` of :data:`CHANGES` (by its version).

    Example:
        >>> since("dce_rules_take_live_ins") == (JAX_VERSION >= (0, 12))
        True
    """
    return CHANGES[name].since <= JAX_VERSION
