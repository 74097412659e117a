//! The recorder: values recorded inside jitted code (`Recorder.record`) written as rows of
//! Zarr v3 arrays by Rust threads, with no Python per row.
//!
//! ## Data path
//!
//! A record is a tap whose consumer is a [`Sink`](crate::record::sinks::Sink) instead of
//! a Python function. The consumer thread looks up each message's consumer id in the
//! process-wide [`Sinks`](crate::record::sinks::Sinks) table and, for a sink, *routes* the
//! message here without attaching to Python
//! ([`RoutedBatch`](crate::record::sinks::RoutedBatch), the one place that routes): the message's
//! buffer becomes the row's bytes (no copy), the row is appended to its array's pending
//! chunk, and a full chunk becomes a [`Job`](crate::record::arrays::Job) for the
//! recorder's writer threads. Routing never does I/O and never waits.
//!
//! ## The byte bound
//!
//! A routed message counts as processed for barriers, but its bytes stay charged against
//! the receiver queue's bound (taken with `take_retained`) until its rows are written; the
//! [`Payload`](crate::record::arrays::Payload) that owns them releases the charge when dropped, whatever path drops it. So
//! a disk slower than the devices fills the bound and pauses the devices, and memory stays
//! bounded. Rows waiting in partial chunks are charged too; two rules keep them from
//! holding the bound forever: when they exceed half the bound, every partial chunk is
//! written (*spill*), and a ticker thread spills when producers wait for space while the
//! writers are idle (a producer that needs more than the other half).
//!
//! ## Crash safety (a killed process leaves a readable store)
//!
//! * An array's `zarr.json` only ever announces rows whose bytes are already written
//!   (chunk files first, then metadata; `zarr.json` is replaced by write-temp + rename).
//! * Bytes of rows inside the announced shape are never overwritten in place: an
//!   uncompressed chunk is appended to in place (past the announced rows); a compressed
//!   chunk that already holds announced rows is rewritten to a temporary file and renamed
//!   over the old one (its earlier rows read back from disk).
//! * Per-row metadata arrays are committed before their data array, so they never hold
//!   fewer rows than it.
//!
//! Completed row ranges advance each array's contiguous *frontier*; a *commit* announces
//! the frontier. Commits happen at every flush ([`Recorder::flush_end`]) and at every *live
//! cycle* of the ticker thread, `commit_interval` apart: a cycle hands the rows each array
//! received and has not announced to the writers, a partial chunk included (appended in
//! place, or put again whole), and announces them once written, so every row is readable
//! within `commit_interval` of its arrival with no flush. Nothing is fsynced unless
//! `durable` is set (the page cache survives a killed process; `durable` also survives an
//! OS crash).
//!
//! ## Layout of a store
//!
//! ```text
//! run1.zarr/             group, attrs {"hostfeed": {"format": "hostfeed-recording", ...}}
//!   layer1/              group
//!     h                  [rows, *value.shape], the value's dtype; chunks of whole rows
//!     h.seq              [rows] int64: record number across the recorder (arrival order)
//!     h.step             [rows] int64: the `step=` given to `record`, or -1
//!     h.device           [rows] int32: the device ordinal that sent the row
//!     h.time_ns          [rows] int64: host wall-clock time (UNIX ns) the row arrived
//!     h.transforms       [rows] int16: index into attrs["hostfeed"]["transforms"]
//! ```
//!
//! No Python here: `cargo test` covers this module with a stand-in [`Budget`].
//!
//! ## Its parts
//!
//! The [`Recorder`] composes parts that each own their state, in files below it:
//! [`Catalogue`] (`catalogue.rs`: the arrays known, their names, the transforms table,
//! the summaries), [`Writers`] (`writer.rs`: the writer and ticker threads and their
//! jobs), [`Committer`] (`commit.rs`: announcing written rows) and [`Failures`]
//! (`failures.rs`: the errors a flush reports). It keeps the store, its lock and the
//! byte budget, and drives the parts from its own files: this one (opening a store),
//! `recorder/declare.rs` (declaring arrays), `recorder/route.rs` (rows to chunks to
//! jobs), `recorder/rows.rs` (rows given by Python), `recorder/flush.rs` (flush, close,
//! the ticker's work), `recorder/parts.rs` (parted arrays), `recorder/resume.rs`
//! (appending to a store), `recorder/flight.rs` (its [`Window`]: rows kept in memory and
//! the triggers that write them). Its store and the store's lock come from the store's back-end
//! (`backend.rs`: the root prepared under the lock). Above it,
//! `sinks.rs` routes messages to it.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use crate::error::RecordError;
use crate::host::buffer::PoolReservation;
use crate::host::sync::lock;
use crate::record::arrays::{ArrayHandle, META_CHUNK_ROWS, META_CHUNK_ROWS_OBJECTS, META_CODEC_OBJECTS};
use crate::record::catalogue::Catalogue;
use crate::record::commit::Committer;
use crate::record::common::{ArrayId, Budget, Mode, Options};
use crate::record::failures::Failures;
use crate::record::backend::api::{Backend, Held};
use crate::record::backend::fs::FileSystem;
use crate::record::backend::root::{is_recording, root_attributes};
#[cfg(test)]
use crate::record::backend::ObjectBackend;
use crate::record::backend::Storage;
#[cfg(test)]
use crate::record::objects::Objects;
use crate::record::store::Store;
use crate::record::storelock::Access;
use crate::record::trace;
use crate::record::window::Window;
use crate::record::writer::Writers;
use crate::record::zarr::{self, Codec};

