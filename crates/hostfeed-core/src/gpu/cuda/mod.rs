//! The CUDA platform: the XLA FFI handlers registered for `CUDA`, a [`Stream`] over the
//! CUDA driver API, and pinned memory for the pool.
//!
//! The driver is loaded at run time (`cudarc` with dynamic loading: `dlopen` of libcuda,
//! symbols resolved on first use), never linked, so hostfeed builds and imports on
//! machines without CUDA; [`driver`] reports why CUDA is unusable instead of failing.
//! The bindings are those of CUDA 13.4 (cudarc's newest), so that every error code a
//! current driver returns is one the bindings know; every function used exists in the
//! CUDA 12 and 13 drivers.
//!
//! The handlers get the stream XLA runs the custom call on (`XLA_FFI_Stream_Get`, a
//! `CUstream`), make its context current for the duration of the call, refuse to run
//! while the stream is being captured into a CUDA graph (their metadata never declares
//! them command-buffer compatible, so XLA does not capture them; this guards the
//! invariant), and run the platform-neutral bodies in `gpu/`.
//!
//! Each tap records an event after its copies (from a pool of events per context, created
//! with `CU_EVENT_DISABLE_TIMING | CU_EVENT_BLOCKING_SYNC`); the device's courier thread
//! (`gpu/`) waits for it, polling briefly before it sleeps in `cuEventSynchronize`.

use std::cell::Cell;
use std::collections::HashMap;
use std::ffi::c_void;
use std::ptr::{self, NonNull};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use cudarc::driver::result::DriverError;
use cudarc::driver::sys;

use crate::error::Error;
use crate::ffi::frame::Frame;
use crate::ffi::handlers::{self, FLAG_STATUS_OUTPUT};
use crate::gpu::pinned::{PinnedAlloc, PinnedPool, PoolStats};
use crate::gpu::{self, Completion, Header, Stream};
use crate::host::buffer::HostBuffer;
use crate::host::hub::Hub;
use crate::host::reply::OutBuf;
use crate::host::sync::lock;

/// How long a courier polls an event before sleeping on it: a tap's copies usually
/// complete within microseconds, and sleeping costs a wake-up of tens of them.
const EVENT_SPIN: Duration = Duration::from_micros(50);

/// Driver functions hostfeed calls, checked when the driver is loaded so that a missing
/// one is a clear error rather than a failure in the middle of a handler.
const SYMBOLS: &[&str] = &[
    "cuInit",
    "cuGetErrorName",
    "cuGetErrorString",
    "cuDriverGetVersion",
    "cuStreamGetCtx",
    "cuStreamIsCapturing",
    "cuCtxGetCurrent",
    "cuCtxPushCurrent_v2",
    "cuCtxPopCurrent_v2",
    "cuCtxSetCurrent",
    "cuEventCreate",
    "cuEventRecord",
    "cuEventQuery",
    "cuEventSynchronize",
    "cuMemHostAlloc",
    "cuMemFreeHost",
    "cuMemcpyDtoHAsync_v2",
    "cuMemcpyHtoDAsync_v2",
    "cuStreamSynchronize",
];

/// A driver error as a hostfeed error naming what failed.
fn driver_error(what: &str, e: DriverError) -> Error {
    let name = e.error_name().map_or_else(|_| format!("{:?}", e.0), |s| s.to_string_lossy().into_owned());
    let text = e.error_string().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    Error::Internal(format!("CUDA {what} failed: {name} ({text})"))
}

/// `Ok` for `CUDA_SUCCESS`, else an error naming `what`.
fn check(res: sys::CUresult, what: &str) -> Result<(), Error> {
    res.result().map_err(|e| driver_error(what, e))
}

/// Whether the CUDA driver library is present with every function hostfeed uses, and
/// its version (e.g. 13000 for CUDA 13.0). Loads the library (once) but does not
/// initialise CUDA. Cached.
///
/// # Errors
/// Why CUDA cannot be used (no driver library, a missing function), in words.
pub fn driver_library() -> Result<(), String> {
    static LOADED: OnceLock<Result<(), String>> = OnceLock::new();
    LOADED
        .get_or_init(|| {
            // SAFETY: only looks for the library file (dlopen and dlclose).
            if !unsafe { sys::is_culib_present() } {
                return Err("the CUDA driver library (libcuda.so.1) was not found".into());
            }
            // SAFETY: the library is present (checked above), so `culib` does not panic;
            // looking up a symbol's address calls nothing.
            let lib = unsafe { sys::culib() };
            for name in SYMBOLS {
                // SAFETY: as above; the address is not used.
                if unsafe { lib.get::<*const c_void>(name.as_bytes()) }.is_err() {
                    return Err(format!("the CUDA driver library lacks {name}"));
                }
            }
            Ok(())
        })
        .clone()
}

