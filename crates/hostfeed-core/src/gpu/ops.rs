//! The bodies of the GPU handlers (tap, call, check, failure), written against a
//! [`Stream`]: the same for every GPU platform.

use crate::error::Error;
use crate::ffi::c_api::dtype;
use crate::ffi::handlers::Attrs;
use crate::ffi::handlers;
use crate::host::buffer::{HostBuffer, ALIGN};
use crate::host::call::{await_reply, waiting_computation};
use crate::host::hub::{in_consumer_thread, Hub};
use crate::host::message::{self, Message, Operand, FLAG_GPU, FLAG_STATUS_OUTPUT};
use crate::host::reply::OutBuf;

use crate::gpu::{Delivery, Job, Stream};

/// What a tap or call sends, besides its operands.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Header {
    pub(crate) consumer_id: i64,
    pub(crate) flags: i64,
    /// XLA device ordinal of the executing GPU.
    pub(crate) ordinal: i32,
    pub(crate) run_id: i64,
}

/// A pinned buffer of `len` bytes, or an empty heap one when `len` is 0.
fn buffer_for<S: Stream>(stream: &S, len: usize) -> Result<HostBuffer, Error> {
    if len == 0 {
        HostBuffer::with_capacity(0)
    } else {
        stream.host_buffer(len)
    }
}

/// After a failure with work possibly still writing `keep`: waits for the stream, then
/// drops `keep`; if even that fails, leaks it (never reuse memory a copy may write).
fn settle<S: Stream, T>(stream: &S, keep: T) {
    if stream.synchronize().is_ok() {
        drop(keep);
    } else {
        std::mem::forget(keep);
    }
}

/// A message for `operands` with a new (pinned) buffer, not yet filled.
pub(crate) fn new_message<'a>(
    stream: &impl Stream,
    header: Header,
    operands: impl Iterator<Item = Operand<'a>>,
) -> Result<Message, Error> {
    let lay = message::layout(operands)?;
    let mut data = buffer_for(stream, lay.capacity)?;
    data.set_len(lay.len());
    let mut msg = lay.into_message(header.consumer_id, header.flags | FLAG_GPU, header.ordinal, data);
    msg.run_id = header.run_id;
    Ok(msg)
}

/// Enqueues the copies of `operands` into `msg`'s buffer (laid out for them). On error,
/// some copies may be pending: the caller must [`settle`] the message.
///
/// # Safety
/// Each operand's `data` must be device memory readable for its bytes until the copies
/// ran (XLA's operand buffers, when called from a handler); `msg` must have been made by
/// [`new_message`] for the same operands.
unsafe fn enqueue_copies<'a>(
    stream: &impl Stream,
    msg: &mut Message,
    operands: impl Iterator<Item = Operand<'a>>,
) -> Result<(), Error> {
    let base = msg.data.as_mut_ptr();
    // Operands adjacent in device memory whose places in the message are adjacent too
    // (each but the last a multiple of ALIGN bytes: XLA often packs a call's operands
    // into one allocation) go in one copy: one driver call instead of several.
    let mut run: Option<(usize, *const u8, usize)> = None; // (offset, source, bytes)
    for (op, meta) in operands.zip(&msg.arrays) {
        if meta.nbytes == 0 {
            continue;
        }
        if let Some((offset, src, n)) = &mut run {
            if *offset + *n == meta.offset && src.wrapping_add(*n) == op.data {
                *n += meta.nbytes;
                continue;
            }
            // SAFETY: the run lies inside the message's pinned buffer (each operand's
            // offset + nbytes <= capacity), which nothing else uses until the copies
            // completed; its source is the caller's operands, one after the other.
            unsafe { stream.copy_to_host(base.add(*offset), *src, *n) }?;
        }
        run = Some((meta.offset, op.data, meta.nbytes));
    }
    if let Some((offset, src, n)) = run {
        // SAFETY: as above.
        unsafe { stream.copy_to_host(base.add(offset), src, n) }?;
    }
    Ok(())
}

/// The tap handler's body on a GPU (see the module documentation).
///
/// # Errors
/// Bad operands, no pinned memory, a failure to enqueue on the stream, a closed receiver.
///
/// # Safety
/// As [`enqueue_copies`].
pub(crate) unsafe fn tap<'a, S: Stream>(
    stream: &S,
    hub: &'static Hub,
    delivery: &'static Delivery,
    header: Header,
    operands: impl Iterator<Item = Operand<'a>> + Clone,
) -> Result<(), Error> {
    // Size the message first (its buffer's class decides its charge), then reserve, then
    // copy: nothing is enqueued for a message that cannot be admitted.
    let mut msg = new_message(stream, header, operands.clone())?;
    let reserved = msg.charged_bytes();
    delivery.reserve(hub, header.ordinal, reserved)?;
    // SAFETY: caller contract; `msg` was laid out for these operands.
    let ready = unsafe { enqueue_copies(stream, &mut msg, operands) }.and_then(|()| stream.record());
    let ready = match ready {
        Ok(r) => r,
        Err(e) => {
            settle(stream, msg);
            delivery.unreserve(hub, header.ordinal, reserved);
            return Err(e);
        }
    };
    delivery.submit(header.ordinal, ready, Job::Deliver { msg, hub, reserved });
    Ok(())
}

