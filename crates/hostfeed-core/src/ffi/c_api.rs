//! Hand-written `#[repr(C)]` mirror of the parts of XLA's FFI C API that hostfeed uses.
//!
//! Source: `xla/ffi/api/c_api.h` as shipped by jaxlib 0.10.x (`jax.ffi.include_dir()`),
//! `XLA_FFI_API_MAJOR 0`, `XLA_FFI_API_MINOR 3`. Each item keeps its C declaration in a
//! comment above it. C enums are modelled as `i32` type aliases with constants so that an
//! unexpected value coming from XLA can never be an invalid Rust enum discriminant.
//!
//! One build serves every supported jaxlib, so this mirror is the common part of their
//! headers. What changed in the supported range (none of it moves a byte hostfeed uses):
//! - jaxlib 0.10.0 through 0.11.0 ship the same header (API 0.3).
//! - jaxlib 0.11.1 (API 0.4) renamed `XLA_FFI_Extension_Base` to
//!   `XLA_FFI_InternalExtension` (same fields; `XLA_FFI_Extension` is now a new, different
//!   struct) and `XLA_FFI_ExecutionContext` to `XLA_FFI_InvokeContext` (the old name stays
//!   as a typedef); renamed `XLA_FFI_Error_GetMessage` to `XLA_FFI_Error_GetDetails`, whose
//!   argument struct gained a trailing `errc` (unused here); added the `RECORD` execution
//!   stage, an optional `record` handler in the bundle, and appended
//!   `XLA_FFI_InvokeContext_FindExtension` to `XLA_FFI_Api`.
//! - jaxlib 0.12.0 (API 0.5) appended `XLA_FFI_CustomOptions_Get` to `XLA_FFI_Api`.
//!
//! `XLA_FFI_Api` only grows at its end, so this mirror is a prefix of every version's
//! table: the handlers check that `struct_size` is at least [`XLA_FFI_Api_STRUCT_SIZE`]
//! before reading a slot. Handlers declare API version 0.3 in their metadata; newer XLA
//! accepts handlers built against an older minor version.
//!
//! `tests/ffi_layout.rs` compiles a C program against the installed header (or each
//! header named in `HOSTFEED_XLA_FFI_INCLUDE`) and checks every size and field offset
//! declared here, so drift fails a test instead of corrupting memory.
#![allow(non_camel_case_types, non_snake_case, non_upper_case_globals)]

use std::ffi::{c_char, c_void};

// #define XLA_FFI_API_MAJOR 0 / #define XLA_FFI_API_MINOR 3
pub(crate) const XLA_FFI_API_MAJOR: i32 = 0;
pub(crate) const XLA_FFI_API_MINOR: i32 = 3;

// typedef enum { XLA_FFI_Extension_Metadata = 1 } XLA_FFI_Extension_Type;
pub(crate) type XLA_FFI_Extension_Type = i32;
pub(crate) const XLA_FFI_Extension_Metadata: XLA_FFI_Extension_Type = 1;

// typedef struct XLA_FFI_Extension_Base { size_t struct_size; XLA_FFI_Extension_Type type;
//   struct XLA_FFI_Extension_Base* next; } XLA_FFI_Extension_Base;
#[repr(C)]
pub(crate) struct XLA_FFI_Extension_Base {
    pub(crate) struct_size: usize,
    pub(crate) type_: XLA_FFI_Extension_Type,
    pub(crate) next: *mut XLA_FFI_Extension_Base,
}

// struct XLA_FFI_Api_Version { size_t struct_size; XLA_FFI_Extension_Base* extension_start;
//   int major_version; int minor_version; };
#[repr(C)]
pub(crate) struct XLA_FFI_Api_Version {
    pub(crate) struct_size: usize,
    pub(crate) extension_start: *mut XLA_FFI_Extension_Base,
    pub(crate) major_version: i32,
    pub(crate) minor_version: i32,
}
/// `XLA_FFI_Api_Version_STRUCT_SIZE` (offset of `minor_version` + its size).
pub(crate) const XLA_FFI_Api_Version_STRUCT_SIZE: usize =
    std::mem::offset_of!(XLA_FFI_Api_Version, minor_version) + std::mem::size_of::<i32>();

