"""How hostfeed's primitives reach the host: a transport, chosen once per lowering context.

* :mod:`.native`: hostfeed's XLA FFI custom calls with handlers in Rust (CPU, and the GPU
  platforms of its table, where their handlers register);
* :mod:`.tpu`: a TPU's own host transfers, one send per tap (where JAX's lowering is
  taken and every platform lowered for is a TPU);
* :mod:`.portable`: JAX's own host-callback lowering (what ``io_callback`` uses), for every
  other platform, or everywhere when ``HOSTFEED_TRANSPORT=jax``.

Each is a whole transport (:class:`Transport`): ``prepare`` before a rule lowers, the
four operations ``tap``, ``call``, ``check`` (fail the computation on a failed call's
status) and ``failure`` (a failed call's message), ``end_scope`` at the end of a token
scope, and the policies the Recorder builds records by. The lowering rules
(``hostfeed._src.lowering``) decide where a callback runs and ask :func:`for_context`
which transport emits it; the Recorder asks :func:`platforms_with` (a choice JAX takes
when it lowers for a platform) or, where the choice shapes a whole step,
:func:`for_platform`. Adding a transport is one module with these functions and a line in
:func:`for_context`.

The transport forced for every platform is a JAX configuration state, ``hostfeed_transport``
(``"auto"``, ``"native"`` or ``"jax"``; its default from ``HOSTFEED_TRANSPORT``), so it is
part of JAX's tracing and compilation cache keys like the other modes.
"""
from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any, Optional, Protocol

import jax

from .. import compat, settings
from . import native, portable, tpu

#: Platforms listed by :func:`transports` besides those of this process's backends.
KNOWN_PLATFORMS = (*native.PLATFORMS, *sorted(tpu.PLATFORMS))

#: The platforms with a lowering rule of their own (the native ones; every other platform
#: takes the default rule).
RULE_PLATFORMS = native.PLATFORMS


class Transport(Protocol):
    """What a transport offers the lowering rules (the modules :mod:`.native`,
    :mod:`.tpu` and :mod:`.portable`)."""

    #: Its name in a compile failure's note.
    NAME: str
    #: Whether a summary recorded at selected steps is computed at every step, outside the
    #: ``cond`` that sends it (where a compiler fails on a summary in such a ``cond``).
    SUMMARIZE_EVERY_STEP: bool
    #: Whether a recorded step's records leave as outputs by default (where a transfer
    #: inside the computation costs more than a copy of an output).
    RECORDS_AS_OUTPUTS: bool
    #: Whether hostfeed's own compute kernels (the summaries' custom calls) are used.
    NATIVE_KERNELS: bool

    def prepare(self, ctx: Any, rule_platform: Optional[str]) -> None:
        """Before a rule registered for ``rule_platform`` (None: the default rule) lowers
        in ``ctx``; raises where this transport cannot serve."""

    def end_scope(self, ctx: Any, token: Any) -> None:
        """At the end of a token scope, after its callbacks (``token``: hostfeed's token
        after the last of them)."""

    def tap(self, ctx: Any, args: Sequence[Any], avals_in: Sequence[Any], per_device: bool, *,
            consumer_id: int, flags: int) -> Any: ...

    def call(self, ctx: Any, args: Sequence[Any], avals_in: Sequence[Any],
             avals_out: Sequence[Any], per_device: bool, *, consumer_id: int, flags: int,
             timeout_ms: int, name: str) -> tuple[Any, list]: ...

    def check(self, ctx: Any, args: Sequence[Any], avals_in: Sequence[Any],
              per_device: bool) -> None: ...

    def failure(self, ctx: Any, status: Any, per_device: bool) -> list: ...


_default = settings.transport() or "auto"
with settings.parsed_here(settings.TRANSPORT_ENV):
    forced_state = compat.enum_state(
        name="hostfeed_transport",
        enum_values=["auto", *settings.TRANSPORTS],
        default=_default,
        help="The transport of hostfeed's callbacks on every platform: 'auto' (native on "
             "CPU and GPUs with handlers, JAX's host-callback lowering elsewhere), "
             "'native' or 'jax'.",
        include_in_jit_key=True,
        include_in_trace_context=True,
    )


