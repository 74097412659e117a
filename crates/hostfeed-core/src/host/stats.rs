//! Lock-free receiver counters. Written by the queue (under its lock, so the values are
//! mutually consistent at every release point) and read without locking for snapshots.
//!
//! Because every writer holds the queue lock, the hot-path updates are plain atomic loads
//! and stores (`record_push`, `record_complete`) rather than read-modify-write
//! instructions (a `lock`-prefixed instruction each on x86, several per tap).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Counters describing the traffic through the receive queue.
#[derive(Default)]
pub struct Stats {
    pub(crate) messages_enqueued: AtomicU64,
    pub(crate) bytes_enqueued: AtomicU64,
    pub(crate) messages_processed: AtomicU64,
    pub(crate) bytes_processed: AtomicU64,
    pub(crate) queued_bytes: AtomicU64,
    pub(crate) peak_queued_bytes: AtomicU64,
    pub(crate) producer_blocked_ns: AtomicU64,
    pub(crate) producer_blocked_count: AtomicU64,
}

/// A plain copy of [`Stats`] at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Messages pushed.
    pub messages_enqueued: u64,
    /// Their bytes.
    pub bytes_enqueued: u64,
    /// Messages the consumer finished.
    pub messages_processed: u64,
    /// Their bytes.
    pub bytes_processed: u64,
    /// Bytes held now.
    pub queued_bytes: u64,
    /// Most bytes held at once since the last reset.
    pub peak_queued_bytes: u64,
    pub(crate) producer_blocked_ns: u64,
    /// Pushes that waited for space.
    pub producer_blocked_count: u64,
}

/// `counter += n` for a counter whose writers are serialised by a lock.
fn bump(counter: &AtomicU64, n: u64) {
    counter.store(counter.load(Relaxed).wrapping_add(n), Relaxed);
}

impl Stats {
    /// Counts one pushed message of `bytes`; `held` is the bytes held after it.
    /// Call with the queue lock held (the only writers are serialised by it).
    pub(crate) fn record_push(&self, bytes: u64, held: u64) {
        bump(&self.messages_enqueued, 1);
        bump(&self.bytes_enqueued, bytes);
        self.queued_bytes.store(held, Relaxed);
        if held > self.peak_queued_bytes.load(Relaxed) {
            self.peak_queued_bytes.store(held, Relaxed);
        }
    }

    /// Counts `count` completed messages of `bytes` in all; `held` is the bytes held after.
    /// Call with the queue lock held.
    pub(crate) fn record_complete(&self, count: u64, bytes: u64, held: u64) {
        bump(&self.messages_processed, count);
        bump(&self.bytes_processed, bytes);
        self.queued_bytes.store(held, Relaxed);
    }

    /// Reads every counter (each individually atomic).
    #[must_use]
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            messages_enqueued: self.messages_enqueued.load(Relaxed),
            bytes_enqueued: self.bytes_enqueued.load(Relaxed),
            messages_processed: self.messages_processed.load(Relaxed),
            bytes_processed: self.bytes_processed.load(Relaxed),
            queued_bytes: self.queued_bytes.load(Relaxed),
            peak_queued_bytes: self.peak_queued_bytes.load(Relaxed),
            producer_blocked_ns: self.producer_blocked_ns.load(Relaxed),
            producer_blocked_count: self.producer_blocked_count.load(Relaxed),
        }
    }

    /// Resets the peak gauge to the current queued bytes (used by benchmarks and tests
    /// that measure one phase). Call with the queue lock held (`Queue::reset_peak`).
    pub(crate) fn reset_peak(&self) {
        self.peak_queued_bytes.store(self.queued_bytes.load(Relaxed), Relaxed);
    }
}

impl Snapshot {
    /// `(name, value)` pairs in a fixed order, for conversion to a Python dict.
    #[must_use]
    pub fn fields(&self) -> [(&'static str, u64); 8] {
        [
            ("messages_enqueued", self.messages_enqueued),
            ("bytes_enqueued", self.bytes_enqueued),
            ("messages_processed", self.messages_processed),
            ("bytes_processed", self.bytes_processed),
            ("queued_bytes", self.queued_bytes),
            ("peak_queued_bytes", self.peak_queued_bytes),
            ("producer_blocked_ns", self.producer_blocked_ns),
            ("producer_blocked_count", self.producer_blocked_count),
        ]
    }
}
