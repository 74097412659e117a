//! Lock-free receiver counters. Written by the queue (under its lock, so the values are
//! mutually consistent at every release point) and read without locking for snapshots.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Counters describing the traffic through the receive queue.
#[derive(Default)]
pub struct Stats {
    pub messages_enqueued: AtomicU64,
    pub bytes_enqueued: AtomicU64,
    pub messages_processed: AtomicU64,
    pub bytes_processed: AtomicU64,
    pub queued_bytes: AtomicU64,
    pub peak_queued_bytes: AtomicU64,
    pub producer_blocked_ns: AtomicU64,
    pub producer_blocked_count: AtomicU64,
}

/// A plain copy of [`Stats`] at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub messages_enqueued: u64,
    pub bytes_enqueued: u64,
    pub messages_processed: u64,
    pub bytes_processed: u64,
    pub queued_bytes: u64,
    pub peak_queued_bytes: u64,
    pub producer_blocked_ns: u64,
    pub producer_blocked_count: u64,
}

impl Stats {
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
    /// that measure one phase).
    pub fn reset_peak(&self) {
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
