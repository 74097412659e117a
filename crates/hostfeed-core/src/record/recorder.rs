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
//! chunk, and a full chunk becomes a [`Job`] for the recorder's writer threads. Routing
//! never does I/O and never waits.
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
//! the frontier. Commits happen at every flush ([`Recorder::flush_end`]) and, from the ticker thread,
//! every `commit_interval`. Nothing is fsynced unless `durable` is set (the page cache
//! survives a killed process; `durable` also survives an OS crash).
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
//! The files of the recorder, ground floor first: `store.rs` (where the bytes go),
//! `trace.rs`, `zarr.rs` (Zarr's documents and keys), `storelock.rs` (the lock on an open
//! store), `common.rs` (what every file shares), `arrays.rs` (an array's state, the
//! writers' jobs); this file, the [`Recorder`] itself; above it, the files that add to it:
//! `writer.rs` (the writer and ticker threads), `flush.rs` (flush and close), `sinks.rs`
//! (routing messages to it) and `recorder/parts.rs` (parted arrays).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

use crate::error::RecordError;
use crate::host::buffer::PoolReservation;
use crate::host::message::recorded_device;
use crate::host::sync::{lock, Waker};
use crate::record::arrays::{
    meta_specs, ArrayHandle, ArrayState, Job, Pool, Row, RowMeta, META_CHUNK_ROWS,
    META_CHUNK_ROWS_OBJECTS,
};
use crate::record::common::{as_u64, as_usize, read_lock, write_lock, ArrayId, Budget, Mode, Options};
use crate::record::objects::{ObjectLock, Objects};
use crate::record::store::{io_error, FsStore, Store};
use crate::record::storelock::{Access, StoreLock};
use crate::record::trace;
use crate::record::zarr::{self, ArraySpec, Codec, DType, ROW_METADATA};

mod parts;
mod resume;
mod root;
mod rows;
use root::{is_recording, prepare_objects, prepare_root, refuse_shared_append, root_attributes};

/// Longest path the recorder creates (Linux's `PATH_MAX`).
const PATH_MAX: usize = 4096;
/// Room a path below an array's directory needs past the array's name: the longest
/// metadata suffix (`.transforms`), the chunk key (`/c/` and a 20-digit index) and a
/// temporary file's suffix (`.PID.N.tmp`); each row dimension adds two bytes (`/0`).
const KEY_ROOM: usize = 11 + 3 + 20 + 40;

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

