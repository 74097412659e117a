"""Capturing an Equinox model's submodules. Equinox modules are pytrees, so a capture is a
copy of the model in which each selected submodule is wrapped in :class:`Captured`, a
module that records around the call of the one it holds. Names are the submodules' pytree
paths (``blocks.3.mlp`` for ``model.blocks[3].mlp``). The copy itself is wrapped in
:class:`CapturedModel`, whose call is the model's and then checks, as a Flax capture does
after each call, that the capture's selected submodules were called (else it recorded
nothing, and says why).

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
from .selection import Selector, listed, name_of

__all__ = ["capture", "Captured", "CapturedModel", "SEP"]

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


class Calls:
    """Which of one capture's selected submodules were called (when traced): hashed by
    identity, in the wrappers' static fields."""

    __slots__ = ("chosen", "called", "watch")

    def __init__(self, chosen: list[str], watch: Any = None):
        self.chosen = chosen
        self.called: set[str] = set()
        self.watch = watch

    def used(self) -> None:
        """The captured model was called."""
        if self.watch is not None:
            self.watch.used()

    def settle(self) -> None:
        """An error about the capture was raised: no warning too."""
        if self.watch is not None:
            self.watch.settle()

    def check(self) -> None:
        """Raises, after a call of the captured model, if no selected submodule was ever
        called (nothing recorded), as a Flax NNX capture does."""
        if self.called:
            return
        self.settle()
        raise ValueError(
            f"hostfeed.capture: the Equinox model ran, but none of the submodules selected "
            f"({listed(self.chosen)}) was called, so nothing was recorded: a capture records the "
            f"calls (__call__) of the selected submodules of the model it returns. Call "
            f"that model in place of the original, and select the submodules its call "
            f"calls (not ones it skips, or whose arrays or other methods it uses).")


class Captured(eqx.Module):
    """An Equinox submodule ``module`` whose calls record (``spec``) under ``name``."""

    module: Any
    step: Any = eqx.field(static=True)  # None, an int or a StepBox (see boxed)
    name: str = eqx.field(static=True)
    spec: CaptureSpec = eqx.field(static=True)
    calls: Any = eqx.field(static=True, default=None)  # the capture's Calls

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.calls is not None:
            self.calls.called.add(self.name)
        step = self.step.value if isinstance(self.step, StepBox) else self.step
        return self.spec.call(self.name, step, self.module, args, kwargs)

    def __getattr__(self, item: str) -> Any:
        # Only for attributes the wrapper lacks: the wrapped module's (a field, a method).
        if item.startswith("__") or item in ("module", "step", "name", "spec"):
            raise AttributeError(item)
        return getattr(self.module, item)


class CapturedModel(eqx.Module):
    """What ``hostfeed.capture`` returns for an Equinox model: the copy of the model with
    the selected submodules wrapped (``hostfeed_model``), whose every attribute and method
    it reads. Its call is the model's, after which each capture's :meth:`Calls.check`
    runs. (Its fields' names are unlike a model's own, which it passes on.)"""

    hostfeed_model: Any
    hostfeed_calls: tuple = eqx.field(static=True)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        for calls in self.hostfeed_calls:
            calls.used()
        try:
            out = self.hostfeed_model(*args, **kwargs)
        except BaseException:
            for calls in self.hostfeed_calls:  # the exception says what went wrong
                calls.settle()
            raise
        for calls in self.hostfeed_calls:
            calls.check()
        return out

    def __getattr__(self, item: str) -> Any:
        if item.startswith(("__", "hostfeed_")):
            raise AttributeError(item)
        return getattr(self.hostfeed_model, item)


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
        return Captured(_walk(node.module, path, visit), node.step, node.name, node.spec,
                        node.calls)
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


def capture(model: Any, spec: CaptureSpec, selector: Selector, step: Any) -> CapturedModel:
    """A copy of ``model`` (an ``eqx.Module``, or a :class:`CapturedModel` to capture
    again) whose selected submodules record."""
    earlier: tuple = ()
    if isinstance(model, CapturedModel):
        model, earlier = model.hostfeed_model, model.hostfeed_calls
    names = named_modules(model)
    chosen = list(dict.fromkeys(n for n, _ in selector.choose(names)))
    calls, selected = Calls(chosen, spec.watch), set(chosen)

    def visit(path: tuple, m: Any) -> Any:
        name = name_of(path, SEP)
        return Captured(m, boxed(step), name, spec, calls) if name in selected else m
    return CapturedModel(_walk(model, (), visit), (*earlier, calls))