/// Where each result of a call goes in its staging buffer.
struct Staging {
    buf: HostBuffer,
    /// (offset in `buf`, device address, bytes) per result; the status last, if any.
    slots: Vec<(usize, *mut u8, usize)>,
}

fn staging<S: Stream>(stream: &S, outs: &[OutBuf], status: Option<&OutBuf>) -> Result<Staging, Error> {
    let mut slots = Vec::with_capacity(outs.len() + 1);
    let mut total = 0usize;
    for o in outs.iter().chain(status) {
        slots.push((total, o.data, o.nbytes));
        total = total
            .checked_add(o.nbytes.next_multiple_of(ALIGN))
            .ok_or_else(|| Error::InvalidArgument("results too large".into()))?;
    }
    let mut buf = buffer_for(stream, total)?;
    buf.set_len(total);
    Ok(Staging { buf, slots })
}

/// Enqueues the copies of the staging buffer into the results, then hands the buffer to
/// the courier, which releases it once they completed.
fn write_back<S: Stream>(
    stream: &S,
    delivery: &'static Delivery,
    ordinal: i32,
    st: Staging,
) -> Result<(), Error> {
    if st.slots.iter().all(|&(_, _, n)| n == 0) {
        return Ok(()); // nothing to copy: the buffer is not in use
    }
    let base = st.buf.as_ptr();
    for &(offset, dst, n) in &st.slots {
        if n > 0 {
            // SAFETY: `dst` is an XLA result buffer of `n` bytes on this stream's device;
            // the source lies inside the staging buffer, kept alive (and unchanged) until
            // the courier saw a marker recorded after the copy.
            if let Err(e) = unsafe { stream.copy_to_device(dst, base.add(offset), n) } {
                settle(stream, st.buf);
                return Err(e);
            }
        }
    }
    let ready = match stream.record() {
        Ok(r) => r,
        Err(e) => {
            settle(stream, st.buf);
            return Err(e);
        }
    };
    delivery.submit(ordinal, ready, Job::Release(st.buf));
    Ok(())
}

/// The call handler's body on a GPU: `outputs` are the call's result buffers (device
/// memory) after the status, which `status` is when the call reports through one.
///
/// # Errors
/// As on CPU: the host function's failure (unless reported through `status`), timeouts,
/// interruptions; failures to enqueue on the stream.
///
/// # Safety
/// As [`enqueue_copies`]; each output must be device memory writable for its bytes.
#[allow(clippy::too_many_arguments)] // the pieces of a decoded frame
pub(crate) unsafe fn call<'a, S: Stream>(
    stream: &S,
    hub: &'static Hub,
    delivery: &'static Delivery,
    header: Header,
    attrs: &Attrs<'_>,
    operands: impl Iterator<Item = Operand<'a>> + Clone,
    outputs: &[OutBuf],
    status: Option<&OutBuf>,
) -> Result<(), Error> {
    if in_consumer_thread() {
        return Err(Error::InsideCallback(waiting_computation(header.flags)));
    }
    if header.flags & FLAG_STATUS_OUTPUT != 0 && status.is_none_or(|s| s.dtype != dtype::S32 || s.nbytes != 4)
    {
        return Err(Error::InvalidArgument("status result must be an int32 scalar".into()));
    }
    let mut msg = new_message(stream, header, operands.clone())?;
    let st = staging(stream, outputs, status)?;
    // SAFETY: caller contract; `msg` was laid out for these operands.
    let copied = unsafe { enqueue_copies(stream, &mut msg, operands) };
    // The operands must be on the host before the request goes out.
    if let Err(e) = copied.and_then(|()| stream.synchronize()) {
        settle(stream, msg);
        return Err(e);
    }
    // The device's taps before this call reach the queue before it.
    delivery.wait_idle(header.ordinal);
    let base = st.buf.as_ptr().cast_mut();
    let outs: Vec<OutBuf> = outputs
        .iter()
        .zip(&st.slots)
        .map(|(o, &(offset, _, n))| OutBuf {
            dtype: o.dtype,
            // SAFETY: the slot lies inside the staging buffer.
            data: unsafe { base.add(offset) },
            nbytes: n,
            dims: o.dims.clone(),
        })
        .collect();
    let outcome = await_reply(hub, attrs.name, attrs.timeout_ms, msg, outs);
    if status.is_none() {
        outcome?;
        return write_back(stream, delivery, header.ordinal, st);
    }
    let code = match outcome {
        Ok(()) => 0,
        Err(e) => {
            for &(offset, _, n) in &st.slots {
                // SAFETY: inside the staging buffer, which nobody else writes any more
                // (the reply slot is no longer pending).
                unsafe { std::ptr::write_bytes(base.add(offset), 0, n) };
            }
            hub.record_failure(e.to_string())
        }
    };
    let (status_offset, _, _) = st.slots[st.slots.len() - 1];
    // SAFETY: the status slot holds 4 bytes of the staging buffer.
    unsafe { base.add(status_offset).cast::<i32>().write_unaligned(code) };
    write_back(stream, delivery, header.ordinal, st)
}