mod declare;
mod flight;
mod flush;
mod parts;
mod resume;
mod route;
mod rows;
pub(crate) use route::forget_late_drops;
pub use route::{take_late_drops, LateDrop};

/// Bumped in a child process created by `fork`
/// ([`after_fork_in_child`](crate::record::sinks::after_fork_in_child)): recorders opened
/// before it belong to the parent (their threads do not exist here).
pub(crate) static FORK_GENERATION: AtomicU64 = AtomicU64::new(0);

/// Counters of one recorder.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RecorderStats {
    /// Rows received.
    pub rows: u64,
    /// Bytes of chunk data written.
    pub bytes_written: u64,
    /// Chunk files written.
    pub chunks_written: u64,
    /// Spills: every partial chunk written early to free the byte bound.
    pub spills: u64,
    /// Metadata commits (`zarr.json` replaced).
    pub commits: u64,
    /// Rows discarded because the recorder was closed or had failed.
    pub rows_dropped: u64,
}

/// See the module documentation.
pub struct Recorder {
    /// The store's path (an object store's: its URL).
    root: PathBuf,
    opts: Options,
    /// Where the bytes go (the file system, `opts.durable` as asked).
    store: Box<dyn Store>,
    budget: Arc<dyn Budget>,
    /// The arrays known.
    catalogue: Catalogue,
    /// The writer and ticker threads, and the jobs they write.
    writers: Writers,
    /// Announces written rows.
    committer: Committer,
    /// The errors the next flush reports.
    failures: Failures,
    /// Bytes of rows in partial chunks (not handed to a writer), over all arrays.
    pending_bytes: AtomicUsize,
    /// The next row's record number.
    next_seq: AtomicU64,
    /// Spills: every partial chunk written early to free the byte bound.
    spills: AtomicU64,
    /// Rows discarded because the recorder was closed or had failed.
    rows_dropped: AtomicU64,
    /// The store is shared by the processes of one run: a declaration never replaces
    /// an array's `zarr.json` (another process may have announced rows in it).
    shared: bool,
    /// The lock on the store (its back-end's), released at close.
    store_lock: Mutex<Option<Box<dyn Held>>>,
    /// [`FORK_GENERATION`] when the recorder was opened.
    fork_generation: u64,
    closed: AtomicBool,
    /// Keeps the host buffer pool large enough for the rows this recorder may hold (the
    /// budget: queued rows, and pending ones up to half of it before it spills); released
    /// at close.
    pool_reservation: Mutex<Option<PoolReservation>>,
    /// The flight recorder: rows kept in memory, triggers that write them (`record/window`;
    /// `recorder/flight.rs`), once configured.
    window: OnceLock<Window>,
}

