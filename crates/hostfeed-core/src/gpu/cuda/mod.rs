//! The CUDA platform: the XLA FFI handlers registered for `CUDA`, a [`Stream`](crate::gpu::Stream) over the
//! CUDA driver API, and pinned memory for the pool.
//!
//! The driver is loaded at run time (`dlopen` of `libcuda.so.1`, every function hostfeed
//! calls resolved at once: [`Api`], called through [`drv`]), never linked, so hostfeed
//! builds and imports on machines without CUDA; [`driver`] reports why CUDA is unusable
//! instead of failing. `libcuda.so.1` is the name XLA loads it by, so both get the same
//! library (cudarc's own loader tries `libcuda.so` first, which may be another file, a
//! toolkit's stub, whose handles would all be foreign to XLA's): cudarc serves only for
//! the types and constants, those of CUDA 13.4 (its newest), so that every error code a
//! current driver returns is one the bindings know; every function used exists in the
//! CUDA 12 and 13 drivers. [`same_driver_as_xla`] still checks, once XLA loaded the
//! driver, that its `cuInit` is hostfeed's (at registration, through
//! `cuda_driver_error`, which `lowering.cuda_status()` reports, and at the first handler
//! call); [`driver_path`] names the file in use. The row of `gpu::PLATFORMS` for CUDA
//! names these functions.
//!
//! The handlers (shared with ROCm: `gpu/driver.rs`, driver [`Cuda`]) get the stream XLA
//! runs the custom call on (`XLA_FFI_Stream_Get`, a `CUstream`), make its context current
//! for the duration of the call (the context of each stream is looked up once per thread
//! and cached: XLA's streams keep their context for life), and run the platform-neutral
//! bodies in `gpu/`. A tap refuses to run while its stream is being captured into a
//! CUDA graph (the handlers' metadata never declares them command-buffer compatible, so
//! XLA does not capture them; this guards the invariant, since a captured tap would
//! deliver bytes never copied); a call, a check and a failure need no such query: each
//! synchronises the stream, which fails under capture, and that failure is reported with
//! the same words.
//!
//! Copies use `cuMemcpyAsync`, which infers the direction from the pointers (unified
//! addressing, always on for 64-bit processes): an operand or result XLA keeps in
//! `pinned_host` memory is a host pointer, which a device-to-host copy would refuse.
//!
//! Every context a handler runs in is *held* (its primary context retained) for the life
//! of the process: the pinned pool's memory and the pooled events belong to it, and JAX
//! releases its own reference at exit (or when its client goes) while hostfeed's may
//! still be in use. Should a device's context nevertheless be replaced (a primary context
//! reset), the pool forgets its memory ([`PinnedPool::reset`](crate::gpu::pinned::PinnedPool::reset)) and the old events.
//!
//! Each tap records an event after its copies (from a pool of events per context, created
//! with `CU_EVENT_DISABLE_TIMING | CU_EVENT_BLOCKING_SYNC`); the device's courier thread
//! (`gpu/`) waits for it, polling briefly before it sleeps in `cuEventSynchronize`.

use std::cell::Cell;
use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void};
use std::ptr::{self, NonNull};
use std::sync::{Mutex, OnceLock};

use cudarc::driver::sys;

use crate::error::Error;
use crate::gpu::driver::{self as gpu_driver, dynamic_api, gpu_driver, Poll};
use crate::gpu::pinned::PinnedAlloc;
use crate::host::sync::lock;

/// The name XLA loads the driver by.
const XLA_DRIVER: &std::ffi::CStr = c"libcuda.so.1";