/// Opaque `XLA_FFI_Error`.
#[repr(C)]
pub struct XLA_FFI_Error {
    _private: [u8; 0],
}

// typedef enum { XLA_FFI_Error_Code_OK = 0, ... } XLA_FFI_Error_Code;
pub(crate) type XLA_FFI_Error_Code = i32;
pub(crate) const XLA_FFI_Error_Code_CANCELLED: XLA_FFI_Error_Code = 1;
pub(crate) const XLA_FFI_Error_Code_INVALID_ARGUMENT: XLA_FFI_Error_Code = 3;
pub(crate) const XLA_FFI_Error_Code_DEADLINE_EXCEEDED: XLA_FFI_Error_Code = 4;
pub(crate) const XLA_FFI_Error_Code_FAILED_PRECONDITION: XLA_FFI_Error_Code = 9;
pub(crate) const XLA_FFI_Error_Code_INTERNAL: XLA_FFI_Error_Code = 13;
pub(crate) const XLA_FFI_Error_Code_UNAVAILABLE: XLA_FFI_Error_Code = 14;

// struct XLA_FFI_Error_Create_Args { size_t struct_size; XLA_FFI_Extension_Base* extension_start;
//   const char* message; XLA_FFI_Error_Code errc; };
#[repr(C)]
pub(crate) struct XLA_FFI_Error_Create_Args {
    pub(crate) struct_size: usize,
    pub(crate) extension_start: *mut XLA_FFI_Extension_Base,
    pub(crate) message: *const c_char,
    pub(crate) errc: XLA_FFI_Error_Code,
}
pub(crate) const XLA_FFI_Error_Create_Args_STRUCT_SIZE: usize =
    std::mem::offset_of!(XLA_FFI_Error_Create_Args, errc) + std::mem::size_of::<i32>();

// typedef XLA_FFI_Error* XLA_FFI_Error_Create(XLA_FFI_Error_Create_Args* args);
pub(crate) type XLA_FFI_Error_Create =
    unsafe extern "C" fn(args: *mut XLA_FFI_Error_Create_Args) -> *mut XLA_FFI_Error;

// typedef enum { XLA_FFI_DataType_INVALID = 0, ... } XLA_FFI_DataType;
pub(crate) type XLA_FFI_DataType = i32;
#[allow(missing_docs)] // XLA's own names (`XLA_FFI_DataType_...`), one per element type
pub mod dtype {
    //! `XLA_FFI_DataType` values.
    use crate::ffi::c_api::XLA_FFI_DataType;
    pub const PRED: XLA_FFI_DataType = 1;
    pub(crate) const S1: XLA_FFI_DataType = 30;
    pub(crate) const S2: XLA_FFI_DataType = 26;
    pub(crate) const S4: XLA_FFI_DataType = 21;
    pub const S8: XLA_FFI_DataType = 2;
    pub const S16: XLA_FFI_DataType = 3;
    pub const S32: XLA_FFI_DataType = 4;
    pub const S64: XLA_FFI_DataType = 5;
    pub(crate) const U1: XLA_FFI_DataType = 31;
    pub(crate) const U2: XLA_FFI_DataType = 27;
    pub(crate) const U4: XLA_FFI_DataType = 22;
    pub const U8: XLA_FFI_DataType = 6;
    pub const U16: XLA_FFI_DataType = 7;
    pub const U32: XLA_FFI_DataType = 8;
    pub const U64: XLA_FFI_DataType = 9;
    pub const F16: XLA_FFI_DataType = 10;
    pub const F32: XLA_FFI_DataType = 11;
    pub const F64: XLA_FFI_DataType = 12;
    pub const BF16: XLA_FFI_DataType = 16;
    pub const C64: XLA_FFI_DataType = 15;
    pub const C128: XLA_FFI_DataType = 18;
    pub(crate) const TOKEN: XLA_FFI_DataType = 17;
    pub const F8E5M2: XLA_FFI_DataType = 19;
    pub const F8E3M4: XLA_FFI_DataType = 29;
    pub const F8E4M3: XLA_FFI_DataType = 28;
    pub const F8E4M3FN: XLA_FFI_DataType = 20;
    pub const F8E4M3B11FNUZ: XLA_FFI_DataType = 23;
    pub const F8E5M2FNUZ: XLA_FFI_DataType = 24;
    pub const F8E4M3FNUZ: XLA_FFI_DataType = 25;
    pub(crate) const F4E2M1FN: XLA_FFI_DataType = 32;
    pub const F8E8M0FNU: XLA_FFI_DataType = 33;

