//! The `extern "C"` XLA FFI handlers. They never touch Python: they decode the call frame
//! ([`Frame::decode`], the one unsafe boundary), copy the operands into a message and push
//! it onto the receiver's queue; a `call` runs its host function on this thread when
//! nothing else is pending, or waits for its reply ([`call_on_device_thread`]). Errors and panics become `XLA_FFI_Error`s,
//! so nothing unwinds into XLA and the JAX caller sees an ordinary exception.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;

use crate::error::Error;
use crate::ffi::c_api::{self as ffi, dtype};
use crate::ffi::frame::{self, Decoded, Frame};
use crate::host::call::{call_on_device_thread, waiting_computation};
use crate::host::cpu_share;
use crate::host::hub::{self, in_consumer_thread, Hub};
use crate::host::message::{self, CopyKind, Message, FLAG_STATUS_OUTPUT};

/// Copies the frame's operands into a message for the consumer the lowering named, as `kind`
/// says.
fn message(frame: &Frame<'_>, kind: CopyKind) -> Result<Message, Error> {
    let consumer_id = frame
        .attrs
        .consumer_id
        .ok_or_else(|| Error::InvalidArgument("custom call lacks the consumer_id attribute".into()))?;
    // SAFETY: every operand points at an XLA buffer of its dtype and dims, alive and
    // readable in host memory (CPU) for the duration of this call.
    let mut msg =
        unsafe { message::gather_as(kind, consumer_id, frame.attrs.flags, frame.device, frame.operands()) }?;
    msg.run_id = frame.run_id;
    Ok(msg)
}

/// The body of the tap handler: copy every operand and enqueue one message.
fn tap(frame: &Frame<'_>, hub: &'static Hub, start: u64) -> Result<(), Error> {
    // A tap's bytes are read by the consumer, maybe on another core.
    let mut msg = message(frame, CopyKind::ForConsumer)?;
    // The device-side cost: from the handler's start until the message is ready to queue
    // (time spent waiting for space on a full queue is counted by `producer_blocked_ns`).
    // The same timestamp starts the message's hand-over.
    msg.queued_at = hub.timing.now();
    hub.timing.record_device(start, msg.queued_at);
    hub.push(msg)?;
    // On the consumer's CPU, let it run the tap functions while the bytes are warm.
    if !in_consumer_thread() {
        cpu_share::after_push(hub.queue.pending_bytes());
    }
    Ok(())
}

/// The body of the call handler: enqueue the request, wait for the consumer's reply (no
/// GIL involved), which writes straight into the result buffers.
fn call(frame: &Frame<'_>, hub: &'static Hub, _start: u64) -> Result<(), Error> {
    if in_consumer_thread() {
        // The reply would have to come from this very thread.
        return Err(Error::InsideCallback(waiting_computation(frame.attrs.flags)));
    }
    let msg = message(frame, CopyKind::Cached)?;
    let mut outs = frame.outputs();
    let status = if frame.attrs.flags & FLAG_STATUS_OUTPUT != 0 {
        let status = outs.next().filter(|b| b.dtype() == dtype::S32 && b.dims().is_empty());
        Some(status.ok_or_else(|| Error::InvalidArgument("status result must be an int32 scalar".into()))?)
    } else {
        None
    };
    let outs = outs.map(|b| b.out_buf()).collect::<Result<Vec<_>, _>>()?;
    // Where to write zeros if the call fails and reports through its status instead.
    let zero_outputs: Vec<(*mut u8, usize)> =
        if status.is_some() { outs.iter().map(|o| (o.data, o.nbytes)).collect() } else { Vec::new() };
    let outcome = call_on_device_thread(hub, frame.attrs.name, frame.attrs.timeout_ms, msg, outs);
    let Some(status) = status else { return outcome };
    let code: i32 = match outcome {
        Ok(()) => 0,
        Err(e) => {
            for (data, n) in zero_outputs {
                // SAFETY: the slot is no longer pending (replied, abandoned or never pushed),
                // so nothing else writes these XLA result buffers of `n` bytes.
                unsafe { ptr::write_bytes(data, 0, n) };
            }
            hub.record_failure(e.to_string())
        }
    };
    // SAFETY: the status result is an int32 scalar buffer (checked above), in host memory.
    unsafe { status.data().cast::<i32>().write_unaligned(code) };
    Ok(())
}

