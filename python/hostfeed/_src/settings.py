"""Settings read from the environment: one parser each, matching the README's table.

| variable | parser |
|---|---|
| ``JAX_HOST_CALLBACK_MAX_QUEUE_BYTE_SIZE`` | :func:`max_queue_bytes` |
| ``JAX_HOST_CALLBACK_INLINE`` | :func:`inline` |
| ``HOSTFEED_AD_TAPS`` | :func:`ad_taps` |
| ``HOSTFEED_SYNC_TAPS`` | :func:`sync_taps` |
| ``HOSTFEED_CALL_TIMEOUT`` | :func:`call_timeout` |
| ``HOSTFEED_STOP_TIMEOUT`` | :func:`stop_timeout` |
| ``HOSTFEED_BUFFER_POOL_BYTES`` | :func:`buffer_pool_bytes` |
| ``HOSTFEED_TRANSPORT`` | :func:`transport` |
| ``HOSTFEED_FAST_DISPATCH`` | :func:`fast_dispatch` |
| ``HOSTFEED_CALL_THREAD`` | :func:`call_thread` |
| ``HOSTFEED_CALLBACK_ERROR_EXIT`` | :func:`callback_error_exit` |

Every parser raises ``ValueError`` naming the variable and its value when the value is not
usable, so a typo fails where the setting is read instead of being ignored; and
:func:`validate` runs every parser when hostfeed is imported, so a bad value fails the
import rather than a barrier or the program's exit. For every variable an empty value
means unset, and words (``true``, ``Primals``, ``JAX``) are read case-insensitively.
"""
from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator
from typing import Any

import numpy as np

MAX_QUEUE_ENV = "JAX_HOST_CALLBACK_MAX_QUEUE_BYTE_SIZE"
INLINE_ENV = "JAX_HOST_CALLBACK_INLINE"
AD_TAPS_ENV = "HOSTFEED_AD_TAPS"
SYNC_TAPS_ENV = "HOSTFEED_SYNC_TAPS"
CALL_TIMEOUT_ENV = "HOSTFEED_CALL_TIMEOUT"
STOP_TIMEOUT_ENV = "HOSTFEED_STOP_TIMEOUT"
BUFFER_POOL_ENV = "HOSTFEED_BUFFER_POOL_BYTES"
TRANSPORT_ENV = "HOSTFEED_TRANSPORT"
FAST_DISPATCH_ENV = "HOSTFEED_FAST_DISPATCH"
CALL_THREAD_ENV = "HOSTFEED_CALL_THREAD"
RECORD_PARTS_ENV = "HOSTFEED_RECORD_PARTS"
CALLBACK_ERROR_EXIT_ENV = "HOSTFEED_CALLBACK_ERROR_EXIT"

#: The transports ``HOSTFEED_TRANSPORT`` can force, by their names (see
#: :mod:`hostfeed._src.transports`): ``jax`` is JAX's host-callback lowering, over a TPU's
#: own host transfers (``tpu``) where every platform lowered for is a TPU.
TRANSPORTS = ("native", "jax", "tpu")

AD_TAPS_MODES = ("transforms", "primals")

#: Where a CPU ``call``'s host function may run (``HOSTFEED_CALL_THREAD``).
CALL_THREADS = ("device", "receiver")

#: Longest finite number of seconds accepted for a timeout (about 31 years); longer waits
#: are spelled ``inf`` (no limit).
MAX_TIMEOUT_SECONDS = 1e9

#: Default of ``HOSTFEED_STOP_TIMEOUT``, in seconds.
DEFAULT_STOP_TIMEOUT = 10.0


@contextlib.contextmanager
def parsed_here(name: str) -> Iterator[None]:
    """Hides variable ``name`` from JAX while a JAX configuration state of the same name
    is defined with the value parsed here, before entering (JAX would read the variable
    itself, with its own rules and an error that does not name it)."""
    saved = os.environ.pop(name, None)
    try:
        yield
    finally:
        if saved is not None:
            os.environ[name] = saved


def _env(name: str) -> str | None:
    text = os.environ.get(name)
    if text is None or not text.strip():
        return None
    return text.strip()


_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}


