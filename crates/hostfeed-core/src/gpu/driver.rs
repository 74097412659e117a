//! What every GPU driver shares: the XLA FFI handlers (written once, generic over a
//! [`Driver`]), the loading of a driver library's functions ([`dynamic_api!`]), the pool
//! of idle events ([`EventPool`]), the wait that polls before it sleeps ([`poll_then_block`])
//! and the words for a stream under graph capture ([`captured`]).
//!
//! A driver (`cuda/`: the CUDA driver API; `hip/`: the HIP runtime for ROCm) provides
//! only its [`StreamOps`] (copies, events, synchronisation on the stream XLA gives a call),
//! its pinned allocator for the pool, and the loading of its library; the handler bodies
//! below decode the call, build the [`Header`] and run the platform-neutral ones of
//! `gpu/ops.rs`; [`gpu_driver!`] makes each driver's `extern "C"` symbols and `HANDLERS`
//! table of them (with `define_handlers!`).

use std::ffi::c_void;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::error::Error;
use crate::ffi::handlers::Frame;
use crate::gpu::pinned::{PinnedAlloc, PinnedPool};
use crate::gpu::{self, Completion, Header, Stream};
use crate::host::buffer::HostBuffer;
use crate::host::hub::Hub;
use crate::host::message::FLAG_STATUS_OUTPUT;
use crate::host::reply::OutBuf;
use crate::host::sync::lock;

/// How long a wait polls before sleeping: a tap's copies usually complete within
/// microseconds, and sleeping costs a wake-up of tens of them.
pub(crate) const POLL_SPIN: Duration = Duration::from_micros(50);

/// The value a driver function answers before its library is loaded (so that no path can
/// call a missing function): the driver's "not initialised" error, a null string.
pub(crate) trait Unloaded {
    /// The answer of an unloaded function.
    fn unloaded() -> Self;
}

impl Unloaded for *const std::ffi::c_char {
    fn unloaded() -> Self {
        std::ptr::null()
    }
}

/// The return type of a declared function: its own, else the driver's result type.
macro_rules! api_ret {
    (; $default:ty) => {
        $default
    };
    ($ret:ty; $default:ty) => {
        $ret
    };
}
pub(crate) use api_ret;

/// Declares the functions a driver library provides to hostfeed, each once, by name and C
/// signature (returning the driver's result type unless another is written): `Api`, their
/// addresses in the library (resolved all at once by `load_api` from a `dlopen` handle,
/// which `Api::handle` keeps), and in `drv` a function of the same name and signature for
/// each, which answers [`Unloaded::unloaded`] while `api()` (the driver's) is `None`.
macro_rules! dynamic_api {
    (
        library: $library:literal,
        result: $res:ty = $unloaded:expr;
        $($name:ident($($arg:ident: $ty:ty),*) $(-> $ret:ty)?;)*
    ) => {
        impl $crate::gpu::driver::Unloaded for $res {
            fn unloaded() -> Self {
                $unloaded
            }
        }

        /// Addresses of the driver functions hostfeed calls.
        #[allow(non_snake_case)]
        struct Api {
            /// The library's handle (CUDA looks its `cuInit` up again to compare with XLA's).
            #[allow(dead_code)]
            handle: usize,
            $($name: unsafe extern "C" fn($($ty),*) -> $crate::gpu::driver::api_ret!($($ret)?; $res),)*
        }

        /// The driver functions, from the library `handle` (from dlopen).
        ///
        /// # Safety
        /// `handle` must be a live handle of the driver library, never closed.
        unsafe fn load_api(handle: *mut c_void) -> Result<Api, String> {
            Ok(Api {
                handle: handle as usize,
                $($name: {
                    // SAFETY: caller contract; the name is NUL-terminated.
                    let f = unsafe { libc::dlsym(handle, concat!(stringify!($name), "\0").as_ptr().cast()) };
                    if f.is_null() {
                        return Err(format!("{} lacks {}", $library, stringify!($name)));
                    }
                    // SAFETY: the library exports this function with this C signature
                    // (that of the driver's headers, as declared here).
                    unsafe {
                        std::mem::transmute::<
                            *mut c_void,
                            unsafe extern "C" fn($($ty),*) -> $crate::gpu::driver::api_ret!($($ret)?; $res),
                        >(f)
                    }
                },)*
            })
        }

        /// The driver functions by name, from the library loaded at run time.
        #[allow(non_snake_case, clippy::missing_safety_doc, dead_code)]
        mod drv {
            use super::*;
            $(
                /// The driver function of this name.
                pub(crate) unsafe fn $name($($arg: $ty),*) -> $crate::gpu::driver::api_ret!($($ret)?; $res) {
                    match api() {
                        // SAFETY: the function's C contract is the caller's.
                        Some(a) => unsafe { (a.$name)($($arg),*) },
                        None => $crate::gpu::driver::Unloaded::unloaded(),
                    }
                }
            )*
        }
    };
}
pub(crate) use dynamic_api;

