//! The sink table: routing messages from the consumer thread to recorders; a recorder's
//! sinks (of its arrays, or of a parted array's parts); and a forked child's start without
//! recorders.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use crate::error::RecordError;
use crate::ffi::c_api::dtype as xla;
use crate::host::hub::{Batch, Worker};
use crate::host::message::Message;
use crate::record::arrays::{ArrayHandle, Row};
use crate::record::common::{read_lock, write_lock, ArrayId};
use crate::record::recorder::{forget_late_drops, Recorder, FORK_GENERATION};
use crate::record::trace;
use crate::record::zarr::DType;

/// Makes this (forked child) process start with no recorder: every recorder opened before
/// the fork counts as closed here (without touching its store, which the parent still
/// writes and holds locked), and no message is routed to one.
pub(crate) fn after_fork_in_child() {
    FORK_GENERATION.fetch_add(1, Ordering::SeqCst);
    sinks().clear();
    forget_late_drops();
    trace::after_fork_in_child();
}

// ---- Sinks: routing messages from the consumer thread -----------------------------------

/// Where the messages of one consumer id go: operand `i` holds `lanes` rows of
/// `targets[i]` (or is not recorded), operand `step` the integer step(s).
pub struct Sink {
    recorder: Arc<Recorder>,
    targets: Vec<Option<Arc<ArrayHandle>>>,
    step: Option<usize>,
    transforms: i16,
    lanes: usize,
    /// A parted array's sink (`recorder/parts.rs`): operand 0 is `[group, part]`, and the
    /// message's rows go to that part's handle.
    parted: Option<Vec<Arc<ArrayHandle>>>,
}