dynamic_api! {
    library: "the CUDA driver library",
    result: sys::CUresult = sys::CUresult::CUDA_ERROR_NOT_INITIALIZED;
    cuInit(flags: c_uint);
    cuGetErrorName(error: sys::CUresult, name: *mut *const c_char);
    cuGetErrorString(error: sys::CUresult, text: *mut *const c_char);
    cuDriverGetVersion(version: *mut c_int);
    cuStreamGetCtx(stream: sys::CUstream, ctx: *mut sys::CUcontext);
    cuStreamIsCapturing(stream: sys::CUstream, status: *mut sys::CUstreamCaptureStatus);
    cuStreamQuery(stream: sys::CUstream);
    cuStreamSynchronize(stream: sys::CUstream);
    cuCtxGetCurrent(ctx: *mut sys::CUcontext);
    cuCtxPushCurrent_v2(ctx: sys::CUcontext);
    cuCtxPopCurrent_v2(ctx: *mut sys::CUcontext);
    cuCtxSetCurrent(ctx: sys::CUcontext);
    cuCtxGetDevice(device: *mut sys::CUdevice);
    cuCtxGetId(ctx: sys::CUcontext, id: *mut c_ulonglong);
    cuDevicePrimaryCtxRetain(ctx: *mut sys::CUcontext, device: sys::CUdevice);
    cuDevicePrimaryCtxRelease_v2(device: sys::CUdevice);
    cuEventCreate(event: *mut sys::CUevent, flags: c_uint);
    cuEventRecord(event: sys::CUevent, stream: sys::CUstream);
    cuEventQuery(event: sys::CUevent);
    cuEventSynchronize(event: sys::CUevent);
    cuMemHostAlloc(ptr: *mut *mut c_void, bytes: usize, flags: c_uint);
    cuMemFreeHost(ptr: *mut c_void);
    cuMemcpyAsync(dst: sys::CUdeviceptr, src: sys::CUdeviceptr, bytes: usize, stream: sys::CUstream);
}

/// The driver library, loaded once: `libcuda.so.1`, the name XLA loads it by, so that
/// both get the same library (a second dlopen of a loaded name returns the same one).
fn loaded() -> &'static Result<Api, String> {
    static API: OnceLock<Result<Api, String>> = OnceLock::new();
    API.get_or_init(|| {
        // SAFETY: dlopen of a shared library by name; its constructors are the driver's.
        // The handle is never closed.
        let handle = unsafe { libc::dlopen(XLA_DRIVER.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            return Err("the CUDA driver library (libcuda.so.1) was not found".into());
        }
        // SAFETY: a live handle of the driver library, never closed.
        unsafe { load_api(handle) }
    })
}

/// The driver functions, if the library loaded.
fn api() -> Option<&'static Api> {
    loaded().as_ref().ok()
}

/// The driver's words for `res` (its name and description).
fn error_words(res: sys::CUresult) -> (String, String) {
    let word = |f: unsafe fn(sys::CUresult, *mut *const c_char) -> sys::CUresult| {
        let mut p: *const c_char = ptr::null();
        // SAFETY: `p` is a valid out pointer; on success the driver points it at a static
        // NUL-terminated string.
        if unsafe { f(res, &raw mut p) } == sys::CUresult::CUDA_SUCCESS && !p.is_null() {
            // SAFETY: as above.
            Some(unsafe { std::ffi::CStr::from_ptr(p) }.to_string_lossy().into_owned())
        } else {
            None
        }
    };
    (
        word(drv::cuGetErrorName).unwrap_or_else(|| format!("{res:?}")),
        word(drv::cuGetErrorString).unwrap_or_default(),
    )
}

/// `Ok` for `CUDA_SUCCESS`, else an error naming `what`.
fn check(res: sys::CUresult, what: &str) -> Result<(), Error> {
    if res == sys::CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    let (name, text) = error_words(res);
    Err(Error::Internal(format!("CUDA {what} failed: {name} ({text})")))
}

/// Whether the CUDA driver library is present with every function hostfeed uses, and
/// its version (e.g. 13000 for CUDA 13.0). Loads the library (once) but does not
/// initialise CUDA. Cached.
///
/// # Errors
/// Why CUDA cannot be used (no driver library, a missing function), in words.
pub(crate) fn driver_library() -> Result<(), String> {
    loaded().as_ref().map(|_| ()).map_err(Clone::clone)
}

/// The address of `cuInit` in the library `handle`, or null.
///
/// # Safety
/// `handle` must be a live handle from `dlopen`.
unsafe fn cu_init_in(handle: *mut c_void) -> *mut c_void {
    // SAFETY: caller contract; the name is a NUL-terminated string; nothing is called.
    unsafe { libc::dlsym(handle, c"cuInit".as_ptr()) }
}

