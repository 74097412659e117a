//! The consumer thread's side of the hub: its access to the hub ([`Worker`]) and the
//! batch of messages it is processing ([`Batch`]), which marks the consumer busy with each
//! message it takes and, when it ends, idle and the batch processed.

use std::sync::atomic::Ordering;

use super::{Hub, MAX_BATCH};
use crate::host::cpu_share;
use crate::host::message::Message;

/// The consumer thread's access to the hub.
pub struct Worker {
    pub(super) hub: &'static Hub,
    pub(super) generation: u64,
}

impl Worker {
    /// Waits for the next batch; `None` when the consumer must exit (stopped, closed, or
    /// abandoned in favour of a newer consumer).
    #[must_use]
    pub(crate) fn next_batch(&self) -> Option<Batch> {
        let r = self.hub;
        if r.generation.load(Ordering::Acquire) != self.generation {
            return None;
        }
        if r.inline.load(Ordering::Acquire) == 0 {
            r.mark_idle();
        }
        let epoch = r.queue.begin_batch(MAX_BATCH)?;
        r.enter_batch(self.generation);
        cpu_share::note_consumer_cpu();
        Some(Batch { hub: r, epoch, generation: self.generation })
    }
}

/// A batch of messages being processed. Messages are taken one at a time so that a
/// consumer stuck in one of them can be relieved of the rest ([`Queue::reclaim_batch`](crate::host::queue::Queue::reclaim_batch)).
/// Ending (or dropping) the batch completes what was taken.
pub struct Batch {
    hub: &'static Hub,
    epoch: u64,
    /// The consumer generation that took it (an abandoned consumer's batch may end later).
    generation: u64,
}

impl Batch {
    /// The next message, or `None` when the batch is exhausted (or was reclaimed).
    #[must_use]
    pub fn take(&self) -> Option<Message> {
        self.take_if(|_| true)
    }

    /// The next message if `accept` accepts it (it runs under the batch's lock: it must
    /// only look at the message); `None` when the batch is exhausted or `accept` refused.
    #[must_use]
    pub fn take_if(&self, accept: impl FnOnce(&Message) -> bool) -> Option<Message> {
        let m = self.hub.queue.take_if(self.epoch, accept)?;
        let now = self.hub.timing.raw_now();
        self.hub.timing.record_handover_at(m.queued_at, now);
        self.hub.mark_busy(m.consumer_id, now);
        Some(m)
    }

    /// The next message if `accept` accepts it, with its bytes still charged after the
    /// batch ends (see [`Queue::take_retained`](crate::host::queue::Queue::take_retained)): the caller owes `release` of the returned
    /// byte count (the recorder keeps rows until they are written).
    #[must_use]
    pub(crate) fn take_retained(&self, accept: impl FnOnce(&Message) -> bool) -> Option<(Message, usize)> {
        let (m, bytes) = self.hub.queue.take_retained(self.epoch, accept)?;
        self.hub.mark_busy(m.consumer_id, self.hub.timing.raw_now());
        Some((m, bytes))
    }

    /// Messages not taken yet.
    #[must_use]
    pub fn remaining(&self) -> usize {
        self.hub.queue.remaining(self.epoch)
    }
}

impl Drop for Batch {
    fn drop(&mut self) {
        // Before the batch counts as processed: whoever sees it processed (a barrier, a
        // call that would run on its device's thread) sees the consumer busy with none of
        // its messages and holding no batch. (Not the batch of an abandoned consumer whose
        // callback returned at last: a newer consumer may be busy.)
        if self.hub.generation.load(Ordering::Acquire) == self.generation {
            self.hub.mark_idle();
            self.hub.in_batch.store(false, Ordering::SeqCst);
        }
        // Messages not taken (the dispatcher failed) are dropped and counted.
        let dropped = self.hub.queue.end_batch(self.epoch);
        if dropped > 0 {
            self.hub.note(format!("{dropped} message(s) were dropped after the dispatcher failed"));
        }
    }
}
