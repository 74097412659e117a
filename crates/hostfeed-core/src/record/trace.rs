//! Writes on a profiler's timeline: while a trace is collected (`jax.profiler`), each chunk
//! write of a writer thread runs inside a trace event on that thread. The core knows no
//! profiler: the bindings install a [`WriteTracer`] (which enters and exits a trace event
//! around the write) and keep the [`write_tracing`] flag current. Not tracing, a write
//! costs one relaxed atomic load.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::OnceLock;

/// Runs writes inside trace events (the bindings' implementation: a `TraceMe`).
pub trait WriteTracer: Send + Sync + 'static {
    /// Runs `write`, a write of `bytes` bytes of record `name`'s chunk `chunk` on the
    /// calling writer thread, inside a trace event; runs it exactly once, traced or not.
    /// The caller holds no lock of the crate.
    fn traced(&self, name: &str, chunk: u64, bytes: usize, write: &mut (dyn FnMut() + Send));
}

static TRACER: OnceLock<Box<dyn WriteTracer>> = OnceLock::new();
static TRACING: AtomicBool = AtomicBool::new(false);
/// Recorders of this process opened and not yet closed.
static OPEN: AtomicUsize = AtomicUsize::new(0);

/// Installs the tracer (once per process; later calls are ignored). Returns whether this
/// call installed it.
pub fn install_write_tracer(tracer: Box<dyn WriteTracer>) -> bool {
    TRACER.set(tracer).is_ok()
}

/// Says whether a trace is being collected: while it is, writes go through the tracer.
pub fn set_write_tracing(on: bool) {
    TRACING.store(on, Ordering::Relaxed);
}

/// Whether writes go through the tracer now.
#[must_use]
pub fn write_tracing() -> bool {
    TRACING.load(Ordering::Relaxed)
}

/// Recorders of this process open now (the bindings ask whether the flag needs keeping).
#[must_use]
pub fn open_recorders() -> usize {
    OPEN.load(Ordering::SeqCst)
}

pub(crate) fn opened() {
    OPEN.fetch_add(1, Ordering::SeqCst);
}

pub(crate) fn closed() {
    // Never below zero (a recorder of the parent closed in a forked child is not counted).
    let _ = OPEN.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
}

/// In a forked child: no recorder of the parent is open here, and no trace is known.
pub(crate) fn after_fork_in_child() {
    OPEN.store(0, Ordering::SeqCst);
    TRACING.store(false, Ordering::Relaxed);
}

/// Runs `write` (record `name`'s chunk `chunk`, `bytes` bytes), inside a trace event while
/// tracing.
pub(crate) fn traced_write<R: Send>(
    name: &str,
    chunk: u64,
    bytes: usize,
    write: impl FnOnce() -> R + Send,
) -> R {
    if !TRACING.load(Ordering::Relaxed) {
        return write();
    }
    let Some(tracer) = TRACER.get() else { return write() };
    let mut write = Some(write);
    let mut out = None;
    tracer.traced(name, chunk, bytes, &mut || {
        if let Some(w) = write.take() {
            out = Some(w());
        }
    });
    match (out, write) {
        (Some(o), _) => o,
        // A tracer that broke its promise: the write still happens.
        (None, Some(w)) => w(),
        (None, None) => unreachable!("a write that ran has a result"),
    }
}
