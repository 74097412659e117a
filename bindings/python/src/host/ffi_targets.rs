//! FFI target registration: the core's handlers as `{target_name: PyCapsule}` dicts for
//! `jax.ffi.register_ffi_target`.

use std::ffi::c_void;

use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyDict};

use hostfeed_core::XLA_FFI_Handler;

/// Adds the registration functions to `m`.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(registrations, m)?)?;
    m.add_function(wrap_pyfunction!(summary_registrations, m)?)?;
    Ok(())
}

fn capsule(py: Python<'_>, f: XLA_FFI_Handler) -> PyResult<Bound<'_, PyCapsule>> {
    // SAFETY: `PyCapsule_New` with a non-null pointer, no name (what
    // `jax.ffi.register_ffi_target` expects) and no destructor; the pointer is a static
    // function that lives as long as the process.
    unsafe {
        let raw = pyo3::ffi::PyCapsule_New(f as *mut c_void, std::ptr::null(), None);
        Ok(Bound::from_owned_ptr_or_err(py, raw)?.cast_into_unchecked())
    }
}

/// `{target_name: PyCapsule}` for `jax.ffi.register_ffi_target(..., platform="cpu")`.
#[pyfunction]
pub fn registrations(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    handler_capsules(py, hostfeed_core::CPU_HANDLERS)
}

/// `{target_name: PyCapsule}` of the CPU's summary handlers (`hostfeed_stats`,
/// `hostfeed_histogram`), for `jax.ffi.register_ffi_target(..., platform="cpu")`.
#[pyfunction]
pub fn summary_registrations(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    handler_capsules(py, hostfeed_core::CPU_SUMMARY_HANDLERS)
}

/// `{name: PyCapsule}` of FFI handlers.
pub(crate) fn handler_capsules<'py>(
    py: Python<'py>,
    handlers: &[(&str, XLA_FFI_Handler)],
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    for &(name, f) in handlers {
        d.set_item(name, capsule(py, f)?)?;
    }
    Ok(d)
}
