//! The flight recorder of a recorder: a *window* that keeps the rows of the last steps of
//! the arrays recorded with `keep="window"` in host memory instead of writing them, and the
//! *triggers* that write it out (a non-finite value in any recorded row, a host predicate
//! on a watched value, an explicit `keep`, another process's trigger).
//!
//! ## Where the rows wait
//!
//! Rows reach the window where every row reaches its recorder (`Recorder::route_row`, on
//! the consumer thread for rows routed from messages, on the caller's for rows given by
//! Python): a windowed row is kept in the [`Ring`] under the window's lock,
//! with no I/O. A row whose message buffer holds it alone (a record of one value, no
//! lanes) is kept in that buffer, whose charge against the receiver queue's bound is
//! released (the window has its own bound, `bytes`): no copy, and the device's copy into
//! it was the tap's. Any other row (lanes sharing a buffer, a GPU's pinned block, bytes
//! lent by Python) is copied into a buffer of its own. Buffers come from the host buffer
//! pool (at most twice the bytes asked; an evicted row's goes back there, warm for the
//! next message). A row counts its buffer's capacity plus [`ROW_OVERHEAD`]: the bound is
//! on the memory held.
//!
//! ## Triggers
//!
//! A trigger fired at step `t` takes the ring's rows of steps `t - steps + 1 ..= t +
//! after` (a `keep`: every step the ring holds), routes them to the store in step order,
//! and has later rows of those steps routed to the store as they come (`through`
//! ranges; overlapping windows merge, and a row taken from the ring is written once).
//! Each trigger is listed in the store's root attributes (`triggers.rs`) with the steps it
//! kept of every array. That document is written before any commit announces those rows:
//! whatever routes rows for a trigger and every commit hold the window's document lock
//! ([`Window::doc_lock`]), so a process killed mid-write leaves rows that are whole and a
//! document that lists what is missing.
//!
//! The non-finite trigger is armed until it fires once: every recorded row (windowed or
//! not, raw or summary) is scanned (`finite.rs`) until then.
//!
//! No Python here.

mod finite;
mod ring;
#[cfg(test)]
mod tests;
mod triggers;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{json, Map, Value};

use crate::error::RecordError;
use crate::host::buffer::HostBuffer;
use crate::host::sync::lock;
use crate::record::arrays::{ArrayHandle, Payload, Row};
use crate::record::common::{read_lock, write_lock, ArrayId};

use self::finite::{first_counted, Scan};
use self::ring::{Group, Ring};
pub(crate) use self::triggers::Kind;
use self::triggers::{earlier_triggers, root_attributes, Trigger};

/// What a row kept in the window counts besides its buffer (its row, payload and group
/// entries).
pub(crate) const ROW_OVERHEAD: usize = 128;

/// How a recorder's window works.
#[derive(Debug, Clone)]
pub struct WindowOptions {
    /// Steps kept of each windowed array (0: no array is windowed; the triggers still
    /// fire and are listed).
    pub steps: usize,
    /// Most bytes kept (see the module documentation).
    pub bytes: usize,
    /// Steps after a trigger's step that are written too.
    pub after: u64,
    /// Whether a non-finite value in a recorded row fires a trigger.
    pub nonfinite: bool,
    /// This process's index (a `jax.distributed` run's), naming its triggers.
    pub process: u32,
    /// Whether this process writes the store's root document (a shared store's members do
    /// not).
    pub writes_doc: bool,
}

/// What the window does with one array's rows.
#[derive(Debug, Clone, Default)]
struct Traits {
    windowed: bool,
    check: Check,
}

/// How an array's rows are searched for non-finite values.
#[derive(Debug, Clone, Default)]
enum Check {
    #[default]
    None,
    /// Every value (`components` per element: 2 for complex types).
    Values { scan: Scan, components: usize },
    /// A summary row: float32 values, `width` per kept position, whose `columns` count the
    /// non-finite values summarized.
    Counted { width: usize, columns: Vec<usize> },
}

