"""The ``outside_call`` primitive and the effect that keeps it alive and ordered.

``outside_call_p`` is the identity on all its operands; the first ``nr_tapped_args`` of
them are sent to the host, where the callback named by ``callback`` runs. Its effect is
ordered, so JAX threads a token through it: taps run in program order, are never dropped
by dead-code elimination even when their outputs are unused, and keep their order through
jit, nested jit and control flow.
"""
from __future__ import annotations

import os
from typing import Any, Sequence

import numpy as np

from . import _compat


class HostCallbackEffect(_compat.Effect):
    """The ordered side effect of sending data to a hostfeed host callback."""

    def __str__(self) -> str:
        return "HostCallback"


host_callback_effect = HostCallbackEffect()
for _effect_set in _compat.EFFECT_SETS:
    _effect_set.add_type(HostCallbackEffect)

INLINE_ENV = "JAX_HOST_CALLBACK_INLINE"
AD_TAPS_ENV = "HOSTFEED_AD_TAPS"
AD_TAPS_MODES = ("transforms", "primals")


def _check_ad_taps(mode: str, source: str) -> str:
    value = str(mode).strip().lower()
    if value not in AD_TAPS_MODES:
        raise ValueError(f"{source}={mode!r} is not a hostfeed autodiff tap mode; use "
                         f"'transforms' (taps see primals and tangents/cotangents, with 'jvp' "
                         f"and 'transpose' in `transforms`) or 'primals' (taps see only primal "
                         f"values, as in JAX 0.4.x)")
    return value


# A JAX configuration state, so that the mode is part of JAX's tracing and compilation
# cache keys: switching modes never reuses a jaxpr traced (or a jvp taken) in the other.
_ad_taps = _compat.enum_state(
    name="hostfeed_ad_taps",
    enum_values=list(AD_TAPS_MODES),
    default=_check_ad_taps(os.environ.get(AD_TAPS_ENV, "transforms") or "transforms",
                           AD_TAPS_ENV),
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
    import jax

    jax.config.update("hostfeed_ad_taps", _check_ad_taps(mode, "set_ad_taps(mode)"))


def inline_enabled() -> bool:
    """Whether ``JAX_HOST_CALLBACK_INLINE`` asks for callbacks to run inline when eager."""
    return os.environ.get(INLINE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


class CallbackSpec:
    """What a host callback is: the user's function, the pytree of its argument, and how to
    call it. Hashable by the function's identity, so it can be a primitive parameter."""

    __slots__ = ("func", "arg_treedef", "with_device", "kind")

    def __init__(self, func: Any, arg_treedef: Any, with_device: bool, kind: str):
        self.func = func
        self.arg_treedef = arg_treedef
        self.with_device = bool(with_device)
        self.kind = kind

    def _key(self) -> tuple:
        return (id(self.func), self.arg_treedef, self.with_device, self.kind)

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, CallbackSpec) and self.func is other.func
                and self._key() == other._key())

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return f"{self.kind}:{getattr(self.func, '__name__', type(self.func).__name__)}"

    @property
    def name(self) -> str:
        return getattr(self.func, "__qualname__", None) or repr(self.func)


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


def make_invoker(spec: CallbackSpec, transforms: tuple):
    """A fast ``invoke(arrays, device_ordinal)`` for the consumer thread."""
    from .receiver import device_for_ordinal

    func = spec.func
    treedef = spec.arg_treedef
    unpacked = unpack_transforms(transforms)
    single = treedef.num_leaves == 1 and treedef.num_nodes == 1
    if spec.with_device:
        def invoke(arrays: Sequence[np.ndarray], ordinal: int) -> None:
            arg = arrays[0] if single else treedef.unflatten(arrays)
            func(arg, unpacked, device=device_for_ordinal(ordinal))
    else:
        def invoke(arrays: Sequence[np.ndarray], ordinal: int) -> None:
            func(arrays[0] if single else treedef.unflatten(arrays), unpacked)
    return invoke