/// A driver library loaded and initialised, once (cached in `cell`: `init`'s outcome), or
/// why `platform` cannot be used.
///
/// # Errors
/// "hostfeed cannot use {platform}: " and what `init` said.
pub(crate) fn initialised(
    cell: &OnceLock<Result<(), String>>,
    platform: &str,
    init: impl FnOnce() -> Result<(), String>,
) -> Result<(), Error> {
    cell.get_or_init(init)
        .clone()
        .map_err(|m| Error::Internal(format!("hostfeed cannot use {platform}: {m}")))
}

/// The memory a driver's pinned allocation of `bytes` returned at `p`, with `outcome`
/// (the driver's answer, checked), as the pool takes it.
///
/// # Errors
/// The driver refused (or returned null), in words naming the size.
pub(crate) fn pinned_block(
    bytes: usize,
    outcome: Result<(), Error>,
    p: *mut c_void,
) -> Result<std::ptr::NonNull<u8>, Error> {
    outcome.map_err(|e| {
        Error::Internal(format!("cannot pin {bytes} bytes of host memory for a GPU tap: {e}"))
    })?;
    std::ptr::NonNull::new(p.cast())
        .ok_or_else(|| Error::Internal("the driver's pinned allocation returned null".into()))
}

/// A GPU driver as the handlers use it.
pub(crate) trait Driver: 'static {
    /// A stream of one handler call, ready for copies until dropped.
    type Stream: Stream;

    /// The stream `raw` (XLA's, from `XLA_FFI_Stream_Get`) made ready for this call;
    /// `capture`: refused while it is being captured into a graph (taps: a captured tap
    /// would deliver bytes never copied; the handlers never declare themselves
    /// command-buffer compatible, so this guards the invariant).
    ///
    /// # Errors
    /// The driver is unusable, the stream is captured, or a driver call fails.
    ///
    /// # Safety
    /// `raw` must be a live stream of this driver, valid for the life of the result.
    unsafe fn stream(raw: *mut c_void, capture: bool) -> Result<Self::Stream, Error>;
}

