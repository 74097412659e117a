//! The ROCm platform: a [`Stream`](crate::gpu::Stream) over the HIP runtime and pinned memory for the pool;
//! the handlers registered for `ROCM` are the shared ones of `gpu/driver.rs` ([`Hip`]).
//!
//! The runtime is loaded at run time, never linked, so hostfeed builds and imports on
//! machines without ROCm: `libamdhip64.so`, else the versioned names of ROCm 7, 6 and 5
//! (a library XLA's ROCm plugin already loaded is found first, by any of these names, so
//! that both use the same runtime). Every function hostfeed calls is resolved at once
//! ([`Api`], declared with its C signature from `hip_runtime_api.h`, called through
//! [`drv`]); [`runtime_library`] reports why ROCm is unusable instead of failing.
//!
//! HIP's context API is deprecated, so a handler makes the stream's device current
//! (`hipStreamGetDevice`, then `hipSetDevice` when another is current) and restores the
//! thread's device when the call ends. A tap refuses to run while its stream is being
//! captured into a HIP graph (as on CUDA; see `gpu_driver::Driver::stream`).
//!
//! Copies use `hipMemcpyAsync` with `hipMemcpyDefault` (the runtime infers the direction
//! from the pointers, unified addressing): an operand or result XLA keeps in pinned host
//! memory is a host pointer, which a device-to-host copy would refuse. Each tap records an
//! event after its copies (from a pool of events per device, created with
//! `hipEventDisableTiming | hipEventBlockingSync`), which the device's courier waits for.
//! Pinned memory comes from `hipHostMalloc` (portable); `hipHostFree` synchronises the
//! device, so the pool frees on its own thread, never on XLA's.
//!
//! Not verified on ROCm hardware: the tests run the shared handlers against fake streams.

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::ptr::{self, NonNull};
use std::sync::OnceLock;

use crate::error::Error;
use crate::gpu::driver::{self as gpu_driver, captured, dynamic_api, gpu_driver, Poll};
use crate::gpu::pinned::PinnedAlloc;

/// `hipError_t` (an enum of C `int` size).
type HipError = c_int;
/// `hipStream_t`, `hipEvent_t`: opaque handles.
type HipStream = *mut c_void;
type HipEvent = *mut c_void;

// The codes and flags hostfeed uses, from `hip_runtime_api.h` (stable since ROCm 5).
const HIP_SUCCESS: HipError = 0;
const HIP_ERROR_NOT_INITIALIZED: HipError = 3;
const HIP_ERROR_NOT_READY: HipError = 600;
const HIP_ERROR_STREAM_CAPTURE_UNSUPPORTED: HipError = 900;
const HIP_ERROR_STREAM_CAPTURE_INVALIDATED: HipError = 901;
const HIP_ERROR_STREAM_CAPTURE_IMPLICIT: HipError = 906;
/// `hipMemcpyDefault`: the direction inferred from the pointers.
const HIP_MEMCPY_DEFAULT: c_int = 4;
/// `hipStreamCaptureStatusNone`.
const HIP_CAPTURE_STATUS_NONE: c_int = 0;
const HIP_EVENT_BLOCKING_SYNC: c_uint = 0x1;
const HIP_EVENT_DISABLE_TIMING: c_uint = 0x2;
const HIP_HOST_MALLOC_PORTABLE: c_uint = 0x1;

/// The names the HIP runtime is loaded by, in order.
const LIBRARIES: [&str; 4] = ["libamdhip64.so", "libamdhip64.so.7", "libamdhip64.so.6", "libamdhip64.so.5"];

dynamic_api! {
    library: "the HIP runtime library (libamdhip64)",
    result: HipError = HIP_ERROR_NOT_INITIALIZED;
    hipInit(flags: c_uint);
    hipGetErrorName(error: HipError) -> *const c_char;
    hipGetErrorString(error: HipError) -> *const c_char;
    hipRuntimeGetVersion(version: *mut c_int);
    hipGetDevice(device: *mut c_int);
    hipSetDevice(device: c_int);
    hipStreamGetDevice(stream: HipStream, device: *mut c_int);
    hipStreamIsCapturing(stream: HipStream, status: *mut c_int);
    hipStreamQuery(stream: HipStream);
    hipStreamSynchronize(stream: HipStream);
    hipEventCreateWithFlags(event: *mut HipEvent, flags: c_uint);
    hipEventRecord(event: HipEvent, stream: HipStream);
    hipEventQuery(event: HipEvent);
    hipEventSynchronize(event: HipEvent);
    hipHostMalloc(ptr: *mut *mut c_void, bytes: usize, flags: c_uint);
    hipHostFree(ptr: *mut c_void);
    hipMemcpyAsync(dst: *mut c_void, src: *const c_void, bytes: usize, kind: c_int, stream: HipStream);
}

