//! `hostfeed._receiver`: the native core of hostfeed.
//!
//! XLA FFI handlers copy tapped operands into a byte-bounded queue; a consumer thread hands
//! them to Python in batches. `ARCHITECTURE.md` at the repository root follows a tap and a
//! call through these modules.
//!
//! Without Python (tested by `cargo test` alone): `xla_ffi` (the C API mirror), `frame` (the
//! safe view of a call frame), `hostbuf` and `message` (host memory and the copy),
//! `pinned` (pinned memory for GPUs), `gpu` (taps and calls on a device stream), `gpu_driver` (the GPU handlers, written once for every driver), `cuda`
//! and `hip` (the CUDA driver and the HIP runtime for ROCm, loaded at run time),
//! `sync` (one lock helper, a waker), `queue`, `reply`, `receiver` (lifecycle, barrier, stuck consumers), `interrupt`
//! (Ctrl-C during a call), `stats`, `error`, `zarr` and `recorder` (values recorded to a
//! Zarr v3 store by writer threads). With Python: `dispatch` (messages as numpy arrays),
//! `exceptions`, `pyapi` (the module's functions and the consumer that calls Python),
//! `pyrecord` (the recorder's class), and the module definition below.

pub mod cuda;
pub mod dispatch;
pub mod error;
pub mod exceptions;
pub mod frame;
pub mod gpu;
pub mod gpu_driver;
pub mod handlers;
pub mod hip;
pub mod histogram;
pub mod hostbuf;
pub mod interrupt;
pub mod message;
pub mod pinned;
pub mod portable;
pub mod pyapi;
pub mod pyrecord;
pub mod queue;
pub mod receiver;
pub mod recorder;
pub mod reply;
pub mod stats;
pub mod storelock;
pub mod sync;
pub mod xla_ffi;
pub mod zarr;

use pyo3::prelude::*;

#[pymodule]
fn _receiver(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("ReceiverError", py.get_type::<exceptions::ReceiverError>())?;
    m.add("ReceiverTimeoutError", py.get_type::<exceptions::ReceiverTimeoutError>())?;
    m.add("CallbackContextError", py.get_type::<exceptions::CallbackContextError>())?;
    m.add("RecordingError", py.get_type::<exceptions::RecordingError>())?;
    m.add_class::<dispatch::MessageData>()?;
    m.add_class::<dispatch::BatchIter>()?;
    m.add_class::<dispatch::Reply>()?;
    m.add_class::<pyrecord::PyRecorder>()?;
    m.add("DEFAULT_MAX_QUEUE_BYTES", receiver::DEFAULT_MAX_QUEUE_BYTES)?;
    m.add("DEFAULT_STOP_TIMEOUT", receiver::DEFAULT_STOP_TIMEOUT.as_secs_f64())?;
    m.add("FLAG_STATUS_OUTPUT", handlers::FLAG_STATUS_OUTPUT)?;
    m.add("FLAG_SHARD", handlers::FLAG_SHARD)?;
    m.add("FLAG_EAGER", handlers::FLAG_EAGER)?;
    m.add("FLAG_SYNC_TAP", handlers::FLAG_SYNC_TAP)?;
    m.add("DTYPE_CODES", pyapi::dtype_codes(py)?)?;
    m.add_function(wrap_pyfunction!(pyapi::start, m)?)?;
    m.add_function(wrap_pyfunction!(pyrecord::after_fork_in_child, m)?)?;
    m.add_function(wrap_pyfunction!(pyapi::stop, m)?)?;
    m.add_function(wrap_pyfunction!(pyapi::finalize, m)?)?;
    m.add_function(wrap_pyfunction!(pyapi::start_exit_watch, m)?)?;
    m.add_function(wrap_pyfunction!(pyapi::stop_exit_watch, m)?)?;
    m.add_function(wrap_pyfunction!(pyapi::push_control, m)?)?;
    m.add_function(wrap_pyfunction!(pyapi::push_eager, m)?)?;
    m.add_function(wrap_pyfunction!(pyapi::barrier, m)?)?;
    m.add_function(wrap_pyfunction!(portable::push_host, m)?)?;
    m.add_function(wrap_pyfunction!(portable::call_host, m)?)?;
    m.add_function(wrap_pyfunction!(portable::failure_text, m)?)?;
    m.add_function(wrap_pyfunction!(pyapi::is_running, m)?)?;
    m.add_function(wrap_pyfunction!(pyapi::in_callback_thread, m)?)?;
    m.add_function(wrap_pyfunction!(pyapi::max_queue_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(pyapi::set_max_queue_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(pyapi::stats, m)?)?;
    m.add_function(wrap_pyfunction!(pyapi::reset_peak, m)?)?;
    m.add_function(wrap_pyfunction!(pyapi::histograms, m)?)?;
    m.add_function(wrap_pyfunction!(pyapi::reset_histograms, m)?)?;
    m.add_function(wrap_pyfunction!(pyapi::set_timing, m)?)?;
    m.add_function(wrap_pyfunction!(pyapi::set_buffer_pool_bytes, m)?)?;
    m.add("DEFAULT_BUFFER_POOL_BYTES", hostbuf::DEFAULT_POOL_BYTES)?;
    m.add_function(wrap_pyfunction!(pyapi::set_consumer_name, m)?)?;
    m.add_function(wrap_pyfunction!(pyapi::install_interrupt_watch, m)?)?;
    m.add_function(wrap_pyfunction!(pyapi::registrations, m)?)?;
    // gpu branch: the CUDA platform
    m.add_function(wrap_pyfunction!(pyapi::cuda_registrations, m)?)?;
    m.add_function(wrap_pyfunction!(pyapi::cuda_driver_error, m)?)?;
    m.add_function(wrap_pyfunction!(pyapi::cuda_driver_version, m)?)?;
    m.add_function(wrap_pyfunction!(pyapi::cuda_driver_path, m)?)?;
    m.add_function(wrap_pyfunction!(pyapi::cuda_pool_stats, m)?)?;
    m.add_function(wrap_pyfunction!(pyapi::cuda_copy_floor, m)?)?;
    m.add_function(wrap_pyfunction!(pyapi::rocm_registrations, m)?)?;
    m.add_function(wrap_pyfunction!(pyapi::rocm_driver_error, m)?)?;
    m.add_function(wrap_pyfunction!(pyapi::rocm_driver_version, m)?)?;
    m.add_function(wrap_pyfunction!(pyapi::rocm_driver_path, m)?)?;
    m.add_function(wrap_pyfunction!(pyapi::rocm_pool_stats, m)?)?;
    m.add_function(wrap_pyfunction!(pyapi::rocm_copy_floor, m)?)?;
    Ok(())
}
