//! The XLA FFI entry: a safe view of a call frame, decoded once, and the `extern "C"` CPU
//! handlers that use it.
//!
//! XLA calls a handler with a raw `XLA_FFI_CallFrame*`. [`Frame::decode`] is the only place
//! that trusts it: it answers the metadata probe, checks the stage, the API table's size and
//! that every argument and result is a buffer, reads the attributes hostfeed's lowering
//! attaches, the device ordinal and the run id. What it returns borrows XLA's storage for
//! the duration of the call and is safe to use: the handlers below it contain no `unsafe`
//! except the actual reads and writes of device memory (in `message` and the reply).
//! XLA's own C++ binding (`Ffi::Bind`) has the same shape: decode, then typed access.
//!
//! The handlers never touch Python: they decode the call frame, copy the operands into a
//! message and push it onto the receiver's queue; a `call` runs its host function on this
//! thread when nothing else is pending, or waits for its reply ([`call_on_device_thread`]).
//! Errors and panics become `XLA_FFI_Error`s, so nothing unwinds into XLA and the JAX caller
//! sees an ordinary exception. The summaries' handlers (`summary_handlers.rs`) and the GPU
//! drivers decode their frames here too.
//!
//! No Python here.

use std::ffi::{c_void, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;

use crate::error::Error;
use crate::ffi::c_api::{self as ffi, dtype};
use crate::host::buffer;
use crate::host::call::{call_on_device_thread, waiting_computation};
use crate::host::hub::{self, in_consumer_thread, Hub};
use crate::host::message::{self, CopyKind, Message, Operand, FLAG_STATUS_OUTPUT};
use crate::host::reply::OutBuf;

/// One argument or result buffer of the call. Only built by [`Frame::decode`] from a
/// frame whose entries were checked to be buffers.
#[derive(Clone, Copy)]
#[repr(transparent)]
pub(crate) struct Buffer<'a> {
    raw: &'a ffi::XLA_FFI_Buffer,
}

impl<'a> Buffer<'a> {
    /// `XLA_FFI_DataType` code.
    #[must_use]
    pub(crate) fn dtype(self) -> ffi::XLA_FFI_DataType {
        self.raw.dtype
    }

    /// Whether this is the ordered-effect token (no data).
    #[must_use]
    pub(crate) fn is_token(self) -> bool {
        self.raw.dtype == dtype::TOKEN
    }

    /// The dimensions, outermost first.
    #[must_use]
    pub(crate) fn dims(&self) -> &'a [i64] {
        let rank = usize::try_from(self.raw.rank).unwrap_or(0);
        if rank == 0 || self.raw.dims.is_null() {
            return &[];
        }
        // SAFETY: XLA's buffer descriptor holds `rank` dimensions at `dims`, alive for the
        // call ('a); checked non-null above.
        unsafe { std::slice::from_raw_parts(self.raw.dims, rank) }
    }

    /// Device address of the data (host memory on CPU). Reading or writing it is up to
    /// the caller, who knows the platform.
    #[must_use]
    pub(crate) fn data(&self) -> *mut u8 {
        self.raw.data.cast()
    }

    /// Size of the data in bytes.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a dtype hostfeed cannot transfer or invalid dims.
    pub(crate) fn nbytes(self) -> Result<usize, Error> {
        let elem = dtype::element_size(self.raw.dtype).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "dtype code {} cannot be transferred (sub-byte and token types are not supported)",
                self.raw.dtype
            ))
        })?;
        self.dims()
            .iter()
            .try_fold(elem, |acc, &d| usize::try_from(d).ok().and_then(|d| acc.checked_mul(d)))
            .ok_or_else(|| Error::InvalidArgument(format!("invalid dims {:?}", self.dims())))
    }

    /// This buffer as an operand to copy to the host.
    #[must_use]
    pub(crate) fn operand(&self) -> Operand<'a> {
        Operand { dtype: self.raw.dtype, data: self.data().cast_const(), dims: self.dims() }
    }

    /// This buffer as an output a `call` reply writes into.
    ///
    /// # Errors
    /// As [`Buffer::nbytes`].
    pub(crate) fn out_buf(&self) -> Result<OutBuf, Error> {
        Ok(OutBuf {
            dtype: self.raw.dtype,
            data: self.data(),
            nbytes: self.nbytes()?,
            dims: self.dims().to_vec(),
        })
    }
}

/// The attributes hostfeed's lowering attaches (`mhlo.backend_config` dictionary).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Attrs<'a> {
    pub(crate) consumer_id: Option<i64>,
    pub(crate) flags: i64,
    /// `call` only: milliseconds to wait for the reply; 0 waits forever.
    pub(crate) timeout_ms: i64,
    /// `call` only: the callback's name, for error messages.
    pub(crate) name: &'a [u8],
}

/// A decoded call frame in the EXECUTE stage.
pub(crate) struct Frame<'a> {
    api: &'a ffi::XLA_FFI_Api,
    ctx: *mut ffi::XLA_FFI_ExecutionContext,
    /// Argument buffers, the token included.
    pub(crate) args: &'a [Buffer<'a>],
    /// Result buffers, the token included.
    pub(crate) rets: &'a [Buffer<'a>],
    pub(crate) attrs: Attrs<'a>,
    /// XLA device ordinal of the executing device.
    pub(crate) device: i32,
    /// XLA's id of this execution (the same on every device of one launch).
    pub(crate) run_id: i64,
}