def byte_count(value: Any, what: str) -> int:
    """A positive whole number of bytes; float notation (``256e6``) is accepted when the
    value is whole, as the legacy flag did, and so is a unit (``64 MiB``, ``1.5GB``).

    Example:
        >>> byte_count("256e6", "bound"), byte_count("64 MiB", "pool")
        (256000000, 67108864)
        >>> byte_count(1.5, "bound")
        Traceback (most recent call last):
        ...
        ValueError: bound=1.5 is not a whole number of bytes; use e.g. 256e6 or 67108864
    """
    if isinstance(value, bool):
        raise TypeError(f"{what} must be a number of bytes, got the bool {value!r}")
    if isinstance(value, str):
        text, scale = value.strip(), 1
        unit = text.rstrip("BbIiKkMmGgTt ")
        suffix = text[len(unit):].strip()
        if suffix:
            scale = _UNITS.get(suffix.lower(), 0)
            text = unit
        try:
            number = float(text) * scale if scale else float("nan")
        except ValueError:
            number = float("nan")
        if math.isnan(number):
            raise ValueError(f"{what}={value!r} is not a number of bytes; use e.g. 256e6, "
                             f"67108864 or 64MiB (units: B, KB, MB, GB, KiB, MiB, GiB)") \
                from None
        if scale > 1 and number == int(number):
            number = int(number)
    elif isinstance(value, (int, float)) or hasattr(value, "__index__"):
        number = value if isinstance(value, (int, float)) else int(value)
    else:
        raise TypeError(f"{what} must be a number of bytes, got {type(value).__name__}: "
                        f"{value!r}")
    if isinstance(number, float):
        if not math.isfinite(number) or number != int(number):
            raise ValueError(f"{what}={value!r} is not a whole number of bytes; use e.g. "
                             f"256e6 or 67108864")
        number = int(number)
    if number <= 0:
        raise ValueError(f"{what}={value!r} must be a positive number of bytes")
    if number >= 1 << 63:
        raise ValueError(f"{what}={value!r} is larger than any memory; use e.g. 256e6")
    return number


def flag(value: Any, what: str) -> bool:
    """A public function's boolean argument: ``True``, ``False`` or a numpy bool; anything
    else (``"no"``, ``0``, ``None``) is a ``TypeError`` that names the argument ``what``.

    Example:
        >>> flag(True, "reset"), flag(np.False_, "reset")
        (True, False)
        >>> flag("no", "hostfeed.receiver_stats: reset")
        Traceback (most recent call last):
        ...
        TypeError: hostfeed.receiver_stats: reset must be True or False, got 'no'
    """
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise TypeError(f"{what} must be True or False, got {value!r}")


def seconds(value: Any, what: str) -> float | None:
    """A non-negative number of seconds, or ``None`` for no limit (``inf``).

    Example:
        >>> seconds("2.5", "timeout"), seconds("inf", "timeout")
        (2.5, None)
    """
    if isinstance(value, bool):
        raise TypeError(f"{what} must be a number of seconds, got the bool {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{what}={value!r} is not a number of seconds") from None
    if math.isnan(number) or number < 0:
        raise ValueError(f"{what}={value!r} must be a non-negative number of seconds "
                         f"(or inf for no limit)")
    if math.isinf(number):
        return None
    if number > MAX_TIMEOUT_SECONDS:
        raise ValueError(f"{what}={value!r} is longer than {MAX_TIMEOUT_SECONDS:.0e} s; use "
                         f"inf for no limit")
    return number


def max_queue_bytes() -> int | None:
    """The byte bound from ``JAX_HOST_CALLBACK_MAX_QUEUE_BYTE_SIZE``, or None if unset.

    Example:
        >>> os.environ.pop(MAX_QUEUE_ENV, None) and None
        >>> max_queue_bytes() is None
        True
    """
    text = _env(MAX_QUEUE_ENV)
    return None if text is None else byte_count(text, MAX_QUEUE_ENV)


def _bool_from_env(name: str, default: bool = False) -> bool:
    text = _env(name)
    if text is None:
        return default
    value = text.lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{name}={text!r} is not a boolean; use 1 or 0 (or true/false, yes/no, "
                     f"on/off)")


