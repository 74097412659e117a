//! `hostfeed-core`: the native core of hostfeed, without Python.
//!
//! XLA FFI handlers copy tapped operands into a byte-bounded queue; a consumer thread (the
//! Python binding's, `bindings/python`) hands them to Python in batches. Nothing here
//! links Python or JAX: `cargo test -p hostfeed-core` runs anywhere.
//!
//! The modules live in four rooms, folders whose `mod.rs` says what each holds: `ffi`
//! (the XLA FFI boundary), `host` (the transport every platform shares), `gpu` (device
//! streams, with `gpu/cuda` and `gpu/hip`, and the table of GPU platforms) and `record`
//! (the Zarr recorder). The module map, the one inventory of the Rust and Python modules,
//! is `ARCHITECTURE.md` ("Where things live") at the repository root.
//!
//! The modules are private and their items `pub(crate)`; what the binding crate and the
//! tests use is re-exported below, grouped by room.

#![cfg_attr(loom, allow(dead_code, unused_imports, unreachable_pub, missing_docs))]

/// Compiles its items only without `--cfg loom` (as tokio's `cfg_not_loom!`): the loom
/// build (`RUSTFLAGS="--cfg loom"`) checks the hand-made synchronisation alone, the parts
/// of `host` that `host/mod.rs` names, and nothing that needs the rest.
macro_rules! cfg_not_loom {
    ($($item:item)*) => {
        $( #[cfg(not(loom))] $item )*
    };
}

mod host;

// ---- host: the parts the loom models check, compiled in every build -------------------
pub use host::queue::{PushError, Pushed, Queue, Reclaimed};
pub use host::reply::{NoReply, OutBuf, ReplySlot};
pub use host::stats::{Snapshot, Stats};
pub use host::sync::{lock, spin_until};

cfg_not_loom! {
    mod error;
    mod ffi;
    mod gpu;
    mod record;

    pub use error::{Error, RecordError};

    // ---- ffi: the handlers and the C API types the binding registers ------------------
    pub use ffi::c_api::{
        constant_table, dtype, layout_table, minimum_table, XLA_FFI_CallFrame, XLA_FFI_Error, XLA_FFI_Handler,
    };
    pub use ffi::handlers::HANDLERS as CPU_HANDLERS;
    pub use ffi::summary_handlers::HANDLERS as CPU_SUMMARY_HANDLERS;

    // ---- host: buffers, messages and their flags, the hub -----------------------------
    pub use host::buffer::{
        pool_idle_bytes, pool_limit, set_pool_limit, HostBuffer, PoolReservation, DEFAULT_POOL_BYTES,
        MAX_RESERVATION,
    };
    pub use host::histogram::{Histogram, Timing};
    pub use host::hub::{
        global as hub, in_consumer_thread, Abandoned, Batch, Consume, Hub, StopOutcome, TryPush, Worker,
        DEFAULT_MAX_QUEUE_BYTES, DEFAULT_STOP_TIMEOUT,
    };
    pub use host::call::set_inline_calls;
    pub use host::buffer::{
        set_step_bytes as set_cpu_share_step_bytes, set_stream_bytes as set_cpu_share_stream_bytes,
        STEP_BYTES as CPU_SHARE_STEP_BYTES, STREAM_BYTES as CPU_SHARE_STREAM_BYTES,
    };
    pub use host::interrupt::{
        counts as signal_counts, install as install_interrupt_handlers, on_initial_thread, open_wake_pipe,
        remove as remove_interrupt_handlers, signalled_since, wait_for_signal,
    };
    pub use host::message::{
        gather, recorded_device, ArrayMeta, ArrayTable, DimTable, Message, Operand, FLAG_EAGER, FLAG_GPU,
        FLAG_SHARD, FLAG_STATUS_OUTPUT, FLAG_SYNC_TAP, PORTABLE_ID_BITS, PORTABLE_KEY_BASE,
    };
    pub use host::portable;

    // ---- gpu: the delivery of GPU messages and the table of GPU platforms --------------
    pub use gpu::pinned::PoolStats;
    pub use gpu::{
        device_key as gpu_device_key, Delivery, Platform as GpuPlatform, DELIVERY as GPU_DELIVERY,
        PLATFORMS as GPU_PLATFORMS,
    };

    // ---- record: the recorder and its sinks --------------------------------------------
    pub use record::arrays::ArrayHandle;
    pub use record::common::{Budget, Mode, Options};
    pub use record::backend::{is_object_url, store_schemes, Storage, StorageLock};
    pub use record::storelock::LOCK_FILE;
    pub use record::recorder::{take_late_drops, LateDrop, Recorder, RecorderStats};
    pub use record::sinks::{sinks, RoutedBatch, Sink, Sinks};
    pub use record::window::WindowOptions;
    pub use record::trace::{
        install_write_tracer, open_recorders, set_write_tracing, write_tracing, WriteTracer,
    };
    pub use record::zarr::Codec;

    /// In a child process created by `fork` (where no thread of the parent exists): the hub
    /// starts fresh and stopped, and every recorder opened before the fork counts as closed
    /// here, without touching its store (which the parent still writes and holds locked).
    pub fn after_fork_in_child() {
        host::hub::global().after_fork_in_child();
        record::sinks::after_fork_in_child();
    }
}