/// The driver, loaded and initialised (once).
///
/// # Errors
/// Why CUDA cannot be used.
pub(crate) fn driver() -> Result<(), Error> {
    static READY: OnceLock<Result<(), String>> = OnceLock::new();
    READY
        .get_or_init(|| {
            driver_library()?;
            // SAFETY: the library and its functions are present; cuInit may be called any
            // number of times.
            check(unsafe { sys::cuInit(0) }, "cuInit").map_err(|e| e.to_string())
        })
        .clone()
        .map_err(|m| Error::Internal(format!("hostfeed cannot use CUDA: {m}")))
}

/// The CUDA driver's version (e.g. 13000), if the driver loads.
#[must_use]
pub fn driver_version() -> Option<i32> {
    driver().ok()?;
    let mut v = 0;
    // SAFETY: the driver is loaded and initialised; `v` is a valid out pointer.
    check(unsafe { sys::cuDriverGetVersion(&raw mut v) }, "cuDriverGetVersion").ok()?;
    Some(v)
}

/// Pinned host memory from `cuMemHostAlloc` (portable: usable with every context). Called
/// with a context current (in a handler: the stream's).
pub(crate) struct CudaHostAlloc;

impl PinnedAlloc for CudaHostAlloc {
    fn alloc(&self, bytes: usize) -> Result<NonNull<u8>, Error> {
        let mut p: *mut c_void = ptr::null_mut();
        let flags = sys::CU_MEMHOSTALLOC_PORTABLE;
        // SAFETY: the driver is loaded (handlers call `driver()` first) and a context is
        // current; `p` is a valid out pointer.
        let res = unsafe { sys::cuMemHostAlloc(&raw mut p, bytes, flags) };
        check(res, "cuMemHostAlloc").map_err(|e| {
            Error::Internal(format!("cannot pin {bytes} bytes of host memory for a GPU tap: {e}"))
        })?;
        NonNull::new(p.cast()).ok_or_else(|| Error::Internal("cuMemHostAlloc returned null".into()))
    }

    unsafe fn free(&self, ptr: NonNull<u8>, _bytes: usize) {
        // SAFETY: caller contract: allocated by `alloc`, freed once, no copy pending. A
        // failure leaves the memory pinned, which is harmless.
        let _ = unsafe { sys::cuMemFreeHost(ptr.as_ptr().cast()) };
    }
}

/// The process's pool of pinned memory for GPU messages.
fn pool() -> &'static PinnedPool<CudaHostAlloc> {
    static POOL: OnceLock<PinnedPool<CudaHostAlloc>> = OnceLock::new();
    POOL.get_or_init(|| PinnedPool::new(CudaHostAlloc))
}

/// Counters of the pinned pool (for tests and `cuda_pool_stats()`).
#[must_use]
pub fn pool_stats() -> PoolStats {
    pool().stats()
}

/// The stream of one handler call, with its context made current until dropped.
pub(crate) struct CudaStream {
    raw: sys::CUstream,
    ctx: sys::CUcontext,
    /// Whether `ctx` was pushed for this call, to pop on drop (not if it was current).
    pushed: bool,
}

impl CudaStream {
    /// The stream `raw` (a `CUstream` from XLA), its context made current.
    ///
    /// # Errors
    /// The driver is unusable, the stream is being captured into a CUDA graph, or a
    /// driver call fails.
    ///
    /// # Safety
    /// `raw` must be a live `CUstream`, valid for the life of the result.
    pub(crate) unsafe fn new(raw: *mut c_void) -> Result<Self, Error> {
        driver()?;
        let raw: sys::CUstream = raw.cast();
        let mut ctx: sys::CUcontext = ptr::null_mut();
        let mut current: sys::CUcontext = ptr::null_mut();
        // SAFETY: the driver is initialised; `raw` is a live stream (caller contract); the
        // out pointers are valid.
        unsafe {
            check(sys::cuStreamGetCtx(raw, &raw mut ctx), "cuStreamGetCtx")?;
            check(sys::cuCtxGetCurrent(&raw mut current), "cuCtxGetCurrent")?;
        }
        let pushed = current != ctx;
        if pushed {
            // SAFETY: `ctx` is the live context of the stream.
            check(unsafe { sys::cuCtxPushCurrent_v2(ctx) }, "cuCtxPushCurrent")?;
        }
        let stream = CudaStream { raw, ctx, pushed };
        let mut capture = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: as above.
        check(unsafe { sys::cuStreamIsCapturing(raw, &raw mut capture) }, "cuStreamIsCapturing")?;
        if capture != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
            return Err(Error::Internal(
                "hostfeed's custom calls cannot be captured into a CUDA graph (they are not \
                 command-buffer compatible); XLA captured one anyway"
                    .into(),
            ));
        }
        Ok(stream)
    }
}

