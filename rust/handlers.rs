//! The `extern "C"` XLA FFI handlers. They never touch Python: they answer the metadata
//! probe, read attributes and the device ordinal, copy operands (via `copy`) and push the
//! message onto the receiver's queue. Errors and panics become `XLA_FFI_Error`s, so nothing
//! unwinds into XLA and the JAX caller sees an ordinary exception.

use std::ffi::CString;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;

use crate::consumer;
use crate::copy::{self, Operand};
use crate::error::Error;
use crate::xla_ffi::{self as ffi, dtype};

/// Attributes a hostfeed custom call carries (`mhlo.backend_config` dictionary).
#[derive(Debug, Default, Clone, Copy)]
struct TapAttrs {
    consumer_id: Option<i64>,
    flags: i64,
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

/// Reads the scalar attributes hostfeed's lowering attaches.
///
/// # Safety
/// `attrs` must come from a valid call frame.
unsafe fn read_attrs(attrs: &ffi::XLA_FFI_Attrs) -> Result<TapAttrs, Error> {
    let mut out = TapAttrs::default();
    let n = usize::try_from(attrs.size).unwrap_or(0);
    for i in 0..n {
        // SAFETY: XLA guarantees `types`, `names` and `attrs` each hold `size` entries, each
        // name points at a byte span and each scalar attribute at an `XLA_FFI_Scalar`.
        let (ty, name, value) = unsafe {
            let span = &**attrs.names.add(i);
            let name = std::slice::from_raw_parts(span.ptr.cast::<u8>(), span.len);
            (*attrs.types.add(i), name, *attrs.attrs.add(i))
        };
        let field = match name {
            b"consumer_id" | b"flags" => name,
            _ => continue,
        };
        if ty != ffi::XLA_FFI_AttrType_SCALAR {
            return Err(Error::InvalidArgument(format!(
                "attribute {:?} must be a scalar",
                String::from_utf8_lossy(field)
            )));
        }
        // SAFETY: a scalar attribute points at an `XLA_FFI_Scalar` owned by XLA.
        let scalar = unsafe { &*value.cast::<ffi::XLA_FFI_Scalar>() };
        let v = match scalar.dtype {
            // SAFETY: the scalar's dtype tells the width of the value it points at.
            dtype::S64 => unsafe { *scalar.value.cast::<i64>() },
            // SAFETY: as above.
            dtype::S32 => i64::from(unsafe { *scalar.value.cast::<i32>() }),
            other => {
                return Err(Error::InvalidArgument(format!(
                    "attribute {:?} has dtype code {other}, expected a 64- or 32-bit integer",
                    String::from_utf8_lossy(field)
                )))
            }
        };
        if field == b"flags" {
            out.flags = v;
        } else {
            out.consumer_id = Some(v);
        }
    }
    Ok(out)
}

/// The ordinal of the device executing this call.
///
/// # Safety
/// `frame` must be a valid call frame.
unsafe fn device_ordinal(frame: &ffi::XLA_FFI_CallFrame) -> Result<i32, Error> {
    // SAFETY: the frame's api pointer is valid for the duration of the call.
    let api = unsafe { frame.api.as_ref() }.ok_or_else(|| Error::Internal("null XLA_FFI_Api".into()))?;
    if api.struct_size < ffi::XLA_FFI_Api_STRUCT_SIZE {
        return Err(Error::Internal(format!(
            "XLA_FFI_Api is {} bytes, hostfeed needs {}: jaxlib is older than this build expects",
            api.struct_size,
            ffi::XLA_FFI_Api_STRUCT_SIZE
        )));
    }
    let get = api
        .XLA_FFI_DeviceOrdinal_Get
        .ok_or_else(|| Error::Internal("XLA_FFI_DeviceOrdinal_Get is missing".into()))?;
    let mut args = ffi::XLA_FFI_DeviceOrdinal_Get_Args {
        struct_size: ffi::XLA_FFI_DeviceOrdinal_Get_Args_STRUCT_SIZE,
        extension_start: ptr::null_mut(),
        ctx: frame.ctx,
        device_ordinal: 0,
    };
    // SAFETY: `args` is initialised and `ctx` comes from the frame.
    let err = unsafe { get(&raw mut args) };
    if !err.is_null() {
        return Err(Error::Internal("XLA_FFI_DeviceOrdinal_Get failed".into()));
    }
    Ok(args.device_ordinal)
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

/// The body of the tap handler: copy every buffer operand and enqueue one message.
///
/// # Safety
/// `frame` must be a valid call frame in the EXECUTE stage.
unsafe fn tap(frame: &ffi::XLA_FFI_CallFrame) -> Result<(), Error> {
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
    consumer::global().push(msg)
}

/// XLA FFI handler `hostfeed_tap`: sends its operands to the host receiver.
///
/// # Safety
/// Called by XLA with a valid call frame.
pub unsafe extern "C" fn hostfeed_tap(frame: *mut ffi::XLA_FFI_CallFrame) -> *mut ffi::XLA_FFI_Error {
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
    let result = catch_unwind(AssertUnwindSafe(|| unsafe { tap(frame) }));
    let err = match result {
        Ok(Ok(())) => return ptr::null_mut(),
        Ok(Err(e)) => e,
        Err(panic) => Error::Internal(format!(
            "panic in hostfeed_tap: {}",
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
