//! The `extern "C"` XLA FFI handlers. They never touch Python: they answer the metadata
//! probe, read attributes and the device ordinal, copy operands (via `copy`) and push the
//! message onto the receiver's queue. Errors and panics become `XLA_FFI_Error`s, so nothing
//! unwinds into XLA and the JAX caller sees an ordinary exception.

use std::ffi::CString;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::consumer;
use crate::copy::{self, Operand};
use crate::error::Error;
use crate::reply::{OutBuf, ReplySlot, TimedOut};
use crate::xla_ffi::{self as ffi, dtype};

/// `flags` bit: the call has an int32 status result (first after the token) and reports
/// failures there instead of failing the computation on this device alone; a later
/// `hostfeed_check`, reached by every device after the status is combined, raises.
pub const FLAG_STATUS_OUTPUT: i64 = 1 << 1;

/// `flags` bit: a shard of a global-view tap or call; the message carries XLA's run id so
/// that the host groups the shards of one execution together.
pub const FLAG_SHARD: i64 = 1 << 2;

/// Attributes a hostfeed custom call carries (`mhlo.backend_config` dictionary). `name`
/// borrows XLA's attribute storage for the duration of the call.
#[derive(Debug, Default, Clone, Copy)]
struct Attrs<'a> {
    consumer_id: Option<i64>,
    flags: i64,
    /// `call` only: milliseconds to wait for the reply; 0 waits forever.
    timeout_ms: i64,
    /// `call` only: the callback's name, for error messages.
    name: &'a [u8],
}

/// If this call is XLA's metadata probe, fills in the API version and returns `true`.
///
/// # Safety
/// `frame` must be a valid call frame from XLA.
unsafe fn answer_metadata(frame: &ffi::XLA_FFI_CallFrame) -> bool {
    let ext = frame.extension_start;
    if ext.is_null() {
        return false;
    }
    // SAFETY: a non-null `extension_start` points at an extension header owned by XLA.
    let ext = unsafe { &*ext };
    if ext.type_ != ffi::XLA_FFI_Extension_Metadata {
        return false;
    }
    // SAFETY: an extension of type Metadata is an `XLA_FFI_Metadata_Extension`, whose first
    // member is the base we just read; its `metadata` pointer is valid for writing.
    unsafe {
        let meta_ext = &*(ptr::from_ref(ext).cast::<ffi::XLA_FFI_Metadata_Extension>());
        let meta = &mut *meta_ext.metadata;
        meta.api_version = ffi::XLA_FFI_Api_Version {
            struct_size: ffi::XLA_FFI_Api_Version_STRUCT_SIZE,
            extension_start: ptr::null_mut(),
            major_version: ffi::XLA_FFI_API_MAJOR,
            minor_version: ffi::XLA_FFI_API_MINOR,
        };
        meta.traits = 0;
    }
    true
}

/// Creates an `XLA_FFI_Error` carrying `err`'s message, or returns null if the API cannot
/// create one (never expected).
///
/// # Safety
/// `api` must be null or the API pointer from the current call frame.
unsafe fn to_ffi_error(api: *const ffi::XLA_FFI_Api, err: &Error) -> *mut ffi::XLA_FFI_Error {
    // SAFETY: per the contract, `api` is null or valid for the duration of the call.
    let Some(api) = (unsafe { api.as_ref() }) else { return ptr::null_mut() };
    let Some(create) = api.XLA_FFI_Error_Create else { return ptr::null_mut() };
    let text = err.to_string().replace('\0', " ");
    let message = CString::new(text).unwrap_or_default();
    let mut args = ffi::XLA_FFI_Error_Create_Args {
        struct_size: ffi::XLA_FFI_Error_Create_Args_STRUCT_SIZE,
        extension_start: ptr::null_mut(),
        message: message.as_ptr(),
        errc: err.ffi_code(),
    };
    // SAFETY: `args` is a properly initialised argument struct; XLA copies the message
    // before returning, so `message` may be dropped afterwards.
    unsafe { create(&raw mut args) }
}