/// What became of a row handed to [`Window::admit`].
pub(crate) enum Admitted {
    /// Kept in the window (or dropped with an error).
    Kept,
    /// For the store, as any row.
    Store(Row),
}

#[derive(Default)]
struct State {
    ring: Option<Ring>,
    /// Step ranges whose windowed rows go to the store as they come.
    through: Vec<(i64, i64)>,
    triggers: Vec<Trigger>,
    /// Local triggers fired so far (the next one's number).
    fired_here: u64,
    /// Triggers Python's policy has not taken yet: from this index.
    unseen: usize,
    /// Local triggers not yet handed to the publisher (a shared store's): from this index.
    unpublished: usize,
    /// The newest step of a windowed row.
    newest: Option<i64>,
    /// The document changed since it was last written.
    dirty: bool,
    /// Triggers closed when the current flush began (marked written when it ends).
    flushing: Vec<usize>,
    /// Windowed rows taken so far, by array id (kept or routed; for `rows_kept`).
    taken: Vec<u64>,
}

/// What the store's root document starts from.
pub(crate) struct Doc {
    /// The root attributes (the earlier recording's when appended to).
    base: Value,
    /// Triggers of the earlier recording.
    earlier: Vec<Value>,
}

/// See the module documentation.
pub(crate) struct Window {
    opts: WindowOptions,
    traits: RwLock<Vec<Traits>>,
    state: Mutex<State>,
    /// Woken when a local trigger fires (the publisher of a shared store waits on it).
    news: Condvar,
    doc: Mutex<Doc>,
    /// The non-finite trigger has not fired yet.
    armed: AtomicBool,
    /// Triggers fired or applied (read by Python without a lock).
    count: AtomicU64,
}

fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

impl Window {
    /// A window with `opts`, whose store's root attributes are `attrs` (an earlier
    /// recording's, whose triggers it keeps, but those after `resume_after_step`).
    pub(crate) fn new(opts: WindowOptions, attrs: Value, resume_after_step: Option<i64>) -> Self {
        let earlier = earlier_triggers(&attrs, resume_after_step);
        let ring = (opts.steps > 0).then(|| Ring::new(opts.steps, opts.bytes));
        Window {
            armed: AtomicBool::new(opts.nonfinite),
            opts,
            traits: RwLock::new(Vec::new()),
            state: Mutex::new(State { ring, dirty: !earlier.is_empty(), ..State::default() }),
            news: Condvar::new(),
            doc: Mutex::new(Doc { base: attrs, earlier }),
            count: AtomicU64::new(0),
        }
    }

    /// The options.
    pub(crate) fn options(&self) -> &WindowOptions {
        &self.opts
    }

    /// Says how array `a`'s rows are handled: kept in the window (`windowed`), and searched
    /// for non-finite values: every value, or where `columns` are given (a summary: its
    /// rows float32 of `width` columns a kept position), those columns for non-zero counts.
    ///
    /// # Errors
    /// A windowed array when the window keeps no step; columns of a row that is not
    /// float32 or not of `width` columns.
    pub(crate) fn set_traits(
        &self,
        a: &ArrayHandle,
        windowed: bool,
        columns: Option<(usize, Vec<usize>)>,
    ) -> Result<(), RecordError> {
        if windowed && self.opts.steps == 0 {
            return Err(RecordError::Invalid(format!(
                "{}: keep=\"window\" needs a window (hostfeed.Recorder(..., window=N))",
                a.context()
            )));
        }
        let row_bytes = a.spec.row_bytes();
        if windowed && row_bytes + ROW_OVERHEAD > self.opts.bytes {
            return Err(RecordError::Invalid(format!(
                "{}: one row of {row_bytes} bytes (and {ROW_OVERHEAD} bytes of bookkeeping) does not fit \
                 in window_bytes={}; raise window_bytes, or record this array with keep=\"always\"",
                a.context(),
                self.opts.bytes
            )));
        }
        let check = match columns {
            Some((width, columns)) => {
                let last = a.spec.row_shape.last().copied().unwrap_or(0);
                if a.spec.dtype.name != "float32" || u64::try_from(width).ok() != Some(last) {
                    return Err(RecordError::Invalid(format!(
                        "{}: a summary's counting columns need float32 rows of {width} columns, \
                         the array is {} {:?}",
                        a.context(),
                        a.spec.dtype.name,
                        a.spec.row_shape
                    )));
                }
                Check::Counted { width, columns }
            }
            None => Scan::of(a.spec.dtype.name).map_or(Check::None, |scan| Check::Values {
                scan,
                components: if a.spec.dtype.name.starts_with("complex") { 2 } else { 1 },
            }),
        };
        let mut traits = write_lock(&self.traits);
        if traits.len() <= a.id {
            traits.resize(a.id + 1, Traits::default());
        }
        traits[a.id] = Traits { windowed, check };
        Ok(())
    }

