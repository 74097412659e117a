"""The JAX internals that a TPU's host transfers and compile failures need: the other half
of :mod:`hostfeed._src.compat` (which re-exports every name here), split off by concern.
Imported only by that package's ``__init__``."""
from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import jax
from jax._src import callback as _callback
from jax._src import compiler as _compiler
from jax._src import pickle_util as _pickle_util
from jax._src.lib.mlir.dialects import hlo


# ---- Host transfers (transports/tpu.py): TPUs' send/recv to the host ----------
# jax 0.10-0.12: `callback.send_to_host(module_ctx, channel, token, operand, *, sharding)`
# and `callback.receive_from_host(module_ctx, channel, token, out_aval, *, sharding)` emit
# `stablehlo.send`/`recv` with `is_host_transfer` and the rendezvous attributes PJRT's
# host callbacks match on; `Client.make_python_callback_from_host_send_and_recv(fn,
# operand_shapes, result_shapes, send_channels, recv_channels, serializer)` makes the
# host side, added to the module with `ModuleContext.add_host_callback`. This is what
# `callback._emit_tpu_python_callback` does, without the extra receive it adds to every
# callback that returns a token (a second transfer the device waits for).


def jax_ordered_io_effect() -> Any:
    """The effect of ``io_callback(ordered=True)`` (the bench's raw transfers order on it)."""
    return _callback._OrderedIOEffect


def after_all(tokens: Sequence[Any]) -> Any:
    """A token after every one of ``tokens``."""
    return hlo.after_all(list(tokens))


def xla_shape(aval: Any) -> Any:
    """The XLA shape of ``aval`` (what the host callback's operands and results declare)."""
    return _callback._aval_to_xla_shape(aval)


def send_to_host(ctx: Any, token: Any, operand: Any, sharding: Any) -> tuple[int, Any]:
    """``stablehlo.send`` of ``operand`` to the host after ``token``; returns the channel
    and the token that orders after the send."""
    mc = ctx.module_context
    channel = mc.new_channel()
    return channel, _callback.send_to_host(mc, channel, token, operand, sharding=sharding)


def receive_from_host(ctx: Any, token: Any, aval: Any, sharding: Any) -> tuple[int, Any, Any]:
    """``stablehlo.recv`` of an ``aval`` from the host after ``token``; returns the channel,
    the token after it and the value."""
    mc = ctx.module_context
    channel = mc.new_channel()
    token, value = _callback.receive_from_host(mc, channel, token, aval, sharding=sharding)
    return channel, token, value


def add_host_transfer_callback(ctx: Any, fn: Any, operand_avals: Sequence[Any],
                               result_avals: Sequence[Any], sends: Sequence[int],
                               recvs: Sequence[int]) -> None:
    """Makes ``fn`` the host side of the transfers on channels ``sends`` (its arguments,
    one numpy array each, once all arrived) and ``recvs`` (what it returns, in order)."""
    mc = ctx.module_context
    backend = mc.get_backend()
    callback = backend.make_python_callback_from_host_send_and_recv(
        fn, [xla_shape(a) for a in operand_avals], [xla_shape(a) for a in result_avals],
        list(sends), list(recvs), _pickle_util.dumps)
    mc.add_host_callback(callback)


# ---- Compile failures of computations that tap (compiler) --------------------------------
# jax 0.10-0.12: `compiler.compile_or_get_cached(backend, computation, ...)` compiles every
# jitted computation (pxla calls it through the module attribute) with the `ir.Module`
# that the lowering rules built. A failure of one that holds hostfeed's operations gets a
# note naming the platform and the operations, so that a platform or JAX release that no
# longer accepts hostfeed's lowering says so at the first use.
_lowered_here: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def note_lowered(ctx: Any, what: str) -> None:
    """Notes that the module ``ctx`` lowers holds hostfeed's ``what`` (named in a note if
    its compilation fails)."""
    _lowered_here.setdefault(ctx.module_context.module, set()).add(what)


def compile_failure_note(module: Any, platform: str) -> str | None:
    """The note a compile failure of ``module`` on ``platform`` gets (None: it holds none
    of hostfeed's operations)."""
    ops = _lowered_here.get(module)
    if not ops:
        return None
    return (f"hostfeed: the computation that failed to compile for {platform} holds "
            f"hostfeed's {', '.join(sorted(ops))} (jax {jax.__version__}); if the error is "
            f"about those operations, this platform or JAX release does not accept hostfeed's "
            f"lowering of them: please report it with this message, and meanwhile run the "
            f"computation on another platform, e.g. under jax.default_device(jax.devices("
            f"'cpu')[0]).")


def _wrap_compile() -> bool:
    orig = getattr(_compiler, "compile_or_get_cached", None)
    if orig is None or getattr(orig, "_hostfeed", False):
        return orig is not None

    def compile_or_get_cached(backend: Any, computation: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return orig(backend, computation, *args, **kwargs)
        except Exception as exc:
            note = compile_failure_note(computation, getattr(backend, "platform", "?"))
            if note is not None:
                exc.add_note(note)
            raise

    compile_or_get_cached._hostfeed = True  # type: ignore[attr-defined]
    _compiler.compile_or_get_cached = compile_or_get_cached
    return True


COMPILE_FAILURES_NAMED = _wrap_compile()
