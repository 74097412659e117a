"""What a capture does around one call of a selected submodule (:class:`CaptureSpec`): its
array inputs and outputs recorded with ``Recorder.record`` under the submodule's name, the
values passed on being the records' results (so that under ``grad`` the cotangents are
recorded too); and :class:`Capturing`, a Flax model whose calls capture.

Names: ``[prefix/]MODULE/output`` for an output that is one array, ``MODULE/output.K`` for
each array of a tuple, list or dict output (``K`` its index or key, nested ones joined by
``.``); ``MODULE/input.I`` for the ``I``-th positional argument and ``MODULE/input.KW`` for
a keyword argument. A summary adds its suffix to the last part (``.stats``, ``.hist``,
...: :attr:`~hostfeed._src.reductions.Reduction.suffix`).
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import threading
from collections.abc import Callable, Sequence
from typing import Any, Optional

import jax
import numpy as np

from .. import compat
from .. import reductions
from ..record.roles import COTANGENT_SUFFIX
from .selection import key_name

__all__ = ["CaptureSpec", "Capturing", "summary_suffix"]


def summary_suffix(reduce: Any) -> str:
    """The suffix a summary adds to a captured array's name.

    Example:
        >>> from hostfeed import Histogram
        >>> [summary_suffix(r) for r in (None, "stats", Histogram(4))]
        ['', '.stats', '.hist']
    """
    if reduce is None:
        return ""
    try:
        return reductions.resolve(reduce, "").suffix
    except ValueError:
        raise ValueError(f"hostfeed.capture: reduce must be None, {reductions.accepted()}, "
                         f"got {reduce!r}") from None


def _is_container(v: Any) -> bool:
    return isinstance(v, (tuple, list, dict))


def _recordable(leaf: Any) -> bool:
    """An array leaf (not a typed PRNG key): what a capture records."""
    if not isinstance(leaf, (jax.Array, np.ndarray)):
        return False
    return not jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key)


@dataclasses.dataclass(frozen=True, eq=False)
class CaptureSpec:
    """What to record around each call of a selected submodule, and how (the arguments of
    ``hostfeed.capture`` but the model and the selection). Hashed by identity: it sits in
    an Equinox wrapper's static fields."""

    recorder: Any
    every: Optional[int] = None
    start: Optional[int] = None
    stop: Optional[int] = None
    reduce: Any = None
    axis: Any = None
    inputs: bool = False
    outputs: bool = True
    prefix: str = ""
    cotangents: Optional[bool] = None
    keep: str = "always"
    #: The capture's :class:`~.watch.Watch` (what it recorded, for the warning when it
    #: recorded nothing), if watched.
    watch: Any = None

    def array_name(self, module: str, role: str) -> str:
        """The stored name of one captured array (``role``: ``output``, ``input.0``, ...).

        Example:
            >>> CaptureSpec(None, reduce="stats", prefix="acts").array_name("b.0.mlp", "output")
            'acts/b.0.mlp/output.stats'
        """
        head = f"{self.prefix}/" if self.prefix else ""
        return f"{head}{module}/{role}{summary_suffix(self.reduce)}"

    def record_tree(self, module: str, role: str, tree: Any, step: Any,
                    keys: Callable[[tuple], str]) -> Any:
        """Records every array leaf of ``tree`` (any pytree: see :func:`named_leaves`)
        under ``role`` + its key path (``keys``); returns the tree with each recorded leaf
        replaced by its record's result (the same value)."""
        flat, treedef = jax.tree_util.tree_flatten(tree)
        out = list(flat)
        for i, (path, axes) in enumerate(named_leaves(tree)):
            if not _recordable(flat[i]):
                continue
            name = self.array_name(module, role + keys(path))
            describe = getattr(getattr(self.recorder, "catalogue", None), "describe_axes", None)
            if axes is not None and self.reduce is None and describe is not None:
                for array in (name, name + COTANGENT_SUFFIX):
                    describe(array, axes)
            if self.watch is not None:
                self.watch.took(name)
            out[i] = self.recorder.record(
                name, flat[i], step=step, every=self.every, start=self.start, stop=self.stop,
                reduce=self.reduce, axis=self.axis, cotangents=self.cotangents,
                **({"keep": self.keep} if self.keep != "always" else {}))
        return jax.tree_util.tree_unflatten(treedef, out)

    def call(self, module: str, step: Any, fn: Callable, args: Sequence[Any],
             kwargs: dict[str, Any]) -> Any:
        """``fn(*args, **kwargs)`` with its inputs and/or outputs recorded; an output with
        no array to record is an error (it would record nothing)."""
        if self.watch is not None:
            self.watch.called(module)
        if self.inputs:
            args, kwargs = self.record_tree(module, "input", (tuple(args), dict(kwargs)), step,
                                            _input_keys)
        out = fn(*args, **kwargs)
        if self.outputs:
            if not self.inputs and not any(_recordable(v) for v in jax.tree_util.tree_leaves(out)):
                if self.watch is not None:
                    self.watch.settle()  # said: no warning too
                raise ValueError(
                    f"hostfeed.capture: the output of {module!r} ({_describe(out)}) holds no "
                    f"array, so there is nothing to record: select a submodule that returns "
                    f"arrays (in any pytree: tuples, dicts, dataclasses, named arrays), or "
                    f"record its inputs (inputs=True)")
            out = self.record_tree(module, "output", out, step, _output_keys)
        return out


