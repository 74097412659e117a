//! A byte-bounded multi-producer queue with one consumer.
//!
//! Producers (XLA FFI handlers) push messages and block while the bytes held would exceed
//! the bound, so a host that falls behind pauses the devices instead of growing memory.
//! A message's bytes stay charged from its push until the consumer has finished with it
//! (so the bound counts what is queued *and* what is being processed). A message larger
//! than the bound is admitted when nothing else is held.
//!
//! The consumer works in *batches*: [`Queue::begin_batch`] moves up to `max` messages out of
//! the queue into the in-flight batch, [`Queue::take`] hands them out one at a time and
//! [`Queue::end_batch`] completes what was taken. If the consumer gets stuck in one message
//! (a host callback that never returns), [`Queue::reclaim_batch`] writes off what it took
//! and puts the messages it had not reached back at the head of the queue, for the next
//! consumer; the stuck consumer's later calls on that batch are ignored (epochs).
//!
//! A consumer that found the queue empty can *nap* for a while ([`Queue::with_nap`]): it
//! sleeps in short timed waits, and producers of messages that can wait that long do not
//! wake it (on a virtual machine, waking a sleeping thread costs the waker tens of
//! microseconds, paid on the device's thread); urgent messages, barriers and stops still
//! wake it at once. After the nap's window it sleeps until woken, as before.
//!
//! There is a single FIFO, so messages from any one producer are consumed in push order.
//! Every push gets a sequence number; [`Queue::wait_processed`] is the barrier primitive.
//!
//! No Python here: this module is tested with plain `cargo test`.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::host::stats::Stats;
use crate::host::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use crate::host::sync::{lock, try_lock, CachePadded, Mutex, Waker};

/// Slots an idle batch ring keeps (see [`Queue::end_batch`]).
const KEPT_RING_SLOTS: usize = 4096;

/// Why a push did not happen; the item is handed back.
#[derive(Debug, PartialEq, Eq)]
pub enum PushError<T> {
    /// The queue was closed for good (`Queue::close`).
    Closed(T),
    /// The item must wait for space but no consumer is active to make any: start one
    /// and push again.
    NoConsumer(T),
    /// `Queue::try_push` only: the item would have to wait for space.
    WouldBlock(T),
}

/// What a push does when the item does not fit under the bound.
#[derive(Clone, Copy, PartialEq, Eq)]
enum WhenFull {
    Wait,
    Admit,
    Refuse,
}

/// A successful push.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pushed {
    /// The item's sequence number.
    pub seq: u64,
    /// Whether a consumer was active at the time; if not, the caller must start one.
    pub(crate) consumer_active: bool,
}

/// What [`Queue::reclaim_batch`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Reclaimed {
    /// Messages the stuck consumer had taken, now counted as processed.
    pub written_off: u64,
    /// Messages it had not reached, back at the head of the queue.
    pub requeued: usize,
}

#[allow(clippy::struct_excessive_bools)] // independent states, read together under one lock
struct Inner<T> {
    items: VecDeque<(usize, T)>,
    /// Bytes pushed and not yet completed (queued plus in flight), plus what is charged
    /// outside any message ([`Queue::charge`], [`Queue::hold_back`]).
    held_bytes: usize,
    /// The part of `held_bytes` the consumer holds back ([`Queue::hold_back`]): messages
    /// waiting for something only another push can bring. A push is admitted whenever
    /// nothing else is charged, so they can never keep that push out.
    held_back: usize,
    /// Sequence number of the next push (= number of pushes so far).
    enqueued: u64,
    /// Number of messages completed.
    processed: u64,
    /// The consumer should exit once `items` is empty.
    drain_and_stop: bool,
    /// A consumer is running (between `clear_stop` and `begin_batch` returning `None`).
    consumer_active: bool,
    closed: bool,
    /// The consumer sleeps in a nap's timed wait: a lazy push need not wake it.
    napping: bool,
}

/// How an idle consumer naps before sleeping (see the module documentation).
pub struct Nap<T> {
    /// Length of one timed wait.
    pub period: Duration,
    /// How long after it found the queue empty the consumer naps; then it sleeps.
    pub window: Duration,
    /// Whether a message must wake a napping consumer at once (a call, a synchronous tap).
    pub urgent: fn(&T) -> bool,
}

/// The batch the consumer is working through.
struct InFlight<T> {
    epoch: u64,
    items: VecDeque<(usize, T)>,
    taken: u64,
    taken_bytes: usize,
}

impl<T> Clone for Nap<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Nap<T> {}

/// See the module documentation.
pub struct Queue<T> {
    // What the producers write on every push (`inner`, `pending`, `enqueued`) and
    // what the consumer writes on every message it takes (`in_flight`, `progress`) each
    // lie on cache lines of their own: sharing lines, every push and every take evicted
    // the other side's line, and its next lock or counter update missed the cache.
    inner: CachePadded<Mutex<Inner<T>>>,
    /// Locked after `inner` never: lock order is `in_flight` then `inner`.
    in_flight: CachePadded<Mutex<InFlight<T>>>,
    /// The consumer sleeps here for messages.
    not_empty: Waker,
    /// Producers sleep here for space.
    space_freed: Waker,
    /// Barrier waiters sleep here for completed messages.
    progressed: Waker,
    bound: AtomicUsize,
    /// Mirror of `items.len()`, readable without the lock (for the consumer's spin).
    pending: CachePadded<AtomicUsize>,
    /// How long an idle consumer polls `pending` before sleeping.
    spin: Duration,
    adaptive: Option<&'static AdaptiveSpin>,
    nap: Option<Nap<T>>,
    /// Bumped whenever the consumer takes or completes messages (stall detection).
    progress: CachePadded<AtomicU64>,
    /// Bumped (under `inner`) by [`Queue::nudge`]: a change other than the consumer's
    /// that waiters of [`Queue::wait_woken`] wait for.
    nudges: AtomicU64,
    /// Mirrors of `Inner::enqueued` / `Inner::processed` (stored under the lock), so that
    /// an idle barrier reads them without locking.
    enqueued: CachePadded<AtomicU64>,
    processed: AtomicU64,
    /// The queue's counters.
    pub stats: Stats,
}