class PartCollector:
    """Groups the messages that the devices of a global-view host callback send, one part
    each, into complete sets.

    Parts are matched by XLA's run id (the same on every device of one launch) and, within
    a run and group of devices, by their position in each device's FIFO stream. Parts of an
    earlier run that never completed (the execution failed on some devices) are dropped
    once a later run completes a set, so they can neither pile up nor be matched with later
    data (a dropped `call` reply fails its device). Used only on the consumer thread, so it
    needs no lock.
    """

    def __init__(self, n_parts: int):
        self.n_parts = n_parts
        self._counts: dict[tuple[int, int], tuple[int, int]] = {}  # (group, part) -> (run, n)
        self._runs: dict[int, dict[tuple[int, int], dict[int, Any]]] = {}

    def add(self, run: int, group: int, part: int, item: Any) -> list | None:
        """Adds one part; returns all parts of its set in part order once complete."""
        last_run, n = self._counts.get((group, part), (run, 0))
        if last_run != run:
            n = 0
        self._counts[(group, part)] = (run, n + 1)
        pending = self._runs.setdefault(run, {})
        parts = pending.setdefault((group, n), {})
        parts[part] = item
        if len(parts) < self.n_parts:
            return None
        del pending[(group, n)]
        for older in list(self._runs):  # insertion order: earlier runs first
            if older == run:
                break
            del self._runs[older]
        if not pending:
            del self._runs[run]
        return [parts[i] for i in range(self.n_parts)]


def _split_meta(arrays: Sequence[np.ndarray]) -> tuple[int, int, list]:
    meta, *shards = arrays
    return int(meta[0]), int(meta[1]), shards


def _join(shard_lists: list) -> list:
    return [np.concatenate([p[j] for p in shard_lists], axis=0)
            for j in range(len(shard_lists[0]))]


def make_shard_assembler(invoke, n_parts: int, source: int):
    """Wraps ``invoke`` for a global-view tap that each of ``n_parts`` devices sends as its
    own shard: every message is ``(meta, *shards)`` with ``meta = [group, part]`` and the
    shards cut along dimension 0. Once all parts of one tap have arrived (see
    :class:`PartCollector`), ``invoke`` runs once with the whole operands, as if device part
    ``source`` had sent them."""
    from .receiver import current_run_id

    collector = PartCollector(n_parts)

    def assemble(arrays: Sequence[np.ndarray], ordinal: int) -> None:
        group, part, shards = _split_meta(arrays)
        parts = collector.add(current_run_id(), group, part, (shards, ordinal))
        if parts is not None:
            invoke(_join([p[0] for p in parts]), parts[source][1])

    return assemble


outside_call_p = _compat.Primitive("outside_call")
outside_call_p.multiple_results = True


def outside_call_params(callback: CallbackSpec, nr_tapped_args: int, transforms: tuple = (),
                        device_index: int = 0, forward_tapped: bool = False,
                        shard_parts: tuple | None = None) -> dict:
    """The parameters of ``outside_call_p``.

    ``callback``: what to call on the host; ``nr_tapped_args``: how many leading operands are
    sent (the rest pass through, for ``result=``); ``transforms``: internal
    ``(name, *params)`` records; ``device_index``: which device collects the operand under
    global-view sharding; ``forward_tapped``: for a jvp tap, whether the forward pass
    already tapped its primals (so partial evaluation must not tap them again);
    ``shard_parts``: set only by the global-view lowering, ``(n_parts, source)`` when each
    device sends its shard and the host assembles them (see ``make_shard_assembler``).
    """
    return dict(callback=callback, nr_tapped_args=nr_tapped_args, transforms=transforms,
                device_index=device_index, forward_tapped=forward_tapped,
                shard_parts=shard_parts)


@outside_call_p.def_effectful_abstract_eval
def _outside_call_abstract_eval(*avals, **params):
    del params
    return avals, {host_callback_effect}


def _outside_call_impl(*args, **params):
    from . import _receiver

    callback, nr_tapped_args = params["callback"], params["nr_tapped_args"]
    transforms = params["transforms"]
    # Eager taps from inside a host callback also run inline: going through the device
    # would have the callback thread wait for a queue that only it can drain.
    if inline_enabled() or _receiver.in_callback_thread():
        # Legacy JAX_HOST_CALLBACK_INLINE: run the callback here, in the caller's thread,
        # so its exceptions propagate with the caller's stack.
        import jax

        tapped = args[:nr_tapped_args]
        arrays = [np.asarray(a) for a in tapped]
        device = None
        if callback.with_device:
            devs = [next(iter(a.devices())) for a in tapped if isinstance(a, jax.Array)]
            device = devs[0] if devs else jax.devices()[0]
        arg = callback.arg_treedef.unflatten(arrays)
        unpacked = unpack_transforms(transforms)
        if callback.with_device:
            callback.func(arg, unpacked, device=device)
        else:
            callback.func(arg, unpacked)
        return list(args)
    # Eager use goes through the device like staged code, so that all callbacks arrive
    # through the receiver, in order.
    return _compat.apply_primitive(outside_call_p, *args, **params)


