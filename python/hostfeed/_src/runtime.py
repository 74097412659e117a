"""What runs on the host, on the consumer thread: turning a message into a call of the
user's function.

For every custom call the lowering registers a *consumer* with :mod:`hostfeed._src.consumers`:
an ``invoke`` built here that unflattens the arrays, passes ``transforms`` (and the device),
checks a ``call``'s results and answers its reply. Global-view callbacks sent shard by
shard are joined here first (:class:`Joiner`). Nothing in this module runs at trace time.
"""
from __future__ import annotations

from typing import Any, NamedTuple
from collections.abc import Callable, Sequence

import jax
import numpy as np

from .. import _receiver
from .devices import device_for_ordinal
from .dispatcher import run_sync_tap
from .dtypes import SUPPORTED_DTYPES, byte_order_problem
from .errors import record_exception, user_frame
from .primitives import CallbackSpec, ShardParts


def check_call_results(name: str, res: Any, result_treedef: Any,
                       result_avals: tuple) -> list[np.ndarray]:
    """Validates a callback's results against the expected pytree, shapes and dtypes (after
    JAX's dtype canonicalisation) and returns them as C-contiguous arrays of exactly the
    expected dtypes. Raises TypeError with the legacy module's wording otherwise.

    Example:
        >>> import jax
        >>> tree = jax.tree_util.tree_structure(0)
        >>> check_call_results("f", [1.0], tree, (jax.core.ShapedArray((), np.float32),))
        Traceback (most recent call last):
        ...
        TypeError: Callback func f should have returned a result with pytree PyTreeDef(*) ...
    """
    actual_treedef: Any
    actual_flat, actual_treedef = jax.tree_util.tree_flatten(res)
    if actual_treedef != result_treedef and not (
            result_treedef.num_leaves == 0 and actual_treedef.num_leaves == 0):
        raise TypeError(f"Callback func {name} should have returned a result with pytree "
                        f"{result_treedef} but returned {actual_treedef}. "
                        + _result_shape_hint(res, result_treedef, result_avals))
    arrays: list[Any] = []
    actual_avals: list[Any] = []
    bad = None
    for r in actual_flat:
        if isinstance(r, (np.ndarray, np.generic, jax.Array, bool, int, float, complex)):
            a = np.asarray(r)
            swapped = byte_order_problem(a.dtype)
            if swapped is not None:
                bad = bad or f"a value of {swapped}"
                actual_avals.append(f"<{a.dtype.str}>")
                arrays.append(None)
                continue
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
                        f"values {expected} but returned {received}{extra}. "
                        + _result_shape_hint(res, result_treedef, result_avals))
    return [np.asarray(a, dtype=e.dtype, order="C") for a, e in zip(arrays, result_avals)]


def _shape_dtype_text(res: Any) -> str | None:
    """``res`` as the ``result_shape`` that describes it, in source form, or None."""
    def leaf(r: Any) -> str:
        a = np.asarray(r)
        if a.dtype.kind not in "biufc":
            raise TypeError(a.dtype)
        dtype = jax.dtypes.canonicalize_dtype(a.dtype)
        return f"jax.ShapeDtypeStruct({tuple(a.shape)}, jnp.{np.dtype(dtype).name})"
    treedef: Any
    try:
        flat, treedef = jax.tree_util.tree_flatten(res)
        texts = [leaf(r) for r in flat]
    except (TypeError, ValueError):
        return None
    if treedef.num_leaves == 1 and treedef.num_nodes == 1:
        return texts[0]
    return str(treedef.unflatten([_Verbatim(t) for t in texts]))


class _Verbatim(str):
    def __repr__(self) -> str:
        return str(self)


def _result_shape_hint(res: Any, result_treedef: Any, result_avals: tuple = ()) -> str:
    """How to fix ``result_shape`` for a host function that returned ``res``, in the
    caller's terms: ``result_shape`` describes the results (a number describes a scalar of
    its type; ``None`` or ``()`` no result at all)."""
    if result_treedef.num_leaves == 0:
        head = ("result_shape was None or empty, which declares that the host function "
                "returns nothing")
    elif (result_avals and all(a.shape == () and np.dtype(a.dtype).kind in "iu"
                               for a in result_avals)
          and str(result_treedef).startswith(("PyTreeDef((", "PyTreeDef(["))):
        head = ("result_shape was a tuple of integers, which declares that many integer "
                "scalars (a number in result_shape describes a scalar of its type), not an "
                "array with that shape: declare arrays with jax.ShapeDtypeStruct(shape, dtype)")
    else:
        head = "result_shape declares what the host function returns"
    suggestion = _shape_dtype_text(res)
    if suggestion is None:
        return f"Hint: {head}; it must return numpy arrays or scalars matching it."
    return (f"Hint: {head}; for what it returned, pass result_shape={suggestion} (or any "
            f"array with that shape and dtype)")


