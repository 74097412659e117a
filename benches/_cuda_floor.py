"""The benchmark floor of a GPU tap's copy: device-to-host copies into pinned host memory
through the CUDA driver API, called with ctypes (no hostfeed code: a benchmark's baseline
stays out of the shipped package).

Each copy is ``cuMemcpyDtoHAsync`` then ``cuStreamSynchronize`` on a stream of its own in
the device's primary context (the one XLA uses), timed on the host.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import time

import numpy as np


def _driver() -> ctypes.CDLL:
    name = ctypes.util.find_library("cuda") or "libcuda.so.1"
    return ctypes.CDLL(name)


def copy_floor(ordinal: int, nbytes: int, repeats: int) -> list[float]:
    """Seconds taken by each of ``repeats`` copies of ``nbytes`` from GPU ``ordinal``.

    Raises OSError without a CUDA driver and RuntimeError when a driver call fails.

        >>> times = copy_floor(0, 1 << 20, 5)  # doctest: +SKIP
        >>> len(times)  # doctest: +SKIP
        5
    """
    cu = _driver()

    def check(res: int, what: str) -> None:
        if res != 0:
            raise RuntimeError(f"CUDA {what} failed (CUresult {res})")

    vp = ctypes.c_void_p
    check(cu.cuInit(0), "cuInit")
    dev = ctypes.c_int()
    check(cu.cuDeviceGet(ctypes.byref(dev), ordinal), "cuDeviceGet")
    ctx = vp()
    check(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
    n = max(nbytes, 1)
    stream, device_mem, host = vp(), ctypes.c_uint64(), vp()
    cu.cuMemcpyDtoHAsync_v2.argtypes = [vp, ctypes.c_uint64, ctypes.c_size_t, vp]
    try:
        check(cu.cuCtxPushCurrent_v2(ctx), "cuCtxPushCurrent")
        try:
            check(cu.cuStreamCreate(ctypes.byref(stream), 1), "cuStreamCreate")  # non-blocking
            check(cu.cuMemAlloc_v2(ctypes.byref(device_mem), ctypes.c_size_t(n)), "cuMemAlloc")
            check(cu.cuMemAllocHost_v2(ctypes.byref(host), ctypes.c_size_t(n)), "cuMemAllocHost")
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                check(cu.cuMemcpyDtoHAsync_v2(host, device_mem, n, stream), "cuMemcpyDtoHAsync")
                check(cu.cuStreamSynchronize(stream), "cuStreamSynchronize")
                times.append(time.perf_counter() - t0)
            return times
        finally:  # every copy was synchronised: nothing uses the buffers any more
            if host.value:
                cu.cuMemFreeHost(host)
            if device_mem.value:
                cu.cuMemFree_v2(device_mem)
            if stream.value:
                cu.cuStreamDestroy_v2(stream)
            cu.cuCtxPopCurrent_v2(ctypes.byref(vp()))
    finally:
        cu.cuDevicePrimaryCtxRelease_v2(dev)


class StreamCopies:
    """Copies between the device buffers a ``jax.experimental.buffer_callback`` gets on a
    CUDA GPU (``__cuda_array_interface__``) and numpy arrays, on the callback's stream
    (``ctx.stream``), each synchronised before it returns: what a user of
    ``buffer_callback`` must write to call host code with device data.

    Raises OSError without a CUDA driver.
    """

    def __init__(self) -> None:
        self.cu = _driver()
        vp = ctypes.c_void_p
        self.cu.cuMemcpyDtoHAsync_v2.argtypes = [vp, ctypes.c_uint64, ctypes.c_size_t, vp]
        self.cu.cuMemcpyHtoDAsync_v2.argtypes = [ctypes.c_uint64, vp, ctypes.c_size_t, vp]
        self.cu.cuStreamSynchronize.argtypes = [vp]

    def _check(self, res: int, what: str) -> None:
        if res != 0:
            raise RuntimeError(f"CUDA {what} failed (CUresult {res})")

    def to_host(self, buf: object, out: np.ndarray, stream: int) -> None:
        """``buf`` (a device buffer) into ``out`` (C-contiguous, same size)."""
        ptr = buf.__cuda_array_interface__["data"][0]  # type: ignore[attr-defined]
        self._check(self.cu.cuMemcpyDtoHAsync_v2(out.ctypes.data, ptr, out.nbytes, stream),
                    "cuMemcpyDtoHAsync")
        self._check(self.cu.cuStreamSynchronize(stream), "cuStreamSynchronize")

    def to_device(self, arr: np.ndarray, buf: object, stream: int) -> None:
        """``arr`` (C-contiguous) into ``buf`` (a device buffer of the same size)."""
        ptr = buf.__cuda_array_interface__["data"][0]  # type: ignore[attr-defined]
        self._check(self.cu.cuMemcpyHtoDAsync_v2(ptr, arr.ctypes.data, arr.nbytes, stream),
                    "cuMemcpyHtoDAsync")
        self._check(self.cu.cuStreamSynchronize(stream), "cuStreamSynchronize")
