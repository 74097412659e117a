//! The GPU platforms' functions (CUDA, ROCm): the handlers' registrations, the driver's
//! state, the pinned pool's counters.

use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::host::{dict_of, handler_capsules, WAIT_SLICE};

/// Waits (GIL released, signals checked) until the GPU couriers delivered every tap handed
/// to them so far.
pub(crate) fn wait_gpu_parcels(py: Python<'_>) -> PyResult<()> {
    let parcels = hostfeed_core::GPU_DELIVERY.submitted();
    while !hostfeed_core::GPU_DELIVERY.delivered_at_least(parcels) {
        if py.detach(|| hostfeed_core::GPU_DELIVERY.wait_delivered(parcels, WAIT_SLICE)) {
            break;
        }
        py.check_signals()?;
    }
    Ok(())
}

/// Waits (GIL released, `limit` at most) until the GPU couriers delivered every tap
/// handed to them, so that stopping or exiting does not leave GPU taps behind.
pub(crate) fn wait_gpu_deliveries(py: Python<'_>, limit: Duration) {
    let parcels = hostfeed_core::GPU_DELIVERY.submitted();
    py.detach(|| hostfeed_core::GPU_DELIVERY.wait_delivered(parcels, limit));
}

/// `{target_name: PyCapsule}` of the CUDA handlers, for
/// `jax.ffi.register_ffi_target(..., platform="CUDA")` (same names as on CPU).
#[pyfunction]
pub fn cuda_registrations(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    handler_capsules(py, hostfeed_core::CUDA_HANDLERS)
}

/// Why the CUDA driver cannot be used (no library, a missing function, not the library
/// XLA loaded), or `None` when it can. Loads the driver library if present but does not
/// initialise CUDA.
#[pyfunction]
pub fn cuda_driver_error(py: Python<'_>) -> Option<String> {
    py.detach(|| hostfeed_core::cuda_driver_library().and_then(|()| hostfeed_core::cuda_same_driver_as_xla()))
        .err()
}

/// The file hostfeed's CUDA driver functions come from, or `None` without a driver.
#[pyfunction]
pub fn cuda_driver_path(py: Python<'_>) -> Option<String> {
    py.detach(hostfeed_core::cuda_driver_path)
}

/// The CUDA driver's version (e.g. 13000 for 13.0), or `None` without a usable driver.
/// Initialises CUDA.
#[pyfunction]
pub fn cuda_driver_version(py: Python<'_>) -> Option<i32> {
    py.detach(hostfeed_core::cuda_driver_version)
}

/// Counters of the pinned-memory pool of CUDA messages.
#[pyfunction]
pub fn cuda_pool_stats(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    pool_stats_dict(py, &hostfeed_core::cuda_pool_stats())
}

/// A pinned pool's counters as a dict (the same keys for every GPU driver).
fn pool_stats_dict<'py>(py: Python<'py>, s: &hostfeed_core::PoolStats) -> PyResult<Bound<'py, PyDict>> {
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

// The ROCm platform: the same handlers over the HIP runtime (loaded at run time).

/// `{target_name: PyCapsule}` of the ROCm handlers, for
/// `jax.ffi.register_ffi_target(..., platform="ROCM")` (same names as on CPU).
#[pyfunction]
pub fn rocm_registrations(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    handler_capsules(py, hostfeed_core::ROCM_HANDLERS)
}

/// Why the HIP runtime cannot be used (no `libamdhip64`, a missing function), or `None`
/// when it can. Loads the runtime library if present but does not initialise HIP.
#[pyfunction]
pub fn rocm_driver_error(py: Python<'_>) -> Option<String> {
    py.detach(hostfeed_core::rocm_runtime_library).err()
}

/// The file hostfeed's HIP functions come from, or `None` without the runtime.
#[pyfunction]
pub fn rocm_driver_path(py: Python<'_>) -> Option<String> {
    py.detach(hostfeed_core::rocm_runtime_path)
}

/// The HIP runtime's version, or `None` without a usable runtime. Initialises HIP.
#[pyfunction]
pub fn rocm_driver_version(py: Python<'_>) -> Option<i32> {
    py.detach(hostfeed_core::rocm_runtime_version)
}

/// Counters of the pinned-memory pool of ROCm messages.
#[pyfunction]
pub fn rocm_pool_stats(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    pool_stats_dict(py, &hostfeed_core::rocm_pool_stats())
}
