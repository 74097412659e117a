"""Python side of the native receiver (``hostfeed._receiver``).

Owns the consumer-id registry (which Python callable a custom call's ``consumer_id``
refers to), the dispatcher the Rust consumer thread calls with batches of messages, the
record of the last callback exception, lazy start and the ``atexit`` drain.
"""
from __future__ import annotations

import atexit
import functools
import hashlib
import logging
import os
import re
import threading
import traceback
import types
from typing import Any, Callable, Sequence

import jax
import ml_dtypes
import numpy as np

from . import _receiver

logger = logging.getLogger("hostfeed")

MAX_QUEUE_ENV = "JAX_HOST_CALLBACK_MAX_QUEUE_BYTE_SIZE"

# XLA_FFI_DataType code -> numpy scalar type, for every dtype hostfeed transfers.
_XLA_DTYPES: dict[int, Any] = {
    1: np.bool_, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64,
    6: np.uint8, 7: np.uint16, 8: np.uint32, 9: np.uint64,
    10: np.float16, 11: np.float32, 12: np.float64, 16: ml_dtypes.bfloat16,
    15: np.complex64, 18: np.complex128,
}
for _code, _name in ((19, "float8_e5m2"), (20, "float8_e4m3fn"), (23, "float8_e4m3b11fnuz"),
                     (24, "float8_e5m2fnuz"), (25, "float8_e4m3fnuz"), (28, "float8_e4m3"),
                     (29, "float8_e3m4"), (33, "float8_e8m0fnu")):
    if hasattr(ml_dtypes, _name):
        _XLA_DTYPES[_code] = getattr(ml_dtypes, _name)

#: numpy dtypes that taps can carry.
SUPPORTED_DTYPES: frozenset[np.dtype] = frozenset(np.dtype(t) for t in _XLA_DTYPES.values())


def max_queue_bytes_from_env() -> int | None:
    """The byte bound set by ``JAX_HOST_CALLBACK_MAX_QUEUE_BYTE_SIZE``, or None if unset.

    Accepts integers and float notation (``256e6``), as the legacy flag did.

    Example:
        >>> import os
        >>> os.environ.pop(MAX_QUEUE_ENV, None) and None
        >>> max_queue_bytes_from_env() is None
        True
    """
    text = os.environ.get(MAX_QUEUE_ENV)
    if text is None or not text.strip():
        return None
    try:
        value = int(float(text))
    except ValueError:
        raise ValueError(
            f"{MAX_QUEUE_ENV}={text!r} is not a number of bytes; use e.g. 256e6") from None
    if value <= 0:
        raise ValueError(f"{MAX_QUEUE_ENV}={text!r} must be a positive number of bytes")
    return value


class _Entry:
    """A registered consumer: the user's callable plus how to call it. For a ``call``,
    ``invoke`` also takes the reply handle and must answer it."""

    __slots__ = ("invoke", "name")

    def __init__(self, invoke: Callable[..., None], name: str):
        self.invoke = invoke
        self.name = name


class _State:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        # Consumer id -> entry (0 is never used). Entries live for the whole process
        # because compiled executables embed their ids.
        self.entries: dict[int, _Entry] = {}
        self.ids: dict[Any, int] = {}
        self.last_exception: tuple[BaseException, str] | None = None
        self.configured = False
        self.atexit_registered = False


_state = _State()


# Consumer ids and JAX's persistent compilation cache. The id is an attribute of the custom
# call, so it is part of the lowered module and hence of the cache key: a process that
# gets an executable from the cache has lowered the same module itself, and so registered
# each of its ids for its own functions first. Cache hits therefore always call the
# functions the hitting process wrote. For them to happen at all, a callback must get the
# same id in every process, whatever else was registered before it: the id is a hash of a
# description of the callback that holds no memory addresses (module and qualified name of
# the function, the pytree and transformation records, ...). Callbacks that this
# description cannot tell apart (closures made by one factory) are numbered in the order
# they are first lowered; two processes that lower them in another order may compile
# again, and never call the wrong one.

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _describe(obj: Any, depth: int = 0) -> str:
    """A text naming ``obj`` the same way in every process (no memory addresses).

    Example:
        >>> _describe((len, functools.partial(print, sep=","), None))
        "(builtins.len,partial(builtins.print;();sep=','),None)"
    """
    if depth > 8:
        text = type(obj).__qualname__
    elif obj is None or isinstance(obj, (bool, int, float, complex, str, bytes)):
        text = repr(obj)
    elif isinstance(obj, (tuple, list)):
        text = "(" + ",".join(_describe(o, depth + 1) for o in obj) + ")"
    elif isinstance(obj, functools.partial):
        kws = ";".join(f"{k}={_describe(v, depth + 1)}" for k, v in sorted(obj.keywords.items()))
        text = f"partial({_describe(obj.func, depth + 1)};{_describe(obj.args, depth + 1)};{kws})"
    elif isinstance(obj, types.MethodType):
        text = f"method({_describe(obj.__func__, depth + 1)};{type(obj.__self__).__qualname__})"
    elif isinstance(obj, (types.FunctionType, types.BuiltinFunctionType)):
        text = f"{getattr(obj, '__module__', None)}.{obj.__qualname__}"
    elif isinstance(getattr(type(obj), "__slots__", None), tuple) and type(obj).__slots__:
        # e.g. primitives.CallbackSpec: its fields, described the same way
        fields = ",".join(f"{n}={_describe(getattr(obj, n, None), depth + 1)}"
                          for n in type(obj).__slots__)
        text = f"{type(obj).__qualname__}({fields})"
    else:  # pytree definitions, abstract values, callable objects
        try:
            text = _ADDRESS.sub("", repr(obj))
        except Exception:  # noqa: BLE001 - a failing repr only makes the id less stable
            text = type(obj).__qualname__
    return text