/// An int32 scalar argument (the status of a call), read.
fn status_arg(frame: &Frame<'_>, what: &str) -> Result<i32, Error> {
    let status = frame
        .args
        .iter()
        .find(|b| !b.is_token())
        .ok_or_else(|| Error::InvalidArgument(format!("{what} needs a status operand")))?;
    if status.dtype() != dtype::S32 || !status.dims().is_empty() {
        return Err(Error::InvalidArgument(format!("{what} status must be an int32 scalar")));
    }
    // SAFETY: an int32 scalar buffer holds 4 readable bytes in host memory.
    Ok(unsafe { status.data().cast::<i32>().read_unaligned() })
}

/// The body of the check handler: fail if the (combined) status names a failed call.
///
/// With many processes the failure may have been recorded in another process, whose
/// tickets mean nothing here; there the lowering passes the failure's message as a second
/// operand (`uint8[n]`, NUL-padded UTF-8, see [`failure`]), which wins when present.
fn check(frame: &Frame<'_>, hub: &'static Hub, _start: u64) -> Result<(), Error> {
    match status_arg(frame, "hostfeed_check")? {
        0 => Ok(()),
        ticket => {
            let sent = frame.args.iter().filter(|b| !b.is_token()).nth(1).filter(|b| b.dtype() == dtype::U8);
            let text = match sent {
                Some(bytes) => {
                    let n = bytes.nbytes()?;
                    // SAFETY: a uint8 buffer of `n` bytes in host memory, alive for the call.
                    let raw = unsafe { std::slice::from_raw_parts(bytes.data().cast_const(), n) };
                    let end = raw.iter().position(|&b| b == 0).unwrap_or(n);
                    String::from_utf8_lossy(&raw[..end]).into_owned()
                }
                None => String::new(),
            };
            let text = if text.is_empty() { hub.failure_message(ticket) } else { text };
            Err(Error::CallFailed(text))
        }
    }
}

/// The body of the failure handler: writes the message of the failure recorded here
/// under this device's own status (a ticket of this process) into the `uint8[n]` result,
/// NUL-padded and cut to fit (zeros when the status is 0). Lets the lowering send the
/// message to the other processes of a multi-process computation.
fn failure(frame: &Frame<'_>, hub: &'static Hub, _start: u64) -> Result<(), Error> {
    let ticket = status_arg(frame, "hostfeed_failure")?;
    let out = frame
        .outputs()
        .next()
        .filter(|b| b.dtype() == dtype::U8)
        .ok_or_else(|| Error::InvalidArgument("hostfeed_failure needs a uint8 result".into()))?;
    let n = out.nbytes()?;
    let text = if ticket == 0 { String::new() } else { hub.failure_message(ticket) };
    let bytes = padded(text, n);
    // SAFETY: the result is a uint8 buffer of `n` bytes in host memory, owned by this call.
    unsafe { ptr::copy_nonoverlapping(bytes.as_ptr(), out.data(), n) };
    Ok(())
}

/// `text` as exactly `n` bytes: NUL-padded, or cut at a character boundary and marked
/// ` [...]` when longer.
pub(crate) fn padded(text: String, n: usize) -> Vec<u8> {
    const MORE: &[u8] = b" [...]";
    let mut bytes = text.into_bytes();
    if bytes.len() > n {
        let mut cut = n.saturating_sub(MORE.len());
        while cut > 0 && (bytes[cut] & 0xC0) == 0x80 {
            cut -= 1; // not inside a UTF-8 sequence
        }
        bytes.truncate(cut);
        bytes.extend_from_slice(&MORE[..MORE.len().min(n - cut)]);
    }
    bytes.resize(n, 0);
    bytes
}

