//! A safe view of an XLA FFI call frame, decoded once at the one unsafe boundary.
//!
//! XLA calls a handler with a raw `XLA_FFI_CallFrame*`. [`Frame::decode`] is the only place
//! that trusts it: it answers the metadata probe, checks the stage, the API table's size and
//! that every argument and result is a buffer, reads the attributes hostfeed's lowering
//! attaches, the device ordinal and the run id. What it returns borrows XLA's storage for
//! the duration of the call and is safe to use: the handlers above it contain no `unsafe`
//! except the actual reads and writes of device memory (in `message` and the reply).
//! XLA's own C++ binding (`Ffi::Bind`) has the same shape: decode, then typed access.
//!
//! No Python here.

use std::ffi::{c_void, CString};
use std::ptr;

use crate::error::Error;
use crate::ffi::c_api::{self as ffi, dtype};
use crate::host::message::Operand;
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