outside_call_p.def_impl(_outside_call_impl)


# ----------------------------------------------------------------------------------------
# `call`: a host callback whose results flow back into the computation.

CALL_TIMEOUT_ENV = "HOSTFEED_CALL_TIMEOUT"


def call_timeout_ms() -> int:
    """Milliseconds a ``call`` waits for its reply (``HOSTFEED_CALL_TIMEOUT`` seconds, read
    when the computation is lowered); 0 means no limit."""
    from .receiver import seconds_from_env

    return int(round(seconds_from_env(CALL_TIMEOUT_ENV, 0.0) * 1000))


def check_call_results(name: str, res: Any, result_treedef: Any,
                       result_avals: tuple) -> list[np.ndarray]:
    """Validates a callback's results against the expected pytree, shapes and dtypes (after
    JAX's dtype canonicalisation) and returns them as C-contiguous arrays of exactly the
    expected dtypes. Raises TypeError with the legacy module's wording otherwise."""
    import jax

    from .receiver import SUPPORTED_DTYPES

    actual_treedef: Any
    actual_flat, actual_treedef = jax.tree_util.tree_flatten(res)
    if actual_treedef != result_treedef and not (
            result_treedef.num_leaves == 0 and actual_treedef.num_leaves == 0):
        raise TypeError(f"Callback func {name} should have returned a result with pytree "
                        f"{result_treedef} but returned {actual_treedef}")
    arrays: list[Any] = []
    actual_avals: list[Any] = []
    bad = None
    for r in actual_flat:
        if isinstance(r, (np.ndarray, np.generic, jax.Array, bool, int, float, complex)):
            a = np.asarray(r)
            if a.dtype not in SUPPORTED_DTYPES and a.dtype.kind not in "biufc":
                bad = bad or f"a value of dtype {a.dtype}"
                actual_avals.append(f"<{a.dtype}>")
                arrays.append(None)
                continue
            dtype = jax.dtypes.canonicalize_dtype(a.dtype)
            actual_avals.append(jax.core.ShapedArray(a.shape, dtype))
            arrays.append(a)
        else:
            bad = bad or f"a non-array value of type {type(r).__name__}"
            actual_avals.append(f"<{type(r).__name__}>")
            arrays.append(None)
    mismatch = bad is not None or any(
        a.shape != e.shape or a.dtype != e.dtype
        for a, e in zip(actual_avals, result_avals) if not isinstance(a, str))
    if mismatch:
        expected = result_treedef.unflatten(list(result_avals))
        received = actual_treedef.unflatten(actual_avals)
        extra = f" ({bad})" if bad else ""
        raise TypeError(f"Callback func {name} should have returned a result with abstract "
                        f"values {expected} but returned {received}{extra}")
    return [np.asarray(a, dtype=e.dtype, order="C") for a, e in zip(arrays, result_avals)]


def make_call_runner(spec: CallbackSpec, result_treedef: Any, result_avals: tuple):
    """``run(arrays, device_ordinal) -> (results, None) | (None, error_message)``: runs the
    callback of a ``call`` and checks its results; failures are also recorded."""
    from .receiver import device_for_ordinal, record_exception

    import jax

    func = spec.func
    treedef = spec.arg_treedef
    name = spec.name
    expected = result_treedef.unflatten(list(result_avals))
    exact = [(tuple(a.shape), np.dtype(a.dtype)) for a in result_avals]
    single = result_treedef.num_leaves == 1 and result_treedef.num_nodes == 1
    flatten = jax.tree_util.tree_flatten

    def fast_check(res: Any) -> list | None:
        # The common case, checked cheaply: numpy arrays of exactly the expected shapes and
        # dtypes. Anything else goes through check_call_results (canonicalisation, errors).
        if single:
            flat = [res]
        else:
            flat, res_treedef = flatten(res)
            if res_treedef != result_treedef:
                return None
        for a, (shape, dtype) in zip(flat, exact):
            if not (type(a) is np.ndarray and a.shape == shape and a.dtype == dtype
                    and a.flags.c_contiguous):
                return None
        return flat

    def run(arrays: Sequence[np.ndarray], ordinal: int) -> tuple[list | None, str | None]:
        arg = treedef.unflatten(arrays)
        try:
            if spec.with_device:
                res = func(arg, device=device_for_ordinal(ordinal))
            else:
                res = func(arg)
        except Exception as exc:  # noqa: BLE001 - recorded and sent to the device
            record_exception(exc, f"host callback {name} of hcb.call")
            return None, (f"hostfeed: host callback {name} of hcb.call raised "
                          f"{type(exc).__name__}: {exc} (expected results: {expected})")
        flat = fast_check(res)
        try:
            if flat is None:
                flat = check_call_results(name, res, result_treedef, result_avals)
        except TypeError as exc:
            record_exception(exc, f"host callback {name} of hcb.call")
            return None, f"hostfeed: {exc}"
        return flat, None

    return run


