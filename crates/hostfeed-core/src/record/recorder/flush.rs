//! Flushing and closing a recorder: a flush's three steps (begin, wait, end), close, the
//! ticker's periodic work (the live cycles among it), the counters.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::{Recorder, RecorderStats};
use crate::error::RecordError;
use crate::host::sync::lock;
use crate::record::arrays::{ArrayHandle, ArrayState};
use crate::record::trace;
use crate::record::writer::TICK;

impl Recorder {
    /// Starts a flush: every row received so far goes to the writers. Returns the rows each
    /// array must have written for the flush to be complete.
    pub fn flush_begin(&self) -> Vec<(Arc<ArrayHandle>, u64)> {
        if let Some(w) = self.window.get() {
            w.flush_begins();
        }
        self.begin_writes(self.catalogue.all(), |_| true)
    }

    /// Hands the rows received so far of each array of `arrays` that `pick` chooses (under
    /// its lock) to the writers, a partial chunk included. Returns the rows each must have
    /// written for them to be on disk.
    fn begin_writes(
        &self,
        arrays: Vec<Arc<ArrayHandle>>,
        pick: impl Fn(&ArrayState) -> bool,
    ) -> Vec<(Arc<ArrayHandle>, u64)> {
        let mut targets = Vec::with_capacity(arrays.len());
        for a in arrays {
            let mut st = lock(&a.state);
            if !pick(&st) {
                continue;
            }
            // A streamed shard's rows are durable once its object is complete: a job
            // without rows completes it when no row is pending.
            let streaming = a.spec.inner_rows.is_some() && self.store.streams() && st.frontier < st.received;
            if !st.pending.is_empty() || streaming {
                self.submit(&a, &mut st, true);
            }
            let received = st.received;
            drop(st);
            targets.push((a, received));
        }
        targets
    }

    /// Waits up to `timeout` until every array has written its target rows (or failed).
    /// Returns whether they have.
    pub fn flush_wait(&self, targets: &[(Arc<ArrayHandle>, u64)], timeout: Duration) -> bool {
        self.writers.wait_for(targets, timeout)
    }

    /// What a flush waiting on `targets` still waits for, for a note to the program (a
    /// flush or close that takes long): the rows each array has yet to write, and what
    /// the writers wait on.
    #[must_use]
    pub fn flush_waiting_for(&self, targets: &[(Arc<ArrayHandle>, u64)]) -> String {
        let mut left = Vec::new();
        for (a, target) in targets {
            let st = lock(&a.state);
            let rows = target.saturating_sub(st.frontier);
            if rows > 0 && !st.failed {
                left.push(format!("{rows} row{} of {:?}", if rows == 1 { "" } else { "s" }, a.name));
            }
        }
        let shown = left.len().min(4);
        let mut what = left[..shown].join(", ");
        if left.len() > shown {
            what = format!("{what} and {} more arrays", left.len() - shown);
        }
        if what.is_empty() {
            what = "the last writes".to_string();
        }
        let on = if self.store.in_place().is_some() {
            "writes to the file system (a slow or full disk, or a network file system that does not answer)"
        } else {
            "uploads in flight, which an object store that does not answer (an outage, a proxy down) has \
             retried for up to its retry_timeout (storage_options, default 180 s)"
        };
        format!("{what} not written yet; the writers wait on {on}")
    }

    /// Ends a flush: announces every written row and reports the errors since the last
    /// flush (the first, with a count of the others).
    ///
    /// # Errors
    /// The first write error since the last flush.
    pub fn flush_end(&self) -> Result<(), RecordError> {
        self.commit_all();
        let result = self.failures.take(&self.catalogue);
        if let Some(w) = self.window.get() {
            // The triggers closed when the flush began have every row written, unless a
            // write failed: their entries say so in the document.
            w.flush_ends(result.is_ok());
            self.commit_all();
        }
        result
    }

    #[cfg(test)]
    /// [`Recorder::flush_begin`], [`Recorder::flush_wait`] (for up to `timeout`) and
    /// [`Recorder::flush_end`]. Returns `Ok(false)` if the writes did not finish in time.
    ///
    /// # Errors
    /// As [`Recorder::flush_end`].
    pub(crate) fn flush(&self, timeout: Duration) -> Result<bool, RecordError> {
        let targets = self.flush_begin();
        let finished = self.flush_wait(&targets, timeout);
        self.flush_end()?;
        Ok(finished)
    }