    /// Bytes per element for the byte-addressable types hostfeed transfers; `None` for
    /// tokens, sub-byte types and unknown codes.
    #[must_use]
    pub(crate) fn element_size(dt: XLA_FFI_DataType) -> Option<usize> {
        Some(match dt {
            PRED | S8 | U8 | F8E5M2 | F8E3M4 | F8E4M3 | F8E4M3FN | F8E4M3B11FNUZ | F8E5M2FNUZ
            | F8E4M3FNUZ | F8E8M0FNU => 1,
            S16 | U16 | F16 | BF16 => 2,
            S32 | U32 | F32 => 4,
            S64 | U64 | F64 | C64 => 8,
            C128 => 16,
            _ => return None,
        })
    }
}

// struct XLA_FFI_Buffer { size_t struct_size; XLA_FFI_Extension_Base* extension_start;
//   XLA_FFI_DataType dtype; void* data; int64_t rank; int64_t* dims; };
#[repr(C)]
pub(crate) struct XLA_FFI_Buffer {
    pub(crate) struct_size: usize,
    pub(crate) extension_start: *mut XLA_FFI_Extension_Base,
    pub(crate) dtype: XLA_FFI_DataType,
    pub(crate) data: *mut c_void,
    pub(crate) rank: i64,
    pub(crate) dims: *mut i64,
}

// typedef enum { XLA_FFI_ArgType_BUFFER = 1 } XLA_FFI_ArgType;
pub(crate) type XLA_FFI_ArgType = i32;
pub(crate) const XLA_FFI_ArgType_BUFFER: XLA_FFI_ArgType = 1;
// typedef enum { XLA_FFI_RetType_BUFFER = 1 } XLA_FFI_RetType;
pub(crate) type XLA_FFI_RetType = i32;
pub(crate) const XLA_FFI_RetType_BUFFER: XLA_FFI_RetType = 1;
// typedef enum { ARRAY = 1, DICTIONARY = 2, SCALAR = 3, STRING = 4 } XLA_FFI_AttrType;
pub(crate) type XLA_FFI_AttrType = i32;
pub(crate) const XLA_FFI_AttrType_SCALAR: XLA_FFI_AttrType = 3;
pub(crate) const XLA_FFI_AttrType_STRING: XLA_FFI_AttrType = 4;

/// Opaque `XLA_FFI_ExecutionContext`.
#[repr(C)]
pub(crate) struct XLA_FFI_ExecutionContext {
    _private: [u8; 0],
}

// typedef struct XLA_FFI_ByteSpan { const char* ptr; size_t len; } XLA_FFI_ByteSpan;
#[repr(C)]
pub(crate) struct XLA_FFI_ByteSpan {
    pub(crate) ptr: *const c_char,
    pub(crate) len: usize,
}

// typedef struct XLA_FFI_Scalar { XLA_FFI_DataType dtype; void* value; } XLA_FFI_Scalar;
#[repr(C)]
pub(crate) struct XLA_FFI_Scalar {
    pub(crate) dtype: XLA_FFI_DataType,
    pub(crate) value: *mut c_void,
}

