"""``hostfeed._receiver.gpu``: the GPU platforms, one table (``gpu.rs``; the drivers are loaded
at run time: nothing here needs a GPU driver to import).
"""
from typing import Any, Final, final


__all__ = [
    "GpuPlatform", "GPU_PLATFORMS",
]

@final
class GpuPlatform:
    """A GPU platform hostfeed has handlers for (the values of ``GPU_PLATFORMS``): its
    names, its handlers' registrations, its driver's state and its pinned pool's
    counters."""

    @property
    def name(self) -> str:
        """hostfeed's (and JAX's) name of the platform: ``"cuda"``, ``"rocm"``."""

    @property
    def xla_platform(self) -> str:
        """The platform name the handlers are registered under: ``"CUDA"``, ``"ROCM"``."""

    def registrations(self) -> dict[str, Any]:
        """``{target_name: PyCapsule}`` of the platform's handlers, for
        ``jax.ffi.register_ffi_target(..., platform=self.xla_platform)`` (the same names as
        on CPU)."""

    def driver_error(self) -> str | None:
        """Why the platform's driver cannot be used (no library, a missing function, ...),
        or None. Loads the driver library if present; does not initialise the driver."""

    def driver_version(self) -> int | None:
        """The driver's version, or None without a usable driver. Initialises the driver."""

    def driver_path(self) -> str | None:
        """The file the driver's functions come from, or None without a driver library."""

    def pool_stats(self) -> dict[str, int]:
        """Counters of the platform's pinned-memory pool: ``allocations``, ``frees``,
        ``allocated_bytes``, ``in_use_bytes``, ``blocks_taken``, ``resets``."""

#: Every GPU platform by hostfeed's name (``"cuda"``, ``"rocm"``).
GPU_PLATFORMS: Final[dict[str, GpuPlatform]]