/// Declares a driver: `$ready()` (the library loaded, then initialised by `$init`, once),
/// `$version()` (from `$get`), the unit struct `$name` implementing [`Driver`] for `$platform`
/// (its handlers' labels) with streams from `$queue::new(raw, capture)`, and its pool of
/// pinned memory, `pool()` (allocator `$alloc`) with `pool_stats()`, and of idle events,
/// `events()`.
macro_rules! gpu_driver {
    (
        $(#[$doc:meta])* $name:ident, platform: $platform:literal, label: $label:literal, queue: $queue:ty,
        alloc: $alloc:ty = $make:expr,
        ready: $ready:ident = $init:path, version: $version:ident = $get:ident
    ) => {
        /// The library loaded and initialised (once), ready for handlers.
        ///
        /// # Errors
        /// Why the platform cannot be used.
        pub(crate) fn $ready() -> Result<(), Error> {
            static READY: OnceLock<Result<(), String>> = OnceLock::new();
            $crate::gpu::driver::initialised(&READY, $platform, $init)
        }

        #[doc = concat!("The version `", stringify!($get), "` reports, if the library loads.")]
        #[must_use]
        pub(crate) fn $version() -> Option<i32> {
            $ready().ok()?;
            let mut v = 0;
            // SAFETY: the library is loaded and initialised; `v` is a valid out pointer.
            check(unsafe { drv::$get(&raw mut v) }, stringify!($get)).ok()?;
            Some(v)
        }

        $(#[$doc])*
        pub(crate) struct $name;

        /// The shared handler bodies, for this driver.
        fn tap_body(frame: &$crate::ffi::handlers::Frame<'_>, hub: &'static $crate::host::hub::Hub, start: u64) -> Result<(), Error> {
            $crate::gpu::driver::tap::<$name>(frame, hub, start)
        }
        fn call_body(frame: &$crate::ffi::handlers::Frame<'_>, hub: &'static $crate::host::hub::Hub, start: u64) -> Result<(), Error> {
            $crate::gpu::driver::call::<$name>(frame, hub, start)
        }
        fn check_body(frame: &$crate::ffi::handlers::Frame<'_>, hub: &'static $crate::host::hub::Hub, start: u64) -> Result<(), Error> {
            $crate::gpu::driver::check_call::<$name>(frame, hub, start)
        }
        fn failure_body(frame: &$crate::ffi::handlers::Frame<'_>, hub: &'static $crate::host::hub::Hub, start: u64) -> Result<(), Error> {
            $crate::gpu::driver::failure::<$name>(frame, hub, start)
        }

        $crate::ffi::handlers::define_handlers! {
            $label;
            pub(crate) const HANDLERS;
            /// XLA FFI handler `hostfeed_tap` on this platform.
            hostfeed_tap => tap_body;
            /// XLA FFI handler `hostfeed_call` on this platform.
            hostfeed_call => call_body;
            /// XLA FFI handler `hostfeed_check` on this platform.
            hostfeed_check => check_body;
            /// XLA FFI handler `hostfeed_failure` on this platform.
            hostfeed_failure => failure_body;
        }

        impl $crate::gpu::driver::Driver for $name {
            type Stream = $crate::gpu::driver::OnStream<$queue>;

            unsafe fn stream(raw: *mut c_void, capture: bool) -> Result<Self::Stream, Error> {
                // SAFETY: forwarded caller contract.
                Ok($crate::gpu::driver::OnStream(unsafe { <$queue>::new(raw, capture) }?))
            }
        }

        impl $crate::gpu::driver::Pools for $queue {
            type Alloc = $alloc;

            fn pinned() -> &'static $crate::gpu::pinned::PinnedPool<$alloc> {
                static POOL: OnceLock<$crate::gpu::pinned::PinnedPool<$alloc>> = OnceLock::new();
                POOL.get_or_init(|| $crate::gpu::pinned::PinnedPool::new($make))
            }

            fn events() -> &'static $crate::gpu::driver::EventPool {
                static EVENTS: $crate::gpu::driver::EventPool = $crate::gpu::driver::EventPool::new();
                &EVENTS
            }
        }

        /// The process's pool of pinned memory for this platform's messages.
        fn pool() -> &'static $crate::gpu::pinned::PinnedPool<$alloc> {
            <$queue as $crate::gpu::driver::Pools>::pinned()
        }

        /// The process's pool of this platform's idle events (by owner).
        #[allow(dead_code)]
        fn events() -> &'static $crate::gpu::driver::EventPool {
            <$queue as $crate::gpu::driver::Pools>::events()
        }

        /// Counters of this platform's pinned pool (for tests and the platform's row of
        /// `gpu::PLATFORMS`).
        #[must_use]
        pub(crate) fn pool_stats() -> $crate::gpu::pinned::PoolStats {
            pool().stats()
        }
    };
}
pub(crate) use gpu_driver;

/// The stream of `frame`'s call.
fn stream<D: Driver>(frame: &Frame<'_>, capture: bool) -> Result<D::Stream, Error> {
    let raw = frame.stream()?;
    // SAFETY: XLA's stream for this call, live for the duration of the call (and the
    // result is dropped before the handler returns).
    unsafe { D::stream(raw, capture) }
}

fn header(frame: &Frame<'_>) -> Result<Header, Error> {
    let consumer_id = frame
        .attrs
        .consumer_id
        .ok_or_else(|| Error::InvalidArgument("custom call lacks the consumer_id attribute".into()))?;
    Ok(Header { consumer_id, flags: frame.attrs.flags, ordinal: frame.device, run_id: frame.run_id })
}

pub(crate) fn tap<D: Driver>(frame: &Frame<'_>, hub: &'static Hub, start: u64) -> Result<(), Error> {
    let header = header(frame)?;
    let stream = stream::<D>(frame, true)?;
    // SAFETY: the operands are XLA's device buffers of their dtypes and dims, alive until
    // the work enqueued on this stream by this call has run.
    unsafe { gpu::tap(&stream, hub, &gpu::DELIVERY, header, frame.operands()) }?;
    // The host thread's cost (enqueuing the copies); the hand-over is timed from the
    // courier's push, when the message is on the host.
    hub.timing.record_device(start, hub.timing.now());
    Ok(())
}