    /// The windowed rows of array `id` the window took so far (kept, routed to the store
    /// for a trigger, or since left for newer steps): what it received, for those who ask
    /// whether a windowed array received rows (a capture's watch).
    pub(crate) fn rows_taken(&self, id: ArrayId) -> u64 {
        lock(&self.state).taken.get(id).copied().unwrap_or(0)
    }

    fn traits(&self, id: ArrayId) -> Traits {
        read_lock(&self.traits).get(id).cloned().unwrap_or_default()
    }

    /// Takes `row` of `a`: searched for non-finite values while that trigger is armed
    /// (firing it, which routes rows through `route`); kept if `a` is windowed, unless
    /// its step is one a trigger writes (then routed through `route`). Errors (a step
    /// larger than the bound) are returned for the next flush.
    pub(crate) fn admit(
        &self,
        a: &Arc<ArrayHandle>,
        row: Row,
        route: &dyn Fn(&Arc<ArrayHandle>, Row),
    ) -> Result<Admitted, RecordError> {
        let traits = self.traits(a.id);
        if self.armed.load(Ordering::Relaxed) {
            if let Some((element, what)) = find_nonfinite(&traits.check, row.bytes()) {
                self.fire_nonfinite(a, row.meta.step, element, what, route);
            }
        }
        if !traits.windowed {
            return Ok(Admitted::Store(row));
        }
        let step = row.meta.step;
        // Made the window's own before its lock is taken (a copy, for some rows).
        let (row, cost) = own(row)?;
        let mut st = lock(&self.state);
        if st.taken.len() <= a.id {
            st.taken.resize(a.id + 1, 0);
        }
        st.taken[a.id] += 1;
        if st.newest.is_none_or(|n| step > n) {
            st.newest = Some(step);
            let mut closed_any = false;
            for t in st.triggers.iter_mut().filter(|t| !t.closed && t.last < step) {
                t.closed = true;
                closed_any = true;
            }
            st.dirty |= closed_any;
        }
        if st.through.iter().any(|&(lo, hi)| (lo..=hi).contains(&step)) {
            drop(st);
            // Routed for a trigger: under the document lock, noted in its trigger first
            // (ranges only grow: the step is still one to write).
            let _doc = self.doc_lock();
            let mut st = lock(&self.state);
            note_kept(&mut st, &a.name, step, false);
            route(a, row);
            return Ok(Admitted::Kept);
        }
        let Some(ring) = st.ring.as_mut() else { return Ok(Admitted::Store(row)) };
        match ring.insert(step, Arc::clone(a), row, cost) {
            Ok(evicted) => {
                drop(st);
                drop(evicted);
                Ok(Admitted::Kept)
            }
            Err((too_large, row)) => {
                drop(st);
                drop(row);
                Err(RecordError::Invalid(format!(
                    "{}: the windowed rows of step {} take {} bytes, more than window_bytes={} (the \
                     row is dropped); raise window_bytes, or window fewer arrays",
                    a.context(),
                    too_large.step,
                    too_large.bytes,
                    self.opts.bytes
                )))
            }
        }
    }

