//! Parted arrays: one array written by many writers, each writing the chunks of
//! its own slice of every row, as when the processes of a `jax.distributed` program each
//! record the shards their devices hold of a global value.
//!
//! A parted array of `count` parts has rows of shape `[count * s0, *rest]` chunked
//! `[chunk_rows, s0, *rest]` ([`Part`]), so a chunk never spans two parts. Each part
//! is an [`ArrayHandle`] of its own (own row stream, own writer jobs, own frontier) whose
//! chunk keys carry the part's index; part 0 also writes the per-row metadata arrays in
//! place. No part writes `zarr.json`: the store's committer (process 0, in Python's
//! `hostfeed.coordination`) calls [`Recorder::commit_parted`] with the rows every part
//! has committed ([`Recorder::parted_rows`]), so a reader never sees a row some part has
//! not written. One process holding every part is the same store, bit for bit.
//!
//! Messages come from the shard-by-shard lowering of a record (`placement.py`): operand
//! 0 is `[group, part]` (int32), operand 1 the part's slice, then the step if any; a
//! parted array's sink ([`Sink::parted`](crate::record::sinks::Sink::parted)) routes each
//! to its part.

use std::sync::Mutex;

use super::declare::Layout;
use super::Recorder;
use crate::error::RecordError;
use crate::host::sync::lock;
use crate::record::arrays::{meta_specs, ArrayHandle, ArrayState};
use crate::record::commit::write_parted_metadata;
use crate::record::common::ArrayId;
use crate::record::store::io_error;
use crate::record::zarr::{ArraySpec, DType, Part};

impl Recorder {
    /// Declares parted array `name`: `count` parts whose rows are `part_shape` slices of
    /// rows `[count * part_shape[0], *part_shape[1..]]`; returns the id of each part's
    /// handle. `commits`: this process writes the array's `zarr.json` (the empty one now,
    /// later [`Recorder::commit_parted`]). Declaring it again alike returns the same ids.
    ///
    /// # Errors
    /// As [`Recorder::declare`], and a scalar row (nothing to split).
    pub fn declare_parted(
        &self,
        name: &str,
        dtype_code: i32,
        part_shape: &[u64],
        count: u64,
        commits: bool,
    ) -> Result<Vec<ArrayId>, RecordError> {
        let context = format!("recording {name:?}");
        let dtype = DType::from_xla(dtype_code).map_err(|e| e.context(&context))?;
        if part_shape.is_empty() || count == 0 {
            return Err(RecordError::Invalid(format!("{context}: a parted array needs rows of rank >= 1")));
        }
        let parts = self.check_name(name, part_shape.len())?;
        if self.is_closed() {
            return Err(self.closed_error());
        }
        let mut global = part_shape.to_vec();
        global[0] *= count;
        let create = |first: ArrayId| {
            let Layout { group_dir, leaf, chunk_rows, inner_rows, dim_names } =
                self.lay_out(&parts, part_shape, &global, dtype.itemsize, &context)?;
            let dir = group_dir.join(&leaf);
            let mut handles = Vec::new();
            for p in 0..count {
                let spec = ArraySpec {
                    dtype,
                    row_shape: part_shape.to_vec(),
                    chunk_rows,
                    codec: self.opts.codec,
                    dim_names: dim_names.clone(),
                    sep: self.opts.sep,
                    part: Some(Part { index: p, count }),
                    inner_rows,
                };
                let (meta_chunk_rows, meta_codec) = self.meta_layout();
                handles.push(ArrayHandle {
                    meta_chunk_rows,
                    meta_codec,
                    id: first + handles.len(),
                    name: name.to_string(),
                    dir: dir.clone(),
                    group_dir: group_dir.clone(),
                    leaf: leaf.clone(),
                    spec,
                    state: Mutex::new(ArrayState::new()),
                });
            }
            Ok(handles)
        };
        let finish = |first: &ArrayHandle| {
            let store = &*self.store;
            for (suffix, _) in meta_specs(&first.leaf, first.meta_chunk_rows, first.meta_codec) {
                let mdir = first.group_dir.join(format!("{}.{suffix}", first.leaf));
                store.create_dir(&mdir).map_err(|e| io_error("create", &mdir, &e).context(&context))?;
            }
            store.create_dir(&first.dir).map_err(|e| io_error("create", &first.dir, &e).context(&context))?;
            if commits && !store.exists(&first.dir.join("zarr.json")) {
                write_parted_metadata(store, &self.catalogue, first, 0).map_err(|e| e.context(&context))?;
            }
            Ok(())
        };
        self.catalogue.declare_parted(name, dtype, part_shape, count, create, finish)
    }

    /// Rows of each part of `name` whose data (and, for part 0, metadata) are on disk.
    ///
    /// # Errors
    /// An unknown name.
    pub fn parted_rows(&self, name: &str) -> Result<Vec<u64>, RecordError> {
        Ok(self.parted_handles(name)?.iter().map(|a| lock(&a.state).committed).collect())
    }

    /// Names of the parted arrays, in declaration order.
    #[must_use]
    pub fn parted_names(&self) -> Vec<String> {
        self.catalogue.parted_names()
    }

    /// Announces `rows` rows of parted array `name` in its `zarr.json` (and its metadata
    /// arrays'): the committer calls it with rows that every part has committed.
    ///
    /// # Errors
    /// An unknown name, I/O errors.
    pub fn commit_parted(&self, name: &str, rows: u64) -> Result<(), RecordError> {
        let handles = self.parted_handles(name)?;
        self.committer.commit_parted(&*self.store, &self.catalogue, &handles[0], rows)
    }
}
