//! The portable transport's way into the queue: on platforms without hostfeed handlers
//! (platforms `tpu`, `rocm`, any other `PJRT` plugin, or everywhere with `HOSTFEED_TRANSPORT=jax`) the
//! primitives are lowered through JAX's own host-callback lowering, and the Python
//! function that JAX runs on its execution thread calls these with the callback's arrays.
//! They build the same message a native handler builds (one copy into a host buffer,
//! `message::gather`) and push it like an eager tap ([`crate::pyapi::push_eager`]): the same
//! byte bound and back-pressure, the same consumer thread, the recorder's Rust sinks.
//!
//! The GIL is released around every wait here (the queue when full, a call's reply).
#![allow(clippy::missing_errors_doc, clippy::must_use_candidate)]

use std::sync::atomic::Ordering;

use numpy::npyffi;
use numpy::{PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::error::Error;
use crate::frame::Attrs;
use crate::handlers::{self, FLAG_STATUS_OUTPUT};
use crate::message::{self, Message, Operand};
use crate::receiver::{self, in_consumer_thread};
use crate::reply::OutBuf;

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
    let mut ops = Vec::with_capacity(arrays.len());
    let dims: Vec<Vec<i64>> = arrays.iter().map(dims_of).collect();
    for (i, (a, &code)) in arrays.iter().zip(codes).enumerate() {
        let data = data_of(a, "operand", i)?;
        let elem = crate::xla_ffi::dtype::element_size(code).unwrap_or(0);
        if elem != a.dtype().itemsize() {
            return Err(PyValueError::new_err(format!(
                "operand {i}: dtype code {code} does not match its {}-byte elements",
                a.dtype().itemsize()
            )));
        }
        ops.push((code, data.cast_const()));
    }
    let operands = ops.iter().zip(&dims).map(|(&(dtype, data), dims)| Operand { dtype, data, dims });
    // SAFETY: each operand points at a live C-contiguous numpy array (kept alive by
    // `arrays`) whose bytes are exactly those of its dtype code (element size checked
    // above) and dims (its shape).
    Ok(unsafe { message::gather(consumer_id, flags & !handlers::FLAG_EAGER, device, operands) }?)
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
    let r = receiver::global();
    let start = r.timing.now();
    let mut msg = gather(consumer_id, &arrays, &codes, device, flags)?;
    msg.queued_at = r.timing.now();
    r.timing.record_device(start, msg.queued_at);
    // The pusher holds the GIL the consumer will want (see `EAGER_HANDOFF_SPIN`).
    crate::pyapi::EAGER_PUSHED.store(true, Ordering::Release);
    Ok(py.detach(|| r.push(msg))?)
}

/// The result buffers of a `call_host`, taken to the thread that waits for the reply.
struct Outputs(Vec<OutBuf>);

// SAFETY: the buffers belong to numpy arrays that the waiting caller keeps alive; only the
// reply slot writes through the pointers, under its lock, while the caller waits.
unsafe impl Send for Outputs {}

impl Outputs {
    fn into_inner(self) -> Vec<OutBuf> {
        self.0
    }
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
    if in_consumer_thread() {
        // The reply would have to come from this very thread.
        return Err(Error::InsideCallback(handlers::waiting_computation(flags)).into());
    }
    let mut outs = Vec::with_capacity(outputs.len());
    for (i, a) in outputs.iter().enumerate() {
        let data = data_of(a, "output", i)?;
        outs.push(OutBuf { dtype: -1, data, nbytes: a.len() * a.dtype().itemsize(), dims: dims_of(a) });
    }
    let zero: Vec<(usize, usize)> = outs.iter().map(|o| (o.data as usize, o.nbytes)).collect();
    let msg = gather(consumer_id, &arrays, &codes, device, flags)?;
    let attrs = Attrs { consumer_id: Some(consumer_id), flags, timeout_ms, name: name.as_bytes() };
    crate::pyapi::EAGER_PUSHED.store(true, Ordering::Release);
    let r = receiver::global();
    let outs = Outputs(outs);
    // The consumer writes through `outs` only while the reply slot is pending, that is
    // while `await_reply` waits; `outputs` keeps the arrays alive until then.
    let outcome = py.detach(move || handlers::await_reply(r, &attrs, msg, outs.into_inner()));
    match outcome {
        Ok(()) => Ok(0),
        Err(e) if flags & FLAG_STATUS_OUTPUT != 0 => {
            for (data, n) in zero {
                // SAFETY: the slot is no longer pending, so nothing else writes these `n`
                // bytes of an output array that `outputs` keeps alive.
                unsafe { std::ptr::write_bytes(data as *mut u8, 0, n) };
            }
            Ok(r.record_failure(e.to_string()))
        }
        Err(e) => Err(e.into()),
    }
}

/// The message of the failed `call` recorded under `ticket` (a status of `call_host`).
#[pyfunction]
pub fn failure_text(ticket: i32) -> String {
    receiver::global().failure_message(ticket)
}
