"""Capturing an Equinox model's submodules. Equinox modules are pytrees, so a capture is a
copy of the model in which each selected submodule is wrapped in :class:`Captured`, a
module that records around the call of the one it holds. Names are the submodules' pytree
paths (``blocks.3.mlp`` for ``model.blocks[3].mlp``).

The wrapper holds the capture in static fields, the step included (a Python int as it is,
an array or a tracer in a box hashed by identity): the wrapper adds no leaf to the model,
so the captured model goes through ``eqx.filter_jit``, ``jax.jit``, ``vmap`` and ``grad``
like the original, and a layer stack made by ``eqx.filter_vmap`` keeps only stacked
arrays, for ``lax.scan`` over ``eqx.partition(layers, eqx.is_array)`` (one row per layer
and call). It reads every other attribute from the module it wraps. A captured model captured again
keeps its wrappers (names do not change) and wraps the newly selected modules once more.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax

from .calls import CaptureSpec
from .selection import Selector, name_of

__all__ = ["capture", "Captured", "SEP"]

#: The pytree path separator in hostfeed's names (``blocks.3.mlp``).
SEP = "."


class StepBox:
    """A capture's step that is an array (a tracer, usually), in a static field: hashed by
    identity, so that it is no leaf of the model (see the module's docstring)."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value

    def __repr__(self) -> str:
        return f"StepBox({self.value!r})"


def boxed(step: Any) -> Any:
    """``step`` as a static field holds it: a Python int (or None) as it is, else boxed.

    Example:
        >>> boxed(3), boxed(None), type(boxed(jax.numpy.int32(3))).__name__
        (3, None, 'StepBox')
    """
    if step is None or (isinstance(step, int) and not isinstance(step, bool)):
        return step
    return step if isinstance(step, StepBox) else StepBox(step)


class Captured(eqx.Module):
    """An Equinox submodule ``module`` whose calls record (``spec``) under ``name``."""

    module: Any
    step: Any = eqx.field(static=True)  # None, an int or a StepBox (see boxed)
    name: str = eqx.field(static=True)
    spec: CaptureSpec = eqx.field(static=True)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        step = self.step.value if isinstance(self.step, StepBox) else self.step
        return self.spec.call(self.name, step, self.module, args, kwargs)

    def __getattr__(self, item: str) -> Any:
        # Only for attributes the wrapper lacks: the wrapped module's (a field, a method).
        if item.startswith("__") or item in ("module", "step", "name", "spec"):
            raise AttributeError(item)
        return getattr(self.module, item)


def _is_sub(root: Any) -> Callable[[Any], bool]:
    return lambda x: x is not root and isinstance(x, eqx.Module)


def _callable_module(m: Any) -> bool:
    return any("__call__" in vars(k) for k in type(m).__mro__
               if k not in (object, eqx.Module))


def _walk(node: Any, path: tuple, visit: Callable[[tuple, Any], Any]) -> Any:
    """Rebuilds ``node`` bottom-up: each submodule found under it (at any depth of lists,
    tuples, dicts and fields) is rebuilt, then passed to ``visit(path, module)``, whose
    result takes its place. A :class:`Captured` is transparent (its module keeps its path)."""
    if isinstance(node, Captured):
        return Captured(_walk(node.module, path, visit), node.step, node.name, node.spec)
    flat, treedef = jax.tree_util.tree_flatten_with_path(node, is_leaf=_is_sub(node))
    leaves = []
    for keys, leaf in flat:
        if not isinstance(leaf, eqx.Module):
            leaves.append(leaf)
            continue
        sub = path + tuple(keys)
        inner = leaf.module if isinstance(leaf, Captured) else leaf
        rebuilt = _walk(leaf, sub, visit)
        leaves.append(visit(sub, rebuilt) if _callable_module(inner) else rebuilt)
    return jax.tree_util.tree_unflatten(treedef, leaves)


def named_modules(model: Any) -> list[tuple[str, Any]]:
    """(name, module) of every callable submodule of ``model`` (not the model itself)."""
    found: list[tuple[str, Any]] = []

    def visit(path: tuple, m: Any) -> Any:
        found.append((name_of(path, SEP), m.module if isinstance(m, Captured) else m))
        return m
    _walk(model, (), visit)
    return found


def capture(model: Any, spec: CaptureSpec, selector: Selector, step: Any) -> Any:
    """A copy of ``model`` (an ``eqx.Module``) whose selected submodules record."""
    names = named_modules(model)
    chosen = {n for n, _ in selector.choose(names)}

    def visit(path: tuple, m: Any) -> Any:
        name = name_of(path, SEP)
        return Captured(m, boxed(step), name, spec) if name in chosen else m
    return _walk(model, (), visit)

