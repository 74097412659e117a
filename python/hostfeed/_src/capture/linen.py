"""Capturing a Flax Linen model's submodules: selected by their scope paths
(``module.path``: ``Block_3/MLP_0``), recorded through Linen's own hook,
``nn.intercept_methods``, which a :class:`~hostfeed._src.capture.calls.Capturing` holds
around the model's ``apply`` (or ``init``, or a call of a bound model).

A Linen model's submodules exist only while it runs (``@nn.compact``), so the selection is
made as each submodule's ``__call__`` is intercepted, and the check that every pattern
selected something (listing the names that were called) when the capture ends.
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

    def _intercept(self, next_fun: Any, args: Any, kwargs: Any, context: Any) -> Any:
        path = context.module.path
        if context.method_name != "__call__" or not path:
            return next_fun(*args, **kwargs)
        name = name_of(path, SEP)
        self.seen[name] = None
        if not self.selector.matches(name, context.module):
            return next_fun(*args, **kwargs)
        return self.spec.call(name, self.step, next_fun, args, kwargs)

    def enter(self) -> None:
        cm = nn.intercept_methods(self._intercept)
        cm.__enter__()
        self._stack().append(cm)

    def exit(self, ok: bool) -> None:
        stack = self._stack()
        stack.pop().__exit__(None, None, None)
        if ok and not stack and self.seen:
            self.selector.check(list(self.seen))


def capture(model: Any, spec: CaptureSpec, selector: Selector, step: Any,
            hooks: Sequence[Hooks] = ()) -> Capturing:
    """``model`` (an ``nn.Module``) whose selected submodules record while it runs."""
    return Capturing(model, [*hooks, LinenHooks(spec, selector, step)])