impl Recorder {
    /// Creates a store at `root` (a directory of the file system) and starts the writer
    /// and ticker threads.
    ///
    /// # Errors
    /// [`RecordError::Io`] when the directory cannot be created or written, or exists.
    pub fn create(
        root: &Path,
        mode: Mode,
        opts: Options,
        budget: Arc<dyn Budget>,
    ) -> Result<Arc<Recorder>, RecordError> {
        let backend = FileSystem { root: root.to_path_buf() };
        Self::open_backend(&backend, mode, opts, budget, &Access::Exclusive)
    }

    /// Creates a store in `storage` (a path, or an object store by URL: its back-end) and
    /// starts the writer and ticker threads. `run`: the store is shared by the processes of
    /// one `jax.distributed` run, named by its first element; the leader (second element:
    /// process 0) prepares the store and takes its lock naming the run, the others join it.
    ///
    /// # Errors
    /// As [`Recorder::create`]; for an object store also an unreachable bucket or a store
    /// held by another recorder whose lease has not ended ([`RecordError::Io`]); a shared
    /// store held by someone outside the run, or asked to append.
    pub fn open(
        storage: &Storage,
        mode: Mode,
        opts: Options,
        budget: Arc<dyn Budget>,
        run: Option<(&str, bool)>,
    ) -> Result<Arc<Recorder>, RecordError> {
        let access = match run {
            None => Access::Exclusive,
            Some((group, true)) => Access::SharedLeader { group: group.to_string() },
            Some((group, false)) => Access::SharedMember { group: group.to_string() },
        };
        Self::open_backend(storage.backend(), mode, opts, budget, &access)
    }

    /// [`Recorder::open`] in an object store already opened (`cargo test`'s in-memory
    /// store).
    #[cfg(test)]
    pub(crate) fn create_in_objects(
        objects: Arc<Objects>,
        mode: Mode,
        opts: Options,
        budget: Arc<dyn Budget>,
        access: &Access,
    ) -> Result<Arc<Recorder>, RecordError> {
        Self::open_backend(&ObjectBackend { objects }, mode, opts, budget, access)
    }

    /// Opens a store through its back-end: the root prepared under the back-end's lock
    /// (`access`), the root group written (unless appended to, or joined), the threads
    /// started, the arrays adopted when appending.
    fn open_backend(
        backend: &dyn Backend,
        mode: Mode,
        opts: Options,
        budget: Arc<dyn Budget>,
        access: &Access,
    ) -> Result<Arc<Recorder>, RecordError> {
        let member = matches!(access, Access::SharedMember { .. });
        let shared = !matches!(access, Access::Exclusive);
        if shared {
            refuse_shared_append(mode)?;
        }
        let root = backend.root().to_path_buf();
        let store = backend.store(opts.durable);
        let held = backend.prepare(mode, opts.lease, access)?;
        let appending = matches!(mode, Mode::Append { .. }) && is_recording(&*store, &root);
        if !member && !appending {
            zarr::write_json(&*store, &root, &zarr::group_metadata(&root_attributes()))?;
        }
        let rec = Self::start(root, store, held, shared, opts, budget)?;
        rec.adopt_or_close(mode)
    }

    /// Adopts the store's arrays (appending); if it cannot, closes the recorder (its
    /// threads stopped, the store's lock released: the failed open leaves nothing held).
    fn adopt_or_close(self: Arc<Self>, mode: Mode) -> Result<Arc<Recorder>, RecordError> {
        match self.adopt(mode) {
            Ok(()) => Ok(self),
            Err(e) => {
                let _ = self.close(); // nothing was recorded: nothing to report
                Err(e)
            }
        }
    }

