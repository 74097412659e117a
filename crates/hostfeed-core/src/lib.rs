//! `hostfeed-core`: the native core of hostfeed, without Python.
//!
//! XLA FFI handlers copy tapped operands into a byte-bounded queue; a consumer thread (the
//! Python binding's, `bindings/python`) hands them to Python in batches. Nothing here
//! links Python or JAX: `cargo test -p hostfeed-core` runs anywhere.
//!
//! The modules live in four rooms, folders whose `mod.rs` says what each holds: `ffi`
//! (the XLA FFI boundary), `host` (the transport every platform shares), `gpu` (device
//! streams, with `gpu/cuda`) and `record` (the Zarr recorder). The module map, the one
//! inventory of the Rust and Python modules, is `ARCHITECTURE.md` ("Where things live") at
//! the repository root.
//!
//! The modules are private and their items `pub(crate)`; what the binding crate and the
//! tests use is re-exported below, grouped by room.

#![cfg_attr(loom, allow(dead_code, unused_imports, unreachable_pub, missing_docs))]

#[cfg(not(loom))]
mod error;
#[cfg(not(loom))]
mod ffi;
#[cfg(not(loom))]
mod gpu;
mod host;
#[cfg(not(loom))]
mod record;

#[cfg(not(loom))]
pub use error::{Error, RecordError};

// ---- ffi: the handlers and the C API types the binding registers ----------------------
#[cfg(not(loom))]
pub use ffi::c_api::{
    constant_table, dtype, layout_table, minimum_table, XLA_FFI_CallFrame, XLA_FFI_Error, XLA_FFI_Handler,
};
#[cfg(not(loom))]
pub use ffi::handlers::{
    FLAG_EAGER, FLAG_GPU, FLAG_SHARD, FLAG_STATUS_OUTPUT, FLAG_SYNC_TAP, HANDLERS as CPU_HANDLERS,
};

// ---- host: buffers, messages, the queue, replies, the hub -----------------------------
#[cfg(not(loom))]
pub use host::buffer::{
    pool_idle_bytes, pool_limit, set_pool_limit, HostBuffer, PoolReservation, DEFAULT_POOL_BYTES,
    MAX_RESERVATION,
};
#[cfg(not(loom))]
pub use host::histogram::{Histogram, Timing};
#[cfg(not(loom))]
pub use host::hub::{
    global as hub, in_consumer_thread, Abandoned, Batch, Consume, Hub, StopOutcome, TryPush, Worker,
    DEFAULT_MAX_QUEUE_BYTES, DEFAULT_STOP_TIMEOUT,
};
#[cfg(not(loom))]
pub use host::interrupt::{install as install_interrupt_handlers, remove as remove_interrupt_handlers};
#[cfg(not(loom))]
pub use host::message::{gather, ArrayMeta, ArrayTable, DimTable, Message, Operand};
#[cfg(not(loom))]
pub use host::portable;
pub use host::queue::{spin_until, PushError, Pushed, Queue, Reclaimed};
pub use host::reply::{NoReply, OutBuf, ReplySlot};
pub use host::stats::{Snapshot, Stats};
pub use host::sync::lock;

// ---- gpu: the delivery of GPU messages and the CUDA platform ---------------------------
#[cfg(not(loom))]
pub use gpu::cuda::{
    driver_library as cuda_driver_library, driver_path as cuda_driver_path,
    driver_version as cuda_driver_version, pool_stats as cuda_pool_stats,
    same_driver_as_xla as cuda_same_driver_as_xla, HANDLERS as CUDA_HANDLERS,
};
#[cfg(not(loom))]
pub use gpu::hip::{
    pool_stats as rocm_pool_stats, runtime_library as rocm_runtime_library,
    runtime_path as rocm_runtime_path, runtime_version as rocm_runtime_version, HANDLERS as ROCM_HANDLERS,
};
#[cfg(not(loom))]
pub use gpu::pinned::PoolStats;
#[cfg(not(loom))]
pub use gpu::{device_key as gpu_device_key, Delivery, DELIVERY as GPU_DELIVERY};

// ---- record: the recorder and its sinks ------------------------------------------------
#[cfg(not(loom))]
pub use record::arrays::ArrayHandle;
#[cfg(not(loom))]
pub use record::recorder::{Budget, Mode, Options, Recorder, RecorderStats};
#[cfg(not(loom))]
pub use record::sinks::{sinks, Sink, Sinks};
#[cfg(not(loom))]
pub use record::trace::{
    install_write_tracer, open_recorders, set_write_tracing, write_tracing, WriteTracer,
};
#[cfg(not(loom))]
pub use record::zarr::Codec;

/// In a child process created by `fork` (where no thread of the parent exists): the hub
/// starts fresh and stopped, and every recorder opened before the fork counts as closed
/// here, without touching its store (which the parent still writes and holds locked).
#[cfg(not(loom))]
pub fn after_fork_in_child() {
    host::hub::global().after_fork_in_child();
    record::recorder::after_fork_in_child();
}
