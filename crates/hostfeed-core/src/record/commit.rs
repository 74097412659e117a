//! Commits: announcing the rows written so far in `zarr.json` (an array's per-row metadata
//! first, so that its metadata arrays never hold fewer rows than it), at every flush and
//! at every *live cycle* of the ticker thread (see [`Committer::cycle_due`]); and the
//! documents of a parted array, which only its committer writes.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::error::RecordError;
use crate::host::sync::lock;
use crate::record::arrays::{meta_specs, ArrayHandle, ArrayState, MetaTail, META_ANNOUNCE_ROWS_OBJECTS};
use crate::record::common::ArrayId;
use crate::record::catalogue::Catalogue;
use crate::record::common::{as_u64, as_usize};
use crate::record::failures::Failures;
use crate::record::store::{create_parent, io_error, Put, Store};
use crate::record::zarr::{self, ArraySpec, Codec};

/// See the module documentation.
pub(crate) struct Committer {
    /// Every row is announced within this long of reaching the recorder (besides every
    /// flush): the `commit_interval`.
    interval: Duration,
    /// Metadata commits (`zarr.json` replaced).
    commits: AtomicU64,
    /// Whether the metadata arrays' rows are announced exactly ([`Committer::announce_exactly`]).
    exact: AtomicBool,
    /// The live cycles: when the last began, and the rows each array is to announce once
    /// written.
    live: Mutex<Live>,
    /// Rows announced of each parted array, by name (never fewer than before).
    parted: Mutex<HashMap<String, u64>>,
}

/// The live cycles' state ([`Committer::cycle_due`]).
struct Live {
    /// When the last cycle began.
    last: Instant,
    /// Arrays whose rows up to a target are being written for a cycle: announced once
    /// written.
    waiting: Vec<(Arc<ArrayHandle>, u64)>,
}

/// What the ticker leaves for the writes of a cycle before its interval ends: the
/// writes and the commit on a local disk take milliseconds, and the ticker looks every
/// [`TICK`](crate::record::writer::TICK).
const CYCLE_LEAD: Duration = Duration::from_millis(100);

impl Committer {
    /// A committer whose every row is announced within `interval` of its arrival (and at
    /// every flush).
    pub(crate) fn new(interval: Duration) -> Self {
        Committer {
            interval,
            commits: AtomicU64::new(0),
            exact: AtomicBool::new(false),
            live: Mutex::new(Live { last: Instant::now(), waiting: Vec::new() }),
            parted: Mutex::new(HashMap::new()),
        }
    }

    /// Whether a live cycle is due; if so, it begins now. A cycle hands every array's rows
    /// received and not yet announced to the writers, a partial chunk (shard) included,
    /// and announces them once written ([`Committer::expect`],
    /// [`Committer::take_written`]): so every row is readable within `commit_interval` of
    /// reaching the recorder, however large its chunk, with no flush. Cycles begin
    /// `commit_interval` apart, less [`CYCLE_LEAD`] (the time the writes and the commit
    /// take on a local disk), so an array's partial chunk is written at most once a
    /// cycle: in place on a file system (only its new rows), put again whole where objects
    /// are (compressed chunks, object stores).
    pub(crate) fn cycle_due(&self) -> bool {
        let period = self.interval.saturating_sub(CYCLE_LEAD.min(self.interval / 10));
        let mut live = lock(&self.live);
        if live.last.elapsed() < period {
            return false;
        }
        live.last = Instant::now();
        true
    }

    /// The arrays a cycle leaves out: those still writing the rows of an earlier one.
    pub(crate) fn in_flight(&self) -> Vec<ArrayId> {
        lock(&self.live).waiting.iter().map(|(a, _)| a.id).collect()
    }

    /// Notes that each array of `targets` is to announce its rows up to its target once
    /// they are written.
    pub(crate) fn expect(&self, targets: Vec<(Arc<ArrayHandle>, u64)>) {
        lock(&self.live).waiting.extend(targets);
    }