impl Sink {
    /// A sink for messages whose operand `i` holds `lanes` rows of array `targets[i]` of
    /// `recorder` (or is not recorded, `None`) and whose operand `step` (if any) holds the
    /// integer step (one per lane, or one for all). `lanes` is 1 except under `vmap`, where
    /// each lane of the batch (first dimensions) is a row.
    ///
    /// # Errors
    /// [`RecordError::Invalid`] for an unknown array id or no lanes.
    pub fn new(
        recorder: &Arc<Recorder>,
        targets: &[Option<ArrayId>],
        step: Option<usize>,
        transforms: &str,
        lanes: usize,
    ) -> Result<Sink, RecordError> {
        if lanes == 0 {
            return Err(RecordError::Invalid("a batch of zero lanes records nothing".into()));
        }
        let targets = targets
            .iter()
            .map(|t| {
                t.map(|id| {
                    recorder.array(id).ok_or_else(|| RecordError::Invalid(format!("no array with id {id}")))
                })
                .transpose()
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Sink {
            recorder: Arc::clone(recorder),
            targets,
            step,
            transforms: recorder.transforms_index(transforms),
            lanes,
            parted: None,
        })
    }

    /// A sink for the shard-by-shard messages of parted array `name` of `recorder` (see
    /// `recorder/parts.rs`): operand `step` (if any) holds the step.
    ///
    /// # Errors
    /// An unknown name.
    pub fn parted(
        recorder: &Arc<Recorder>,
        name: &str,
        step: Option<usize>,
        transforms: &str,
    ) -> Result<Sink, RecordError> {
        let handles = recorder.parted_handles(name)?;
        Ok(Sink {
            recorder: Arc::clone(recorder),
            targets: Vec::new(),
            step,
            transforms: recorder.transforms_index(transforms),
            lanes: 1,
            parted: Some(handles),
        })
    }

    /// The index of the sink's transforms description in its recorder's table.
    #[cfg(test)]
    pub(crate) fn transforms(&self) -> i16 {
        self.transforms
    }

    /// Routes one message whose bytes (`charged`) are still charged against the bound;
    /// the charge is released once its rows are written (or dropped).
    pub(crate) fn route(&self, msg: Message, charged: usize) {
        if let Some(parts) = &self.parted {
            return self.route_parted(parts, msg, charged);
        }
        let rec = &self.recorder;
        let mut rows = Vec::with_capacity(self.targets.len());
        let mut problem = None;
        if msg.arrays.len() == self.targets.len() {
            for (op, target) in msg.arrays.iter().zip(&self.targets) {
                let Some(a) = target else { continue };
                let dtype_ok = DType::from_xla(op.dtype).is_ok_and(|d| d == a.spec.dtype);
                if !dtype_ok || Some(op.nbytes) != a.spec.row_bytes().checked_mul(self.lanes) {
                    problem = Some(format!(
                        "{}: {} bytes of dtype code {} do not hold {} row(s) of {} bytes of {}",
                        a.context(),
                        op.nbytes,
                        op.dtype,
                        self.lanes,
                        a.spec.row_bytes(),
                        a.spec.dtype.name
                    ));
                    break;
                }
                rows.push((Arc::clone(a), op.offset));
            }
        } else {
            problem = Some(format!(
                "a record message has {} operands, expected {}",
                msg.arrays.len(),
                self.targets.len()
            ));
        }
        let steps = self.step.map(|i| read_steps(&msg, i, self.lanes)).unwrap_or_default();
        let device = msg.device;
        let payload = rec.hold(msg.data, charged);
        if let Some(p) = problem {
            rec.report(RecordError::Invalid(format!("hostfeed internal error: {p}")));
            return;
        }
        // The last row takes the payload itself: a message of one row is its row's alone
        // (a recorder's window keeps such a buffer instead of copying the row).
        let mut payload = Some(payload);
        let last = (self.lanes * rows.len()).saturating_sub(1);
        for lane in 0..self.lanes {
            let step = steps.get(lane).or(steps.first()).copied().unwrap_or(-1);
            let meta = rec.meta(step, device, self.transforms);
            for (k, (a, offset)) in rows.iter().enumerate() {
                let len = a.spec.row_bytes();
                let held = if lane * rows.len() + k == last { payload.take() } else { payload.clone() };
                let Some(held) = held else { continue };
                let row = Row { payload: held, offset: offset + lane * len, len, meta };
                rec.route_row(a, row);
            }
        }
    }

    /// Routes one message of a parted array's sink to the part it names (see
    /// [`Sink::route`]).
    fn route_parted(&self, parts: &[Arc<ArrayHandle>], msg: Message, charged: usize) {
        let rec = &self.recorder;
        let part = part_of(&msg);
        let problem = match (part.and_then(|p| parts.get(p)), msg.arrays.get(1)) {
            (Some(a), Some(op)) => {
                let dtype_ok = DType::from_xla(op.dtype).is_ok_and(|d| d == a.spec.dtype);
                (!dtype_ok || op.nbytes != a.spec.row_bytes()).then(|| {
                    format!(
                        "{}: {} bytes of dtype code {} are not one slice of {} bytes of {}",
                        a.context(),
                        op.nbytes,
                        op.dtype,
                        a.spec.row_bytes(),
                        a.spec.dtype.name
                    )
                })
            }
            _ => Some(format!("a parted record message names part {part:?} of {}", parts.len())),
        };
        let steps = self.step.map(|i| read_steps(&msg, i, 1)).unwrap_or_default();
        let device = msg.device;
        let offset = msg.arrays.get(1).map_or(0, |op| op.offset);
        let payload = rec.hold(msg.data, charged);
        if let Some(p) = problem {
            rec.report(RecordError::Invalid(format!("hostfeed internal error: {p}")));
            return;
        }
        let a = &parts[part.unwrap_or_default()];
        let meta = rec.meta(steps.first().copied().unwrap_or(-1), device, self.transforms);
        let len = a.spec.row_bytes();
        rec.route_row(a, Row { payload, offset, len, meta });
    }
}

/// The part number of a `[group, part]` operand.
fn part_of(msg: &Message) -> Option<usize> {
    let op = msg.arrays.first()?;
    if op.dtype != xla::S32 || op.nbytes < 8 {
        return None;
    }
    let mut raw = [0u8; 4];
    // SAFETY: bytes `op.offset + 4..op.offset + 8` lie inside the operand (nbytes >= 8),
    // written by the handler's copy before the message was queued.
    unsafe { std::ptr::copy_nonoverlapping(msg.data.as_ptr().add(op.offset + 4), raw.as_mut_ptr(), 4) };
    usize::try_from(i32::from_le_bytes(raw)).ok()
}

/// Up to `lanes` integers of operand `i` of `msg` (the step of each lane).
fn read_steps(msg: &Message, i: usize, lanes: usize) -> Vec<i64> {
    let Some(op) = msg.arrays.get(i) else { return Vec::new() };
    let Some(size) = xla::element_size(op.dtype).filter(|&s| s <= 8) else { return Vec::new() };
    let n = (op.nbytes / size).min(lanes);
    let mut out = Vec::with_capacity(n);
    for k in 0..n {
        let mut raw = [0u8; 8];
        // SAFETY: `op.offset..op.offset + op.nbytes` was written by the handler's copy, and
        // element `k < op.nbytes / size` of `size <= 8` bytes lies inside it.
        unsafe {
            std::ptr::copy_nonoverlapping(
                msg.data.as_ptr().add(op.offset + k * size),
                raw.as_mut_ptr(),
                size,
            );
        }
        let value = match op.dtype {
            xla::S8 => i64::from(i8::from_le_bytes([raw[0]])),
            xla::S16 => i64::from(i16::from_le_bytes([raw[0], raw[1]])),
            xla::S32 => i64::from(i32::from_le_bytes([raw[0], raw[1], raw[2], raw[3]])),
            xla::S64 => i64::from_le_bytes(raw),
            xla::U8 => i64::from(raw[0]),
            xla::U16 => i64::from(u16::from_le_bytes([raw[0], raw[1]])),
            xla::U32 => i64::from(u32::from_le_bytes([raw[0], raw[1], raw[2], raw[3]])),
            xla::U64 => i64::try_from(u64::from_le_bytes(raw)).unwrap_or(i64::MAX),
            _ => return out,
        };
        out.push(value);
    }
    out
}

/// The process-wide table of sinks, by consumer id (consumer ids are process-wide, like
/// the receiver: compiled executables embed them).
#[derive(Default)]
pub struct Sinks {
    any: AtomicBool,
    /// Consumer id -> sink (ids are hashes, spread over the whole positive `i64` range).
    table: RwLock<HashMap<i64, Arc<Sink>>>,
}

static SINKS: std::sync::OnceLock<Sinks> = std::sync::OnceLock::new();

/// The process-wide sink table.
pub fn sinks() -> &'static Sinks {
    SINKS.get_or_init(Sinks::default)
}

