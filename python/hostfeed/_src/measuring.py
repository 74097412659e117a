"""The hooks hostfeed's bench measures through: the one internal module ``hostfeed.bench``
imports beside the public API (``hostfeed``, ``hostfeed.host_callback``).

A benchmark needs what a user does not: to read and empty the receiver's timing
histograms between rounds; to turn off, for a round, what the code does to be fast (the
histograms themselves, a CPU ``call`` run on its device's thread, a device thread's yield
to the receiver thread on a shared CPU, fast dispatch's token handling; or the streaming
copies that are off by default turned on), so that both ways run side by side; JAX's own
costs with hostfeed's fast-dispatch markers set aside; XLA calling a handler that does
nothing (a small tap's floor); the portable transport forced on CPU; and on a TPU, raw
host transfers below hostfeed (:func:`raw_host_send`). Everything
here is a thin name for an internal piece, so that the bench never reaches into the
package's modules itself, and a change of those modules shows here, in one place.

Example:
    >>> from hostfeed._src import measuring
    >>> before = measuring.set_timing(False); measuring.set_timing(before)
    False
    >>> sorted(measuring.histograms())
    ['device_ns', 'handover_ns']
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np
from jax.extend.core import Primitive

from .. import _receiver
from . import compat, consumers, fast_dispatch, lifecycle, settings, transports
from .latency import PERCENTILES, summary_of_buckets
from .primitives import call_check_p

__all__ = [
    "PERCENTILES", "summary_of_buckets", "flag", "histograms", "reset_histograms",
    "set_timing", "stats", "set_max_queue_bytes", "reset_peak", "set_inline_calls",
    "calls_on_receiver_thread", "cpu_share",
    "token_chain_lowering", "devices_set_aside", "scoped_devices", "profiler_check",
    "registered_consumers", "forcing_transport", "noop_custom_call", "raw_host_send",
]

#: A public function's boolean argument, checked (``TypeError`` naming it otherwise).
flag = settings.flag
#: The receiver's timing histograms (``device_ns``, ``handover_ns``: ``[(upper bound,
#: count), ...]``), since the last :func:`reset_histograms`.
histograms = lifecycle.histograms
#: Empties the timing histograms.
reset_histograms = lifecycle.reset_histograms
#: Turns the recording of the timing histograms on or off; returns the previous setting.
set_timing = lifecycle.set_timing
#: The receiver's counters (``hostfeed.receiver_stats()`` without the distributions).
stats = lifecycle.stats
#: Changes the queue's byte bound (``JAX_HOST_CALLBACK_MAX_QUEUE_BYTE_SIZE``) at once.
set_max_queue_bytes = lifecycle.set_max_queue_bytes
#: Forgets the peak of the queued bytes.
reset_peak = lifecycle.reset_peak
#: Within the block, computations keep JAX's token chain (as with
#: ``HOSTFEED_FAST_DISPATCH=0``).
token_chain_lowering = fast_dispatch.token_chain_lowering
#: Within the block, hostfeed waits as if no token-scoped computation had been compiled:
#: JAX's own barrier costs, without hostfeed's markers.
devices_set_aside = fast_dispatch.devices_set_aside
#: The devices computations in a token scope were compiled for (a barrier marks each).
scoped_devices = fast_dispatch.scoped_devices
#: What the receiver thread asks once per batch: whether ``jax.profiler`` traces.
profiler_check = compat.host_tracing
#: How many tap and call functions are registered now.
registered_consumers = consumers.registered_consumers
#: Computations traced in the block use the transport named (``"native"``, ``"jax"``,
#: ``"tpu"``; None: chosen per platform).
forcing_transport = transports.forcing


def set_inline_calls(enabled: bool) -> bool:
    """Lets a CPU ``call`` run its host function on its device's thread when nothing else
    is pending (True, the default) or keeps every call on the receiver thread; returns the
    previous setting."""
    return _receiver.host.set_inline_calls(enabled)


@contextlib.contextmanager
def calls_on_receiver_thread() -> Iterator[None]:
    """Within the block, every ``call`` runs its host function on the receiver thread (as
    with ``HOSTFEED_CALL_THREAD=receiver``)."""
    before = set_inline_calls(False)
    try:
        yield
    finally:
        set_inline_calls(before)


@contextlib.contextmanager
def cpu_share(keep_in_step: bool = True, stream: bool = False) -> Iterator[None]:
    """Within the block, after a large tap, a device's thread on the receiver thread's CPU
    yields it (``keep_in_step``: True, as hostfeed does by default), and one on another CPU
    copies large taps with non-temporal stores (``stream``: False, as by default).
    """
    host = _receiver.host
    step = host.set_cpu_share_step_bytes(
        host.DEFAULT_CPU_SHARE_STEP_BYTES if keep_in_step else 0)
    streams = host.set_cpu_share_stream_bytes(
        host.DEFAULT_CPU_SHARE_STREAM_BYTES if stream else 0)
    try:
        yield
    finally:
        host.set_cpu_share_step_bytes(step)
        host.set_cpu_share_stream_bytes(streams)


def noop_custom_call(operand: Any) -> None:
    """Inside a traced function: a custom call of hostfeed's that returns at once (its
    check target with a zero status), threaded on the same effect token as a tap: XLA's own
    cost of calling a handler. ``operand`` is an int32 scalar it multiplies by zero."""
    call_check_p.bind(operand * 0)


# ----------------------------------------------------------------------------------------
# A TPU's host transfers as JAX lowers them, below hostfeed (the TPU bench's paths).

_EFFECT = compat.jax_ordered_io_effect()

raw_send_p = Primitive("hostfeed_bench_raw_send")
raw_send_p.multiple_results = True
raw_send_p.def_effectful_abstract_eval(lambda *avals, **params: ([], {_EFFECT}))


def _raw_send_lowering(ctx: Any, *args: Any, receive: bool, overlap: bool) -> list:
    token = ctx.tokens_in.get(_EFFECT)
    sharding = compat.callback_op_sharding(ctx.module_context.axis_context, None, [])
    values, avals = list(args), list(ctx.avals_in)
    channels, tokens = [], []
    for value in values:
        channel, after = compat.send_to_host(ctx, token, value, sharding)
        channels.append(channel)
        tokens.append(after)
        if not overlap:
            token = after
    token = compat.after_all(tokens) if overlap and len(tokens) > 1 else tokens[-1]
    recvs, results = [], []
    if receive:
        dummy = jax.core.ShapedArray((), np.float32)
        channel, token, _ = compat.receive_from_host(ctx, token, dummy, sharding)
        recvs, results = [channel], [dummy]

    def host(*arrays: Any) -> tuple:
        return (np.zeros((), np.float32),) if receive else ()

    compat.add_host_transfer_callback(ctx, host, avals, results, channels, recvs)
    ctx.set_tokens_out(ctx.tokens_in.update_tokens(compat.mlir.TokenSet({_EFFECT: token})))
    return []


compat.mlir.register_lowering(raw_send_p, _raw_send_lowering, cacheable=False)


def raw_host_send(*values: Any, receive: bool = False, overlap: bool = False) -> None:
    """Inside a traced function: sends ``values`` to the host as JAX lowers a host
    callback's transfers (``stablehlo.send`` with ``is_host_transfer``, one per value,
    chained on one token, or all after the same token with ``overlap``), to a Python
    function that does nothing; with ``receive``, then receives a float32 scalar back (the
    shape of an ordered ``io_callback``). Only a backend with host transfers (a TPU) runs
    it."""
    raw_send_p.bind(*values, receive=receive, overlap=overlap)