// typedef enum { INSTANTIATE = 0, PREPARE = 1, INITIALIZE = 2, EXECUTE = 3 } XLA_FFI_ExecutionStage;
pub(crate) type XLA_FFI_ExecutionStage = i32;
pub(crate) const XLA_FFI_ExecutionStage_EXECUTE: XLA_FFI_ExecutionStage = 3;

// struct XLA_FFI_Args { size_t struct_size; XLA_FFI_Extension_Base* extension_start;
//   int64_t size; XLA_FFI_ArgType* types; void** args; };
#[repr(C)]
pub(crate) struct XLA_FFI_Args {
    pub(crate) struct_size: usize,
    pub(crate) extension_start: *mut XLA_FFI_Extension_Base,
    pub(crate) size: i64,
    pub(crate) types: *mut XLA_FFI_ArgType,
    pub(crate) args: *mut *mut c_void,
}

// struct XLA_FFI_Rets { size_t struct_size; XLA_FFI_Extension_Base* extension_start;
//   int64_t size; XLA_FFI_RetType* types; void** rets; };
#[repr(C)]
pub(crate) struct XLA_FFI_Rets {
    pub(crate) struct_size: usize,
    pub(crate) extension_start: *mut XLA_FFI_Extension_Base,
    pub(crate) size: i64,
    pub(crate) types: *mut XLA_FFI_RetType,
    pub(crate) rets: *mut *mut c_void,
}

// struct XLA_FFI_Attrs { size_t struct_size; XLA_FFI_Extension_Base* extension_start;
//   int64_t size; XLA_FFI_AttrType* types; XLA_FFI_ByteSpan** names; void** attrs; };
#[repr(C)]
pub(crate) struct XLA_FFI_Attrs {
    pub(crate) struct_size: usize,
    pub(crate) extension_start: *mut XLA_FFI_Extension_Base,
    pub(crate) size: i64,
    pub(crate) types: *mut XLA_FFI_AttrType,
    pub(crate) names: *mut *mut XLA_FFI_ByteSpan,
    pub(crate) attrs: *mut *mut c_void,
}

/// Opaque `XLA_FFI_Future`.
#[repr(C)]
pub(crate) struct XLA_FFI_Future {
    _private: [u8; 0],
}

// struct XLA_FFI_CallFrame { size_t struct_size; XLA_FFI_Extension_Base* extension_start;
//   const XLA_FFI_Api* api; XLA_FFI_ExecutionContext* ctx; XLA_FFI_ExecutionStage stage;
//   XLA_FFI_Args args; XLA_FFI_Rets rets; XLA_FFI_Attrs attrs; XLA_FFI_Future* future; };
/// The call frame XLA passes to a handler.
#[repr(C)]
pub struct XLA_FFI_CallFrame {
    pub(crate) struct_size: usize,
    pub(crate) extension_start: *mut XLA_FFI_Extension_Base,
    pub(crate) api: *const XLA_FFI_Api,
    pub(crate) ctx: *mut XLA_FFI_ExecutionContext,
    pub(crate) stage: XLA_FFI_ExecutionStage,
    pub(crate) args: XLA_FFI_Args,
    pub(crate) rets: XLA_FFI_Rets,
    pub(crate) attrs: XLA_FFI_Attrs,
    pub(crate) future: *mut XLA_FFI_Future,
}

// typedef XLA_FFI_Error* XLA_FFI_Handler(XLA_FFI_CallFrame* call_frame);
/// An XLA FFI handler: what `jax.ffi.register_ffi_target` registers.
pub type XLA_FFI_Handler = unsafe extern "C" fn(call_frame: *mut XLA_FFI_CallFrame) -> *mut XLA_FFI_Error;

// typedef uint32_t XLA_FFI_Handler_Traits;
pub(crate) type XLA_FFI_Handler_Traits = u32;

// typedef struct XLA_FFI_TypeId { int64_t type_id; } XLA_FFI_TypeId;
#[repr(C)]
pub(crate) struct XLA_FFI_TypeId {
    pub(crate) type_id: i64,
}