    /// The arrays whose cycle's rows are written (or whose writes failed), no longer
    /// waited for.
    pub(crate) fn take_written(&self) -> Vec<Arc<ArrayHandle>> {
        let mut live = lock(&self.live);
        let (done, left): (Vec<_>, Vec<_>) = std::mem::take(&mut live.waiting).into_iter().partition(|(a, target)| {
            let st = lock(&a.state);
            st.frontier >= *target || st.failed
        });
        live.waiting = left;
        done.into_iter().map(|(a, _)| a).collect()
    }

    /// The targets of the cycles not written yet.
    pub(crate) fn waiting(&self) -> Vec<(Arc<ArrayHandle>, u64)> {
        lock(&self.live).waiting.clone()
    }

    /// Commits so far.
    pub(crate) fn count(&self) -> u64 {
        self.commits.load(Ordering::Relaxed)
    }

    /// Announces the rows written so far in `zarr.json` (per-row metadata first); a
    /// failure fails the array.
    pub(crate) fn commit(&self, store: &dyn Store, catalogue: &Catalogue, failures: &Failures, a: &ArrayHandle) {
        let mut st = lock(&a.state);
        let rows = st.frontier;
        // Closing: metadata arrays announced past the rows are announced exactly.
        let exact = self.exact.load(Ordering::Relaxed);
        let settle = exact && st.meta_announced != Some(rows) && a.spec.part.is_none();
        if (rows == st.committed && !settle) || st.failed {
            return;
        }
        match commit_locked(store, catalogue, a, &mut st, rows, exact) {
            Ok(()) => {
                self.commits.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => failures.record(a, &mut st, e),
        }
    }

    /// From now on, commits announce the rows of the per-row metadata arrays exactly (an
    /// object store's announce them ahead while recording): called as the recorder closes.
    pub(crate) fn announce_exactly(&self) {
        self.exact.store(true, Ordering::Relaxed);
    }

    /// [`Committer::commit`] of every array of `catalogue`.
    pub(crate) fn commit_all(&self, store: &dyn Store, catalogue: &Catalogue, failures: &Failures) {
        for a in &catalogue.all() {
            self.commit(store, catalogue, failures, a);
        }
    }

    /// Announces `rows` rows of the parted array whose first part is `a` (see
    /// [`write_parted_metadata`]), unless as many are announced already: the ticker's
    /// live cycles and the program's flushes both announce, one at a time, and never
    /// fewer rows than before.
    ///
    /// # Errors
    /// I/O errors.
    pub(crate) fn commit_parted(
        &self,
        store: &dyn Store,
        catalogue: &Catalogue,
        a: &ArrayHandle,
        rows: u64,
    ) -> Result<(), RecordError> {
        let mut announced = lock(&self.parted);
        if announced.get(&a.name).is_some_and(|&n| n >= rows) {
            return Ok(());
        }
        write_parted_metadata(store, catalogue, a, rows).map_err(|e| e.context(&a.context()))?;
        announced.insert(a.name.clone(), rows);
        self.commits.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// Announces rows `..rows` of `a` (under its lock, `st`): writes their per-row metadata,
/// then the documents (`zarr.json`) of the metadata arrays, then the data array's.
///
/// In an object store, where every document and chunk is an object put whole (and each
/// put is a request), the metadata arrays announce rows ahead, to the next multiple of
/// [`META_ANNOUNCE_ROWS_OBJECTS`] (rows past the data array's read as zeros, and every
/// reader takes the data array's rows), so that their five documents are put again once
/// every that many rows rather than at every commit; `exact` (closing) announces `rows`.
fn commit_locked(
    store: &dyn Store,
    catalogue: &Catalogue,
    a: &ArrayHandle,
    st: &mut ArrayState,
    rows: u64,
    exact: bool,
) -> Result<(), RecordError> {
    let from = st.committed;
    let lo = as_usize(from - st.meta_first);
    let hi = as_usize(rows - st.meta_first);
    let meta = &st.meta[lo..hi];
    let announce = match st.meta_announced {
        _ if exact || store.in_place().is_some() => rows,
        Some(ahead) if ahead >= rows => ahead,
        _ => rows.next_multiple_of(META_ANNOUNCE_ROWS_OBJECTS),
    };
    let fresh = st.meta_fresh;
    for (i, (suffix, spec)) in meta_specs(&a.leaf, a.meta_chunk_rows, a.meta_codec).enumerate() {
        let values: Vec<u8> = match suffix {
            "seq" => meta.iter().flat_map(|m| m.seq.to_le_bytes()).collect(),
            "step" => meta.iter().flat_map(|m| m.step.to_le_bytes()).collect(),
            "device" => meta.iter().flat_map(|m| m.device.to_le_bytes()).collect(),
            "time_ns" => meta.iter().flat_map(|m| m.time_ns.to_le_bytes()).collect(),
            _ => meta.iter().flat_map(|m| m.transforms.to_le_bytes()).collect(),
        };
        let mdir = a.group_dir.join(format!("{}.{suffix}", a.leaf));
        let tail = &mut st.meta_tails[i];
        match a.spec.part {
            // A parted array: part 0 writes the rows' metadata; `zarr.json` is written
            // by the store's committer once every part has its rows (`parts.rs`).
            Some(p) if p.index != 0 => {}
            Some(_) => write_rows_in_place(store, &spec, &mdir, from, &values, tail, fresh)?,
            None => {
                write_rows_in_place(store, &spec, &mdir, from, &values, tail, fresh)?;
                if st.meta_announced != Some(announce) {
                    zarr::write_json(store, &mdir, &spec.metadata(announce, &json!({})))?;
                }
            }
        }
    }
    if a.spec.part.is_none() {
        st.meta_announced = Some(announce);
        if rows > from {
            zarr::write_json(store, &a.dir, &a.spec.metadata(rows, &catalogue.attributes(a)))?;
        }
    }
    st.committed = rows;
    // Forget metadata that is on disk.
    st.meta.drain(..hi);
    st.meta_first = rows;
    Ok(())
}

/// Writes the documents (`zarr.json`) of the parted array whose first part is `a` and of
/// its metadata arrays, announcing `rows` rows: the rows every part has committed
/// (`recorder/parts.rs`).
///
/// # Errors
/// I/O errors.
pub(crate) fn write_parted_metadata(
    store: &dyn Store,
    catalogue: &Catalogue,
    a: &ArrayHandle,
    rows: u64,
) -> Result<(), RecordError> {
    for (suffix, spec) in meta_specs(&a.leaf, a.meta_chunk_rows, a.meta_codec) {
        let mdir = a.group_dir.join(format!("{}.{suffix}", a.leaf));
        zarr::write_json(store, &mdir, &spec.metadata(rows, &json!({})))?;
    }
    zarr::write_json(store, &a.dir, &a.spec.metadata(rows, &catalogue.attributes(a)))
}

/// Writes the rows `from..` of a metadata array whose bytes are `values`: in place (each
/// chunk object at full size, its rows written at their offsets) where the store can and
/// the chunks are uncompressed, else each chunk put whole (compressed as `spec` says;
/// `tail`, `fresh`: see [`put_rows_whole`]).
fn write_rows_in_place(
    store: &dyn Store,
    spec: &ArraySpec,
    dir: &Path,
    from: u64,
    values: &[u8],
    tail: &mut MetaTail,
    fresh: bool,
) -> Result<(), RecordError> {
    let in_place = store.in_place().filter(|_| spec.codec == Codec::Raw);
    let rb = spec.row_bytes();
    let rows = as_u64(values.len() / rb.max(1));
    let mut row = from;
    let mut off = 0usize;
    while row < from + rows {
        let k = row / spec.chunk_rows;
        let end = ((k + 1) * spec.chunk_rows).min(from + rows);
        let n = as_usize(end - row) * rb;
        let path = spec.chunk_path(dir, k);
        create_parent(store, &path)?;
        let at = (row - k * spec.chunk_rows) * as_u64(rb);
        let new = &values[off..off + n];
        match in_place {
            Some(in_place) => in_place.write_at(&path, at, &[new], as_u64(spec.chunk_bytes()))?,
            None => put_rows_whole(store, spec, &path, k, as_usize(at), new, tail, fresh)?,
        }
        off += n;
        row = end;
    }
    Ok(())
}

/// The bytes of the metadata chunk at `path` (of an array laid out as `spec`), decoded;
/// `Ok(None)` where there is none.
///
/// # Errors
/// The chunk cannot be read or decoded.
pub(crate) fn read_meta_chunk(store: &dyn Store, spec: &ArraySpec, path: &Path) -> Result<Option<Vec<u8>>, RecordError> {
    let stored = match store.get(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_error("read back", path, &e)),
    };
    decode_meta_chunk(spec, path, stored).map(Some)
}

/// The bytes of metadata chunk `path` from its `stored` bytes, decoded.
fn decode_meta_chunk(spec: &ArraySpec, path: &Path, stored: Vec<u8>) -> Result<Vec<u8>, RecordError> {
    let undecodable = |e: String| RecordError::Io {
        errno: Some(libc::EIO),
        message: format!("cannot decompress {}: {e}", path.display()),
    };
    match spec.codec {
        Codec::Raw => Ok(stored),
        Codec::Blosc(_) => zarr::blosc_decode(&stored).map_err(undecodable),
        Codec::Zstd(_) => {
            // One byte more than a chunk, so that a longer frame is seen.
            zstd::bulk::decompress(&stored, spec.chunk_bytes() + 1).map_err(|e| RecordError::Io {
                errno: Some(libc::EIO),
                message: format!("cannot decompress {}: {e}", path.display()),
            })
        }
    }
}

/// Puts chunk `k`, at `path`, again whole with `new` at byte `at`: its earlier rows (a
/// chunk begun at an earlier commit) from `tail` where it is the chunk put last, else read
/// back, zeros (the fill value) where none were written; compressed as `spec` says.
/// Where the store holds no chunk of this array that this recorder did not put (`fresh`),
/// a chunk of zeros (devices and transforms, mostly) is not put: it reads as the fill value.
/// `tail` becomes this chunk.
#[allow(clippy::too_many_arguments)]
fn put_rows_whole(
    store: &dyn Store,
    spec: &ArraySpec,
    path: &Path,
    k: u64,
    at: usize,
    new: &[u8],
    tail: &mut MetaTail,
    fresh: bool,
) -> Result<(), RecordError> {
    // Rows from the chunk's start: nothing earlier to read back (a request saved per
    // chunk begun, and the later bytes are zeros or past the announced rows).
    let earlier = match tail.take() {
        _ if at == 0 => None,
        Some((t, None)) if t == k => None,
        Some((t, Some(stored))) if t == k => Some(decode_meta_chunk(spec, path, stored)?),
        _ => read_meta_chunk(store, spec, path)?,
    };
    let mut chunk = earlier.unwrap_or_else(|| vec![0u8; spec.chunk_bytes()]);
    if chunk.len() != spec.chunk_bytes() {
        return Err(RecordError::Io {
            errno: Some(libc::EIO),
            message: format!(
                "cannot append to {}: it holds {} bytes, not a chunk of {}",
                path.display(),
                chunk.len(),
                spec.chunk_bytes()
            ),
        });
    }
    chunk[at..at + new.len()].copy_from_slice(new);
    if fresh && chunk.iter().all(|&b| b == 0) {
        *tail = Some((k, None));
        return Ok(());
    }
    let stored = match spec.codec {
        Codec::Raw => chunk,
        Codec::Zstd(level) => zstd::bulk::compress(&chunk, level).map_err(|e| RecordError::Io {
            errno: Some(libc::EIO),
            message: format!("cannot compress {}: {e}", path.display()),
        })?,
        Codec::Blosc(clevel) => {
            zarr::blosc_encode(&chunk, spec.dtype.itemsize, clevel).map_err(|e| RecordError::Io {
                errno: Some(libc::EIO),
                message: format!("cannot compress {}: {e}", path.display()),
            })?
        }
    };
    store.put(path, &stored, Put::Replace)?;
    *tail = Some((k, Some(stored)));
    Ok(())
}