/// What XLA called the handler for.
pub(crate) enum Decoded<'a> {
    /// The metadata probe (answered) or a stage hostfeed does nothing in.
    Nothing,
    /// Run the handler.
    Execute(Frame<'a>),
}

impl<'a> Frame<'a> {
    /// Decodes `frame`. Answers the metadata probe; returns [`Decoded::Nothing`] for it and
    /// for stages other than EXECUTE.
    ///
    /// # Errors
    /// A frame hostfeed cannot use (API table too small, non-buffer operands, bad
    /// attributes, a failing getter); the API table (for [`Frame::error_for`]) when known.
    ///
    /// # Safety
    /// `frame` must be null or a valid call frame from XLA, alive for `'a`.
    pub(crate) unsafe fn decode(
        frame: *mut ffi::XLA_FFI_CallFrame,
    ) -> Result<Decoded<'a>, (Error, *const ffi::XLA_FFI_Api)> {
        // SAFETY: caller contract: null or valid for 'a.
        let Some(frame) = (unsafe { frame.as_ref() }) else { return Ok(Decoded::Nothing) };
        // SAFETY: as above.
        if unsafe { answer_metadata(frame) } {
            return Ok(Decoded::Nothing);
        }
        if frame.stage != ffi::XLA_FFI_ExecutionStage_EXECUTE {
            return Ok(Decoded::Nothing);
        }
        let fail = |e: Error| (e, frame.api);
        // SAFETY: the frame's api pointer is null or valid for the call.
        let api =
            unsafe { frame.api.as_ref() }.ok_or_else(|| fail(Error::Internal("null XLA_FFI_Api".into())))?;
        if api.struct_size < ffi::XLA_FFI_Api_STRUCT_SIZE {
            return Err(fail(Error::Internal(format!(
                "XLA_FFI_Api is {} bytes, hostfeed needs {}: jaxlib is older than this build expects",
                api.struct_size,
                ffi::XLA_FFI_Api_STRUCT_SIZE
            ))));
        }
        // SAFETY: `args`/`rets` come from the valid frame; each holds `size` typed entries.
        let args = unsafe {
            buffers(
                frame.args.size,
                frame.args.types,
                frame.args.args,
                ffi::XLA_FFI_ArgType_BUFFER,
                "argument",
            )
        }
        .map_err(fail)?;
        // SAFETY: as above.
        let rets = unsafe {
            buffers(frame.rets.size, frame.rets.types, frame.rets.rets, ffi::XLA_FFI_RetType_BUFFER, "result")
        }
        .map_err(fail)?;
        // SAFETY: the attributes come from the valid frame.
        let attrs = unsafe { read_attrs(&frame.attrs) }.map_err(fail)?;
        // SAFETY: `ctx` comes from the valid frame and `api` is its checked API table.
        let (device, run_id) = unsafe { (device_ordinal(api, frame.ctx), run_id(api, frame.ctx)) };
        let (device, run_id) = (device.map_err(fail)?, run_id.map_err(fail)?);
        Ok(Decoded::Execute(Frame { api, ctx: frame.ctx, args, rets, attrs, device, run_id }))
    }

    /// The argument buffers that carry data (the token skipped).
    pub(crate) fn operands(&self) -> impl Iterator<Item = Operand<'a>> + Clone + 'a {
        self.args.iter().filter(|b| !b.is_token()).map(Buffer::operand)
    }

    /// The result buffers that carry data (the token skipped).
    pub(crate) fn outputs(&self) -> impl Iterator<Item = Buffer<'a>> + 'a {
        self.rets.iter().copied().filter(|b| !b.is_token())
    }

    /// The platform stream this call runs on (`XLA_FFI_Stream_Get`): a `CUstream` on
    /// CUDA. Only GPU handlers ask for it.
    ///
    /// # Errors
    /// The getter is missing or fails, or returns no stream.
    pub(crate) fn stream(&self) -> Result<*mut c_void, Error> {
        let get = self
            .api
            .XLA_FFI_Stream_Get
            .ok_or_else(|| Error::Internal("XLA_FFI_Stream_Get is missing".into()))?;
        let mut args = ffi::XLA_FFI_Stream_Get_Args {
            struct_size: ffi::XLA_FFI_Stream_Get_Args_STRUCT_SIZE,
            extension_start: ptr::null_mut(),
            ctx: self.ctx,
            stream: ptr::null_mut(),
        };
        // SAFETY: `args` is initialised and `ctx` comes from the frame being handled, whose
        // checked API table provided the getter.
        getter_result(unsafe { get(&raw mut args) }, "XLA_FFI_Stream_Get")?;
        if args.stream.is_null() {
            return Err(Error::Internal("XLA_FFI_Stream_Get returned no stream".into()));
        }
        Ok(args.stream)
    }

    /// An `XLA_FFI_Error` carrying `err`'s message for the handler to return.
    #[must_use]
    pub(crate) fn error_for(&self, err: &Error) -> *mut ffi::XLA_FFI_Error {
        // SAFETY: `self.api` is the checked API table of the frame being handled.
        unsafe { to_ffi_error(self.api, err) }
    }
}

