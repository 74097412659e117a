//! Flushing and closing a recorder: a flush's three steps (begin, wait, end), the errors
//! it reports (one [`RecordError`] naming every array that failed), close, the counters.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::RecordError;
use crate::host::sync::lock;
use crate::record::arrays::{ArrayHandle, ArrayState};
use crate::record::common::read_lock;
use crate::record::recorder::{Recorder, RecorderStats};
use crate::record::trace;

impl Recorder {
    /// Starts a flush: every row received so far goes to the writers. Returns the rows each
    /// array must have written for the flush to be complete.
    pub fn flush_begin(&self) -> Vec<(Arc<ArrayHandle>, u64)> {
        let arrays = read_lock(&self.arrays).clone();
        let mut targets = Vec::with_capacity(arrays.len());
        for a in arrays {
            let mut st = lock(&a.state);
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
        let deadline = Instant::now() + timeout;
        loop {
            let seen = lock(&self.pool.state).finished;
            let done = targets.iter().all(|(a, target)| {
                let st = lock(&a.state);
                st.frontier >= *target || st.failed
            });
            if done {
                return true;
            }
            let mut g = lock(&self.pool.state);
            while g.finished == seen {
                let now = Instant::now();
                if now >= deadline {
                    return false;
                }
                g = self.pool.finished.wait_timeout(g, deadline - now);
            }
        }
    }

    /// Ends a flush: announces every written row and reports the errors since the last
    /// flush (the first, with a count of the others).
    ///
    /// # Errors
    /// The first write error since the last flush.
    pub fn flush_end(&self) -> Result<(), RecordError> {
        let arrays = read_lock(&self.arrays).clone();
        for a in &arrays {
            self.commit(a, true);
        }
        self.take_error()
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

    /// The errors since the last call, and the rows dropped since because their array had
    /// failed, as one [`RecordError::Io`] naming every array concerned (the errno is the
    /// first error's).
    ///
    /// # Errors
    /// That error.
    pub(crate) fn take_error(&self) -> Result<(), RecordError> {
        let mut errors = std::mem::take(&mut *lock(&self.errors));
        let failed = lock(&self.failed_arrays).clone();
        if !failed.is_empty() {
            let arrays = read_lock(&self.arrays);
            for a in failed.iter().filter_map(|&id| arrays.get(id)) {
                let mut st = lock(&a.state);
                if st.dropped > 0 {
                    let (errno, why) = st.failure.clone().unwrap_or_default();
                    errors.push(RecordError::Io {
                        errno,
                        message: format!(
                            "{}: {} more row(s) were dropped because an earlier write of this array \
                             failed ({why})",
                            a.context(),
                            st.dropped
                        ),
                    });
                    st.dropped = 0;
                }
            }
        }
        let errno = errors.iter().find_map(|e| match e {
            RecordError::Io { errno, .. } => *errno,
            _ => None,
        });
        match errors.len() {
            0 => Ok(()),
            1 => Err(RecordError::Io { errno, message: errors[0].message().to_string() }),
            n => Err(RecordError::Io {
                errno,
                message: format!(
                    "{n} recording errors: {}",
                    errors.iter().map(RecordError::message).collect::<Vec<_>>().join("; ")
                ),
            }),
        }
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
        let targets = self.flush_begin();
        while !self.flush_wait(&targets, Duration::from_secs(3600)) {}
        let result = self.flush_end();
        self.stop_threads();
        lock(&self.pool_reservation).take();
        lock(&self.store_lock).take();
        trace::closed();
        result
    }

    /// Stops and joins the writer and ticker threads (once the writers ran out of jobs).
    pub(crate) fn stop_threads(&self) {
        lock(&self.pool.state).stop = true;
        self.pool.work.notify_all();
        *lock(&self.ticker) = true;
        self.ticker_wake.notify_all();
        let threads = std::mem::take(&mut *lock(&self.threads));
        for t in threads {
            if t.join().is_err() {
                self.budget.note(format!("a thread of the recorder of {} panicked", self.root.display()));
            }
        }
    }

    /// Counters.
    #[must_use]
    pub fn stats(&self) -> RecorderStats {
        let rows = read_lock(&self.arrays).iter().map(|a| lock(&a.state).received).sum();
        RecorderStats {
            rows,
            bytes_written: self.bytes_written.load(Ordering::Relaxed),
            chunks_written: self.chunks_written.load(Ordering::Relaxed),
            spills: self.spills.load(Ordering::Relaxed),
            commits: self.commits.load(Ordering::Relaxed),
            rows_dropped: self.rows_dropped.load(Ordering::Relaxed),
        }
    }

    pub(crate) fn record_error(&self, a: &ArrayHandle, st: &mut ArrayState, e: RecordError) {
        st.failed = true;
        let errno = match &e {
            RecordError::Io { errno, .. } => *errno,
            _ => None,
        };
        st.failure = Some((errno, e.message().to_string()));
        // Said at once (logged at the next call into hostfeed), not only by the next flush:
        // from now on this array's rows are dropped.
        self.budget.note(format!(
            "{}: a write failed ({}); this array's later rows are dropped (counted) until the \
             recorder is closed, and every flush() or barrier_wait() raises RecordingError saying \
             how many. Close it and open the store again with mode=\"a\" to go on",
            a.context(),
            e.message()
        ));
        lock(&self.failed_arrays).push(a.id);
        lock(&self.errors).push(e.context(&a.context()));
    }
}