pub(crate) fn call<D: Driver>(frame: &Frame<'_>, hub: &'static Hub, _start: u64) -> Result<(), Error> {
    let header = header(frame)?;
    let mut outs = frame.outputs();
    let status = if frame.attrs.flags & FLAG_STATUS_OUTPUT != 0 {
        Some(outs.next().ok_or_else(|| Error::InvalidArgument("missing status result".into()))?.out_buf()?)
    } else {
        None
    };
    let outs: Vec<OutBuf> = outs.map(|b| b.out_buf()).collect::<Result<_, _>>()?;
    let stream = stream::<D>(frame, false)?;
    // SAFETY: operands and results are XLA's device buffers of their dtypes and dims,
    // alive until the work enqueued on this stream by this call has run.
    unsafe {
        gpu::call(
            &stream,
            hub,
            &gpu::DELIVERY,
            header,
            &frame.attrs,
            frame.operands(),
            &outs,
            status.as_ref(),
        )
    }
}

pub(crate) fn check_call<D: Driver>(
    frame: &Frame<'_>,
    hub: &'static Hub,
    _start: u64,
) -> Result<(), Error> {
    let mut ops = frame.operands();
    let status =
        ops.next().ok_or_else(|| Error::InvalidArgument("hostfeed_check needs a status operand".into()))?;
    let sent = ops.next();
    let stream = stream::<D>(frame, false)?;
    // SAFETY: XLA's device buffers of their dtypes and dims, alive for the call.
    unsafe { gpu::check(&stream, hub, &status, sent.as_ref()) }
}

pub(crate) fn failure<D: Driver>(
    frame: &Frame<'_>,
    hub: &'static Hub,
    _start: u64,
) -> Result<(), Error> {
    let status = frame
        .operands()
        .next()
        .ok_or_else(|| Error::InvalidArgument("hostfeed_failure needs a status operand".into()))?;
    let out = frame
        .outputs()
        .next()
        .ok_or_else(|| Error::InvalidArgument("hostfeed_failure needs a uint8 result".into()))?
        .out_buf()?;
    let stream = stream::<D>(frame, false)?;
    // SAFETY: XLA's device buffers of their dtypes and dims, alive until the work enqueued
    // by this call has run.
    unsafe { gpu::failure(&stream, hub, &gpu::DELIVERY, frame.device, &status, &out) }
}

/// What a driver's query of an event or stream answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Poll {
    /// The work before it completed.
    Done,
    /// Not yet.
    Pending,
}

/// Waits for work that usually completes within microseconds: `query` a while
/// ([`POLL_SPIN`]), then `block` (the driver's sleeping wait).
///
/// # Errors
/// What `query` or `block` report.
pub(crate) fn poll_then_block(
    query: impl Fn() -> Result<Poll, Error>,
    block: impl FnOnce() -> Result<(), Error>,
) -> Result<(), Error> {
    let start = Instant::now();
    loop {
        match query()? {
            Poll::Done => return Ok(()),
            Poll::Pending if start.elapsed() < POLL_SPIN => std::hint::spin_loop(),
            Poll::Pending => return block(),
        }
    }
}

/// The error of a driver call that failed because the stream was being captured into a
/// graph (`graph`: "a CUDA graph", "a HIP graph").
#[must_use]
pub(crate) fn captured(graph: &str) -> Error {
    Error::Internal(format!(
        "hostfeed's custom calls cannot be captured into {graph} (they are not \
         command-buffer compatible); XLA captured one anyway"
    ))
}

/// Idle events (driver handles as addresses) by the address of what they belong to (a
/// CUDA context, a HIP device): a tap records one after its copies, and it comes back
/// when the courier has waited for it (re-recording an event is allowed whatever its
/// state).
pub(crate) struct EventPool(Mutex<Option<std::collections::HashMap<usize, Vec<usize>>>>);

impl EventPool {
    /// An empty pool.
    #[must_use]
    pub(crate) const fn new() -> Self {
        EventPool(Mutex::new(None))
    }

    /// An idle event of `owner`, if there is one.
    pub(crate) fn take(&self, owner: usize) -> Option<usize> {
        lock(&self.0).as_mut()?.get_mut(&owner)?.pop()
    }

    /// Back to the pool: `event` of `owner`, idle.
    pub(crate) fn give(&self, owner: usize, event: usize) {
        lock(&self.0).get_or_insert_with(Default::default).entry(owner).or_default().push(event);
    }

    /// Forgets the events of `owner` (gone: its events died with it).
    pub(crate) fn forget(&self, owner: usize) {
        if let Some(events) = lock(&self.0).as_mut() {
            events.remove(&owner);
        }
    }
}

impl Default for EventPool {
    fn default() -> Self {
        Self::new()
    }
}