impl Drop for CudaStream {
    fn drop(&mut self) {
        if self.pushed {
            let mut popped: sys::CUcontext = ptr::null_mut();
            // SAFETY: this call pushed the context in `new` on this thread.
            let _ = unsafe { sys::cuCtxPopCurrent_v2(&raw mut popped) };
        }
    }
}

/// Idle events, by the address of their context.
static EVENTS: Mutex<Option<HashMap<usize, Vec<usize>>>> = Mutex::new(None);

/// An event recorded on a stream, back to the pool when dropped.
pub(crate) struct CudaEvent {
    raw: sys::CUevent,
    ctx: sys::CUcontext,
}

// SAFETY: CUDA events and contexts are handles usable from any thread; the courier only
// queries and waits on the event, with its context made current.
unsafe impl Send for CudaEvent {}

thread_local! {
    /// The context this thread last made current (couriers serve one device each).
    static CURRENT: Cell<usize> = const { Cell::new(0) };
}

impl CudaEvent {
    /// An idle event of `ctx` (created when none is), recorded on `stream`.
    ///
    /// # Safety
    /// `ctx` must be current on this thread and `stream` a live stream of it.
    unsafe fn record(ctx: sys::CUcontext, stream: sys::CUstream) -> Result<Self, Error> {
        let idle = lock(&EVENTS).get_or_insert_with(HashMap::new).get_mut(&(ctx as usize)).and_then(Vec::pop);
        let raw = if let Some(e) = idle {
            e as sys::CUevent
        } else {
            let mut e: sys::CUevent = ptr::null_mut();
            let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32
                | sys::CUevent_flags::CU_EVENT_BLOCKING_SYNC as u32;
            // SAFETY: `ctx` is current (caller contract); `e` is a valid out pointer.
            check(unsafe { sys::cuEventCreate(&raw mut e, flags) }, "cuEventCreate")?;
            e
        };
        let event = CudaEvent { raw, ctx };
        // SAFETY: the event belongs to the stream's context; the stream is live.
        check(unsafe { sys::cuEventRecord(raw, stream) }, "cuEventRecord")?;
        Ok(event)
    }
}

impl Completion for CudaEvent {
    fn wait(&self) -> Result<(), Error> {
        if CURRENT.get() != self.ctx as usize {
            // SAFETY: the event's context is live (XLA's, for the process's life).
            check(unsafe { sys::cuCtxSetCurrent(self.ctx) }, "cuCtxSetCurrent")?;
            CURRENT.set(self.ctx as usize);
        }
        let start = Instant::now();
        loop {
            // SAFETY: a live event, recorded.
            match unsafe { sys::cuEventQuery(self.raw) } {
                sys::CUresult::CUDA_SUCCESS => return Ok(()),
                sys::CUresult::CUDA_ERROR_NOT_READY if start.elapsed() < EVENT_SPIN => std::hint::spin_loop(),
                sys::CUresult::CUDA_ERROR_NOT_READY => break,
                err => return check(err, "cuEventQuery"),
            }
        }
        // SAFETY: as above; a blocking-sync event: the thread sleeps until it completes.
        check(unsafe { sys::cuEventSynchronize(self.raw) }, "cuEventSynchronize")
    }
}

impl Drop for CudaEvent {
    fn drop(&mut self) {
        // Re-recording an event is allowed whatever its state: back to the pool.
        lock(&EVENTS)
            .get_or_insert_with(HashMap::new)
            .entry(self.ctx as usize)
            .or_default()
            .push(self.raw as usize);
    }
}

impl Stream for CudaStream {
    unsafe fn copy_to_host(&self, dst: *mut u8, src: *const u8, n: usize) -> Result<(), Error> {
        // SAFETY: caller contract (device source, pinned destination, both valid for `n`
        // bytes until the copy ran); the stream's context is current.
        check(
            unsafe { sys::cuMemcpyDtoHAsync_v2(dst.cast(), src as sys::CUdeviceptr, n, self.raw) },
            "cuMemcpyDtoHAsync",
        )
    }

    unsafe fn copy_to_device(&self, dst: *mut u8, src: *const u8, n: usize) -> Result<(), Error> {
        // SAFETY: as above, the other way.
        check(
            unsafe { sys::cuMemcpyHtoDAsync_v2(dst as sys::CUdeviceptr, src.cast(), n, self.raw) },
            "cuMemcpyHtoDAsync",
        )
    }