CallOutcome = tuple[list | None, str | None]


class CallParts(NamedTuple):
    """A ``call``'s callback in its parts (see :func:`make_call_parts`)."""

    #: ``arg(arrays)``: the host function's argument, from the operands' arrays.
    arg: Callable[[Sequence[np.ndarray]], Any]
    #: ``call(arg, ordinal)``: the host function's results.
    call: Callable[[Any, int], Any]
    #: ``raised(exc) -> message``: records the exception the host function raised and
    #: returns the call's error message.
    raised: Callable[[BaseException], str]
    #: ``results(res) -> (flat, None) | (None, message)``: the checked flat results, or
    #: the error (recorded).
    results: Callable[[Any], CallOutcome]


def make_call_parts(spec: CallbackSpec, result_treedef: Any, result_avals: tuple) -> CallParts:
    """The parts of running a ``call``'s callback and checking its results, which
    :func:`make_call_runner` puts together (and the receiver, when it runs the function
    itself)."""
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

    def arg(arrays: Sequence[np.ndarray]) -> Any:
        return treedef.unflatten(arrays)

    def call(arg: Any, ordinal: int) -> Any:
        if spec.with_device:
            return func(arg, device=device_for_ordinal(ordinal))
        return func(arg)

    def raised(exc: BaseException) -> str:
        record_exception(exc, f"host callback {name} of hcb.call",
                         raised_in="the computation that made the call fails with it")
        return (f"hostfeed: host callback {name} of hcb.call raised "
                f"{type(exc).__name__}: {exc}{user_frame(exc)} (expected "
                f"results: {expected})")

    def results(res: Any) -> CallOutcome:
        flat = fast_check(res)
        try:
            if flat is None:
                flat = check_call_results(name, res, result_treedef, result_avals)
        except TypeError as exc:
            # hostfeed's own check failed, not the user's code: no traceback into it.
            record_exception(exc.with_traceback(None), f"host callback {name} of hcb.call",
                             raised_in="the computation that made the call fails with it")
            return None, f"hostfeed: {exc}"
        return flat, None

    return CallParts(arg, call, raised, results)


def make_call_runner(spec: CallbackSpec, result_treedef: Any,
                     result_avals: tuple) -> Callable[[Sequence[np.ndarray], int], CallOutcome]:
    """``run(arrays, device_ordinal) -> (results, None) | (None, error_message)``: runs the
    callback of a ``call`` and checks its results; failures are also recorded."""
    parts = make_call_parts(spec, result_treedef, result_avals)

    def run(arrays: Sequence[np.ndarray], ordinal: int) -> CallOutcome:
        arg = parts.arg(arrays)
        try:
            res = parts.call(arg, ordinal)
        except BaseException as exc:  # noqa: BLE001 - recorded and sent to the device
            return None, parts.raised(exc)
        return parts.results(res)

    return run


def make_call_invoker(spec: CallbackSpec, result_treedef: Any,
                      result_avals: tuple) -> Callable[..., bool]:
    """``invoke(arrays, device_ordinal, reply) -> failed`` for a ``call``: runs the
    callback, checks its results and answers ``reply`` (results or an error naming what
    went wrong); returns whether it failed."""
    run = make_call_runner(spec, result_treedef, result_avals)

    def invoke(arrays: Sequence[np.ndarray], ordinal: int, reply: Any) -> bool:
        flat, error = run(arrays, ordinal)
        if error is None:
            reply.send(flat)
            return False
        reply.fail(error)
        return True

    return invoke


def make_direct_call(spec: CallbackSpec, result_treedef: Any,
                     result_avals: tuple) -> Any:
    """What the receiver needs to run a ``call``'s host function without a Python frame of
    hostfeed's around it (``_receiver.consumers.DirectCall``), or ``None`` where it cannot (a
    function that takes the device): the function; the argument's tree, unless it is
    the one array; the one result's shape and dtype when there is one result (checked
    there, copied straight into the call's results); and the parts that handle an
    exception and any other results, as :func:`make_call_runner` does."""
    if spec.with_device:
        return None
    parts = make_call_parts(spec, result_treedef, result_avals)
    treedef = spec.arg_treedef
    leaf = treedef.num_leaves == 1 and treedef.num_nodes == 1
    single = result_treedef.num_leaves == 1 and result_treedef.num_nodes == 1
    shape = tuple(result_avals[0].shape) if single else None
    dtype = np.dtype(result_avals[0].dtype) if single else None
    return _receiver.consumers.DirectCall(spec.func, None if leaf else treedef, shape, dtype,
                                          parts.raised, parts.results)