/// Reads the attributes hostfeed's lowering attaches (integer scalars and the name).
///
/// # Safety
/// `attrs` must come from a valid call frame.
unsafe fn read_attrs(attrs: &ffi::XLA_FFI_Attrs) -> Result<Attrs<'_>, Error> {
    let mut out = Attrs::default();
    let n = usize::try_from(attrs.size).unwrap_or(0);
    for i in 0..n {
        // SAFETY: XLA guarantees `types`, `names` and `attrs` each hold `size` entries and
        // each name points at a byte span alive for the call.
        let (ty, name, value) = unsafe {
            let span = &**attrs.names.add(i);
            let name = std::slice::from_raw_parts(span.ptr.cast::<u8>(), span.len);
            (*attrs.types.add(i), name, *attrs.attrs.add(i))
        };
        let field: &mut i64 = match name {
            b"consumer_id" => out.consumer_id.insert(0),
            b"flags" => &mut out.flags,
            b"timeout_ms" => &mut out.timeout_ms,
            b"name" if ty == ffi::XLA_FFI_AttrType_STRING => {
                // SAFETY: a string attribute points at a byte span alive for the call.
                out.name = unsafe {
                    let span = &*value.cast::<ffi::XLA_FFI_ByteSpan>();
                    std::slice::from_raw_parts(span.ptr.cast::<u8>(), span.len)
                };
                continue;
            }
            _ => continue,
        };
        if ty != ffi::XLA_FFI_AttrType_SCALAR {
            return Err(Error::InvalidArgument(format!(
                "attribute {:?} must be an integer scalar",
                String::from_utf8_lossy(name)
            )));
        }
        // SAFETY: a scalar attribute points at an `XLA_FFI_Scalar` owned by XLA.
        let scalar = unsafe { &*value.cast::<ffi::XLA_FFI_Scalar>() };
        *field = match scalar.dtype {
            // SAFETY: the scalar's dtype tells the width of the value it points at.
            dtype::S64 => unsafe { *scalar.value.cast::<i64>() },
            // SAFETY: as above.
            dtype::S32 => i64::from(unsafe { *scalar.value.cast::<i32>() }),
            other => {
                return Err(Error::InvalidArgument(format!(
                    "attribute {:?} has dtype code {other}, expected a 64- or 32-bit integer",
                    String::from_utf8_lossy(name)
                )))
            }
        };
    }
    Ok(out)
}

/// The frame's API table, checked to be at least as large as the one this build mirrors
/// (so every function slot hostfeed reads exists).
///
/// # Safety
/// `frame` must be a valid call frame.
unsafe fn api(frame: &ffi::XLA_FFI_CallFrame) -> Result<&ffi::XLA_FFI_Api, Error> {
    // SAFETY: the frame's api pointer is null or valid for the duration of the call.
    let api = unsafe { frame.api.as_ref() }.ok_or_else(|| Error::Internal("null XLA_FFI_Api".into()))?;
    if api.struct_size < ffi::XLA_FFI_Api_STRUCT_SIZE {
        return Err(Error::Internal(format!(
            "XLA_FFI_Api is {} bytes, hostfeed needs {}: jaxlib is older than this build expects",
            api.struct_size,
            ffi::XLA_FFI_Api_STRUCT_SIZE
        )));
    }
    Ok(api)
}

/// Turns an FFI getter's result into `Ok(())` or an error naming the getter.
fn getter_result(err: *mut ffi::XLA_FFI_Error, name: &str) -> Result<(), Error> {
    if err.is_null() {
        Ok(())
    } else {
        Err(Error::Internal(format!("{name} failed")))
    }
}

/// The ordinal of the device executing this call.
///
/// # Safety
/// `frame` must be a valid call frame.
unsafe fn device_ordinal(frame: &ffi::XLA_FFI_CallFrame) -> Result<i32, Error> {
    // SAFETY: caller contract.
    let get = unsafe { api(frame) }?
        .XLA_FFI_DeviceOrdinal_Get
        .ok_or_else(|| Error::Internal("XLA_FFI_DeviceOrdinal_Get is missing".into()))?;
    let mut args = ffi::XLA_FFI_DeviceOrdinal_Get_Args {
        struct_size: ffi::XLA_FFI_DeviceOrdinal_Get_Args_STRUCT_SIZE,
        extension_start: ptr::null_mut(),
        ctx: frame.ctx,
        device_ordinal: 0,
    };
    // SAFETY: `args` is initialised and `ctx` comes from the frame.
    getter_result(unsafe { get(&raw mut args) }, "XLA_FFI_DeviceOrdinal_Get")?;
    Ok(args.device_ordinal)
}