// struct XLA_FFI_DeviceOrdinal_Get_Args { size_t struct_size; XLA_FFI_Extension_Base* extension_start;
//   XLA_FFI_ExecutionContext* ctx; int32_t device_ordinal; };
#[repr(C)]
pub(crate) struct XLA_FFI_DeviceOrdinal_Get_Args {
    pub(crate) struct_size: usize,
    pub(crate) extension_start: *mut XLA_FFI_Extension_Base,
    pub(crate) ctx: *mut XLA_FFI_ExecutionContext,
    pub(crate) device_ordinal: i32,
}
pub(crate) const XLA_FFI_DeviceOrdinal_Get_Args_STRUCT_SIZE: usize =
    std::mem::offset_of!(XLA_FFI_DeviceOrdinal_Get_Args, device_ordinal) + std::mem::size_of::<i32>();

// typedef XLA_FFI_Error* XLA_FFI_DeviceOrdinal_Get(XLA_FFI_DeviceOrdinal_Get_Args* args);
pub(crate) type XLA_FFI_DeviceOrdinal_Get =
    unsafe extern "C" fn(args: *mut XLA_FFI_DeviceOrdinal_Get_Args) -> *mut XLA_FFI_Error;

// struct XLA_FFI_Metadata { size_t struct_size; XLA_FFI_Api_Version api_version;
//   XLA_FFI_Handler_Traits traits; XLA_FFI_TypeId state_type_id; };
#[repr(C)]
pub(crate) struct XLA_FFI_Metadata {
    pub(crate) struct_size: usize,
    pub(crate) api_version: XLA_FFI_Api_Version,
    pub(crate) traits: XLA_FFI_Handler_Traits,
    pub(crate) state_type_id: XLA_FFI_TypeId,
}

// struct XLA_FFI_Metadata_Extension { XLA_FFI_Extension_Base extension_base;
//   XLA_FFI_Metadata* metadata; };
#[repr(C)]
pub(crate) struct XLA_FFI_Metadata_Extension {
    pub(crate) extension_base: XLA_FFI_Extension_Base,
    pub(crate) metadata: *mut XLA_FFI_Metadata,
}

// ---- GPU handlers: the stream of a GPU handler, and the traits bit it must not declare ----

// enum XLA_FFI_Handler_TraitsBits { XLA_FFI_HANDLER_TRAITS_COMMAND_BUFFER_COMPATIBLE = 1u << 0 };
/// hostfeed's handlers never declare this: they have host side effects at every execution
/// (and launch host functions), so XLA must not capture them into command buffers.
pub(crate) const XLA_FFI_HANDLER_TRAITS_COMMAND_BUFFER_COMPATIBLE: XLA_FFI_Handler_Traits = 1 << 0;

// struct XLA_FFI_Stream_Get_Args { size_t struct_size; XLA_FFI_Extension_Base* extension_start;
//   XLA_FFI_ExecutionContext* ctx; void* stream; };
// Same layout in jaxlib 0.10.2, 0.11.2 and 0.12.0.1 (0.11.1 renamed the extension and
// context types only). For the CUDA platform `stream` is a `CUstream`.
#[repr(C)]
pub(crate) struct XLA_FFI_Stream_Get_Args {
    pub(crate) struct_size: usize,
    pub(crate) extension_start: *mut XLA_FFI_Extension_Base,
    pub(crate) ctx: *mut XLA_FFI_ExecutionContext,
    pub(crate) stream: *mut c_void,
}
pub(crate) const XLA_FFI_Stream_Get_Args_STRUCT_SIZE: usize =
    std::mem::offset_of!(XLA_FFI_Stream_Get_Args, stream) + std::mem::size_of::<*mut c_void>();

// typedef XLA_FFI_Error* XLA_FFI_Stream_Get(XLA_FFI_Stream_Get_Args* args);
pub(crate) type XLA_FFI_Stream_Get =
    unsafe extern "C" fn(args: *mut XLA_FFI_Stream_Get_Args) -> *mut XLA_FFI_Error;
