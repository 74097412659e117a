//! The GPU platforms (CUDA, ROCm), one Python class over the core's table of them
//! (`hostfeed_core::GPU_PLATFORMS`): [`GpuPlatform`], a platform's handlers'
//! registrations, its driver's state and its pinned pool's counters, and the module
//! attribute `GPU_PLATFORMS` (name -> `GpuPlatform`, a row of the table each). A platform
//! added to the core's table appears here with nothing to change.

use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::host::{dict_of, handler_capsules};

/// Adds the GPU platforms' class and `GPU_PLATFORMS` to `m`.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<GpuPlatform>()?;
    let platforms = PyDict::new(py);
    for platform in hostfeed_core::GPU_PLATFORMS {
        platforms.set_item(platform.name, GpuPlatform { platform })?;
    }
    m.add("GPU_PLATFORMS", platforms)?;
    Ok(())
}

/// A GPU platform hostfeed has handlers for (the values of `GPU_PLATFORMS`): its names, its
/// handlers' registrations, its driver's state and its pinned pool's counters. Nothing here
/// needs the platform's driver to import.
#[pyclass(frozen, module = "hostfeed._receiver.gpu")]
pub struct GpuPlatform {
    platform: &'static hostfeed_core::GpuPlatform,
}

#[pymethods]
impl GpuPlatform {
    /// hostfeed's (and JAX's) name of the platform: "cuda", "rocm".
    #[getter]
    fn name(&self) -> &'static str {
        self.platform.name
    }

    /// The platform name the handlers are registered under: "CUDA", "ROCM".
    #[getter]
    fn xla_platform(&self) -> &'static str {
        self.platform.xla_platform
    }

    /// `{target_name: PyCapsule}` of the platform's handlers, for
    /// `jax.ffi.register_ffi_target(..., platform=self.xla_platform)` (the same names as on
    /// CPU).
    fn registrations<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        handler_capsules(py, self.platform.handlers)
    }

    /// Why the platform's driver cannot be used (no library, a missing function, ...), or
    /// `None` when it can. Loads the driver library if present but does not initialise the
    /// driver.
    fn driver_error(&self, py: Python<'_>) -> Option<String> {
        py.detach(self.platform.driver_error).err()
    }

    /// The driver's version, or `None` without a usable driver. Initialises the driver.
    fn driver_version(&self, py: Python<'_>) -> Option<i32> {
        py.detach(self.platform.driver_version)
    }

    /// The file the driver's functions come from, or `None` without a driver library.
    fn driver_path(&self, py: Python<'_>) -> Option<String> {
        py.detach(self.platform.driver_path)
    }

    /// Counters of the platform's pinned-memory pool: `allocations`, `frees`,
    /// `allocated_bytes`, `in_use_bytes`, `blocks_taken`, `resets`.
    fn pool_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = (self.platform.pool_stats)();
        dict_of(
            py,
            [
                ("allocations", s.allocations),
                ("frees", s.frees),
                ("allocated_bytes", s.allocated_bytes),
                ("in_use_bytes", s.in_use_bytes),
                ("blocks_taken", s.blocks_taken),
                ("resets", s.resets),
            ],
        )
    }

    fn __repr__(&self) -> String {
        format!("GpuPlatform({:?})", self.platform.name)
    }
}
