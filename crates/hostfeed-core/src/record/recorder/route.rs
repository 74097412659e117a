//! Routing rows: a row appended to its array's pending chunk, and a full chunk (or, at a
//! flush or a spill, a partial one) handed to the writers as a job; the byte bound's share
//! of the rows waiting in partial chunks (see the recorder's documentation).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use super::Recorder;
use crate::error::RecordError;
use crate::host::buffer::HostBuffer;
use crate::host::message::recorded_device;
use crate::host::sync::lock;
use crate::record::arrays::{ArrayHandle, ArrayState, Job, Payload, Row, RowMeta};
use crate::record::common::as_u64;
use crate::record::window::Admitted;
use crate::record::zarr::Codec;

/// Rows that reached a closed recorder and were dropped, not yet reported to the program:
/// (store, array) -> rows. Process-wide, so that the program learns of them even when it
/// holds the recorder no more (see [`take_late_drops`]).
static LATE: Mutex<BTreeMap<(String, String), u64>> = Mutex::new(BTreeMap::new());
/// Whether [`LATE`] holds anything (read without its lock by every barrier).
static HAS_LATE: AtomicBool = AtomicBool::new(false);

/// One entry of [`take_late_drops`]: rows of an array that reached its recorder after it
/// was closed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LateDrop {
    /// The recorder's store (a path, or an object store's URL).
    pub store: String,
    /// The array's name.
    pub array: String,
    /// Rows dropped.
    pub rows: u64,
}

/// Takes the rows dropped since the last call because they reached a closed recorder
/// (compiled code run after `close`), by store and array, for the program to raise
/// (`barrier_wait`) or report (interpreter exit). Without a lock when there are none.
#[must_use]
pub fn take_late_drops() -> Vec<LateDrop> {
    if !HAS_LATE.swap(false, Ordering::AcqRel) {
        return Vec::new();
    }
    std::mem::take(&mut *lock(&LATE))
        .into_iter()
        .map(|((store, array), rows)| LateDrop { store, array, rows })
        .collect()
}

/// Forgets the late drops (a forked child: they are the parent's to report).
pub(crate) fn forget_late_drops() {
    HAS_LATE.store(false, Ordering::Release);
    if let Ok(mut late) = LATE.try_lock() {
        late.clear();
    }
}

fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

impl Recorder {
    /// Keeps `buf`, whose `charged` bytes are charged against the byte bound, for rows
    /// until they are written; the charge is released when the last of them is dropped.
    pub(crate) fn hold(&self, buf: HostBuffer, charged: usize) -> Arc<Payload> {
        Arc::new(Payload::new(buf, charged, Arc::clone(&self.budget)))
    }

    /// Counts a row of `a` that reached this recorder after it was closed, for
    /// [`take_late_drops`].
    pub(super) fn note_late(&self, a: &ArrayHandle) {
        *lock(&LATE).entry((self.root.display().to_string(), a.name.clone())).or_insert(0) += 1;
        HAS_LATE.store(true, Ordering::Release);
    }

    /// Keeps `e` (a failure no array is to blame for) for the next flush to report.
    pub(crate) fn report(&self, e: RecordError) {
        self.failures.push(e);
    }

    /// The metadata of a row arriving now: the next record number, and the given step,
    /// device and transforms index.
    pub(crate) fn meta(&self, step: i64, device: i32, transforms: i16) -> RowMeta {
        let seq = i64::try_from(self.next_seq.fetch_add(1, Ordering::Relaxed)).unwrap_or(i64::MAX);
        RowMeta { seq, step, device: recorded_device(device), time_ns: now_ns(), transforms }
    }

    /// Appends a row to its array's pending chunk; a full chunk goes to the writers; with
    /// a window, the row goes there first (`record/window`: kept in memory, or searched for
    /// a non-finite value). Never does I/O, never waits (beyond short locks; a trigger
    /// firing waits for a commit in progress, see [`Window::doc_lock`]).
    ///
    /// [`Window::doc_lock`]: crate::record::window::Window
    pub(crate) fn route_row(&self, a: &Arc<ArrayHandle>, row: Row) {
        let Some(window) = self.window.get() else { return self.store_row(a, row) };
        match window.admit(a, row, &|a, row| self.store_row(a, row)) {
            Ok(Admitted::Kept) => {}
            Ok(Admitted::Store(row)) => self.store_row(a, row),
            Err(e) => {
                self.budget.note(e.message().to_string());
                self.failures.push(e);
            }
        }
    }

