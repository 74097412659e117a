"""hostfeed: JAX host callbacks for current JAX, with the receiving side in Rust.

* ``id_tap`` / ``id_print``: the identity on a value that also sends it to a host function
  (or prints it), asynchronously by default (``barrier_wait`` waits for them; synchronous
  taps with ``sync=True`` or ``host_callback.sync_taps()``);
* ``host_callback.call``: a host function whose results flow back into the computation;
* :class:`Recorder`: records values from inside jitted code to a Zarr v3 store, written by
  Rust threads; :func:`read_recording` reads them back; :func:`capture` records a Flax or
  Equinox model's submodules chosen by name, without editing the model.

Use it as ``from hostfeed import host_callback as hcb``, or call :func:`install` once so
that legacy code's ``from jax.experimental import host_callback`` gets hostfeed.

Example:
    >>> import jax, jax.numpy as jnp, numpy as np
    >>> from hostfeed import host_callback as hcb
    >>> f = jax.jit(lambda x: hcb.call(np.cos, hcb.id_print(x, what="x"), result_shape=x))
    >>> y = f(jnp.float32(0.0)); hcb.barrier_wait()
    what: x
    0.
    >>> float(y)
    1.0
"""
from __future__ import annotations

import sys

import jax.experimental
from importlib.metadata import PackageNotFoundError, version as _version
from typing import Any, Optional

# Before the submodules: bench._report reads it while the package initialises.
try:
    __version__ = _version("hostfeed")
except PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0.0.0"

from ._src import compat as _compat  # noqa: F401  (checks the JAX version first)
from ._src import settings as _settings

# Every HOSTFEED_* and JAX_HOST_CALLBACK_* variable, parsed now: a bad value fails this
# import with a ValueError naming the variable, not a barrier or the program's exit.
_settings.validate()

# The package is assembled here, once: the primitives, then their transformation rules,
# evaluation outside computations and lowerings (registered with JAX as these modules are
# imported), then the public API.
from ._src import primitives as _primitives, rules as _rules  # noqa: E402,F401
from ._src import eager as _eager  # noqa: E402,F401
from ._src import fast_dispatch as _fast_dispatch, lowering as _lowering  # noqa: E402,F401
from ._src import lifecycle as _lifecycle  # noqa: E402
from ._src.latency import summary_of_buckets  # noqa: E402
from ._src import transports as _transports  # noqa: E402
from ._src.transports import native as _native  # noqa: E402
from . import host_callback, zarr_dtypes  # noqa: E402
from .host_callback import (CallbackException, TapFunctionException, barrier_wait,  # noqa: E402
                            id_print, id_tap, stop_outfeed_receiver)
from ._src.readback.reading import read_recording  # noqa: E402
from ._src.readback.opened import RecordedArray, Recording, follow, open_recording  # noqa: E402
from ._src.readback.tensorboard import to_tensorboard  # noqa: E402
from ._src.record.recorder import Recorder  # noqa: E402
from ._src.record import barrier as _record_barrier  # noqa: E402,F401 - its hooks
from ._src.record.window import Triggered  # noqa: E402
from ._src.record.watch import Spike, spike  # noqa: E402
from ._src.reductions import CAST_STATS, STATS, Histogram, Stats, TopK  # noqa: E402
from ._src.capture import CaptureWarning, Capturing, capture  # noqa: E402
from ._src.record.unflushed import UnflushedReadWarning  # noqa: E402
from ._receiver.error import (CallbackContextError, ReceiverError,  # noqa: E402
                              ReceiverTimeoutError, RecordingError)

# The public classes print, and are documented, as hostfeed's, where they are imported
# from (the native exceptions are defined as hostfeed.* in Rust; these live in _src).
for _public in (CallbackException, Recorder, Histogram, TopK, Stats, Capturing, Recording,
                RecordedArray, UnflushedReadWarning, CaptureWarning, Triggered, Spike):
    _public.__module__ = "hostfeed"
del _public

__all__ = [
    "host_callback", "install", "id_tap", "id_print", "barrier_wait",
    "stop_outfeed_receiver", "CallbackException", "TapFunctionException",
    "start_receiver", "receiver_stats", "Recorder", "RecordingError", "read_recording",
    "Histogram", "TopK", "Stats", "STATS", "CAST_STATS", "capture", "Capturing",
    "CaptureWarning", "open_recording", "follow", "Recording", "RecordedArray",
    "to_tensorboard", "UnflushedReadWarning",
    "register_zarr_dtypes", "CallbackContextError", "ReceiverError", "ReceiverTimeoutError",
    "transports", "gpu_status", "Triggered", "spike", "Spike",
    "__version__",
]