/// Opens the HIP runtime: one already loaded in the process (XLA's) by any of
/// [`LIBRARIES`], else the first of them that loads; the handle is never closed.
fn open_runtime() -> Result<*mut c_void, String> {
    use libloading::os::unix::{Library, RTLD_LAZY, RTLD_LOCAL, RTLD_NOW};
    for name in LIBRARIES {
        // SAFETY: RTLD_NOLOAD only looks the library up among those loaded; no code runs.
        if let Ok(lib) = unsafe { Library::open(Some(name), RTLD_LAZY | libc::RTLD_NOLOAD) } {
            return Ok(lib.into_raw());
        }
    }
    let mut tried = Vec::new();
    for name in LIBRARIES {
        // SAFETY: loading a shared library by name runs its constructors, the HIP
        // runtime's; the handle is never closed (into_raw).
        match unsafe { Library::open(Some(name), RTLD_NOW | RTLD_LOCAL) } {
            Ok(lib) => return Ok(lib.into_raw()),
            // The loader's words (libloading's own are only "dlopen failed").
            Err(e) => {
                tried.push(std::error::Error::source(&e).map_or_else(|| e.to_string(), ToString::to_string));
            }
        }
    }
    Err(format!(
        "the HIP runtime library (libamdhip64) was not found: tried {} ({})",
        LIBRARIES.join(", "),
        tried.first().map_or("", String::as_str)
    ))
}

/// The runtime library, loaded once.
fn loaded() -> &'static Result<Api, String> {
    static API: OnceLock<Result<Api, String>> = OnceLock::new();
    API.get_or_init(|| {
        let handle = open_runtime()?;
        // SAFETY: a live handle of the HIP runtime, never closed.
        unsafe { load_api(handle) }
    })
}

/// The runtime's functions, if the library loaded.
fn api() -> Option<&'static Api> {
    loaded().as_ref().ok()
}

/// The runtime's words for `res`: its name and description.
fn error_words(res: HipError) -> String {
    let word = |p: *const c_char| {
        // SAFETY: HIP returns null or a static NUL-terminated string.
        (!p.is_null()).then(|| unsafe { std::ffi::CStr::from_ptr(p) }.to_string_lossy().into_owned())
    };
    // SAFETY: both functions take any code and return a static string (null unloaded).
    let (name, text) = unsafe { (word(drv::hipGetErrorName(res)), word(drv::hipGetErrorString(res))) };
    format!("{} ({})", name.unwrap_or_else(|| format!("hipError_t {res}")), text.unwrap_or_default())
}

/// `Ok` for `hipSuccess`, else an error naming `what`.
fn check(res: HipError, what: &str) -> Result<(), Error> {
    if res == HIP_SUCCESS {
        return Ok(());
    }
    Err(Error::Internal(format!("HIP {what} failed: {}", error_words(res))))
}

/// `check`, with failures from a stream under capture reported as such.
fn check_stream(res: HipError, what: &str) -> Result<(), Error> {
    match res {
        HIP_ERROR_STREAM_CAPTURE_UNSUPPORTED
        | HIP_ERROR_STREAM_CAPTURE_INVALIDATED
        | HIP_ERROR_STREAM_CAPTURE_IMPLICIT => Err(captured("a HIP graph")),
        other => check(other, what),
    }
}

/// A query's answer: done, pending (`hipErrorNotReady`), or the error.
fn poll(res: HipError, what: &str) -> Result<Poll, Error> {
    match res {
        HIP_SUCCESS => Ok(Poll::Done),
        HIP_ERROR_NOT_READY => Ok(Poll::Pending),
        err => check_stream(err, what).map(|()| Poll::Done),
    }
}

/// Whether the HIP runtime library is present with every function hostfeed uses. Loads
/// the library (once) but does not initialise HIP. Cached.
///
/// # Errors
/// Why ROCm cannot be used (no runtime library, a missing function), in words.
pub(crate) fn runtime_library() -> Result<(), String> {
    loaded().as_ref().map(|_| ()).map_err(Clone::clone)
}

