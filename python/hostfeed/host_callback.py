"""Host callbacks for JAX: a drop-in for the removed ``jax.experimental.host_callback``.

``id_tap(tap_func, arg)`` behaves like the identity on ``arg`` and, as a side effect, calls
``tap_func(arg, transforms)`` on the host with the runtime value of ``arg`` as numpy
arrays. ``id_print`` is ``id_tap`` with a printing function. Taps work eagerly and under
``jax.jit``, nested jit, ``lax.cond``, ``lax.while_loop`` (body and predicate),
``lax.scan`` and ``lax.fori_loop``, and run in program order.

By default taps run as the legacy module ran them: on CPUs and GPUs a tap's function has
run before the computation goes on past it, so code that reads what its tap functions
wrote once the results are ready (or right after an eager call) finds it complete; on
TPUs taps are asynchronous, as there. Asynchronous taps (``HOSTFEED_SYNC_TAPS=0``,
:func:`set_sync_taps`, :func:`sync_taps`, ``id_tap(..., sync=False)``) only copy the
tapped arrays into a byte-bounded queue in Rust, and a receiver thread then calls your
Python functions, in order, while the computation goes on: use :func:`barrier_wait` to
wait until every tap of the computations dispatched so far has been processed.
Exceptions raised by tap functions are logged with their traceback, the receiver keeps
going, and the next :func:`barrier_wait` raises :class:`CallbackException` carrying the
last one.

:func:`call` sends values to the host and returns the host function's results to the
computation, which waits for them; a failing host function fails the computation with an
exception that names it (and is also recorded for :func:`barrier_wait`).

Under transformations taps keep working and tell the host what was applied through
``transforms``, a tuple of ``(name, params)`` pairs: ``('batch', {'batch_dims': ...})``
under ``vmap``; under autodiff, in the default ``'transforms'`` mode, ``('jvp', {})`` and
``('transpose', {})`` (``jvp`` taps ``(primals, tangents)``; ``grad`` taps the primals in the
forward pass and the cotangents in the backward pass). The ``'primals'`` mode (JAX 0.4.x's
final module) taps only primal values; choose it with ``HOSTFEED_AD_TAPS=primals`` or
:func:`set_ad_taps`.

On several devices, ``pmap`` and ``shard_map`` tap per device; ``jit`` over sharded arrays
taps the whole logical operand once, on device ``device_index`` of the computation. With
many processes (``jax.distributed``) a callback runs in the process that owns its device:
per-device taps in each device's process, a global-view tap or call once in the process
owning device ``device_index`` (a call's results reach every process's shards).

Environment variables (the legacy names):

* ``JAX_HOST_CALLBACK_MAX_QUEUE_BYTE_SIZE`` (default ``256e6``): bytes of tapped data that
  may wait for the host; when the queue is full, devices pause until callbacks catch up.
* ``JAX_HOST_CALLBACK_INLINE=1``: outside of ``jit`` and control flow, run tap functions
  inline in the calling thread (so their exceptions propagate with your stack).
* ``HOSTFEED_AD_TAPS`` (``transforms`` or ``primals``): what taps see under autodiff.
* ``HOSTFEED_SYNC_TAPS``: ``0``: taps are asynchronous; ``1``: synchronous everywhere;
  unset: the legacy module's way (synchronous on CPUs and GPUs); see :func:`set_sync_taps`.
* ``HOSTFEED_CALL_TIMEOUT``: seconds a :func:`call` waits for its host function.
* ``HOSTFEED_STOP_TIMEOUT``: seconds without progress after which stopping the receiver
  fails the calls waiting on a stuck callback (default 10).

Example:
    >>> import jax, jax.numpy as jnp
    >>> from hostfeed import host_callback as hcb
    >>> seen = []
    >>> @jax.jit
    ... def f(x):
    ...     y = hcb.id_tap(lambda v, transforms: seen.append(v.tolist()), x * 2)
    ...     return y + 1
    >>> f(jnp.arange(3.)).tolist()
    [1.0, 3.0, 5.0]
    >>> seen                    # (by default the tap has run once the result is ready)
    [[0.0, 2.0, 4.0]]
"""
from __future__ import annotations

import contextlib
import difflib
import inspect
import types
from typing import Any, Optional, TypeVar, overload
from collections.abc import Callable, Iterator, Sequence

import jax
import numpy as np

