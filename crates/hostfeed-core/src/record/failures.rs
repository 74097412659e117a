//! The errors a recorder's next flush reports: each failed write (after which its array's
//! rows are dropped, and counted), and what failed without an array to blame (a lease not
//! renewed, a message that does not match its sink). A flush reports them as one
//! [`RecordError`] naming every array concerned.

use std::sync::{Arc, Mutex};

use crate::error::RecordError;
use crate::host::sync::lock;
use crate::record::arrays::{ArrayHandle, ArrayState};
use crate::record::catalogue::Catalogue;
use crate::record::common::{ArrayId, Budget};

/// See the module documentation.
pub(crate) struct Failures {
    /// Where a failed write is said at once (logged at the next call into hostfeed).
    budget: Arc<dyn Budget>,
    /// Errors not yet reported by a flush.
    errors: Mutex<Vec<RecordError>>,
    /// Arrays whose writes failed (their later rows are dropped), by id.
    failed_arrays: Mutex<Vec<ArrayId>>,
}

impl Failures {
    /// No failure yet; failed writes are said through `budget`.
    pub(crate) fn new(budget: Arc<dyn Budget>) -> Self {
        Failures { budget, errors: Mutex::new(Vec::new()), failed_arrays: Mutex::new(Vec::new()) }
    }

    /// Keeps `e` for the next flush to report.
    pub(crate) fn push(&self, e: RecordError) {
        lock(&self.errors).push(e);
    }

    /// Marks array `a` failed by `e` (under its lock, `st`): its later rows are dropped.
    pub(crate) fn record(&self, a: &ArrayHandle, st: &mut ArrayState, e: RecordError) {
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

    /// The errors since the last call, and the rows dropped since because their array had
    /// failed (the arrays of `catalogue`), as one [`RecordError::Io`] naming every array
    /// concerned (the errno is the first error's).
    ///
    /// # Errors
    /// That error.
    pub(crate) fn take(&self, catalogue: &Catalogue) -> Result<(), RecordError> {
        let mut errors = std::mem::take(&mut *lock(&self.errors));
        let failed = lock(&self.failed_arrays).clone();
        if !failed.is_empty() {
            for a in catalogue.handles(&failed) {
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
}