/// The operations on one call's stream, and on its events, in which the drivers differ;
/// [`OnStream`] makes a [`Stream`] of them.
pub(crate) trait StreamOps: Pools + 'static {
    /// The owner of this stream's events (its CUDA context, its HIP device), as an address.
    fn owner(&self) -> usize;

    /// Enqueues a copy of `n` bytes from `src` to `dst`, the direction inferred from the
    /// pointers (unified addressing: either may be device or pinned host memory).
    ///
    /// # Errors
    /// The copy could not be enqueued.
    ///
    /// # Safety
    /// As [`Stream::copy_to_host`] or [`Stream::copy_to_device`], by direction.
    unsafe fn copy(&self, dst: *mut u8, src: *const u8, n: usize) -> Result<(), Error>;

    /// Records `event` (one of this stream's owner, from [`StreamOps::create_event`]).
    ///
    /// # Errors
    /// The event could not be recorded.
    fn record_on(&self, event: usize) -> Result<(), Error>;

    /// Whether everything enqueued so far has completed.
    ///
    /// # Errors
    /// The device reported an error.
    fn query(&self) -> Result<Poll, Error>;

    /// Sleeps until everything enqueued so far has completed.
    ///
    /// # Errors
    /// The device reported an error.
    fn block(&self) -> Result<(), Error>;

    /// A new event of this stream's owner (current on this thread), which a courier can
    /// sleep on (blocking synchronisation, no timing).
    ///
    /// # Errors
    /// The driver refused.
    fn create_event(&self) -> Result<usize, Error>;

    /// Readies the calling thread (a courier) to wait on events of `owner`.
    ///
    /// # Errors
    /// The driver refused.
    fn enter(owner: usize) -> Result<(), Error>;

    /// Whether `event` (recorded) completed.
    ///
    /// # Errors
    /// The device reported an error.
    fn event_query(event: usize) -> Result<Poll, Error>;

    /// Sleeps until `event` (recorded) completed.
    ///
    /// # Errors
    /// The device reported an error.
    fn event_block(event: usize) -> Result<(), Error>;
}

/// A driver's pools (declared by [`gpu_driver!`]): pinned memory and idle events.
pub(crate) trait Pools {
    /// The driver's allocator of pinned host memory.
    type Alloc: PinnedAlloc + 'static;

    /// The process's pool of pinned memory for the driver's messages.
    fn pinned() -> &'static PinnedPool<Self::Alloc>;

    /// The process's pool of the driver's idle events.
    fn events() -> &'static EventPool;
}

/// The [`Stream`] of a driver's [`StreamOps`].
pub(crate) struct OnStream<S: StreamOps>(pub(crate) S);

/// An event recorded on a stream of driver `S`, back to its pool when dropped.
pub(crate) struct Pooled<S: StreamOps> {
    raw: usize,
    owner: usize,
    driver: std::marker::PhantomData<fn() -> S>,
}

impl<S: StreamOps> Completion for Pooled<S> {
    fn wait(&self) -> Result<(), Error> {
        S::enter(self.owner)?;
        poll_then_block(|| S::event_query(self.raw), || S::event_block(self.raw))
    }
}

impl<S: StreamOps> Drop for Pooled<S> {
    fn drop(&mut self) {
        // Re-recording an event is allowed whatever its state.
        S::events().give(self.owner, self.raw);
    }
}

impl<S: StreamOps> Stream for OnStream<S> {
    unsafe fn copy_to_host(&self, dst: *mut u8, src: *const u8, n: usize) -> Result<(), Error> {
        // SAFETY: forwarded caller contract.
        unsafe { self.0.copy(dst, src, n) }
    }

    unsafe fn copy_to_device(&self, dst: *mut u8, src: *const u8, n: usize) -> Result<(), Error> {
        // SAFETY: forwarded caller contract.
        unsafe { self.0.copy(dst, src, n) }
    }

    fn record(&self) -> Result<Box<dyn Completion>, Error> {
        let owner = self.0.owner();
        let raw = match S::events().take(owner) {
            Some(e) => e,
            None => self.0.create_event()?,
        };
        let event = Pooled::<S> { raw, owner, driver: std::marker::PhantomData };
        self.0.record_on(raw)?;
        Ok(Box::new(event))
    }

    fn synchronize(&self) -> Result<(), Error> {
        // Work just enqueued (a call's operand copies) usually completes within
        // microseconds: look a while before sleeping (a wake-up costs tens of them).
        poll_then_block(|| self.0.query(), || self.0.block())
    }

    fn host_buffer(&self, len: usize) -> Result<HostBuffer, Error> {
        Ok(HostBuffer::pinned(S::pinned().take(len)?, len))
    }
}

#[cfg(test)]
mod tests;
