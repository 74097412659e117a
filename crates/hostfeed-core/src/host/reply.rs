//! The one-shot reply slot a `call` handler waits on.
//!
//! The handler (on an XLA thread) describes its output buffers, pushes the request and
//! waits. The consumer fills the outputs *directly* (one copy, from the callback's numpy
//! arrays into XLA's buffers) and records success or an error message. The handler may
//! give up at a deadline, and `stop` may cancel it; both mark the slot so that a late
//! reply is refused instead of writing into buffers XLA has reclaimed.
//!
//! No Python here.

use std::time::{Duration, Instant};

use crate::host::sync::atomic::{AtomicBool, Ordering};
use crate::host::sync::{lock, spin_until, AdaptiveSpin, Mutex, Waker};

/// How long a waiting handler polls for the reply, yielding the CPU between looks, before
/// sleeping: not at all. On a loaded machine a yield can lose the CPU to busy processes
/// for a whole scheduler time slice, milliseconds on a round trip that otherwise takes
/// microseconds; a handler woken from sleep sees the reply within microseconds.
const REPLY_SPIN: Duration = Duration::ZERO;
/// The longest a waiting handler spins (never yielding) before sleeping (see
/// `AdaptiveSpin`): while the consumer answers within microseconds (it was awake), the
/// handler sees the reply without sleeping and being woken; when replies come late (a
/// loaded machine, a slow host function), the spin stops within a few calls.
static REPLY_ADAPTIVE_SPIN: AdaptiveSpin = AdaptiveSpin::new(Duration::from_micros(100));
/// Longest sleep between two looks at the interruption check of [`ReplySlot::wait`].
const POLL_SLICE: Duration = Duration::from_millis(20);

/// One output buffer of the custom call, owned by XLA.
#[derive(Debug)]
pub struct OutBuf {
    /// `XLA_FFI_DataType` code.
    pub dtype: i32,
    /// The buffer.
    pub data: *mut u8,
    /// Its length in bytes.
    pub nbytes: usize,
    /// Its dimensions.
    pub dims: Vec<i64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Phase {
    Pending,
    Replied(Result<(), String>),
    /// The handler stopped waiting (deadline or cancellation); the outputs are gone.
    Abandoned,
}

struct State {
    phase: Phase,
    outputs: Vec<OutBuf>,
}

/// See the module documentation.
pub struct ReplySlot {
    state: Mutex<State>,
    replied: Waker,
    /// Set (after the phase) when a reply was recorded; lets `wait` poll without locking.
    answered: AtomicBool,
    /// Set when the consumer took the request (its host function is about to run).
    started: AtomicBool,
}

// SAFETY: the raw output pointers are only dereferenced by `reply_with` while the phase is
// `Pending`, under the slot's lock. While the phase is `Pending` the handler that owns the
// buffers is blocked in `wait` (it leaves `wait` only after moving the phase out of
// `Pending` under the same lock), so the buffers are alive and written by one thread at a
// time. Everything else in the slot is plain owned data.
unsafe impl Send for ReplySlot {}
// SAFETY: see above; all access goes through the mutex.
unsafe impl Sync for ReplySlot {}

/// Why `wait` returned without a reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoReply {
    /// The deadline passed first.
    TimedOut,
    /// The interruption check answered this reason first.
    Interrupted(String),
}

impl ReplySlot {
    /// A pending slot for a call with these outputs.
    #[must_use]
    pub fn new(outputs: Vec<OutBuf>) -> Self {
        ReplySlot {
            state: Mutex::new(State { phase: Phase::Pending, outputs }),
            replied: Waker::new(),
            answered: AtomicBool::new(false),
            started: AtomicBool::new(false),
        }
    }