impl Sinks {
    /// Forgets every sink (a forked child: the recorders are the parent's).
    pub fn clear(&self) {
        write_lock(&self.table).clear();
        self.any.store(false, Ordering::Release);
    }

    /// Routes the messages of consumer `consumer_id` to `sink` from now on.
    pub fn bind(&self, consumer_id: i64, sink: Sink) {
        write_lock(&self.table).insert(consumer_id, Arc::new(sink));
        self.any.store(true, Ordering::Release);
    }

    /// The sink of `consumer_id`, if it has one.
    #[must_use]
    pub(crate) fn get(&self, consumer_id: i64) -> Option<Arc<Sink>> {
        if !self.any.load(Ordering::Acquire) {
            return None;
        }
        read_lock(&self.table).get(&consumer_id).cloned()
    }

    /// The consumer's next batch that holds a message for the host's code (`None` when
    /// the consumer must exit); messages for sinks at the head of each batch are routed on
    /// the way, and later ones as the batch is taken from ([`RoutedBatch`]).
    #[must_use]
    pub fn next_batch(&'static self, worker: &Worker) -> Option<RoutedBatch> {
        loop {
            let batch = worker.next_batch()?;
            self.route_leading(&batch);
            if batch.remaining() > 0 {
                return Some(RoutedBatch { batch, sinks: self });
            }
        }
    }

    /// Routes the messages at the head of `batch` that belong to sinks, stopping at the
    /// first that does not (it is for the host's code). Without sinks (no recorder open),
    /// one atomic load: this runs before every message the host's code takes.
    #[inline]
    fn route_leading(&self, batch: &Batch) {
        if self.any.load(Ordering::Acquire) {
            self.route_leading_messages(batch);
        }
    }

    /// [`Sinks::route_leading`] where sinks exist.
    fn route_leading_messages(&self, batch: &Batch) {
        loop {
            let mut sink = None;
            let taken = batch.take_retained(|m| {
                sink = self.get(m.consumer_id);
                sink.is_some()
            });
            match (taken, sink) {
                (Some((msg, charged)), Some(sink)) => sink.route(msg, charged),
                _ => return,
            }
        }
    }
}

/// A batch of the consumer thread as the host's code sees it: the one place where records
/// are routed. Every message for a sink is routed to it on the way to the next message for
/// the host's code, so queue order is kept and such messages are never taken by the host's
/// code. Ending (or dropping) it ends the batch.
pub struct RoutedBatch {
    batch: Batch,
    sinks: &'static Sinks,
}

impl RoutedBatch {
    /// The next message for the host's code (those for sinks before it routed), or `None`
    /// when the batch is exhausted.
    #[must_use]
    #[inline]
    pub fn take(&self) -> Option<Message> {
        self.take_if(|_| true)
    }

    /// The next message for the host's code (those for sinks before it routed) if
    /// `accept` accepts it (see [`Batch::take_if`]).
    #[must_use]
    #[inline]
    pub fn take_if(&self, accept: impl FnOnce(&Message) -> bool) -> Option<Message> {
        self.sinks.route_leading(&self.batch);
        self.batch.take_if(accept)
    }

    /// Messages not taken yet (those for sinks included).
    #[must_use]
    pub fn remaining(&self) -> usize {
        self.batch.remaining()
    }
}