/// XLA's id of the current execution (the same on every device of one launch).
///
/// # Safety
/// `frame` must be a valid call frame.
unsafe fn run_id(frame: &ffi::XLA_FFI_CallFrame) -> Result<i64, Error> {
    // SAFETY: caller contract.
    let get = unsafe { api(frame) }?
        .XLA_FFI_RunId_Get
        .ok_or_else(|| Error::Internal("XLA_FFI_RunId_Get is missing".into()))?;
    let mut args = ffi::XLA_FFI_RunId_Get_Args {
        struct_size: ffi::XLA_FFI_RunId_Get_Args_STRUCT_SIZE,
        extension_start: ptr::null_mut(),
        ctx: frame.ctx,
        run_id: 0,
    };
    // SAFETY: `args` is initialised and `ctx` comes from the frame.
    getter_result(unsafe { get(&raw mut args) }, "XLA_FFI_RunId_Get")?;
    Ok(args.run_id)
}

/// The buffer operands of a call frame, skipping tokens.
///
/// # Safety
/// `args` must come from a valid call frame and every entry must be a buffer (checked by
/// [`check_buffers`]); the returned operands borrow XLA's buffers for the call's duration.
unsafe fn operands(args: &ffi::XLA_FFI_Args) -> impl Iterator<Item = Operand<'_>> + Clone {
    let n = usize::try_from(args.size).unwrap_or(0);
    (0..n).filter_map(move |i| {
        // SAFETY: `args` holds `size` entries, each (checked) an `XLA_FFI_Buffer` whose
        // `dims` hold `rank` entries.
        unsafe {
            let buf = &*(*args.args.add(i)).cast::<ffi::XLA_FFI_Buffer>();
            if buf.dtype == dtype::TOKEN {
                return None;
            }
            let rank = usize::try_from(buf.rank).unwrap_or(0);
            let dims: &[i64] =
                if rank == 0 { &[] } else { std::slice::from_raw_parts(buf.dims, rank) };
            Some(Operand { dtype: buf.dtype, data: buf.data.cast::<u8>().cast_const(), dims })
        }
    })
}

/// Checks that every argument is a buffer (the only kind XLA passes today).
///
/// # Safety
/// `args` must come from a valid call frame.
unsafe fn check_buffers(args: &ffi::XLA_FFI_Args) -> Result<(), Error> {
    let n = usize::try_from(args.size).unwrap_or(0);
    for i in 0..n {
        // SAFETY: `types` holds `size` entries.
        if unsafe { *args.types.add(i) } != ffi::XLA_FFI_ArgType_BUFFER {
            return Err(Error::InvalidArgument(format!("argument {i} is not a buffer")));
        }
    }
    Ok(())
}

/// Reads the attributes and device, then copies the operands into a message.
///
/// # Safety
/// `frame` must be a valid call frame in the EXECUTE stage.
unsafe fn message(frame: &ffi::XLA_FFI_CallFrame) -> Result<(copy::Message, Attrs<'_>), Error> {
    // SAFETY: the frame is valid (caller contract).
    let attrs = unsafe { read_attrs(&frame.attrs) }?;
    let consumer_id = attrs
        .consumer_id
        .ok_or_else(|| Error::InvalidArgument("custom call lacks the consumer_id attribute".into()))?;
    // SAFETY: as above.
    let device = unsafe { device_ordinal(frame) }?;
    // SAFETY: as above; `operands` is only called after `check_buffers` succeeded, and the
    // operands point at XLA buffers alive for this call.
    let msg = unsafe {
        check_buffers(&frame.args)?;
        copy::gather(consumer_id, attrs.flags, device, operands(&frame.args))
    }?;
    Ok((msg, attrs))
}

/// The body of the tap handler: copy every buffer operand and enqueue one message.
///
/// # Safety
/// `frame` must be a valid call frame in the EXECUTE stage.
unsafe fn tap(frame: &ffi::XLA_FFI_CallFrame) -> Result<(), Error> {
    // SAFETY: caller contract.
    let (mut msg, attrs) = unsafe { message(frame) }?;
    if attrs.flags & FLAG_SHARD != 0 {
        // SAFETY: as above.
        msg.run_id = unsafe { run_id(frame) }?;
    }
    consumer::global().push(msg)
}

