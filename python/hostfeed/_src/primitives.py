"""The ``outside_call`` primitive, its parameters, and the effect that keeps it alive and
ordered.

``outside_call_p`` is the identity on all its operands; the first ``nr_tapped_args`` of
them are sent to the host, where the callback named by ``callback`` runs. Its effect is
ordered, so JAX threads a token through it: taps run in program order, are never dropped
by dead-code elimination even when their outputs are unused, and keep their order through
jit, nested jit and control flow.

What a host callback is, at trace time, is the primitives' parameter: :class:`CallbackSpec`
(the user's function, the pytree of its argument, its :class:`CallbackKind`),
:class:`RecordSpec` (a record: the spec of a callback whose host side is a recorder's
array), :class:`ShardParts` (how a global-view callback is split), and the transformation
records a binding carries. Whether a callback is a record is decided once, when it is
bound, by the type of its spec (:func:`is_record`): the lowering picks its rule by that
type, and no plain tap's lowering asks.

Only what tracing needs lives here (the primitives, their parameters, effect, abstract
evaluation and dead-code rule, the modes that are part of JAX's cache keys): what the
primitives do outside a computation is :mod:`hostfeed._src.eager`'s, so declaring them
starts nothing.
"""
from __future__ import annotations

import enum
import os
from typing import Any, NamedTuple, Optional

import jax
import numpy as np

from . import compat, settings

__all__ = [
    "HostCallbackEffect", "host_callback_effect", "outside_call_p",
    "outside_call_params", "host_call_p", "call_check_p", "failure_message_p",
    "get_ad_taps", "set_ad_taps", "get_sync_taps", "sync_taps_state", "sync_taps_mode",
    "tap_sync_param", "legacy_sync", "recorded_before_p",
    "CallbackKind", "CallbackSpec", "RecordSpec", "ShardParts", "is_record", "unpack_transforms",
]


# ---- The primitives' parameter: what a callback is ----------------------------------------


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


# ---- The primitives ----------------------------------------------------------------------


class HostCallbackEffect(compat.Effect):
    """The ordered side effect of sending data to a hostfeed host callback."""

    def __str__(self) -> str:
        return "HostCallback"


host_callback_effect = HostCallbackEffect()
for _effect_set in compat.EFFECT_SETS:
    _effect_set.add_type(HostCallbackEffect)
# Dispatch: the token of the previous computation that tapped is passed on as it is.
compat.install_token_fast_path(HostCallbackEffect)

# A JAX configuration state, so that the mode is part of JAX's tracing and compilation
# cache keys: switching modes never reuses a jaxpr traced (or a jvp taken) in the other.
_default_ad_taps = settings.ad_taps()
with settings.parsed_here(settings.AD_TAPS_ENV):
    _ad_taps = compat.enum_state(
        name="hostfeed_ad_taps",
        enum_values=list(settings.AD_TAPS_MODES),
        default=_default_ad_taps,
        help="What hostfeed taps see under autodiff: 'transforms' or 'primals'.",
        include_in_jit_key=True,
        include_in_trace_context=True,
    )


def get_ad_taps() -> str:
    """The autodiff tap mode for functions traced from now on.

    Example:
        >>> get_ad_taps() in ("transforms", "primals")
        True
    """
    return _ad_taps.value


def set_ad_taps(mode: str) -> None:
    """Sets the autodiff tap mode (``'transforms'`` or ``'primals'``) for functions traced
    afterwards; see :func:`hostfeed.host_callback.set_ad_taps`."""
    jax.config.update("hostfeed_ad_taps", settings.check_ad_taps(mode, "set_ad_taps(mode)"))


# How taps traced from now on (without ``sync=``) run: ``legacy`` (the default: their tap
# function has run before the computation goes on, so before its results are ready, where
# the legacy module's did: on CPUs and GPUs; asynchronous on TPUs), ``sync`` or ``async``
# everywhere. A JAX configuration state for the same reason as the autodiff mode: a
# jitted function traced in one mode is traced again in another, never reused.
_default_sync_taps = settings.sync_taps()
with settings.parsed_here(settings.SYNC_TAPS_ENV):
    sync_taps_state = compat.enum_state(
        name="hostfeed_sync_taps",
        enum_values=list(settings.SYNC_TAPS_MODES),
        default=_default_sync_taps,
        help="How hostfeed taps run: 'legacy' (synchronous on CPUs and GPUs, asynchronous "
             "on TPUs), 'sync' or 'async'.",
        include_in_jit_key=True,
        include_in_trace_context=True,
    )


def sync_taps_mode() -> str:
    """The tap mode for functions traced from now on: ``'legacy'``, ``'sync'`` or
    ``'async'`` (see :data:`hostfeed._src.settings.SYNC_TAPS_MODES`).

    Example:
        >>> sync_taps_mode() in ("legacy", "sync", "async")
        True
    """
    return sync_taps_state.value


def tap_sync_param() -> bool | None:
    """The ``sync`` parameter of a tap traced now without ``sync=``: True, False, or None
    (the legacy mode: decided where it runs, by :func:`legacy_sync`).

    Example:
        >>> tap_sync_param() in (True, False, None)
        True
    """
    mode = sync_taps_state.value
    return None if mode == "legacy" else mode == "sync"