impl<T> Queue<T> {
    /// A queue holding at most `bound_bytes` bytes (see the module documentation).
    #[must_use]
    pub fn new(bound_bytes: usize) -> Self {
        Queue {
            inner: CachePadded(Mutex::new(Inner {
                items: VecDeque::new(),
                held_bytes: 0,
                held_back: 0,
                enqueued: 0,
                processed: 0,
                drain_and_stop: false,
                consumer_active: false,
                closed: false,
                napping: false,
            })),
            in_flight: CachePadded(Mutex::new(InFlight {
                epoch: 0,
                items: VecDeque::new(),
                taken: 0,
                taken_bytes: 0,
            })),
            not_empty: Waker::new(),
            space_freed: Waker::new(),
            progressed: Waker::new(),
            bound: AtomicUsize::new(bound_bytes.max(1)),
            pending: CachePadded(AtomicUsize::new(0)),
            spin: Duration::ZERO,
            adaptive: None,
            nap: None,
            progress: CachePadded(AtomicU64::new(0)),
            nudges: AtomicU64::new(0),
            enqueued: CachePadded(AtomicU64::new(0)),
            processed: AtomicU64::new(0),
            stats: Stats::default(),
        }
    }

    /// Lets an idle consumer poll for up to `spin` before sleeping (the receiver uses none:
    /// this poll yields the CPU, which under load costs whole scheduler time slices; it
    /// spins adaptively instead, [`Queue::with_adaptive_spin`]).
    #[must_use]
    pub fn with_spin(mut self, spin: Duration) -> Self {
        self.spin = spin;
        self
    }

    /// Lets an idle consumer spin adaptively before sleeping (see `AdaptiveSpin`).
    #[must_use]
    pub fn with_adaptive_spin(mut self, spin: &'static AdaptiveSpin) -> Self {
        self.adaptive = Some(spin);
        self
    }

    /// Lets an idle consumer nap as `nap` says before sleeping until woken (see the
    /// module documentation).
    #[must_use]
    pub fn with_nap(mut self, nap: Nap<T>) -> Self {
        self.nap = Some(nap);
        self
    }

    /// The current byte bound.
    pub fn bound(&self) -> usize {
        self.bound.load(Ordering::Relaxed)
    }

    /// Changes the byte bound; producers blocked on the old bound re-check at once.
    pub fn set_bound(&self, bound_bytes: usize) {
        let guard = lock(&self.inner);
        self.bound.store(bound_bytes.max(1), Ordering::Relaxed);
        drop(guard);
        self.space_freed.notify_all();
    }

    /// Pushes `item` worth `bytes`, blocking while it would exceed the bound.
    ///
    /// # Errors
    /// [`PushError::Closed`] once `Queue::close` was called; [`PushError::NoConsumer`]
    /// when it would have to wait but no consumer is active.
    pub fn push(&self, item: T, bytes: usize) -> Result<Pushed, PushError<T>> {
        self.push_inner(item, bytes, WhenFull::Wait)
    }

    /// Like [`Queue::push`] but never waits: an item that would have to wait for space is
    /// handed back as [`PushError::WouldBlock`]. For a producer that holds a resource the
    /// consumer needs (the GIL) and must release it before it may wait.
    ///
    /// # Errors
    /// [`PushError::Closed`], [`PushError::WouldBlock`].
    pub(crate) fn try_push(&self, item: T, bytes: usize) -> Result<Pushed, PushError<T>> {
        self.push_inner(item, bytes, WhenFull::Refuse)
    }

    /// Like [`Queue::push`] but never waits for space: the item is admitted over the bound.
    /// For producers that the consumer itself waits on (a tap issued from inside a host
    /// callback), where waiting would deadlock.
    ///
    /// # Errors
    /// [`PushError::Closed`] once [`Queue::close`] was called.
    pub(crate) fn push_over_bound(&self, item: T, bytes: usize) -> Result<Pushed, PushError<T>> {
        self.push_inner(item, bytes, WhenFull::Admit)
    }

