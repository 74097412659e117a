//! `hostfeed._receiver`: the native core of hostfeed.
//!
//! XLA FFI handlers copy tapped operands into a byte-bounded queue; a consumer thread hands
//! them to Python in batches. See `DESIGN.md` for the data path.

pub mod consumer;
pub mod copy;
pub mod error;
pub mod handlers;
pub mod pyapi;
pub mod queue;
pub mod reply;
pub mod stats;
pub mod xla_ffi;

use pyo3::prelude::*;

#[pymodule]
fn _receiver(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("ReceiverError", py.get_type::<error::ReceiverError>())?;
    m.add("ReceiverTimeoutError", py.get_type::<error::ReceiverTimeoutError>())?;
    m.add("CallbackContextError", py.get_type::<error::CallbackContextError>())?;
    m.add_class::<consumer::MessageData>()?;
    m.add_class::<consumer::Reply>()?;
    m.add("DEFAULT_MAX_QUEUE_BYTES", consumer::DEFAULT_MAX_QUEUE_BYTES)?;
    m.add_function(wrap_pyfunction!(pyapi::start, m)?)?;
    m.add_function(wrap_pyfunction!(pyapi::stop, m)?)?;
    m.add_function(wrap_pyfunction!(pyapi::finalize, m)?)?;
    m.add_function(wrap_pyfunction!(pyapi::barrier, m)?)?;
    m.add_function(wrap_pyfunction!(pyapi::is_running, m)?)?;
    m.add_function(wrap_pyfunction!(pyapi::in_callback_thread, m)?)?;
    m.add_function(wrap_pyfunction!(pyapi::max_queue_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(pyapi::set_max_queue_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(pyapi::stats, m)?)?;
    m.add_function(wrap_pyfunction!(pyapi::reset_peak, m)?)?;
    m.add_function(wrap_pyfunction!(pyapi::registrations, m)?)?;
    Ok(())
}
