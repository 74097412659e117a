"""Capturing a Flax NNX model's submodules: selected by their attribute paths
(``nnx.iter_modules``: ``blocks.3.mlp``), recorded while the model runs under a
:class:`~hostfeed._src.capture.calls.Capturing`.

NNX has no method hook, so this does what ``nnx.capture(..., method_outputs=...)`` does:
while a capture is on, the ``__call__`` of each selected module's class is replaced by a
wrapper, put back when the last capture using the class ends. The wrapper records only for
the selected modules, and once per call (a ``super().__call__`` of a patched base class
runs plainly). A selected module carries a mark while a capture is on: a static attribute
(``_hostfeed_capture``, a number) that NNX keeps in the module's graph, so the copies NNX
transforms make of it (``nnx.remat``, ``nnx.scan`` and ``nnx.vmap`` over a layer stack,
``nnx.jit``) are recognised too; the captures that record a mark are found in a context
variable (other threads and contexts run the plain method). The mark is removed when the
last capture of the module ends: the modules' graph, state and the model's results are
then as without the capture.
"""
from __future__ import annotations

import contextvars
import functools
import itertools
import threading
from types import MappingProxyType
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from flax import nnx

from .calls import CaptureSpec, Capturing, Hooks
from .selection import Selector, listed, name_of

__all__ = ["capture", "SEP"]

#: NNX's path separator in hostfeed's names (``blocks.3.mlp``).
SEP = "."

#: The attribute that marks a selected module while a capture is on (a static attribute of
#: its graph: NNX's transforms copy it with the module).
MARK = "_hostfeed_capture"

# mark -> the captures that record it: (hooks, name) pairs, outermost first.
_ACTIVE: contextvars.ContextVar[Mapping[int, tuple[tuple[NnxHooks, str], ...]]] = \
    contextvars.ContextVar("hostfeed_capture_nnx", default=MappingProxyType({}))
# The marks whose recorded call is running (a call of the same module inside runs plainly).
_IN_CALL: contextvars.ContextVar[frozenset[int]] = contextvars.ContextVar(
    "hostfeed_capture_nnx_in_call", default=frozenset())
# id(module) -> [the module, its mark, how many captures on (in any thread) use it].
_MARKED: dict[int, list[Any]] = {}
_MARKS = itertools.count(1)

_MISSING = object()
# cls -> [captures using the patch, the class's own __call__ (or _MISSING)]
_PATCHED: dict[type, list[Any]] = {}
_LOCK = threading.Lock()


def _callable_class(cls: type) -> bool:
    """Whether instances of ``cls`` can be called (a ``__call__`` of the class, not of its
    metaclass)."""
    return any("__call__" in vars(k) for k in cls.__mro__ if k is not object)


def _recording(hooks: NnxHooks, name: str, call: Callable) -> Callable:
    return lambda *args, **kwargs: hooks.spec.call(name, hooks.step, call, args, kwargs)


def _wrapper(original: Callable) -> Callable:
    @functools.wraps(original)
    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        key = vars(self).get(MARK)
        hits = _ACTIVE.get().get(key) if key is not None else None
        inside = _IN_CALL.get()
        if not hits or key in inside:
            return original(self, *args, **kwargs)
        token = _IN_CALL.set(inside | {key})
        try:
            call: Callable = functools.partial(original, self)
            for hooks, name in reversed(hits):
                hooks.called = True
                call = _recording(hooks, name, call)
            return call(*args, **kwargs)
        finally:
            _IN_CALL.reset(token)
    __call__._hostfeed_original = original  # type: ignore[attr-defined]
    return __call__


def _patch(cls: type) -> None:
    with _LOCK:
        entry = _PATCHED.get(cls)
        if entry is not None:
            entry[0] += 1
            return
        own = vars(cls).get("__call__", _MISSING)
        current = cls.__call__  # type: ignore[operator]
        original = getattr(current, "_hostfeed_original", current)
        _PATCHED[cls] = [1, own]
        type.__setattr__(cls, "__call__", _wrapper(original))


def _unpatch(cls: type) -> None:
    with _LOCK:
        entry = _PATCHED[cls]
        entry[0] -= 1
        if entry[0]:
            return
        del _PATCHED[cls]
        if entry[1] is _MISSING:
            type.__delattr__(cls, "__call__")
        else:
            type.__setattr__(cls, "__call__", entry[1])


def _mark(module: Any) -> int:
    """Marks ``module`` (once for any number of captures); its mark."""
    with _LOCK:
        entry = _MARKED.get(id(module))
        if entry is None:
            entry = _MARKED[id(module)] = [module, next(_MARKS), 0]
            object.__setattr__(module, MARK, entry[1])
        entry[2] += 1
        return int(entry[1])


def _unmark(module: Any) -> None:
    with _LOCK:
        entry = _MARKED[id(module)]
        entry[2] -= 1
        if not entry[2]:
            del _MARKED[id(module)]
            if vars(module).get(MARK) == entry[1]:
                object.__delattr__(module, MARK)


class NnxHooks(Hooks):
    """One capture of an NNX model: the selected modules, what to record, the step."""

    def __init__(self, chosen: Sequence[tuple[str, Any]], spec: CaptureSpec, step: Any):
        self.chosen = list(chosen)
        self.spec = spec
        self.step = step
        self._classes = list(dict.fromkeys(type(m) for _, m in self.chosen))

    def enter(self) -> None:
        active = dict(_ACTIVE.get())
        done: list[type] = []
        marked: list[Any] = []
        try:
            for cls in self._classes:
                _patch(cls)
                done.append(cls)
            for name, m in self.chosen:
                key = _mark(m)
                marked.append(m)
                active[key] = (*active.get(key, ()), (self, name))
        except BaseException:
            for m in marked:
                _unmark(m)
            for cls in done:
                _unpatch(cls)
            raise
        self.called = False
        self._stack().append(_ACTIVE.set(active))

    def exit(self, ok: bool) -> None:
        _ACTIVE.reset(self._stack().pop())
        for _, m in self.chosen:
            _unmark(m)
        for cls in self._classes:
            _unpatch(cls)

    def after_call(self) -> None:
        if not self.called:
            if self.spec.watch is not None:
                self.spec.watch.settle()  # said: no warning too
            raise ValueError(
                f"hostfeed.capture: the model ran, but none of the submodules selected "
                f"({listed([n for n, _ in self.chosen])}) was called while the capture was "
                f"on, so nothing was recorded: the model does not call them, or calls a copy "
                f"that does not carry the capture's mark (one merged from a graph split "
                f"before the capture began). Select the submodules the model calls.")


def named_modules(model: Any) -> list[tuple[str, Any]]:
    """(name, module) of every callable submodule of ``model`` (not the model itself), in
    ``nnx.iter_modules``'s order."""
    return [(name_of(path, SEP), m) for path, m in nnx.iter_modules(model)
            if path and _callable_class(type(m))]


def capture(model: Any, spec: CaptureSpec, selector: Selector, step: Any,
            hooks: Sequence[Hooks] = ()) -> Capturing:
    """``model`` (an ``nnx.Module``) whose selected submodules record while it runs."""
    chosen = selector.choose(named_modules(model))
    return Capturing(model, [*hooks, NnxHooks(chosen, spec, step)])