# Read once, when hostfeed is imported, as the legacy module read its flag (a JAX flag
# whose default came from the environment); an eager tap would otherwise pay for reading
# the environment (about a microsecond) every time.
_INLINE = _bool_from_env(INLINE_ENV)


def inline() -> bool:
    """Whether ``JAX_HOST_CALLBACK_INLINE`` (as set when hostfeed was imported) asks for
    eager callbacks to run inline.

    Example:
        >>> isinstance(inline(), bool)
        True
    """
    return _INLINE


def _one_of(value: Any, choices: tuple[str, ...], source: str, refusal: str) -> str:
    """``value`` as one of ``choices`` (words in any case, spaces ignored), else the
    ``ValueError`` ``"{source}={value!r} {refusal}"``."""
    word = str(value).strip().lower()
    if word not in choices:
        raise ValueError(f"{source}={value!r} {refusal}")
    return word


def check_ad_taps(mode: Any, source: str) -> str:
    """``mode`` as one of :data:`AD_TAPS_MODES`; ``source`` names where it came from.

    Example:
        >>> check_ad_taps(" Primals", "mode")
        'primals'
    """
    return _one_of(mode, AD_TAPS_MODES, source,
                   "is not a hostfeed autodiff tap mode; use 'transforms' (taps see primals "
                   "and tangents/cotangents, with 'jvp' and 'transpose' in `transforms`) or "
                   "'primals' (taps see only primal values, as in JAX 0.4.x)")


def ad_taps() -> str:
    """The initial autodiff tap mode, from ``HOSTFEED_AD_TAPS`` (default ``transforms``).

    Example:
        >>> ad_taps() in AD_TAPS_MODES
        True
    """
    text = _env(AD_TAPS_ENV)
    return "transforms" if text is None else check_ad_taps(text, AD_TAPS_ENV)


#: The tap modes (``hcb.set_sync_taps``): ``legacy`` (the default), the legacy module's
#: semantics: synchronous taps on CPUs and GPUs, asynchronous ones on TPUs; ``sync``:
#: synchronous everywhere; ``async``: asynchronous everywhere.
SYNC_TAPS_MODES = ("legacy", "sync", "async")


def sync_taps() -> str:
    """The initial tap mode, from ``HOSTFEED_SYNC_TAPS``: unset, ``legacy`` (each tap
    function has run before the computation goes on, as the legacy module's taps on CPUs
    and GPUs; asynchronous on TPUs, as there); ``1`` (``sync``: synchronous everywhere);
    ``0`` (``async``: asynchronous everywhere, see ``hcb.barrier_wait``). Read once, when
    hostfeed is imported; switch later with ``hcb.set_sync_taps`` or ``with
    hcb.sync_taps():``.

    Example:
        >>> before = os.environ.pop(SYNC_TAPS_ENV, None)
        >>> sync_taps()
        'legacy'
        >>> os.environ[SYNC_TAPS_ENV] = "0"; sync_taps()
        'async'
        >>> os.environ.pop(SYNC_TAPS_ENV) and before is not None and os.environ.update(
        ...     {SYNC_TAPS_ENV: before})
    """
    if _env(SYNC_TAPS_ENV) is None:
        return "legacy"
    return "sync" if _bool_from_env(SYNC_TAPS_ENV) else "async"


def fast_dispatch() -> bool:
    """Whether computations that tap on one device are lowered for JAX's C++ dispatch path,
    from ``HOSTFEED_FAST_DISPATCH`` (``1``/``0``, default ``1``; see
    :mod:`hostfeed.fast_dispatch`). Read once, when hostfeed is imported.

    Example:
        >>> os.environ.pop(FAST_DISPATCH_ENV, None) and None
        >>> fast_dispatch()
        True
    """
    return _bool_from_env(FAST_DISPATCH_ENV, default=True)


def record_parts() -> bool:
    """Whether a record of a value sharded over several devices is written part by part,
    each device's part by its own process, from ``HOSTFEED_RECORD_PARTS`` (``1``/``0``,
    default ``1``; ``0``: the value is first gathered in the process of ``device_index``,
    as before parts were written, kept to compare the two). Read once, when hostfeed is
    imported.

    Example:
        >>> os.environ.pop(RECORD_PARTS_ENV, None) and None
        >>> record_parts()
        True
    """
    return _bool_from_env(RECORD_PARTS_ENV, default=True)