/// The lock a recorder holds on its store.
#[derive(Debug)]
pub(crate) enum HeldLock {
    /// A file system's `flock` (`storelock.rs`), released when dropped.
    File(#[expect(dead_code, reason = "held for its Drop")] StoreLock),
    /// An object store's lock object with its lease (`objects.rs`), renewed by the ticker.
    Object(ObjectLock),
    /// A member of a shared object store's run: its leader holds (and renews) the lock.
    Joined,
}

/// Where a recorder's store lives.
#[derive(Debug, Clone)]
pub enum Location {
    /// A directory of the local (or a shared) file system.
    Path(PathBuf),
    /// An object store by URL (`s3://bucket/prefix/run.zarr`, `gs://…`, `az://…`), with the
    /// `object_store` crate's config keys for its provider (over the provider's environment
    /// variables).
    Url {
        /// The store's URL.
        url: String,
        /// Config keys and values.
        options: Vec<(String, String)>,
    },
}

/// Declared array names and every group they imply.
#[derive(Default)]
struct NameIndex {
    pub(crate) arrays: HashMap<String, ArrayId>,
    groups: HashSet<String>,
    /// Arrays of a store appended to that this recorder cannot go on writing, and why.
    frozen: HashMap<String, String>,
}

/// See the module documentation.
pub struct Recorder {
    pub(crate) root: PathBuf,
    pub(crate) opts: Options,
    /// Where the bytes go (the file system, `opts.durable` as asked).
    pub(crate) store: Box<dyn Store>,
    pub(crate) budget: Arc<dyn Budget>,
    pub(crate) arrays: RwLock<Vec<Arc<ArrayHandle>>>,
    pub(crate) pool: Pool,
    /// Bytes of rows in partial chunks (not handed to a writer), over all arrays.
    pub(crate) pending_bytes: AtomicUsize,
    next_seq: AtomicU64,
    /// Errors not yet reported by a flush.
    pub(crate) errors: Mutex<Vec<RecordError>>,
    /// Arrays whose writes failed (their later rows are dropped), by id.
    pub(crate) failed_arrays: Mutex<Vec<ArrayId>>,
    /// Declared names (and the groups they imply), for clash checks in constant time.
    index: Mutex<NameIndex>,
    /// The store is shared by the processes of one run: a declaration never replaces
    /// an array's `zarr.json` (another process may have announced rows in it).
    shared: bool,
    /// Parted arrays (`parts.rs`): name -> the id of each part's handle.
    parted: Mutex<HashMap<String, Vec<ArrayId>>>,
    /// The lock on the store, released at close.
    pub(crate) store_lock: Mutex<Option<HeldLock>>,
    /// [`FORK_GENERATION`] when the recorder was opened.
    fork_generation: u64,
    /// Distinct transforms descriptions (JSON) of the rows; rows store the index.
    transforms: Mutex<Vec<String>>,
    /// What the rows of an array summarize (`hostfeed.reduce` in its attributes: the
    /// statistics' names, a histogram's edges), by array name.
    pub(crate) summaries: Mutex<HashMap<String, Value>>,
    pub(crate) closed: AtomicBool,
    pub(crate) ticker: Mutex<bool>,
    pub(crate) ticker_wake: Waker,
    pub(crate) threads: Mutex<Vec<JoinHandle<()>>>,
    pub(crate) bytes_written: AtomicU64,
    pub(crate) chunks_written: AtomicU64,
    pub(crate) spills: AtomicU64,
    pub(crate) commits: AtomicU64,
    pub(crate) rows_dropped: AtomicU64,
    /// Keeps the host buffer pool large enough for the rows this recorder may hold (the
    /// budget: queued rows, and pending ones up to half of it before it spills); released
    /// at close.
    pub(crate) pool_reservation: Mutex<Option<PoolReservation>>,
    /// Shards written in place: the inner chunks their index lists, by array and shard
    /// (the index only grows).
    pub(crate) shard_index: Mutex<HashMap<(ArrayId, u64), u64>>,
    /// Shards being streamed to their objects (object stores), by array and shard.
    pub(crate) uploads: Mutex<HashMap<(ArrayId, u64), crate::record::shard::ShardUpload>>,
}

fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

/// Where a new array lives and how it is chunked ([`Recorder::lay_out`]).
pub(crate) struct Layout {
    /// The directory of the group that holds it.
    pub(crate) group_dir: PathBuf,
    /// Its name in that group.
    pub(crate) leaf: String,
    /// Rows per chunk (per shard, when sharded).
    pub(crate) chunk_rows: u64,
    /// Rows per inner chunk of a shard; `None`: not sharded.
    pub(crate) inner_rows: Option<u64>,
    /// Its dimension names: `LEAF.row`, then `LEAF.d0`, ...
    pub(crate) dim_names: Vec<Option<String>>,
}

impl Recorder {
    /// Creates a store at `root` and starts the writer and ticker threads.
    ///
    /// # Errors
    /// [`RecordError::Io`] when the directory cannot be created or written, or exists.
    pub fn create(
        root: &Path,
        mode: Mode,
        opts: Options,
        budget: Arc<dyn Budget>,
    ) -> Result<Arc<Recorder>, RecordError> {
        Self::create_with(root, mode, opts, budget, &Access::Exclusive)
    }

    /// Creates a store at `location` (a path, or an object store by URL) and starts the
    /// writer and ticker threads. `run`: the store is shared by the processes of one
    /// `jax.distributed` run, named by its first element; the leader (second element:
    /// process 0) prepares the store and takes its lock naming the run, the others join it.
    ///
    /// # Errors
    /// As [`Recorder::create`]; for a URL also an unknown scheme or option
    /// ([`RecordError::Invalid`]), and an unreachable bucket or a store held by another
    /// recorder whose lease has not ended ([`RecordError::Io`]); a shared store held by
    /// someone outside the run, or asked to append.
    pub fn open(
        location: &Location,
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
        match location {
            Location::Path(root) => Self::create_with(root, mode, opts, budget, &access),
            Location::Url { url, options } => {
                if run.is_some() {
                    refuse_shared_append(mode)?;
                }
                let objects = Objects::open(url, options)?;
                Self::create_in_objects(objects, mode, opts, budget, &access)
            }
        }
    }