from . import _receiver
from ._src import compat, dtypes, eager, lifecycle, placement, settings
from ._src.errors import CallbackException
from ._src.primitives import (CallbackKind, CallbackSpec, get_ad_taps, get_sync_taps, host_call_p,
                              outside_call_p, outside_call_params, set_ad_taps as _set_ad_taps,
                              sync_taps_state, tap_sync_param)
from ._src.printing import Printer

__all__ = [
    "id_tap", "id_print", "call", "barrier_wait", "stop_outfeed_receiver",
    "CallbackException", "TapFunctionException", "set_ad_taps", "get_ad_taps",
    "set_sync_taps", "get_sync_taps", "sync_taps",
]

T = TypeVar("T")
R = TypeVar("R")

# (Bound once: on Python 3.11 a member looked up on its enum class costs 0.1 µs a call.)
_TAP, _CALL = CallbackKind.TAP, CallbackKind.CALL


TapFunctionException = CallbackException  # legacy alias


def set_ad_taps(mode: str) -> None:
    """Chooses what taps see under autodiff, for functions traced from now on.

    * ``'transforms'`` (default; the legacy module's documented behaviour): under ``jvp``
      one callback receives ``(primals, tangents)`` with ``'jvp'`` in ``transforms``; under
      ``grad``/``vjp`` the forward pass taps the primals and the backward pass taps the
      cotangents with ``['jvp', 'transpose']``.
    * ``'primals'`` (JAX 0.4.x's final legacy module): taps see only primal values, with no
      autodiff entry in ``transforms``, and the backward pass does not tap; tap tangents or
      cotangents yourself inside ``jax.custom_jvp``/``jax.custom_vjp`` rules.

    ``vmap`` behaves the same in both modes. The initial mode comes from the environment
    variable ``HOSTFEED_AD_TAPS``. The mode is part of JAX's tracing and compilation cache
    keys, so a jitted function called after a switch is traced again in the new mode.

    Example:
        >>> from hostfeed import host_callback as hcb
        >>> hcb.set_ad_taps("primals"); hcb.get_ad_taps()
        'primals'
        >>> hcb.set_ad_taps("transforms")
    """
    _set_ad_taps(mode)


def set_sync_taps(sync: Optional[bool]) -> None:
    """Makes taps traced from now on synchronous (``True``), asynchronous (``False``), or
    run as the legacy module ran them (``None``: the default).

    A synchronous tap's function has run before the computation goes on past the tap, so
    once a result of the computation is ready (``block_until_ready()``, ``print``, a
    conversion to numpy), every synchronous tap before it has run; no ``barrier_wait`` is
    needed; an eager tap has run when ``id_tap`` returns, and an eager loop or conditional
    that taps (``lax.while_loop`` outside ``jit``) returns once its taps have run. This is
    what the legacy module did on CPUs and GPUs, and what the default mode does there (on
    a TPU, whose legacy taps were asynchronous, the default leaves them asynchronous). On
    a CPU the tap function runs on the device's thread, as a JAX callback does, and costs
    the computation about what the fastest of them costs; a tap with nothing else pending
    never waits for the receiver's thread.

    An asynchronous tap only copies its operands into hostfeed's queue (well under a
    microsecond for a small tap) and its function runs later on the receiver's thread,
    while the computation goes on: use :func:`barrier_wait` before reading what the tap
    functions wrote. The initial mode comes from ``HOSTFEED_SYNC_TAPS`` (read at import:
    ``1``: synchronous, ``0``: asynchronous, unset: the default); ``id_tap(...,
    sync=True)`` chooses per tap and ``with hcb.sync_taps(...):`` for a block. The mode is
    part of JAX's cache keys, so switching retraces. Exceptions of tap functions are
    recorded for the next :func:`barrier_wait` in every mode; the computation goes on.

    Example:
        >>> from hostfeed import host_callback as hcb
        >>> hcb.set_sync_taps(False); hcb.get_sync_taps()
        False
        >>> hcb.set_sync_taps(None)
    """
    jax.config.update("hostfeed_sync_taps", _mode_of(sync, "set_sync_taps(sync)"))


def _mode_of(sync: Any, what: str) -> str:
    if sync is None:
        return "legacy"
    if not isinstance(sync, (bool, np.bool_)):
        raise TypeError(f"{what}: expected True, False or None (the default), got {sync!r}")
    return "sync" if sync else "async"


