//! The byte-bounded receive queue: many producers (XLA threads, one or more per device),
//! one consumer.
//!
//! * A message's bytes count against the bound from the moment it is pushed until the
//!   consumer reports it processed ([`Queue::complete`]), so the bound limits the memory
//!   held by messages the host has not finished with, including the batch in flight.
//! * A producer whose message would exceed the bound blocks until enough bytes are
//!   completed. A message larger than the whole bound is admitted once nothing else is
//!   held, rather than deadlocking.
//! * One FIFO for all producers: messages are handed to the consumer in push order, which
//!   implies per-device FIFO order.
//! * Every push gets a sequence number; [`Queue::wait_processed`] is the barrier primitive.
//!
//! No Python here: this module is tested with plain `cargo test`.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::stats::Stats;

/// Why a push did not happen; the item is handed back.
#[derive(Debug, PartialEq, Eq)]
pub enum PushError<T> {
    /// The queue was closed for good ([`Queue::close`]).
    Closed(T),
    /// The item must wait for space but no consumer is active to make any: start one
    /// and push again.
    NoConsumer(T),
}

/// A successful push.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pushed {
    /// The item's sequence number.
    pub seq: u64,
    /// Whether a consumer was active at the time; if not, the caller must start one.
    pub consumer_active: bool,
}

struct Inner<T> {
    items: VecDeque<(usize, T)>,
    /// Bytes pushed and not yet completed (queued plus in flight).
    held_bytes: usize,
    /// Sequence number of the next push (= number of pushes so far).
    enqueued: u64,
    /// Number of messages completed.
    processed: u64,
    /// The consumer should exit once `items` is empty.
    drain_and_stop: bool,
    /// A consumer is running (between `clear_stop` and `pop_batch` returning `false`).
    consumer_active: bool,
    /// The consumer sleeps on `not_empty` (so a push must wake it; otherwise the wake-up
    /// system call is skipped).
    consumer_sleeping: bool,
    /// Threads sleeping in `wait_processed`.
    progress_waiters: usize,
    closed: bool,
}

/// See the module documentation.
pub struct Queue<T> {
    inner: Mutex<Inner<T>>,
    not_empty: Condvar,
    space_freed: Condvar,
    progress: Condvar,
    bound: AtomicUsize,
    /// Mirror of `items.len()`, readable without the lock (for the consumer's spin).
    pending: AtomicUsize,
    /// How long an idle consumer polls `pending` before sleeping on the condvar.
    spin: Duration,
    has_waiting_producers: AtomicBool,
    pub stats: Stats,
}

