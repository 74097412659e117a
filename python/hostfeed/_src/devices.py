"""Device keys: the integer a message carries to name the device it came from, in three
spaces (a CPU device's XLA ordinal; ``-2 - ordinal`` for a GPU's, set by the GPU handlers;
keys at or below :data:`PORTABLE_KEY_BASE` for the portable transport's devices of any
platform), and the ``jax.Device`` each names. The ground floor: imports nothing of
hostfeed but the native module's constants."""
from __future__ import annotations

import functools
import threading

import jax

from .. import _receiver


@functools.cache
def device_for_ordinal(ordinal: int) -> jax.Device:
    """The ``jax.Device`` of this process that a message's device key ``ordinal`` names.

    A message from a CPU device carries its XLA device ordinal; one from a GPU carries
    ``-2 - ordinal`` (set in Rust for messages of the GPU handlers, so that the keys of a
    CPU and a GPU device never collide, nor with -1, the host's own messages). What
    ``XLA_FFI_DeviceOrdinal_Get`` reports differs by setup: on CPU
    with one process it is the device's id (which equals its ``local_hardware_id``); with
    many processes (``jax.distributed``) it is the *global* device id (e.g. 2048 for the
    first CPU device of process 1), not an index into ``jax.local_devices()``; a GPU's is
    its ordinal on this host. So a local device is matched by ``id`` first, then by
    ``local_hardware_id`` (the ordinal of platforms that number their devices per process).

    Raises:
      LookupError: no device of this process has that ordinal (the tap is then recorded
        as failed for ``barrier_wait``, not lost silently).
    """
    if ordinal <= PORTABLE_KEY_BASE:
        return _portable_devices[ordinal]
    platform = "cpu"
    if ordinal <= -2:
        platform, ordinal = "gpu", -2 - ordinal
    devices = _local_callback_devices(platform)
    for d in devices:
        if d.id == ordinal:
            return d
    for d in devices:
        if getattr(d, "local_hardware_id", None) == ordinal:
            return d
    raise LookupError(
        f"hostfeed: no {platform} device of process {jax.process_index()} has XLA device "
        f"ordinal {ordinal}; its devices are "
        f"{[(d.id, d.local_hardware_id) for d in devices]} as (id, local_hardware_id)")


#: Device keys at or below this one name devices of the portable transport (any platform):
#: ``PORTABLE_KEY_BASE - (slot << PORTABLE_ID_BITS | id)``, where ``id`` is the device's JAX
#: id (what a recorded row's ``device`` holds, decoded in Rust) and ``slot`` its platform's
#: place among the portable platforms seen.
PORTABLE_KEY_BASE = _receiver.messages.PORTABLE_KEY_BASE
PORTABLE_ID_BITS = _receiver.messages.PORTABLE_ID_BITS
_portable_devices: dict[int, jax.Device] = {}
_portable_slots: dict[str, int] = {}
_portable_lock = threading.Lock()


def portable_device_key(device: jax.Device) -> int:
    """The device key that messages of the portable transport from ``device`` carry, so
    that :func:`device_for_ordinal` gives ``device`` back (a CPU device's is its id, as in
    a native handler's messages).

    Example:
        >>> d = jax.devices()[0]
        >>> device_for_ordinal(portable_device_key(d)) == d
        True
    """
    if device.platform == "cpu":
        return device.id
    if not 0 <= device.id < 1 << PORTABLE_ID_BITS:
        raise ValueError(f"hostfeed: device {device} has id {device.id}, beyond the "
                         f"{1 << PORTABLE_ID_BITS} a message can name")
    with _portable_lock:
        slot = _portable_slots.setdefault(device.platform, len(_portable_slots))
        key = PORTABLE_KEY_BASE - ((slot << PORTABLE_ID_BITS) | device.id)
        _portable_devices.setdefault(key, device)
        return key


def _local_callback_devices(platform: str) -> list:
    """The local devices of ``platform`` (``"cpu"`` or ``"gpu"``) host callbacks run on."""
    try:
        return list(jax.local_devices(backend=platform))
    except RuntimeError:  # no such backend: the default one's
        return list(jax.local_devices())

