//! Taps and calls on a GPU, written against a [`Stream`] (the device's work queue) so that
//! the logic is the same for any GPU platform and is tested with plain `cargo test`
//! against a fake stream; `cuda/` implements [`Stream`] with the CUDA driver API.
//!
//! ## Taps never make the device wait
//!
//! A tap handler runs on XLA's host thread, which *enqueues* the device's work; the
//! operands are produced by work still queued. So the handler:
//!
//! 1. lays the message out ([`message::layout`](crate::host::message::layout)) in one pinned buffer from the pool;
//! 2. reserves the message's bytes against the receiver's byte bound ([`Delivery::reserve`]),
//!    waiting (on the host thread: the device goes on with the work already enqueued)
//!    while this device's messages in flight plus the queue's would exceed it;
//! 3. enqueues an asynchronous device-to-host copy of each operand into the buffer, then
//!    records an *event* on the stream (a marker that completes when the copies have);
//! 4. hands (event, message) to the device's *courier* and returns.
//!
//! (The message holds the GPU's ordinal and the `FLAG_GPU` bit; Python gets the device as
//! [`device_key`], distinct from CPU devices.)
//!
//! The courier, a thread per device, waits for each event in turn and pushes the message
//! onto the queue. So the device never synchronises with the host, not even with a host
//! function (which would stall the stream until the driver's callback thread ran it): it
//! only runs the copies among its other work. The courier takes parcels in the order the
//! handler made them, which is the device's program order (the ordered-effect token
//! orders hostfeed's custom calls, on one stream or several), so each device's messages
//! reach the queue in order; devices interleave. The pinned buffer goes back to its pool
//! when the consumer drops the message (Python let go of the numpy views).
//!
//! Memory: what is reserved (in flight) plus what is queued stays within the bound per
//! device, as on CPU; a message alone may exceed it when nothing else is held. A courier
//! may still wait for queue space if CPU producers filled the queue meanwhile; the device
//! does not notice.
//!
//! `barrier_wait`, stop and exit first wait for the couriers to deliver what they were
//! handed ([`Delivery::wait_delivered`]): once JAX has seen the computations finish, every
//! event is complete, so this is quick.
//!
//! ## Calls block, by nature
//!
//! A call copies its operands to the host and synchronises the stream (its results are
//! needed before anything after it can run), waits for the courier to deliver the taps
//! before it (per-device order), enqueues the request and waits for the reply (shared
//! with CPU: [`await_reply`](crate::host::call::await_reply)), which the consumer writes
//! into a pinned *staging* buffer; the handler then enqueues host-to-device copies of the
//! staging buffer into the results, in stream order, and hands the buffer to the courier,
//! which returns it to the pool once an event after the copies completed. A failing call
//! returns the same error as on CPU (or, with a status result, zeros and the failure's
//! ticket).
//!
//! ## Errors
//!
//! If enqueuing a copy or recording an event fails, the handler synchronises the stream
//! before the buffer can be reused (copies already enqueued might still write it) and
//! fails the computation. If even synchronising fails (the device is in an error state),
//! the buffer is leaked rather than reused; likewise when a courier's event reports an
//! error (the tap is then lost, with a note).
//!
//! ## Platforms
//!
//! [`PLATFORMS`] is the one table of GPU platforms, a row each: its names, its handlers and
//! its driver's functions (check, version, path, pinned pool counters). The binding
//! registers and reports every platform from it. Adding a platform is a driver folder (as
//! `hip/`: its `StreamOps`, pinned allocator and library loading, declared with `gpu_driver!`),
//! its `mod` line below and its row in [`PLATFORMS`].
//!
//! No Python and no CUDA here. What every driver shares is in `driver.rs`; `cuda/` and
//! `hip/` (ROCm) hold only the drivers' own parts.

pub(crate) mod cuda;
mod delivery;
pub(crate) mod driver;
pub(crate) mod hip;
mod ops;
pub(crate) mod pinned;
mod stream;
#[cfg(test)]
mod tests;

use crate::ffi::c_api::XLA_FFI_Handler;
use pinned::PoolStats;

pub(crate) use delivery::Job;
pub use delivery::{Delivery, DELIVERY};
pub(crate) use ops::{call, check, failure, tap, Header};
pub use stream::device_key;
pub(crate) use stream::{Completion, Stream};

/// One GPU platform hostfeed has handlers for: a row of [`PLATFORMS`].
pub struct Platform {
    /// hostfeed's (and JAX's) name of the platform: `"cuda"`, `"rocm"`.
    pub name: &'static str,
    /// The platform XLA registers the handlers under (`jax.ffi.register_ffi_target(...,
    /// platform=...)`): `"CUDA"`, `"ROCM"`.
    pub xla_platform: &'static str,
    /// The platform's handlers by XLA FFI target name (the same names as on CPU).
    pub handlers: &'static [(&'static str, XLA_FFI_Handler)],
    /// Why the driver cannot be used (no library, a missing function, ...), as the error;
    /// loads the driver library if present but does not initialise the driver.
    pub driver_error: fn() -> Result<(), String>,
    /// The driver's version, or `None` without a usable driver; initialises the driver.
    pub driver_version: fn() -> Option<i32>,
    /// The file the driver's functions come from, or `None` without a driver library.
    pub driver_path: fn() -> Option<String>,
    /// Counters of the platform's pool of pinned memory.
    pub pool_stats: fn() -> PoolStats,
}

/// Every GPU platform, a row each (see the module documentation).
pub static PLATFORMS: &[Platform] = &[
    Platform {
        name: "cuda",
        xla_platform: "CUDA",
        handlers: cuda::HANDLERS,
        driver_error: cuda::driver_error,
        driver_version: cuda::driver_version,
        driver_path: cuda::driver_path,
        pool_stats: cuda::pool_stats,
    },
    Platform {
        name: "rocm",
        xla_platform: "ROCM",
        handlers: hip::HANDLERS,
        driver_error: hip::runtime_library,
        driver_version: hip::runtime_version,
        driver_path: hip::runtime_path,
        pool_stats: hip::pool_stats,
    },
];