def call_thread() -> str:
    """Where a CPU ``call``'s host function runs, from ``HOSTFEED_CALL_THREAD``:
    ``device`` (default: on the device's own thread when nothing else is pending and the
    call has no timeout) or ``receiver`` (always on the receiver thread, where a host
    function that never returns can always be interrupted). Read when hostfeed is
    imported.

    Example:
        >>> os.environ.pop(CALL_THREAD_ENV, None) and None
        >>> call_thread()
        'device'
    """
    text = _env(CALL_THREAD_ENV)
    if text is None:
        return "device"
    return _one_of(text, CALL_THREADS, CALL_THREAD_ENV,
                   "is not a place to run calls; use 'device' (the default) or 'receiver'")


def call_timeout() -> float | None:
    """Seconds a ``call`` waits for its host function (``HOSTFEED_CALL_TIMEOUT``, read when
    a computation is lowered); None (unset, ``0`` or ``inf``) means no limit.

    Example:
        >>> os.environ.pop(CALL_TIMEOUT_ENV, None) and None
        >>> call_timeout() is None
        True
    """
    text = _env(CALL_TIMEOUT_ENV)
    if text is None:
        return None
    value = seconds(text, CALL_TIMEOUT_ENV)
    return None if value == 0 else value


def stop_timeout() -> float | None:
    """Seconds without progress after which stopping the receiver gives up on a stuck
    callback (``HOSTFEED_STOP_TIMEOUT``, default 10); None (``inf``) waits forever.

    Example:
        >>> os.environ.pop(STOP_TIMEOUT_ENV, None) and None
        >>> stop_timeout()
        10.0
    """
    text = _env(STOP_TIMEOUT_ENV)
    return DEFAULT_STOP_TIMEOUT if text is None else seconds(text, STOP_TIMEOUT_ENV)


def buffer_pool_bytes() -> int | None:
    """Most bytes of large host buffers kept for reuse when idle
    (``HOSTFEED_BUFFER_POOL_BYTES``; None: the default, 64 MiB, raised while Recorders
    are open to the queue bound, at most 1 GiB per Recorder: the rows a Recorder may
    hold). Bursts of large taps or records bigger than the pool pay page faults for fresh
    memory. A value set here is kept as is, Recorders or not.

    Example:
        >>> os.environ.pop(BUFFER_POOL_ENV, None) and None
        >>> buffer_pool_bytes() is None
        True
    """
    text = _env(BUFFER_POOL_ENV)
    return None if text is None else byte_count(text, BUFFER_POOL_ENV)


def check_transport(name: Any, source: str) -> str:
    """``name`` as one of :data:`TRANSPORTS`; ``source`` names where it came from.

    Example:
        >>> check_transport(" JAX", "transport")
        'jax'
    """
    return _one_of(name, TRANSPORTS, source,
                   "is not a hostfeed transport; use 'native' (hostfeed's handlers: CPU, CUDA "
                   "and ROCm), 'jax' (JAX's host-callback lowering, every platform JAX's "
                   "callbacks run on; a TPU's own host transfers on TPUs), 'tpu' (a TPU's "
                   "own host transfers, TPUs only) or leave it unset (chosen per platform)")


def transport() -> str | None:
    """The transport forced for every platform by ``HOSTFEED_TRANSPORT`` (``native``: hostfeed's
    own handlers; ``jax``: JAX's host-callback lowering, over a TPU's own host transfers on
    TPUs; ``tpu``: a TPU's own host transfers, TPUs only), or None (unset: chosen per
    platform). Read once, when hostfeed is imported.

    Example:
        >>> os.environ.pop(TRANSPORT_ENV, None) and None
        >>> transport() is None
        True
    """
    text = _env(TRANSPORT_ENV)
    return None if text is None else check_transport(text, TRANSPORT_ENV)


