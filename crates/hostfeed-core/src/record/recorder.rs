//! The recorder: values recorded inside jitted code (`Recorder.record`) written as rows of
//! Zarr v3 arrays by Rust threads, with no Python per row.
//!
//! ## Data path
//!
//! A record is a tap whose consumer is a [`Sink`] instead of a Python function. The
//! consumer thread looks up each message's consumer id in the process-wide [`Sinks`]
//! table and, for a sink, *routes* the message here without attaching to Python
//! ([`Sinks::route_leading`]): the message's buffer becomes the row's bytes (no copy), the
//! row is appended to its array's pending chunk, and a full chunk becomes a [`Job`] for
//! the recorder's writer threads. Routing never does I/O and never waits.
//!
//! ## The byte bound
//!
//! A routed message counts as processed for barriers, but its bytes stay charged against
//! the receiver queue's bound (taken with `take_retained`) until its rows are written; the
//! [`Payload`] that owns them releases the charge when dropped, whatever path drops it. So
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

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::fs::{self, File, OpenOptions};
use std::io::{IoSlice, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

use crate::error::RecordError;
use crate::ffi::c_api::dtype as xla;
use crate::host::buffer::{HostBuffer, PoolReservation};
use crate::host::hub::{Batch, Hub, Worker};
use crate::host::message::Message;
use crate::host::sync::{lock, Waker};
use crate::record::storelock::{Access, StoreLock, LOCK_FILE};
use crate::record::zarr::{self, io_error, ArraySpec, Codec, DType, ROW_METADATA};

/// Index of an array in its recorder.
pub(crate) type ArrayId = usize;

/// Rows per chunk of a per-row metadata array.
const META_CHUNK_ROWS: u64 = 1 << 16;
/// Most buffers in one vectored write (Linux's `IOV_MAX` is 1024).
const MAX_IOV: usize = 1024;
/// How often the ticker looks for producers stuck behind partial chunks, and for commits.
const TICK: Duration = Duration::from_millis(50);
/// Longest path the recorder creates (Linux's `PATH_MAX`).
const PATH_MAX: usize = 4096;
/// Room a path below an array's directory needs past the array's name: the longest
/// metadata suffix (`.transforms`), the chunk key (`/c/` and a 20-digit index) and a
/// temporary file's suffix (`.PID.N.tmp`); each row dimension adds two bytes (`/0`).
const KEY_ROOM: usize = 11 + 3 + 20 + 40;

/// Bumped in a child process created by `fork` ([`after_fork_in_child`]): recorders
/// opened before it belong to the parent (their threads do not exist here).
static FORK_GENERATION: AtomicU64 = AtomicU64::new(0);

/// Makes this (forked child) process start with no recorder: every recorder opened before
/// the fork counts as closed here (without touching its store, which the parent still
/// writes and holds locked), and no message is routed to one.
pub(crate) fn after_fork_in_child() {
    FORK_GENERATION.fetch_add(1, Ordering::SeqCst);
    sinks().clear();
}

/// Where a recorder's bytes are charged: the receiver queue's bound (the [`Hub`]
/// implements it), or a stand-in in tests.
pub trait Budget: Send + Sync + 'static {
    /// Charges `bytes` held outside the queue (rows copied from Python). Never waits.
    fn charge(&self, bytes: usize);
    /// Frees bytes charged earlier (at push, or by `charge`).
    fn release(&self, bytes: usize);
    /// The byte bound.
    fn bound(&self) -> usize;
    /// Whether a producer waits for space now.
    fn producers_waiting(&self) -> bool;
    /// Something worth telling the user that has no caller to raise in (logged).
    fn note(&self, text: String);
}

impl Budget for &'static Hub {
    fn charge(&self, bytes: usize) {
        self.queue.charge(bytes);
    }
    fn release(&self, bytes: usize) {
        self.queue.release(bytes);
    }
    fn bound(&self) -> usize {
        self.queue.bound()
    }
    fn producers_waiting(&self) -> bool {
        self.queue.producers_waiting()
    }
    fn note(&self, text: String) {
        Hub::note(self, text);
    }
}

/// How a recorder writes.
#[derive(Debug, Clone)]
pub struct Options {
    /// Compression of data chunks.
    pub codec: Codec,
    /// Target chunk size in bytes: rows per chunk = max(1, this / row bytes). Capped at a
    /// quarter of the byte bound when an array is declared.
    pub chunk_bytes: usize,
    /// Writer threads.
    pub writers: usize,
    /// fsync chunk files and metadata (survive an OS crash, not just a killed process).
    pub durable: bool,
    /// Announce written rows at least this often (besides every flush).
    pub commit_interval: Duration,
    /// Chunk key separator: `/` (nested directories) or `.` (flat file names).
    pub sep: char,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            codec: Codec::Raw,
            chunk_bytes: 16 << 20,
            writers: 1,
            durable: false,
            commit_interval: Duration::from_secs(1),
            sep: '/',
        }
    }
}

/// What to do with an existing directory at the store's path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Create; fail if the path exists and is not an empty directory.
    Create,
    /// Create, replacing an earlier hostfeed recording at the path (nothing else).
    Overwrite,
}

/// Per-row metadata.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct RowMeta {
    /// Record number across the recorder, in arrival order.
    pub(crate) seq: i64,
    /// The user's step, or -1.
    pub(crate) step: i64,
    pub(crate) device: i32,
    /// Host wall-clock time when the row reached the host (UNIX ns).
    pub(crate) time_ns: i64,
    /// Index into the recorder's transforms table.
    pub(crate) transforms: i16,
}

/// Bytes kept for rows until they are written; releases its charge when dropped.
struct Payload {
    buf: HostBuffer,
    charged: usize,
    budget: Arc<dyn Budget>,
}

impl Drop for Payload {
    fn drop(&mut self) {
        self.budget.release(self.charged);
    }
}

/// One row: `len` bytes at `offset` of a payload (which several rows may share).
struct Row {
    payload: Arc<Payload>,
    offset: usize,
    len: usize,
    meta: RowMeta,
}

impl Row {
    fn bytes(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: `offset..offset + len` lies inside the payload's buffer and was written
        // before the row was made (by the handler's copy of this operand, or by
        // `Recorder::append`); the buffer is never written again and lives as long as
        // `self.payload`.
        unsafe { std::slice::from_raw_parts(self.payload.buf.as_ptr().add(self.offset), self.len) }
    }
}

struct ArrayState {
    /// Rows received.
    received: u64,
    /// Rows of the current chunk not yet handed to a writer; the first is row `pending_first`.
    pending: Vec<Row>,
    pending_first: u64,
    /// Compressed codec: rows of the current chunk already on disk in a padded partial
    /// chunk (after a flush); the next write of that chunk reads them back.
    on_disk_prefix: u64,
    /// Row ranges written, by start; `frontier` = rows written contiguously from 0.
    done: BTreeMap<u64, u64>,
    frontier: u64,
    /// Rows announced in `zarr.json`.
    committed: u64,
    last_commit: Instant,
    /// Metadata of rows `meta_first..received`.
    meta: Vec<RowMeta>,
    meta_first: u64,
    /// The first write error; later rows are dropped (and counted) instead of written.
    failed: bool,
    /// That error's errno and text (repeated by the errors about the dropped rows).
    failure: Option<(Option<i32>, String)>,
    dropped: u64,
}