@contextlib.contextmanager
def sync_taps(sync: Optional[bool] = True) -> Iterator[None]:
    """Within the block, taps traced (and jitted functions called) are synchronous
    (``True``), asynchronous (``False``) or as by default (``None``); see
    :func:`set_sync_taps`. Applies to the calling thread.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from hostfeed import host_callback as hcb
        >>> seen = []
        >>> f = jax.jit(lambda x: hcb.id_tap(lambda v, tr: seen.append(int(v)), x) + 1)
        >>> with hcb.sync_taps(False):
        ...     y = f(jnp.int32(1)).block_until_ready()
        ...     hcb.barrier_wait()                  # asynchronous: wait for the taps
        >>> seen
        [1]
    """
    with sync_taps_state(_mode_of(sync, "sync_taps(sync)")):
        yield


def _check_callable(func: Any, what: str) -> None:
    if not callable(func):
        raise TypeError(f"{what} must be callable, got {type(func).__name__}: {func!r}")


def _bind_problem(func: Any, n_args: int, with_device: bool) -> tuple[str, str] | None:
    """``(func with its signature, why)`` if ``func(*n_args positional, [device=...])``
    would fail to bind, else None (also when the signature cannot be read, as for some
    builtins)."""
    try:
        sig = inspect.signature(func)
    except (TypeError, ValueError):
        return None
    try:
        if with_device:
            sig.bind(*([None] * n_args), device=None)
        else:
            sig.bind(*([None] * n_args))
    except TypeError as exc:
        name = getattr(func, "__name__", None) or type(func).__name__
        return f"{name}{sig}", str(exc)
    return None


# Signature checks of plain functions, by what decides them: the code object and which
# defaults exist (closures made by one `def` share them, so an eager tap with a fresh
# lambda per call pays a dict lookup).
_BIND_CACHE: dict[tuple, tuple[str, str] | None] = {}


def _check_signature(func: Any, n_args: int, with_device: bool) -> tuple[str, str] | None:
    if getattr(func, "__hostfeed_by_value__", False):  # hostfeed's own (id_print)
        return None
    if not isinstance(func, types.FunctionType) or func.__dict__:  # __wrapped__, ...
        return _bind_problem(func, n_args, with_device)
    key = (func.__code__, len(func.__defaults__ or ()), frozenset(func.__kwdefaults__ or ()),
           n_args, with_device)
    try:
        return _BIND_CACHE[key]
    except KeyError:
        pass
    problem = _bind_problem(func, n_args, with_device)
    if len(_BIND_CACHE) < 4096:
        _BIND_CACHE[key] = problem
    return problem


def _check_tap_func(tap_func: Any, tap_with_device: bool, api: str) -> None:
    """Refuses, where the tap is written, a tap function that cannot be called as
    ``tap_func(arg, transforms)`` (``device=`` too with ``tap_with_device``)."""
    _check_callable(tap_func, f"{api}: tap_func")
    problem = _check_signature(tap_func, 2, tap_with_device)
    if problem is None:
        return
    func, why = problem
    if tap_with_device:
        how, example, wrap = ("tap_func(arg, transforms, device=dev)",
                              "def tap(x, transforms, *, device): ...",
                              "lambda x, transforms, device: f(x)")
    else:
        how, example, wrap = ("tap_func(arg, transforms)", "def tap(x, transforms): ...",
                              "lambda x, transforms: f(x)")
    raise TypeError(
        f"{api}: tap functions are called as {how}, but {func} cannot be ({why}). A tap "
        f"function takes the value and the transformations applied (a tuple of "
        f"(name, params) pairs, empty without any)"
        f"{', and the device as a keyword' if tap_with_device else ''}: write "
        f"`{example}`, or wrap an io_callback-style function f as `{wrap}`")


def _check_call_func(func: Any, with_device: bool) -> None:
    _check_callable(func, "call: callback_func")
    problem = _check_signature(func, 1, with_device)
    if problem is None:
        return
    name, why = problem
    how = "callback_func(arg, device=dev)" if with_device else "callback_func(arg)"
    raise TypeError(
        f"call: host functions are called as {how}, but {name} cannot be ({why}). It "
        f"takes the value sent (one pytree, as `arg` was given)"
        f"{' and the device as a keyword' if with_device else ''} and returns results "
        f"matching result_shape")