def _id_candidate(description: str, attempt: int) -> int:
    digest = hashlib.blake2b(f"{attempt}:{description}".encode(), digest_size=8).digest()
    return (int.from_bytes(digest, "little") >> 2) or 1  # a positive int64, never 0


def register(key: Any, invoke: Callable[..., None], name: str) -> int:
    """Returns the consumer id for ``key``, registering ``invoke`` under it if new.

    The id depends only on what ``key`` describes (see the comment above), not on what
    else this process registered, so compiled code can be shared through JAX's persistent
    compilation cache.
    """
    with _state.lock:
        cid = _state.ids.get(key)
        if cid is None:
            description = _describe(key)
            attempt = 0
            cid = _id_candidate(description, attempt)
            while cid in _state.entries:  # another callback with the same description
                attempt += 1
                cid = _id_candidate(description, attempt)
            _state.entries[cid] = _Entry(invoke, name)
            _state.ids[key] = cid
        return cid


def record_exception(exc: BaseException, where: str) -> None:
    """Logs ``exc`` with its traceback and keeps it for the next ``barrier_wait``."""
    formatted = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    logger.error("hostfeed: postponing exception raised in %s:\n%s", where, formatted)
    _state.last_exception = (exc, formatted)


def take_last_exception() -> tuple[BaseException, str] | None:
    """Returns and clears the recorded callback exception."""
    exc, _state.last_exception = _state.last_exception, None
    return exc


_run_id = [0]


def current_run_id() -> int:
    """XLA's run id of the message being dispatched (shard-wise taps only; else 0)."""
    return _run_id[0]


def _dispatch(batch: list[tuple[int, int, int, tuple[np.ndarray, ...], Any, int]]) -> None:
    # Runs on the consumer thread, with the GIL, for a batch of messages in queue order.
    entries = _state.entries
    run_id = _run_id
    for cid, ordinal, _flags, arrays, reply, run in batch:
        run_id[0] = run
        entry = entries.get(cid)
        try:
            if entry is None:
                raise LookupError(
                    f"hostfeed: no host callback is registered under consumer id {cid} in this "
                    f"process: the executable was compiled elsewhere and not lowered here "
                    f"(hostfeed registers callbacks when JAX lowers a computation)")
            if reply is None:
                entry.invoke(arrays, ordinal)
            elif reply.pending:  # a call nobody waits for any more is not run
                entry.invoke(arrays, ordinal, reply)
        except Exception as exc:  # noqa: BLE001 - recorded and re-raised by barrier_wait
            name = entry.name if entry else cid
            record_exception(exc, f"host callback {name}")
            if reply is not None:
                reply.fail(f"hostfeed: host callback {name} failed: {type(exc).__name__}: {exc}")


@functools.lru_cache(maxsize=None)
def device_for_ordinal(ordinal: int) -> jax.Device:
    """The local ``jax.Device`` whose XLA device ordinal is ``ordinal``."""
    for d in jax.local_devices():
        hw = getattr(d, "local_hardware_id", None)
        if (hw if hw is not None else d.id) == ordinal:
            return d
    return jax.local_devices()[ordinal]


def ensure_started(max_queue_bytes: int | None = None) -> None:
    """Starts the receiver if it is not running (lazily, on first use).

    The bound is ``max_queue_bytes`` if given, else ``JAX_HOST_CALLBACK_MAX_QUEUE_BYTE_SIZE``
    on first start, else 256e6 bytes.
    """
    if max_queue_bytes is None and _state.configured and _receiver.is_running():
        return
    with _state.lock:
        if max_queue_bytes is None and not _state.configured:
            max_queue_bytes = max_queue_bytes_from_env()
        dtypes = {code: np.dtype(t) for code, t in _XLA_DTYPES.items()}
        _receiver.start(_dispatch, dtypes, max_queue_bytes)
        _state.configured = True
        if not _state.atexit_registered:
            atexit.register(_at_exit)
            _state.atexit_registered = True


def is_configured() -> bool:
    """Whether the receiver was ever started in this process."""
    return _state.configured


STOP_TIMEOUT_ENV = "HOSTFEED_STOP_TIMEOUT"


def seconds_from_env(name: str, default: float) -> float:
    """A non-negative number of seconds from the environment variable ``name``.

    Example:
        >>> seconds_from_env("HOSTFEED_UNSET_EXAMPLE", 2.5)
        2.5
    """
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{name}={text!r} is not a number of seconds") from None
    if value < 0:
        raise ValueError(f"{name}={text!r} must not be negative")
    return value


def stop_timeout() -> float:
    """Seconds without progress after which stopping gives up on a stuck callback
    (``HOSTFEED_STOP_TIMEOUT``, default 10)."""
    return seconds_from_env(STOP_TIMEOUT_ENV, 10.0)


def _at_exit() -> None:
    # Drain what computations already sent, then shut down before the interpreter
    # finalises (the consumer thread must not outlive it). A pending callback exception
    # is raised here, so it is printed rather than lost.
    from .host_callback import barrier_wait

    try:
        barrier_wait("at_exit")
    finally:
        _receiver.finalize(stop_timeout())