    /// The recorder of a prepared store: starts the writer and ticker threads.
    fn start(
        root: PathBuf,
        store: Box<dyn Store>,
        held: Box<dyn Held>,
        shared: bool,
        opts: Options,
        budget: Arc<dyn Budget>,
    ) -> Result<Arc<Recorder>, RecordError> {
        let writers = opts.writers.max(1);
        let rec = Arc::new(Recorder {
            root,
            committer: Committer::new(opts.commit_interval),
            opts,
            store,
            failures: Failures::new(Arc::clone(&budget)),
            budget,
            catalogue: Catalogue::new(),
            writers: Writers::default(),
            pending_bytes: AtomicUsize::new(0),
            next_seq: AtomicU64::new(0),
            spills: AtomicU64::new(0),
            rows_dropped: AtomicU64::new(0),
            shared,
            store_lock: Mutex::new(Some(held)),
            fork_generation: FORK_GENERATION.load(Ordering::SeqCst),
            closed: AtomicBool::new(false),
            pool_reservation: Mutex::new(None),
            window: OnceLock::new(),
        });
        let mut started = Ok(());
        for i in 0..=writers {
            let r = Arc::clone(&rec);
            let (name, main): (String, Box<dyn FnOnce() + Send>) = if i < writers {
                let main = move || r.writers.writer_main(&*r.store, &r.failures);
                (format!("hostfeed-writer-{i}"), Box::new(main))
            } else {
                ("hostfeed-recorder".into(), Box::new(move || r.writers.ticker_main(|| r.tick())))
            };
            if let Err(e) = rec.writers.spawn(name, main) {
                started = Err(e);
                break;
            }
        }
        if let Err(e) = started {
            rec.stop_threads();
            return Err(e);
        }
        trace::opened();
        // The rows a recorder holds until written (queued, and pending in partial chunks)
        // may fill the whole bound: the pool keeps that much, so that the buffers a burst's
        // rows release come back warm for the next burst. With less, a writer behind a
        // burst frees buffers the pool cannot keep, and the next burst's rows fault in
        // fresh memory.
        *lock(&rec.pool_reservation) = Some(PoolReservation::new(rec.budget.bound()));
        Ok(rec)
    }

    /// The store's path (an object store's: its URL).
    #[must_use]
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Rows per chunk of the per-row metadata arrays and their codec: fewer rows, and
    /// compressed, where a commit puts the whole chunk again (object stores).
    fn meta_layout(&self) -> (u64, Codec) {
        if self.store.in_place().is_some() {
            (META_CHUNK_ROWS, Codec::Raw)
        } else {
            (META_CHUNK_ROWS_OBJECTS, META_CODEC_OBJECTS)
        }
    }

    /// Whether [`Recorder::close`] was called (or this is a forked child of the process
    /// that opened it).
    #[must_use]
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst) || self.forked_away()
    }

    /// Whether this process is a forked child of the one that opened the recorder.
    fn forked_away(&self) -> bool {
        FORK_GENERATION.load(Ordering::Relaxed) != self.fork_generation
    }

    fn closed_error(&self) -> RecordError {
        if self.forked_away() {
            return RecordError::Closed(format!(
                "the recorder of {} was opened by the parent of this forked process; open a new \
                 one (on another path) here",
                self.root.display()
            ));
        }
        RecordError::Closed(format!("the recorder of {} is closed", self.root.display()))
    }

    /// The handle of array `id`.
    pub(crate) fn array(&self, id: ArrayId) -> Option<Arc<ArrayHandle>> {
        self.catalogue.get(id)
    }

    /// The handle of each part of parted array `name`.
    ///
    /// # Errors
    /// An unknown name.
    pub(crate) fn parted_handles(&self, name: &str) -> Result<Vec<Arc<ArrayHandle>>, RecordError> {
        self.catalogue.parts(name)
    }
}

/// `mode="a"` is for one process: a shared store's run records to a new store.
fn refuse_shared_append(mode: Mode) -> Result<(), RecordError> {
    if matches!(mode, Mode::Append { .. }) {
        return Err(RecordError::Invalid(
            "mode=\"a\" cannot yet be used by the processes of a jax.distributed run (one \
             process appends; or record the resumed run to a new path)"
                .into(),
        ));
    }
    Ok(())
}
