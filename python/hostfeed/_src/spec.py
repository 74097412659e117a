"""What a host callback is, at trace time: :class:`CallbackSpec` (the user's function, the
pytree of its argument, its :class:`CallbackKind`), :class:`RecordSpec` (a record: the
spec of a callback whose host side is a recorder's array), :class:`ShardParts` (how a
global-view callback is split), and the transformation records a binding carries. These
are parameters of hostfeed's primitives; nothing here runs on the host or starts the
receiver, so declaring a primitive loads no dispatcher.

Whether a callback is a record is decided once, when it is bound, by the type of its
spec (:func:`is_record`): the lowering picks its rule by that type, and no plain tap's
lowering asks.
"""
from __future__ import annotations

import enum
import os
from typing import Any, NamedTuple, Optional

__all__ = ["CallbackKind", "CallbackSpec", "RecordSpec", "ShardParts", "is_record",
           "unpack_transforms"]


class CallbackKind(enum.StrEnum):
    """What the user bound: a tap, a call, or a record (with or without its step operand).

    Members are strings (``CallbackKind.TAP == "tap"``), so a spec hashes and prints as
    before; compare with ``is``.
    """

    TAP = "tap"
    CALL = "call"
    RECORD = "record"
    #: A record whose last operand is the step (``rec.record(name, x, step=s)``).
    RECORD_WITH_STEP = "record+step"


class CallbackSpec:
    """What a host callback is: the user's function, the pytree of its argument, and how to
    call it. Hashable by the function's identity, so it can be a primitive parameter.

    Example:
        >>> import jax
        >>> spec = CallbackSpec(print, jax.tree_util.tree_structure(0), False, CallbackKind.TAP)
        >>> spec, spec.name
        (tap:print, 'print')
    """

    __slots__ = ("func", "arg_treedef", "with_device", "kind", "ad_taps")

    def __init__(self, func: Any, arg_treedef: Any, with_device: bool, kind: CallbackKind | str,
                 ad_taps: Optional[str] = None):
        self.func = func
        self.arg_treedef = arg_treedef
        self.with_device = bool(with_device)
        # (A member as it is: calling the enum costs a third of a microsecond per tap.)
        self.kind = kind if type(kind) is CallbackKind else CallbackKind(kind)
        # This callback's autodiff mode ("transforms" or "primals"), over the process's
        # (`get_ad_taps()`, read when None): `Recorder.record(..., cotangents=)`.
        self.ad_taps = ad_taps

    def _key(self) -> tuple:
        # Callables are told apart by identity, except hostfeed's own value-like ones
        # (id_print's printers), which compare by their settings.
        func = self.func if getattr(self.func, "__hostfeed_by_value__", False) else id(self.func)
        return (func, self.arg_treedef, self.with_device, self.kind, self.ad_taps)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CallbackSpec) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return f"{self.kind}:{getattr(self.func, '__name__', type(self.func).__name__)}"

    @property
    def name(self) -> str:
        """The function's qualified name; a lambda's is its file and line instead
        (``<lambda> at train.py:12``), which tells lambdas apart.

        Example:
            >>> f = lambda x: x
            >>> CallbackSpec(f, None, False, CallbackKind.TAP).name.startswith("<lambda> at ")
            True
        """
        name = getattr(self.func, "__qualname__", None)
        if not isinstance(name, str):
            return getattr(self.func, "__name__", repr(self.func))
        code = getattr(self.func, "__code__", None)
        if name.endswith("<lambda>") and code is not None:
            return f"<lambda> at {os.path.basename(code.co_filename)}:{code.co_firstlineno}"
        return name

    def with_tree(self, treedef: Any) -> CallbackSpec:
        """The same callback with another argument tree."""
        return CallbackSpec(self.func, treedef, self.with_device, self.kind, self.ad_taps)


class RecordSpec(CallbackSpec):
    """A record (``Recorder.record(name, ...)``): the spec carries what its lowering needs
    of the recorder, ``catalogue`` (its :class:`~hostfeed._src.record.catalogue.Catalogue`:
    the arrays declared, the Rust sinks they are bound to) and ``array`` (the record's
    name: its array in the store), so that the lowering reaches the recorder through
    nothing else. ``func`` is the record's host function (a ``Target``), called only on
    the paths that record through Python (a global-view record joined on the host, the
    inline mode); the lowering never calls it. ``claim``: whether this process writes the
    arrays, where the lowering decided it (a gathered global-view record: the process of
    the device that records it); None: as the placement says.

    Example:
        >>> import jax
        >>> spec = RecordSpec(None, "h", print, jax.tree_util.tree_structure((0, 0)), True)
        >>> spec, spec.name, spec.with_step, is_record(spec)
        (record+step:h, "Recorder.record('h')", True, True)
    """

    __slots__ = ("catalogue", "array", "claim")

    def __init__(self, catalogue: Any, array: str, func: Any, arg_treedef: Any,
                 with_step: bool, ad_taps: Optional[str] = None,
                 claim: Optional[bool] = None):
        super().__init__(func, arg_treedef, True,
                         CallbackKind.RECORD_WITH_STEP if with_step else CallbackKind.RECORD,
                         ad_taps)
        self.catalogue = catalogue
        self.array = array
        self.claim = claim

    def _key(self) -> tuple:
        return (id(self.catalogue), self.array, self.arg_treedef, self.kind, self.ad_taps,
                self.claim)

    def __eq__(self, other: object) -> bool:
        return type(other) is RecordSpec and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return f"{self.kind}:{self.array}"

    @property
    def name(self) -> str:
        """How messages name the record: ``Recorder.record('NAME')``."""
        return f"Recorder.record({self.array!r})"

    @property
    def with_step(self) -> bool:
        """Whether its last operand is the step."""
        return self.kind is CallbackKind.RECORD_WITH_STEP

    def with_tree(self, treedef: Any) -> RecordSpec:
        """The same record with another argument tree."""
        return RecordSpec(self.catalogue, self.array, self.func, treedef, self.with_step,
                          self.ad_taps, self.claim)

    def claimed(self, here: bool) -> RecordSpec:
        """The same record, its arrays written by this process or not (``here``)."""
        return RecordSpec(self.catalogue, self.array, self.func, self.arg_treedef,
                          self.with_step, self.ad_taps, here)


def is_record(spec: CallbackSpec) -> bool:
    """Whether a callback is a record: the one test, by the type of its spec.

    Example:
        >>> import jax
        >>> is_record(CallbackSpec(print, jax.tree_util.tree_structure(0), False, "tap"))
        False
    """
    return type(spec) is RecordSpec


class ShardParts(NamedTuple):
    """How a global-view callback is split: ``n_parts`` devices each send a slice; the
    joined callback runs as if device part ``source`` had sent it. For a ``call``,
    ``whole_avals`` are the avals of its whole (unsplit) results."""

    n_parts: int
    source: int
    whole_avals: tuple | None = None
    #: A record written part by part, each part by its own process: the
    #: messages go to a Rust sink, never joined. ``per_device``: each device's whole value
    #: is one part (a shard_map record under many processes).
    parted: bool = False
    per_device: bool = False


def unpack_transforms(transforms: tuple) -> tuple[tuple[str, dict], ...]:
    """Internal ``(name, *params)`` tuples -> the legacy ``(name, params_dict)`` form.

    Example:
        >>> unpack_transforms((("batch", (0,)), ("jvp",)))
        (('batch', {'batch_dims': (0,)}), ('jvp', {}))
    """
    out = []
    for name, *params in transforms:
        if name == "batch":
            out.append((name, {"batch_dims": params[0]}))
        else:
            out.append((name, {}))
    return tuple(out)
