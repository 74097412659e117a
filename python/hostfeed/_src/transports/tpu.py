"""The TPU's transport: taps and calls as the device's own transfers to and from the host,
as few as possible.

A TPU has no host-side custom calls; its way to the host is a ``send`` (and back, a
``recv``) with ``is_host_transfer``, which PJRT hands to a host callback once the bytes
have arrived. JAX's callbacks lower to one such transfer per operand and, when the
callback returns a token (every ordered callback), one more receive that makes the device
wait until the Python function has *returned*. Each transfer costs the device about the
same fixed time whatever its size up to tens of KiB (``docs/platforms.md``), so:

* a tap is **one send**: its small operands (and, on several devices, the executing
  device's partition id) packed into one byte buffer on the device
  (:func:`pack`), and no receive: the host side copies the bytes into
  hostfeed's queue and returns, the tap function runs later on the receiver thread, and
  hostfeed's token orders the sends;
* a call is one send and one receive of the results packed the same way (a dummy scalar
  when there are none, so that the device waits for the reply);
* an operand larger than :data:`PACK_LIMIT_BYTES`, or of a dtype that does not pack
  (64-bit and complex dtypes, float8 types), travels as a transfer of its own, as in JAX's
  callbacks, and zero-size arrays not at all;
* a computation ends with a fence (:func:`end_scope`), so that it finishes only once the
  host ran its callbacks.

Its policies for what the Recorder builds around a record (``summarize_every_step``,
``records_as_outputs`` of :data:`TRANSPORT`) are the TPU's too. What it shares with the
portable transport is in :mod:`.common`: the device keys, the function that waits for a
call's reply, the status checks. The JAX functions it emits the transfers with are in
:mod:`hostfeed._src.compat.transfers`.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ... import _receiver
from .. import compat
from ..primitives import host_callback_effect
from .base import Transport
from .common import (call_host_function, check, check_platform, codes, device_keys, failure,
                     key, note_devices)
from .common import sharding as _sharding

#: Platforms whose computations this transport lowers for (the others take JAX's own
#: host-callback lowering).
PLATFORMS = frozenset({"tpu"})

#: An operand larger than this travels as a transfer of its own, in its own dtype: packing
#: bitcasts it to bytes on the device, which a TPU pays for in relayouts that grow with the
#: array, while the fixed cost of one more transfer is small beside a large array's own
#: (docs/platforms.md has the measurements behind the limit).
PACK_LIMIT_BYTES = 64 << 10

_U32 = np.dtype(np.uint32)


# ---- packing: several arrays as one byte buffer, on the device and on the host ----------
# A tap's operands go, and a call's results come back, as *one* ``uint8`` buffer:
# :func:`pack` bitcasts each array to bytes and concatenates them on the device,
# :func:`unpack` slices them back, and :meth:`Layout.views` gives the host numpy views of
# the buffer without copying. Each array starts at a multiple of :data:`ALIGNMENT` bytes,
# so the host views are aligned for their dtype. Only dtypes that bitcast to bytes
# unchanged are packed (:func:`packable`): the integers, float16, float32 and booleans (as
# ``uint8``). Others travel as arrays of their own, as JAX's callbacks send them: 64-bit
# and complex dtypes, the float8 types, and bfloat16 (a TPU's bitcast of bfloat16 to
# integers flushes its subnormals and rewrites its NaN payloads, where sending it as it is
# keeps its bits).

#: Each packed array starts at a multiple of this many bytes.
ALIGNMENT = 16

_PACKABLE = frozenset(np.dtype(t) for t in (
    np.bool_, np.int8, np.int16, np.int32, np.uint8, np.uint16, np.uint32, np.float16,
    np.float32))


def packable(dtype: Any) -> bool:
    """Whether arrays of ``dtype`` go into the packed buffer.

    Example:
        >>> packable(np.float32), packable(np.float64), packable(np.complex64)
        (True, False, False)
    """
    return np.dtype(dtype) in _PACKABLE


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where each of several arrays lies in one byte buffer: ``offsets[i]`` bytes in,
    ``shapes[i]`` and ``dtypes[i]``; ``nbytes`` in all (padding included).

    Example:
        >>> lay = Layout.of([((2,), np.float32), ((), np.int8)])
        >>> lay.offsets, lay.nbytes
        ((0, 16), 17)
    """

    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[np.dtype, ...]
    offsets: tuple[int, ...]
    nbytes: int

    @classmethod
    def of(cls, arrays: Sequence[tuple[Sequence[int], Any]]) -> Layout:
        """The layout of arrays given as ``(shape, dtype)``, in order."""
        shapes, dtypes, offsets, end = [], [], [], 0
        for given_shape, given_dtype in arrays:
            start = -(-end // ALIGNMENT) * ALIGNMENT
            shape, dtype = tuple(int(d) for d in given_shape), np.dtype(given_dtype)
            shapes.append(shape)
            dtypes.append(dtype)
            offsets.append(start)
            end = start + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        return cls(tuple(shapes), tuple(dtypes), tuple(offsets), end)

    def views(self, buffer: np.ndarray) -> list[np.ndarray]:
        """Numpy views of each array in ``buffer`` (a ``uint8`` array of ``nbytes``), no copy.

        Example:
            >>> lay = Layout.of([((2,), np.float32)])
            >>> lay.views(np.frombuffer(np.float32([1, 2]).tobytes(), np.uint8))[0]
            array([1., 2.], dtype=float32)
        """
        return [np.ndarray(shape, dtype, buffer=buffer, offset=off)
                for shape, dtype, off in zip(self.shapes, self.dtypes, self.offsets)]


def _bytes_of(x: Any) -> Any:
    if x.dtype == jnp.bool_:
        return x.astype(jnp.uint8).reshape(-1)
    return lax.bitcast_convert_type(x, jnp.uint8).reshape(-1)


def pack(values: Sequence[Any], layout: Layout) -> Any:
    """``values`` (of ``layout``'s shapes and dtypes, all :func:`packable`) as one
    ``uint8[layout.nbytes]`` array, on the device.

    Example:
        >>> lay = Layout.of([((2,), np.float32), ((), np.bool_)])
        >>> buf = pack([jnp.float32([1, 2]), jnp.bool_(True)], lay)
        >>> buf.shape, [v.tolist() for v in lay.views(np.asarray(buf))]
        ((17,), [[1.0, 2.0], True])
    """
    parts, end = [], 0
    for value, off in zip(values, layout.offsets):
        if off > end:
            parts.append(jnp.zeros((off - end,), jnp.uint8))
        part = _bytes_of(jnp.asarray(value))
        parts.append(part)
        end = off + part.shape[0]
    if not parts:
        return jnp.zeros((0,), jnp.uint8)
    return parts[0] if len(parts) == 1 else jnp.concatenate(parts)


def unpack(buffer: Any, layout: Layout) -> list[Any]:
    """The arrays of ``layout`` from ``buffer`` (``uint8[layout.nbytes]``), on the device:
    :func:`pack`'s inverse.

    Example:
        >>> lay = Layout.of([((2,), np.float32), ((), np.bool_)])
        >>> [v.tolist() for v in unpack(pack([jnp.float32([1, 2]), True], lay), lay)]
        [[1.0, 2.0], True]
    """
    out = []
    for shape, dtype, off in zip(layout.shapes, layout.dtypes, layout.offsets):
        n = int(np.prod(shape, dtype=np.int64))
        raw = lax.slice(buffer, (off,), (off + n * dtype.itemsize,))
        if dtype == np.bool_:
            out.append((raw != 0).reshape(shape))
        elif dtype.itemsize == 1:
            out.append(lax.bitcast_convert_type(raw, dtype).reshape(shape))
        else:
            words = raw.reshape((n, dtype.itemsize))
            out.append(lax.bitcast_convert_type(words, dtype).reshape(shape))
    return out


def device_pack(layout: Layout) -> Any:
    """:func:`pack` as a function of a list of values, for ``compat.lower_fun``."""
    return lambda *values: [pack(values, layout)]


def device_unpack(layout: Layout) -> Any:
    """:func:`unpack` as a function of a list of one buffer, for ``compat.lower_fun``."""
    return lambda buffer: unpack(buffer, layout)
_DUMMY = jax.core.ShapedArray((), np.float32)  # what a call with nothing to receive waits on


def _aval(shape: Sequence[int], dtype: Any) -> Any:
    return jax.core.ShapedArray(tuple(shape), np.dtype(dtype))


@dataclasses.dataclass(frozen=True)
class Plan:
    """How a list of arrays travels: the packed ones (``layout``, in the order of
    ``packed``, indices into the list) in one ``uint8`` buffer, ``separate`` ones as
    transfers of their own, ``empty`` ones (zero elements) not at all. ``with_pid``: the
    packed buffer ends with the executing device's partition id (``uint32``)."""

    avals: tuple[Any, ...]
    packed: tuple[int, ...]
    separate: tuple[int, ...]
    empty: tuple[int, ...]
    layout: Layout
    with_pid: bool
    @classmethod
    def of(cls, avals: Sequence[Any], with_pid: bool = False) -> Plan:
        """The plan for arrays of ``avals``: the small ones of packable dtypes packed,
        the others (larger than :data:`PACK_LIMIT_BYTES`, or of other dtypes) apart.

        Example:
            >>> p = Plan.of([_aval((2,), np.float32), _aval((2,), np.float64),
            ...              _aval((0,), np.int32), _aval((1 << 20,), np.float32)],
            ...             with_pid=True)
            >>> p.packed, p.separate, p.empty, p.layout.offsets
            ((0,), (1, 3), (2,), (0, 16))
        """
        packed, separate, empty = [], [], []
        for i, a in enumerate(avals):
            nbytes = int(np.prod(a.shape, dtype=np.int64)) * np.dtype(a.dtype).itemsize
            if nbytes == 0:
                empty.append(i)
            elif packable(a.dtype) and nbytes <= PACK_LIMIT_BYTES:
                packed.append(i)
            else:
                separate.append(i)
        parts = [(avals[i].shape, avals[i].dtype) for i in packed]
        if with_pid:
            parts.append(((), _U32))
        return cls(tuple(avals), tuple(packed), tuple(separate), tuple(empty),
                   Layout.of(parts), with_pid)

    @property
    def has_buffer(self) -> bool:
        """Whether anything travels packed."""
        return self.layout.nbytes > 0

    def transfer_avals(self) -> list[Any]:
        """The avals of the transfers, in order: the packed buffer (if any), then each
        separate array."""
        head = [_aval((self.layout.nbytes,), np.uint8)] if self.has_buffer else []
        return head + [self.avals[i] for i in self.separate]

    def host_arrays(self, transfers: Sequence[np.ndarray]) -> tuple[list[np.ndarray], int]:
        """The arrays (numpy, in the original order) and the partition id (0 without one)
        from what the host received (:meth:`transfer_avals`)."""
        out: list[Any] = [None] * len(self.avals)
        rest = list(transfers)
        pid = 0
        if self.has_buffer:
            views = self.layout.views(np.asarray(rest.pop(0)).reshape(-1))
            if self.with_pid:
                pid = int(views.pop())
            for i, v in zip(self.packed, views):
                out[i] = v
        for i, a in zip(self.separate, rest):
            out[i] = np.asarray(a, order="C")
        for i in self.empty:
            a = self.avals[i]
            out[i] = np.empty(a.shape, a.dtype)
        return out, pid

    def host_outputs(self) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Arrays for a call's results to be written into (in the original order), and
        what the host returns to the device (the packed buffer they view, then each
        separate one)."""
        outs: list[Any] = [None] * len(self.avals)
        sent: list[np.ndarray] = []
        if self.has_buffer:
            buffer = np.zeros(self.layout.nbytes, np.uint8)
            sent.append(buffer)
            for i, v in zip(self.packed, self.layout.views(buffer)):
                outs[i] = v
        for i in self.separate:
            a = self.avals[i]
            outs[i] = np.zeros(a.shape, a.dtype)  # a failed call returns zeros
            sent.append(outs[i])
        for i in self.empty:
            a = self.avals[i]
            outs[i] = np.empty(a.shape, a.dtype)
        return outs, sent


def _send(ctx: Any, token: Any, args: Sequence[Any], plan: Plan, sharding: Any
          ) -> tuple[Any, list[int], list[Any]]:
    """Sends ``args`` (and the partition id) to the host as ``plan`` says; returns the
    token after the sends, their channels and the avals sent."""
    values = [args[i] for i in plan.packed]
    avals = [plan.avals[i] for i in plan.packed]
    if plan.with_pid:
        values.append(compat.partition_id())
        avals.append(_aval((), _U32))
    transfers: list[Any] = []
    if plan.has_buffer:
        (buffer,) = compat.lower_fun(ctx, device_pack(plan.layout), avals,
                                     [_aval((plan.layout.nbytes,), np.uint8)], values,
                                     pass_tokens=False)
        transfers.append(buffer)
    transfers += [args[i] for i in plan.separate]
    transfer_avals = plan.transfer_avals()
    if not transfers:  # the callback runs when something arrives
        transfers = [compat.mlir.ir_constant(np.zeros((1,), np.uint8))]
        transfer_avals = [_aval((1,), np.uint8)]
    channels = []
    for value in transfers:
        channel, token = compat.send_to_host(ctx, token, value, sharding)
        channels.append(channel)
    return token, channels, transfer_avals


def _finish(ctx: Any, token: Any) -> None:
    ctx.set_tokens_out(
        ctx.tokens_in.update_tokens(compat.mlir.TokenSet({host_callback_effect: token})))


def _tap(ctx: Any, args: Sequence[Any], avals_in: Sequence[Any], *, with_pid: bool,
         host: Callable[[list[np.ndarray], int], None]) -> Any:
    """One send of ``args`` (hostfeed's token in and out); on the host, ``host(arrays,
    partition_id)`` runs once they arrived. Returns the token after the send."""
    plan = Plan.of(avals_in, with_pid)
    token = ctx.tokens_in.get(host_callback_effect)
    token, channels, sent = _send(ctx, token, args, plan, _sharding(ctx, []))

    def received(*transfers: np.ndarray) -> tuple:
        host(*plan.host_arrays(transfers[:len(plan.transfer_avals())]))
        return ()

    compat.add_host_transfer_callback(ctx, received, sent, [], channels, [])
    _finish(ctx, token)
    return token


def _call(ctx: Any, args: Sequence[Any], avals_in: Sequence[Any], avals_out: Sequence[Any], *,
          with_pid: bool, host: Callable[[list[np.ndarray], int, list[np.ndarray]], None]
         ) -> list[Any]:
    """One send of ``args`` and one receive of the results of ``avals_out`` (hostfeed's
    token in and out); on the host, ``host(arrays, partition_id, outputs)`` writes the
    results into ``outputs`` (numpy arrays of ``avals_out``). Returns the results."""
    plan = Plan.of(avals_in, with_pid)
    results = Plan.of(avals_out)
    token = ctx.tokens_in.get(host_callback_effect)
    token, sends, sent = _send(ctx, token, args, plan, _sharding(ctx, []))
    received_avals = results.transfer_avals() or [_DUMMY]
    recvs, values = [], []
    for aval in received_avals:
        # Under manual sharding each result's annotation has its rank: the received one's.
        channel, token, value = compat.receive_from_host(ctx, token, aval,
                                                         _sharding(ctx, [aval]))
        recvs.append(channel)
        values.append(value)

    def reply(*transfers: np.ndarray) -> tuple:
        arrays, pid = plan.host_arrays(transfers[:len(plan.transfer_avals())])
        outputs, returned = results.host_outputs()
        host(arrays, pid, outputs)
        return tuple(returned) if returned else (np.zeros((), np.float32),)

    compat.add_host_transfer_callback(ctx, reply, sent, received_avals, sends, recvs)
    out: list[Any] = [None] * len(avals_out)
    if results.has_buffer:
        unpacked = compat.lower_fun(ctx, device_unpack(results.layout), [received_avals[0]],
                                    [avals_out[i] for i in results.packed], [values.pop(0)],
                                    pass_tokens=False)
        for i, v in zip(results.packed, unpacked):
            out[i] = v
    for i in results.separate:
        out[i] = values.pop(0)
    for i in results.empty:
        a = avals_out[i]
        out[i] = compat.mlir.ir_constant(np.zeros(a.shape, a.dtype))
    _finish(ctx, token)
    return out


def end_scope(ctx: Any, token: Any) -> None:
    """At the end of a token scope (``fast_dispatch``): a send and a receive after
    ``token`` whose host side does nothing, so that the computation ends only once the
    host has run every callback it made.

    A TPU's computation can finish before the host has run the callbacks of its sends: a
    ``barrier_wait`` right after it would miss rows, and the taps of computations
    dispatched back to back would interleave. The host runs a computation's callbacks one
    after the other, so once this one has run, all have. One round trip per computation,
    not per tap."""
    sharding = _sharding(ctx, [])
    channel, token = compat.send_to_host(ctx, token,
                                         compat.mlir.ir_constant(np.zeros((1,), np.uint8)),
                                         sharding)
    back, _, _ = compat.receive_from_host(ctx, token, _DUMMY, _sharding(ctx, [_DUMMY]))
    compat.add_host_transfer_callback(ctx, lambda *_: (np.zeros((), np.float32),),
                                      [_aval((1,), np.uint8)], [_DUMMY], [channel], [back])


# ---- the transport (:class:`hostfeed._src.transports.Transport`) ---------------------------


def prepare(ctx: Any, rule_platform: Optional[str]) -> None:
    """Before a rule lowers: the module keeps its device assignment (as the portable
    transport's); refuses clearly where a platform lowered for is not a TPU (only a forced
    ``HOSTFEED_TRANSPORT=tpu`` gets there)."""
    del rule_platform
    other = [p for p in compat.lowering_platforms(ctx) if p not in PLATFORMS]
    if other:
        raise NotImplementedError(
            f"hostfeed's TPU transport (its host transfers) runs on TPUs only; this "
            f"computation targets {', '.join(other)} and HOSTFEED_TRANSPORT=tpu forbids the "
            f"others. Unset HOSTFEED_TRANSPORT (or set it to 'jax'), or run it on a TPU.")
    note_devices(ctx)


def tap(ctx: Any, args: Sequence[Any], avals_in: Sequence[Any], per_device: bool, *,
        consumer_id: int, flags: int) -> Any:
    """``hostfeed_tap`` as one send; returns None: later uses of the operand need not wait
    for the transfer (and MHLO's add-dependency does not legalize to what a TPU compiles)."""
    del per_device
    check_platform(ctx)
    cid, flags = int(consumer_id), int(flags)
    dtype_codes, keys = codes(avals_in), device_keys(ctx)
    push = _receiver.portable.push_host

    def host(arrays: list[np.ndarray], pid: int) -> None:
        push(cid, arrays, dtype_codes, key(keys, pid), flags)

    _tap(ctx, args, avals_in, with_pid=len(keys) > 1, host=host)
    return None


def call(ctx: Any, args: Sequence[Any], avals_in: Sequence[Any], avals_out: Sequence[Any],
         per_device: bool, *, consumer_id: int, flags: int, timeout_ms: int,
         name: str) -> tuple[Any, list]:
    """``hostfeed_call`` as one send and one receive; returns (None, its results)."""
    del per_device
    check_platform(ctx)
    keys = device_keys(ctx)
    # (A TPU runs one computation at a time: the lowering refuses a call compiled by a host
    # function the receiver runs, which would wait for itself: one_computation_at_a_time.)
    host = call_host_function(int(consumer_id), int(flags), int(timeout_ms), str(name),
                              codes(avals_in), keys)
    return None, _call(ctx, args, avals_in, avals_out, with_pid=len(keys) > 1, host=host)


#: A TPU's own host transfers. Its policies: a summary recorded at selected steps is computed
#: at every step, outside the ``cond`` that sends it (a TPU's compiler failed on a summary
#: computed in a ``cond`` with a host transfer after it, in the same branch or in a second
#: ``cond``, and compiled a summary at every step and a ``cond`` that only sends a value); a
#: recorded step's records leave as outputs by default (host transfers inside the
#: computation cost far more than a copy of an output does); no hostfeed kernel; one
#: computation at a time. A failed call's status check and message are JAX's host
#: callbacks, as on the portable transport (they run once per failure, not per step).
TRANSPORT = Transport(
    name="tpu", summarize_every_step=True, records_as_outputs=True, native_kernels=False,
    one_computation_at_a_time=True, prepare=prepare, end_scope=end_scope, tap=tap, call=call,
    check=check, failure=failure)