    /// [`Recorder::open`] in an object store already opened (`cargo test`'s in-memory
    /// store).
    pub(crate) fn create_in_objects(
        objects: Arc<Objects>,
        mode: Mode,
        opts: Options,
        budget: Arc<dyn Budget>,
        access: &Access,
    ) -> Result<Arc<Recorder>, RecordError> {
        let root = objects.root().to_path_buf();
        let held = prepare_objects(&objects, mode, opts.lease, access)?;
        let store: Box<dyn Store> = Box::new(objects);
        let member = matches!(access, Access::SharedMember { .. });
        let appending = matches!(mode, Mode::Append { .. }) && is_recording(&*store, &root);
        if !appending && !member {
            zarr::write_json(&*store, &root, &zarr::group_metadata(&root_attributes()))?;
        }
        let shared = !matches!(access, Access::Exclusive);
        let rec = Self::start(root, store, held, shared, opts, budget)?;
        rec.adopt_or_close(mode)
    }

    fn create_with(
        root: &Path,
        mode: Mode,
        opts: Options,
        budget: Arc<dyn Budget>,
        access: &Access,
    ) -> Result<Arc<Recorder>, RecordError> {
        let member = matches!(access, Access::SharedMember { .. });
        let shared = !matches!(access, Access::Exclusive);
        let store: Box<dyn Store> = Box::new(FsStore { durable: opts.durable });
        if shared {
            refuse_shared_append(mode)?;
        }
        let held = prepare_root(&*store, root, mode, access)?;
        let appending = matches!(mode, Mode::Append { .. }) && is_recording(&*store, root);
        if !member && !appending {
            zarr::write_json(&*store, root, &zarr::group_metadata(&root_attributes()))?;
        }
        let rec = Self::start(root.to_path_buf(), store, HeldLock::File(held), shared, opts, budget)?;
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
        held: HeldLock,
        shared: bool,
        opts: Options,
        budget: Arc<dyn Budget>,
    ) -> Result<Arc<Recorder>, RecordError> {
        let writers = opts.writers.max(1);
        let rec = Arc::new(Recorder {
            root,
            opts,
            store,
            budget,
            arrays: RwLock::new(Vec::new()),
            pool: Pool::default(),
            pending_bytes: AtomicUsize::new(0),
            next_seq: AtomicU64::new(0),
            errors: Mutex::new(Vec::new()),
            failed_arrays: Mutex::new(Vec::new()),
            index: Mutex::new(NameIndex::default()),
            shared,
            parted: Mutex::new(HashMap::new()),
            store_lock: Mutex::new(Some(held)),
            fork_generation: FORK_GENERATION.load(Ordering::SeqCst),
            transforms: Mutex::new(vec!["[]".to_string()]),
            summaries: Mutex::new(HashMap::new()),
            closed: AtomicBool::new(false),
            ticker: Mutex::new(false),
            ticker_wake: Waker::new(),
            threads: Mutex::new(Vec::new()),
            bytes_written: AtomicU64::new(0),
            chunks_written: AtomicU64::new(0),
            spills: AtomicU64::new(0),
            commits: AtomicU64::new(0),
            rows_dropped: AtomicU64::new(0),
            pool_reservation: Mutex::new(None),
            shard_index: Mutex::new(HashMap::new()),
            uploads: Mutex::new(HashMap::new()),
        });
        let spawn = |name: String, f: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new().name(name).spawn(f).map_err(|e| RecordError::Io {
                errno: e.raw_os_error(),
                message: format!("cannot start a recorder thread: {e}"),
            })
        };
        let mut started = Ok(());
        for i in 0..=writers {
            let r = Arc::clone(&rec);
            let (name, main): (String, Box<dyn FnOnce() + Send>) = if i < writers {
                (format!("hostfeed-writer-{i}"), Box::new(move || r.writer_main()))
            } else {
                ("hostfeed-recorder".into(), Box::new(move || r.ticker_main()))
            };
            match spawn(name, main) {
                Ok(t) => lock(&rec.threads).push(t),
                Err(e) => {
                    started = Err(e);
                    break;
                }
            }
        }
        if let Err(e) = started {
            rec.stop_threads();
            return Err(e);
        }
        trace::opened();
        // The rows a recorder holds until written (queued, and pending in partial chunks)
        // may fill the whole bound: the pool keeps that much, so that a burst's buffers
        // come back warm for the next (with half, a single writer behind a burst of 4 MiB
        // rows freed the rest and faulted in fresh memory for most rows of the next burst:
        // 0.35x of a plain file write instead of 0.95x).
        *lock(&rec.pool_reservation) = Some(PoolReservation::new(rec.budget.bound()));
        Ok(rec)
    }

