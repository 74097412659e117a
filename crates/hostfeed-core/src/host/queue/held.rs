//! What the consumer keeps past the end of a batch: the bytes of messages it retains (the
//! recorder keeps rows until they are on disk) and messages it holds back (the dispatcher
//! keeps a device's later messages behind a joined tap whose other parts have not come),
//! which barriers wait for until they ran ([`Queue::done_before`]).

use super::{Inner, Queue};
use crate::host::sync::atomic::Ordering;
use crate::host::sync::lock;

impl<T> Queue<T> {
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
        self.charge_outside(bytes, false, None);
    }

    /// Holds back the message of sequence number `seq` (if known) after its batch ended,
    /// until something that only a later push brings lets it run (a joined tap's other
    /// parts): barriers taken after its push wait until [`Queue::let_go`] says it ran. Its
    /// `bytes` stay charged meanwhile, so that the bound still bounds such messages; that
    /// never waits, and never keeps a push out: a push is admitted whenever nothing but
    /// held-back bytes is charged.
    pub fn hold_back(&self, seq: Option<u64>, bytes: usize) {
        self.charge_outside(bytes, true, seq);
    }

    /// [`Queue::charge`], or with `held_back` [`Queue::hold_back`] of message `seq`.
    fn charge_outside(&self, bytes: usize, held_back: bool, seq: Option<u64>) {
        let mut g = lock(&self.inner);
        g.held_bytes += bytes;
        if held_back {
            g.held_back += bytes;
        }
        if let Some(seq) = seq {
            *g.held.entry(seq).or_insert(0) += 1;
            self.store_held_min(&g);
        }
        let held = g.held_bytes as u64;
        drop(g);
        self.stats.queued_bytes.store(held, Ordering::Relaxed);
        self.stats.peak_queued_bytes.fetch_max(held, Ordering::Relaxed);
    }

    /// Ends a hold of [`Queue::hold_back`]: the message of sequence number `seq` (if
    /// known) has run (call it after running it: a barrier may return at once), and
    /// `bytes` it charged are freed.
    pub fn let_go(&self, seq: Option<u64>, bytes: usize) {
        if bytes == 0 && seq.is_none() {
            return;
        }
        let mut g = lock(&self.inner);
        let bytes = bytes.min(g.held_back);
        g.held_back -= bytes;
        g.held_bytes = g.held_bytes.saturating_sub(bytes);
        if let Some(seq) = seq {
            if let Some(holds) = g.held.get_mut(&seq) {
                *holds -= 1;
                if *holds == 0 {
                    g.held.remove(&seq);
                }
            }
            self.store_held_min(&g);
        }
        self.stats.queued_bytes.store(g.held_bytes as u64, Ordering::Relaxed);
        drop(g);
        self.space_freed.notify_all();
        if seq.is_some() {
            // Under the lock a barrier checks `done_before` under (the `Waker` contract).
            self.progressed.notify_all();
        }
    }

    /// (Under the lock.) Mirrors the lowest held sequence number into `held_min`.
    fn store_held_min(&self, g: &Inner<T>) {
        let min = g.held.keys().next().copied().unwrap_or(u64::MAX);
        self.held_min.store(min, Ordering::Release);
    }

    /// Whether every message pushed before sequence number `target` has completed and is
    /// not held back (see [`Queue::hold_back`]): what a barrier taken at `target` waits
    /// for. Lock-free.
    pub fn done_before(&self, target: u64) -> bool {
        // `processed` first: a hold is registered before its batch completes, so once the
        // completion is seen the hold is too (or its end).
        self.processed.load(Ordering::Acquire) >= target && self.held_min.load(Ordering::Acquire) >= target
    }

    /// How many messages pushed before `target` have not completed or are held back.
    pub fn outstanding_before(&self, target: u64) -> u64 {
        let g = lock(&self.inner);
        let held = g.held.range(..target).map(|(_, &n)| n as u64).sum::<u64>();
        target.saturating_sub(g.processed) + held
    }

    /// Whether messages pushed before `target` have all completed but some are held back.
    pub fn only_held_before(&self, target: u64) -> bool {
        self.processed.load(Ordering::Acquire) >= target && self.held_min.load(Ordering::Acquire) < target
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

    /// Waits until `bytes` more fit under the bound, or nothing but held-back bytes is
    /// charged (a row larger than the bound goes alone), or the queue is closed; charges
    /// nothing. While it waits it counts as a waiting producer (a recorder's ticker then
    /// writes partial chunks early to make room).
    pub(crate) fn wait_for_room(&self, bytes: usize) {
        let mut g = lock(&self.inner);
        loop {
            let bound = self.bound.load(Ordering::Relaxed);
            if g.closed || g.held_bytes <= g.held_back || g.held_bytes.saturating_add(bytes) <= bound {
                return;
            }
            g = self.space_freed.wait(g);
        }
    }

    /// Whether some producer is waiting for space now.
    pub(crate) fn producers_waiting(&self) -> bool {
        self.space_freed.has_sleepers()
    }
}
