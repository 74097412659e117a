"""The JAX internals that re-evaluating a traced function's jaxpr needs (the recorder's
hoisting of records into outputs, :mod:`hostfeed._src.record.hoist`): the other half of
:mod:`hostfeed._src.compat` (which re-exports every name here), split off by concern.
Imported only by that package's ``__init__``.

jax 0.10-0.12 evaluate an equation as ``core.eval_jaxpr`` does: ``primitive.get_bind_params``,
then ``bind`` inside the equation's source-info and context managers. jax 0.12 dropped
``ClosedJaxpr`` (a ``Jaxpr`` holds its constants: ``.consts``, ``.jaxpr`` is itself);
jax 0.11 packs a scan's operand groups into ``ft_in`` (0.10: ``num_consts``/``num_carry``).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Optional

import jax
from jax._src import core as _core
from jax._src import source_info_util as _source_info

#: Call-like primitives whose body takes the equation's operands and gives its results
#: unchanged (nested jit, closed calls, remat, custom derivatives already applied): such a
#: body can be evaluated in place of the equation. Names across jax 0.10-0.12.
CALL_LIKE = frozenset({"pjit", "jit", "closed_call", "core_call", "remat", "remat2",
                       "checkpoint", "custom_jvp_call", "custom_vjp_call",
                       "custom_vjp_call_jaxpr", "xla_metadata_call"})
#: The parameter that holds a call-like primitive's body.
_BODY_PARAMS = ("jaxpr", "call_jaxpr", "fun_jaxpr")


def traced(fn: Callable, *args: Any) -> tuple[Any, list, Any]:
    """``fn`` traced at ``args``' abstract values: (its Jaxpr, the constants its constvars
    take, the pytree of ``jax.ShapeDtypeStruct`` it returns)."""
    closed, shape = jax.make_jaxpr(fn, return_shape=True)(*args)
    jaxpr, consts = body(closed)
    return jaxpr, consts, shape


def body(jaxpr: Any) -> tuple[Any, list]:
    """A (closed) jaxpr as an open Jaxpr and the constants of its constvars."""
    return getattr(jaxpr, "jaxpr", jaxpr), list(getattr(jaxpr, "consts", ()))


def is_literal(atom: Any) -> bool:
    """Whether a jaxpr atom is a literal (read its ``.val``) rather than a variable."""
    return isinstance(atom, _core.Literal)


def bind_eqn(eqn: Any, invals: Sequence[Any]) -> list:
    """Evaluates equation ``eqn`` on ``invals`` (binding its primitive in the current trace,
    with its source information), as ``core.eval_jaxpr`` does; always a list."""
    bind_params = eqn.primitive.get_bind_params(eqn.params)
    name_stack = _source_info.current_name_stack() + eqn.source_info.name_stack
    with _source_info.user_context(eqn.source_info.traceback, name_stack=name_stack), \
            eqn.ctx.manager:
        ans = eqn.primitive.bind(*invals, **bind_params)
    return list(ans) if eqn.primitive.multiple_results else [ans]


def sub_jaxprs(params: dict) -> list:
    """The jaxprs among an equation's parameters (bodies, branches), open."""
    return [body(j)[0] for j in _core.jaxprs_in_params(params)]


def call_body(eqn: Any) -> tuple[Any, list] | None:
    """The body (open jaxpr, constants) of a call-like equation whose body takes its operands
    and gives its results as they are; None for any other equation."""
    if eqn.primitive.name not in CALL_LIKE:
        return None
    for key in _BODY_PARAMS:
        if key in eqn.params:
            jaxpr, consts = body(eqn.params[key])
            if len(jaxpr.invars) != len(eqn.invars) or len(jaxpr.outvars) != len(eqn.outvars):
                return None
            same = all(getattr(v.aval, "shape", None) == getattr(w.aval, "shape", None)
                       for v, w in zip(jaxpr.invars, eqn.invars))
            return (jaxpr, consts) if same else None
    return None


def scan_groups(params: dict, operands: Sequence[Any]) -> tuple[list, list, list]:
    """A scan equation's operands as (constants, carry, xs)."""
    if "ft_in" in params:  # jax 0.11+ (versions.CHANGES["scan_packs_operand_groups"])
        consts, carry, xs = params["ft_in"].update(list(operands)).unpack()
        return list(consts), list(carry), list(xs)
    nc, nk = params["num_consts"], params["num_carry"]
    return list(operands[:nc]), list(operands[nc:nc + nk]), list(operands[nc + nk:])


def scan_body(params: dict) -> tuple[Any, list]:
    """A scan equation's body (open jaxpr, constants): (consts, carry, x) -> (carry, y)."""
    return body(params["jaxpr"])


def cond_branches(params: dict) -> list[tuple[Any, list]]:
    """A cond equation's branches (open jaxpr, constants each), by index."""
    return [body(b) for b in params["branches"]]


def platform_branch(params: dict, platform: str) -> Optional[int]:
    """For a cond of :func:`jax.lax.platform_dependent` (its index is the platform lowered
    for, its ``branches_platforms`` say which branch serves which platforms, None for the
    default one): the index of the branch ``platform`` takes; None for any other cond.

    Example:
        >>> platform_branch({"branches_platforms": (("tpu",), None)}, "cpu")
        1
        >>> platform_branch({}, "cpu") is None
        True
    """
    platforms = params.get("branches_platforms")
    if platforms is None:
        return None
    for i, ps in enumerate(platforms):
        if ps is None or platform in ps:
            return i
    return None