/// The file hostfeed's HIP functions come from, if the runtime library loads.
#[must_use]
pub(crate) fn runtime_path() -> Option<String> {
    let a = api()?;
    let mut info = std::mem::MaybeUninit::<libc::Dl_info>::zeroed();
    // SAFETY: `hipInit`'s address is in the library; dladdr only reads the loader's tables
    // and writes `info`; `dli_fname` is a NUL-terminated string owned by the loader.
    unsafe {
        if libc::dladdr(a.hipInit as *const c_void, info.as_mut_ptr()) == 0
            || info.assume_init_ref().dli_fname.is_null()
        {
            return None;
        }
        Some(std::ffi::CStr::from_ptr(info.assume_init_ref().dli_fname).to_string_lossy().into_owned())
    }
}

/// Initialises the loaded runtime (`hipInit`, which may be called any number of times).
fn initialise() -> Result<(), String> {
    runtime_library()?;
    // SAFETY: the library and its functions are present.
    check(unsafe { drv::hipInit(0) }, "hipInit").map_err(|e| e.to_string())
}

/// Pinned host memory from `hipHostMalloc` (portable: usable from every device).
pub(crate) struct HipHostAlloc;

impl PinnedAlloc for HipHostAlloc {
    fn alloc(&self, bytes: usize) -> Result<NonNull<u8>, Error> {
        let mut p: *mut c_void = ptr::null_mut();
        // SAFETY: the runtime is loaded (handlers call `runtime()` first); `p` is a valid
        // out pointer.
        let res = unsafe { drv::hipHostMalloc(&raw mut p, bytes, HIP_HOST_MALLOC_PORTABLE) };
        gpu_driver::pinned_block(bytes, check(res, "hipHostMalloc"), p)
    }

    unsafe fn free(&self, ptr: NonNull<u8>, _bytes: usize) {
        // SAFETY: caller contract: allocated by `alloc`, freed once, no copy pending (the
        // pool frees on its own thread: hipHostFree synchronises the device). A failure
        // leaves the memory pinned, which is harmless.
        let _ = unsafe { drv::hipHostFree(ptr.as_ptr().cast()) };
    }
}

gpu_driver! {
    /// The HIP driver of the shared handlers (`gpu/driver.rs`).
    Hip, platform: "ROCm", label: " (ROCm)", queue: HipStreamRef, alloc: HipHostAlloc = HipHostAlloc,
    ready: runtime = initialise, version: runtime_version = hipRuntimeGetVersion
}

/// The stream of one handler call, its device made current until dropped.
pub(crate) struct HipStreamRef {
    raw: HipStream,
    device: c_int,
    /// The device current before, to restore on drop (when it differed).
    restore: Option<c_int>,
}

impl HipStreamRef {
    /// The stream `raw` (a `hipStream_t` from XLA), its device made current; `capture`:
    /// refused while being captured into a HIP graph.
    ///
    /// # Errors
    /// The runtime is unusable, the stream is captured, or a HIP call fails.
    ///
    /// # Safety
    /// `raw` must be a live `hipStream_t`, valid for the life of the result.
    unsafe fn new(raw: *mut c_void, capture: bool) -> Result<Self, Error> {
        runtime()?;
        let (mut device, mut current) = (0, 0);
        // SAFETY: the runtime is initialised; `raw` is a live stream (caller contract);
        // the out pointers are valid.
        unsafe {
            check(drv::hipStreamGetDevice(raw, &raw mut device), "hipStreamGetDevice")?;
            check(drv::hipGetDevice(&raw mut current), "hipGetDevice")?;
        }
        let restore = if current == device {
            None
        } else {
            // SAFETY: `device` is the stream's, a valid ordinal.
            check(unsafe { drv::hipSetDevice(device) }, "hipSetDevice")?;
            Some(current)
        };
        let stream = HipStreamRef { raw, device, restore };
        if capture {
            let mut status = HIP_CAPTURE_STATUS_NONE;
            // SAFETY: as above.
            check(unsafe { drv::hipStreamIsCapturing(raw, &raw mut status) }, "hipStreamIsCapturing")?;
            if status != HIP_CAPTURE_STATUS_NONE {
                return Err(captured("a HIP graph"));
            }
        }
        Ok(stream)
    }
}

impl Drop for HipStreamRef {
    fn drop(&mut self) {
        if let Some(before) = self.restore {
            // SAFETY: the thread's device before this call, a valid ordinal.
            let _ = unsafe { drv::hipSetDevice(before) };
        }
    }
}

impl gpu_driver::StreamOps for HipStreamRef {
    fn owner(&self) -> usize {
        self.device.unsigned_abs() as usize
    }