// ---- end of the GPU handlers' part ----

// struct XLA_FFI_RunId_Get_Args { size_t struct_size; XLA_FFI_Extension_Base* extension_start;
//   XLA_FFI_ExecutionContext* ctx; int64_t run_id; };
#[repr(C)]
pub(crate) struct XLA_FFI_RunId_Get_Args {
    pub(crate) struct_size: usize,
    pub(crate) extension_start: *mut XLA_FFI_Extension_Base,
    pub(crate) ctx: *mut XLA_FFI_ExecutionContext,
    pub(crate) run_id: i64,
}
pub(crate) const XLA_FFI_RunId_Get_Args_STRUCT_SIZE: usize =
    std::mem::offset_of!(XLA_FFI_RunId_Get_Args, run_id) + std::mem::size_of::<i64>();

// typedef XLA_FFI_Error* XLA_FFI_RunId_Get(XLA_FFI_RunId_Get_Args* args);
pub(crate) type XLA_FFI_RunId_Get =
    unsafe extern "C" fn(args: *mut XLA_FFI_RunId_Get_Args) -> *mut XLA_FFI_Error;

/// A function-pointer slot of `XLA_FFI_Api` that hostfeed does not call.
pub(crate) type UnusedFn = *const c_void;

// struct XLA_FFI_Api { size_t struct_size; XLA_FFI_Extension_Base* extension_start;
//   XLA_FFI_Api_Version api_version; const XLA_FFI_InternalApi* internal_api;
//   XLA_FFI_Error_Create* ...; XLA_FFI_Error_GetMessage*; XLA_FFI_Error_Destroy*;
//   XLA_FFI_Handler_Register*; XLA_FFI_Stream_Get*; XLA_FFI_Type_Register*;
//   XLA_FFI_ExecutionContext_Get*; XLA_FFI_State_Set*; XLA_FFI_State_Get*;
//   XLA_FFI_DeviceMemory_Allocate*; XLA_FFI_DeviceMemory_Free*; XLA_FFI_ThreadPool_Schedule*;
//   XLA_FFI_ThreadPool_NumThreads*; XLA_FFI_Future_Create*; XLA_FFI_Future_SetAvailable*;
//   XLA_FFI_Future_SetError*; XLA_FFI_RunId_Get*; XLA_FFI_DeviceOrdinal_Get*; };
#[repr(C)]
pub(crate) struct XLA_FFI_Api {
    pub(crate) struct_size: usize,
    pub(crate) extension_start: *mut XLA_FFI_Extension_Base,
    pub(crate) api_version: XLA_FFI_Api_Version,
    pub(crate) internal_api: *const c_void,
    pub(crate) XLA_FFI_Error_Create: Option<XLA_FFI_Error_Create>,
    pub(crate) XLA_FFI_Error_GetMessage: UnusedFn,
    pub(crate) XLA_FFI_Error_Destroy: UnusedFn,
    pub(crate) XLA_FFI_Handler_Register: UnusedFn,
    pub(crate) XLA_FFI_Stream_Get: Option<XLA_FFI_Stream_Get>,
    pub(crate) XLA_FFI_Type_Register: UnusedFn,
    pub(crate) XLA_FFI_ExecutionContext_Get: UnusedFn,
    pub(crate) XLA_FFI_State_Set: UnusedFn,
    pub(crate) XLA_FFI_State_Get: UnusedFn,
    pub(crate) XLA_FFI_DeviceMemory_Allocate: UnusedFn,
    pub(crate) XLA_FFI_DeviceMemory_Free: UnusedFn,
    pub(crate) XLA_FFI_ThreadPool_Schedule: UnusedFn,
    pub(crate) XLA_FFI_ThreadPool_NumThreads: UnusedFn,
    pub(crate) XLA_FFI_Future_Create: UnusedFn,
    pub(crate) XLA_FFI_Future_SetAvailable: UnusedFn,
    pub(crate) XLA_FFI_Future_SetError: UnusedFn,
    pub(crate) XLA_FFI_RunId_Get: Option<XLA_FFI_RunId_Get>,
    pub(crate) XLA_FFI_DeviceOrdinal_Get: Option<XLA_FFI_DeviceOrdinal_Get>,
}
/// `XLA_FFI_Api_STRUCT_SIZE`: the API must be at least this large for us to read
/// `XLA_FFI_DeviceOrdinal_Get`.
pub(crate) const XLA_FFI_Api_STRUCT_SIZE: usize = std::mem::size_of::<XLA_FFI_Api>();