def _check_leaves(leaves: list, api: str, what: str) -> list:
    out = []
    for i, leaf in enumerate(leaves):
        x = leaf
        if compat.is_tracer(x) or isinstance(x, (jax.Array, np.ndarray, np.generic)):
            dtype = x.dtype
        elif isinstance(x, (bool, int, float, complex)):
            x = jax.numpy.asarray(x)
            dtype = x.dtype
        elif hasattr(x, "__jax_array__"):
            x = x.__jax_array__()
            dtype = x.dtype
        else:
            raise TypeError(
                f"{api}: leaf {i} of `{what}` has type {type(x).__name__}, which is not a JAX "
                f"type; pass arrays, numpy values or Python scalars (wrap other data in a "
                f"closure of the tap function instead)")
        swapped = dtypes.byte_order_problem(dtype)
        if swapped is not None:
            raise TypeError(f"{api}: leaf {i} of `{what}` has {swapped}")
        if np.dtype(dtype) not in dtypes.SUPPORTED_DTYPES:
            raise TypeError(
                f"{api}: leaf {i} of `{what}` has dtype {dtype}, which hostfeed cannot transfer "
                f"to the host. Supported: bool, (u)int8-64, float16/bfloat16/32/64, "
                f"complex64/128 and the float8 types; cast first, e.g. x.astype(jnp.int8)")
        dtypes.check_size(np.shape(x), dtype, api, f"leaf {i} of `{what}`")
        out.append(x)
    return out


def _device_index_arg(device_index: Any, api: str) -> int:
    if isinstance(device_index, bool) or not isinstance(device_index, (int, np.integer)) \
            or device_index < 0:
        raise ValueError(f"{api}: device_index must be a non-negative int, got {device_index!r}")
    return int(device_index)


@overload
def id_tap(tap_func: Callable, arg: T, *, result: None = None, tap_with_device: bool = False,
           device_index: int = 0, sync: Optional[bool] = None, **kwargs: Any) -> T: ...
@overload
def id_tap(tap_func: Callable, arg: Any, *, result: R, tap_with_device: bool = False,
           device_index: int = 0, sync: Optional[bool] = None, **kwargs: Any) -> R: ...
def id_tap(tap_func: Callable, arg: Any, *, result: Any = None, tap_with_device: bool = False,
           device_index: int = 0, sync: Optional[bool] = None, **kwargs: Any) -> Any:
    """Identity on ``arg`` that also calls ``tap_func(arg, transforms)`` on the host.

    Args:
      tap_func: called as ``tap_func(arg, transforms)`` with ``arg`` as a pytree of numpy
        arrays and ``transforms`` a tuple of ``(name, params)`` pairs describing the JAX
        transformations applied (empty when none). With ``tap_with_device=True`` it is
        called as ``tap_func(arg, transforms, device=dev)``. Its return value is ignored.
        Its signature is checked here: an io_callback-style ``def f(x)`` is refused.
      arg: a pytree of JAX arrays, numpy values or Python scalars to send to the host. A
        typed PRNG key leaf is sent as its key data (what ``jax.random.key_data`` gives)
        and returned as the typed key.
      result: if given, the return value of ``id_tap`` (not sent to the host); the tap
        still runs even if only ``result`` is used, or nothing at all.
      tap_with_device: pass the originating ``jax.Device`` as the ``device`` keyword.
      device_index: under global-view sharding, which device of the computation collects
        the operand and runs the callback (the JAX 0.4.x keyword; default 0); with many
        processes, the tap function runs in that device's process only.
      sync: ``True``: the computation waits until ``tap_func`` has run (a synchronous tap,
        see :func:`set_sync_taps`); ``False``: asynchronous; ``None`` (default): the mode
        in effect (by default the legacy module's: synchronous but on TPUs).
      **kwargs: refused with the legacy module's explanation (use ``functools.partial``).

    Returns:
      ``arg``, or ``result`` if given.

    Raises:
      TypeError: ``tap_func`` is not callable or cannot be called with ``(arg,
        transforms)`` (and ``device=``), a leaf is not a transferable JAX value (for
        example an extended dtype other than a PRNG key), or extra keyword arguments were
        given.

    Example:
        >>> import jax.numpy as jnp
        >>> from hostfeed import host_callback as hcb
        >>> got = []
        >>> y = hcb.id_tap(lambda a, tr: got.append(a), jnp.float32(2.), result=jnp.int32(1))
        >>> hcb.barrier_wait(); (int(y), float(got[0]))
        (1, 2.0)
    """
    if kwargs:
        raise TypeError(_misspelt(kwargs, ("result", "tap_with_device", "device_index", "sync"))
                        + "Support for **kwargs in ``id_tap`` has been removed. Instead, "
                        "pre-apply keyword arguments, either by using a closure or by passing "
                        f"``functools.partial(tap_func, **kwargs)``. (id_tap got "
                        f"{sorted(kwargs)}.)")
    tap_with_device = settings.flag(tap_with_device, "id_tap: tap_with_device")
    _check_tap_func(tap_func, tap_with_device, "id_tap")
    return _tap(tap_func, arg, result, tap_with_device, device_index, sync, "id_tap")