    fn record(&self) -> Result<Box<dyn Completion>, Error> {
        // SAFETY: the stream's context is current for the life of `self`.
        Ok(Box::new(unsafe { CudaEvent::record(self.ctx, self.raw) }?))
    }

    fn synchronize(&self) -> Result<(), Error> {
        // SAFETY: the stream is live.
        check(unsafe { sys::cuStreamSynchronize(self.raw) }, "cuStreamSynchronize")
    }

    fn host_buffer(&self, len: usize) -> Result<HostBuffer, Error> {
        Ok(HostBuffer::pinned(pool().take(len)?, len))
    }
}

/// The stream of `frame`'s call.
fn stream(frame: &Frame<'_>) -> Result<CudaStream, Error> {
    let raw = frame.stream()?;
    // SAFETY: XLA's stream for this call, live for the duration of the call (and the
    // result is dropped before the handler returns).
    unsafe { CudaStream::new(raw) }
}

fn header(frame: &Frame<'_>) -> Result<Header, Error> {
    let consumer_id = frame
        .attrs
        .consumer_id
        .ok_or_else(|| Error::InvalidArgument("custom call lacks the consumer_id attribute".into()))?;
    Ok(Header { consumer_id, flags: frame.attrs.flags, ordinal: frame.device, run_id: frame.run_id })
}

fn tap(frame: &Frame<'_>, receiver: &'static Hub, start: u64) -> Result<(), Error> {
    let header = header(frame)?;
    let stream = stream(frame)?;
    // SAFETY: the operands are XLA's device buffers of their dtypes and dims, alive until
    // the work enqueued on this stream by this call has run.
    unsafe { gpu::tap(&stream, receiver, &gpu::DELIVERY, header, frame.operands()) }?;
    // The host thread's cost (enqueuing the copies); the hand-over is timed from the
    // courier's push, when the message is on the host.
    receiver.timing.record_device(start, receiver.timing.now());
    Ok(())
}

fn call(frame: &Frame<'_>, receiver: &'static Hub, _start: u64) -> Result<(), Error> {
    let header = header(frame)?;
    let mut outs = frame.outputs();
    let status = if frame.attrs.flags & FLAG_STATUS_OUTPUT != 0 {
        Some(outs.next().ok_or_else(|| Error::InvalidArgument("missing status result".into()))?.out_buf()?)
    } else {
        None
    };
    let outs: Vec<OutBuf> = outs.map(|b| b.out_buf()).collect::<Result<_, _>>()?;
    let stream = stream(frame)?;
    // SAFETY: operands and results are XLA's device buffers of their dtypes and dims,
    // alive until the work enqueued on this stream by this call has run.
    unsafe {
        gpu::call(
            &stream,
            receiver,
            &gpu::DELIVERY,
            header,
            &frame.attrs,
            frame.operands(),
            &outs,
            status.as_ref(),
        )
    }
}

fn check_call(frame: &Frame<'_>, receiver: &'static Hub, _start: u64) -> Result<(), Error> {
    let mut ops = frame.operands();
    let status =
        ops.next().ok_or_else(|| Error::InvalidArgument("hostfeed_check needs a status operand".into()))?;
    let sent = ops.next();
    let stream = stream(frame)?;
    // SAFETY: XLA's device buffers of their dtypes and dims, alive for the call.
    unsafe { gpu::check(&stream, receiver, &status, sent.as_ref()) }
}

fn failure(frame: &Frame<'_>, receiver: &'static Hub, _start: u64) -> Result<(), Error> {
    let status = frame
        .operands()
        .next()
        .ok_or_else(|| Error::InvalidArgument("hostfeed_failure needs a status operand".into()))?;
    let out = frame
        .outputs()
        .next()
        .ok_or_else(|| Error::InvalidArgument("hostfeed_failure needs a uint8 result".into()))?
        .out_buf()?;
    let stream = stream(frame)?;
    // SAFETY: XLA's device buffers of their dtypes and dims, alive until the work enqueued
    // by this call has run.
    unsafe { gpu::failure(&stream, receiver, &gpu::DELIVERY, frame.device, &status, &out) }
}

handlers::define_handlers! {
    " (CUDA)";
    /// XLA FFI handler `hostfeed_tap` on CUDA.
    hostfeed_tap => tap;
    /// XLA FFI handler `hostfeed_call` on CUDA.
    hostfeed_call => call;
    /// XLA FFI handler `hostfeed_check` on CUDA.
    hostfeed_check => check_call;
    /// XLA FFI handler `hostfeed_failure` on CUDA.
    hostfeed_failure => failure;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_driver_cuda_is_reported_unusable_rather_than_panicking() {
        match driver_library() {
            Ok(()) => assert!(SYMBOLS.iter().all(|s| s.starts_with("cu"))), // a machine with CUDA
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