impl ArrayState {
    /// An array with no rows.
    fn new() -> Self {
        ArrayState {
            received: 0,
            pending: Vec::new(),
            pending_first: 0,
            on_disk_prefix: 0,
            done: BTreeMap::new(),
            frontier: 0,
            committed: 0,
            last_commit: Instant::now(),
            meta: Vec::new(),
            meta_first: 0,
            failed: false,
            failure: None,
            dropped: 0,
        }
    }
}

/// One array of the store (plus its per-row metadata arrays).
pub struct ArrayHandle {
    id: ArrayId,
    name: String,
    /// The data array's directory, its group's directory and its last name part.
    dir: PathBuf,
    group_dir: PathBuf,
    leaf: String,
    spec: ArraySpec,
    state: Mutex<ArrayState>,
}

impl ArrayHandle {
    fn context(&self) -> String {
        format!("recording {:?}", self.name)
    }
}

/// A chunk (or the part of one) for a writer.
struct Job {
    array: Arc<ArrayHandle>,
    chunk: u64,
    /// Row index of `rows[0]`.
    first_row: u64,
    rows: Vec<Row>,
    /// Pad to a full chunk (a partial chunk written at a flush or spill).
    partial: bool,
    /// Compressed codec: rows at the start of this chunk to read back from disk.
    disk_prefix: u64,
}

impl Job {
    fn key(&self) -> (ArrayId, u64) {
        (self.array.id, self.chunk)
    }
}

#[derive(Default)]
struct PoolState {
    jobs: VecDeque<Job>,
    /// Chunks being written: jobs of one chunk run one at a time, in submission order.
    running: Vec<(ArrayId, u64)>,
    /// Jobs finished so far (flush waits for this to move).
    finished: u64,
    stop: bool,
}

impl PoolState {
    /// The first job whose chunk is not being written and has no earlier job waiting.
    fn next_job(&mut self) -> Option<Job> {
        let mut blocked: Vec<(ArrayId, u64)> = Vec::new();
        for i in 0..self.jobs.len() {
            let key = self.jobs[i].key();
            if !self.running.contains(&key) && !blocked.contains(&key) {
                let job = self.jobs.remove(i)?;
                self.running.push(key);
                return Some(job);
            }
            blocked.push(key);
        }
        None
    }

    fn idle(&self) -> bool {
        self.jobs.is_empty() && self.running.is_empty()
    }
}

#[derive(Default)]
struct Pool {
    state: Mutex<PoolState>,
    /// Writers sleep here for jobs.
    work: Waker,
    /// Flushes sleep here for finished jobs.
    finished: Waker,
}

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

/// Declared array names and every group they imply.
#[derive(Default)]
struct NameIndex {
    arrays: HashMap<String, ArrayId>,
    groups: HashSet<String>,
}

/// See the module documentation.
pub struct Recorder {
    root: PathBuf,
    opts: Options,
    budget: Arc<dyn Budget>,
    arrays: RwLock<Vec<Arc<ArrayHandle>>>,
    pool: Pool,
    /// Bytes of rows in partial chunks (not handed to a writer), over all arrays.
    pending_bytes: AtomicUsize,
    next_seq: AtomicU64,
    /// Errors not yet reported by a flush.
    errors: Mutex<Vec<RecordError>>,
    /// Arrays whose writes failed (their later rows are dropped), by id.
    failed_arrays: Mutex<Vec<ArrayId>>,
    /// Declared names (and the groups they imply), for clash checks in constant time.
    index: Mutex<NameIndex>,
    /// The lock on the store, released at close.
    store_lock: Mutex<Option<StoreLock>>,
    /// [`FORK_GENERATION`] when the recorder was opened.
    fork_generation: u64,
    /// Distinct transforms descriptions (JSON) of the rows; rows store the index.
    transforms: Mutex<Vec<String>>,
    closed: AtomicBool,
    ticker: Mutex<bool>,
    ticker_wake: Waker,
    threads: Mutex<Vec<JoinHandle<()>>>,
    bytes_written: AtomicU64,
    chunks_written: AtomicU64,
    spills: AtomicU64,
    commits: AtomicU64,
    rows_dropped: AtomicU64,
    /// Keeps the host buffer pool large enough for the rows this recorder may hold (half
    /// the budget: beyond that it spills); released at close.
    pool_reservation: Mutex<Option<PoolReservation>>,
}

fn read_lock<T>(l: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    // See `sync::lock`: no user code runs under the crate's locks.
    l.read().unwrap_or_else(PoisonError::into_inner)
}

fn write_lock<T>(l: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(PoisonError::into_inner)
}