/// The file that holds the code at `addr`, if the dynamic loader knows it.
fn file_of(addr: *const c_void) -> Option<String> {
    // SAFETY: `Dl_info` is plain data; dladdr only reads the loader's tables and writes
    // `info`; `dli_fname` is a NUL-terminated string owned by the loader.
    unsafe {
        let mut info: libc::Dl_info = std::mem::zeroed();
        if libc::dladdr(addr, &raw mut info) == 0 || info.dli_fname.is_null() {
            return None;
        }
        Some(std::ffi::CStr::from_ptr(info.dli_fname).to_string_lossy().into_owned())
    }
}

/// The address of hostfeed's `cuInit`.
fn our_cu_init() -> Option<*const c_void> {
    let a = api()?;
    // SAFETY: a live handle (never closed); the symbol's address is read, nothing called.
    let f = unsafe { cu_init_in(a.handle as *mut c_void) };
    (!f.is_null()).then_some(f.cast_const())
}

/// The file hostfeed's CUDA driver functions come from (e.g.
/// `/usr/lib/x86_64-linux-gnu/libcuda.so.570.86.15`), if the driver library loads.
#[must_use]
pub(crate) fn driver_path() -> Option<String> {
    file_of(our_cu_init()?)
}

/// Whether hostfeed calls the same driver library as XLA: when `libcuda.so.1` (XLA's name
/// for it) is loaded in the process, its `cuInit` must be hostfeed's. Answers `Ok` when
/// XLA has not loaded the driver (yet): nothing to compare with.
///
/// # Errors
/// Both files, when they differ (or hostfeed's driver library is unusable).
pub(crate) fn same_driver_as_xla() -> Result<(), String> {
    let ours = our_cu_init().ok_or_else(|| driver_library().err().unwrap_or_default())?;
    // SAFETY: RTLD_NOLOAD only looks the library up among those loaded (it loads nothing);
    // a handle it returns is closed below, after its symbol was read.
    let theirs = unsafe {
        let handle = libc::dlopen(XLA_DRIVER.as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD);
        if handle.is_null() {
            return Ok(());
        }
        let f = cu_init_in(handle);
        libc::dlclose(handle);
        f
    };
    if theirs.is_null() || std::ptr::eq(theirs.cast_const(), ours) {
        return Ok(());
    }
    let name = |p: *const c_void| file_of(p).unwrap_or_else(|| "?".into());
    Err(format!(
        "hostfeed's CUDA driver library ({}) is not the one XLA loaded (libcuda.so.1: {}), so \
         every CUDA handle XLA passes would be foreign to it; make libcuda.so on the library \
         path the same file as libcuda.so.1 (e.g. remove a CUDA toolkit's stubs directory \
         from LD_LIBRARY_PATH)",
        name(ours),
        name(theirs)
    ))
}

/// Why hostfeed cannot use the CUDA driver: no driver library, a missing function, or not
/// the library XLA loaded (`libcuda.so.1`). Loads the library (once) but does not
/// initialise CUDA. The platform table's check (`gpu::PLATFORMS`).
///
/// # Errors
/// That reason, in words.
pub(crate) fn driver_error() -> Result<(), String> {
    driver_library().and_then(|()| same_driver_as_xla())
}

/// Initialises the loaded driver, once it is known to be XLA's (`cuInit`, which may be
/// called any number of times).
fn initialise() -> Result<(), String> {
    same_driver_as_xla()?;
    // SAFETY: the library and its functions are present (checked by the above).
    check(unsafe { drv::cuInit(0) }, "cuInit").map_err(|e| e.to_string())
}

/// Pinned host memory from `cuMemHostAlloc` (portable: usable with every context). Called
/// with a context current (in a handler: the stream's), which it remembers: the pool's
/// reaper thread frees with that context current (a thread of its own has none).
pub(crate) struct CudaHostAlloc {
    /// The context of the first allocation (0: none yet).
    owner: std::sync::atomic::AtomicUsize,
}

impl CudaHostAlloc {
    const fn new() -> Self {
        CudaHostAlloc { owner: std::sync::atomic::AtomicUsize::new(0) }
    }
}