def _misspelt(kwargs: dict, known: Sequence[str]) -> str:
    """'Did you mean ...?' for keywords close to one of ``known`` (empty if none)."""
    hints = []
    for k in sorted(kwargs):
        close = difflib.get_close_matches(k, known, n=1, cutoff=0.6)
        if close:
            hints.append(f"{k}= looks like a misspelt {close[0]}=")
    return f"{'; '.join(hints)}. " if hints else ""


def _sync_arg(sync: Any, api: str) -> bool | None:
    """``sync=`` of a tap as its primitive's parameter (None: the legacy mode's choice,
    made where it runs)."""
    if sync is None:
        return tap_sync_param()
    if not isinstance(sync, (bool, np.bool_)):
        raise TypeError(f"{api}: sync must be True, False or None (the mode in effect), got "
                        f"{sync!r}")
    return bool(sync)


def _outside_call(args: list, params: dict) -> list:
    """Binds ``outside_call_p``; outside any trace its evaluation rule runs directly
    (:func:`hostfeed._src.eager.outside_call`), and a traced tap never enters eager.py."""
    if compat.eval_trace_active() and not any([compat.is_tracer(a) for a in args]):  # noqa: C419
        return eager.outside_call(args, params)
    return outside_call_p.bind(*args, **params)


def _check_eager_device_index(device_index: int, leaves: list, api: str) -> None:
    """Eagerly (no leaf is traced), ``device_index`` names one of the devices that hold
    the operands, as under ``jit`` it names one of the computation's devices."""
    if device_index == 0 or any(compat.is_tracer(x) for x in leaves):
        return
    n = max((len(x.sharding.device_set) for x in leaves if isinstance(x, jax.Array)),
            default=1)
    placement.check_device_index(device_index, n, f"hold the operands of this eager {api}")


def _tap(tap_func: Any, arg: Any, result: Any, tap_with_device: bool, device_index: Any,
         sync: Any, api: str) -> Any:
    device_index = _device_index_arg(device_index, api)
    sync = _sync_arg(sync, api)
    arg_treedef: Any
    flat_args, arg_treedef = jax.tree_util.tree_flatten(arg)
    flat_args, arg_keys = dtypes.unwrap_keys(flat_args, api, "arg")
    flat_args = _check_leaves(flat_args, api, "arg")
    result_treedef: Any
    if result is not None:
        flat_results, result_treedef = jax.tree_util.tree_flatten(result)
        flat_results, result_keys = dtypes.unwrap_keys(flat_results, api, "result")
        flat_results = _check_leaves(flat_results, api, "result")
    else:
        flat_results, result_treedef = [], None
    _check_eager_device_index(device_index, [*flat_args, *flat_results], api)
    spec = CallbackSpec(tap_func, arg_treedef, tap_with_device, _TAP)
    outs = _outside_call([*flat_args, *flat_results],
                        outside_call_params(spec, len(flat_args), device_index=device_index,
                                            sync=sync))
    if result_treedef is None:
        return arg_treedef.unflatten(dtypes.rewrap_keys(outs[:len(flat_args)], arg_keys))
    return result_treedef.unflatten(dtypes.rewrap_keys(outs[len(flat_args):], result_keys))


@overload
def id_print(arg: T, *, result: None = None, tap_with_device: bool = False,
             device_index: int = 0, output_stream: Any = None,
             threshold: Optional[int] = None, sync: Optional[bool] = None,
             **kwargs: Any) -> T: ...
@overload
def id_print(arg: Any, *, result: R, tap_with_device: bool = False,
             device_index: int = 0, output_stream: Any = None,
             threshold: Optional[int] = None, sync: Optional[bool] = None,
             **kwargs: Any) -> R: ...