def legacy_sync(platforms: Any) -> bool:
    """Whether a tap of the legacy mode is synchronous on ``platforms`` (the platforms a
    computation is lowered for): as the legacy module's taps, everywhere but on a TPU,
    whose taps (outfeed) were asynchronous.

    Example:
        >>> legacy_sync(["cpu"]), legacy_sync(["tpu"])
        (True, False)
    """
    return not any(p == "tpu" for p in platforms)


def get_sync_taps() -> bool:
    """Whether taps traced from now on (without ``sync=``) are synchronous on this
    process's default backend (in the legacy mode: unless it is a TPU).

    Example:
        >>> isinstance(get_sync_taps(), bool)
        True
    """
    sync = tap_sync_param()
    return legacy_sync([jax.default_backend()]) if sync is None else sync


outside_call_p = compat.Primitive("outside_call")
outside_call_p.multiple_results = True


def outside_call_params(callback: CallbackSpec, nr_tapped_args: int, transforms: tuple = (),
                        device_index: int = 0, forward_tapped: bool = False,
                        shard_parts: tuple | None = None, sync: bool | None = False) -> dict:
    """The parameters of ``outside_call_p``.

    ``callback``: what to call on the host; ``nr_tapped_args``: how many leading operands are
    sent (the rest pass through, for ``result=``); ``transforms``: internal
    ``(name, *params)`` records; ``device_index``: which device collects the operand under
    global-view sharding; ``forward_tapped``: for a jvp tap, whether the forward pass
    already tapped its primals (so partial evaluation must not tap them again);
    ``shard_parts``: set only by the global-view lowering, a
    :class:`hostfeed._src.primitives.ShardParts` when each device sends its shard and the host
    joins them; ``sync``: the computation waits until the tap function has run (a
    synchronous tap, lowered as a call without results); None: the legacy mode's choice,
    made where the tap runs (:func:`legacy_sync`).
    """
    return dict(callback=callback, nr_tapped_args=nr_tapped_args, transforms=transforms,
                device_index=device_index, forward_tapped=forward_tapped,
                shard_parts=shard_parts, sync=sync)


@outside_call_p.def_effectful_abstract_eval
def _outside_call_abstract_eval(*avals: Any, **params: Any) -> Any:
    del params
    return avals, {host_callback_effect}


# Dead-code elimination, which every jitted function meets (the transformation rules are
# rules.py's).
def _outside_call_dce(used_outs: list[bool], eqn: Any) -> tuple[list[bool], Any]:
    # Never drop a tap. Only the pass-through operands of `result=` whose outputs are unused
    # can go; tapped operands are always kept.
    n = eqn.params["nr_tapped_args"]
    keep = [True] * n + list(used_outs[n:])
    if all(keep):
        return keep, eqn
    new_eqn = eqn.replace(invars=[v for v, k in zip(eqn.invars, keep) if k],
                          outvars=[v for v, k in zip(eqn.outvars, keep) if k])
    return keep, new_eqn


compat.register_dce_rule(outside_call_p, _outside_call_dce)


# `recorded_before_p`: the identity, sending nothing. A record becomes this in the copy of a
# checkpointed function (`jax.checkpoint`, `nn.remat`, `nnx.remat`) that the backward pass
# recomputes: the forward pass recorded the value already (rules.py). Pure, and lowered to
# nothing, so the recomputation is the one XLA compiles without the record.
recorded_before_p = compat.Primitive("hostfeed_recorded_before")
recorded_before_p.multiple_results = True
recorded_before_p.def_impl(lambda *operands: list(operands))
recorded_before_p.def_abstract_eval(lambda *avals: list(avals))


# ----------------------------------------------------------------------------------------
# `call`: a host callback whose results flow back into the computation.

host_call_p = compat.Primitive("host_call")
host_call_p.multiple_results = True


@host_call_p.def_effectful_abstract_eval
def _host_call_abstract_eval(*avals: Any, result_avals: Any, with_status: bool = False,
                             **params: Any) -> Any:
    # `with_status` (set only by hostfeed's own multi-device lowering) adds a leading int32
    # status result: 0, or the ticket of a failure that a later check raises everywhere.
    del avals, params
    status = [_status_aval()] if with_status else []
    return status + list(result_avals), {host_callback_effect}


def _status_aval() -> Any:
    return jax.core.ShapedArray((), np.int32)


# `call_check_p`: fails the computation if a (combined) call status is non-zero. Bound only
# by the multi-device lowering of `call`, after every device has the same status, so that
# all devices fail together instead of some waiting forever in a collective.
call_check_p = compat.Primitive("host_call_check")
call_check_p.multiple_results = True


@call_check_p.def_effectful_abstract_eval
def _call_check_abstract_eval(status: Any, *message: Any) -> Any:
    # `message` (many processes only): the failure's text as NUL-padded uint8 bytes, sent
    # from the process where the call failed (its status ticket means nothing elsewhere).
    del status, message
    return [], {host_callback_effect}


# Global-view placement needs each device's process (many processes): see placement.py.
compat.require_devices_during_lowering(outside_call_p, host_call_p)


# `failure_message_p` (many processes only): the text of this process's failed call named
# by a device's own status, as `uint8[FAILURE_MESSAGE_BYTES]` (zeros for status 0), so the
# lowering can send it to the other processes. Pure: it only reads what the call recorded.
failure_message_p = compat.Primitive("host_call_failure_message")
FAILURE_MESSAGE_BYTES = 2048


@failure_message_p.def_abstract_eval
def _failure_message_abstract_eval(status: Any) -> Any:
    del status
    return jax.core.ShapedArray((FAILURE_MESSAGE_BYTES,), np.uint8)