/// An `XLA_FFI_Error` for `err` through `api` (null when `api` is null or lacks the
/// constructor, which XLA then treats as success: never expected).
///
/// # Safety
/// `api` must be null or the API table of the call frame being handled.
#[must_use]
pub(crate) unsafe fn to_ffi_error(api: *const ffi::XLA_FFI_Api, err: &Error) -> *mut ffi::XLA_FFI_Error {
    // SAFETY: caller contract: null or valid for the call.
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
        // Not compatible with command buffers / CUDA graphs: the handlers have host side
        // effects that must run at every execution (on GPUs they also launch host
        // functions and copies into pooled buffers, which a replayed graph would repeat).
        meta.traits = 0;
        debug_assert_eq!(meta.traits & ffi::XLA_FFI_HANDLER_TRAITS_COMMAND_BUFFER_COMPATIBLE, 0);
    }
    true
}

/// The `size` entries of an argument or result list as buffers, after checking that
/// every entry is one.
///
/// # Safety
/// `types` and `ptrs` must each hold `size` entries alive for `'a`, and every entry whose
/// type is `buffer_type` must point at an `XLA_FFI_Buffer` alive for `'a`.
unsafe fn buffers<'a>(
    size: i64,
    types: *const i32,
    ptrs: *mut *mut c_void,
    buffer_type: i32,
    what: &str,
) -> Result<&'a [Buffer<'a>], Error> {
    let n = usize::try_from(size).unwrap_or(0);
    if n == 0 {
        return Ok(&[]);
    }
    // SAFETY: caller contract: `types` and `ptrs` hold `n` entries alive for 'a.
    let (types, ptrs) =
        unsafe { (std::slice::from_raw_parts(types, n), std::slice::from_raw_parts(ptrs, n)) };
    for (i, (&ty, &p)) in types.iter().zip(ptrs).enumerate() {
        if ty != buffer_type || p.is_null() {
            return Err(Error::InvalidArgument(format!("{what} {i} is not a buffer")));
        }
    }
    // SAFETY: every entry is a non-null pointer to an `XLA_FFI_Buffer` alive for 'a
    // (checked above, caller contract); `Buffer` is a `repr(transparent)` reference, which
    // has the layout of a non-null pointer, so the pointer array is an array of `Buffer`s.
    Ok(unsafe { std::slice::from_raw_parts(ptrs.as_ptr().cast::<Buffer<'a>>(), n) })
}

/// Reads the attributes hostfeed's lowering attaches (integer scalars and the name).
///
/// # Safety
/// `attrs` must come from a valid call frame, alive for `'a`.
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
/// `api` and `ctx` must come from the call frame being handled.
unsafe fn device_ordinal(
    api: &ffi::XLA_FFI_Api,
    ctx: *mut ffi::XLA_FFI_ExecutionContext,
) -> Result<i32, Error> {
    let get = api
        .XLA_FFI_DeviceOrdinal_Get
        .ok_or_else(|| Error::Internal("XLA_FFI_DeviceOrdinal_Get is missing".into()))?;
    let mut args = ffi::XLA_FFI_DeviceOrdinal_Get_Args {
        struct_size: ffi::XLA_FFI_DeviceOrdinal_Get_Args_STRUCT_SIZE,
        extension_start: ptr::null_mut(),
        ctx,
        device_ordinal: 0,
    };
    // SAFETY: `args` is initialised and `ctx` comes from the frame being handled.
    getter_result(unsafe { get(&raw mut args) }, "XLA_FFI_DeviceOrdinal_Get")?;
    Ok(args.device_ordinal)
}

/// XLA's id of the current execution (the same on every device of one launch).
///
/// # Safety
/// `api` and `ctx` must come from the call frame being handled.
unsafe fn run_id(api: &ffi::XLA_FFI_Api, ctx: *mut ffi::XLA_FFI_ExecutionContext) -> Result<i64, Error> {
    let get = api.XLA_FFI_RunId_Get.ok_or_else(|| Error::Internal("XLA_FFI_RunId_Get is missing".into()))?;
    let mut args = ffi::XLA_FFI_RunId_Get_Args {
        struct_size: ffi::XLA_FFI_RunId_Get_Args_STRUCT_SIZE,
        extension_start: ptr::null_mut(),
        ctx,
        run_id: 0,
    };
    // SAFETY: `args` is initialised and `ctx` comes from the frame being handled.
    getter_result(unsafe { get(&raw mut args) }, "XLA_FFI_RunId_Get")?;
    Ok(args.run_id)
}

// ---- The CPU handlers ------------------------------------------------------------------

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
        buffer::after_push(hub.queue.pending_bytes());
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
            Err((e, api)) => unsafe { to_ffi_error(api, &e) },
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
        unsafe { to_ffi_error(api, &Error::Internal(format!("panic in {name}: {text}"))) }
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
