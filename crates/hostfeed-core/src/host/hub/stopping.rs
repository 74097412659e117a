//! Stopping the consumer thread: a stop that lets it drain the queue (abandoning one that
//! makes no progress for the stall timeout), the fresh receiver of a forked child, and
//! `finalize` at interpreter exit. Off the road of a tap: see the module documentation of
//! [`super`].

use std::sync::atomic::Ordering;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::{in_consumer_thread, Abandoned, Control, Hub, StopOutcome};
use crate::error::Error;
use crate::host::sync::lock;

impl Hub {
    /// Abandons the running consumer: it is stuck (made no progress for `stalled_for`).
    pub(super) fn abandon(&self, control: &mut Control, stalled_for: Duration) -> Abandoned {
        self.generation.fetch_add(1, Ordering::AcqRel);
        control.thread = None; // detached: it exits if its callback ever returns
        let reclaimed = self.queue.reclaim_batch();
        self.queue.consumer_exited();
        let name = self.busy_with().map_or_else(|| "?".to_string(), |(id, _)| self.name(id));
        self.mark_idle();
        let failed_calls = self.cancel_calls(&format!(
            "hostfeed: the host callback {name} made no progress for {:.1} s \
             (HOSTFEED_STOP_TIMEOUT) while the receiver was stopping; this call was failed \
             instead of waiting forever",
            stalled_for.as_secs_f64()
        ));
        let abandoned = Abandoned { stalled_for, failed_calls, reclaimed };
        self.note(format!(
            "the host callback {name} made no progress for {:.1} s; its receiver thread was \
             abandoned ({} message(s) written off, {} handed to a new thread, {failed_calls} \
             waiting call(s) failed)",
            stalled_for.as_secs_f64(),
            reclaimed.written_off,
            reclaimed.requeued
        ));
        abandoned
    }

    /// Lets the consumer drain the queue, then stops and joins it. If it makes no progress
    /// for `stall` (`None`: wait forever), it is abandoned (see the module documentation).
    ///
    /// # Errors
    /// [`Error::InsideCallback`] when called from a host callback.
    pub fn stop(&'static self, stall: Option<Duration>) -> Result<StopOutcome, Error> {
        if in_consumer_thread() {
            return Err(Error::InsideCallback("stop_outfeed_receiver"));
        }
        // Hold the control lock through the join so that a handler that needs a consumer
        // waits for this stop to finish and then starts a fresh one.
        let mut control = lock(&self.control);
        let Some(handle) = control.thread.take() else { return Ok(StopOutcome::NotRunning) };
        self.stopping.store(true, Ordering::SeqCst);
        let outcome = self.join_stopping(&mut control, handle, stall);
        self.stopping.store(false, Ordering::SeqCst);
        // Messages pushed while `stopping` was set did not start a consumer (see `push`).
        if control.thread.is_none() && self.queue.processed() < self.queue.enqueued() {
            self.start_locked(&mut control)?;
        }
        Ok(outcome)
    }

    fn join_stopping(&'static self, control: &mut Control, handle: JoinHandle<()>, stall: Option<Duration>) -> StopOutcome {
        self.queue.request_stop();
        let mut seen = (self.queue.progress(), Instant::now());
        while !handle.is_finished() {
            let progress = self.queue.progress();
            if progress != seen.0 {
                seen = (progress, Instant::now());
            } else if stall.is_some_and(|s| seen.1.elapsed() >= s) {
                control.thread = Some(handle);
                return StopOutcome::Abandoned(self.abandon(control, seen.1.elapsed()));
            }
            self.queue.wait_progress(progress, Duration::from_millis(20));
        }
        if handle.join().is_err() {
            self.note("the consumer thread panicked".into());
        }
        StopOutcome::Joined
    }

    /// In a child process created by `fork`: the consumer thread (and every other thread)
    /// exists only in the parent, so the child starts with a fresh, stopped receiver: the
    /// parent's thread is forgotten (never joined: it is not there), queued messages and
    /// waiting calls are written off. The next message starts a consumer as usual.
    pub fn after_fork_in_child(&self) {
        if let Some(mut control) = crate::host::sync::try_lock(&self.control) {
            std::mem::forget(control.thread.take());
        }
        if let Some(mut calls) = crate::host::sync::try_lock(&self.calls) {
            std::mem::forget(std::mem::take(&mut *calls));
        }
        self.queue.reset_after_fork();
        self.mark_idle();
        // (An inline run of the parent's: its thread is not here.)
        self.inline.store(0, Ordering::SeqCst);
    }

    /// Processes what is queued (restarting the consumer once after abandoning a stuck
    /// one), then stops the receiver for good: later messages are refused, waiting calls
    /// fail. Returns the messages that could not be processed (dropped).
    ///
    /// # Errors
    /// As [`Hub::stop`].
    pub fn finalize(&'static self, stall: Option<Duration>) -> Result<usize, Error> {
        let mut abandons = 0;
        loop {
            let outcome = self.stop(stall)?;
            let pending = self.queue.processed() < self.queue.enqueued();
            if matches!(outcome, StopOutcome::Abandoned(_)) {
                abandons += 1;
            }
            if !pending || abandons >= 2 {
                break;
            }
            self.start()?;
        }
        let mut control = lock(&self.control);
        self.finalized.store(true, Ordering::Release);
        self.cancel_calls("hostfeed: the receiver shut down (interpreter exit)");
        let leftovers = self.queue.close();
        control.consumer = None;
        drop(control);
        if !leftovers.is_empty() {
            self.note(format!("{} message(s) were still queued at exit and were dropped", leftovers.len()));
        }
        Ok(leftovers.len())
    }
}