/// The custom call's result buffers (tokens skipped), as reply outputs.
///
/// # Safety
/// `rets` must come from a valid call frame.
unsafe fn outputs(rets: &ffi::XLA_FFI_Rets) -> Result<Vec<OutBuf>, Error> {
    let n = usize::try_from(rets.size).unwrap_or(0);
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        // SAFETY: `types` and `rets` hold `size` entries; a BUFFER result points at an
        // `XLA_FFI_Buffer` whose `dims` hold `rank` entries, alive for the call.
        let buf = unsafe {
            if *rets.types.add(i) != ffi::XLA_FFI_RetType_BUFFER {
                return Err(Error::InvalidArgument(format!("result {i} is not a buffer")));
            }
            &*(*rets.rets.add(i)).cast::<ffi::XLA_FFI_Buffer>()
        };
        if buf.dtype == dtype::TOKEN {
            continue;
        }
        let rank = usize::try_from(buf.rank).unwrap_or(0);
        // SAFETY: as above.
        let dims: Vec<i64> = if rank == 0 { Vec::new() } else { unsafe { std::slice::from_raw_parts(buf.dims, rank) }.to_vec() };
        let elem = dtype::element_size(buf.dtype).ok_or_else(|| {
            Error::InvalidArgument(format!("result {i} has unsupported dtype code {}", buf.dtype))
        })?;
        let nbytes = dims
            .iter()
            .try_fold(elem, |acc, &d| usize::try_from(d).ok().and_then(|d| acc.checked_mul(d)))
            .ok_or_else(|| Error::InvalidArgument(format!("result {i} has invalid dims {dims:?}")))?;
        out.push(OutBuf { dtype: buf.dtype, data: buf.data.cast(), nbytes, dims });
    }
    Ok(out)
}

/// The body of the call handler: enqueue the request, wait for the consumer's reply (no
/// GIL involved), which writes straight into the result buffers.
///
/// # Safety
/// `frame` must be a valid call frame in the EXECUTE stage.
unsafe fn call(frame: &ffi::XLA_FFI_CallFrame) -> Result<(), Error> {
    if consumer::in_consumer_thread() {
        // The reply would have to come from this very thread.
        return Err(Error::InsideCallback("a computation containing hcb.call"));
    }
    // SAFETY: caller contract.
    let (mut msg, attrs) = unsafe { message(frame) }?;
    if attrs.flags & FLAG_SHARD != 0 {
        // SAFETY: as above.
        msg.run_id = unsafe { run_id(frame) }?;
    }
    // SAFETY: as above.
    let mut outs = unsafe { outputs(&frame.rets) }?;
    let status = if attrs.flags & FLAG_STATUS_OUTPUT != 0 {
        if outs.is_empty() || outs[0].dtype != dtype::S32 || outs[0].nbytes != 4 {
            return Err(Error::InvalidArgument("status result must be an int32 scalar".into()));
        }
        Some(outs.remove(0))
    } else {
        None
    };
    // Where to write zeros if the call fails and reports through its status instead.
    let zero_outputs: Vec<(*mut u8, usize)> = if status.is_some() {
        outs.iter().map(|o| (o.data, o.nbytes)).collect()
    } else {
        Vec::new()
    };
    let slot = Arc::new(ReplySlot::new(outs));
    msg.reply = Some(Arc::clone(&slot));
    let receiver = consumer::global();
    let ticket = receiver.register_call(Arc::clone(&slot));
    let deadline = u64::try_from(attrs.timeout_ms)
        .ok()
        .filter(|&ms| ms > 0)
        .map(|ms| Instant::now() + Duration::from_millis(ms));
    let waited = receiver.push(msg).map(|()| slot.wait(deadline));
    receiver.deregister_call(ticket);
    let outcome = match waited {
        Ok(Ok(Ok(()))) => Ok(()),
        Ok(Ok(Err(message))) => Err(Error::CallFailed(message)),
        Ok(Err(TimedOut)) => Err(Error::CallTimeout {
            name: String::from_utf8_lossy(attrs.name).into_owned(),
            seconds: attrs.timeout_ms as f64 / 1e3,
        }),
        Err(e) => Err(e),
    };
    let Some(status) = status else { return outcome };
    let code: i32 = match outcome {
        Ok(()) => 0,
        Err(e) => {
            for (data, n) in zero_outputs {
                // SAFETY: the slot is no longer pending (replied, abandoned or never pushed),
                // so nothing else writes these XLA result buffers of `n` bytes.
                unsafe { ptr::write_bytes(data, 0, n) };
            }
            consumer::record_failure(e.to_string())
        }
    };
    // SAFETY: the status result is an int32 scalar buffer (checked above).
    unsafe { status.data.cast::<i32>().write_unaligned(code) };
    Ok(())
}