    fn push_inner(&self, item: T, bytes: usize, when_full: WhenFull) -> Result<Pushed, PushError<T>> {
        let mut g = lock(&self.inner);
        let mut blocked_since: Option<Instant> = None;
        loop {
            if g.closed {
                return Err(PushError::Closed(item));
            }
            let bound = self.bound.load(Ordering::Relaxed);
            if when_full == WhenFull::Admit
                || g.held_bytes <= g.held_back
                || g.held_bytes.saturating_add(bytes) <= bound
            {
                break;
            }
            if when_full == WhenFull::Refuse {
                return Err(PushError::WouldBlock(item));
            }
            if !g.consumer_active {
                return Err(PushError::NoConsumer(item));
            }
            if blocked_since.is_none() {
                blocked_since = Some(Instant::now());
                self.stats.producer_blocked_count.fetch_add(1, Ordering::Relaxed);
            }
            g = self.space_freed.wait(g);
        }
        if let Some(t0) = blocked_since {
            let ns = u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX);
            self.stats.producer_blocked_ns.fetch_add(ns, Ordering::Relaxed);
        }
        let seq = g.enqueued;
        g.enqueued += 1;
        self.enqueued.store(g.enqueued, Ordering::Release);
        g.held_bytes += bytes;
        g.items.push_back((bytes, item));
        self.pending.store(g.items.len(), Ordering::Release);
        self.stats.record_push(bytes as u64, g.held_bytes as u64);
        let consumer_active = g.consumer_active;
        // A napping consumer finds a lazy message within one nap period by itself.
        let wake =
            !g.napping || self.nap.is_some_and(|nap| (nap.urgent)(&g.items.back().expect("just pushed").1));
        drop(g);
        if wake {
            self.not_empty.notify_one();
        }
        Ok(Pushed { seq, consumer_active })
    }

    /// Waits until at least one message is queued, then moves up to `max` of them into the
    /// in-flight batch and returns its epoch. Returns `None`, with nothing moved, when the
    /// queue is empty and the consumer was asked to stop ([`Queue::request_stop`]) or the
    /// queue is closed. The previous batch must have been ended (or reclaimed).
    pub fn begin_batch(&self, max: usize) -> Option<u64> {
        if !self.spin.is_zero() {
            spin_until(self.spin, || self.pending.load(Ordering::Acquire) != 0);
        }
        if let Some(adaptive) = self.adaptive {
            adaptive.spin(|| self.pending.load(Ordering::Acquire) != 0);
        }
        let nap_until = self.nap.map(|nap| (nap.period, Instant::now() + nap.window));
        loop {
            {
                let mut g = lock(&self.inner);
                while g.items.is_empty() {
                    if g.drain_and_stop || g.closed {
                        g.consumer_active = false;
                        drop(g);
                        // Producers waiting for space must now see that nobody will make any.
                        self.space_freed.notify_all();
                        return None;
                    }
                    let nap = nap_until.and_then(|(period, until)| {
                        let left = until.saturating_duration_since(Instant::now());
                        (!left.is_zero()).then(|| left.min(period))
                    });
                    if let Some(nap) = nap {
                        g.napping = true;
                        g = self.not_empty.wait_timeout(g, nap);
                        g.napping = false;
                    } else {
                        g = self.not_empty.wait(g);
                    }
                }
            }
            // Lock order: `in_flight`, then `inner`. Only `close` removes queued items
            // meanwhile; then the next round returns `None`.
            let mut flight = lock(&self.in_flight);
            let mut g = lock(&self.inner);
            if g.items.is_empty() {
                continue;
            }
            let max = max.max(1);
            if flight.items.is_empty() && g.items.len() <= max {
                // The whole queue becomes the batch: swap the two rings (no copy while
                // the producers wait for the lock); the queue keeps the batch's old,
                // empty ring and its capacity.
                std::mem::swap(&mut flight.items, &mut g.items);
            } else {
                let n = g.items.len().min(max);
                flight.items.extend(g.items.drain(..n));
            }
            self.pending.store(g.items.len(), Ordering::Release);
            flight.epoch += 1;
            flight.taken = 0;
            flight.taken_bytes = 0;
            return Some(flight.epoch);
        }
    }

    /// The next message of batch `epoch`, or `None` when the batch is exhausted or was
    /// reclaimed.
    pub fn take(&self, epoch: u64) -> Option<T> {
        self.take_if(epoch, |_| true)
    }

    /// Like [`Queue::take`], but only if `accept` accepts the next message (it runs under
    /// the batch's lock: it must only look at the message).
    pub fn take_if(&self, epoch: u64, accept: impl FnOnce(&T) -> bool) -> Option<T> {
        let mut flight = lock(&self.in_flight);
        if flight.epoch != epoch || !accept(&flight.items.front()?.1) {
            return None;
        }
        let (bytes, item) = flight.items.pop_front()?;
        flight.taken += 1;
        flight.taken_bytes += bytes;
        self.progress.fetch_add(1, Ordering::Relaxed);
        Some(item)
    }

    // ---- Bytes held past the end of a batch (the recorder) ------------------------------
    //
    // A consumer that keeps a message's bytes after processing it (the recorder keeps rows
    // until they are on disk) takes it with `take_retained`: the message counts as
    // processed when its batch ends (barriers see it), but its bytes stay charged against
    // the bound until that consumer calls `release`. Bytes it holds without a message
    // (rows copied from Python) are charged with `charge`. So the bound keeps bounding
    // memory, and a slow disk pauses the producers.

    /// Like [`Queue::take`], but only if `accept` accepts the next message, and keeping its
    /// bytes charged after the batch ends: the caller must [`Queue::release`] the returned
    /// byte count once it no longer holds the message's memory.
    pub(crate) fn take_retained(&self, epoch: u64, accept: impl FnOnce(&T) -> bool) -> Option<(T, usize)> {
        let mut flight = lock(&self.in_flight);
        if flight.epoch != epoch || !accept(&flight.items.front()?.1) {
            return None;
        }
        let (bytes, item) = flight.items.pop_front()?;
        flight.taken += 1;
        self.progress.fetch_add(1, Ordering::Relaxed);
        self.stats.bytes_processed.fetch_add(bytes as u64, Ordering::Relaxed);
        Some((item, bytes))
    }

    /// Charges `bytes` held outside any message (never waits; see [`Queue::take_retained`]).
    pub(crate) fn charge(&self, bytes: usize) {
        self.charge_outside(bytes, false);
    }

    /// Charges `bytes` of messages the consumer holds back after their batch ended, until
    /// something that only a later push brings lets them run (a joined tap's other parts),
    /// so that the bound still bounds them. Never waits, and never keeps a push out: a
    /// push is admitted whenever nothing but held-back bytes is charged. Freed with
    /// [`Queue::let_go`].
    pub fn hold_back(&self, bytes: usize) {
        self.charge_outside(bytes, true);
    }

    /// [`Queue::charge`], or with `held_back` [`Queue::hold_back`].
    fn charge_outside(&self, bytes: usize, held_back: bool) {
        let mut g = lock(&self.inner);
        g.held_bytes += bytes;
        if held_back {
            g.held_back += bytes;
        }
        let held = g.held_bytes as u64;
        drop(g);
        self.stats.queued_bytes.store(held, Ordering::Relaxed);
        self.stats.peak_queued_bytes.fetch_max(held, Ordering::Relaxed);
    }

    /// Frees `bytes` charged by [`Queue::hold_back`].
    pub fn let_go(&self, bytes: usize) {
        if bytes == 0 {
            return;
        }
        let mut g = lock(&self.inner);
        let bytes = bytes.min(g.held_back);
        g.held_back -= bytes;
        g.held_bytes = g.held_bytes.saturating_sub(bytes);
        self.stats.queued_bytes.store(g.held_bytes as u64, Ordering::Relaxed);
        drop(g);
        self.space_freed.notify_all();
    }

    /// Bytes charged by [`Queue::hold_back`] and not yet let go.
    pub fn held_back_bytes(&self) -> usize {
        lock(&self.inner).held_back
    }

    /// Frees `bytes` charged by [`Queue::take_retained`] or [`Queue::charge`].
    pub(crate) fn release(&self, bytes: usize) {
        if bytes == 0 {
            return;
        }
        let mut g = lock(&self.inner);
        g.held_bytes = g.held_bytes.saturating_sub(bytes);
        self.stats.queued_bytes.store(g.held_bytes as u64, Ordering::Relaxed);
        drop(g);
        self.space_freed.notify_all();
    }

    /// Whether some producer is waiting for space now.
    pub(crate) fn producers_waiting(&self) -> bool {
        self.space_freed.has_sleepers()
    }

    /// Messages of batch `epoch` not taken yet.
    pub(crate) fn remaining(&self, epoch: u64) -> usize {
        let flight = lock(&self.in_flight);
        if flight.epoch == epoch {
            flight.items.len()
        } else {
            0
        }
    }

    /// Completes batch `epoch`: the messages taken from it are processed, their bytes freed;
    /// messages not taken are dropped and counted as processed too (returned count). Does
    /// nothing for a reclaimed batch.
    pub fn end_batch(&self, epoch: u64) -> usize {
        let mut flight = lock(&self.in_flight);
        if flight.epoch != epoch {
            return 0;
        }
        let dropped = flight.items.len();
        let dropped_bytes: usize = flight.items.drain(..).map(|(b, _)| b).sum();
        let count = flight.taken + dropped as u64;
        let bytes = flight.taken_bytes + dropped_bytes;
        flight.taken = 0;
        flight.taken_bytes = 0;
        flight.epoch += 1;
        let mut g = lock(&self.inner);
        // `begin_batch` swaps rings, so the two alternate: the one a burst grew comes back
        // to the queue at the next swap and need not grow again. But if the queue grew a
        // second large ring meanwhile, the batch's idle one goes (freed after the locks):
        // at most one ring keeps a burst's capacity (the bound counts queued slots, not
        // idle capacity).
        let spare = (flight.items.capacity() > KEPT_RING_SLOTS && g.items.capacity() > KEPT_RING_SLOTS)
            .then(|| std::mem::take(&mut flight.items));
        drop(flight);
        self.complete_locked(&mut g, count, bytes);
        drop(g);
        drop(spare);
        self.after_complete();
        dropped
    }

    /// Takes the in-flight batch away from a consumer that stopped making progress: the
    /// messages it took are written off as processed (their bytes freed), the ones it had
    /// not reached go back to the head of the queue, and its later calls on the batch are
    /// ignored.
    pub fn reclaim_batch(&self) -> Reclaimed {
        let mut flight = lock(&self.in_flight);
        flight.epoch += 1;
        let rest: Vec<(usize, T)> = flight.items.drain(..).collect();
        let written_off = flight.taken;
        let bytes = flight.taken_bytes;
        flight.taken = 0;
        flight.taken_bytes = 0;
        let mut g = lock(&self.inner);
        drop(flight);
        let requeued = rest.len();
        for item in rest.into_iter().rev() {
            g.items.push_front(item);
        }
        self.pending.store(g.items.len(), Ordering::Release);
        self.complete_locked(&mut g, written_off, bytes);
        drop(g);
        self.after_complete();
        self.not_empty.notify_all();
        Reclaimed { written_off, requeued }
    }

    fn complete_locked(&self, g: &mut Inner<T>, count: u64, bytes: usize) {
        g.processed += count;
        g.held_bytes -= bytes;
        self.processed.store(g.processed, Ordering::Release);
        self.stats.record_complete(count, bytes as u64, g.held_bytes as u64);
    }

    fn after_complete(&self) {
        self.progress.fetch_add(1, Ordering::Relaxed);
        self.space_freed.notify_all();
        self.progressed.notify_all();
    }

    /// A counter that changes whenever the consumer takes or completes messages: a
    /// consumer whose counter stays put while messages wait is stuck.
    pub(crate) fn progress(&self) -> u64 {
        self.progress.load(Ordering::Relaxed)
    }

    /// Waits up to `timeout` for messages to be completed, if `progress()` still equals
    /// `seen`.
    pub(crate) fn wait_progress(&self, seen: u64, timeout: Duration) {
        let g = lock(&self.inner);
        if self.progress() == seen {
            drop(self.progressed.wait_timeout(g, timeout));
        }
    }

    /// A counter that changes with `Queue::progress` and with every [`Queue::nudge`]:
    /// read it before looking at the state a [`Queue::wait_woken`] waits for.
    pub fn wake_count(&self) -> u64 {
        self.progress().wrapping_add(self.nudges.load(Ordering::Relaxed))
    }

    /// Wakes the threads in [`Queue::wait_woken`] (and `Queue::wait_progress`) for a
    /// change that is not the consumer's (a GPU courier ending a reservation), without
    /// counting as the consumer's progress (stall detection must not see it). The change
    /// must be made before the call; a waiter that read [`Queue::wake_count`] before it
    /// does not sleep through it (the count changes under the lock the waiter checks it
    /// under).
    pub fn nudge(&self) {
        let g = lock(&self.inner);
        self.nudges.fetch_add(1, Ordering::Relaxed);
        drop(g);
        self.progressed.notify_all();
    }

    /// Waits up to `timeout` for the consumer's progress or a [`Queue::nudge`], if
    /// [`Queue::wake_count`] still equals `seen`.
    pub fn wait_woken(&self, seen: u64, timeout: Duration) {
        let g = lock(&self.inner);
        if self.wake_count() == seen {
            drop(self.progressed.wait_timeout(g, timeout));
        }
    }

    /// The sequence number the next push will get: a barrier taken now waits for
    /// `processed >= enqueued()`.
    pub fn enqueued(&self) -> u64 {
        self.enqueued.load(Ordering::Acquire)
    }

    /// Number of messages completed so far.
    pub fn processed(&self) -> u64 {
        self.processed.load(Ordering::Acquire)
    }

    /// Resets the peak gauge of [`Queue::stats`] to the bytes held now.
    pub fn reset_peak(&self) {
        let _guard = lock(&self.inner);
        self.stats.reset_peak();
    }

    /// Messages pushed and not yet moved into a batch (for tests and diagnostics).
    pub fn len(&self) -> usize {
        lock(&self.inner).items.len()
    }

    /// Whether no message is waiting to be moved into a batch.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes pushed and not yet completed.
    pub fn held_bytes(&self) -> usize {
        lock(&self.inner).held_bytes
    }

    /// Waits up to `timeout` until at least `target` messages are processed.
    /// Returns whether that happened.
    pub fn wait_processed(&self, target: u64, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut g = lock(&self.inner);
        if g.napping && g.processed < target {
            // A lazy message may wait for the nap's end (see `wake_napping`).
            self.not_empty.notify_one();
        }
        while g.processed < target {
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            g = self.progressed.wait_timeout(g, deadline - now);
        }
        true
    }

    /// Wakes the consumer if it naps: a barrier wants the messages it would find later.
    pub fn wake_napping(&self) {
        if lock(&self.inner).napping {
            self.not_empty.notify_one();
        }
    }

    /// Asks the consumer to exit once the queue is empty (`begin_batch` returns `None`).
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
    pub(crate) fn consumer_exited(&self) {
        lock(&self.inner).consumer_active = false;
        self.space_freed.notify_all();
    }

    /// In a child process created by `fork`, where no consumer thread exists: forgets
    /// every queued and in-flight message (leaked, not dropped: they may hold memory the
    /// parent's threads were using) and counts them as processed, so that the child starts
    /// with an empty queue, no consumer and nothing for a barrier to wait for. Skips a lock
    /// that a thread of the parent held at the fork (that thread does not exist here).
    pub fn reset_after_fork(&self) {
        if let Some(mut flight) = try_lock(&self.in_flight) {
            std::mem::forget(std::mem::take(&mut flight.items));
            flight.epoch += 1;
            flight.taken = 0;
            flight.taken_bytes = 0;
        }
        if let Some(mut g) = try_lock(&self.inner) {
            std::mem::forget(std::mem::take(&mut g.items));
            g.processed = g.enqueued;
            g.held_bytes = 0;
            g.held_back = 0;
            g.drain_and_stop = false;
            g.consumer_active = false;
            self.pending.store(0, Ordering::Release);
            self.processed.store(g.processed, Ordering::Release);
            self.stats.queued_bytes.store(0, Ordering::Relaxed);
        }
    }

    /// Closes the queue for good: pending and future pushes fail, the consumer exits once
    /// the queue is empty. Returns the items that were never moved into a batch.
    pub(crate) fn close(&self) -> Vec<T> {
        let mut g = lock(&self.inner);
        g.closed = true;
        self.pending.store(0, Ordering::Release);
        let (count, bytes) = (g.items.len() as u64, g.items.iter().map(|(b, _)| *b).sum());
        let left: Vec<T> = g.items.drain(..).map(|(_, t)| t).collect();
        self.complete_locked(&mut g, count, bytes);
        drop(g);
        self.not_empty.notify_all();
        self.after_complete();
        left
    }

    /// Whether [`Queue::close`] was called (for tests).
    #[cfg(test)]
    pub(crate) fn is_closed(&self) -> bool {
        lock(&self.inner).closed
    }
}