impl PinnedAlloc for CudaHostAlloc {
    fn alloc(&self, bytes: usize) -> Result<NonNull<u8>, Error> {
        if self.owner.load(std::sync::atomic::Ordering::Acquire) == 0 {
            let mut current: sys::CUcontext = ptr::null_mut();
            // SAFETY: the driver is loaded; `current` is a valid out pointer.
            if unsafe { drv::cuCtxGetCurrent(&raw mut current) } == sys::CUresult::CUDA_SUCCESS
                && !current.is_null()
            {
                self.owner.store(current as usize, std::sync::atomic::Ordering::Release);
            }
        }
        let mut p: *mut c_void = ptr::null_mut();
        let flags = sys::CU_MEMHOSTALLOC_PORTABLE;
        // SAFETY: the driver is loaded (handlers call `driver()` first) and a context is
        // current; `p` is a valid out pointer.
        let res = unsafe { drv::cuMemHostAlloc(&raw mut p, bytes, flags) };
        gpu_driver::pinned_block(bytes, check(res, "cuMemHostAlloc"), p)
    }

    unsafe fn free(&self, ptr: NonNull<u8>, _bytes: usize) {
        let mut current: sys::CUcontext = ptr::null_mut();
        let owner = self.owner.load(std::sync::atomic::Ordering::Acquire);
        // SAFETY: the driver is loaded (memory was allocated); `current` is a valid out
        // pointer; the owner context is held for the process's life (`hold_context`), so
        // making it current is valid. On the reaper thread nothing else is current.
        unsafe {
            if drv::cuCtxGetCurrent(&raw mut current) == sys::CUresult::CUDA_SUCCESS
                && current.is_null()
                && owner != 0
            {
                let _ = drv::cuCtxSetCurrent(owner as sys::CUcontext);
            }
        }
        // SAFETY: caller contract: allocated by `alloc`, freed once, no copy pending. A
        // failure leaves the memory pinned, which is harmless.
        let _ = unsafe { drv::cuMemFreeHost(ptr.as_ptr().cast()) };
    }
}

gpu_driver! {
    /// The CUDA driver of the shared handlers (`gpu/driver.rs`).
    Cuda, platform: "CUDA", label: " (CUDA)", queue: CudaStream, alloc: CudaHostAlloc = CudaHostAlloc::new(),
    ready: driver = initialise, version: driver_version = cuDriverGetVersion
}

/// The contexts handlers ran in, held: by device ordinal, (context, its unique id).
static HELD: Mutex<Vec<(i32, usize, u64)>> = Mutex::new(Vec::new());

/// The unique id of context `ctx` (never reused, unlike its address), if it is alive.
fn context_id(ctx: sys::CUcontext) -> Option<u64> {
    let mut id: c_ulonglong = 0;
    // SAFETY: the driver is loaded; `id` is a valid out pointer; a destroyed context is
    // reported as an error.
    (unsafe { drv::cuCtxGetId(ctx, &raw mut id) } == sys::CUresult::CUDA_SUCCESS).then_some(id)
}

/// Holds `ctx` (current on this thread) for the process's life, the first time a handler
/// runs in it: retains its device's primary context when it is that one. If the device's
/// context held before is gone (replaced: a primary context reset), the pinned pool
/// forgets its memory and the events of the old context are dropped from the pool.
fn hold_context(ctx: sys::CUcontext) -> Result<(), Error> {
    let Some(id) = context_id(ctx) else { return Ok(()) };
    let mut held = lock(&HELD);
    if held.iter().any(|&(_, c, i)| c == ctx as usize && i == id) {
        return Ok(());
    }
    let mut dev: sys::CUdevice = 0;
    // SAFETY: `ctx` is current (caller contract); `dev` is a valid out pointer.
    check(unsafe { drv::cuCtxGetDevice(&raw mut dev) }, "cuCtxGetDevice")?;
    let replaced: Vec<usize> = held
        .iter()
        .filter(|&&(d, c, i)| d == dev && context_id(c as sys::CUcontext) != Some(i))
        .map(|&(_, c, _)| c)
        .collect();
    if !replaced.is_empty() {
        // The memory and events of a context that is gone died with it.
        if replaced.contains(&pool().allocator().owner.load(std::sync::atomic::Ordering::Acquire)) {
            pool().reset();
            pool().allocator().owner.store(0, std::sync::atomic::Ordering::Release);
        }
        for &c in &replaced {
            events().forget(c);
        }
        held.retain(|&(_, c, _)| !replaced.contains(&c));
    }
    let mut primary: sys::CUcontext = ptr::null_mut();
    // SAFETY: `dev` is a valid device; `primary` is a valid out pointer. The reference is
    // kept (never released) when it is `ctx`, else released at once.
    unsafe {
        check(drv::cuDevicePrimaryCtxRetain(&raw mut primary, dev), "cuDevicePrimaryCtxRetain")?;
        if primary != ctx {
            let _ = drv::cuDevicePrimaryCtxRelease_v2(dev);
        }
    }
    held.push((dev, ctx as usize, id));
    Ok(())
}