# ----------------------------------------------------------------------------------------
# Global-view callbacks sent shard by shard: each of `n_parts` devices sends its slice of
# every operand (cut along dimension 0) behind `meta = [group, part]`; the host joins the
# slices of one execution and calls the user's function once. Under many processes the
# slices of other processes' devices are first moved to devices of the process that runs
# the callback (placement.py), which then send several slices in one message:
# `meta = [group, part_0, part_1, ...]`, one *slot* of operands per part, -1 marking an
# empty slot (see :class:`Joiner`).


class _Part(NamedTuple):
    shards: list
    ordinal: int
    reply: Any
    part: int = 0  # the part number (position along dimension 0)
    slot: int = 0  # the slot of its message that carried it
    n_slots: int = 1  # the slots of that message


def _join(parts: Sequence[_Part]) -> list:
    return [np.concatenate([p.shards[j] for p in parts], axis=0)
            for j in range(len(parts[0].shards))]


def _unpack(arrays: Sequence[np.ndarray], ordinal: int, reply: Any) -> tuple[int, list[_Part]]:
    """``(group, parts)`` of one message ``(meta, *slots)``; empty slots are left out."""
    meta, *rest = arrays
    group, slots = int(meta[0]), [int(p) for p in meta[1:]]
    n_slots = len(slots)
    if n_slots == 0 or len(rest) % n_slots:
        raise ValueError(f"hostfeed: malformed part message: meta {meta.tolist()} with "
                         f"{len(rest)} operands")
    per = len(rest) // n_slots
    return group, [_Part(rest[s * per:(s + 1) * per], ordinal, reply, part, s, n_slots)
                   for s, part in enumerate(slots) if part >= 0]


class Joiner:
    """Groups the parts that the devices of a global-view callback send into complete
    sets, and runs ``complete(parts)`` once per set.

    Parts are matched by XLA's run id (the same on every device of one launch) and, within
    a run and group of devices, by their position in each device's FIFO stream. A message
    may carry several parts (slots), all of the same set; one device never sends parts of
    one set in two messages, so a set completes on the message of its last device.
    A set that can no longer complete (its execution failed on some device) is dropped by
    :meth:`abandon`; its waiting ``call`` replies are failed. Used only on the consumer
    thread (under the dispatcher's lock), so it needs no lock of its own.

    Example:
        >>> got = []
        >>> j = Joiner(2, lambda parts: got.append([p.ordinal for p in parts]))
        >>> j.add(7, [np.array([0, 1], np.int32)], ordinal=5, reply=None) is None
        True
        >>> j.add(7, [np.array([0, 0], np.int32)], ordinal=4, reply=None)
        (4, 5)
        >>> got
        [[4, 5]]
    """

    def __init__(self, n_parts: int, complete: Callable[[list[_Part]], None],
                 name: str = "global-view host callback", waits: int | None = None):
        self.n_parts = n_parts
        self.name = name
        self._complete = complete
        # The part whose device alone waits for its set (a synchronous tap's: the message
        # of any other part is answered as it arrives), or None: every device waits.
        self._waits = waits
        self._counts: dict[tuple[int, int], tuple[int, int]] = {}  # (group, part) -> (run, n)
        self._runs: dict[int, dict[tuple[int, int], dict[int, _Part]]] = {}

    def add(self, run: int, arrays: Sequence[np.ndarray], ordinal: int,
            reply: Any) -> tuple[int, ...] | None:
        """Adds one message's parts (``arrays = (meta, *slots)``). Returns None while their
        set is incomplete, else runs the set and returns the device ordinals that took
        part."""
        group, new = _unpack(arrays, ordinal, reply)
        if (reply is not None and self._waits is not None
                and all(p.part != self._waits for p in new)):
            reply.send([])  # the device goes on; its later callbacks wait for the set
            new = [p._replace(reply=None) for p in new]
        pending = self._runs.setdefault(run, {})
        parts: dict[int, _Part] = {}
        key = (group, 0)
        for p in new:
            if not 0 <= p.part < self.n_parts:
                raise ValueError(f"hostfeed: part {p.part} of {self.name} is outside its "
                                 f"{self.n_parts} parts")
            last_run, n = self._counts.get((group, p.part), (run, 0))
            if last_run != run:
                n = 0
            self._counts[(group, p.part)] = (run, n + 1)
            key = (group, n)
            parts = pending.setdefault(key, {})
            parts[p.part] = p
        if len(parts) < self.n_parts:
            return None
        del pending[key]
        if not pending:
            del self._runs[run]
        ordered = [parts[i] for i in range(self.n_parts)]
        try:
            self._complete(ordered)
        except BaseException as exc:  # noqa: BLE001 - recorded; the devices go on
            record_exception(exc, f"host callback {self.name}")
            for p in ordered:
                if p.reply is not None:
                    p.reply.fail(f"hostfeed: host callback {self.name} failed: "
                                 f"{type(exc).__name__}: {exc}")
        return tuple(dict.fromkeys(p.ordinal for p in ordered))

    def abandon(self, run: int, why: str) -> tuple[int, ...]:
        """Drops the incomplete sets of ``run``, failing their waiting replies with
        ``why``; returns the device ordinals whose parts were dropped."""
        ordinals = []
        for parts in self._runs.pop(run, {}).values():
            for p in parts.values():
                ordinals.append(p.ordinal)
                if p.reply is not None:
                    p.reply.fail(why)
        self._counts = {k: v for k, v in self._counts.items() if v[0] != run}
        return tuple(dict.fromkeys(ordinals))

    def let_go(self, run: int, ordinal: int) -> bool:
        """Answers the waiting reply of device ``ordinal``'s part of the oldest incomplete
        set of ``run`` (a synchronous tap's device goes on before the tap ran; the tap
        still runs once the set is complete); whether there was one. Never a ``call``'s
        part: its device needs the results."""
        if self._waits is None:
            return False
        for parts in self._runs.get(run, {}).values():
            for p in list(parts.values()):
                if p.ordinal == ordinal and p.reply is not None and p.reply.pending:
                    p.reply.send([])
                    for j, q in parts.items():  # (the message's other slots share it)
                        if q.reply is p.reply:
                            parts[j] = q._replace(reply=None)
                    return True
        return False

    def senders(self, run: int, ordinal: int) -> frozenset[int]:
        """The devices that sent a part of the oldest incomplete set of ``run`` that device
        ``ordinal`` sent a part of (empty if there is none)."""
        for parts in self._runs.get(run, {}).values():
            ordinals = frozenset(p.ordinal for p in parts.values())
            if ordinal in ordinals:
                return ordinals
        return frozenset()

    def incomplete_runs(self) -> list[int]:
        """Runs with parts waiting for other devices."""
        return list(self._runs)


