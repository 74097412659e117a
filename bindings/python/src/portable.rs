//! The portable transport's Python functions (`push_host`, `call_host`, `failure_text`):
//! on platforms without hostfeed handlers the primitives are lowered through JAX's own
//! host-callback lowering, and the Python function that JAX runs on its execution thread
//! calls these with the callback's numpy arrays. The arrays are checked and described
//! here; the message, the push and the wait for a reply are the core's
//! (`hostfeed_core::portable`), pushed like an eager tap (`host/lifecycle.rs`'s `push_eager`).
//!
//! The GIL is released around every wait here (the queue when full, a call's reply).

use std::sync::atomic::Ordering;

use numpy::npyffi;
use numpy::{PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::error::IntoPy;
use crate::host::EAGER_PUSHED;
use hostfeed_core::portable::{self, HostArray, Outputs};
use hostfeed_core::{Error, Message};

/// Adds the portable transport's functions to `m`.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(push_host, m)?)?;
    m.add_function(wrap_pyfunction!(call_host, m)?)?;
    m.add_function(wrap_pyfunction!(failure_text, m)?)?;
    Ok(())
}

/// The data pointer of a C-contiguous numpy array (refused otherwise).
fn data_of(a: &Bound<'_, PyUntypedArray>, what: &str, i: usize) -> PyResult<*mut u8> {
    if !a.is_c_contiguous() {
        return Err(PyValueError::new_err(format!("{what} {i} is not a C-contiguous array")));
    }
    // SAFETY: `a` is a live numpy array object; reading its data pointer field is what
    // `PyArray_DATA` does.
    Ok(unsafe { (*npyffi::_PyArray_GET_ITEM_DATA(a.as_array_ptr())).data.cast::<u8>() })
}

fn dims_of(a: &Bound<'_, PyUntypedArray>) -> Vec<i64> {
    a.shape().iter().map(|&d| i64::try_from(d).unwrap_or(i64::MAX)).collect()
}

/// A message for `consumer_id` holding copies of `arrays` (XLA dtype codes `codes`), as if
/// device `device` had sent it.
fn gather(
    consumer_id: i64,
    arrays: &[Bound<'_, PyUntypedArray>],
    codes: &[i32],
    device: i32,
    flags: i64,
) -> PyResult<Message> {
    if arrays.len() != codes.len() {
        return Err(PyValueError::new_err(format!(
            "{} arrays but {} dtype codes",
            arrays.len(),
            codes.len()
        )));
    }
    let mut host = Vec::with_capacity(arrays.len());
    for (i, (a, &code)) in arrays.iter().zip(codes).enumerate() {
        let data = data_of(a, "operand", i)?;
        host.push(HostArray {
            code,
            data: data.cast_const(),
            itemsize: a.dtype().itemsize(),
            dims: dims_of(a),
        });
    }
    // SAFETY: each array is a live C-contiguous numpy array (kept alive by `arrays`) of
    // `itemsize` bytes per element and its shape as dims.
    match unsafe { portable::gather(consumer_id, &host, device, flags) } {
        Err(Error::InvalidArgument(m)) => Err(PyValueError::new_err(m)),
        other => other.py(),
    }
}

/// A tap of the portable transport: copies `arrays` (C-contiguous numpy arrays with XLA
/// dtype codes `codes`) into a message for the consumer registered under `consumer_id`,
/// as if device `device` had sent it with `flags`, and enqueues it. When the queue is full
/// this waits (GIL released), which pauses the computation that sends, like a native tap.
#[pyfunction]
#[pyo3(signature = (consumer_id, arrays, codes, device, flags=0))]
#[allow(clippy::needless_pass_by_value)]
pub fn push_host(
    py: Python<'_>,
    consumer_id: i64,
    arrays: Vec<Bound<'_, PyUntypedArray>>,
    codes: Vec<i32>,
    device: i32,
    flags: i64,
) -> PyResult<()> {
    let start = portable::now();
    let msg = gather(consumer_id, &arrays, &codes, device, flags)?;
    // The pusher holds the GIL the consumer will want (see `EAGER_HANDOFF_SPIN`).
    EAGER_PUSHED.store(true, Ordering::Release);
    py.detach(|| portable::push(start, msg)).py()
}

/// A `call` of the portable transport: enqueues `arrays` for the call consumer
/// `consumer_id` (as [`push_host`]) and waits, GIL released, for its reply, which the
/// consumer writes straight into `outputs` (C-contiguous numpy arrays of the call's result
/// shapes, alive for the whole wait). Honours `timeout_ms` (0: none), Ctrl-C and SIGTERM,
/// like the native handler.
///
/// Without `FLAG_STATUS_OUTPUT` in `flags` a failure raises with the host function's
/// message (the result is 0); with it the outputs are zeroed and the failure's ticket is
/// returned (for `failure_text` and the later check).
#[pyfunction]
#[pyo3(signature = (consumer_id, arrays, codes, outputs, device, flags, timeout_ms, name))]
#[allow(clippy::too_many_arguments, clippy::needless_pass_by_value)]
pub fn call_host(
    py: Python<'_>,
    consumer_id: i64,
    arrays: Vec<Bound<'_, PyUntypedArray>>,
    codes: Vec<i32>,
    outputs: Vec<Bound<'_, PyUntypedArray>>,
    device: i32,
    flags: i64,
    timeout_ms: i64,
    name: String,
) -> PyResult<i32> {
    portable::refuse_inside_callback(flags).py()?;
    let mut outs = Vec::with_capacity(outputs.len());
    for (i, a) in outputs.iter().enumerate() {
        let data = data_of(a, "output", i)?;
        outs.push((data, a.len() * a.dtype().itemsize(), dims_of(a)));
    }
    let msg = gather(consumer_id, &arrays, &codes, device, flags)?;
    // SAFETY: `outputs` keeps the arrays alive until the call returns, and nothing else
    // writes them meanwhile (the caller waits here).
    let outs = unsafe { Outputs::new(outs) };
    EAGER_PUSHED.store(true, Ordering::Release);
    let result = py.detach(move || portable::call(msg, outs, flags, timeout_ms, &name));
    if result.is_err() {
        // A Ctrl-C (or SIGTERM) that ended the wait is pending in Python on the initial
        // thread: its handler would raise a `KeyboardInterrupt` in the next Python code,
        // JAX's callback wrapper, which lets it escape into XLA (the process aborts). Run
        // the handler here and keep the call's error, which names the interruption.
        if let Err(e) = py.check_signals() {
            let interrupt = e.is_instance_of::<pyo3::exceptions::PyKeyboardInterrupt>(py)
                || e.is_instance_of::<pyo3::exceptions::PySystemExit>(py);
            if !interrupt {
                return Err(e);
            }
        }
    }
    result.py()
}

/// The message of the failed `call` recorded under `ticket` (a status of `call_host`).
#[pyfunction]
pub fn failure_text(ticket: i32) -> String {
    portable::failure_text(ticket)
}