/// `check`, with failures from a stream under capture reported as such.
fn check_stream(res: sys::CUresult, what: &str) -> Result<(), Error> {
    match res {
        sys::CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
        | sys::CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
        | sys::CUresult::CUDA_ERROR_STREAM_CAPTURE_IMPLICIT => Err(gpu_driver::captured("a CUDA graph")),
        other => check(other, what),
    }
}

/// A query's answer: done, pending (`CUDA_ERROR_NOT_READY`), or the error (by `fail`).
fn poll(
    res: sys::CUresult,
    what: &str,
    fail: fn(sys::CUresult, &str) -> Result<(), Error>,
) -> Result<Poll, Error> {
    match res {
        sys::CUresult::CUDA_SUCCESS => Ok(Poll::Done),
        sys::CUresult::CUDA_ERROR_NOT_READY => Ok(Poll::Pending),
        err => fail(err, what).map(|()| Poll::Done),
    }
}

thread_local! {
    /// The context of each stream this thread's handlers saw (XLA's streams keep theirs).
    static STREAM_CTX: std::cell::RefCell<Vec<(usize, usize)>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Most streams [`STREAM_CTX`] remembers per thread (XLA uses a few per device).
const STREAM_CACHE: usize = 32;

/// The stream of one handler call, with its context made current until dropped.
pub(crate) struct CudaStream {
    raw: sys::CUstream,
    ctx: sys::CUcontext,
    /// Whether `ctx` was pushed for this call, to pop on drop (not if it was current).
    pushed: bool,
}

impl CudaStream {
    /// The stream `raw` (a `CUstream` from XLA), its context made current; `capture`:
    /// refuse it while it is being captured into a CUDA graph (taps; see the module
    /// documentation).
    ///
    /// # Errors
    /// The driver is unusable, the stream is being captured into a CUDA graph, or a
    /// driver call fails.
    ///
    /// # Safety
    /// `raw` must be a live `CUstream`, valid for the life of the result.
    pub(crate) unsafe fn new(raw: *mut c_void, capture: bool) -> Result<Self, Error> {
        driver()?;
        let raw: sys::CUstream = raw.cast();
        let cached = STREAM_CTX.with_borrow(|c| c.iter().find(|e| e.0 == raw as usize).map(|e| e.1));
        let (ctx, fresh) = if let Some(ctx) = cached {
            (ctx as sys::CUcontext, false)
        } else {
            let mut ctx: sys::CUcontext = ptr::null_mut();
            // SAFETY: the driver is initialised; `raw` is a live stream (caller contract);
            // the out pointer is valid.
            check(unsafe { drv::cuStreamGetCtx(raw, &raw mut ctx) }, "cuStreamGetCtx")?;
            (ctx, true)
        };
        let mut current: sys::CUcontext = ptr::null_mut();
        // SAFETY: as above.
        check(unsafe { drv::cuCtxGetCurrent(&raw mut current) }, "cuCtxGetCurrent")?;
        let pushed = current != ctx;
        if pushed {
            // SAFETY: `ctx` is the live context of the stream.
            check(unsafe { drv::cuCtxPushCurrent_v2(ctx) }, "cuCtxPushCurrent")?;
        }
        let stream = CudaStream { raw, ctx, pushed };
        if fresh {
            hold_context(ctx)?;
            STREAM_CTX.with_borrow_mut(|c| {
                if c.len() >= STREAM_CACHE {
                    c.remove(0);
                }
                c.push((raw as usize, ctx as usize));
            });
        }
        if capture {
            let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
            // SAFETY: as above.
            check(unsafe { drv::cuStreamIsCapturing(raw, &raw mut status) }, "cuStreamIsCapturing")?;
            if status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
                return Err(gpu_driver::captured("a CUDA graph"));
            }
        }
        Ok(stream)
    }
}