def _describe(out: Any) -> str:
    leaves = jax.tree_util.tree_leaves(out)
    if not leaves:
        return f"a {type(out).__name__} with no leaf" if out is not None else "None"
    kinds = sorted({type(v).__name__ for v in leaves})
    return f"a {type(out).__name__} of {', '.join(kinds)}"


def _children(node: Any) -> Optional[list[tuple[Any, Any]]]:
    """``node``'s children with their keys, one level down its pytree; None for a leaf."""
    flat, _ = jax.tree_util.tree_flatten_with_path(node, is_leaf=lambda v: v is not node)
    if len(flat) == 1 and flat[0][0] == () and flat[0][1] is node:
        return None
    return [(path[0], child) for path, child in flat]


def _axis_names(node: Any, leaf: Any) -> Optional[list[Optional[str]]]:
    """The axis names of a named array (Haliax's ``NamedArray`` and the like: an ``array``
    and, per dimension, an axis with a ``name`` or a name), None for anything else."""
    axes = getattr(node, "axes", None)
    if getattr(node, "array", None) is not leaf or not isinstance(axes, (tuple, list)) \
            or len(axes) != getattr(leaf, "ndim", -1):
        return None
    names = [a if isinstance(a, str) else getattr(a, "name", None) for a in axes]
    return names if all(isinstance(n, str) for n in names) else None


def named_leaves(tree: Any) -> list[tuple[tuple[str, ...], Optional[list]]]:
    """For each leaf of ``tree``, in ``jax.tree_util.tree_leaves`` order: its name parts
    (each key of its path: a tuple's index, a dict's key, a dataclass's field, ...) and,
    for the array of a named array, its axis names. A node other than a tuple, list or dict
    that holds one array (a named array, a box) gives that array its own name, as if it
    were the array.

    Example:
        >>> import jax.numpy as jnp
        >>> named_leaves({"h": (jnp.ones(2), 3)})
        [(('h', '0'), None), (('h', '1'), None)]
    """
    def walk(node: Any, parts: tuple[str, ...]) -> list[tuple[tuple[str, ...], Any, Any]]:
        children = _children(node)
        if children is None:
            return [(parts, node, None)]
        out = []
        for key, child in children:
            out += walk(child, parts + (key_name(key),))
        if not _is_container(node):
            arrays = [i for i, (_, leaf, _) in enumerate(out) if _recordable(leaf)]
            if len(arrays) == 1:
                i = arrays[0]
                out[i] = (parts, out[i][1], out[i][2] or _axis_names(node, out[i][1]))
        return out
    return [(parts, axes) for parts, _, axes in walk(tree, ())]


def _output_keys(path: tuple) -> str:
    return "".join("." + key_name(k) for k in path)


def _input_keys(path: tuple) -> str:
    # path[0] picks args (0) or kwargs (1); path[1] the position or the keyword.
    return "".join("." + key_name(k) for k in path[1:])


class Hooks:
    """What a Flax capture switches on while the model runs (``enter``) and off again
    (``exit``): NNX's patched ``__call__`` of the selected modules' classes, Linen's method
    interceptor. Per thread: ``_stack()`` is this thread's stack of what ``enter`` set."""

    _local: threading.local
    spec: CaptureSpec

    def _stack(self) -> list:
        local = self.__dict__.setdefault("_local", threading.local())
        if not hasattr(local, "stack"):
            local.stack = []
        return local.stack

    def enter(self) -> None:
        raise NotImplementedError

    def exit(self, ok: bool) -> None:
        raise NotImplementedError

    def after_call(self) -> None:
        """Checks, after a call of the model with the capture on, that it recorded what it
        should (raises what it did not)."""