fn lock<U>(m: &Mutex<U>) -> MutexGuard<'_, U> {
    // A panic while holding this lock can only come from a bug in this module (no user
    // code runs under it); the counters stay consistent, so recover the guard.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<T> Queue<T> {
    /// A queue holding at most `bound_bytes` bytes (see the module documentation).
    #[must_use]
    pub fn new(bound_bytes: usize) -> Self {
        Queue {
            inner: Mutex::new(Inner {
                items: VecDeque::new(),
                held_bytes: 0,
                enqueued: 0,
                processed: 0,
                drain_and_stop: false,
                consumer_active: false,
                consumer_sleeping: false,
                progress_waiters: 0,
                closed: false,
            }),
            not_empty: Condvar::new(),
            space_freed: Condvar::new(),
            progress: Condvar::new(),
            bound: AtomicUsize::new(bound_bytes.max(1)),
            pending: AtomicUsize::new(0),
            spin: Duration::ZERO,
            has_waiting_producers: AtomicBool::new(false),
            stats: Stats::default(),
        }
    }

    /// Lets an idle consumer poll for up to `spin` before sleeping. Waking a sleeping
    /// thread costs tens of microseconds (more on virtual machines); a short poll keeps
    /// the consumer awake through a burst of taps or a loop of `call`s.
    #[must_use]
    pub fn with_spin(mut self, spin: Duration) -> Self {
        self.spin = spin;
        self
    }

    /// The current byte bound.
    pub fn bound(&self) -> usize {
        self.bound.load(Ordering::Relaxed)
    }

    /// Changes the byte bound; producers blocked on the old bound re-check at once.
    pub fn set_bound(&self, bound_bytes: usize) {
        let _g = lock(&self.inner);
        self.bound.store(bound_bytes.max(1), Ordering::Relaxed);
        self.space_freed.notify_all();
    }

    /// Pushes `item` worth `bytes`, blocking while it would exceed the bound.
    ///
    /// # Errors
    /// [`PushError::Closed`] once [`Queue::close`] was called; [`PushError::NoConsumer`]
    /// when it would have to wait but no consumer is active.
    pub fn push(&self, item: T, bytes: usize) -> Result<Pushed, PushError<T>> {
        self.push_inner(item, bytes, true)
    }

    /// Like [`Queue::push`] but never waits for space: the item is admitted over the bound.
    /// For producers that the consumer itself waits on (a tap issued from inside a host
    /// callback), where waiting would deadlock.
    ///
    /// # Errors
    /// [`PushError::Closed`] once [`Queue::close`] was called.
    pub fn push_over_bound(&self, item: T, bytes: usize) -> Result<Pushed, PushError<T>> {
        self.push_inner(item, bytes, false)
    }

    fn push_inner(&self, item: T, bytes: usize, may_wait: bool) -> Result<Pushed, PushError<T>> {
        let mut g = lock(&self.inner);
        let mut blocked_since: Option<Instant> = None;
        loop {
            if g.closed {
                return Err(PushError::Closed(item));
            }
            let bound = self.bound.load(Ordering::Relaxed);
            if !may_wait || g.held_bytes == 0 || g.held_bytes.saturating_add(bytes) <= bound {
                break;
            }
            if !g.consumer_active {
                return Err(PushError::NoConsumer(item));
            }
            if blocked_since.is_none() {
                blocked_since = Some(Instant::now());
                self.stats.producer_blocked_count.fetch_add(1, Ordering::Relaxed);
            }
            self.has_waiting_producers.store(true, Ordering::Relaxed);
            g = self.space_freed.wait(g).unwrap_or_else(PoisonError::into_inner);
        }
        if let Some(t0) = blocked_since {
            let ns = u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX);
            self.stats.producer_blocked_ns.fetch_add(ns, Ordering::Relaxed);
        }
        let seq = g.enqueued;
        g.enqueued += 1;
        g.held_bytes += bytes;
        g.items.push_back((bytes, item));
        self.pending.store(g.items.len(), Ordering::Release);
        let held = g.held_bytes as u64;
        self.stats.messages_enqueued.fetch_add(1, Ordering::Relaxed);
        self.stats.bytes_enqueued.fetch_add(bytes as u64, Ordering::Relaxed);
        self.stats.queued_bytes.store(held, Ordering::Relaxed);
        self.stats.peak_queued_bytes.fetch_max(held, Ordering::Relaxed);
        let wake = g.consumer_sleeping;
        let consumer_active = g.consumer_active;
        drop(g);
        if wake {
            self.not_empty.notify_one();
        }
        Ok(Pushed { seq, consumer_active })
    }

    /// Moves up to `max` messages into `out` (appending `(bytes, item)`), waiting until at
    /// least one is available. Returns `false`, with nothing moved, when the queue is empty
    /// and the consumer was asked to stop ([`Queue::request_stop`]) or the queue is closed.
    pub fn pop_batch(&self, max: usize, out: &mut Vec<(usize, T)>) -> bool {
        if !self.spin.is_zero() {
            spin_until(self.spin, || self.pending.load(Ordering::Acquire) != 0);
        }
        let mut g = lock(&self.inner);
        while g.items.is_empty() {
            if g.drain_and_stop || g.closed {
                g.consumer_active = false;
                drop(g);
                // Producers waiting for space must now see that nobody will make any.
                self.space_freed.notify_all();
                return false;
            }
            g.consumer_sleeping = true;
            g = self.not_empty.wait(g).unwrap_or_else(PoisonError::into_inner);
            g.consumer_sleeping = false;
        }
        let n = g.items.len().min(max.max(1));
        out.extend(g.items.drain(..n));
        self.pending.store(g.items.len(), Ordering::Release);
        true
    }

    /// Reports `count` popped messages totalling `bytes` as processed: frees their bytes
    /// and wakes blocked producers and barrier waiters.
    pub fn complete(&self, count: u64, bytes: usize) {
        let mut g = lock(&self.inner);
        g.processed += count;
        g.held_bytes -= bytes;
        self.stats.messages_processed.fetch_add(count, Ordering::Relaxed);
        self.stats.bytes_processed.fetch_add(bytes as u64, Ordering::Relaxed);
        self.stats.queued_bytes.store(g.held_bytes as u64, Ordering::Relaxed);
        let barrier_waiting = g.progress_waiters > 0;
        drop(g);
        if self.has_waiting_producers.swap(false, Ordering::Relaxed) {
            self.space_freed.notify_all();
        }
        if barrier_waiting {
            self.progress.notify_all();
        }
    }

    /// The sequence number the next push will get: a barrier taken now waits for
    /// `processed >= enqueued()`.
    pub fn enqueued(&self) -> u64 {
        lock(&self.inner).enqueued
    }

    /// Number of messages completed so far.
    pub fn processed(&self) -> u64 {
        lock(&self.inner).processed
    }

    /// Messages pushed and not yet popped.
    pub fn len(&self) -> usize {
        lock(&self.inner).items.len()
    }

    /// Whether no message is waiting to be popped.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Waits up to `timeout` until at least `target` messages are processed.
    /// Returns whether that happened.
    pub fn wait_processed(&self, target: u64, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut g = lock(&self.inner);
        while g.processed < target {
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            g.progress_waiters += 1;
            g = self
                .progress
                .wait_timeout(g, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
            g.progress_waiters -= 1;
        }
        true
    }

    /// Asks the consumer to exit once the queue is empty (`pop_batch` returns `false`).
    pub fn request_stop(&self) {
        lock(&self.inner).drain_and_stop = true;
        self.not_empty.notify_all();
    }

    /// Marks a consumer as active (clearing any previous [`Queue::request_stop`]); call
    /// before starting the consumer thread.
    pub fn clear_stop(&self) {
        let mut g = lock(&self.inner);
        g.drain_and_stop = false;
        g.consumer_active = true;
    }

    /// Records that the consumer thread has exited (normally or not): producers that wait
    /// for space are told there is no consumer, so that one gets started.
    pub fn consumer_exited(&self) {
        lock(&self.inner).consumer_active = false;
        self.space_freed.notify_all();
    }

    /// Closes the queue for good: pending and future pushes fail, the consumer exits once
    /// the queue is empty. Returns the items that were never popped.
    pub fn close(&self) -> Vec<T> {
        let mut g = lock(&self.inner);
        g.closed = true;
        self.pending.store(0, Ordering::Release);
        self.not_empty.notify_all();
        self.space_freed.notify_all();
        g.items.drain(..).map(|(_, t)| t).collect()
    }

    /// Whether [`Queue::close`] was called.
    pub fn is_closed(&self) -> bool {
        lock(&self.inner).closed
    }
}

