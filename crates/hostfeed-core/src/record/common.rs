//! What every file of the recorder shares, below all of them: an array's id, the
//! [`Budget`] a recorder charges its bytes to, its [`Options`] and [`Mode`], and small
//! helpers (lock recovery, integer conversions).
//!
//! No Python here.

use std::sync::{PoisonError, RwLock};
use std::time::Duration;

use crate::host::hub::Hub;
use crate::record::zarr::Codec;

/// Index of an array in its recorder.
pub(crate) type ArrayId = usize;

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
    /// Waits until `bytes` more fit under the bound (at once if nothing is charged: a row
    /// larger than the bound goes alone). For producers that are not the consumer thread
    /// (which frees the room): rows a recorder's steps hand over from their outputs.
    fn wait_for_room(&self, bytes: usize) {
        let _ = bytes;
    }
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
    fn wait_for_room(&self, bytes: usize) {
        self.queue.wait_for_room(bytes);
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
    /// Every row received is announced within this long (besides every flush), its
    /// partial chunk written by a live cycle if need be; `Duration::MAX`: at flushes only.
    /// While it is finite, an object put whole (object stores) holds few large rows.
    pub commit_interval: Duration,
    /// Chunk key separator: `/` (nested directories) or `.` (flat file names).
    pub sep: char,
    /// Shard size in bytes (Zarr's `sharding_indexed`: each object holds this many bytes of
    /// rows in chunks of `chunk_bytes`); `None`: a chunk is an object. Where a shard is put
    /// whole (compressed, or an object store) its rows wait in memory, so it is capped at a
    /// quarter of the byte bound like a chunk.
    pub shard_bytes: Option<usize>,
    /// An object store's lock: how long it stays held after its recorder stops renewing it
    /// (a crashed process); renewed every third of it while the recorder is open.
    pub lease: Duration,
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
            shard_bytes: None,
            lease: Duration::from_secs(60),
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
    /// Append to the hostfeed recording at the path (create it if there is none): every
    /// array goes on after its last announced row. With `resume_after_step`, the rows from
    /// the first one whose step is greater are dropped first (a job restarted from its
    /// checkpoint of that step records the later steps exactly once).
    Append {
        /// Drop the rows recorded after this step.
        resume_after_step: Option<i64>,
    },
}

/// Takes a read lock, recovering the guard if a panic poisoned it.
pub(crate) fn read_lock<T>(l: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    // See `sync::lock`: no user code runs under the crate's locks.
    l.read().unwrap_or_else(PoisonError::into_inner)
}

/// Takes a write lock, recovering the guard if a panic poisoned it.
pub(crate) fn write_lock<T>(l: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(PoisonError::into_inner)
}

/// `n` as a `usize` (saturating).
pub(crate) fn as_usize(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

/// `n` as a `u64`.
pub(crate) fn as_u64(n: usize) -> u64 {
    n as u64
}
