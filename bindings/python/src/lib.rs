//! `hostfeed._receiver`: the Python extension module over `hostfeed-core`.
//!
//! The core (`crates/hostfeed-core`) has no Python; this crate turns its values into Python
//! objects and back, its modules mirroring the core's rooms. Its errors reach Python
//! through one conversion (`error::CoreError`). The module map is `ARCHITECTURE.md`
//! ("Where things live") at the repository root.

mod error;
mod gpu;
mod host;
mod messages;
mod portable;
mod record;

use pyo3::prelude::*;

#[pymodule]
fn _receiver(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("ReceiverError", py.get_type::<error::ReceiverError>())?;
    m.add("ReceiverTimeoutError", py.get_type::<error::ReceiverTimeoutError>())?;
    m.add("CallbackContextError", py.get_type::<error::CallbackContextError>())?;
    m.add("RecordingError", py.get_type::<error::RecordingError>())?;
    m.add_class::<messages::MessageData>()?;
    m.add_class::<messages::BatchIter>()?;
    m.add_class::<messages::Reply>()?;
    m.add_class::<record::PyRecorder>()?;
    m.add("DEFAULT_MAX_QUEUE_BYTES", hostfeed_core::DEFAULT_MAX_QUEUE_BYTES)?;
    m.add("DEFAULT_STOP_TIMEOUT", hostfeed_core::DEFAULT_STOP_TIMEOUT.as_secs_f64())?;
    m.add("FLAG_STATUS_OUTPUT", hostfeed_core::FLAG_STATUS_OUTPUT)?;
    m.add("FLAG_SHARD", hostfeed_core::FLAG_SHARD)?;
    m.add("FLAG_EAGER", hostfeed_core::FLAG_EAGER)?;
    m.add("FLAG_SYNC_TAP", hostfeed_core::FLAG_SYNC_TAP)?;
    m.add("DTYPE_CODES", host::dtype_codes(py)?)?;
    m.add_function(wrap_pyfunction!(host::start, m)?)?;
    m.add_function(wrap_pyfunction!(record::after_fork_in_child, m)?)?;
    m.add_function(wrap_pyfunction!(record::write_tracing, m)?)?;
    m.add_function(wrap_pyfunction!(host::stop, m)?)?;
    m.add_function(wrap_pyfunction!(host::finalize, m)?)?;
    m.add_function(wrap_pyfunction!(host::start_exit_watch, m)?)?;
    m.add_function(wrap_pyfunction!(host::stop_exit_watch, m)?)?;
    m.add_function(wrap_pyfunction!(host::push_control, m)?)?;
    m.add_function(wrap_pyfunction!(host::push_eager, m)?)?;
    m.add_function(wrap_pyfunction!(host::barrier, m)?)?;
    // The portable transport.
    m.add_function(wrap_pyfunction!(portable::push_host, m)?)?;
    m.add_function(wrap_pyfunction!(portable::call_host, m)?)?;
    m.add_function(wrap_pyfunction!(portable::failure_text, m)?)?;
    m.add_function(wrap_pyfunction!(host::is_running, m)?)?;
    m.add_function(wrap_pyfunction!(host::in_callback_thread, m)?)?;
    m.add_function(wrap_pyfunction!(host::max_queue_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(host::set_max_queue_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(host::stats, m)?)?;
    m.add_function(wrap_pyfunction!(host::reset_peak, m)?)?;
    m.add_function(wrap_pyfunction!(host::hold_back, m)?)?;
    m.add_function(wrap_pyfunction!(host::let_go, m)?)?;
    m.add_function(wrap_pyfunction!(host::histograms, m)?)?;
    m.add_function(wrap_pyfunction!(host::reset_histograms, m)?)?;
    m.add_function(wrap_pyfunction!(host::set_timing, m)?)?;
    m.add_function(wrap_pyfunction!(host::set_buffer_pool_bytes, m)?)?;
    m.add("DEFAULT_BUFFER_POOL_BYTES", hostfeed_core::DEFAULT_POOL_BYTES)?;
    m.add_function(wrap_pyfunction!(host::set_consumer_name, m)?)?;
    m.add_function(wrap_pyfunction!(host::install_interrupt_watch, m)?)?;
    m.add_function(wrap_pyfunction!(host::registrations, m)?)?;
    // The CUDA platform.
    m.add_function(wrap_pyfunction!(gpu::cuda_registrations, m)?)?;
    m.add_function(wrap_pyfunction!(gpu::cuda_driver_error, m)?)?;
    m.add_function(wrap_pyfunction!(gpu::cuda_driver_version, m)?)?;
    m.add_function(wrap_pyfunction!(gpu::cuda_driver_path, m)?)?;
    m.add_function(wrap_pyfunction!(gpu::cuda_pool_stats, m)?)?;
    m.add_function(wrap_pyfunction!(gpu::rocm_registrations, m)?)?;
    m.add_function(wrap_pyfunction!(gpu::rocm_driver_error, m)?)?;
    m.add_function(wrap_pyfunction!(gpu::rocm_driver_version, m)?)?;
    m.add_function(wrap_pyfunction!(gpu::rocm_driver_path, m)?)?;
    m.add_function(wrap_pyfunction!(gpu::rocm_pool_stats, m)?)?;
    Ok(())
}