/// The body of the check handler: fail if the (combined) status names a failed call.
///
/// # Safety
/// `frame` must be a valid call frame in the EXECUTE stage.
unsafe fn check(frame: &ffi::XLA_FFI_CallFrame) -> Result<(), Error> {
    // SAFETY: caller contract; the operands are checked to be buffers first.
    let status = unsafe {
        check_buffers(&frame.args)?;
        operands(&frame.args).next()
    }
    .ok_or_else(|| Error::InvalidArgument("hostfeed_check needs a status operand".into()))?;
    if status.dtype != dtype::S32 || !status.dims.is_empty() {
        return Err(Error::InvalidArgument("hostfeed_check status must be an int32 scalar".into()));
    }
    // SAFETY: an int32 scalar buffer holds 4 readable bytes.
    let code = unsafe { status.data.cast::<i32>().read_unaligned() };
    match code {
        0 => Ok(()),
        ticket => Err(Error::CallFailed(consumer::failure_message(ticket))),
    }
}

/// Shared frame for every handler: metadata probe, stage check, panic guard, error
/// conversion.
///
/// # Safety
/// `frame` must be null or a valid call frame from XLA.
unsafe fn run(
    frame: *mut ffi::XLA_FFI_CallFrame,
    name: &str,
    body: unsafe fn(&ffi::XLA_FFI_CallFrame) -> Result<(), Error>,
) -> *mut ffi::XLA_FFI_Error {
    // SAFETY: XLA passes a valid frame for the duration of the call.
    let Some(frame) = (unsafe { frame.as_ref() }) else { return ptr::null_mut() };
    // SAFETY: the frame is valid.
    if unsafe { answer_metadata(frame) } {
        return ptr::null_mut();
    }
    if frame.stage != ffi::XLA_FFI_ExecutionStage_EXECUTE {
        return ptr::null_mut();
    }
    // SAFETY: the frame is valid and in the EXECUTE stage.
    let result = catch_unwind(AssertUnwindSafe(|| unsafe { body(frame) }));
    let err = match result {
        Ok(Ok(())) => return ptr::null_mut(),
        Ok(Err(e)) => e,
        Err(panic) => Error::Internal(format!(
            "panic in {name}: {}",
            panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default()
        )),
    };
    // SAFETY: the api pointer comes from the frame.
    unsafe { to_ffi_error(frame.api, &err) }
}

/// XLA FFI handler `hostfeed_tap`: sends its operands to the host receiver.
///
/// # Safety
/// Called by XLA with a valid call frame.
pub unsafe extern "C" fn hostfeed_tap(frame: *mut ffi::XLA_FFI_CallFrame) -> *mut ffi::XLA_FFI_Error {
    // SAFETY: forwarded caller contract.
    unsafe { run(frame, "hostfeed_tap", tap) }
}

/// XLA FFI handler `hostfeed_check`: raises the failure of a `call` recorded under its
/// status operand (every device of a multi-device computation reaches it together).
///
/// # Safety
/// Called by XLA with a valid call frame.
pub unsafe extern "C" fn hostfeed_check(frame: *mut ffi::XLA_FFI_CallFrame) -> *mut ffi::XLA_FFI_Error {
    // SAFETY: forwarded caller contract.
    unsafe { run(frame, "hostfeed_check", check) }
}

/// XLA FFI handler `hostfeed_call`: sends its operands to the host, waits for the host
/// callback's results and writes them into the call's results.
///
/// # Safety
/// Called by XLA with a valid call frame.
pub unsafe extern "C" fn hostfeed_call(frame: *mut ffi::XLA_FFI_CallFrame) -> *mut ffi::XLA_FFI_Error {
    // SAFETY: forwarded caller contract.
    unsafe { run(frame, "hostfeed_call", call) }
}