def make_joined_tap(invoke: Callable[..., None], shard_parts: ShardParts,
                    name: str) -> Joiner:
    """A :class:`Joiner` that calls the tap ``invoke`` once per complete set, with the
    joined operands, as if device part ``source`` had sent them. The parts of a
    synchronous tap carry replies: the device of part ``source`` (the one the tap runs
    for, as the legacy module ran a global-view tap on one device) goes on once the tap
    has run, every other one as soon as its part has arrived (its later callbacks still
    wait for the tap): one thread of the runtime waits per set, not one per device."""
    source = shard_parts.source

    def complete(parts: list[_Part]) -> None:
        replies = list({id(p.reply): p.reply for p in parts if p.reply is not None}.values())
        if replies:
            run_sync_tap(invoke, name, _join(parts), parts[source].ordinal, replies)
        else:
            invoke(_join(parts), parts[source].ordinal)

    return Joiner(shard_parts.n_parts, complete, name, waits=source)


def make_joined_call(spec: CallbackSpec, result_treedef: Any,
                     shard_parts: ShardParts) -> Joiner:
    """A :class:`Joiner` for a global-view ``call``: once all parts are in, the callback
    runs once with the whole operands (as from part ``source``) and every message gets,
    slot by slot, its part's slice (along dimension 0) of each result (zeros for an empty
    slot), or the error."""
    assert shard_parts.whole_avals is not None
    run = make_call_runner(spec, result_treedef, shard_parts.whole_avals)
    n_parts, source = shard_parts.n_parts, shard_parts.source

    def complete(parts: list[_Part]) -> None:
        flat, error = run(_join(parts), parts[source].ordinal)
        messages: dict[int, tuple[Any, list[_Part | None]]] = {}
        for p in parts:
            slots = messages.setdefault(id(p.reply), (p.reply, [None] * p.n_slots))[1]
            slots[p.slot] = p
        if error is not None:
            for reply, _ in messages.values():
                reply.fail(error)
            return
        assert flat is not None
        pieces = [np.split(f, n_parts, axis=0) for f in flat]
        for reply, slots in messages.values():
            out = []
            for slot in slots:
                for piece in pieces:
                    out.append(np.ascontiguousarray(piece[slot.part]) if slot is not None
                               else np.zeros_like(piece[0]))
            reply.send(out)

    return Joiner(n_parts, complete, f"{spec.name} of hcb.call")
