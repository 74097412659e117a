"""Capturing a Flax Linen model's submodules: selected by their scope paths
(``module.path``: ``Block_3/MLP_0``), recorded through Linen's own hook,
``nn.intercept_methods``, which a :class:`~hostfeed._src.capture.calls.Capturing` holds
around the model's ``apply`` (or ``init``, or a call of a bound model).

A Linen model's submodules exist only while it runs (``@nn.compact``), so the selection is
made as each submodule's ``__call__`` is intercepted, and the check that every pattern
selected something (listing the names that were called) when the capture ends.

A module that shares another's scope (``nn.share_scope``: a wrapper and what it wraps, a
parent and a child whose parameters live in the parent's) is named as it would be without
sharing, its parent's name and its own (``layer_0/mlp/gating``), not by the scope's path,
which is the other module's name too.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from flax import linen as nn

from .calls import CaptureSpec, Capturing, Hooks
from .selection import Selector, name_of

__all__ = ["capture", "SEP"]

#: Linen's scope path separator in hostfeed's names (``Block_3/MLP_0``).
SEP = "/"


class LinenHooks(Hooks):
    """One capture of a Linen model: the selection (made at each call), what to record, the
    step; the names of the submodules called, for the check at the end."""

    def __init__(self, spec: CaptureSpec, selector: Selector, step: Any):
        self.spec = spec
        self.selector = selector
        self.step = step
        self.seen: dict[str, None] = {}
        # name -> the class of the module recorded under it (in this run of the model).
        self.recorded: dict[str, type] = {}

    def _intercept(self, next_fun: Any, args: Any, kwargs: Any, context: Any) -> Any:
        module = context.module
        if context.method_name != "__call__" or not module.path:
            return next_fun(*args, **kwargs)
        name = name_of(own_path(module), SEP)
        self.seen[name] = None
        if not self.selector.matches(name, module):
            return next_fun(*args, **kwargs)
        first = self.recorded.setdefault(name, type(module))
        if first is not type(module):
            raise ValueError(
                f"hostfeed.capture: two different submodules of the Flax Linen model are "
                f"named {name!r}, a {first.__qualname__} and a {type(module).__qualname__} "
                f"(modules that share a scope, or a module given the name of another): their "
                f"outputs cannot be recorded under one name. Select only one of them (a "
                f"predicate (name, module) -> bool can tell them apart by class).")
        return self.spec.call(name, self.step, next_fun, args, kwargs)

    def enter(self) -> None:
        if not self._stack():
            self.recorded = {}
        cm = nn.intercept_methods(self._intercept)
        cm.__enter__()
        self._stack().append(cm)

    def exit(self, ok: bool) -> None:
        stack = self._stack()
        stack.pop().__exit__(None, None, None)
        if ok and not stack and self.seen:
            self.selector.check(list(self.seen))


def own_path(module: Any) -> tuple[str, ...]:
    """A bound module's path as its parents name it: its scope's path, but for a module
    whose scope is shared (``nn.share_scope``) or that is inside one, its parent's own path
    and its name (see the module's docstring)."""
    path = tuple(module.path)
    parent = module.parent
    if not isinstance(parent, nn.Module) or parent.scope is None or module.name is None:
        return path  # the model, or a copy a lifted transform made (parent: its scope)
    above = own_path(parent)
    if path != (*parent.path, module.name) or above != tuple(parent.path):
        return (*above, module.name)
    return path


def capture(model: Any, spec: CaptureSpec, selector: Selector, step: Any,
            hooks: Sequence[Hooks] = ()) -> Capturing:
    """``model`` (an ``nn.Module``) whose selected submodules record while it runs."""
    return Capturing(model, [*hooks, LinenHooks(spec, selector, step)])