/// Polls `ready` for up to `budget`; returns whether it became true. Used before a
/// blocking wait where the event is expected within microseconds.
pub fn spin_until(budget: Duration, mut ready: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    loop {
        for _ in 0..64 {
            if ready() {
                return true;
            }
            std::hint::spin_loop();
        }
        if start.elapsed() >= budget {
            return ready();
        }
        std::thread::yield_now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifo_and_sequence_numbers() {
        let q = Queue::new(100);
        q.clear_stop();
        assert_eq!(q.push('a', 10).unwrap().seq, 0);
        assert_eq!(q.push('b', 10), Ok(Pushed { seq: 1, consumer_active: true }));
        let mut out = Vec::new();
        assert!(q.pop_batch(10, &mut out));
        assert_eq!(out, vec![(10, 'a'), (10, 'b')]);
        assert_eq!(q.enqueued(), 2);
        assert_eq!(q.processed(), 0);
        q.complete(2, 20);
        assert_eq!(q.processed(), 2);
        assert_eq!(q.stats.snapshot().queued_bytes, 0);
        assert_eq!(q.stats.snapshot().peak_queued_bytes, 20);
    }

    #[test]
    fn oversized_message_is_admitted_alone() {
        let q = Queue::new(8);
        assert_eq!(q.push(1, 1000).unwrap().seq, 0);
        assert_eq!(q.stats.snapshot().queued_bytes, 1000);
    }

    #[test]
    fn pop_batch_respects_max() {
        let q = Queue::new(1000);
        for i in 0..5 {
            q.push(i, 1).unwrap();
        }
        let mut out = Vec::new();
        assert!(q.pop_batch(2, &mut out));
        assert_eq!(out.len(), 2);
        assert_eq!(q.len(), 3);
    }

    #[test]
    fn stop_request_ends_pop_only_when_empty() {
        let q = Queue::new(1000);
        q.clear_stop();
        q.push(7, 1).unwrap();
        q.request_stop();
        let mut out = Vec::new();
        assert!(q.pop_batch(10, &mut out));
        assert!(!q.pop_batch(10, &mut out));
        q.clear_stop();
        assert!(q.push(8, 1).unwrap().consumer_active);
        assert!(q.pop_batch(10, &mut out));
        assert_eq!(out.iter().map(|x| x.1).collect::<Vec<_>>(), vec![7, 8]);
    }

    #[test]
    fn close_rejects_pushes_and_returns_leftovers() {
        let q = Queue::new(1000);
        q.push(1, 1).unwrap();
        assert_eq!(q.close(), vec![1]);
        assert_eq!(q.push(2, 1), Err(PushError::Closed(2)));
        assert!(q.is_closed());
    }

    #[test]
    fn push_without_consumer_reports_instead_of_blocking() {
        let q = Queue::new(10);
        let first = q.push(1, 8).unwrap();
        assert!(!first.consumer_active);
        assert_eq!(q.push(2, 8), Err(PushError::NoConsumer(2)));
        q.clear_stop();
        let mut out = Vec::new();
        assert!(q.pop_batch(10, &mut out));
        q.complete(1, 8);
        assert_eq!(q.push(2, 8).unwrap().seq, 1);
    }

    #[test]
    fn push_over_bound_never_waits() {
        let q = Queue::new(10);
        q.clear_stop();
        q.push(1, 10).unwrap();
        assert_eq!(q.push_over_bound(2, 10).unwrap().seq, 1);
        assert_eq!(q.stats.snapshot().queued_bytes, 20);
    }

    #[test]
    fn wait_processed_times_out() {
        let q = Queue::new(1000);
        q.push(1, 1).unwrap();
        assert!(!q.wait_processed(1, Duration::from_millis(10)));
        assert!(q.wait_processed(0, Duration::from_millis(0)));
    }
}
