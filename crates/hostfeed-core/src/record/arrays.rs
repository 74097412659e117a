//! An array's state (its pending rows, chunk jobs and frontier), the layout of its per-row
//! metadata arrays, and the jobs the writers write.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::ffi::c_api::dtype as xla;
use crate::host::buffer::HostBuffer;
use crate::record::common::{ArrayId, Budget};
use crate::record::zarr::{ArraySpec, Codec, DType, ROW_METADATA};

/// Rows per chunk of a per-row metadata array on a file system (written in place: a
/// commit writes only the new rows).
pub(crate) const META_CHUNK_ROWS: u64 = 1 << 16;
/// Rows per chunk of a per-row metadata array in an object store, where a commit puts the
/// whole chunk holding the new rows again: 8 KiB of 8-byte values, compressed
/// ([`META_CODEC_OBJECTS`]), so that a commit puts again at most 1,023 rows of each.
pub(crate) const META_CHUNK_ROWS_OBJECTS: u64 = 1 << 10;
/// The codec of the per-row metadata arrays in an object store: Blosc, bytes shuffled then
/// zstd (at 3), so that record numbers and steps compress to a few bits a row and times
/// to under 2 bytes (zstd alone: a byte, and 2), and the metadata of small rows does not
/// outweigh them (devices and transforms, zeros, are not put at all).
pub(crate) const META_CODEC_OBJECTS: Codec = Codec::Blosc(2);
/// In an object store, the per-row metadata arrays' `zarr.json` announce rows to the next
/// multiple of this many (zeros past the data array's rows, which readers take), so that a
/// commit rewrites those five documents once every this many rows, not at every flush;
/// closing announces the rows exactly.
pub(crate) const META_ANNOUNCE_ROWS_OBJECTS: u64 = 1 << 15;

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
pub(crate) struct Payload {
    pub(crate) buf: HostBuffer,
    /// Bytes charged against the budget (released early by [`Payload::uncharge`]: rows a
    /// recorder's window keeps count against the window's bound instead).
    pub(crate) charged: AtomicUsize,
    pub(crate) budget: Arc<dyn Budget>,
}

impl Payload {
    /// Bytes `buf` kept for rows, charged `charged` bytes against `budget`.
    pub(crate) fn new(buf: HostBuffer, charged: usize, budget: Arc<dyn Budget>) -> Self {
        Payload { buf, charged: AtomicUsize::new(charged), budget }
    }

    /// Bytes `buf` kept for rows with no charge (a copy a window made), for the budget of
    /// `like`.
    pub(crate) fn uncharged(buf: HostBuffer, like: &Payload) -> Self {
        Payload::new(buf, 0, Arc::clone(&like.budget))
    }

    /// Releases the charge now (the bytes are counted elsewhere from now on).
    pub(crate) fn uncharge(&self) {
        let charged = self.charged.swap(0, Ordering::AcqRel);
        if charged > 0 {
            self.budget.release(charged);
        }
    }
}

impl Drop for Payload {
    fn drop(&mut self) {
        self.uncharge();
    }
}

/// One row: `len` bytes at `offset` of a payload (which several rows may share).
pub(crate) struct Row {
    pub(crate) payload: Arc<Payload>,
    pub(crate) offset: usize,
    pub(crate) len: usize,
    pub(crate) meta: RowMeta,
}