/// Sizes and field offsets of every mirrored struct, as `(C expression, value)` pairs that
/// must match the header exactly. `XLA_FFI_Api`'s size is not here: the mirror is a prefix
/// of the table, which later versions extend (see [`minimum_table`]).
/// `tests/ffi_layout.rs` evaluates the same C expressions against the real header.
#[must_use]
pub fn layout_table() -> Vec<(&'static str, usize)> {
    use std::mem::{offset_of, size_of};
    macro_rules! entries {
        ($( $ty:ident { $($field:ident => $cfield:literal),* } ),* $(,)?) => {
            vec![$(
                (concat!("sizeof(", stringify!($ty), ")"), size_of::<$ty>()),
                $( (concat!("offsetof(", stringify!($ty), ", ", $cfield, ")"), offset_of!($ty, $field)), )*
            )*]
        };
    }
    entries![
        XLA_FFI_Extension_Base { struct_size => "struct_size", type_ => "type", next => "next" },
        XLA_FFI_Api_Version { struct_size => "struct_size", extension_start => "extension_start",
            major_version => "major_version", minor_version => "minor_version" },
        XLA_FFI_Error_Create_Args { struct_size => "struct_size", extension_start => "extension_start",
            message => "message", errc => "errc" },
        XLA_FFI_Buffer { struct_size => "struct_size", extension_start => "extension_start",
            dtype => "dtype", data => "data", rank => "rank", dims => "dims" },
        XLA_FFI_ByteSpan { ptr => "ptr", len => "len" },
        XLA_FFI_Scalar { dtype => "dtype", value => "value" },
        XLA_FFI_Args { struct_size => "struct_size", extension_start => "extension_start",
            size => "size", types => "types", args => "args" },
        XLA_FFI_Rets { struct_size => "struct_size", extension_start => "extension_start",
            size => "size", types => "types", rets => "rets" },
        XLA_FFI_Attrs { struct_size => "struct_size", extension_start => "extension_start",
            size => "size", types => "types", names => "names", attrs => "attrs" },
        XLA_FFI_CallFrame { struct_size => "struct_size", extension_start => "extension_start",
            api => "api", ctx => "ctx", stage => "stage", args => "args", rets => "rets",
            attrs => "attrs", future => "future" },
        XLA_FFI_TypeId { type_id => "type_id" },
        XLA_FFI_DeviceOrdinal_Get_Args { struct_size => "struct_size",
            extension_start => "extension_start", ctx => "ctx", device_ordinal => "device_ordinal" },
        XLA_FFI_Stream_Get_Args { struct_size => "struct_size",
            extension_start => "extension_start", ctx => "ctx", stream => "stream" },
        XLA_FFI_RunId_Get_Args { struct_size => "struct_size",
            extension_start => "extension_start", ctx => "ctx", run_id => "run_id" },
        XLA_FFI_Metadata { struct_size => "struct_size", api_version => "api_version",
            traits => "traits", state_type_id => "state_type_id" },
        XLA_FFI_Metadata_Extension { extension_base => "extension_base", metadata => "metadata" },
        XLA_FFI_Api { struct_size => "struct_size", extension_start => "extension_start",
            api_version => "api_version", internal_api => "internal_api",
            XLA_FFI_Error_Create => "XLA_FFI_Error_Create",
            XLA_FFI_Stream_Get => "XLA_FFI_Stream_Get",
            XLA_FFI_RunId_Get => "XLA_FFI_RunId_Get",
            XLA_FFI_DeviceOrdinal_Get => "XLA_FFI_DeviceOrdinal_Get" },
    ]
    .into_iter()
    .filter(|(expr, _)| *expr != "sizeof(XLA_FFI_Api)")
    .collect()
}