/// Reads `n` bytes of device memory (synchronously: the stream is waited for).
///
/// # Safety
/// `src` must be device memory readable for `n` bytes.
unsafe fn read_device<S: Stream>(stream: &S, src: *const u8, n: usize) -> Result<Vec<u8>, Error> {
    let mut buf = buffer_for(stream, n)?;
    if n > 0 {
        // SAFETY: the pinned buffer holds `n` bytes; caller contract for `src`.
        if let Err(e) = unsafe { stream.copy_to_host(buf.as_mut_ptr(), src, n) } {
            settle(stream, buf);
            return Err(e);
        }
    }
    if let Err(e) = stream.synchronize() {
        std::mem::forget(buf);
        return Err(e);
    }
    // SAFETY: the copy of `n` bytes completed.
    Ok(unsafe { std::slice::from_raw_parts(buf.as_ptr(), n) }.to_vec())
}

/// The status operand of `hostfeed_check`/`hostfeed_failure`, read from the device.
///
/// # Safety
/// `status.data` must be device memory of an int32 scalar.
unsafe fn read_status<S: Stream>(stream: &S, status: &Operand<'_>, what: &str) -> Result<i32, Error> {
    if status.dtype != dtype::S32 || !status.dims.is_empty() {
        return Err(Error::InvalidArgument(format!("{what} status must be an int32 scalar")));
    }
    // SAFETY: caller contract.
    let bytes = unsafe { read_device(stream, status.data, 4) }?;
    Ok(i32::from_ne_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
}

/// The check handler's body on a GPU (as `handlers::check`): `status` is the combined
/// status, `sent` the optional `uint8[n]` failure text from another process.
///
/// # Errors
/// The recorded failure when the status names one.
///
/// # Safety
/// The operands must be device memory of their dtypes and dims.
pub(crate) unsafe fn check<S: Stream>(
    stream: &S,
    hub: &'static Hub,
    status: &Operand<'_>,
    sent: Option<&Operand<'_>>,
) -> Result<(), Error> {
    // SAFETY: caller contract.
    let ticket = unsafe { read_status(stream, status, "hostfeed_check") }?;
    if ticket == 0 {
        return Ok(());
    }
    let text = match sent.filter(|b| b.dtype == dtype::U8) {
        Some(b) => {
            let n = b.dims.iter().map(|&d| usize::try_from(d).unwrap_or(0)).product();
            // SAFETY: caller contract: a uint8 buffer of `n` bytes.
            let raw = unsafe { read_device(stream, b.data, n) }?;
            let end = raw.iter().position(|&c| c == 0).unwrap_or(n);
            String::from_utf8_lossy(&raw[..end]).into_owned()
        }
        None => String::new(),
    };
    let text = if text.is_empty() { hub.failure_message(ticket) } else { text };
    Err(Error::CallFailed(text))
}

/// The failure handler's body on a GPU (as `handlers::failure`): writes the message of
/// the failure recorded under `status` into `out` (`uint8[n]`).
///
/// # Errors
/// Bad operands, failures to enqueue on the stream.
///
/// # Safety
/// `status` must be device memory of an int32 scalar, `out` device memory of its bytes.
pub(crate) unsafe fn failure<S: Stream>(
    stream: &S,
    hub: &'static Hub,
    delivery: &'static Delivery,
    ordinal: i32,
    status: &Operand<'_>,
    out: &OutBuf,
) -> Result<(), Error> {
    if out.dtype != dtype::U8 {
        return Err(Error::InvalidArgument("hostfeed_failure needs a uint8 result".into()));
    }
    // SAFETY: caller contract.
    let ticket = unsafe { read_status(stream, status, "hostfeed_failure") }?;
    let text = if ticket == 0 { String::new() } else { hub.failure_message(ticket) };
    let bytes = handlers::padded(text, out.nbytes);
    let mut st = staging(stream, std::slice::from_ref(out), None)?;
    // SAFETY: the staging buffer holds `out.nbytes` bytes at offset 0.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), st.buf.as_mut_ptr(), out.nbytes) };
    write_back(stream, delivery, ordinal, st)
}