    /// Flushes (waiting as long as it takes), then stops the threads; rows that arrive
    /// later are dropped with a note. Closing twice does nothing.
    ///
    /// # Errors
    /// As [`Recorder::flush_end`].
    pub fn close(&self) -> Result<(), RecordError> {
        if self.forked_away() {
            // The threads and the store are the parent's: nothing here to stop or release.
            self.closed.store(true, Ordering::SeqCst);
            return Ok(());
        }
        if self.closed.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        if let Some(w) = self.window.get() {
            w.closing();
        }
        let targets = self.flush_begin();
        while !self.flush_wait(&targets, Duration::from_secs(3600)) {}
        // The last commit announces the metadata arrays' rows exactly.
        self.committer.announce_exactly();
        let result = self.flush_end();
        self.stop_threads();
        lock(&self.pool_reservation).take();
        lock(&self.store_lock).take();
        trace::closed();
        result
    }

    /// Stops and joins the writer and ticker threads (once the writers ran out of jobs).
    pub(super) fn stop_threads(&self) {
        self.writers.stop(|| {
            self.budget.note(format!("a thread of the recorder of {} panicked", self.root.display()));
        });
    }

    /// The ticker's work, every [`TICK`]: a spill for producers stuck behind rows in
    /// partial chunks, the lease, the live cycles.
    pub(super) fn tick(&self) {
        // Producers stuck behind rows in partial chunks that nothing else will write.
        if self.pending_bytes.load(Ordering::Relaxed) > 0
            && self.budget.producers_waiting()
            && self.writers.idle()
        {
            self.spill();
        }
        self.renew_lease();
        self.live_cycle();
    }

    /// A live cycle when one is due ([`Committer::cycle_due`]): the rows every array has
    /// received and not announced go to the writers, partial chunks included; then, at
    /// this tick and the next ones, each array whose rows are written is announced. On a
    /// file system the ticker writes them itself if the writers have not (within a tick),
    /// and waits for them up to a tick, so that their rows are announced at once.
    ///
    /// [`Committer::cycle_due`]: crate::record::commit::Committer::cycle_due
    fn live_cycle(&self) {
        if self.committer.cycle_due() {
            let busy = self.committer.in_flight();
            let arrays = self.catalogue.all().into_iter().filter(|a| !busy.contains(&a.id)).collect();
            let targets = self.begin_writes(arrays, |st| st.received > st.committed && !st.failed);
            if !targets.is_empty() {
                self.committer.expect(targets);
                let waiting = self.committer.waiting();
                if self.store.in_place().is_some() {
                    // A file system's writes take milliseconds: the ticker writes what it can
                    // itself, at its own priority, the writers' being lowered.
                    self.writers.help(&*self.store, &self.failures, &waiting, TICK);
                }
                self.writers.wait_for(&waiting, TICK);
            }
        }
        let written = self.committer.take_written();
        // With a window, the triggers' document first, under its lock (`with_triggers`):
        // no row routed for a trigger is announced before the trigger is listed.
        self.with_triggers(|| {
            for a in &written {
                self.committer.commit(&*self.store, &self.catalogue, &self.failures, a);
            }
        });
        if !written.is_empty() && !self.shared {
            self.announce_parted();
        }
    }

    /// Announces the rows every part of each parted array has committed (a store of one
    /// process: a shared store's are announced by its leader, once the processes agree).
    fn announce_parted(&self) {
        for name in self.catalogue.parted_names() {
            let Ok(parts) = self.parted_handles(&name) else { continue };
            let rows = parts.iter().map(|a| lock(&a.state).committed).min().unwrap_or(0);
            if rows > 0 {
                if let Err(e) = self.committer.commit_parted(&*self.store, &self.catalogue, &parts[0], rows) {
                    self.failures.push(e);
                }
            }
        }
    }

    /// Renews the store lock's lease when due (an object store's); a failure is reported by the next flush.
    fn renew_lease(&self) {
        let renewed = match &*lock(&self.store_lock) {
            Some(held) => held.renew_if_due(),
            None => Ok(()),
        };
        if let Err(e) = renewed {
            self.failures.push(e);
        }
    }

    /// Rows array `name` received (those it held when resumed included; a windowed
    /// array's, those its window took); `None` if no array has that name.
    #[must_use]
    pub fn rows_received(&self, name: &str) -> Option<u64> {
        match self.window.get() {
            Some(w) => self.catalogue.rows_received_and(name, |id| w.rows_taken(id)),
            None => self.catalogue.rows_received_by(name),
        }
    }

    /// Counters.
    #[must_use]
    pub fn stats(&self) -> RecorderStats {
        let rows = self.catalogue.rows_received();
        let (bytes_written, chunks_written) = self.writers.written();
        RecorderStats {
            rows,
            bytes_written,
            chunks_written,
            spills: self.spills.load(Ordering::Relaxed),
            commits: self.committer.count(),
            rows_dropped: self.rows_dropped.load(Ordering::Relaxed),
        }
    }
}