/// `(C expression, value)` pairs where the header may have more than the mirror, but not
/// less: the API table's size (newer versions append slots) and the API minor version
/// (newer XLA runs handlers that declare an older minor version).
#[must_use]
pub fn minimum_table() -> Vec<(&'static str, i64)> {
    vec![
        ("sizeof(XLA_FFI_Api)", i64::try_from(XLA_FFI_Api_STRUCT_SIZE).unwrap_or(i64::MAX)),
        ("XLA_FFI_API_MINOR", XLA_FFI_API_MINOR.into()),
    ]
}

/// Enum constants mirrored here, as `(C expression, value)` pairs, for the same test.
#[must_use]
pub fn constant_table() -> Vec<(&'static str, i64)> {
    let mut v: Vec<(&'static str, i64)> = vec![
        ("XLA_FFI_API_MAJOR", XLA_FFI_API_MAJOR.into()),
        ("XLA_FFI_Extension_Metadata", XLA_FFI_Extension_Metadata.into()),
        ("XLA_FFI_Error_Code_CANCELLED", XLA_FFI_Error_Code_CANCELLED.into()),
        ("XLA_FFI_Error_Code_INVALID_ARGUMENT", XLA_FFI_Error_Code_INVALID_ARGUMENT.into()),
        ("XLA_FFI_Error_Code_DEADLINE_EXCEEDED", XLA_FFI_Error_Code_DEADLINE_EXCEEDED.into()),
        ("XLA_FFI_Error_Code_FAILED_PRECONDITION", XLA_FFI_Error_Code_FAILED_PRECONDITION.into()),
        ("XLA_FFI_Error_Code_INTERNAL", XLA_FFI_Error_Code_INTERNAL.into()),
        ("XLA_FFI_Error_Code_UNAVAILABLE", XLA_FFI_Error_Code_UNAVAILABLE.into()),
        ("XLA_FFI_ArgType_BUFFER", XLA_FFI_ArgType_BUFFER.into()),
        ("XLA_FFI_RetType_BUFFER", XLA_FFI_RetType_BUFFER.into()),
        ("XLA_FFI_AttrType_SCALAR", XLA_FFI_AttrType_SCALAR.into()),
        ("XLA_FFI_AttrType_STRING", XLA_FFI_AttrType_STRING.into()),
        ("XLA_FFI_ExecutionStage_EXECUTE", XLA_FFI_ExecutionStage_EXECUTE.into()),
        (
            "XLA_FFI_HANDLER_TRAITS_COMMAND_BUFFER_COMPATIBLE",
            XLA_FFI_HANDLER_TRAITS_COMMAND_BUFFER_COMPATIBLE.into(),
        ),
        ("sizeof(XLA_FFI_DataType)", i64::try_from(std::mem::size_of::<XLA_FFI_DataType>()).unwrap_or(-1)),
    ];
    macro_rules! dts {
        ($($n:ident),*) => { $( v.push((concat!("XLA_FFI_DataType_", stringify!($n)), dtype::$n.into())); )* };
    }
    dts!(
        PRED,
        S1,
        S2,
        S4,
        S8,
        S16,
        S32,
        S64,
        U1,
        U2,
        U4,
        U8,
        U16,
        U32,
        U64,
        F16,
        F32,
        F64,
        BF16,
        C64,
        C128,
        TOKEN,
        F8E5M2,
        F8E3M4,
        F8E4M3,
        F8E4M3FN,
        F8E4M3B11FNUZ,
        F8E5M2FNUZ,
        F8E4M3FNUZ,
        F4E2M1FN,
        F8E8M0FNU
    );
    v
}