    /// The output buffers of a slot nobody else holds (a request that was not sent).
    #[must_use]
    pub(crate) fn into_outputs(self) -> Vec<OutBuf> {
        self.state.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner).outputs
    }

    /// Records that the consumer took the request.
    pub fn mark_started(&self) {
        self.started.store(true, Ordering::Relaxed);
    }

    /// Whether the consumer took the request.
    pub(crate) fn is_started(&self) -> bool {
        self.started.load(Ordering::Relaxed)
    }

    /// Whether nobody has replied or given up yet.
    pub fn is_pending(&self) -> bool {
        lock(&self.state).phase == Phase::Pending
    }

    /// If still pending, lets `fill` write the outputs and records its outcome. Returns
    /// `false` (and does not call `fill`) if the slot was already replied to or abandoned.
    pub fn reply_with(&self, fill: impl FnOnce(&[OutBuf]) -> Result<(), String>) -> bool {
        let mut g = lock(&self.state);
        if g.phase != Phase::Pending {
            return false;
        }
        let outcome = fill(&g.outputs);
        g.phase = Phase::Replied(outcome);
        self.answered.store(true, Ordering::Release);
        drop(g);
        self.replied.notify_all();
        true
    }

    /// Replies with an error (the callback failed, the receiver stopped, ...).
    pub fn fail(&self, message: String) -> bool {
        self.reply_with(|_| Err(message))
    }

    /// Waits for the reply until `deadline` (`None`: forever), looking at `interrupted`
    /// at least every 20 ms: when it answers a reason, the wait ends with that reason. On
    /// a timeout or interruption the slot is abandoned, so a late reply is refused.
    ///
    /// # Errors
    /// [`NoReply`] when the deadline passed or the wait was interrupted first.
    pub fn wait(
        &self,
        deadline: Option<Instant>,
        mut interrupted: impl FnMut() -> Option<String>,
    ) -> Result<Result<(), String>, NoReply> {
        if !spin_until(REPLY_SPIN, || self.answered.load(Ordering::Acquire)) {
            REPLY_ADAPTIVE_SPIN.spin(|| self.answered.load(Ordering::Acquire));
        }
        let mut g = lock(&self.state);
        loop {
            if let Phase::Replied(outcome) = &g.phase {
                let outcome = outcome.clone();
                g.phase = Phase::Abandoned; // the outputs belong to XLA again
                return Ok(outcome);
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                g.phase = Phase::Abandoned;
                return Err(NoReply::TimedOut);
            }
            if let Some(why) = interrupted() {
                g.phase = Phase::Abandoned;
                return Err(NoReply::Interrupted(why));
            }
            let slice = deadline.map_or(POLL_SLICE, |d| (d - now).min(POLL_SLICE));
            g = self.replied.wait_timeout(g, slice);
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    fn slot_with(buf: &mut [u8]) -> ReplySlot {
        ReplySlot::new(vec![OutBuf { dtype: 6, data: buf.as_mut_ptr(), nbytes: buf.len(), dims: vec![4] }])
    }

    #[test]
    fn reply_fills_outputs_once() {
        let mut buf = [0u8; 4];
        let slot = slot_with(&mut buf);
        assert!(slot.reply_with(|outs| {
            // SAFETY: the slot is pending and `buf` outlives it.
            unsafe { std::ptr::copy_nonoverlapping([1u8, 2, 3, 4].as_ptr(), outs[0].data, 4) };
            Ok(())
        }));
        assert!(!slot.fail("late".into()));
        assert_eq!(slot.wait(None, || None), Ok(Ok(())));
        drop(slot);
        assert_eq!(buf, [1, 2, 3, 4]);
    }

    #[test]
    fn timeout_abandons_and_refuses_late_replies() {
        let mut buf = [0u8; 4];
        let slot = slot_with(&mut buf);
        assert_eq!(
            slot.wait(Some(Instant::now() + Duration::from_millis(5)), || None),
            Err(NoReply::TimedOut)
        );
        assert!(!slot.reply_with(|_| panic!("must not write after abandonment")));
        assert!(!slot.is_pending());
    }

    #[test]
    fn waiter_wakes_on_reply_from_another_thread() {
        let slot = Arc::new(ReplySlot::new(Vec::new()));
        let s2 = Arc::clone(&slot);
        let t = std::thread::spawn(move || s2.wait(Some(Instant::now() + Duration::from_secs(30)), || None));
        assert!(slot.fail("callback raised".into()));
        assert_eq!(t.join().unwrap(), Ok(Err("callback raised".into())));
    }

    #[test]
    fn interruption_ends_the_wait_and_refuses_late_replies() {
        let slot = ReplySlot::new(Vec::new());
        let mut looks = 0;
        let got = slot.wait(None, || {
            looks += 1;
            (looks == 3).then(|| "interrupted".to_string())
        });
        assert_eq!(got, Err(NoReply::Interrupted("interrupted".into())));
        assert!(!slot.fail("late".into()));
    }
}