impl Drop for CudaStream {
    fn drop(&mut self) {
        if self.pushed {
            let mut popped: sys::CUcontext = ptr::null_mut();
            // SAFETY: this call pushed the context in `new` on this thread.
            let _ = unsafe { drv::cuCtxPopCurrent_v2(&raw mut popped) };
        }
    }
}

thread_local! {
    /// The context this thread last made current (couriers serve one device each).
    static CURRENT: Cell<usize> = const { Cell::new(0) };
}

impl gpu_driver::StreamOps for CudaStream {
    fn owner(&self) -> usize {
        self.ctx as usize
    }

    unsafe fn copy(&self, dst: *mut u8, src: *const u8, n: usize) -> Result<(), Error> {
        // SAFETY: caller contract (device or pinned host memory, valid for `n` bytes until
        // the copy ran); the stream's context is current. Under unified addressing a host
        // pointer is a valid address for cuMemcpyAsync, which infers the direction.
        let res =
            unsafe { drv::cuMemcpyAsync(dst as sys::CUdeviceptr, src as sys::CUdeviceptr, n, self.raw) };
        check_stream(res, "cuMemcpyAsync")
    }

    fn record_on(&self, event: usize) -> Result<(), Error> {
        // SAFETY: an event of the stream's context (current); the stream is live.
        check(unsafe { drv::cuEventRecord(event as sys::CUevent, self.raw) }, "cuEventRecord")
    }

    fn query(&self) -> Result<Poll, Error> {
        // SAFETY: the stream is live.
        poll(unsafe { drv::cuStreamQuery(self.raw) }, "cuStreamQuery", check_stream)
    }

    fn block(&self) -> Result<(), Error> {
        // SAFETY: the stream is live.
        check_stream(unsafe { drv::cuStreamSynchronize(self.raw) }, "cuStreamSynchronize")
    }

    fn create_event(&self) -> Result<usize, Error> {
        let mut e: sys::CUevent = ptr::null_mut();
        let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32
            | sys::CUevent_flags::CU_EVENT_BLOCKING_SYNC as u32;
        // SAFETY: the stream's context is current; `e` is a valid out pointer.
        check(unsafe { drv::cuEventCreate(&raw mut e, flags) }, "cuEventCreate")?;
        Ok(e as usize)
    }

    fn enter(ctx: usize) -> Result<(), Error> {
        if CURRENT.get() != ctx {
            // SAFETY: the event's context is live (held for the process's life).
            check(unsafe { drv::cuCtxSetCurrent(ctx as sys::CUcontext) }, "cuCtxSetCurrent")?;
            CURRENT.set(ctx);
        }
        Ok(())
    }

    fn event_query(event: usize) -> Result<Poll, Error> {
        // SAFETY: a live event, recorded (the pool never destroys one).
        poll(unsafe { drv::cuEventQuery(event as sys::CUevent) }, "cuEventQuery", check)
    }

    fn event_block(event: usize) -> Result<(), Error> {
        // SAFETY: as above; a blocking-sync event: the thread sleeps until it completes.
        check(unsafe { drv::cuEventSynchronize(event as sys::CUevent) }, "cuEventSynchronize")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_driver_cuda_is_reported_unusable_rather_than_panicking() {
        match driver_library() {
            Ok(()) => assert!(driver_path().is_some_and(|p| p.contains("libcuda"))), // a machine with CUDA
            Err(why) => {
                assert!(why.contains("CUDA driver library"), "{why}");
                let err = driver().unwrap_err().to_string();
                assert!(err.contains("cannot use CUDA"), "{err}");
                assert!(driver_version().is_none());
                assert_eq!(pool_stats().allocations, 0);
            }
        }
    }
}
