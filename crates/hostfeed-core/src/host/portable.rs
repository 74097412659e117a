//! The portable transport's Python-free half. On platforms without hostfeed handlers
//! (`tpu`, `rocm`, any other `PJRT` plugin, or everywhere with `HOSTFEED_TRANSPORT=jax`)
//! the primitives are lowered through JAX's own host-callback lowering; the Python
//! function JAX runs on its execution thread hands the callback's arrays to the binding
//! (`bindings/python/src/portable.rs`), which checks them and comes here. A tap builds the
//! same message a native handler builds (one copy into a host buffer, [`message::gather`])
//! and pushes it: the same byte bound and back-pressure, the same consumer thread, the
//! recorder's sinks. A call waits for its reply like the native call handler.
//!
//! No Python here; the binding releases the GIL around [`push`] and [`call`].

use crate::error::Error;
use crate::ffi::c_api::dtype;
use crate::host::call::{await_reply, waiting_computation};
use crate::host::hub::{self, in_consumer_thread};
use crate::host::message::{self, Message, Operand, FLAG_EAGER, FLAG_STATUS_OUTPUT};
use crate::host::reply::OutBuf;

/// A host array of the portable transport: XLA dtype `code`, C-contiguous bytes at `data`
/// of elements of `itemsize` bytes, `dims` its shape.
pub struct HostArray {
    /// `XLA_FFI_DataType` code.
    pub code: i32,
    /// The first byte.
    pub data: *const u8,
    /// Bytes of one element, as the array's own dtype says.
    pub itemsize: usize,
    /// The shape.
    pub dims: Vec<i64>,
}

/// A message for `consumer_id` holding copies of `arrays`, as if device `device` had sent
/// it with `flags` (less the eager bit).
///
/// # Errors
/// [`Error::InvalidArgument`] when an array's dtype code does not match its element
/// size; the errors of [`message::gather`].
///
/// # Safety
/// Each array's `data` points at `itemsize * product(dims)` readable bytes, alive for the
/// duration of the call.
pub unsafe fn gather(
    consumer_id: i64,
    arrays: &[HostArray],
    device: i32,
    flags: i64,
) -> Result<Message, Error> {
    for (i, a) in arrays.iter().enumerate() {
        let elem = dtype::element_size(a.code).unwrap_or(0);
        if elem != a.itemsize {
            return Err(Error::InvalidArgument(format!(
                "operand {i}: dtype code {} does not match its {}-byte elements",
                a.code, a.itemsize
            )));
        }
    }
    let operands = arrays.iter().map(|a| Operand { dtype: a.code, data: a.data, dims: &a.dims });
    // SAFETY: each operand points at bytes of exactly its dtype code (element size checked
    // above) and dims, alive for the call (the caller's contract).
    unsafe { message::gather(consumer_id, flags & !FLAG_EAGER, device, operands) }
}

/// Enqueues a tap's message (waits while the queue is full, which pauses the computation
/// that sends, like a native tap). `start` is when the tap began (for the device-side
/// histogram).
///
/// # Errors
/// The hub's, when it is shut down or no consumer can be started.
pub fn push(start: u64, mut msg: Message) -> Result<(), Error> {
    let r = hub::global();
    msg.queued_at = r.timing.now();
    r.timing.record_device(start, msg.queued_at);
    r.push(msg)
}

/// When a tap begins, on the hub's clock (for [`push`]).
#[must_use]
pub fn now() -> u64 {
    hub::global().timing.now()
}

/// Refuses a call (or a synchronous tap, `flags`) made from the consumer thread, whose
/// reply would have to come from that very thread.
///
/// # Errors
/// [`Error::InsideCallback`] there.
pub fn refuse_inside_callback(flags: i64) -> Result<(), Error> {
    if in_consumer_thread() {
        return Err(Error::InsideCallback(waiting_computation(flags)));
    }
    Ok(())
}

/// The result buffers of a [`call`], taken to the thread that waits for the reply.
pub struct Outputs(Vec<OutBuf>);

// SAFETY: the buffers belong to arrays that the waiting caller keeps alive (the contract
// of `Outputs::new`); only the reply slot writes through the pointers, under its lock,
// while the caller waits.
unsafe impl Send for Outputs {}

impl Outputs {
    /// Result buffers of `nbytes` bytes each at `data`, of shape `dims`.
    ///
    /// # Safety
    /// Each buffer stays alive and written by nobody else until the [`call`] it is given
    /// to returns.
    #[must_use]
    pub unsafe fn new(buffers: Vec<(*mut u8, usize, Vec<i64>)>) -> Self {
        Outputs(
            buffers
                .into_iter()
                .map(|(data, nbytes, dims)| OutBuf { dtype: -1, data, nbytes, dims })
                .collect(),
        )
    }
}

/// A call of the portable transport: enqueues `msg` (for the call consumer it names, see
/// [`gather`]) and waits for its reply, which the consumer writes straight into `outputs`.
/// Honours `timeout_ms` (0: none), Ctrl-C and SIGTERM, like the native handler; `name` is
/// the callback's, for error messages.
///
/// Without `FLAG_STATUS_OUTPUT` in `flags` a failure is returned as an error; with it the
/// outputs are zeroed and the failure's ticket is returned (for [`failure_text`] and the
/// later check). Success returns 0.
///
/// # Errors
/// The call's failure, without `FLAG_STATUS_OUTPUT`.
pub fn call(
    msg: Message,
    outputs: Outputs,
    flags: i64,
    timeout_ms: i64,
    name: &str,
) -> Result<i32, Error> {
    let zero: Vec<(usize, usize)> = outputs.0.iter().map(|o| (o.data as usize, o.nbytes)).collect();
    let r = hub::global();
    // The consumer writes through the outputs only while the reply slot is pending, that
    // is while `await_reply` waits.
    match await_reply(r, name.as_bytes(), timeout_ms, msg, outputs.0) {
        Ok(()) => Ok(0),
        Err(e) if flags & FLAG_STATUS_OUTPUT != 0 => {
            for (data, n) in zero {
                // SAFETY: the slot is no longer pending, so nothing else writes these `n`
                // bytes of an output buffer that the caller keeps alive (`Outputs::new`).
                unsafe { std::ptr::write_bytes(data as *mut u8, 0, n) };
            }
            Ok(r.record_failure(e.to_string()))
        }
        Err(e) => Err(e),
    }
}

/// The message of the failed call recorded under `ticket` (a status of [`call`]).
#[must_use]
pub fn failure_text(ticket: i32) -> String {
    hub::global().failure_message(ticket)
}
