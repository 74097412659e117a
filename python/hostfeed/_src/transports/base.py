"""The :class:`Transport` type: what a transport offers the lowering rules and the
Recorder. Its instances are the transports (``native.TRANSPORT``, ``tpu.TRANSPORT``,
``portable.TRANSPORT``); :mod:`hostfeed._src.transports` chooses one per lowering context.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Optional, Protocol


class Tap(Protocol):
    """A tap of ``args`` (of ``avals_in``); returns the operation that orders after it
    (None where later uses of the operands need not wait for it)."""

    def __call__(self, ctx: Any, args: Sequence[Any], avals_in: Sequence[Any],
                 per_device: bool, *, consumer_id: int, flags: int) -> Any: ...


class Call(Protocol):
    """A call of the host function ``name`` on ``args``; returns the operation and the
    call's results (of ``avals_out``)."""

    def __call__(self, ctx: Any, args: Sequence[Any], avals_in: Sequence[Any],
                 avals_out: Sequence[Any], per_device: bool, *, consumer_id: int, flags: int,
                 timeout_ms: int, name: str) -> tuple[Any, list]: ...


@dataclasses.dataclass(frozen=True)
class Transport:
    """One way for hostfeed's primitives to reach the host: its name, the Recorder's
    policies on it, and what it emits in a lowering rule's context ``ctx``.

    Example:
        >>> from hostfeed._src.transports import native
        >>> isinstance(native.TRANSPORT, Transport), native.TRANSPORT.name
        (True, 'native')
    """

    #: Its name: the value of ``HOSTFEED_TRANSPORT`` that forces it, and in a compile
    #: failure's note.
    name: str
    #: Whether a summary recorded at selected steps is computed at every step, outside the
    #: ``cond`` that sends it (where a compiler fails on a summary in such a ``cond``).
    summarize_every_step: bool
    #: Whether a recorded step's records leave as outputs by default (where a transfer
    #: inside the computation costs more than a copy of an output).
    records_as_outputs: bool
    #: Whether hostfeed's own compute kernels (the summaries' custom calls) are used.
    native_kernels: bool
    #: Whether the device runs one computation at a time, so that a computation with a
    #: call, compiled by a host function on the receiver thread, would wait for itself.
    one_computation_at_a_time: bool
    #: Before a rule registered for ``rule_platform`` (None: the default rule) lowers in
    #: ``ctx``; raises where this transport cannot serve.
    prepare: Callable[[Any, Optional[str]], None]
    #: At the end of a token scope, after its callbacks (``token``: hostfeed's token after
    #: the last of them).
    end_scope: Callable[[Any, Any], None]
    tap: Tap
    call: Call
    #: Fails the computation when the status (``args[0]``) of a call names a failure.
    check: Callable[[Any, Sequence[Any], Sequence[Any], bool], None]
    #: The text of the failed call ``status`` names, as ``uint8[n]``.
    failure: Callable[[Any, Any, bool], list]