# Which Flax captures are on in this thread (0: none), as a JAX configuration state that is
# part of JAX's jit cache key and trace context: a function jitted inside the model (Linen's
# ``nn.jit``, ``nnx.jit``, a ``jax.jit`` helper) is traced again under a capture instead of
# reusing a trace made without it (which would record nothing) or under another capture
# (whose records, and their traced step, would leak into calls without it).
_scope_state = compat.int_state(
    name="hostfeed_capture_scope", default=0,
    help="Which hostfeed.capture of a Flax model is on (0: none); set by hostfeed.capture.",
    include_in_jit_key=True, include_in_trace_context=True)
# (the scope around, a Capturing's number) -> the scope inside it: the same captures nested
# the same way give the same scope, so a jitted function is traced once for them.
_SCOPES: dict[tuple[int, int], int] = {}
_NUMBERS = itertools.count(1)


def _scope_inside(outer: int, number: int) -> int:
    scope = _SCOPES.get((outer, number))
    if scope is None:
        scope = _SCOPES.setdefault((outer, number), next(_NUMBERS))
    return scope


class Capturing:
    """A Flax model whose selected submodules are recorded while it runs: returned by
    ``hostfeed.capture`` for a Flax NNX or Linen model.

    Use it where the model is used: calling it calls the model (``captured(x)`` is
    ``model(x)``), and its methods are the model's (``captured.apply(variables, x)`` is
    ``model.apply(variables, x)``, ``captured.generate(...)``), each run with the capture
    on. As a context manager it turns the capture on around a block instead
    (``with hostfeed.capture(model, rec, "blocks.*.mlp", step=step): y = model(x)``).
    Other attributes are the model's. Capturing again (``hostfeed.capture(captured, ...)``)
    adds a capture (another summary, other modules).
    """

    def __init__(self, model: Any, hooks: Sequence[Hooks]):
        object.__setattr__(self, "_model", model)
        object.__setattr__(self, "_hooks", tuple(hooks))
        object.__setattr__(self, "_number", next(_NUMBERS))
        # How deep this thread is in calls with the capture on (it is turned on once).
        object.__setattr__(self, "_local", threading.local())

    @property
    def model(self) -> Any:
        """The model itself (its calls outside this wrapper record nothing)."""
        return self._model

    def __enter__(self) -> Any:
        depth = getattr(self._local, "depth", 0)
        if depth == 0:
            for h in self._hooks:
                if h.spec.watch is not None:
                    h.spec.watch.used()
            scope = _scope_state(_scope_inside(_scope_state.value, self._number))
            scope.__enter__()
            entered: list[Hooks] = []
            try:
                for h in self._hooks:
                    h.enter()
                    entered.append(h)
            except BaseException:
                for h in reversed(entered):
                    h.exit(False)
                scope.__exit__(None, None, None)
                raise
            self._local.scope = scope
        self._local.depth = depth + 1
        return self._model

    def __exit__(self, exc_type: Any, *rest: Any) -> None:
        if exc_type is not None:
            for h in self._hooks:  # the exception says what went wrong: no warning too
                if h.spec.watch is not None:
                    h.spec.watch.settle()
        self._local.depth -= 1
        if self._local.depth:
            return
        first: Optional[BaseException] = None
        for h in reversed(self._hooks):
            try:
                h.exit(exc_type is None)
            except Exception as exc:  # noqa: BLE001 - every hook exits; the first error is raised
                first = first or exc
        self._local.scope.__exit__(None, None, None)
        if first is not None:
            raise first

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self:
            out = self._model(*args, **kwargs)
            if self._local.depth == 1:
                for h in self._hooks:
                    h.after_call()
            return out

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._model, name)
        if not callable(attr) or isinstance(attr, type):
            return attr

        @functools.wraps(attr)
        def capturing(*args: Any, **kwargs: Any) -> Any:
            with self:
                return attr(*args, **kwargs)
        return capturing

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._model, name, value)

    def __repr__(self) -> str:
        return f"hostfeed.capture({type(self._model).__name__}, {len(self._hooks)} capture(s))"