def callback_error_exit() -> int:
    """The exit status of a program that would exit with 0 while a host callback's exception
    was never raised by a ``barrier_wait`` (interpreter exit prints it), from
    ``HOSTFEED_CALLBACK_ERROR_EXIT``: ``1`` (default, as an uncaught exception), ``0`` (the
    legacy module's: the status stays 0), or another status up to 255. Read at exit.

    Example:
        >>> os.environ.pop(CALLBACK_ERROR_EXIT_ENV, None) and None
        >>> callback_error_exit()
        1
    """
    text = _env(CALLBACK_ERROR_EXIT_ENV)
    if text is None:
        return 1
    status = int(text) if text.isdigit() else -1
    if not 0 <= status <= 255:
        raise ValueError(f"{CALLBACK_ERROR_EXIT_ENV}={text!r} is not an exit status; use 1 "
                         f"(the default: exit with status 1, as an uncaught exception does), "
                         f"0 (keep status 0, as the legacy module did) or another status "
                         f"up to 255")
    return status


#: Every variable hostfeed reads, with its parser.
PARSERS = {
    MAX_QUEUE_ENV: max_queue_bytes,
    INLINE_ENV: lambda: _bool_from_env(INLINE_ENV),
    AD_TAPS_ENV: ad_taps,
    SYNC_TAPS_ENV: sync_taps,
    CALL_TIMEOUT_ENV: call_timeout,
    STOP_TIMEOUT_ENV: stop_timeout,
    BUFFER_POOL_ENV: buffer_pool_bytes,
    TRANSPORT_ENV: transport,
    FAST_DISPATCH_ENV: fast_dispatch,
    CALL_THREAD_ENV: call_thread,
    RECORD_PARTS_ENV: record_parts,
    CALLBACK_ERROR_EXIT_ENV: callback_error_exit,
}


#: Variables of hostfeed's own tests, benches and build, which a program never sets: not
#: reported as unknown.
DEVELOPMENT_PREFIXES = ("HOSTFEED_SOAK", "HOSTFEED_BENCH_", "HOSTFEED_WHEEL",
                        "HOSTFEED_XLA_FFI_INCLUDE", "HOSTFEED_REQUIRE_FFI_HEADERS",
                        "HOSTFEED_REQUIRE_S3S")


def unknown_variables(environ: Any = None) -> list[str]:
    """One line for each ``HOSTFEED_*`` variable that hostfeed does not read (a typo, say),
    naming the closest variable it does read.

    Example:
        >>> print(*unknown_variables({"HOSTFEED_SYNC_TAP": "1", "HOSTFEED_AD_TAPS": "x"}))
        HOSTFEED_SYNC_TAP is not a hostfeed setting (did you mean HOSTFEED_SYNC_TAPS?); it is \
ignored
    """
    import difflib

    environ = os.environ if environ is None else environ
    known = [k for k in PARSERS if k.startswith("HOSTFEED_")]
    out = []
    for name in sorted(environ):
        if (name.startswith("HOSTFEED_") and name not in PARSERS
                and not name.startswith(DEVELOPMENT_PREFIXES)):
            stem = name.removeprefix("HOSTFEED_")
            close = difflib.get_close_matches(stem, [k.removeprefix("HOSTFEED_") for k in known],
                                              n=1, cutoff=0.6)
            hint = (f"did you mean HOSTFEED_{close[0]}?" if close
                    else "hostfeed reads " + ", ".join(known))
            out.append(f"{name} is not a hostfeed setting ({hint}); it is ignored")
    return out


def validate() -> None:
    """Parses every variable of the table above; raises the ``ValueError`` (naming the
    variable) of the first that is set to something unusable, and warns once about each
    ``HOSTFEED_*`` variable it does not know. Run when hostfeed is imported.

    Example:
        >>> os.environ[STOP_TIMEOUT_ENV] = "abc"
        >>> validate()
        Traceback (most recent call last):
        ...
        ValueError: HOSTFEED_STOP_TIMEOUT='abc' is not a number of seconds
        >>> del os.environ[STOP_TIMEOUT_ENV]
        >>> validate()
    """
    for parse in PARSERS.values():
        parse()
    import warnings

    for line in unknown_variables():
        warnings.warn(line, UserWarning, stacklevel=2)
