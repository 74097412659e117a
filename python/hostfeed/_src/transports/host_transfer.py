"""Taps and calls on a TPU: the device's own transfers to and from the host, as few as
possible.

A TPU has no host-side custom calls; its way to the host is a ``send`` (and back, a
``recv``) with ``is_host_transfer``, which PJRT hands to a host callback once the bytes
have arrived. JAX's callbacks lower to one such transfer per operand and, when the
callback returns a token (every ordered callback), one more receive that makes the device
wait until the Python function has *returned*. Each transfer costs the device about the
same fixed time (about 240 µs on a TPU v5e for up to tens of KiB), so:

* a tap is **one send**: its small operands (and, on several devices, the executing
  device's partition id) packed into one byte buffer on the device
  (:mod:`hostfeed._src.packing`), and no receive: the host side copies the bytes into
  hostfeed's queue and returns, the tap function runs later on the receiver thread, and
  hostfeed's token orders the sends;
* a call is one send and one receive of the results packed the same way (a dummy scalar
  when there are none, so that the device waits for the reply);
* an operand larger than :data:`PACK_LIMIT_BYTES`, or of a dtype that does not pack
  (64-bit and complex dtypes, float8 types), travels as a transfer of its own, as in JAX's
  callbacks, and zero-size arrays not at all;
* a computation ends with a :func:`fence`, so that it finishes only once the host ran its
  callbacks.

Measured on a TPU v5e (jax 0.10.2, ``docs/tpu/``; ``docs/platforms.md`` has the figures
and what each path cost).

Everything else is the portable transport's (:mod:`.portable`): the device keys, the
functions that push a message or wait for a call's reply, the status checks.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from .. import compat
from ..packing import Layout, device_pack, device_unpack, packable
from ..primitives import host_callback_effect

#: Platforms whose computations this transport lowers for (the others take JAX's own
#: host-callback lowering).
PLATFORMS = frozenset({"tpu"})

#: An operand larger than this travels as a transfer of its own, in its own dtype: packing
#: bitcasts it to bytes on the device, which a TPU pays for in relayouts (a 4 MiB row took
#: 4.4 ms packed against 1.3 ms sent as it is, docs/tpu/bench-2026-12-05.json), while the
#: fixed cost of one more transfer (about 240 µs) is small beside its own.
PACK_LIMIT_BYTES = 64 << 10

_U32 = np.dtype(np.uint32)
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
            outs[i] = np.empty(a.shape, a.dtype)
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


def _sharding(ctx: Any, avals_out: Sequence[Any]) -> Any:
    return compat.callback_op_sharding(ctx.module_context.axis_context, None, avals_out)


def _finish(ctx: Any, token: Any) -> None:
    ctx.set_tokens_out(
        ctx.tokens_in.update_tokens(compat.mlir.TokenSet({host_callback_effect: token})))


def tap(ctx: Any, args: Sequence[Any], avals_in: Sequence[Any], *, with_pid: bool,
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


def call(ctx: Any, args: Sequence[Any], avals_in: Sequence[Any], avals_out: Sequence[Any], *,
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


def fence(ctx: Any, token: Any) -> None:
    """A send and a receive after ``token`` whose host side does nothing: the computation
    ends only once the host has run every callback it made.

    A TPU's computation can finish before the host has run the callbacks of its sends
    (measured: a ``barrier_wait`` right after five one-record computations found four rows,
    and taps from computations dispatched back to back came interleaved); the host runs a
    computation's callbacks one after the other, so once this one has run, all have. One
    round trip per computation (about 700 µs on a TPU v5e), not per tap."""
    sharding = _sharding(ctx, [])
    channel, token = compat.send_to_host(ctx, token,
                                         compat.mlir.ir_constant(np.zeros((1,), np.uint8)),
                                         sharding)
    back, _, _ = compat.receive_from_host(ctx, token, _DUMMY, _sharding(ctx, [_DUMMY]))
    compat.add_host_transfer_callback(ctx, lambda *_: (np.zeros((), np.float32),),
                                      [_aval((1,), np.uint8)], [_DUMMY], [channel], [back])