def id_print(arg: Any, *, result: Any = None, tap_with_device: bool = False,
             device_index: int = 0, output_stream: Any = None,
             threshold: Optional[int] = None, sync: Optional[bool] = None,
             **kwargs: Any) -> Any:
    """Like :func:`id_tap` with a tap function that prints ``arg`` on the host.

    Each print shows the ``kwargs`` first (sorted by key, as ``key: value``), together with
    the transforms and, with ``tap_with_device=True``, the device; then ``arg``, with arrays
    formatted by ``numpy.array2string`` (``threshold`` is passed to it). ``output_stream``,
    if given, receives ``output_stream.write(s)`` instead of ``print``. ``sync`` is
    :func:`id_tap`'s (so it is not printed).

    Example:
        >>> import io, jax.numpy as jnp
        >>> from hostfeed import host_callback as hcb
        >>> s = io.StringIO()
        >>> _ = hcb.id_print((jnp.float32(3.), jnp.float32(9.)), what="x,x^2", output_stream=s)
        >>> hcb.barrier_wait(); print(s.getvalue(), end="")
        what: x,x^2
        ( 3. 9. )
    """
    tap_with_device = settings.flag(tap_with_device, "id_print: tap_with_device")
    printer = Printer(output_stream, threshold, kwargs)
    return _tap(printer, arg, result, tap_with_device, device_index, sync, "id_print")


_RESULT_SHAPE_MSG = (
    "result_shape should be a pytree of values with structure matching the expected result "
    "of the callback function. The values must be either numeric scalars, or must have "
    "'shape' and 'dtype' attributes. Got {}")


def _result_avals(result_shape: Any) -> tuple[Any, tuple, tuple]:
    """(treedef, avals, key dtypes): a typed-key leaf is transferred as its key data."""
    flat, treedef = jax.tree_util.tree_flatten(result_shape)
    avals: list = []
    key_dtypes: list = []
    for i, r in enumerate(flat):
        key_dtypes.append(None)
        if dtypes.is_extended(getattr(r, "dtype", None)):
            if not dtypes.is_key(r.dtype):
                raise dtypes.refuse_extended("hcb.call", f"leaf {i} of `result_shape`", r.dtype)
            key_dtypes[-1] = r.dtype
            shape, dtype = dtypes.key_data_shape(tuple(r.shape), r.dtype)
            dtypes.check_size(shape, dtype, "hcb.call", f"leaf {i} of `result_shape`")
            avals.append(jax.core.ShapedArray(shape, dtype))
            continue
        try:
            if hasattr(r, "shape") and hasattr(r, "dtype"):
                shape = tuple(int(d) for d in r.shape)
                dtype = jax.dtypes.canonicalize_dtype(np.dtype(r.dtype))
            elif isinstance(r, (bool, int, float, complex, np.number, np.bool_)):
                shape = ()
                dtype = jax.dtypes.canonicalize_dtype(jax.numpy.result_type(r))
            else:
                raise TypeError(type(r))
        except (TypeError, ValueError, OverflowError):
            raise ValueError(_RESULT_SHAPE_MSG.format(result_shape)) from None
        if any(d < 0 for d in shape):
            raise ValueError(f"hcb.call: leaf {i} of `result_shape` has a negative dimension "
                             f"in its shape {shape}. " + _RESULT_SHAPE_MSG.format(result_shape))
        if np.dtype(dtype) not in dtypes.SUPPORTED_DTYPES:
            raise ValueError(
                f"hcb.call: result_shape has dtype {dtype}, which hostfeed cannot transfer. "
                + _RESULT_SHAPE_MSG.format(result_shape))
        dtypes.check_size(shape, dtype, "hcb.call", f"leaf {i} of `result_shape`")
        avals.append(jax.core.ShapedArray(shape, dtype))
    return treedef, tuple(avals), tuple(key_dtypes)