/// A spin before a blocking wait whose length adapts to whether spinning pays: it starts
/// at `max`, halves after every spin that saw nothing (down to none), and is back at `max`
/// after one that did. Once it is none, every [`AdaptiveSpin::PROBE_EVERY`]th wait tries a
/// short spin again.
///
/// Waking a sleeping thread costs tens of microseconds on an idle virtual machine (its
/// CPU must be woken too), the whole cost of a `call` round trip when each side sleeps in
/// turn; a spin that sees the event first saves it. On a loaded machine the event comes
/// late, the spins see nothing and stop within a few waits, so busy processes do not take
/// the CPU from the spinner for scheduler time slices (the spin never yields: it only
/// polls, with `spin_loop`, for at most its budget).
pub struct AdaptiveSpin {
    max_ns: u64,
    budget_ns: std::sync::atomic::AtomicU64,
    waits: std::sync::atomic::AtomicU64,
}

impl AdaptiveSpin {
    /// While the budget is none, one wait in this many spins (for `max` / 8) to find out
    /// whether spinning pays again.
    pub const PROBE_EVERY: u64 = 64;
    /// Budgets below this are none.
    const MIN_NS: u64 = 500;

    /// A spin of at most `max`.
    #[must_use]
    pub const fn new(max: Duration) -> Self {
        #[allow(clippy::cast_possible_truncation)] // a budget of microseconds
        let max_ns = max.as_nanos() as u64;
        AdaptiveSpin {
            max_ns,
            budget_ns: std::sync::atomic::AtomicU64::new(max_ns),
            waits: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// The current budget, in nanoseconds (for tests).
    #[must_use]
    pub fn budget_ns(&self) -> u64 {
        self.budget_ns.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Polls `ready` for up to the current budget; returns whether it became true, and
    /// adapts the budget to the outcome.
    pub fn spin(&self, mut ready: impl FnMut() -> bool) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        if cfg!(loom) {
            return ready(); // one look, as `spin_until` under loom
        }
        if ready() {
            return true;
        }
        let mut budget = self.budget_ns.load(Relaxed);
        let probe = budget == 0;
        if probe {
            if self.max_ns == 0 || (self.waits.fetch_add(1, Relaxed) + 1) % Self::PROBE_EVERY != 0 {
                return false;
            }
            budget = self.max_ns / 8;
        }
        let seen = spin_for(budget, &mut ready);
        let next = if seen {
            self.max_ns
        } else if probe {
            0
        } else {
            Some(budget / 2).filter(|&b| b >= Self::MIN_NS).unwrap_or(0)
        };
        self.budget_ns.store(next, Relaxed);
        seen
    }
}

/// Polls `ready` (never yielding) for up to `budget_ns`.
fn spin_for(budget_ns: u64, ready: &mut impl FnMut() -> bool) -> bool {
    poll(Duration::from_nanos(budget_ns), false, ready)
}

/// Polls `ready` for up to `budget`; returns whether it became true. Used before a
/// blocking wait where the event is expected within microseconds.
///
/// Under loom, one look: a model explores the orders of events, not the passing of time.
#[cfg(loom)]
pub fn spin_until(_budget: Duration, mut ready: impl FnMut() -> bool) -> bool {
    ready()
}

/// Polls `ready` for up to `budget`, yielding the CPU between rounds; returns whether it
/// became true. Used before a blocking wait where the event is expected within
/// microseconds.
#[cfg(not(loom))]
pub fn spin_until(budget: Duration, mut ready: impl FnMut() -> bool) -> bool {
    poll(budget, true, &mut ready)
}

/// Polls `ready` in rounds of 64 looks until it is true or `budget` has passed, yielding
/// the CPU between rounds if `yielding`.
fn poll(budget: Duration, yielding: bool, ready: &mut impl FnMut() -> bool) -> bool {
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
        if yielding {
            std::thread::yield_now();
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// Runs one batch of up to `max` items through `q`, returning them.
    fn drain<T>(q: &Queue<T>, max: usize) -> Vec<T> {
        let epoch = q.begin_batch(max).expect("a batch");
        let mut out = Vec::new();
        while let Some(x) = q.take(epoch) {
            out.push(x);
        }
        q.end_batch(epoch);
        out
    }

    #[test]
    fn a_nudge_wakes_a_waiter_without_counting_as_progress() {
        let q = std::sync::Arc::new(Queue::<u32>::new(100));
        let progress = q.progress();
        let seen = q.wake_count();
        let (tx, rx) = std::sync::mpsc::channel();
        let q2 = std::sync::Arc::clone(&q);
        let waiter = std::thread::spawn(move || {
            q2.wait_woken(seen, Duration::from_secs(3600));
            tx.send(()).unwrap();
        });
        while !q.progressed.has_sleepers() {
            std::thread::yield_now();
        }
        q.nudge();
        assert!(rx.recv_timeout(Duration::from_secs(30)).is_ok(), "the nudge did not wake the waiter");
        waiter.join().unwrap();
        assert_eq!(q.progress(), progress, "stall detection must not see a nudge");
        assert_ne!(q.wake_count(), seen);
        // A waiter that read the count before a nudge does not sleep at all.
        q.wait_woken(seen, Duration::from_secs(3600));
    }

    /// A consumer thread for `q` that sends every message it takes.
    fn consumer_of(
        q: &std::sync::Arc<Queue<u32>>,
    ) -> (std::thread::JoinHandle<()>, std::sync::mpsc::Receiver<u32>) {
        let (tx, rx) = std::sync::mpsc::channel();
        let q = std::sync::Arc::clone(q);
        let handle = std::thread::spawn(move || {
            while let Some(epoch) = q.begin_batch(16) {
                while let Some(m) = q.take(epoch) {
                    tx.send(m).unwrap();
                }
                q.end_batch(epoch);
            }
        });
        (handle, rx)
    }

    fn until_napping(q: &Queue<u32>) {
        while !lock(&q.inner).napping {
            std::thread::yield_now();
        }
    }

    #[test]
    fn a_napping_consumer_is_woken_by_urgent_messages_barriers_and_stops() {
        // Naps far longer than the test: only a wake-up gets a message to it in time.
        let nap = Nap {
            period: Duration::from_secs(600),
            window: Duration::from_secs(3600),
            urgent: |m: &u32| *m >= 100,
        };
        let q = std::sync::Arc::new(Queue::new(1000).with_nap(nap));
        q.clear_stop();
        let (consumer, rx) = consumer_of(&q);
        let within = Duration::from_secs(30);
        until_napping(&q);
        q.push(100, 1).unwrap(); // urgent: wakes it
        assert_eq!(rx.recv_timeout(within), Ok(100));
        until_napping(&q);
        q.push(1, 1).unwrap(); // lazy: waits for the nap's end, or a barrier
        assert!(q.wait_processed(2, within), "the barrier did not wake the napping consumer");
        assert_eq!(rx.recv_timeout(within), Ok(1));
        until_napping(&q);
        q.push(2, 1).unwrap();
        q.wake_napping();
        assert_eq!(rx.recv_timeout(within), Ok(2));
        until_napping(&q);
        q.request_stop();
        consumer.join().unwrap();
    }

    #[test]
    fn after_the_nap_window_a_consumer_sleeps_and_every_push_wakes_it() {
        let nap = Nap { period: Duration::from_millis(1), window: Duration::ZERO, urgent: |_: &u32| false };
        let q = std::sync::Arc::new(Queue::new(1000).with_nap(nap));
        q.clear_stop();
        let (consumer, rx) = consumer_of(&q);
        while !q.not_empty.has_sleepers() {
            std::thread::yield_now();
        }
        assert!(!lock(&q.inner).napping);
        q.push(7, 1).unwrap();
        assert_eq!(rx.recv_timeout(Duration::from_secs(30)), Ok(7));
        q.request_stop();
        consumer.join().unwrap();
    }

    #[test]
    fn fifo_and_sequence_numbers() {
        let q = Queue::new(100);
        q.clear_stop();
        assert_eq!(q.push('a', 10).unwrap().seq, 0);
        assert_eq!(q.push('b', 10), Ok(Pushed { seq: 1, consumer_active: true }));
        let epoch = q.begin_batch(10).unwrap();
        assert_eq!(q.enqueued(), 2);
        assert_eq!(q.processed(), 0);
        assert_eq!((q.take(epoch), q.take(epoch), q.take(epoch)), (Some('a'), Some('b'), None));
        assert_eq!(q.stats.snapshot().queued_bytes, 20, "bytes stay held until the batch ends");
        q.end_batch(epoch);
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
    fn batches_respect_max() {
        let q = Queue::new(1000);
        for i in 0..5 {
            q.push(i, 1).unwrap();
        }
        assert_eq!(drain(&q, 2), vec![0, 1]);
        assert_eq!(q.len(), 3);
    }

    #[test]
    fn a_batch_that_takes_the_whole_queue_leaves_later_pushes_for_the_next_one() {
        let q = Queue::new(1000);
        q.clear_stop();
        for round in 0..3 {
            for i in 0..4 {
                q.push(round * 10 + i, 1).unwrap();
            }
            let epoch = q.begin_batch(4).unwrap(); // all four: the rings are swapped
            assert_eq!((q.len(), q.remaining(epoch)), (0, 4));
            assert_eq!(q.take(epoch), Some(round * 10));
            q.push(round * 10 + 4, 1).unwrap(); // pushed while the batch is worked through
            let rest: Vec<i32> = std::iter::from_fn(|| q.take(epoch)).collect();
            assert_eq!(rest, vec![round * 10 + 1, round * 10 + 2, round * 10 + 3]);
            q.end_batch(epoch);
            assert_eq!(drain(&q, 4), vec![round * 10 + 4]);
        }
        assert_eq!((q.processed(), q.enqueued(), q.held_bytes()), (15, 15, 0));
    }

    #[test]
    fn at_most_one_ring_keeps_a_burst_capacity() {
        let q = Queue::new(usize::MAX);
        q.clear_stop();
        let burst = 4 * KEPT_RING_SLOTS;
        let push_burst = |from: usize| {
            for i in from..from + burst {
                q.push(i, 1).unwrap();
            }
        };
        let ring_capacities = || (lock(&q.inner).items.capacity(), lock(&q.in_flight).items.capacity());
        // One burst: its ring becomes the batch's, stays large while idle, and comes back
        // to the queue at the next swap (no regrowth).
        push_burst(0);
        assert_eq!(drain(&q, burst), (0..burst).collect::<Vec<_>>());
        let (queued, idle) = ring_capacities();
        assert!(queued <= KEPT_RING_SLOTS && idle >= burst, "{queued} {idle}");
        q.push(burst, 1).unwrap();
        assert_eq!(drain(&q, burst), vec![burst]);
        assert!(ring_capacities().0 >= burst, "the burst's ring is the queue's again");
        // A second burst while the first is in flight: the queue grows a second large ring,
        // and the batch's idle one is let go when the batch ends.
        push_burst(burst + 1);
        let epoch = q.begin_batch(burst).unwrap();
        push_burst(2 * burst + 1);
        let taken: Vec<usize> = std::iter::from_fn(|| q.take(epoch)).collect();
        assert_eq!(taken, ((burst + 1)..=(2 * burst)).collect::<Vec<_>>());
        q.end_batch(epoch);
        let (queued, idle) = ring_capacities();
        assert!(queued >= burst && idle <= KEPT_RING_SLOTS, "{queued} {idle}");
        assert_eq!(drain(&q, burst), ((2 * burst + 1)..=(3 * burst)).collect::<Vec<_>>());
        assert_eq!((q.processed(), q.held_bytes()), (3 * burst as u64 + 1, 0));
    }

    #[test]
    fn stop_request_ends_batches_only_when_empty() {
        let q = Queue::new(1000);
        q.clear_stop();
        q.push(7, 1).unwrap();
        q.request_stop();
        assert_eq!(drain(&q, 10), vec![7]);
        assert_eq!(q.begin_batch(10), None);
        q.clear_stop();
        assert!(q.push(8, 1).unwrap().consumer_active);
        assert_eq!(drain(&q, 10), vec![8]);
    }

    #[test]
    fn close_rejects_pushes_and_returns_leftovers() {
        let q = Queue::new(1000);
        q.push(1, 1).unwrap();
        assert_eq!(q.close(), vec![1]);
        assert_eq!(q.push(2, 1), Err(PushError::Closed(2)));
        assert!(q.is_closed());
        assert_eq!((q.processed(), q.held_bytes()), (1, 0), "leftovers are accounted for");
    }

    #[test]
    fn push_without_consumer_reports_instead_of_blocking() {
        let q = Queue::new(10);
        let first = q.push(1, 8).unwrap();
        assert!(!first.consumer_active);
        assert_eq!(q.push(2, 8), Err(PushError::NoConsumer(2)));
        q.clear_stop();
        assert_eq!(drain(&q, 10), vec![1]);
        assert_eq!(q.push(2, 8).unwrap().seq, 1);
    }

    #[test]
    fn held_back_bytes_count_against_the_bound_but_never_keep_a_push_out() {
        let q = Queue::new(10);
        q.clear_stop();
        q.hold_back(8);
        // Nothing but held-back bytes is charged: admitted, though over the bound.
        assert_eq!(q.try_push(1, 5).unwrap().seq, 0);
        assert_eq!(q.try_push(2, 1), Err(PushError::WouldBlock(2)), "13 bytes charged");
        assert_eq!(drain(&q, 10), vec![1]);
        assert_eq!(q.try_push(2, 1).unwrap().seq, 1);
        assert_eq!(q.try_push(3, 5), Err(PushError::WouldBlock(3)), "8 held back + 1 + 5");
        q.let_go(8);
        assert_eq!((q.held_back_bytes(), q.held_bytes()), (0, 1));
        assert_eq!(q.try_push(3, 5).unwrap().seq, 2);
        q.let_go(100); // nothing held back: frees nothing else
        assert_eq!(q.held_bytes(), 6);
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
    fn try_push_refuses_instead_of_waiting() {
        let q = Queue::new(10);
        q.clear_stop();
        q.try_push(1, 8).unwrap();
        assert_eq!(q.try_push(2, 8), Err(PushError::WouldBlock(2)));
        assert_eq!(drain(&q, 10), vec![1]);
        assert_eq!(q.try_push(2, 8).unwrap().seq, 1);
    }

    #[test]
    fn wait_processed_times_out() {
        let q = Queue::new(1000);
        q.push(1, 1).unwrap();
        assert!(!q.wait_processed(1, Duration::from_millis(10)));
        assert!(q.wait_processed(0, Duration::from_millis(0)));
    }

    #[test]
    fn reclaim_writes_off_taken_and_requeues_the_rest_in_order() {
        let q = Queue::new(1000);
        q.clear_stop();
        for i in 0..5 {
            q.push(i, 10).unwrap();
        }
        let stuck = q.begin_batch(3).unwrap();
        assert_eq!(q.take(stuck), Some(0));
        assert_eq!(q.take(stuck), Some(1)); // the consumer is stuck in message 1
        let r = q.reclaim_batch();
        assert_eq!(r, Reclaimed { written_off: 2, requeued: 1 });
        assert_eq!((q.processed(), q.held_bytes()), (2, 30));
        // The stuck consumer's batch is gone: its later calls change nothing.
        assert_eq!(q.take(stuck), None);
        assert_eq!(q.end_batch(stuck), 0);
        assert_eq!((q.processed(), q.held_bytes()), (2, 30));
        // A new consumer gets message 2 first, then 3 and 4.
        assert_eq!(drain(&q, 10), vec![2, 3, 4]);
        assert_eq!((q.processed(), q.held_bytes()), (5, 0));
        assert!(q.wait_processed(5, Duration::ZERO));
    }

    #[test]
    fn retained_bytes_stay_charged_until_released() {
        let q = Queue::new(100);
        q.push(1, 60).unwrap();
        q.push(2, 30).unwrap();
        let e = q.begin_batch(10).unwrap();
        assert_eq!(q.take_retained(e, |&x| x == 2), None, "the head is not accepted");
        assert_eq!(q.take_retained(e, |&x| x == 1), Some((1, 60)));
        assert_eq!(q.take(e), Some(2));
        q.end_batch(e);
        assert_eq!((q.processed(), q.held_bytes()), (2, 60), "processed, but still charged");
        // A producer waits for the retained bytes, not for the batch.
        assert_eq!(q.push(3, 50), Err(PushError::NoConsumer(3)));
        q.release(60);
        assert_eq!(q.held_bytes(), 0);
        q.charge(70);
        assert_eq!(q.stats.snapshot().peak_queued_bytes, 90);
        assert_eq!(q.push(3, 50), Err(PushError::NoConsumer(3)));
        q.release(70);
        assert_eq!(q.push(3, 50).unwrap().seq, 2);
        assert!(!q.producers_waiting());
    }

    #[test]
    fn end_batch_counts_untaken_messages_as_dropped() {
        let q = Queue::new(1000);
        q.push(1, 4).unwrap();
        q.push(2, 4).unwrap();
        let e = q.begin_batch(10).unwrap();
        assert_eq!(q.take(e), Some(1));
        assert_eq!(q.end_batch(e), 1);
        assert_eq!((q.processed(), q.held_bytes()), (2, 0));
    }

    #[test]
    fn adaptive_spin_halves_when_it_sees_nothing_and_comes_back_when_it_pays() {
        let spin = AdaptiveSpin::new(Duration::from_micros(8));
        assert_eq!(spin.budget_ns(), 8_000);
        // Nothing happens: 8 us, 4, 2, 1, then none (below 0.5 us).
        for expected in [4_000, 2_000, 1_000, 500, 0] {
            assert!(!spin.spin(|| false));
            assert_eq!(spin.budget_ns(), expected);
        }
        // With no budget, only one wait in PROBE_EVERY looks again (for max / 8), the
        // others return at once; a probe that sees the event restores the whole budget.
        let mut looks = 0;
        for _ in 0..AdaptiveSpin::PROBE_EVERY - 1 {
            assert!(!spin.spin(|| {
                looks += 1;
                false
            }));
        }
        assert_eq!(looks, AdaptiveSpin::PROBE_EVERY - 1, "no spin without a budget");
        assert_eq!(spin.budget_ns(), 0);
        // A probe that sees nothing leaves no budget (the next probe is the wait after).
        for _ in 0..AdaptiveSpin::PROBE_EVERY {
            assert!(!spin.spin(|| false));
        }
        assert_eq!(spin.budget_ns(), 0);
        let mut polls = 0;
        assert!(spin.spin(|| {
            polls += 1;
            polls > 3
        }));
        assert_eq!(spin.budget_ns(), 8_000);
        // An event already there costs one look and keeps the budget.
        assert!(spin.spin(|| true));
        assert_eq!(spin.budget_ns(), 8_000);
    }
}