impl Row {
    pub(crate) fn bytes(&self) -> &[u8] {
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

pub(crate) struct ArrayState {
    /// Rows received.
    pub(crate) received: u64,
    /// Rows of the current chunk not yet handed to a writer; the first is row `pending_first`.
    pub(crate) pending: Vec<Row>,
    pub(crate) pending_first: u64,
    /// Compressed codec: rows of the current chunk already on disk in a padded partial
    /// chunk (after a flush); the next write of that chunk reads them back.
    pub(crate) on_disk_prefix: u64,
    /// Row ranges written, by start; `frontier` = rows written contiguously from 0.
    pub(crate) done: BTreeMap<u64, u64>,
    pub(crate) frontier: u64,
    /// Rows announced in `zarr.json`.
    pub(crate) committed: u64,
    /// Metadata of rows `meta_first..received`.
    pub(crate) meta: Vec<RowMeta>,
    pub(crate) meta_first: u64,
    /// The first write error; later rows are dropped (and counted) instead of written.
    pub(crate) failed: bool,
    /// That error's errno and text (repeated by the errors about the dropped rows).
    pub(crate) failure: Option<(Option<i32>, String)>,
    pub(crate) dropped: u64,
    /// Rows the per-row metadata arrays' `zarr.json` announce (`None`: not known, an
    /// array resumed); in an object store, past `committed`, to the end of
    /// [`META_ANNOUNCE_ROWS_OBJECTS`] ([`crate::record::commit`]).
    pub(crate) meta_announced: Option<u64>,
    /// Whether the store holds no metadata chunk objects but those this recorder put (an
    /// array it created): a chunk of zeros is then not put (see [`MetaTail`]).
    pub(crate) meta_fresh: bool,
    /// In an object store, each metadata array's chunk put last ([`ROW_METADATA`] order).
    pub(crate) meta_tails: Vec<MetaTail>,
}

/// The chunk of a per-row metadata array that an object store was handed last: its index
/// and the bytes put (as stored, compressed), or `None` where a chunk of zeros (the fill
/// value) was not put; the next commit that adds rows to it starts from these instead of
/// reading it back.
pub(crate) type MetaTail = Option<(u64, Option<Vec<u8>>)>;

impl ArrayState {
    /// An array with no rows.
    pub(crate) fn new() -> Self {
        ArrayState {
            received: 0,
            pending: Vec::new(),
            pending_first: 0,
            on_disk_prefix: 0,
            done: BTreeMap::new(),
            frontier: 0,
            committed: 0,
            meta: Vec::new(),
            meta_first: 0,
            failed: false,
            failure: None,
            dropped: 0,
            meta_announced: Some(0),
            meta_fresh: true,
            meta_tails: vec![None; ROW_METADATA.len()],
        }
    }
}

impl ArrayState {
    /// An array that holds `rows` rows already (a store appended to): the next row is row
    /// `rows`, and the rows of its last chunk (of `chunk_rows`) are in the store.
    pub(crate) fn resumed(rows: u64, chunk_rows: u64) -> Self {
        ArrayState {
            received: rows,
            pending_first: rows,
            on_disk_prefix: rows % chunk_rows.max(1),
            frontier: rows,
            committed: rows,
            meta_first: rows,
            meta_announced: None,
            meta_fresh: false,
            ..ArrayState::new()
        }
    }
}

/// The per-row metadata arrays of data array `leaf`, `chunk_rows` rows a chunk encoded with
/// `codec`: suffix and layout.
pub(crate) fn meta_specs(
    leaf: &str,
    chunk_rows: u64,
    codec: Codec,
) -> impl Iterator<Item = (&'static str, ArraySpec)> + '_ {
    ROW_METADATA.iter().map(move |&suffix| {
        let code = match suffix {
            "device" => xla::S32,
            "transforms" => xla::S16,
            _ => xla::S64,
        };
        let spec = ArraySpec {
            dtype: DType::from_xla(code).unwrap_or_else(|_| unreachable!("metadata dtypes are valid")),
            row_shape: vec![],
            chunk_rows,
            codec,
            dim_names: vec![Some(format!("{leaf}.row"))],
            sep: '/',
            part: None,
            inner_rows: None,
        };
        (suffix, spec)
    })
}

/// One array of the store (plus its per-row metadata arrays).
pub struct ArrayHandle {
    pub(crate) id: ArrayId,
    pub(crate) name: String,
    /// The data array's directory, its group's directory and its last name part.
    pub(crate) dir: PathBuf,
    pub(crate) group_dir: PathBuf,
    pub(crate) leaf: String,
    pub(crate) spec: ArraySpec,
    /// Rows per chunk of its per-row metadata arrays.
    pub(crate) meta_chunk_rows: u64,
    /// The codec of its per-row metadata arrays (raw on a file system, where they are
    /// written in place; zstd in an object store, [`META_CODEC_OBJECTS`]).
    pub(crate) meta_codec: Codec,
    pub(crate) state: Mutex<ArrayState>,
}

impl ArrayHandle {
    pub(crate) fn context(&self) -> String {
        format!("recording {:?}", self.name)
    }
}

/// A chunk (or the part of one) for a writer.
pub(crate) struct Job {
    pub(crate) array: Arc<ArrayHandle>,
    pub(crate) chunk: u64,
    /// Row index of `rows[0]`.
    pub(crate) first_row: u64,
    pub(crate) rows: Vec<Row>,
    /// Pad to a full chunk (a partial chunk written at a flush or spill).
    pub(crate) partial: bool,
    /// Compressed codec: rows at the start of this chunk to read back from disk.
    pub(crate) disk_prefix: u64,
}

impl Job {
    /// The array and chunk (shard) the job writes into. Jobs with one key run one at a
    /// time, in order; jobs of different chunks (shards) in parallel. A shard's jobs (its
    /// inner chunks) are not spread over the writers: the kernel lets one write at a time
    /// into a file, so two writers in one shard would wait for each other, while two shards
    /// are two files written at once; parallelism is across shards.
    pub(crate) fn key(&self) -> (ArrayId, u64) {
        (self.array.id, self.chunk)
    }

    /// The row after the job's last.
    pub(crate) fn end_row(&self) -> u64 {
        self.first_row + self.rows.len() as u64
    }
}