def call(callback_func: Callable, arg: Any, *, result_shape: Any = None,
         call_with_device: bool = False, device_index: int = 0) -> Any:
    """Calls ``callback_func(arg)`` on the host and returns its result to the computation.

    The device waits for the host's answer. Results must match ``result_shape``; any
    failure (the callback raises, returns the wrong pytree, shape or dtype, or a non-array)
    fails the computation with an exception in the caller that names the callback, what was
    expected and what was received, and is also recorded so that the next
    :func:`barrier_wait` raises :class:`CallbackException`. The receiver keeps working.

    Args:
      callback_func: called as ``callback_func(arg)`` (``callback_func(arg, device=d)``
        with ``call_with_device=True``) with ``arg`` as numpy arrays; returns a pytree of
        arrays or scalars.
      arg: a pytree of JAX arrays, numpy values or Python scalars sent to the host (typed
        PRNG keys as their key data).
      result_shape: a pytree of numeric scalars or objects with ``shape`` and ``dtype``
        (numpy arrays, ``jax.ShapeDtypeStruct``) describing the results; ``None`` or ``()``
        for no results. Dtypes are canonicalised as JAX does (``float64`` becomes
        ``float32`` unless x64 is enabled). For a leaf with a typed PRNG key dtype the host
        function returns the key data (``uint32``, shape ``shape + key shape``), and the
        computation gets typed keys.
      call_with_device: pass the originating ``jax.Device`` as the ``device`` keyword.
      device_index: under global-view sharding, which device of the computation makes the
        call (the JAX 0.4.x keyword; default 0); with many processes, the host function
        runs in that device's process and every process gets its part of the results.

    Returns:
      The callback's results, with the structure, shapes and dtypes of ``result_shape``.

    Raises:
      ValueError: ``result_shape`` is not a pytree of scalars or shape/dtype objects.
      TypeError: ``callback_func`` is not callable, a leaf of ``arg`` is not a JAX value,
        a leaf of ``arg`` or ``result_shape`` has an extended dtype other than a PRNG key,
        or the call is differentiated (use ``jax.custom_vjp``).

    The wait for the reply can be bounded with the environment variable
    ``HOSTFEED_CALL_TIMEOUT`` (seconds, read when the computation is compiled).

    Example:
        >>> import jax, jax.numpy as jnp, numpy as np
        >>> from hostfeed import host_callback as hcb
        >>> f = jax.jit(lambda x: hcb.call(np.sin, x, result_shape=x) * 2)
        >>> f(jnp.zeros(3)).tolist()
        [0.0, 0.0, 0.0]
    """
    call_with_device = settings.flag(call_with_device, "call: call_with_device")
    _check_call_func(callback_func, call_with_device)
    if _receiver.host.in_callback_thread():
        raise _receiver.error.CallbackContextError(
            "hostfeed: hcb.call was used inside a host callback; its reply would have to "
            "come from the callback thread, which is busy running this callback. Compute "
            "the value directly on the host instead.")
    device_index = _device_index_arg(device_index, "call")
    result_treedef, result_avals, result_keys = _result_avals(result_shape)
    flat_args, arg_treedef = jax.tree_util.tree_flatten(arg)
    flat_args, _ = dtypes.unwrap_keys(flat_args, "call", "arg")
    flat_args = _check_leaves(flat_args, "call", "arg")
    _check_eager_device_index(device_index, flat_args, "call")
    spec = CallbackSpec(callback_func, arg_treedef, call_with_device, _CALL)
    outs = host_call_p.bind(*flat_args, callback=spec, result_treedef=result_treedef,
                            result_avals=result_avals, device_index=device_index)
    return result_treedef.unflatten(dtypes.rewrap_keys(outs, result_keys))


def barrier_wait(logging_name: Optional[str] = None, *, timeout: Optional[float] = None) -> None:
    """Blocks until every callback of the computations dispatched so far has run.

    Waits for dispatched computations to finish sending, then for the receiver to process
    everything they sent. The GIL is released while waiting.

    Args:
      logging_name: a name used in the debug log for this wait.
      timeout: seconds to wait at most (None: no limit); past it ``TimeoutError`` is raised.

    Raises:
      CallbackException: a host callback raised since the last ``barrier_wait``; carries
        the last such exception (as ``__cause__``) and its formatted traceback.
      RecordingError: an open recorder's write failed (it flushes them all), or rows
        reached a recorder after its ``close()`` and were dropped (counted per array).
      RuntimeError: called from inside a host callback, where it would deadlock.

    Example:
        >>> from hostfeed import host_callback as hcb
        >>> hcb.barrier_wait("after_step")
    """
    lifecycle.barrier(logging_name, timeout)


def stop_outfeed_receiver() -> None:
    """Processes everything already sent, then stops the receiver's consumer thread.

    The receiver restarts by itself the next time a host callback is used (including by
    already-compiled functions). Exceptions recorded from callbacks are kept for the next
    :func:`barrier_wait`.

    Example:
        >>> from hostfeed import host_callback as hcb
        >>> hcb.stop_outfeed_receiver()
    """
    lifecycle.stop()