    unsafe fn copy(&self, dst: *mut u8, src: *const u8, n: usize) -> Result<(), Error> {
        // SAFETY: caller contract (device or pinned host memory, valid for `n` bytes until
        // the copy ran); the stream's device is current; hipMemcpyDefault infers the
        // direction (unified addressing).
        let res = unsafe { drv::hipMemcpyAsync(dst.cast(), src.cast(), n, HIP_MEMCPY_DEFAULT, self.raw) };
        check_stream(res, "hipMemcpyAsync")
    }

    fn record_on(&self, event: usize) -> Result<(), Error> {
        // SAFETY: an event of the stream's device (current); the stream is live.
        check_stream(unsafe { drv::hipEventRecord(event as HipEvent, self.raw) }, "hipEventRecord")
    }

    fn query(&self) -> Result<Poll, Error> {
        // SAFETY: the stream is live.
        poll(unsafe { drv::hipStreamQuery(self.raw) }, "hipStreamQuery")
    }

    fn block(&self) -> Result<(), Error> {
        // SAFETY: the stream is live.
        check_stream(unsafe { drv::hipStreamSynchronize(self.raw) }, "hipStreamSynchronize")
    }

    fn create_event(&self) -> Result<usize, Error> {
        let mut e: HipEvent = ptr::null_mut();
        let flags = HIP_EVENT_DISABLE_TIMING | HIP_EVENT_BLOCKING_SYNC;
        // SAFETY: the stream's device is current; `e` is a valid out pointer.
        check(unsafe { drv::hipEventCreateWithFlags(&raw mut e, flags) }, "hipEventCreateWithFlags")?;
        Ok(e as usize)
    }

    fn enter(_device: usize) -> Result<(), Error> {
        // HIP events are waited for from any thread, whatever device is current.
        Ok(())
    }

    fn event_query(event: usize) -> Result<Poll, Error> {
        // SAFETY: a live event, recorded (the pool never destroys one).
        poll(unsafe { drv::hipEventQuery(event as HipEvent) }, "hipEventQuery")
    }

    fn event_block(event: usize) -> Result<(), Error> {
        // SAFETY: as above; a blocking-sync event: the thread sleeps until it completes.
        check(unsafe { drv::hipEventSynchronize(event as HipEvent) }, "hipEventSynchronize")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::driver::Driver;

    #[test]
    fn without_the_runtime_rocm_is_reported_unusable_rather_than_panicking() {
        match runtime_library() {
            Ok(()) => assert!(runtime_path().is_some_and(|p| p.contains("amdhip64"))), // a ROCm machine
            Err(why) => {
                assert!(why.contains("libamdhip64") && why.contains("libamdhip64.so.6"), "{why}");
                let err = runtime().unwrap_err().to_string();
                assert!(err.contains("cannot use ROCm"), "{err}");
                assert!(runtime_version().is_none() && runtime_path().is_none());
                assert_eq!(pool_stats().allocations, 0);
                // The unloaded functions answer "not initialised" instead of being called.
                // SAFETY: no library: the wrapper returns without calling anything.
                assert_eq!(unsafe { drv::hipInit(0) }, HIP_ERROR_NOT_INITIALIZED);
                let words = error_words(HIP_ERROR_NOT_READY);
                assert!(words.contains("600"), "{words}");
            }
        }
    }

    #[test]
    fn queries_map_hip_codes_to_done_pending_and_capture_errors() {
        assert_eq!(poll(HIP_SUCCESS, "q").unwrap(), Poll::Done);
        assert_eq!(poll(HIP_ERROR_NOT_READY, "q").unwrap(), Poll::Pending);
        for code in [
            HIP_ERROR_STREAM_CAPTURE_UNSUPPORTED,
            HIP_ERROR_STREAM_CAPTURE_INVALIDATED,
            HIP_ERROR_STREAM_CAPTURE_IMPLICIT,
        ] {
            let err = poll(code, "q").unwrap_err().to_string();
            assert!(err.contains("a HIP graph"), "{err}");
        }
        let err = poll(1, "hipEventQuery").unwrap_err().to_string();
        assert!(err.contains("HIP hipEventQuery failed"), "{err}");
    }

    #[test]
    fn the_stream_of_a_machine_without_rocm_is_refused_with_the_reason() {
        if runtime_library().is_ok() {
            return; // a ROCm machine: a bogus stream would be handed to the runtime
        }
        // SAFETY: without the runtime nothing is called with the pointer.
        let err = unsafe { <Hip as Driver>::stream(ptr::null_mut(), true) }.err().unwrap().to_string();
        assert!(err.contains("cannot use ROCm") && err.contains("libamdhip64"), "{err}");
    }
}