    /// [`Recorder::route_row`] for a row that goes to the store.
    pub(crate) fn store_row(&self, a: &Arc<ArrayHandle>, row: Row) {
        let mut st = lock(&a.state);
        // Checked under the array's lock: `close` sets the flag, then spills every array
        // under its lock, so a row is either spilled by it or sees the flag.
        if self.is_closed() || st.failed {
            st.dropped += 1;
            self.rows_dropped.fetch_add(1, Ordering::Relaxed);
            let closed = self.is_closed();
            drop(st);
            drop(row);
            if closed {
                if !self.forked_away() {
                    self.note_late(a);
                }
                self.budget.note(format!(
                    "{}: a row arrived after the recorder was closed and was dropped (the next \
                     barrier_wait raises it)",
                    a.context()
                ));
            }
            return;
        }
        st.meta.push(row.meta);
        st.received += 1;
        st.pending.push(row);
        let cr = self.write_rows(a);
        if (st.pending_first % cr) + as_u64(st.pending.len()) == cr {
            self.submit(a, &mut st, false);
        } else {
            let pending =
                self.pending_bytes.fetch_add(a.spec.row_bytes(), Ordering::Relaxed) + a.spec.row_bytes();
            drop(st);
            if pending > self.budget.bound() / 2 {
                self.spill();
            }
        }
    }

    /// Rows a writer's job of array `a` holds once complete: a chunk (a shard), or for a
    /// shard written in place, an inner chunk.
    fn write_rows(&self, a: &ArrayHandle) -> u64 {
        match a.spec.inner_rows {
            Some(inner) if self.in_place_shards(a) || self.store.streams() => inner,
            _ => a.spec.chunk_rows,
        }
    }

    /// Whether `a` is sharded and its shards are written in place (uncompressed, on a file
    /// system).
    fn in_place_shards(&self, a: &ArrayHandle) -> bool {
        a.spec.inner_rows.is_some() && matches!(a.spec.codec, Codec::Raw) && self.store.in_place().is_some()
    }

    /// Hands the array's pending rows to the writers (under its lock, so that jobs of one
    /// chunk are submitted in order).
    pub(super) fn submit(&self, a: &Arc<ArrayHandle>, st: &mut ArrayState, partial: bool) {
        let rows = std::mem::take(&mut st.pending);
        let first_row = st.pending_first;
        let cr = a.spec.chunk_rows;
        let chunk = first_row / cr;
        let n = as_u64(rows.len());
        st.pending_first += n;
        // The rows counted as pending: all of them, except the row that completed a chunk
        // (`route_row` submits before counting it).
        let counted = if partial { rows.len() } else { rows.len().saturating_sub(1) };
        self.pending_bytes.fetch_sub(counted * a.spec.row_bytes(), Ordering::Relaxed);
        // Rows of this chunk put earlier in a padded partial chunk are read back by the next
        // write of it: compressed chunks, and every chunk of a store that cannot write into
        // part of an object.
        let whole = matches!(a.spec.codec, Codec::Zstd(_)) || self.store.in_place().is_none();
        let disk_prefix = if whole { st.on_disk_prefix } else { 0 };
        // After a partial compressed chunk, the next write of it starts from the disk copy.
        st.on_disk_prefix = st.pending_first % cr;
        let job = Job { array: Arc::clone(a), chunk, first_row, rows, partial, disk_prefix };
        self.writers.submit(job);
    }

    /// Writes every partial chunk (a *spill*: see the recorder's documentation).
    pub(super) fn spill(&self) {
        let mut any = false;
        for a in &self.catalogue.all() {
            let mut st = lock(&a.state);
            if !st.pending.is_empty() {
                if !any {
                    // Counted before the first job is submitted: a writer may finish it (and
                    // release its bytes) before this loop ends.
                    self.spills.fetch_add(1, Ordering::Relaxed);
                    any = true;
                }
                self.submit(a, &mut st, true);
            }
        }
    }
}
