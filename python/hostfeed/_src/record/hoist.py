"""Records hoisted out of a computation into its outputs.

A recorded step (:class:`hostfeed._src.record.step.RecordedStep`) traces the user's
function to a jaxpr, then evaluates that jaxpr again inside its own ``jit`` with this
module's interpreter: every equation is bound as it was, except a record's
(``outside_call_p`` with a recorder's target), whose operands are *collected* instead of
sent to the host, and which is the identity, as it always is. The collected values become
extra outputs of the computation; the host copies them when the step has been dispatched,
overlapping the next steps, and appends their rows to the recorder.

Where a record sits decides how it is collected:

- at the top, or in a call-like body (nested ``jit``, ``checkpoint``, custom derivatives
  after differentiation): as it is (a body holding a record is evaluated in place of its
  call);
- in a ``scan`` (``fori_loop`` with static bounds): the scan is rebuilt with ``lax.scan``,
  its body collecting too, and the collected values come out stacked, one per iteration;
- in a ``cond`` of :func:`jax.lax.platform_dependent`: its branch for the platform the
  step runs on, evaluated in place;
- in a ``cond`` (``every=``, ``start=``, ``stop=`` are one): the cond is rebuilt with
  ``lax.switch``; every branch gives every branch's collected values (zeros where it did
  not record) and a flag per record saying whether it ran;
- anywhere else (a ``while_loop``, ``shard_map``, ``pmap``): not collected; the record
  stays in the computation and reaches the recorder the way it always does.

The structure of what was collected is static (:class:`Site`, :class:`Loop`): it travels
as the auxiliary data of the :class:`Collected` pytree the computation returns, so the
host reads it from the outputs of every call without tracing again.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple, Optional, Union

import jax
import jax.numpy as jnp
from jax import lax

from .. import compat
from ..primitives import is_record, outside_call_p

__all__ = ["Site", "Loop", "Collected", "evaluate", "holds_records", "order"]


class Site(NamedTuple):
    """One record equation: its callback (a ``RecordSpec``), its transforms, how many
    operands it sends, and whether each instance carries a flag (inside a cond: it may not
    have run). Its arrays: the flag (bool, if flagged), then the operands. ``selection``:
    for a record of ``every=``/``start=``/``stop=`` at the computation's top whose step is
    an argument, ``(the argument's index among the flat arguments, every, start, stop)``:
    when that argument is a host value, the host knows the flag without fetching it."""
    callback: Any
    transforms: tuple
    operands: int
    flagged: bool
    selection: Any = None


class Loop(NamedTuple):
    """A scan that collected: its length and direction, and what its body collected (each
    array stacked along a new leading axis, one entry per iteration)."""
    length: int
    reverse: bool
    children: tuple


Node = Union[Site, Loop]


class Collected:
    """What a computation collected: the static nodes and their arrays, flat in node order.
    A pytree whose auxiliary data is the nodes (so jit returns them with every call)."""

    __slots__ = ("nodes", "arrays")

    def __init__(self, nodes: tuple, arrays: Sequence[Any]):
        self.nodes = tuple(nodes)
        self.arrays = list(arrays)

    def __repr__(self) -> str:
        return f"Collected({len(self.nodes)} nodes, {len(self.arrays)} arrays)"


jax.tree_util.register_pytree_node(
    Collected, lambda c: (c.arrays, c.nodes), lambda nodes, arrays: Collected(nodes, arrays))


def collectable(eqn: Any) -> bool:
    """Whether ``eqn`` is a recorder's record that can be collected (not a synchronous one,
    not one the global-view lowering already split into parts)."""
    if eqn.primitive is not outside_call_p:
        return False
    params = eqn.params
    return (is_record(params["callback"]) and not params.get("sync")
            and params.get("shard_parts") is None)


_holds: dict[int, tuple[Any, bool]] = {}


def holds_records(jaxpr: Any) -> bool:
    """Whether ``jaxpr`` (open) has a record equation, at any depth."""
    hit = _holds.get(id(jaxpr))
    if hit is not None and hit[0] is jaxpr:
        return hit[1]
    found = any(collectable(e) or any(holds_records(j) for j in compat.jaxprs.sub_jaxprs(e.params))
                for e in jaxpr.eqns)
    if len(_holds) > 4096:
        _holds.clear()
    _holds[id(jaxpr)] = (jaxpr, found)
    return found


class _Collector:
    def __init__(self, origins: Optional[dict] = None, platform: str = "") -> None:
        # the platform the computation runs on (a cond of platform_dependent takes its
        # branch)
        self.platform = platform
        self.nodes: list[Node] = []
        self.arrays: list[Any] = []
        # id(value) -> (value, index of the flat argument it is, maybe converted)
        self.origins: dict[int, tuple[Any, int]] = {} if origins is None else origins
        # selections of records whose step is an argument, in the order met; the host's
        # outcome of some (see `evaluate`)
        self.met: list[tuple] = []
        self.choices: tuple = ()

    def origin(self, value: Any) -> Optional[int]:
        """The index of the flat argument ``value`` is (maybe converted), if it is one."""
        hit = self.origins.get(id(value))
        return hit[1] if hit is not None and hit[0] is value else None

    def site(self, eqn: Any, operands: Sequence[Any]) -> None:
        params = eqn.params
        self.nodes.append(Site(params["callback"], params["transforms"], len(operands), False))
        self.arrays.extend(_strong(x) for x in operands)


def _strong(x: Any) -> Any:
    """``x`` without a weak type (a branch's outputs must have the same types in each)."""
    x = jnp.asarray(x)
    return lax.convert_element_type(x, x.dtype) if getattr(x, "weak_type", False) else x


def evaluate(jaxpr: Any, consts: Sequence[Any], args: Sequence[Any], platform: str,
             choices: Optional[tuple] = None) -> tuple[list, tuple, list, tuple]:
    """Evaluates ``jaxpr`` on ``args`` in the current trace, for a computation that runs on
    ``platform``, collecting its records: (its results, the collected nodes, their arrays,
    the selections met). ``choices``: for each selection met (in order),
    ``(selection, outcome)`` as the host decided it (None: not decided), from the
    selections an earlier evaluation met: a cond whose outcome is decided is replaced by
    the chosen branch."""
    c = _Collector({id(a): (a, i) for i, a in enumerate(args)}, platform)
    c.choices = choices or ()
    outs = _eval(jaxpr, consts, args, c)
    return outs, tuple(c.nodes), c.arrays, tuple(c.met)


def _eval(jaxpr: Any, consts: Sequence[Any], args: Sequence[Any], c: _Collector) -> list:
    env: dict[Any, Any] = {}

    def read(v: Any) -> Any:
        return v.val if compat.jaxprs.is_literal(v) else env[v]

    env.update(zip(jaxpr.constvars, consts))
    env.update(zip(jaxpr.invars, args))
    for eqn in jaxpr.eqns:
        invals = [read(v) for v in eqn.invars]
        outvals = _eval_eqn(eqn, invals, c)
        for v, x in zip(eqn.outvars, outvals):
            if not isinstance(v, compat.DropVar):
                env[v] = x
    return [read(v) for v in jaxpr.outvars]


def _eval_eqn(eqn: Any, invals: list, c: _Collector) -> list:
    if collectable(eqn):
        c.site(eqn, invals[:eqn.params["nr_tapped_args"]])
        return invals  # the identity on every operand
    subs = compat.jaxprs.sub_jaxprs(eqn.params)
    if not subs or not any(holds_records(j) for j in subs):
        outvals = compat.jaxprs.bind_eqn(eqn, invals)
        if eqn.primitive.name == "convert_element_type" and invals:
            at = c.origin(invals[0])
            if at is not None:  # an argument converted (jnp.asarray(step, jnp.int32))
                c.origins[id(outvals[0])] = (outvals[0], at)
        return outvals
    name = eqn.primitive.name
    if name == "scan":
        return _scan(eqn, invals, c)
    if name == "cond":
        return _cond(eqn, invals, c)
    called = compat.jaxprs.call_body(eqn)
    if called is not None:
        return _eval(called[0], called[1], invals, c)
    # A while loop, shard_map, pmap...: its records stay in the computation.
    return compat.jaxprs.bind_eqn(eqn, invals)


def _scan(eqn: Any, invals: list, c: _Collector) -> list:
    params = eqn.params
    consts, carry, xs = compat.jaxprs.scan_groups(params, invals)
    body, body_consts = compat.jaxprs.scan_body(params)
    inner = _Collector(platform=c.platform)
    ncarry = len(carry)

    def step(k: list, x: list) -> tuple:
        inner.nodes, inner.arrays = [], []
        outs = _eval(body, body_consts, [*consts, *k, *x], inner)
        return outs[:ncarry], (outs[ncarry:], inner.arrays)

    scanned: Any = lax.scan(step, carry, xs, length=params["length"],
                            reverse=params["reverse"], unroll=params.get("unroll", 1))
    new_carry, (ys, stacked) = scanned
    c.nodes.append(Loop(int(params["length"]), bool(params["reverse"]), tuple(inner.nodes)))
    c.arrays.extend(stacked)
    return [*new_carry, *ys]


def _flagged(nodes: Sequence[Node], arrays: Sequence[Any], lead: tuple = ()
             ) -> tuple[list[Node], list]:
    """Every site of ``nodes`` with a flag: a site that had none gets a true one (of the
    stacked shape ``lead`` of its loops)."""
    out_nodes: list[Node] = []
    out: list = []
    it = iter(arrays)
    for node in nodes:
        if isinstance(node, Loop):
            inner = [next(it) for _ in range(_count(node))]
            n, a = _flagged(node.children, inner, (*lead, node.length))
            out_nodes.append(node._replace(children=tuple(n)))
            out.extend(a)
        else:
            out.append(next(it) if node.flagged else jnp.ones(lead, bool))
            out.extend(next(it) for _ in range(node.operands))
            out_nodes.append(node._replace(flagged=True))
    return out_nodes, out


def _count(node: Node) -> int:
    """How many arrays a node holds."""
    if isinstance(node, Loop):
        return sum(_count(n) for n in node.children)
    return node.operands + int(node.flagged)


def _cond(eqn: Any, invals: list, c: _Collector) -> list:
    index, ops = invals[0], invals[1:]
    branches = compat.jaxprs.cond_branches(eqn.params)
    chosen = compat.jaxprs.platform_branch(eqn.params, c.platform)
    if chosen is not None:
        # A choice by platform (a summary's, Recorder.record with reduce= and every=): the
        # branch of the platform this step runs on, evaluated in place. Either branch
        # records the same rows; as outputs, none of them is a host transfer.
        body, consts = branches[chosen]
        return _eval(body, consts, ops, c)
    selections = [s for s in (_host_selection(b, ops, c) for b, _ in branches)
                  if s is not None]
    if selections and c.origins is not None and len(branches) == 2:
        k = len(c.met)
        c.met.append(selections[0])
        if k < len(c.choices) and c.choices[k][0] == selections[0] \
                and c.choices[k][1] is not None:
            # The host decided this step's selection: only the chosen branch (the
            # second, for a true predicate) is in the computation.
            body, consts = branches[1 if c.choices[k][1] else 0]
            return _eval(body, consts, ops, c)
    # What each branch collects (nodes, and the arrays' types), traced once to know it.
    shapes: list[tuple[list[Node], Any]] = []
    for body, consts in branches:
        probe = _Collector(c.origins, c.platform)

        def run(*o: Any, body: Any = body, consts: Any = consts, probe: Any = probe) -> Any:
            _eval(body, consts, list(o), probe)
            return _flagged(probe.nodes, probe.arrays)[1]

        arrays = jax.eval_shape(run, *ops)
        nodes = _flagged(probe.nodes, [None] * len(probe.arrays))[0]
        selection = _host_selection(body, ops, c)
        if selection is not None:
            nodes = [n._replace(selection=selection) if isinstance(n, Site) else n
                     for n in nodes]
        shapes.append((nodes, arrays))

    def branch(i: int) -> Any:
        body, consts = branches[i]

        def run(*o: Any) -> tuple:
            inner = _Collector(platform=c.platform)
            outs = _eval(body, consts, list(o), inner)
            mine = _flagged(inner.nodes, inner.arrays)[1]
            out: list = []
            for j, (_, arrays) in enumerate(shapes):
                out.extend(mine if j == i else
                           [jnp.zeros(a.shape, a.dtype) for a in arrays])
            return outs, out

        return run

    outs, collected = lax.switch(index, [branch(i) for i in range(len(branches))], *ops)
    for nodes, _ in shapes:
        c.nodes.extend(nodes)
    c.arrays.extend(collected)
    return list(outs)


def _host_selection(body: Any, ops: Sequence[Any], c: _Collector) -> Optional[tuple]:
    """For a branch that records at the steps ``every=``/``start=``/``stop=`` select (it
    passes its step through ``selected_step_p``), whose step operand is an argument of the
    computation: (that argument's flat index, every, start, stop)."""
    invars = list(body.invars)
    for eqn in body.eqns:
        if eqn.primitive.name != "hostfeed_selected_step" or not eqn.params.get("selection"):
            continue
        var = eqn.invars[0]
        if compat.jaxprs.is_literal(var) or var not in invars:
            return None
        at = c.origin(ops[invars.index(var)])
        return None if at is None else (at, *eqn.params["selection"])
    return None


def order(nodes: Sequence[Node], prefix: tuple = ()) -> Iterator[tuple[int, Site, tuple]]:
    """The record instances of ``nodes`` in program order: (the index of the site's first
    array in the flat list, the site, its index into the stacked arrays)."""
    yield from _order(nodes, prefix, [0])


def _order(nodes: Sequence[Node], prefix: tuple, at: list) -> Iterator[tuple[int, Site, tuple]]:
    for node in nodes:
        if isinstance(node, Loop):
            start = at[0]
            steps = range(node.length - 1, -1, -1) if node.reverse else range(node.length)
            for t in steps:
                at[0] = start
                yield from _order(node.children, (*prefix, t), at)
            at[0] = start + _count(node)
        else:
            yield at[0], node, prefix
            at[0] += _count(node)


def site_arrays(nodes: Sequence[Node]) -> tuple[list[int], list[int]]:
    """The flat indices of the arrays every call needs (operands of sites without a flag),
    and of the flags."""
    always: list[int] = []
    flags: list[int] = []
    at = 0
    for node in nodes:
        if isinstance(node, Loop):
            a, f = site_arrays(node.children)
            always += [at + i for i in a]
            flags += [at + i for i in f]
        elif node.flagged:
            flags.append(at)
        else:
            always += list(range(at, at + node.operands))
        at += _count(node)
    return always, flags

