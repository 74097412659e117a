//! Declaring arrays: a record name checked (its paths under the system's limit), the
//! array laid out (its group, chunking, sharding and dimension names) and its documents
//! written with zero rows, under the catalogue's locks ([`Catalogue::declare`]); and what
//! a declaration adds to the catalogue (summaries, transforms descriptions).
//!
//! [`Catalogue::declare`]: crate::record::catalogue::Catalogue::declare

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use serde_json::json;

use super::Recorder;
use crate::error::RecordError;
use crate::host::sync::lock;
use crate::record::arrays::{meta_specs, ArrayHandle, ArrayState};
use crate::record::common::{as_u64, as_usize, ArrayId};
use crate::record::store::io_error;
use crate::record::zarr::{self, ArraySpec, Codec, DType};

/// Longest path the recorder creates (Linux's `PATH_MAX`).
const PATH_MAX: usize = 4096;
/// Room a path below an array's directory needs past the array's name: the longest
/// metadata suffix (`.transforms`), the chunk key (`/c/` and a 20-digit index) and a
/// temporary file's suffix (`.PID.N.tmp`); each row dimension adds two bytes (`/0`).
const KEY_ROOM: usize = 11 + 3 + 20 + 40;
/// Where objects are put whole (an object store), the most rows of an object (a chunk or
/// a shard): a flush puts the object holding an array's last rows again whole, so what it
/// sends grows with the rows since that object began (at most this many), not with the
/// chunk size. 256 rows of 16 bytes are a 4 KiB object: a flush every 1,000 rows puts
/// about an eighth of its rows again, beside their metadata (compressed, 1,024 rows a
/// chunk).
const OBJECT_ROWS: u64 = 256;
/// There, the fewest chunks a shard of [`OBJECT_ROWS`] rows is cut into: a partial shard
/// is padded to the end of its last chunk only.
const OBJECT_INNER_CHUNKS: u64 = 8;
/// While rows are announced live (a finite `commit_interval`), an object there holds at
/// most this many bytes of rows, or [`LIVE_OBJECT_ROWS`] rows where that is more: each live
/// cycle puts the object being filled again, so what a cycle sends grows with the rows of
/// that object; 16 rows of 1 KiB and more, recorded at a row a second and announced every
/// 30 s, are sent in under twice their bytes (`benches/object_bytes.py`).
const LIVE_OBJECT_BYTES: usize = 16 << 10;
/// See [`LIVE_OBJECT_BYTES`].
const LIVE_OBJECT_ROWS: u64 = 16;

/// Where a new array lives and how it is chunked ([`Recorder::lay_out`]).
pub(super) struct Layout {
    /// The directory of the group that holds it.
    pub(super) group_dir: PathBuf,
    /// Its name in that group.
    pub(super) leaf: String,
    /// Rows per chunk (per shard, when sharded).
    pub(super) chunk_rows: u64,
    /// Rows per inner chunk of a shard; `None`: not sharded.
    pub(super) inner_rows: Option<u64>,
    /// Its dimension names: `LEAF.row`, then `LEAF.d0`, ...
    pub(super) dim_names: Vec<Option<String>>,
}

impl Recorder {
    /// Where a new array named by `parts` lives and how it is chunked, for rows of
    /// `row_shape` (`shown`: the shape an error names): creates the groups above it that do
    /// not exist yet; returns its group directory, leaf name, rows per chunk and dimension
    /// names.
    pub(super) fn lay_out(
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
        let mut chunk_rows = as_u64((target / row_bytes.max(1)).max(1));
        // Where objects are put whole (an object store), a flush or a live cycle puts the
        // object holding the last rows again, padded to its last chunk: an object holds at
        // most `OBJECT_ROWS` (while rows are announced live, fewer of large rows:
        // `LIVE_OBJECT_BYTES`), and a shard's chunks at most an eighth of that, so that small
        // rows make small objects (as their metadata does) and a flush costs about the rows
        // since its object began, not a chunk size of padding.
        let whole_objects = self.store.in_place().is_none();
        let object_rows = if self.opts.commit_interval == Duration::MAX {
            OBJECT_ROWS
        } else {
            as_u64(LIVE_OBJECT_BYTES / row_bytes.max(1)).clamp(LIVE_OBJECT_ROWS, OBJECT_ROWS)
        };
        if whole_objects {
            chunk_rows = chunk_rows.min(object_rows);
        }
        let mut dim_names = vec![Some(format!("{leaf}.row"))];
        dim_names.extend((0..row_shape.len()).map(|i| Some(format!("{leaf}.d{i}"))));
        let Some(shard_bytes) = self.opts.shard_bytes else {
            return Ok(Layout { group_dir, leaf, chunk_rows, inner_rows: None, dim_names });
        };
        if whole_objects {
            chunk_rows = chunk_rows.min(object_rows / OBJECT_INNER_CHUNKS).max(1);
        }
        // Rows of a shard written in place or streamed never wait in memory (beyond an inner
        // chunk); a shard put whole does.
        let in_place = matches!(self.opts.codec, Codec::Raw) && self.store.in_place().is_some();
        let cap = if in_place || self.store.streams() { usize::MAX } else { quarter.max(1) };
        let mut per_shard = (shard_bytes.min(cap) / (as_usize(chunk_rows) * row_bytes).max(1)).max(1);
        if whole_objects {
            per_shard = per_shard.min(as_usize(object_rows / chunk_rows).max(1));
        }
        Ok(Layout {
            group_dir,
            leaf,
            chunk_rows: chunk_rows * as_u64(per_shard),
            inner_rows: Some(chunk_rows),
            dim_names,
        })
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
        self.catalogue
            .declare(name, dtype, row_shape, |id| self.create_array(name, &parts, dtype, row_shape, id))
    }