    /// Fires the non-finite trigger (once) for value `element` of a row of `a` at `step`.
    fn fire_nonfinite(
        &self,
        a: &ArrayHandle,
        step: i64,
        element: usize,
        what: finite::NonFinite,
        route: &dyn Fn(&Arc<ArrayHandle>, Row),
    ) {
        if !self.armed.swap(false, Ordering::AcqRel) {
            return;
        }
        let at = if step >= 0 { format!(" at step {step}") } else { String::new() };
        let reason = format!(
            "non-finite value {} in {:?}{at} (element {element} of its row)",
            what.name(),
            a.name
        );
        let mut extra = Map::new();
        extra.insert("value".into(), json!(what.name()));
        extra.insert("element".into(), json!(element));
        self.fire(Kind::NonFinite, step, reason, Some(a.name.clone()), extra, route);
    }

    /// Fires a trigger of `kind` at `step` (for a `keep`: the steps the ring holds, the
    /// newest of them its step), routing the ring's rows of its steps through `route`;
    /// returns its description.
    pub(crate) fn fire(
        &self,
        kind: Kind,
        step: i64,
        reason: String,
        name: Option<String>,
        extra: Map<String, Value>,
        route: &dyn Fn(&Arc<ArrayHandle>, Row),
    ) -> Value {
        let _doc = self.doc_lock();
        let mut st = lock(&self.state);
        let (step, first, last) = match kind {
            Kind::Keep => {
                let span = st.ring.as_ref().and_then(Ring::span);
                let newest = st.newest.unwrap_or(step);
                span.map_or((newest, newest, newest), |(lo, hi)| (hi, lo, hi))
            }
            _ => (step, self.first_of(step), step.saturating_add_unsigned(self.opts.after)),
        };
        let uid = format!("{}:{}", self.opts.process, st.fired_here);
        st.fired_here += 1;
        let trigger = Trigger {
            uid,
            kind,
            step,
            first,
            last,
            reason,
            name,
            process: self.opts.process,
            time_ns: now_ns(),
            extra,
            kept: BTreeMap::new(),
            others: BTreeMap::new(),
            closed: kind == Kind::Keep || st.newest.is_some_and(|n| n > last),
            written: false,
        };
        let description = trigger.describe();
        st.triggers.push(trigger);
        Self::write_out(&mut st, first, last, route);
        drop(st);
        self.count.fetch_add(1, Ordering::Release);
        self.news.notify_all();
        description
    }

    /// Applies another process's trigger (its description): this process writes its
    /// window for the same steps. A trigger already known (its `uid`) is ignored.
    pub(crate) fn apply_remote(&self, description: &Value, route: &dyn Fn(&Arc<ArrayHandle>, Row)) -> bool {
        let Some(mut trigger) = Trigger::from_description(description) else { return false };
        let _doc = self.doc_lock();
        let mut st = lock(&self.state);
        if st.triggers.iter().any(|t| t.uid == trigger.uid) {
            return false;
        }
        if trigger.kind == Kind::NonFinite {
            // One non-finite trigger for the whole run.
            self.armed.store(false, Ordering::Release);
        }
        trigger.closed = trigger.kind == Kind::Keep || st.newest.is_some_and(|n| n > trigger.last);
        let (first, last) = (trigger.first, trigger.last);
        st.triggers.push(trigger);
        Self::write_out(&mut st, first, last, route);
        drop(st);
        self.count.fetch_add(1, Ordering::Release);
        true
    }

    /// The first step a trigger at `step` writes.
    fn first_of(&self, step: i64) -> i64 {
        let back = i64::try_from(self.opts.steps.max(1) - 1).unwrap_or(i64::MAX);
        step.saturating_sub(back)
    }

