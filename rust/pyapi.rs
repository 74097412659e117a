//! The Python-facing functions of `hostfeed._receiver`: argument checks, conversions, and
//! the GIL released around every wait. Everything here is a thin wrapper over `consumer`.

use std::ffi::c_void;
use std::time::Duration;

use numpy::PyArrayDescr;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyDict};

use crate::consumer::{self, DispatchConfig};
use crate::handlers;
use crate::xla_ffi::XLA_FFI_Handler;

fn duration(timeout: Option<f64>) -> PyResult<Option<Duration>> {
    match timeout {
        None => Ok(None),
        Some(t) if t.is_finite() && t >= 0.0 => Ok(Some(Duration::from_secs_f64(t))),
        Some(t) => Err(PyValueError::new_err(format!(
            "timeout must be a non-negative number of seconds or None, got {t}"
        ))),
    }
}

/// Configures and starts the receiver.
///
/// `dispatcher(batch)` is called on the consumer thread with a list of
/// `(consumer_id, device_ordinal, flags, arrays, reply_or_None, run_id)` tuples; `dtypes` maps XLA dtype codes
/// to numpy dtypes. Returns whether a consumer thread was started by this call.
#[pyfunction]
#[pyo3(signature = (dispatcher, dtypes, max_queue_bytes=None))]
pub fn start(
    py: Python<'_>,
    dispatcher: Bound<'_, PyAny>,
    dtypes: &Bound<'_, PyDict>,
    max_queue_bytes: Option<u64>,
) -> PyResult<bool> {
    if !dispatcher.is_callable() {
        return Err(PyValueError::new_err("dispatcher must be callable"));
    }
    let mut descrs: Vec<Option<Py<PyArrayDescr>>> = Vec::new();
    for (k, v) in dtypes.iter() {
        let code: usize = k.extract()?;
        let descr = v.cast_into::<PyArrayDescr>().map_err(|e| {
            PyValueError::new_err(format!("dtypes[{code}] must be a numpy dtype: {e}"))
        })?;
        if descrs.len() <= code {
            descrs.resize_with(code + 1, || None);
        }
        descrs[code] = Some(descr.unbind());
    }
    let receiver = consumer::global();
    if let Some(bound) = max_queue_bytes {
        set_max_queue_bytes(bound)?;
    }
    let config = DispatchConfig { dispatcher: dispatcher.unbind(), descrs };
    // Detached: the control lock may be held by a `stop` waiting for the consumer, which
    // needs the GIL.
    Ok(py.detach(move || {
        receiver.configure(config);
        receiver.start()
    })?)
}

const DEFAULT_STALL_SECONDS: f64 = 10.0;

fn stall(seconds: Option<f64>) -> PyResult<Duration> {
    Ok(duration(Some(seconds.unwrap_or(DEFAULT_STALL_SECONDS)))?.unwrap_or_default())
}

/// Drains the queue, then stops and joins the consumer thread (GIL released). If a
/// callback makes no progress for `stall_timeout` seconds, waiting calls are failed and the
/// thread is abandoned; returns whether the thread was joined.
#[pyfunction]
#[pyo3(signature = (stall_timeout=None))]
pub fn stop(py: Python<'_>, stall_timeout: Option<f64>) -> PyResult<bool> {
    Ok(consumer::global().stop(py, stall(stall_timeout)?)?)
}

/// Stops the receiver for good; later taps fail with an error (interpreter exit).
#[pyfunction]
#[pyo3(signature = (stall_timeout=None))]
pub fn finalize(py: Python<'_>, stall_timeout: Option<f64>) -> PyResult<()> {
    Ok(consumer::global().finalize(py, stall(stall_timeout)?)?)
}

/// Waits until every message enqueued before the call is processed.
#[pyfunction]
#[pyo3(signature = (timeout=None))]
pub fn barrier(py: Python<'_>, timeout: Option<f64>) -> PyResult<()> {
    let timeout = duration(timeout)?;
    Ok(consumer::global().barrier(py, timeout)?)
}

/// Whether the consumer thread is running.
#[pyfunction]
pub fn is_running(py: Python<'_>) -> bool {
    py.detach(|| consumer::global().is_running())
}

/// Whether the caller runs on the consumer thread (inside a host callback).
#[pyfunction]
pub fn in_callback_thread() -> bool {
    consumer::in_consumer_thread()
}

/// The queue's byte bound.
#[pyfunction]
pub fn max_queue_bytes() -> u64 {
    consumer::global().queue.bound() as u64
}

/// Sets the queue's byte bound (takes effect at once, also for blocked producers).
#[pyfunction]
pub fn set_max_queue_bytes(bound: u64) -> PyResult<()> {
    if bound == 0 {
        return Err(PyValueError::new_err("max_queue_bytes must be positive"));
    }
    let bound = usize::try_from(bound).map_err(|_| PyValueError::new_err("bound too large"))?;
    consumer::global().queue.set_bound(bound);
    Ok(())
}

/// The receiver's counters as a dict.
#[pyfunction]
pub fn stats(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    for (k, v) in consumer::global().queue.stats.snapshot().fields() {
        d.set_item(k, v)?;
    }
    d.set_item("max_queue_bytes", max_queue_bytes())?;
    Ok(d)
}

/// Resets `peak_queued_bytes` to the current queued bytes.
#[pyfunction]
pub fn reset_peak() {
    consumer::global().queue.stats.reset_peak();
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
    let d = PyDict::new(py);
    d.set_item("hostfeed_tap", capsule(py, handlers::hostfeed_tap)?)?;
    d.set_item("hostfeed_call", capsule(py, handlers::hostfeed_call)?)?;
    d.set_item("hostfeed_check", capsule(py, handlers::hostfeed_check)?)?;
    Ok(d)
}