/// Shared frame for every handler: decoding, panic guard, error conversion.
///
/// # Safety
/// `frame` must be null or a valid call frame from XLA.
pub(crate) unsafe fn run(
    frame: *mut ffi::XLA_FFI_CallFrame,
    name: &str,
    body: fn(&Frame<'_>, &'static Hub, u64) -> Result<(), Error>,
) -> *mut ffi::XLA_FFI_Error {
    let result = catch_unwind(AssertUnwindSafe(|| {
        let hub = hub::global();
        // The device-side cost of a tap is timed from here (decoding included).
        let start = hub.timing.now();
        // SAFETY: caller contract.
        match unsafe { Frame::decode(frame) } {
            Ok(Decoded::Nothing) => ptr::null_mut(),
            Ok(Decoded::Execute(f)) => match body(&f, hub, start) {
                Ok(()) => ptr::null_mut(),
                Err(e) => f.error_for(&e),
            },
            // SAFETY: `api` is null or the API table of this frame.
            Err((e, api)) => unsafe { frame::to_ffi_error(api, &e) },
        }
    }));
    result.unwrap_or_else(|panic| {
        let text = panic
            .downcast_ref::<&str>()
            .map(|s| (*s).to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        // SAFETY: caller contract: null or a valid frame.
        let api = unsafe { frame.as_ref() }.map_or(ptr::null(), |f| f.api);
        // SAFETY: `api` is null or the API table of this frame.
        unsafe { frame::to_ffi_error(api, &Error::Internal(format!("panic in {name}: {text}"))) }
    })
}

/// Defines a platform's `extern "C"` XLA FFI handlers, one per `symbol => body` pair, each
/// a thin wrapper that runs `body` inside [`run`] (decoding, panic guard, error
/// conversion), and `HANDLERS` (of the visibility given), the table of their target names
/// for registration (the names are the same on every platform; XLA tells them apart by the
/// platform registered).
/// As XLA's `XLA_FFI_DEFINE_HANDLER_SYMBOL` does for C++ handlers.
macro_rules! define_handlers {
    (
        $platform:literal;
        $vis:vis const HANDLERS;
        $($(#[doc = $doc:literal])* $symbol:ident => $body:path;)+
    ) => {
        $(
            $(#[doc = $doc])*
            ///
            /// # Safety
            /// Called by XLA with a valid call frame.
            pub(crate) unsafe extern "C" fn $symbol(
                frame: *mut $crate::ffi::c_api::XLA_FFI_CallFrame,
            ) -> *mut $crate::ffi::c_api::XLA_FFI_Error {
                // SAFETY: forwarded caller contract.
                unsafe { $crate::ffi::handlers::run(frame, concat!(stringify!($symbol), $platform), $body) }
            }
        )+

        /// This platform's handlers by XLA FFI target name, for
        /// `jax.ffi.register_ffi_target`.
        $vis const HANDLERS: &[(&str, $crate::ffi::c_api::XLA_FFI_Handler)] =
            &[$((stringify!($symbol), $symbol)),+];
    };
}
pub(crate) use define_handlers;

define_handlers! {
    "";
    pub const HANDLERS;
    /// XLA FFI handler `hostfeed_tap`: sends its operands to the host receiver.
    hostfeed_tap => tap;
    /// XLA FFI handler `hostfeed_call`: sends its operands to the host, waits for the host
    /// callback's results and writes them into the call's results.
    hostfeed_call => call;
    /// XLA FFI handler `hostfeed_check`: raises the failure of a `call` recorded under its
    /// status operand (every device of a multi-device computation reaches it together).
    hostfeed_check => check;
    /// XLA FFI handler `hostfeed_failure`: the message of this process's failed call named
    /// by a status operand, as bytes, so that it can be sent to the other processes.
    hostfeed_failure => failure;
}

#[cfg(test)]
mod tests {
    use super::padded;

    #[test]
    fn failure_text_is_padded_or_cut_at_a_character_boundary() {
        assert_eq!(padded("ab".into(), 4), b"ab\0\0");
        assert_eq!(padded(String::new(), 2), b"\0\0");
        let cut = padded("x".repeat(20), 10);
        assert_eq!(cut, b"xxxx [...]");
        // 'é' is two bytes: the cut never splits it, so the text stays valid UTF-8.
        let cut = padded("é".repeat(10), 11);
        assert_eq!(cut.len(), 11);
        assert_eq!(std::str::from_utf8(&cut).unwrap(), "éé [...]\0");
        assert_eq!(padded("abcdef".into(), 3), b" [."); // too small for any text
    }
}