    /// Routes the ring's rows of steps `first..=last` through `route` (under the document
    /// lock), noting them in the newest trigger, and has later rows of those steps routed
    /// as they come.
    fn write_out(st: &mut State, first: i64, last: i64, route: &dyn Fn(&Arc<ArrayHandle>, Row)) {
        let groups: Vec<Group> = st.ring.as_mut().map(|r| r.take_range(first, last)).unwrap_or_default();
        for g in groups {
            for (a, row, _) in g.rows {
                note_kept(st, &a.name, g.step, true);
                route(&a, row);
            }
        }
        st.through.push((first, last));
        st.through.sort_unstable();
        let mut merged: Vec<(i64, i64)> = Vec::with_capacity(st.through.len());
        for &(lo, hi) in &st.through {
            match merged.last_mut() {
                Some(m) if lo <= m.1.saturating_add(1) => m.1 = m.1.max(hi),
                _ => merged.push((lo, hi)),
            }
        }
        st.through = merged;
        st.dirty = true;
    }

    /// The lock whatever routes rows for a trigger holds, and every commit (so that the
    /// document listing them is written before they are announced).
    pub(crate) fn doc_lock(&self) -> MutexGuard<'_, Doc> {
        lock(&self.doc)
    }

    /// The root attributes listing every trigger, if they changed since last asked (and
    /// this process writes the document). Called with the document lock held.
    pub(crate) fn document_if_changed(&self, doc: &Doc) -> Option<Value> {
        let mut st = lock(&self.state);
        if !st.dirty || !self.opts.writes_doc {
            return None;
        }
        st.dirty = false;
        Some(root_attributes(&doc.base, &doc.earlier, &st.triggers))
    }

    /// The document is to be written again (its last write failed).
    pub(crate) fn changed(&self) {
        lock(&self.state).dirty = true;
    }

    /// A flush begins: the triggers closed now are written once it ends.
    pub(crate) fn flush_begins(&self) {
        let mut st = lock(&self.state);
        st.flushing = st.triggers.iter().enumerate().filter(|(_, t)| t.closed && !t.written).map(|(i, _)| i).collect();
    }

    /// A flush ended with every row it waited for written and announced (`ok`): the
    /// triggers closed when it began are written.
    pub(crate) fn flush_ends(&self, ok: bool) {
        let mut st = lock(&self.state);
        let done = std::mem::take(&mut st.flushing);
        if ok {
            for i in done {
                st.triggers[i].written = true;
                st.dirty = true;
            }
        }
    }

    /// Closing: no row will come any more (every trigger is closed); the ring's rows are
    /// dropped.
    pub(crate) fn closing(&self) {
        let dropped = {
            let mut st = lock(&self.state);
            for t in &mut st.triggers {
                t.closed = true;
            }
            st.dirty = true;
            st.ring.as_mut().map(Ring::clear).unwrap_or_default()
        };
        drop(dropped);
    }

    /// Triggers fired or applied so far.
    pub(crate) fn count(&self) -> u64 {
        self.count.load(Ordering::Acquire)
    }

    /// The descriptions of the triggers Python's policy has not taken yet.
    pub(crate) fn take_unseen(&self) -> Vec<Value> {
        let mut st = lock(&self.state);
        let from = st.unseen;
        st.unseen = st.triggers.len();
        st.triggers[from..].iter().map(Trigger::describe).collect()
    }

    /// The descriptions of this process's triggers not yet published, waiting up to
    /// `timeout` for one.
    pub(crate) fn take_unpublished(&self, timeout: Duration) -> Vec<Value> {
        let mut st = lock(&self.state);
        let local = |st: &State| st.triggers[st.unpublished..].iter().any(|t| t.process == self.opts.process);
        if !local(&st) && !timeout.is_zero() {
            st = self.news.wait_timeout(st, timeout).map_or_else(|e| e.into_inner().0, |(g, _)| g);
        }
        let from = st.unpublished;
        st.unpublished = st.triggers.len();
        st.triggers[from..].iter().filter(|t| t.process == self.opts.process).map(Trigger::describe).collect()
    }

    /// What this process kept for each trigger (uid -> `{kept, written}`).
    pub(crate) fn own_parts(&self) -> Vec<(String, Value)> {
        lock(&self.state).triggers.iter().map(|t| (t.uid.clone(), t.own_part())).collect()
    }

    /// Another process's part of trigger `uid` (see [`Window::own_parts`]).
    pub(crate) fn merge_part(&self, uid: &str, process: u32, part: Value) {
        let mut st = lock(&self.state);
        if process == self.opts.process {
            return;
        }
        if let Some(t) = st.triggers.iter_mut().find(|t| t.uid == uid) {
            if t.others.get(&process) != Some(&part) {
                t.others.insert(process, part);
                st.dirty = true;
            }
        }
    }

    /// Every trigger's description: the earlier recording's, then this recorder's.
    pub(crate) fn describe_all(&self) -> Vec<Value> {
        let earlier = self.doc_lock().earlier.clone();
        let st = lock(&self.state);
        earlier.into_iter().chain(st.triggers.iter().map(Trigger::describe)).collect()
    }

    /// Bytes and steps held now.
    pub(crate) fn held(&self) -> (usize, usize) {
        lock(&self.state).ring.as_ref().map_or((0, 0), |r| (r.bytes(), r.len()))
    }
}