fn as_usize(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

fn as_u64(n: usize) -> u64 {
    n as u64
}

fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

const ROOT_FORMAT: &str = "hostfeed-recording";

fn root_attributes() -> Value {
    json!({"hostfeed": {"format": ROOT_FORMAT, "version": 1}})
}

/// Whether `root` holds a hostfeed recording (its `zarr.json` says so).
fn is_recording(root: &Path) -> bool {
    fs::read(root.join("zarr.json"))
        .ok()
        .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
        .is_some_and(|v| v["attributes"]["hostfeed"]["format"] == json!(ROOT_FORMAT))
}

/// The entries of `root` besides the lock file (`None`: `root` is not a readable directory).
fn entries(root: &Path) -> Option<Vec<PathBuf>> {
    let d = fs::read_dir(root).ok()?;
    Some(d.filter_map(Result::ok).filter(|e| e.file_name() != LOCK_FILE).map(|e| e.path()).collect())
}

/// Whether `mode` may use `root` (an existing path) as it is.
fn check_existing(root: &Path, mode: Mode) -> Result<(), RecordError> {
    if entries(root).is_some_and(|e| e.is_empty()) {
        return Ok(());
    }
    match mode {
        Mode::Create => Err(RecordError::Io {
            errno: Some(libc::EEXIST),
            message: format!(
                "{} exists and is not an empty directory; choose a new path, or pass mode=\"w\" to \
                 replace an earlier recording",
                root.display()
            ),
        }),
        Mode::Overwrite if is_recording(root) => Ok(()),
        Mode::Overwrite => Err(RecordError::Io {
            errno: Some(libc::EEXIST),
            message: format!(
                "{} exists and is not a hostfeed recording; mode=\"w\" only replaces earlier \
                 recordings",
                root.display()
            ),
        }),
    }
}

/// Makes `root` an empty directory held by the returned lock. A store another recorder
/// holds is refused first (naming the holder), before anything is created or removed.
fn prepare_root(root: &Path, mode: Mode) -> Result<StoreLock, RecordError> {
    StoreLock::check_free(root)?;
    if root.exists() {
        check_existing(root, mode)?;
    }
    fs::create_dir_all(root).map_err(|e| io_error("create", root, &e))?;
    let held = StoreLock::acquire(root, Access::Exclusive)?;
    // Again under the lock: another process may have written meanwhile.
    check_existing(root, mode)?;
    // An earlier recording is replaced entry by entry: the directory (and the lock file
    // in it) stays, so the lock keeps guarding the path.
    for entry in entries(root).unwrap_or_default() {
        let removed = if entry.is_dir() && !entry.is_symlink() {
            fs::remove_dir_all(&entry)
        } else {
            fs::remove_file(&entry)
        };
        removed.map_err(|e| io_error("remove the old recording's", &entry, &e))?;
    }
    Ok(held)
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
        let held = prepare_root(root, mode)?;
        zarr::write_json_atomic(root, &zarr::group_metadata(&root_attributes()), opts.durable)?;
        let writers = opts.writers.max(1);
        let rec = Arc::new(Recorder {
            root: root.to_path_buf(),
            opts,
            budget,
            arrays: RwLock::new(Vec::new()),
            pool: Pool::default(),
            pending_bytes: AtomicUsize::new(0),
            next_seq: AtomicU64::new(0),
            errors: Mutex::new(Vec::new()),
            failed_arrays: Mutex::new(Vec::new()),
            index: Mutex::new(NameIndex::default()),
            store_lock: Mutex::new(Some(held)),
            fork_generation: FORK_GENERATION.load(Ordering::SeqCst),
            transforms: Mutex::new(vec!["[]".to_string()]),
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
        *lock(&rec.pool_reservation) = Some(PoolReservation::new(rec.budget.bound() / 2));
        Ok(rec)
    }

    /// The store's path.
    #[must_use]
    pub fn root(&self) -> &Path {
        &self.root
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
        let durable = self.opts.durable;
        let mut group_dir = self.root.clone();
        for g in &parts[..parts.len() - 1] {
            group_dir.push(g);
            if !group_dir.join("zarr.json").exists() {
                fs::create_dir_all(&group_dir)
                    .map_err(|e| io_error("create", &group_dir, &e).context(&context))?;
                zarr::write_json_atomic(&group_dir, &zarr::group_metadata(&json!({})), durable)
                    .map_err(|e| e.context(&context))?;
            }
        }
        let leaf = parts[parts.len() - 1].to_string();
        let row_bytes = zarr::nbytes(row_shape, dtype.itemsize).ok_or_else(|| {
            RecordError::Invalid(format!("{context}: rows of shape {row_shape:?} are too large"))
        })?;
        let target = self.opts.chunk_bytes.min(self.budget.bound() / 4).max(1);
        let chunk_rows = as_u64((target / row_bytes.max(1)).max(1));
        let mut dim_names = vec![Some(format!("{leaf}.row"))];
        dim_names.extend((0..row_shape.len()).map(|i| Some(format!("{leaf}.d{i}"))));
        let spec = ArraySpec {
            dtype,
            row_shape: row_shape.to_vec(),
            chunk_rows,
            codec: self.opts.codec,
            dim_names,
            sep: self.opts.sep,
        };
        let dir = group_dir.join(&leaf);
        let handle = ArrayHandle {
            id: arrays.len(),
            name: name.to_string(),
            dir,
            group_dir,
            leaf,
            spec,
            state: Mutex::new(ArrayState::new()),
        };
        // Metadata arrays, then the data array, all with zero rows.
        for (suffix, mspec) in meta_specs(&handle.leaf) {
            let mdir = handle.group_dir.join(format!("{}.{suffix}", handle.leaf));
            fs::create_dir_all(&mdir).map_err(|e| io_error("create", &mdir, &e).context(&context))?;
            zarr::write_json_atomic(&mdir, &mspec.metadata(0, &json!({})), durable)
                .map_err(|e| e.context(&context))?;
        }
        fs::create_dir_all(&handle.dir).map_err(|e| io_error("create", &handle.dir, &e).context(&context))?;
        let attrs = self.attributes(&handle);
        zarr::write_json_atomic(&handle.dir, &handle.spec.metadata(0, &attrs), durable)
            .map_err(|e| e.context(&context))?;
        let handle = Arc::new(handle);
        arrays.push(Arc::clone(&handle));
        index.arrays.insert(name.to_string(), handle.id);
        index.groups.extend(prefixes.iter().map(|p| (*p).to_string()));
        Ok(handle.id)
    }

    /// The data array's attributes: CF `coordinates` (so xarray shows the per-row metadata
    /// as coordinates along the row dimension) and hostfeed's description, with the
    /// transforms table the `.transforms` column indexes.
    fn attributes(&self, a: &ArrayHandle) -> Value {
        let coords: Vec<String> = ROW_METADATA.iter().map(|s| format!("{}.{s}", a.leaf)).collect();
        let transforms: Vec<Value> = lock(&self.transforms)
            .iter()
            .map(|t| serde_json::from_str(t).unwrap_or_else(|_| json!(t)))
            .collect();
        json!({
            "coordinates": coords.join(" "),
            "hostfeed": {"name": a.name, "row_metadata": ROW_METADATA, "transforms": transforms},
        })
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

    fn array(&self, id: ArrayId) -> Option<Arc<ArrayHandle>> {
        read_lock(&self.arrays).get(id).cloned()
    }

    /// A sink for messages whose operand `i` holds `lanes` rows of array `targets[i]` (or
    /// is not recorded, `None`) and whose operand `step` (if any) holds the integer step
    /// (one per lane, or one for all). `lanes` is 1 except under `vmap`, where each lane of
    /// the batch (first dimensions) is a row.
    ///
    /// # Errors
    /// [`RecordError::Invalid`] for an unknown array id or no lanes.
    pub fn sink(
        self: &Arc<Self>,
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
                    self.array(id).ok_or_else(|| RecordError::Invalid(format!("no array with id {id}")))
                })
                .transpose()
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Sink {
            recorder: Arc::clone(self),
            targets,
            step,
            transforms: self.transforms_index(transforms),
            lanes,
        })
    }

    /// Records one row of array `id` copied from `data` (the path of values that reach
    /// the host through Python: global-view records joined from shards, inline mode).
    ///
    /// # Errors
    /// A size that does not match the array's rows, an unknown array, a closed recorder.
    pub fn append(
        &self,
        id: ArrayId,
        data: &[u8],
        step: i64,
        device: i32,
        transforms: i16,
    ) -> Result<(), RecordError> {
        let a = self.array(id).ok_or_else(|| RecordError::Invalid(format!("no array with id {id}")))?;
        if data.len() != a.spec.row_bytes() {
            return Err(RecordError::Invalid(format!(
                "{}: a row has {} bytes, got {}",
                a.context(),
                a.spec.row_bytes(),
                data.len()
            )));
        }
        if self.is_closed() {
            return Err(self.closed_error());
        }
        let mut buf = HostBuffer::with_capacity(data.len())
            .map_err(|e| RecordError::Io { errno: Some(libc::ENOMEM), message: e.to_string() })?;
        if !data.is_empty() {
            // SAFETY: the buffer was allocated with room for `data.len()` bytes; a fresh
            // allocation cannot overlap `data`.
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), buf.as_mut_ptr(), data.len()) };
        }
        self.budget.charge(buf.capacity());
        let payload = Arc::new(Payload { charged: buf.capacity(), buf, budget: Arc::clone(&self.budget) });
        let meta = self.meta(step, device, transforms);
        self.route_row(&a, Row { payload, offset: 0, len: data.len(), meta });
        Ok(())
    }

    fn meta(&self, step: i64, device: i32, transforms: i16) -> RowMeta {
        let seq = i64::try_from(self.next_seq.fetch_add(1, Ordering::Relaxed)).unwrap_or(i64::MAX);
        RowMeta { seq, step, device, time_ns: now_ns(), transforms }
    }

    /// Appends a row to its array's pending chunk; a full chunk goes to the writers.
    /// Never does I/O, never waits (beyond short locks).
    fn route_row(&self, a: &Arc<ArrayHandle>, row: Row) {
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
        let cr = a.spec.chunk_rows;
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

    /// Hands the array's pending rows to the writers (under its lock, so that jobs of one
    /// chunk are submitted in order).
    fn submit(&self, a: &Arc<ArrayHandle>, st: &mut ArrayState, partial: bool) {
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
        let disk_prefix = if matches!(a.spec.codec, Codec::Zstd(_)) { st.on_disk_prefix } else { 0 };
        // After a partial compressed chunk, the next write of it starts from the disk copy.
        st.on_disk_prefix = st.pending_first % cr;
        let job = Job { array: Arc::clone(a), chunk, first_row, rows, partial, disk_prefix };
        lock(&self.pool.state).jobs.push_back(job);
        self.pool.work.notify_one();
    }

    /// Writes every partial chunk (see the module documentation).
    fn spill(&self) {
        let arrays = read_lock(&self.arrays).clone();
        let mut any = false;
        for a in &arrays {
            let mut st = lock(&a.state);
            if !st.pending.is_empty() {
                self.submit(a, &mut st, true);
                any = true;
            }
        }
        if any {
            self.spills.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Starts a flush: every row received so far goes to the writers. Returns the rows each
    /// array must have written for the flush to be complete.
    pub fn flush_begin(&self) -> Vec<(Arc<ArrayHandle>, u64)> {
        let arrays = read_lock(&self.arrays).clone();
        let mut targets = Vec::with_capacity(arrays.len());
        for a in arrays {
            let mut st = lock(&a.state);
            if !st.pending.is_empty() {
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
        result
    }

    /// Stops and joins the writer and ticker threads (once the writers ran out of jobs).
    fn stop_threads(&self) {
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

    fn record_error(&self, a: &ArrayHandle, st: &mut ArrayState, e: RecordError) {
        st.failed = true;
        let errno = match &e {
            RecordError::Io { errno, .. } => *errno,
            _ => None,
        };
        st.failure = Some((errno, e.message().to_string()));
        lock(&self.failed_arrays).push(a.id);
        lock(&self.errors).push(e.context(&a.context()));
    }

    // ---- threads --------------------------------------------------------------------

    fn writer_main(&self) {
        lower_priority();
        loop {
            let job = {
                let mut g = lock(&self.pool.state);
                loop {
                    if let Some(j) = g.next_job() {
                        break j;
                    }
                    if g.stop && g.jobs.is_empty() {
                        return;
                    }
                    g = self.pool.work.wait(g);
                }
            };
            let a = Arc::clone(&job.array);
            let key = job.key();
            let (first, n) = (job.first_row, as_u64(job.rows.len()));
            // A panic must not lose the job's bookkeeping (a flush would wait for it forever).
            let result =
                catch_unwind(AssertUnwindSafe(|| write_chunk(&self.opts, &job))).unwrap_or_else(|_| {
                    Err(RecordError::Invalid("hostfeed internal error: a panic while writing a chunk".into()))
                });
            let bytes = job.rows.len() * a.spec.row_bytes();
            // The rows are on disk (or failed): their bytes no longer count.
            drop(job);
            {
                let mut st = lock(&a.state);
                match result {
                    Ok(()) => {
                        self.bytes_written.fetch_add(as_u64(bytes), Ordering::Relaxed);
                        self.chunks_written.fetch_add(1, Ordering::Relaxed);
                        st.done.insert(first, first + n);
                        loop {
                            let f = st.frontier;
                            match st.done.remove(&f) {
                                Some(end) => st.frontier = end,
                                None => break,
                            }
                        }
                    }
                    Err(e) => {
                        if !st.failed {
                            self.record_error(&a, &mut st, e);
                        }
                    }
                }
            }
            let mut g = lock(&self.pool.state);
            g.running.retain(|k| *k != key);
            g.finished += 1;
            let more = !g.jobs.is_empty();
            drop(g);
            self.pool.finished.notify_all();
            if more {
                // A job of the chunk just finished may be next.
                self.pool.work.notify_one();
            }
        }
    }

    fn ticker_main(&self) {
        let mut g = lock(&self.ticker);
        while !*g {
            g = self.ticker_wake.wait_timeout(g, TICK);
            if *g {
                break;
            }
            drop(g);
            // Producers stuck behind rows in partial chunks that nothing else will write.
            if self.pending_bytes.load(Ordering::Relaxed) > 0
                && self.budget.producers_waiting()
                && lock(&self.pool.state).idle()
            {
                self.spill();
            }
            let arrays = read_lock(&self.arrays).clone();
            for a in &arrays {
                self.commit(a, false);
            }
            g = lock(&self.ticker);
        }
    }

    /// Announces the rows written so far in `zarr.json` (per-row metadata first), if due.
    fn commit(&self, a: &ArrayHandle, force: bool) {
        let mut st = lock(&a.state);
        let rows = st.frontier;
        if rows == st.committed
            || st.failed
            || (!force && st.last_commit.elapsed() < self.opts.commit_interval)
        {
            return;
        }
        match self.commit_locked(a, &mut st, rows) {
            Ok(()) => {
                self.commits.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => self.record_error(a, &mut st, e),
        }
    }

    fn commit_locked(&self, a: &ArrayHandle, st: &mut ArrayState, rows: u64) -> Result<(), RecordError> {
        let durable = self.opts.durable;
        let from = st.committed;
        let lo = as_usize(from - st.meta_first);
        let hi = as_usize(rows - st.meta_first);
        let meta = &st.meta[lo..hi];
        for (suffix, spec) in meta_specs(&a.leaf) {
            let values: Vec<u8> = match suffix {
                "seq" => meta.iter().flat_map(|m| m.seq.to_le_bytes()).collect(),
                "step" => meta.iter().flat_map(|m| m.step.to_le_bytes()).collect(),
                "device" => meta.iter().flat_map(|m| m.device.to_le_bytes()).collect(),
                "time_ns" => meta.iter().flat_map(|m| m.time_ns.to_le_bytes()).collect(),
                _ => meta.iter().flat_map(|m| m.transforms.to_le_bytes()).collect(),
            };
            let mdir = a.group_dir.join(format!("{}.{suffix}", a.leaf));
            write_rows_in_place(&spec, &mdir, from, &values, durable)?;
            zarr::write_json_atomic(&mdir, &spec.metadata(rows, &json!({})), durable)?;
        }
        zarr::write_json_atomic(&a.dir, &a.spec.metadata(rows, &self.attributes(a)), durable)?;
        st.committed = rows;
        st.last_commit = Instant::now();
        // Forget metadata that is on disk.
        st.meta.drain(..hi);
        st.meta_first = rows;
        Ok(())
    }
}

/// The per-row metadata arrays of data array `leaf`: suffix and layout.
fn meta_specs(leaf: &str) -> impl Iterator<Item = (&'static str, ArraySpec)> + '_ {
    ROW_METADATA.iter().map(move |&suffix| {
        let code = match suffix {
            "device" => xla::S32,
            "transforms" => xla::S16,
            _ => xla::S64,
        };
        let spec = ArraySpec {
            dtype: DType::from_xla(code).unwrap_or_else(|_| unreachable!("metadata dtypes are valid")),
            row_shape: vec![],
            chunk_rows: META_CHUNK_ROWS,
            codec: Codec::Raw,
            dim_names: vec![Some(format!("{leaf}.row"))],
            sep: '/',
        };
        (suffix, spec)
    })
}

/// Writes the rows `from..` of an uncompressed array whose bytes are `values` in place
/// (chunk files created at full size, as holes, then written at the rows' offsets).
fn write_rows_in_place(
    spec: &ArraySpec,
    dir: &Path,
    from: u64,
    values: &[u8],
    durable: bool,
) -> Result<(), RecordError> {
    let rb = spec.row_bytes();
    let rows = as_u64(values.len() / rb.max(1));
    let mut row = from;
    let mut off = 0usize;
    while row < from + rows {
        let k = row / spec.chunk_rows;
        let end = ((k + 1) * spec.chunk_rows).min(from + rows);
        let n = as_usize(end - row) * rb;
        let path = spec.chunk_path(dir, k);
        create_parent(&path)?;
        let f = open_for_write(&path)?;
        let cb = as_u64(spec.chunk_bytes());
        if f.metadata().map_err(|e| io_error("stat", &path, &e))?.len() < cb {
            f.set_len(cb).map_err(|e| io_error("extend", &path, &e))?;
        }
        f.write_all_at(&values[off..off + n], (row - k * spec.chunk_rows) * as_u64(rb))
            .map_err(|e| io_error("write", &path, &e))?;
        if durable {
            f.sync_data().map_err(|e| io_error("fsync", &path, &e))?;
        }
        off += n;
        row = end;
    }
    Ok(())
}

/// Opens a chunk file for writing in place, creating it if needed (never truncating).
fn open_for_write(path: &Path) -> Result<File, RecordError> {
    OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|e| io_error("open", path, &e))
}

/// Lowers the calling thread's scheduling priority (nice +10), so that on a busy machine
/// the writers use the CPU the computation leaves idle instead of slowing it down. If they
/// fall behind, the queue bound pauses the computation anyway.
fn lower_priority() {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: `gettid` has no preconditions; `setpriority` on this thread's own id only
        // changes its nice value (failure is harmless and ignored).
        let tid = unsafe { libc::gettid() };
        // Never 0: that would mean the whole process.
        if let Some(tid) = libc::id_t::try_from(tid).ok().filter(|&t| t > 0) {
            // SAFETY: see above.
            unsafe { libc::setpriority(libc::PRIO_PROCESS, tid, 10) };
        }
    }
}

/// Writes `bufs` back to back at `offset` of `f` with vectored writes (at most
/// [`MAX_IOV`] buffers each, continuing after partial writes).
fn write_all_vectored_at(f: &File, bufs: &[&[u8]], offset: u64) -> std::io::Result<()> {
    let mut file = f;
    file.seek(SeekFrom::Start(offset))?;
    for group in bufs.chunks(MAX_IOV) {
        let mut slices: Vec<IoSlice<'_>> = group.iter().map(|b| IoSlice::new(b)).collect();
        let mut rest = &mut slices[..];
        IoSlice::advance_slices(&mut rest, 0); // skip empty leading buffers
        while !rest.is_empty() {
            match file.write_vectored(rest) {
                Ok(0) => return Err(std::io::Error::from(std::io::ErrorKind::WriteZero)),
                Ok(n) => IoSlice::advance_slices(&mut rest, n),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}

fn create_parent(path: &Path) -> Result<(), RecordError> {
    match path.parent() {
        Some(p) => fs::create_dir_all(p).map_err(|e| io_error("create", p, &e)),
        None => Ok(()),
    }
}

fn write_chunk(opts: &Options, job: &Job) -> Result<(), RecordError> {
    let spec = &job.array.spec;
    let path = spec.chunk_path(&job.array.dir, job.chunk);
    let rb = spec.row_bytes();
    let chunk_bytes = spec.chunk_bytes();
    let in_chunk = job.first_row - job.chunk * spec.chunk_rows;
    create_parent(&path)?;
    match spec.codec {
        Codec::Raw => {
            // Append in place: only bytes past the rows already in this chunk are written.
            let f = open_for_write(&path)?;
            let mut off = in_chunk * as_u64(rb);
            // The rows straight from their message buffers, no gathering copy.
            let slices: Vec<&[u8]> = job.rows.iter().map(Row::bytes).collect();
            write_all_vectored_at(&f, &slices, off).map_err(|e| io_error("write", &path, &e))?;
            off += as_u64(rb * job.rows.len());
            if off < as_u64(chunk_bytes) {
                // A partial chunk: the padding is a hole, no bytes written; it reads as zeros
                // (the fill value) and lies past `shape`, so no reader sees it.
                let len = f.metadata().map_err(|e| io_error("stat", &path, &e))?.len();
                if len < as_u64(chunk_bytes) {
                    f.set_len(as_u64(chunk_bytes)).map_err(|e| io_error("extend", &path, &e))?;
                }
            }
            if opts.durable {
                f.sync_data().map_err(|e| io_error("fsync", &path, &e))?;
            }
        }
        Codec::Zstd(level) => {
            let fail = |op: &str, e: std::io::Error| io_error(op, &path, &e);
            let mut enc = zstd::stream::Encoder::new(Vec::with_capacity(chunk_bytes / 2), level)
                .map_err(|e| fail("start compressing", e))?;
            let mut written = 0usize;
            if job.disk_prefix > 0 {
                // Rows of this chunk flushed earlier as a padded partial chunk.
                let want = as_usize(job.disk_prefix) * rb;
                let f = File::open(&path).map_err(|e| fail("reopen", e))?;
                let mut dec = zstd::stream::Decoder::new(f).map_err(|e| fail("decompress", e))?;
                let mut prefix = vec![0u8; want];
                dec.read_exact(&mut prefix).map_err(|e| fail("read back", e))?;
                enc.write_all(&prefix).map_err(|e| fail("compress", e))?;
                written += want;
            }
            debug_assert_eq!(as_u64(written), in_chunk * as_u64(rb));
            for r in &job.rows {
                enc.write_all(r.bytes()).map_err(|e| fail("compress", e))?;
                written += rb;
            }
            if job.partial && written < chunk_bytes {
                let zeros = vec![0u8; (chunk_bytes - written).min(1 << 20)];
                while written < chunk_bytes {
                    let n = zeros.len().min(chunk_bytes - written);
                    enc.write_all(&zeros[..n]).map_err(|e| fail("compress", e))?;
                    written += n;
                }
            }
            let out = enc.finish().map_err(|e| fail("finish compressing", e))?;
            // A chunk that may hold announced rows is replaced whole, atomically; a fresh
            // chunk lies past the announced shape, so a torn write of it is invisible.
            let replace = job.partial || job.disk_prefix > 0 || path.exists();
            // A temporary file of its own: never `with_extension`, which maps the flat keys
            // `c.1` and `c.2` (and `c.1.0`, `c.1.1`...) to one name.
            let target = if replace { zarr::temp_path(&path) } else { path.clone() };
            let mut f = File::create(&target).map_err(|e| io_error("create", &target, &e))?;
            f.write_all(&out).map_err(|e| io_error("write", &target, &e))?;
            if opts.durable {
                f.sync_data().map_err(|e| io_error("fsync", &target, &e))?;
            }
            drop(f);
            if replace {
                fs::rename(&target, &path).map_err(|e| {
                    let _ = fs::remove_file(&target);
                    fail("rename over", e)
                })?;
            }
        }
    }
    Ok(())
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
}

impl Sink {
    /// Routes one message whose bytes (`charged`) are still charged against the bound;
    /// the charge is released once its rows are written (or dropped).
    pub(crate) fn route(&self, msg: Message, charged: usize) {
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
        let payload = Arc::new(Payload { buf: msg.data, charged, budget: Arc::clone(&rec.budget) });
        if let Some(p) = problem {
            lock(&rec.errors).push(RecordError::Invalid(format!("hostfeed internal error: {p}")));
            return;
        }
        for lane in 0..self.lanes {
            let step = steps.get(lane).or(steps.first()).copied().unwrap_or(-1);
            let meta = rec.meta(step, device, self.transforms);
            for (a, offset) in &rows {
                let len = a.spec.row_bytes();
                let row = Row { payload: Arc::clone(&payload), offset: offset + lane * len, len, meta };
                rec.route_row(a, row);
            }
        }
    }
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

    /// The consumer's next batch that holds a message for Python (`None` when the consumer
    /// must exit); messages for sinks at the head of each batch are routed on the way.
    #[must_use]
    pub fn next_batch(&self, worker: &Worker) -> Option<Batch> {
        loop {
            let batch = worker.next_batch()?;
            self.route_leading(&batch);
            if batch.remaining() > 0 {
                return Some(batch);
            }
        }
    }

    /// Routes the messages at the head of `batch` that belong to sinks, stopping at the
    /// first that does not (it is for Python). Returns how many were routed.
    pub fn route_leading(&self, batch: &Batch) -> usize {
        if !self.any.load(Ordering::Acquire) {
            return 0;
        }
        let mut n = 0;
        loop {
            let mut sink = None;
            let taken = batch.take_retained(|m| {
                sink = self.get(m.consumer_id);
                sink.is_some()
            });
            match (taken, sink) {
                (Some((msg, charged)), Some(sink)) => sink.route(msg, charged),
                _ => return n,
            }
            n += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::message::{gather, Operand};

    /// A budget that counts.
    #[derive(Default)]
    struct Counter {
        held: AtomicUsize,
        waiting: AtomicBool,
        notes: Mutex<Vec<String>>,
    }

    impl Budget for Counter {
        fn charge(&self, bytes: usize) {
            self.held.fetch_add(bytes, Ordering::SeqCst);
        }
        fn release(&self, bytes: usize) {
            self.held.fetch_sub(bytes, Ordering::SeqCst);
        }
        fn bound(&self) -> usize {
            1 << 20
        }
        fn producers_waiting(&self) -> bool {
            self.waiting.load(Ordering::SeqCst)
        }
        fn note(&self, text: String) {
            lock(&self.notes).push(text);
        }
    }

    fn temp_root(tag: &str) -> PathBuf {
        let root = std::env::temp_dir().join(format!("hostfeed_rec_{tag}_{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        root
    }

    fn json_at(path: &Path) -> Value {
        serde_json::from_slice(&fs::read(path.join("zarr.json")).unwrap()).unwrap()
    }

    fn int_row(r: u32) -> Vec<u8> {
        [r, r + 100].iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    /// Reads `rows` rows of `row_bytes` from the uncompressed chunks of `dir`.
    fn read_raw_rows(dir: &Path, rows: usize, row_bytes: usize, chunk_rows: usize) -> Vec<u8> {
        let mut out = Vec::new();
        let mut k = 0;
        while out.len() / row_bytes < rows {
            let bytes = fs::read(dir.join(format!("c/{k}/0"))).unwrap();
            assert_eq!(bytes.len(), row_bytes * chunk_rows, "chunks are full size");
            out.extend_from_slice(&bytes);
            k += 1;
        }
        out.truncate(rows * row_bytes);
        out
    }

    fn read_zstd_rows(dir: &Path, rows: usize, row_bytes: usize, chunk_rows: usize) -> Vec<u8> {
        let mut out = Vec::new();
        let mut k = 0;
        while out.len() / row_bytes < rows {
            let bytes = zstd::decode_all(File::open(dir.join(format!("c/{k}/0"))).unwrap()).unwrap();
            assert_eq!(bytes.len(), row_bytes * chunk_rows, "chunks are full size");
            out.extend_from_slice(&bytes);
            k += 1;
        }
        out.truncate(rows * row_bytes);
        out
    }

    #[test]
    fn rows_survive_flushes_in_the_middle_of_a_chunk() {
        for codec in [Codec::Raw, Codec::Zstd(1)] {
            let root = temp_root(&format!("flush_{codec:?}"));
            let budget = Arc::new(Counter::default());
            let opts = Options { codec, chunk_bytes: 40, writers: 2, ..Options::default() };
            let rec = Recorder::create(&root, Mode::Create, opts, budget.clone()).unwrap();
            let id = rec.declare("g/x", xla::S32, &[2]).unwrap(); // 8-byte rows, 5 per chunk
            for r in 0..13u32 {
                rec.append(id, &int_row(r), r.into(), 3, 0).unwrap();
                if r == 6 || r == 7 {
                    assert!(rec.flush(Duration::from_secs(30)).unwrap());
                    assert_eq!(json_at(&root.join("g/x"))["shape"], json!([r + 1, 2]));
                }
            }
            rec.close().unwrap();
            assert_eq!(budget.held.load(Ordering::SeqCst), 0, "every row's bytes were released");
            assert_eq!(json_at(&root.join("g/x"))["shape"], json!([13, 2]));
            let want: Vec<u8> = (0..13).flat_map(int_row).collect();
            let got = match codec {
                Codec::Raw => read_raw_rows(&root.join("g/x"), 13, 8, 5),
                Codec::Zstd(_) => read_zstd_rows(&root.join("g/x"), 13, 8, 5),
            };
            assert_eq!(got, want, "{codec:?}");
            let steps = json_at(&root.join("g/x.step"));
            assert_eq!(steps["shape"], json!([13]));
            let step_bytes = fs::read(root.join("g/x.step/c/0")).unwrap();
            let step_values: Vec<i64> =
                step_bytes.chunks(8).take(13).map(|c| i64::from_le_bytes(c.try_into().unwrap())).collect();
            assert_eq!(step_values, (0..13).collect::<Vec<i64>>());
            let device = fs::read(root.join("g/x.device/c/0")).unwrap();
            assert_eq!(&device[..8], &[3, 0, 0, 0, 3, 0, 0, 0]);
            assert!(rec.append(id, &int_row(0), 0, 0, 0).is_err(), "closed");
            let _ = fs::remove_dir_all(&root);
        }
    }

    #[test]
    fn flat_keys_with_zstd_and_many_writers_keep_every_flushed_row() {
        // Flushes in the middle of chunks: a compressed chunk is rewritten (its flushed
        // prefix read back) while the next chunk's partial copy is written by another
        // writer; with `.` keys of scalar rows both once went through one `c.tmp`.
        for (codec, sep) in [(Codec::Zstd(1), '.'), (Codec::Zstd(1), '/'), (Codec::Raw, '.')] {
            let root = temp_root(&format!("flat_{codec:?}_{}", sep == '.'));
            let budget = Arc::new(Counter::default());
            let opts = Options { codec, chunk_bytes: 16, writers: 4, sep, ..Options::default() };
            let rec = Recorder::create(&root, Mode::Create, opts, budget.clone()).unwrap();
            let ids: Vec<ArrayId> =
                (0..3).map(|k| rec.declare(&format!("a{k}"), xla::S32, &[]).unwrap()).collect();
            let rows = 600u32;
            for r in 0..rows {
                for (k, &id) in ids.iter().enumerate() {
                    let v = r * 10 + u32::try_from(k).unwrap();
                    rec.append(id, &v.to_le_bytes(), r.into(), 0, 0).unwrap();
                }
                if r % 3 == 2 {
                    assert!(rec.flush(Duration::from_secs(60)).unwrap(), "{codec:?} {sep}");
                }
            }
            rec.close().unwrap();
            for (k, _) in ids.iter().enumerate() {
                let dir = root.join(format!("a{k}"));
                assert_eq!(json_at(&dir)["shape"], json!([rows]));
                let mut got = Vec::new();
                for c in 0..rows.div_ceil(4) {
                    let name = if sep == '.' { format!("c.{c}") } else { format!("c/{c}") };
                    let bytes = fs::read(dir.join(name)).unwrap();
                    let bytes = match codec {
                        Codec::Raw => bytes,
                        Codec::Zstd(_) => zstd::decode_all(&bytes[..]).unwrap(),
                    };
                    got.extend_from_slice(&bytes);
                }
                let want: Vec<u8> =
                    (0..rows).flat_map(|r| (r * 10 + u32::try_from(k).unwrap()).to_le_bytes()).collect();
                assert_eq!(&got[..want.len()], &want[..], "{codec:?} {sep} a{k}");
                let tmp = fs::read_dir(&dir)
                    .unwrap()
                    .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().ends_with(".tmp"))
                    .count();
                assert_eq!(tmp, 0, "no temporary file is left");
            }
            let _ = fs::remove_dir_all(&root);
        }
    }

    #[test]
    fn an_open_store_is_locked_and_a_refused_open_changes_nothing() {
        let root = temp_root("locked");
        let first =
            Recorder::create(&root, Mode::Create, Options::default(), Arc::new(Counter::default())).unwrap();
        let x = first.declare("x", xla::S32, &[2]).unwrap();
        first.append(x, &int_row(1), 0, 0, 0).unwrap();
        assert!(first.flush(Duration::from_secs(30)).unwrap());
        for mode in [Mode::Overwrite, Mode::Create] {
            let Err(e) = Recorder::create(&root, mode, Options::default(), Arc::new(Counter::default()))
            else {
                panic!("a second open of an open store must fail")
            };
            assert!(matches!(e, RecordError::Io { errno: Some(libc::EBUSY), .. }), "{e}");
            assert!(e.to_string().contains(&format!("pid {}", std::process::id())), "{e}");
        }
        assert_eq!(json_at(&root.join("x"))["shape"], json!([1, 2]), "the first store is intact");
        first.close().unwrap();
        Recorder::create(&root, Mode::Overwrite, Options::default(), Arc::new(Counter::default()))
            .unwrap()
            .close()
            .unwrap();
        assert!(!root.join("x").exists());
        let _ = fs::remove_dir_all(&root);
    }

    #[test]
    fn names_that_would_make_too_long_paths_are_refused_before_creating() {
        let mut root = std::env::temp_dir().join(format!("hostfeed_rec_long_{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        let top = root.clone();
        for _ in 0..19 {
            root.push("d".repeat(200));
        }
        let rec =
            Recorder::create(&root, Mode::Create, Options::default(), Arc::new(Counter::default())).unwrap();
        let name = ["n".repeat(150), "n".repeat(150)].join("/");
        let e = rec.declare(&name, xla::F32, &[3]).unwrap_err();
        assert!(matches!(e, RecordError::Invalid(_)) && e.to_string().contains("4096"), "{e}");
        assert!(!root.join("n".repeat(150)).exists());
        rec.close().unwrap();
        let _ = fs::remove_dir_all(&top);
    }

    #[test]
    fn many_names_are_indexed() {
        let root = temp_root("many");
        let rec =
            Recorder::create(&root, Mode::Create, Options::default(), Arc::new(Counter::default())).unwrap();
        for k in 0..200 {
            assert_eq!(rec.declare(&format!("g{}/n{k}", k % 7), xla::F32, &[]).unwrap(), k);
        }
        assert_eq!(rec.declare("g3/n3", xla::F32, &[]).unwrap(), 3);
        assert!(rec.declare("g3", xla::F32, &[]).unwrap_err().to_string().contains("clashes with \"g3/"));
        assert!(rec
            .declare("g3/n3/z", xla::F32, &[])
            .unwrap_err()
            .to_string()
            .contains("clashes with \"g3/n3\""));
        rec.close().unwrap();
        let _ = fs::remove_dir_all(&root);
    }

    #[test]
    fn declarations_clash_with_another_shape_dtype_or_group() {
        let root = temp_root("clash");
        let rec =
            Recorder::create(&root, Mode::Create, Options::default(), Arc::new(Counter::default())).unwrap();
        let a = rec.declare("l/h", xla::F32, &[3]).unwrap();
        assert_eq!(rec.declare("l/h", xla::F32, &[3]).unwrap(), a);
        let e = rec.declare("l/h", xla::F32, &[4]).unwrap_err().to_string();
        assert!(e.contains("first recorded as float32 [3], now as float32 [4]"), "{e}");
        assert!(rec.declare("l/h", xla::BF16, &[3]).is_err());
        assert!(rec.declare("l", xla::F32, &[3]).is_err());
        assert!(rec.declare("l/h/z", xla::F32, &[3]).is_err());
        assert!(rec.declare("l/h.step", xla::F32, &[3]).is_err());
        assert!(matches!(rec.declare("q", xla::U4, &[3]), Err(RecordError::Dtype(_))));
        rec.close().unwrap();
        assert!(matches!(rec.declare("m", xla::F32, &[]), Err(RecordError::Closed(_))));
        // The path now holds a recording: creating again fails, overwriting works.
        let again = Recorder::create(&root, Mode::Create, Options::default(), Arc::new(Counter::default()));
        assert!(matches!(again, Err(RecordError::Io { errno: Some(libc::EEXIST), .. })));
        let over = Recorder::create(&root, Mode::Overwrite, Options::default(), Arc::new(Counter::default()))
            .unwrap();
        over.close().unwrap();
        assert!(!root.join("l").exists());
        let _ = fs::remove_dir_all(&root);
    }

    #[test]
    fn overwrite_refuses_what_is_not_a_recording() {
        let root = temp_root("not_a_recording");
        fs::create_dir_all(&root).unwrap();
        fs::write(root.join("precious.txt"), b"keep").unwrap();
        let r = Recorder::create(&root, Mode::Overwrite, Options::default(), Arc::new(Counter::default()));
        assert!(r.is_err());
        assert!(root.join("precious.txt").exists());
        let _ = fs::remove_dir_all(&root);
    }

    fn message(consumer_id: i64, values: &[i32], step: i32, device: i32) -> Message {
        let ops = [
            Operand { dtype: xla::S32, data: values.as_ptr().cast(), dims: &[2] },
            Operand { dtype: xla::S32, data: std::ptr::from_ref(&step).cast(), dims: &[] },
        ];
        // SAFETY: both operands point at live locals of the described sizes.
        unsafe { gather(consumer_id, 0, device, ops.iter().copied()) }.unwrap()
    }

    #[test]
    fn a_sink_routes_messages_without_copying_and_releases_after_writing() {
        let root = temp_root("sink");
        let budget = Arc::new(Counter::default());
        let opts = Options { chunk_bytes: 8 * 4, ..Options::default() };
        let rec = Recorder::create(&root, Mode::Create, opts, budget.clone()).unwrap();
        let x = rec.declare("x", xla::S32, &[2]).unwrap();
        let sink = rec.sink(&[Some(x), None], Some(1), r#"[["batch", {"batch_dims": [0]}]]"#, 1).unwrap();
        assert_eq!(sink.transforms, 1);
        for i in 0..6 {
            let msg = message(7, &[i, -i], 10 * i, 1);
            budget.charge(100);
            sink.route(msg, 100);
        }
        // A full chunk (4 rows) goes to the writer by itself; 2 rows wait for a flush.
        assert!(rec.flush(Duration::from_secs(30)).unwrap());
        assert_eq!(budget.held.load(Ordering::SeqCst), 0);
        let got = read_raw_rows(&root.join("x"), 6, 8, 4);
        let want: Vec<u8> = (0..6).flat_map(|i: i32| [i, -i]).flat_map(i32::to_le_bytes).collect();
        assert_eq!(got, want);
        let meta = json_at(&root.join("x"));
        assert_eq!(meta["attributes"]["hostfeed"]["transforms"][1], json!([["batch", {"batch_dims": [0]}]]));
        let steps = fs::read(root.join("x.step/c/0")).unwrap();
        assert_eq!(i64::from_le_bytes(steps[40..48].try_into().unwrap()), 50);
        let tr = fs::read(root.join("x.transforms/c/0")).unwrap();
        assert_eq!(&tr[..4], &[1, 0, 1, 0]);
        rec.close().unwrap();
        // Rows after close are dropped, released and noted.
        budget.charge(100);
        sink.route(message(7, &[1, 1], 0, 0), 100);
        assert_eq!(budget.held.load(Ordering::SeqCst), 0);
        assert_eq!(lock(&budget.notes).len(), 1);
        let _ = fs::remove_dir_all(&root);
    }

    #[test]
    fn partial_chunks_are_spilled_when_producers_wait_and_writers_idle() {
        let root = temp_root("pressure");
        let budget = Arc::new(Counter::default());
        let opts = Options { chunk_bytes: 1 << 20, ..Options::default() };
        let rec = Recorder::create(&root, Mode::Create, opts, budget.clone()).unwrap();
        let x = rec.declare("x", xla::U8, &[1000]).unwrap(); // 256 rows per chunk (bound / 4)
        rec.append(x, &[7u8; 1000], 0, 0, 0).unwrap();
        assert!(budget.held.load(Ordering::SeqCst) >= 1000, "the pending row holds its bytes");
        budget.waiting.store(true, Ordering::SeqCst);
        // The ticker notices and writes the partial chunk; no flush is involved.
        let deadline = Instant::now() + Duration::from_secs(30);
        while budget.held.load(Ordering::SeqCst) != 0 {
            assert!(Instant::now() < deadline, "the pending row was never written");
            std::thread::yield_now();
        }
        assert!(rec.stats().spills >= 1);
        rec.close().unwrap();
        let _ = fs::remove_dir_all(&root);
    }

    #[test]
    fn write_errors_are_reported_once_and_later_rows_dropped() {
        let root = temp_root("errors");
        let budget = Arc::new(Counter::default());
        let opts = Options { chunk_bytes: 8, ..Options::default() };
        let rec = Recorder::create(&root, Mode::Create, opts, budget.clone()).unwrap();
        let x = rec.declare("x", xla::S32, &[2]).unwrap();
        // A file where the chunk directory must go: every chunk write fails.
        fs::write(root.join("x/c"), b"in the way").unwrap();
        rec.append(x, &int_row(1), 0, 0, 0).unwrap();
        let e = rec.flush(Duration::from_secs(30)).unwrap_err();
        assert!(matches!(e, RecordError::Io { .. }), "{e}");
        assert!(e.to_string().contains("recording \"x\""), "{e}");
        rec.append(x, &int_row(2), 0, 0, 0).unwrap();
        let e = rec.flush(Duration::from_secs(30)).unwrap_err();
        // The same error type every time (a later flush is no ValueError), naming the array.
        assert!(matches!(e, RecordError::Io { errno: Some(_), .. }), "{e}");
        assert!(e.to_string().contains("recording \"x\": 1 more row(s) were dropped"), "{e}");
        assert!(rec.flush(Duration::from_secs(30)).unwrap());
        rec.close().unwrap();
        assert_eq!(budget.held.load(Ordering::SeqCst), 0);
        assert_eq!(json_at(&root.join("x"))["shape"], json!([0, 2]), "nothing is announced");
        let _ = fs::remove_dir_all(&root);
    }

    #[test]
    fn vectored_writes_cover_many_and_empty_buffers() {
        let root = temp_root("vectored");
        fs::create_dir_all(&root).unwrap();
        let path = root.join("f");
        let rows: Vec<Vec<u8>> =
            (0..2500u32).map(|i| if i % 7 == 0 { Vec::new() } else { i.to_le_bytes().to_vec() }).collect();
        let slices: Vec<&[u8]> = rows.iter().map(Vec::as_slice).collect();
        let f = OpenOptions::new().write(true).create(true).truncate(false).open(&path).unwrap();
        write_all_vectored_at(&f, &slices, 3).unwrap();
        let got = fs::read(&path).unwrap();
        assert_eq!(&got[..3], &[0, 0, 0]);
        assert_eq!(got[3..], rows.concat());
        let _ = fs::remove_dir_all(&root);
    }

    #[test]
    fn jobs_of_one_chunk_run_in_order() {
        let mut p = PoolState::default();
        let a = Arc::new(ArrayHandle {
            id: 0,
            name: "a".into(),
            dir: PathBuf::new(),
            group_dir: PathBuf::new(),
            leaf: "a".into(),
            spec: meta_specs("a").next().unwrap().1,
            state: Mutex::new(ArrayState::new()),
        });
        let job = |chunk, first_row| Job {
            array: Arc::clone(&a),
            chunk,
            first_row,
            rows: Vec::new(),
            partial: false,
            disk_prefix: 0,
        };
        p.jobs.extend([job(0, 0), job(0, 3), job(1, 10)]);
        assert_eq!(p.next_job().map(|j| j.first_row), Some(0));
        // Chunk 0 is being written: its second job waits, chunk 1 goes ahead.
        assert_eq!(p.next_job().map(|j| j.first_row), Some(10));
        assert!(p.next_job().is_none());
        p.running.retain(|k| *k != (0, 0));
        assert_eq!(p.next_job().map(|j| j.first_row), Some(3));
    }
}
