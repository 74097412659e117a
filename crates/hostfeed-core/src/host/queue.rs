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
//! wake it at once. After the nap's window it sleeps until woken.
//!
//! There is a single FIFO, so messages from any one producer are consumed in push order.
//! Every push gets a sequence number; [`Queue::wait_processed`] is the barrier primitive.
//! A message the consumer *holds back* past the end of its batch (the dispatcher keeps a
//! device's later messages behind a joined tap whose other parts have not come) has not
//! run yet: it stays outstanding for barriers, by its sequence number, until the consumer
//! lets it go ([`Queue::hold_back`], [`Queue::let_go`]), so a barrier never returns before
//! a message pushed before it ran, held or not.
//!
//! No Python here: this module is tested with plain `cargo test`.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use crate::host::stats::Stats;
use crate::host::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use crate::host::sync::{lock, spin_until, try_lock, AdaptiveSpin, CachePadded, Mutex, Waker};

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
    /// Bytes of `items`: pushed, not yet moved into a batch.
    queued_bytes: usize,
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
    /// Sequence numbers of completed messages the consumer holds back (not run yet), each
    /// with how many holds it has ([`Queue::hold_back`]).
    held: BTreeMap<u64, usize>,
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
    // lie on cache lines of their own: on shared lines, every push and every take would
    // evict the other side's line, and its next lock or counter update would miss.
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
    /// Mirror of `Inner::queued_bytes`, readable without the lock (for a producer that
    /// lets the consumer catch up, `host/buffer.rs`).
    pending_bytes: AtomicUsize,
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
    /// Mirror of the lowest sequence number in `Inner::held` (`u64::MAX`: none).
    held_min: AtomicU64,
    /// Writes an item's sequence number into it as it is pushed ([`Queue::with_seq`]).
    stamp: Option<fn(&mut T, u64)>,
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
                queued_bytes: 0,
                held_bytes: 0,
                held_back: 0,
                enqueued: 0,
                processed: 0,
                held: BTreeMap::new(),
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
            pending_bytes: AtomicUsize::new(0),
            spin: Duration::ZERO,
            adaptive: None,
            nap: None,
            progress: CachePadded(AtomicU64::new(0)),
            nudges: AtomicU64::new(0),
            enqueued: CachePadded(AtomicU64::new(0)),
            processed: AtomicU64::new(0),
            held_min: AtomicU64::new(u64::MAX),
            stamp: None,
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

    /// Writes each item's sequence number into it as it is pushed (with `stamp`), for a
    /// consumer that holds items back ([`Queue::hold_back`]).
    #[must_use]
    pub fn with_seq(mut self, stamp: fn(&mut T, u64)) -> Self {
        self.stamp = Some(stamp);
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

    fn push_inner(&self, mut item: T, bytes: usize, when_full: WhenFull) -> Result<Pushed, PushError<T>> {
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
        if let Some(stamp) = self.stamp {
            stamp(&mut item, seq);
        }
        g.enqueued += 1;
        self.enqueued.store(g.enqueued, Ordering::Release);
        g.held_bytes += bytes;
        g.items.push_back((bytes, item));
        g.queued_bytes += bytes;
        self.publish_pending(&g);
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

    /// Stores the mirrors of what is queued (`pending`, `pending_bytes`), under the lock.
    fn publish_pending(&self, g: &Inner<T>) {
        self.pending.store(g.items.len(), Ordering::Release);
        self.pending_bytes.store(g.queued_bytes, Ordering::Release);
    }

    /// Bytes pushed and not yet moved into a batch by the consumer (read without the lock:
    /// a moment's value).
    #[cfg_attr(loom, allow(dead_code))] // read by the CPU handlers, which loom does not build
    pub(crate) fn pending_bytes(&self) -> usize {
        self.pending_bytes.load(Ordering::Acquire)
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
                g.queued_bytes = 0;
            } else {
                let n = g.items.len().min(max);
                let moved: usize = g.items.iter().take(n).map(|(b, _)| *b).sum();
                g.queued_bytes -= moved;
                flight.items.extend(g.items.drain(..n));
            }
            self.publish_pending(&g);
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
            g.queued_bytes += item.0;
            g.items.push_front(item);
        }
        self.publish_pending(&g);
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

    /// Waits up to `timeout` until at least `target` messages are processed and none pushed
    /// before `target` is held back ([`Queue::done_before`]). Returns whether that happened.
    pub fn wait_processed(&self, target: u64, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut g = lock(&self.inner);
        if g.napping && g.processed < target {
            // A lazy message may wait for the nap's end (see `wake_napping`).
            self.not_empty.notify_one();
        }
        while g.processed < target || g.held.keys().next().is_some_and(|&seq| seq < target) {
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
            g.queued_bytes = 0;
            g.processed = g.enqueued;
            g.held_bytes = 0;
            g.held_back = 0;
            g.held.clear();
            self.held_min.store(u64::MAX, Ordering::Release);
            g.drain_and_stop = false;
            g.consumer_active = false;
            self.publish_pending(&g);
            self.processed.store(g.processed, Ordering::Release);
            self.stats.queued_bytes.store(0, Ordering::Relaxed);
        }
    }

    /// Closes the queue for good: pending and future pushes fail, the consumer exits once
    /// the queue is empty. Returns the items that were never moved into a batch.
    pub(crate) fn close(&self) -> Vec<T> {
        let mut g = lock(&self.inner);
        g.closed = true;
        // Nothing runs any more: held messages never will, and no barrier waits for them.
        g.held.clear();
        self.held_min.store(u64::MAX, Ordering::Release);
        let (count, bytes) = (g.items.len() as u64, g.items.iter().map(|(b, _)| *b).sum());
        let left: Vec<T> = g.items.drain(..).map(|(_, t)| t).collect();
        g.queued_bytes = 0;
        self.publish_pending(&g);
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

mod held;

#[cfg(all(test, not(loom)))]
mod tests;
