"""How hostfeed's primitives reach the host: a transport, chosen once per lowering context
and kept there.

Each transport is an instance of :class:`Transport` (:mod:`.base`), defined as
``TRANSPORT`` by its module:

* ``native`` (:mod:`.native`): hostfeed's XLA FFI custom calls with handlers in Rust (CPU,
  and the GPU platforms of its table, where their handlers register); it also registers
  the core's compute kernels (:func:`register_kernel`);
* ``tpu`` (:mod:`.tpu`): a TPU's own host transfers, one send per tap;
* ``jax`` (:mod:`.portable`): JAX's own host-callback lowering (what ``io_callback``
  uses), for every other platform.

A :class:`Transport` holds ``prepare`` (before a rule lowers), the four operations ``tap``,
``call``, ``check`` (fail the computation on a failed call's status) and ``failure`` (a
failed call's message), ``end_scope`` (at the end of a token scope), and the policies the
Recorder builds records by, as typed fields. :func:`row` is the one platform → transport
table, and :func:`choose` the one function that chooses: one transport for the platforms a
computation lowers for (as JAX's ``mlir.lower_per_platform`` takes a rule from a platform
→ rule table). Every decision goes through it:

* while lowering, :func:`for_context`: the choice is made at the first ask in a lowering
  context and kept in it (as crossbeam-channel keeps a channel's flavor), so the lowering
  rules, the end of a token scope (``fast_dispatch``) and the summaries' kernel rule
  (:func:`register_kernel`) of one computation all read the same transport;
* while tracing, :func:`for_platform` (the platform a step runs on) and
  :func:`platforms_where` (a choice JAX takes per platform when it lowers);
* :func:`transports` (``hostfeed.transports()``): each platform's :func:`row`, by name.

What the transports over JAX's host callbacks share is in :mod:`.common`.

The transport forced for every platform is a JAX configuration state, ``hostfeed_transport``
(``"auto"``, ``"native"``, ``"jax"`` or ``"tpu"``; its default from ``HOSTFEED_TRANSPORT``),
so it is part of JAX's tracing and compilation cache keys like the other modes.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Optional

import jax
import numpy as np

from .. import compat, settings
from . import native, portable, tpu
from .base import Transport

#: Platforms listed by :func:`transports` besides those of this process's backends.
KNOWN_PLATFORMS = (*native.PLATFORMS, *sorted(tpu.PLATFORMS))

#: The platforms with a lowering rule of their own (the native ones; every other platform
#: takes the default rule).
RULE_PLATFORMS = native.PLATFORMS


#: The transports by name (the values of ``HOSTFEED_TRANSPORT`` that force them).
BY_NAME: dict[str, Transport] = {t.name: t for t in (native.TRANSPORT, portable.TRANSPORT,
                                                     tpu.TRANSPORT)}


_default = settings.transport() or "auto"
with settings.parsed_here(settings.TRANSPORT_ENV):
    forced_state = compat.enum_state(
        name="hostfeed_transport",
        enum_values=["auto", *settings.TRANSPORTS],
        default=_default,
        help="The transport of hostfeed's callbacks on every platform: 'auto' (native on "
             "CPU and GPUs with handlers, a TPU's host transfers on TPUs, JAX's "
             "host-callback lowering elsewhere), 'native', 'jax' or 'tpu'.",
        include_in_jit_key=True,
        include_in_trace_context=True,
    )


def forced() -> Optional[str]:
    """The transport forced for every platform (``HOSTFEED_TRANSPORT`` or :func:`forcing`);
    None: chosen per platform.

    Example:
        >>> forced() in (None, "native", "jax", "tpu")
        True
    """
    value = forced_state.value
    return None if value == "auto" else value


def forcing(transport: Optional[str]) -> contextlib.AbstractContextManager:
    """Computations traced in the block use ``transport`` (``"native"``, ``"jax"``,
    ``"tpu"``, or None: chosen per platform) as if ``HOSTFEED_TRANSPORT`` said so (this
    thread only).

    Example:
        >>> with forcing("jax"):
        ...     row("cpu").name
        'jax'
    """
    if transport is not None:
        transport = settings.check_transport(transport, "forcing(transport)")
    return forced_state("auto" if transport is None else transport)


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
    """The transport of each platform, by name: CPU, CUDA, ROCm, TPU and those of this
    process's JAX backends (named as computations lower for them: ``cuda``, not a device's
    ``gpu``), each as :func:`choose` chooses for a computation lowered for it alone (its
    :func:`row`): ``"native"``, ``"tpu"`` or ``"jax"``. (For a GPU platform this registers
    hostfeed's handlers if its backend exists, as the first lowering for it would.)

    Example:
        >>> with forcing(None):
        ...     table = transports()
        >>> table["cpu"], table["tpu"]
        ('native', 'tpu')
    """
    platforms = list(KNOWN_PLATFORMS)
    for backend in ("cpu", "gpu", "tpu", None):
        with contextlib.suppress(RuntimeError):
            platforms += [canonical(d.platform) for d in jax.devices(backend)[:1]]
    return {p: choose([p]).name for p in dict.fromkeys(platforms)}


def platforms(ctx: Any) -> Sequence[str]:
    """The platforms the rule context ``ctx`` lowers for."""
    return compat.lowering_platforms(ctx)


def row(platform: str) -> Transport:
    """The platform → transport table: the transport of computations lowered for
    ``platform`` alone. Where none is forced: native where hostfeed's handlers serve it,
    a TPU's host transfers on a TPU, JAX's host-callback lowering elsewhere;
    ``HOSTFEED_TRANSPORT=jax`` keeps the last two.

    Example:
        >>> with forcing(None):
        ...     row("cpu").name, row("tpu").name, row("metal").name
        ('native', 'tpu', 'jax')
    """
    chosen = forced()
    if chosen is not None and chosen != "jax":
        return BY_NAME[chosen]
    if chosen is None and native.unavailable(platform) is None:
        return native.TRANSPORT
    return tpu.TRANSPORT if platform in tpu.PLATFORMS else portable.TRANSPORT


def choose(lowered_for: Sequence[str]) -> Transport:
    """The one transport of a computation lowered for the platforms ``lowered_for``: their
    common :func:`row`, or JAX's host-callback lowering where their rows differ (it serves
    every platform with JAX's host callbacks).

    Example:
        >>> with forcing(None):
        ...     choose(["tpu"]).name, choose(["tpu", "cpu"]).name
        ('tpu', 'jax')
    """
    chosen = {t.name: t for t in map(row, lowered_for)}
    if len(chosen) == 1:
        return next(iter(chosen.values()))
    return portable.TRANSPORT if chosen else native.TRANSPORT


class _Kept(NamedTuple):
    """The key of the transport kept in a lowering context for the platforms it lowers for
    (a type of hostfeed's own: no key of JAX's equals it)."""
    platforms: tuple[str, ...]


def for_context(ctx: Any) -> Transport:
    """The transport that emits hostfeed's operations in lowering context ``ctx``: chosen by
    :func:`choose` for the platforms ``ctx`` lowers for at the first ask in the module being
    lowered, and kept in its lowering (``compat.lowering_memo``: the choice, never an MLIR
    object, dies with the lowering), so that every rule of one computation, the end of its
    token scope and its summaries' kernels read one transport. Each branch of a lowering
    for several platforms at once asks for its own platforms, and keeps its own choice.

    Example:
        >>> class Ctx: platforms = ("tpu",)
        >>> for_context(Ctx()).name == ("native" if forced() == "native" else "tpu")
        True
    """
    lowered_for = _Kept(tuple(platforms(ctx)))
    memo = compat.lowering_memo(ctx)
    kept = memo.get(lowered_for)
    if kept is None:
        kept = memo[lowered_for] = choose(lowered_for.platforms)
    return kept


def for_platform(platform: Optional[str] = None) -> Transport:
    """The transport of computations lowered for ``platform`` (None: JAX's default
    backend), for decisions taken while tracing, before the platform lowered for is known.

    Example:
        >>> for_platform("tpu").records_as_outputs == (forced() != "native")
        True
    """
    return choose([canonical(platform or jax.default_backend())])


def platforms_where(policy: Callable[[Transport], bool]) -> tuple[str, ...]:
    """The known platforms whose transport ``policy`` holds for, for a choice that JAX then
    takes when it lowers for a platform (:func:`jax.lax.platform_dependent`), not while
    tracing.

    Example:
        >>> "cpu" in platforms_where(lambda t: t.summarize_every_step)
        False
    """
    return tuple(p for p in KNOWN_PLATFORMS if policy(for_platform(p)))


def register_kernel(prim: Any, target: str, fallback: Callable[..., Any],
                    constants: Callable[..., Sequence[np.ndarray]],
                    where: Callable[[Any], bool]) -> None:
    """Lowers ``prim`` (of one operand) to the native transport's compute kernel ``target``
    on the platforms it has kernels for (:data:`native.KERNEL_PLATFORMS`), where the
    transport kept for the context (:func:`for_context`) uses them and ``where(ctx)``
    holds, with the operands ``constants(**params)`` after the value; to ``fallback`` (a
    lowering rule) elsewhere.
    """
    def rule(ctx: Any, v: Any, **params: Any) -> Any:
        if not where(ctx) or not for_context(ctx).native_kernels:
            return fallback(ctx, v, **params)
        return native.kernel(ctx, target, v, constants(**params))

    for platform in native.KERNEL_PLATFORMS:
        compat.mlir.register_lowering(prim, rule, platform=platform)