# zarr-python learns bfloat16 and the float8 types when (or as soon as) it is imported.
zarr_dtypes.register_when_zarr_is_imported()
register_zarr_dtypes = zarr_dtypes.register


def install() -> None:
    """Makes ``jax.experimental.host_callback`` refer to ``hostfeed.host_callback``.

    After this, legacy code runs unchanged:

    Example:
        >>> import hostfeed; hostfeed.install()
        >>> from jax.experimental import host_callback as hcb
        >>> hcb.id_tap is hostfeed.id_tap
        True
    """
    sys.modules["jax.experimental.host_callback"] = host_callback
    # setattr: JAX no longer declares this attribute, so type checkers refuse assignment.
    setattr(jax.experimental, "host_callback", host_callback)  # noqa: B010


def start_receiver(*, max_queue_byte_size: Optional[int] = None) -> None:
    """Starts the receiver now (it otherwise starts lazily) and/or sets its byte bound.

    Args:
      max_queue_byte_size: bytes of tapped data that may wait for the host before devices
        pause; overrides ``JAX_HOST_CALLBACK_MAX_QUEUE_BYTE_SIZE``. Takes effect at once.

    Example:
        >>> import hostfeed
        >>> hostfeed.start_receiver(max_queue_byte_size=64 << 20)
        >>> hostfeed.receiver_stats()["max_queue_bytes"]
        67108864
        >>> hostfeed.start_receiver(max_queue_byte_size=256_000_000)
    """
    if max_queue_byte_size is not None:
        max_queue_byte_size = _settings.byte_count(max_queue_byte_size, "max_queue_byte_size")
    _lifecycle.ensure_started(max_queue_byte_size)


def transports() -> dict[str, str]:
    """Which transport hostfeed's callbacks use in computations for each platform, by name:
    ``"native"`` (hostfeed's own handlers: CPU, CUDA, ROCm), ``"tpu"`` (a TPU's own host
    transfers) or ``"jax"`` (the portable transport, JAX's host-callback lowering: other
    platforms, a GPU whose handlers could not register; everywhere but on TPUs when
    ``HOSTFEED_TRANSPORT=jax``). The transport a computation for that platform alone is
    lowered with. Lists CPU, CUDA, ROCm, TPU and the platforms of this process's backends.

    Example:
        >>> import hostfeed
        >>> hostfeed.transports()["tpu"] in ("native", "tpu")
        True
    """
    return _transports.transports()


def gpu_status(platform: str) -> Optional[str]:
    """Why hostfeed's native handlers for GPU ``platform`` (``"cuda"`` or ``"rocm"``) are not
    registered, or None when they are; registers them on the first call (as the first
    lowering for that platform does). The reason names what is missing: a JAX plugin for
    the platform (``jax-cuda12-plugin``, ...), or why the driver library (CUDA's
    ``libcuda.so.1``, HIP's ``libamdhip64``) cannot be used. Without usable handlers,
    computations for that platform take the portable transport (:func:`transports`).

    Example:
        >>> import hostfeed
        >>> hostfeed.gpu_status("cuda") is None or "CUDA" in hostfeed.gpu_status("cuda")
        True
    """
    return _native.platform(platform).status()


def receiver_stats(*, reset: bool = False) -> dict[str, Any]:
    """Counters of the receiver: messages and bytes enqueued/processed (bytes as charged
    against the bound: data plus what each message holds besides), current and peak queued
    bytes, time producers spent blocked on a full queue, and the bound; the host buffer
    pool's limit (``buffer_pool_bytes``: ``HOSTFEED_BUFFER_POOL_BYTES``, or 64 MiB raised
    to what open Recorders reserve) and its idle bytes; and two latency
    distributions in microseconds (``count``, ``mean``, ``p50``, ``p90``, ``p99``,
    ``p999``, ``max``): ``device_us``, what each tap cost the device (from the handler's
    start until its message was queued), and ``handover_us``, from a message entering the
    queue until the receiver took it for its callback. ``reset=True`` empties the
    distributions and the peak after reading them, so that the next call covers what
    happened since (``python -m hostfeed bench --only timing`` measures what keeping them
    costs per tap).

    Example:
        >>> import hostfeed
        >>> sorted(hostfeed.receiver_stats())[:4]
        ['buffer_pool_bytes', 'buffer_pool_idle_bytes', 'bytes_enqueued', 'bytes_processed']
    """
    reset = _settings.flag(reset, "hostfeed.receiver_stats: reset")
    stats = _lifecycle.stats()
    h = _lifecycle.histograms()
    stats["device_us"] = summary_of_buckets(h["device_ns"], 1e-3)
    stats["handover_us"] = summary_of_buckets(h["handover_ns"], 1e-3)
    if reset:
        _lifecycle.reset_histograms()
        _lifecycle.reset_peak()
    return stats