    /// The store's path (an object store's: its URL).
    #[must_use]
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Rows per chunk of the per-row metadata arrays: fewer where a commit puts the whole
    /// chunk again (object stores).
    pub(crate) fn meta_chunk_rows(&self) -> u64 {
        if self.store.in_place().is_some() {
            META_CHUNK_ROWS
        } else {
            META_CHUNK_ROWS_OBJECTS
        }
    }

    /// Whether [`Recorder::close`] was called (or this is a forked child of the process
    /// that opened it).
    #[must_use]
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst) || self.forked_away()
    }

    /// Whether this process is a forked child of the one that opened the recorder.
    pub(crate) fn forked_away(&self) -> bool {
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

    /// Where a new array named by `parts` lives and how it is chunked, for rows of
    /// `row_shape` (`shown`: the shape an error names): creates the groups above it that do
    /// not exist yet; returns its group directory, leaf name, rows per chunk and dimension
    /// names.
    pub(crate) fn lay_out(
        &self,
        parts: &[&str],
        row_shape: &[u64],
        shown: &[u64],
        itemsize: usize,
        context: &str,
    ) -> Result<Layout, RecordError> {
        let mut group_dir = self.root.clone();
        for g in &parts[..parts.len() - 1] {
            group_dir.push(g);
            if !self.store.exists(&group_dir.join("zarr.json")) {
                self.store
                    .create_dir(&group_dir)
                    .map_err(|e| io_error("create", &group_dir, &e).context(context))?;
                match zarr::write_json(&*self.store, &group_dir, &zarr::group_metadata(&json!({}))) {
                    // Another process of a shared store's run created it meanwhile (an
                    // object store's conditional create): the same document.
                    Err(RecordError::Io { errno: Some(libc::EEXIST), .. }) if self.shared => {}
                    done => done.map_err(|e| e.context(context))?,
                }
            }
        }
        let leaf = parts[parts.len() - 1].to_string();
        let row_bytes = zarr::nbytes(row_shape, itemsize).ok_or_else(|| {
            RecordError::Invalid(format!("{context}: rows of shape {shown:?} are too large"))
        })?;
        let quarter = self.budget.bound() / 4;
        let target = self.opts.chunk_bytes.min(quarter).max(1);
        let chunk_rows = as_u64((target / row_bytes.max(1)).max(1));
        let mut dim_names = vec![Some(format!("{leaf}.row"))];
        dim_names.extend((0..row_shape.len()).map(|i| Some(format!("{leaf}.d{i}"))));
        let Some(shard_bytes) = self.opts.shard_bytes else {
            return Ok(Layout { group_dir, leaf, chunk_rows, inner_rows: None, dim_names });
        };
        // Rows of a shard written in place or streamed never wait in memory (beyond an inner
        // chunk); a shard put whole does.
        let in_place = matches!(self.opts.codec, Codec::Raw) && self.store.in_place().is_some();
        let cap = if in_place || self.store.streams() { usize::MAX } else { quarter.max(1) };
        let per_shard = (shard_bytes.min(cap) / (as_usize(chunk_rows) * row_bytes).max(1)).max(1);
        Ok(Layout { group_dir, leaf, chunk_rows: chunk_rows * as_u64(per_shard), inner_rows: Some(chunk_rows), dim_names })
    }

    /// Checks a record name for an array with rows of `ndim` dimensions: `zarr::split_name`,
    /// and that every path it makes stays under `PATH_MAX`. Creates nothing.
    ///
    /// # Errors
    /// [`RecordError::Invalid`] saying what is wrong.
    pub fn check_name<'n>(&self, name: &'n str, ndim: usize) -> Result<Vec<&'n str>, RecordError> {
        let parts = zarr::split_name(name)?;
        let longest = self.root.as_os_str().len() + 1 + name.len() + KEY_ROOM + 2 * ndim;
        if longest > PATH_MAX {
            return Err(RecordError::Invalid(format!(
                "invalid record name {name:?}: the files of this array in {} would have paths of up \
                 to {longest} bytes, more than the {PATH_MAX} the system allows; use a shorter name \
                 or store path",
                self.root.display()
            )));
        }
        Ok(parts)
    }

    /// Declares array `name` (`"layer1/h"`: group `layer1`, array `h`) with rows of
    /// `row_shape` and XLA dtype `dtype_code`; returns its id. Declaring the same name
    /// again with the same shape and dtype returns the same id.
    ///
    /// # Errors
    /// An invalid name, a dtype that cannot be recorded, a clash with an earlier
    /// declaration (another shape or dtype, or an array where a group is needed or the
    /// reverse), I/O errors, or a closed recorder.
    pub fn declare(&self, name: &str, dtype_code: i32, row_shape: &[u64]) -> Result<ArrayId, RecordError> {
        let dtype = DType::from_xla(dtype_code).map_err(|e| e.context(&format!("recording {name:?}")))?;
        let parts = self.check_name(name, row_shape.len())?;
        if self.is_closed() {
            return Err(self.closed_error());
        }
        let mut arrays = write_lock(&self.arrays);
        let mut index = lock(&self.index);
        index.refuse_frozen(name)?;
        if let Some(&id) = index.arrays.get(name) {
            let a = &arrays[id];
            if a.spec.dtype == dtype && a.spec.row_shape == row_shape {
                return Ok(a.id);
            }
            return Err(RecordError::Invalid(format!(
                "record name {name:?} was first recorded as {} {:?}, now as {} {:?}; a name keeps \
                 one dtype and row shape: use another name",
                a.spec.dtype.name, a.spec.row_shape, dtype.name, row_shape
            )));
        }
        let clash = |other: &str| {
            Err(RecordError::Invalid(format!(
                "record name {name:?} clashes with {other:?}: a name cannot be both an array and a \
                 group"
            )))
        };
        if index.groups.contains(name) {
            let other =
                arrays.iter().find(|a| a.name.starts_with(&format!("{name}/"))).map_or("", |a| &a.name);
            return clash(other);
        }
        let prefixes: Vec<&str> = name.match_indices('/').map(|(i, _)| &name[..i]).collect();
        if let Some(p) = prefixes.iter().find(|p| index.arrays.contains_key(**p)) {
            return clash(p);
        }
        let context = format!("recording {name:?}");
        let store = &*self.store;
        let Layout { group_dir, leaf, chunk_rows, inner_rows, dim_names } =
            self.lay_out(&parts, row_shape, row_shape, dtype.itemsize, &context)?;
        let spec = ArraySpec {
            dtype,
            row_shape: row_shape.to_vec(),
            chunk_rows,
            codec: self.opts.codec,
            dim_names,
            sep: self.opts.sep,
            part: None,
            inner_rows,
        };
        let dir = group_dir.join(&leaf);
        let handle = ArrayHandle {
            meta_chunk_rows: self.meta_chunk_rows(),
            id: arrays.len(),
            name: name.to_string(),
            dir,
            group_dir,
            leaf,
            spec,
            state: Mutex::new(ArrayState::new()),
        };
        // Metadata arrays, then the data array, all with zero rows.
        let keep = |dir: &Path| self.shared && store.exists(&dir.join("zarr.json"));
        for (suffix, mspec) in meta_specs(&handle.leaf, handle.meta_chunk_rows) {
            let mdir = handle.group_dir.join(format!("{}.{suffix}", handle.leaf));
            store.create_dir(&mdir).map_err(|e| io_error("create", &mdir, &e).context(&context))?;
            if !keep(&mdir) {
                zarr::write_json(store, &mdir, &mspec.metadata(0, &json!({})))
                    .map_err(|e| e.context(&context))?;
            }
        }
        store.create_dir(&handle.dir).map_err(|e| io_error("create", &handle.dir, &e).context(&context))?;
        if !keep(&handle.dir) {
            let attrs = self.attributes(&handle);
            zarr::write_json(store, &handle.dir, &handle.spec.metadata(0, &attrs))
                .map_err(|e| e.context(&context))?;
        }
        let handle = Arc::new(handle);
        arrays.push(Arc::clone(&handle));
        index.arrays.insert(name.to_string(), handle.id);
        index.groups.extend(prefixes.iter().map(|p| (*p).to_string()));
        Ok(handle.id)
    }

    /// The data array's attributes: CF `coordinates` (so xarray shows the per-row metadata
    /// as coordinates along the row dimension) and hostfeed's description, with the
    /// transforms table the `.transforms` column indexes.
    pub(crate) fn attributes(&self, a: &ArrayHandle) -> Value {
        let coords: Vec<String> = ROW_METADATA.iter().map(|s| format!("{}.{s}", a.leaf)).collect();
        let transforms: Vec<Value> = lock(&self.transforms)
            .iter()
            .map(|t| serde_json::from_str(t).unwrap_or_else(|_| json!(t)))
            .collect();
        let mut hostfeed = json!({"name": a.name, "row_metadata": ROW_METADATA, "transforms": transforms});
        if let Some(summary) = lock(&self.summaries).get(&a.name) {
            hostfeed["reduce"] = summary.clone();
        }
        json!({"coordinates": coords.join(" "), "hostfeed": hostfeed})
    }

    /// Says what the rows of array `name` summarize (a JSON object: the kind of summary,
    /// the statistics' names or a histogram's edges), written as `hostfeed.reduce` in its
    /// attributes from its next `zarr.json` on.
    ///
    /// # Errors
    /// Text that is not a JSON object; a name that already summarizes otherwise.
    pub fn describe_summary(&self, name: &str, summary: &str) -> Result<(), RecordError> {
        let value: Value = serde_json::from_str(summary)
            .ok()
            .filter(Value::is_object)
            .ok_or_else(|| RecordError::Invalid(format!("a summary must be a JSON object, got {summary:?}")))?;
        let mut summaries = lock(&self.summaries);
        match summaries.get(name) {
            Some(known) if *known != value => Err(RecordError::Invalid(format!(
                "record name {name:?} holds {known}, not {value}: a name keeps one kind of summary; use \
                 another name"
            ))),
            _ => {
                summaries.insert(name.to_string(), value);
                Ok(())
            }
        }
    }

    /// The index of a transforms description (JSON) in the recorder's table.
    pub fn transforms_index(&self, description: &str) -> i16 {
        let mut t = lock(&self.transforms);
        let i = t.iter().position(|x| x == description).unwrap_or_else(|| {
            t.push(description.to_string());
            t.len() - 1
        });
        i16::try_from(i).unwrap_or(i16::MAX)
    }

    pub(crate) fn array(&self, id: ArrayId) -> Option<Arc<ArrayHandle>> {
        read_lock(&self.arrays).get(id).cloned()
    }

    pub(crate) fn meta(&self, step: i64, device: i32, transforms: i16) -> RowMeta {
        let seq = i64::try_from(self.next_seq.fetch_add(1, Ordering::Relaxed)).unwrap_or(i64::MAX);
        RowMeta { seq, step, device: recorded_device(device), time_ns: now_ns(), transforms }
    }

    /// Appends a row to its array's pending chunk; a full chunk goes to the writers.
    /// Never does I/O, never waits (beyond short locks).
    pub(crate) fn route_row(&self, a: &Arc<ArrayHandle>, row: Row) {
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
                self.budget.note(format!(
                    "{}: a row arrived after the recorder was closed and was dropped",
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
    pub(crate) fn write_rows(&self, a: &ArrayHandle) -> u64 {
        match a.spec.inner_rows {
            Some(inner) if self.in_place_shards(a) || self.store.streams() => inner,
            _ => a.spec.chunk_rows,
        }
    }

    /// Whether `a` is sharded and its shards are written in place (uncompressed, on a file
    /// system).
    pub(crate) fn in_place_shards(&self, a: &ArrayHandle) -> bool {
        a.spec.inner_rows.is_some() && matches!(a.spec.codec, Codec::Raw) && self.store.in_place().is_some()
    }

    /// Hands the array's pending rows to the writers (under its lock, so that jobs of one
    /// chunk are submitted in order).
    pub(crate) fn submit(&self, a: &Arc<ArrayHandle>, st: &mut ArrayState, partial: bool) {
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
        lock(&self.pool.state).jobs.push_back(job);
        self.pool.work.notify_one();
    }

    /// Writes every partial chunk (see the module documentation).
    pub(crate) fn spill(&self) {
        let arrays = read_lock(&self.arrays).clone();
        let mut any = false;
        for a in &arrays {
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