/// Notes that the row of `name` at `step` was routed for a trigger covering it: the
/// newest (`newest`: its own rows taken from the ring) or else the oldest (a row that
/// came later: it belongs to the first window that covers it).
fn note_kept(st: &mut State, name: &str, step: i64, newest: bool) {
    let covers = |t: &&mut Trigger| (t.first..=t.last).contains(&step);
    let found = if newest { st.triggers.iter_mut().rev().find(covers) } else { st.triggers.iter_mut().find(covers) };
    if let Some(t) = found {
        t.kept.entry(name.to_string()).or_default().insert(step);
        st.dirty = true;
    }
}

/// The first non-finite value of a row checked as `check` says: its element index.
fn find_nonfinite(check: &Check, bytes: &[u8]) -> Option<(usize, finite::NonFinite)> {
    match check {
        Check::None => None,
        Check::Values { scan, components } => scan.first(bytes).map(|(i, what)| (i / components, what)),
        Check::Counted { width, columns } => {
            first_counted(bytes, *width, columns).map(|i| (i / width, finite::NonFinite::Nan))
        }
    }
}

/// `row` as the window keeps it, and what it counts: in its own message buffer when that
/// holds it alone (the buffer's charge against the queue's bound released), else copied
/// into a buffer of its own (a pooled one).
fn own(row: Row) -> Result<(Row, usize), RecordError> {
    let alone = Arc::strong_count(&row.payload) == 1;
    let cap = row.payload.buf.capacity();
    if alone && row.payload.buf.is_plain_heap() {
        row.payload.uncharge();
        return Ok((row, cap + ROW_OVERHEAD));
    }
    // From the pool (warm memory: evicted rows' buffers return there), counted at its
    // capacity.
    let mut buf = HostBuffer::with_capacity(row.len)
        .map_err(|e| RecordError::Io { errno: Some(libc::ENOMEM), message: e.to_string() })?;
    if row.len > 0 {
        // SAFETY: `buf` was just allocated with room for `row.len` bytes and cannot overlap
        // the row's bytes, which are valid for `row.len` bytes (`Row::bytes`).
        unsafe { std::ptr::copy_nonoverlapping(row.bytes().as_ptr(), buf.as_mut_ptr(), row.len) };
    }
    let cap = buf.capacity();
    let payload = Arc::new(Payload::uncharged(buf, &row.payload));
    Ok((Row { payload, offset: 0, len: row.len, meta: row.meta }, cap.max(row.len) + ROW_OVERHEAD))
}