def make_call_invoker(spec: CallbackSpec, result_treedef: Any, result_avals: tuple):
    """``invoke(arrays, device_ordinal, reply)`` for a ``call``: runs the callback, checks
    its results and answers ``reply`` (results or an error naming what went wrong)."""
    run = make_call_runner(spec, result_treedef, result_avals)

    def invoke(arrays: Sequence[np.ndarray], ordinal: int, reply: Any) -> None:
        flat, error = run(arrays, ordinal)
        if error is None:
            reply.send(flat)
        else:
            reply.fail(error)

    return invoke


def make_call_assembler(spec: CallbackSpec, result_treedef: Any, result_avals: tuple,
                        n_parts: int, source: int):
    """``invoke(arrays, device_ordinal, reply)`` for a global-view ``call`` that each of
    ``n_parts`` devices sends as its own shard (``(meta, *shards)``, as for taps). Once all
    parts are in, the callback runs once with the whole operands (as from part ``source``)
    and every device gets its slice (along dimension 0) of each result, or the error."""
    from .receiver import current_run_id

    run = make_call_runner(spec, result_treedef, result_avals)
    collector = PartCollector(n_parts)

    def invoke(arrays: Sequence[np.ndarray], ordinal: int, reply: Any) -> None:
        group, part, shards = _split_meta(arrays)
        parts = collector.add(current_run_id(), group, part, (shards, ordinal, reply))
        if parts is None:
            return  # the reply waits in the collector; the device keeps waiting
        flat, error = run(_join([p[0] for p in parts]), parts[source][1])
        pieces = [] if flat is None else [np.split(f, n_parts, axis=0) for f in flat]
        for i, (_, _, r) in enumerate(parts):
            if error is not None:
                r.fail(error)
            else:
                r.send([np.ascontiguousarray(p[i]) for p in pieces])

    return invoke


host_call_p = _compat.Primitive("host_call")
host_call_p.multiple_results = True


@host_call_p.def_effectful_abstract_eval
def _host_call_abstract_eval(*avals, result_avals, with_status=False, **params):
    # `with_status` (set only by hostfeed's own multi-device lowering) adds a leading int32
    # status result: 0, or the ticket of a failure that a later check raises everywhere.
    del avals, params
    status = [_status_aval()] if with_status else []
    return status + list(result_avals), {host_callback_effect}


def _status_aval():
    import jax

    return jax.core.ShapedArray((), np.int32)


def _host_call_impl(*args, callback, result_treedef, result_avals, device_index,
                    with_status=False, shard_parts=None):
    if inline_enabled():
        import jax
        import jax.numpy as jnp

        arg = callback.arg_treedef.unflatten([np.asarray(a) for a in args])
        if callback.with_device:
            devs = [next(iter(a.devices())) for a in args if isinstance(a, jax.Array)]
            res = callback.func(arg, device=devs[0] if devs else jax.devices()[0])
        else:
            res = callback.func(arg)
        flat = check_call_results(callback.name, res, result_treedef, result_avals)
        return [jnp.asarray(a) for a in flat]
    return _compat.apply_primitive(host_call_p, *args, callback=callback,
                                   result_treedef=result_treedef, result_avals=result_avals,
                                   device_index=device_index, with_status=with_status,
                                   shard_parts=shard_parts)


host_call_p.def_impl(_host_call_impl)


# `call_check_p`: fails the computation if a (combined) call status is non-zero. Bound only
# by the multi-device lowering of `call`, after every device has the same status, so that
# all devices fail together instead of some waiting forever in a collective.
call_check_p = _compat.Primitive("host_call_check")
call_check_p.multiple_results = True


@call_check_p.def_effectful_abstract_eval
def _call_check_abstract_eval(status):
    del status
    return [], {host_callback_effect}
