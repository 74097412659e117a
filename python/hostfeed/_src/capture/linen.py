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

A Linen module that wraps an NNX module (``nnx.bridge.ToLinen`` and copies of it: an
``nnx_class`` field) makes its NNX module anew in each call: its call is given, as its
``nnx_method``, a method that selects the NNX module's submodules by their NNX names
(after the wrapper's own path) and records them as an NNX capture does.
"""
from __future__ import annotations

import inspect
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
        if context.method_name != "__call__":
            return next_fun(*args, **kwargs)
        if _wrapped_nnx(module) is not None:
            return self._nnx_wrapper(module, next_fun, args, kwargs)
        if not module.path:
            return next_fun(*args, **kwargs)
        return self._call(module, next_fun, args, kwargs)

    def _nnx_wrapper(self, module: Any, next_fun: Any, args: Any, kwargs: Any) -> Any:
        """A call of a Linen module that wraps an NNX module (``nnx.bridge.ToLinen`` or a
        copy of it), which makes the NNX module anew in each call: the wrapper's call is
        given, as its ``nnx_method``, a method that captures the NNX module's submodules
        by their NNX names (after the wrapper's own path) around the method it runs."""
        cls = type(module)
        if "nnx_method" not in inspect.signature(cls.__call__).parameters:
            where = f"at {name_of(module.path, SEP)!r}" if module.path else "the model"
            raise ValueError(
                f"hostfeed.capture: {cls.__name__} ({where}) is a Linen module that wraps "
                f"the NNX module {module.nnx_class.__name__} and "
                f"makes it inside its call, where a capture of the Linen model cannot select "
                f"its submodules: capture the NNX model itself (hostfeed.capture(nnx_model, "
                f"rec, ...)), or use flax.nnx.bridge.ToLinen, whose nnx_method the capture "
                f"uses")
        prefix = own_path(module) if module.path else ()
        method = kwargs.pop("nnx_method", None)

        def capturing(nnx_module: Any, *a: Any, **kw: Any) -> Any:
            return self._in_nnx(nnx_module, prefix, method, a, kw)

        def call(*a: Any, **kw: Any) -> Any:
            return next_fun(*a, nnx_method=capturing, **kw)
        if not prefix:
            return call(*args, **kwargs)
        return self._call(module, call, args, kwargs)

    def _in_nnx(self, model: Any, prefix: tuple, method: Any, args: Any, kwargs: Any) -> Any:
        """``method`` (None, a name or a function) of NNX ``model`` run with the submodules
        this capture selects among its own recorded."""
        from . import nnx as nnx_capture
        chosen = []
        for nnx_name, sub in nnx_capture.named_modules(model):
            name = f"{name_of(prefix, SEP)}{SEP}{nnx_name}" if prefix else nnx_name
            self.seen[name] = None
            if self.selector.matches_parts(name, sub, [*prefix, *nnx_name.split(".")]):
                chosen.append((name, sub))
        fn = (getattr(type(model), method or "__call__") if method is None
              or isinstance(method, str) else method)
        if not chosen:
            return fn(model, *args, **kwargs)
        hooks = nnx_capture.NnxHooks(chosen, self.spec, self.step)
        hooks.enter()
        try:
            out = fn(model, *args, **kwargs)
        finally:
            hooks.exit(True)
        hooks.after_call()
        return out

    def _call(self, module: Any, next_fun: Any, args: Any, kwargs: Any) -> Any:
        """A submodule's call, recorded if it is selected."""
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
            try:
                self.selector.check(list(self.seen))
            except ValueError:
                if self.spec.watch is not None:
                    self.spec.watch.settle()  # said: no warning too
                raise


def _wrapped_nnx(module: Any) -> Any:
    """The NNX module class a Linen module wraps (``nnx.bridge.ToLinen`` and copies of it:
    an ``nnx_class`` field holding an NNX module class), or None."""
    if "nnx_class" not in getattr(type(module), "__dataclass_fields__", {}):
        return None
    cls = getattr(module, "nnx_class", None)
    if not isinstance(cls, type):
        return None
    return cls if any(k.__module__.startswith("flax.nnx") for k in cls.__mro__) else None


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