def forced() -> Optional[str]:
    """The transport forced for every platform (``HOSTFEED_TRANSPORT`` or :func:`forcing`);
    None: chosen per platform.

    Example:
        >>> forced() in (None, "native", "jax")
        True
    """
    value = forced_state.value
    return None if value == "auto" else value


def forcing(transport: Optional[str]) -> contextlib.AbstractContextManager:
    """Computations traced in the block use ``transport`` (``"native"``, ``"jax"``, or None:
    chosen per platform) as if ``HOSTFEED_TRANSPORT`` said so (this thread only).

    Example:
        >>> with forcing("jax"):
        ...     transport_for("cpu")
        'jax'
    """
    if transport is not None:
        transport = settings.check_transport(transport, "forcing(transport)")
    return forced_state("auto" if transport is None else transport)


def transport_for(platform: str) -> str:
    """``"native"`` or ``"jax"``: the transport hostfeed's callbacks use in computations
    lowered for ``platform``: native on CPU and the GPU platforms of the native table
    (where their handlers register on a backend), JAX's lowering elsewhere, unless one is
    forced.

    Example:
        >>> transport_for("tpu") == ("native" if forced() == "native" else "jax")
        True
    """
    chosen = forced()
    if chosen is not None:
        return chosen
    return "native" if native.unavailable(platform) is None else "jax"


def canonical(platform: str) -> str:
    """The platform computations lower for, as the lowering rules and the table of
    :func:`transports` name it, for a name a device or backend reports (a CUDA device's
    ``platform`` and ``jax.default_backend()`` there read ``"gpu"``: this is ``"cuda"``).

    Example:
        >>> canonical("cpu"), canonical("tpu")
        ('cpu', 'tpu')
    """
    return compat.canonical_platform(platform)


def transports() -> dict[str, str]:
    """The transport of each platform: CPU, CUDA, ROCm, TPU and those of this process's
    JAX backends (named as computations lower for them: ``cuda``, not a device's
    ``gpu``), as ``{platform: "native" | "jax"}``. (For a GPU platform this registers
    hostfeed's handlers if its backend exists, as the first lowering for it would.)

    Example:
        >>> sorted(transports())[:2]
        ['cpu', 'cuda']
    """
    platforms = list(KNOWN_PLATFORMS)
    for backend in ("cpu", "gpu", "tpu", None):
        with contextlib.suppress(RuntimeError):
            platforms += [canonical(d.platform) for d in jax.devices(backend)[:1]]
    return {p: transport_for(p) for p in dict.fromkeys(platforms)}


def platforms(ctx: Any) -> Sequence[str]:
    """The platforms the rule context ``ctx`` lowers for."""
    return ctx.platforms or ctx.module_context.platforms


def _of(lowered_for: Sequence[str]) -> Transport:
    if any(transport_for(p) == "jax" for p in lowered_for):
        if lowered_for and all(p in tpu.PLATFORMS for p in lowered_for):
            return tpu  # type: ignore[return-value]
        return portable  # type: ignore[return-value]
    return native  # type: ignore[return-value]


def for_context(ctx: Any) -> Transport:
    """The transport that emits hostfeed's operations in lowering context ``ctx``: JAX's
    lowering when any platform lowered for takes it (over a TPU's host transfers when all
    of them are TPUs), else the native one.

    Example:
        >>> class Ctx: platforms = ("tpu",)
        >>> for_context(Ctx()).NAME == ("native" if forced() == "native" else "host-transfer")
        True
    """
    return _of(platforms(ctx))


def for_platform(platform: Optional[str] = None) -> Transport:
    """The transport of computations lowered for ``platform`` (None: JAX's default
    backend), for decisions taken while tracing, before the platform lowered for is known.

    Example:
        >>> for_platform("tpu").RECORDS_AS_OUTPUTS == (forced() != "native")
        True
    """
    return _of([canonical(platform or jax.default_backend())])


def platforms_with(policy: str) -> tuple[str, ...]:
    """The known platforms whose transport holds ``policy`` (the name of one of a
    :class:`Transport`'s boolean policies), for a choice that JAX then takes when it lowers
    for a platform (:func:`jax.lax.platform_dependent`), not while tracing.

    Example:
        >>> "cpu" in platforms_with("SUMMARIZE_EVERY_STEP")
        False
    """
    return tuple(p for p in KNOWN_PLATFORMS if getattr(for_platform(p), policy))