    /// Lays out array `name` (its name's `parts`) with rows of `row_shape` and `dtype`, as
    /// array `id`, and writes its metadata arrays' and its own `zarr.json` with zero rows
    /// (a shared store's documents that exist already are kept).
    fn create_array(
        &self,
        name: &str,
        parts: &[&str],
        dtype: DType,
        row_shape: &[u64],
        id: ArrayId,
    ) -> Result<ArrayHandle, RecordError> {
        let context = format!("recording {name:?}");
        let store = &*self.store;
        let Layout { group_dir, leaf, chunk_rows, inner_rows, dim_names } =
            self.lay_out(parts, row_shape, row_shape, dtype.itemsize, &context)?;
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
        let (meta_chunk_rows, meta_codec) = self.meta_layout();
        let handle = ArrayHandle {
            meta_chunk_rows,
            meta_codec,
            id,
            name: name.to_string(),
            dir,
            group_dir,
            leaf,
            spec,
            state: Mutex::new(ArrayState::new()),
        };
        // Metadata arrays, then the data array, all with zero rows.
        let keep = |dir: &Path| self.shared && store.exists(&dir.join("zarr.json"));
        for (suffix, mspec) in meta_specs(&handle.leaf, handle.meta_chunk_rows, handle.meta_codec) {
            let mdir = handle.group_dir.join(format!("{}.{suffix}", handle.leaf));
            store.create_dir(&mdir).map_err(|e| io_error("create", &mdir, &e).context(&context))?;
            if !keep(&mdir) {
                zarr::write_json(store, &mdir, &mspec.metadata(0, &json!({})))
                    .map_err(|e| e.context(&context))?;
            }
        }
        store.create_dir(&handle.dir).map_err(|e| io_error("create", &handle.dir, &e).context(&context))?;
        if keep(&handle.dir) {
            // Another process's array: its metadata chunks may be in the store already.
            lock(&handle.state).meta_fresh = false;
        } else {
            let attrs = self.catalogue.attributes(&handle);
            zarr::write_json(store, &handle.dir, &handle.spec.metadata(0, &attrs))
                .map_err(|e| e.context(&context))?;
        }
        Ok(handle)
    }

    /// Says what the rows of array `name` summarize (a JSON object: the kind of summary,
    /// the statistics' names or a histogram's edges), written as `hostfeed.reduce` in its
    /// attributes from its next `zarr.json` on.
    ///
    /// # Errors
    /// Text that is not a JSON object; a name that already summarizes otherwise.
    pub fn describe_summary(&self, name: &str, summary: &str) -> Result<(), RecordError> {
        self.catalogue.describe_summary(name, summary)
    }

    /// Names the axes of array `name`'s rows (a JSON array of strings, or nulls for axes
    /// without a name), written as `hostfeed.axes` in its attributes from its next
    /// `zarr.json` on.
    ///
    /// # Errors
    /// Text that is not such an array.
    pub fn describe_axes(&self, name: &str, axes: &str) -> Result<(), RecordError> {
        self.catalogue.describe_axes(name, axes)
    }

    /// The index of a transforms description (JSON) in the recorder's table.
    pub fn transforms_index(&self, description: &str) -> i16 {
        self.catalogue.transforms_index(description)
    }
}
