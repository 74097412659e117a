//! Parted arrays: one array written by many writers, each writing the chunks of
//! its own slice of every row, as when the processes of a `jax.distributed` program each
//! record the shards their devices hold of a global value.
//!
//! A parted array of `count` parts has rows of shape `[count * s0, *rest]` chunked
//! `[chunk_rows, s0, *rest]` ([`zarr::Part`]), so a chunk never spans two parts. Each part
//! is an [`ArrayHandle`] of its own (own row stream, own writer jobs, own frontier) whose
//! chunk keys carry the part's index; part 0 also writes the per-row metadata arrays in
//! place. No part writes `zarr.json`: the store's committer (process 0, in Python's
//! `hostfeed.coordination`) calls [`Recorder::commit_parted`] with the rows every part
//! has committed ([`Recorder::parted_rows`]), so a reader never sees a row some part has
//! not written. One process holding every part is the same store, bit for bit.
//!
//! Messages come from the shard-by-shard lowering of a record (`placement.py`): operand
//! 0 is `[group, part]` (int32), operand 1 the part's slice, then the step if any.

use std::sync::{Arc, Mutex};

use serde_json::json;

use super::{Layout, Recorder};
use crate::error::RecordError;
use crate::ffi::c_api::dtype as xla;
use crate::host::message::Message;
use crate::host::sync::lock;
use crate::record::arrays::{meta_specs, ArrayHandle, ArrayState, Payload, Row};
use crate::record::common::{as_u64, as_usize, read_lock, write_lock, ArrayId};
use crate::record::sinks::{read_steps, Sink};
use crate::record::store::io_error;
use crate::record::zarr::{self, ArraySpec, DType, Part};

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
        let mut arrays = write_lock(&self.arrays);
        let mut index = lock(&self.index);
        index.refuse_frozen(name)?;
        let mut parted = lock(&self.parted);
        let mut global = part_shape.to_vec();
        global[0] *= count;
        if let Some(ids) = parted.get(name) {
            let a = &arrays[ids[0]];
            if a.spec.dtype == dtype && a.spec.row_shape == part_shape && ids.len() == as_usize(count) {
                return Ok(ids.clone());
            }
            let mut was = a.spec.row_shape.clone();
            was[0] *= as_u64(ids.len());
            return Err(RecordError::Invalid(format!(
                "record name {name:?} was first recorded as {} {was:?} in {} part(s), now as {} \
                 {global:?} in {count}; a name keeps one dtype, shape and sharding: use another name",
                a.spec.dtype.name,
                ids.len(),
                dtype.name
            )));
        }
        if index.arrays.contains_key(name) || index.groups.contains(name) {
            return Err(RecordError::Invalid(format!(
                "record name {name:?} is already recorded, with another layout (per device or \
                 unsharded); a sharded value needs a name of its own"
            )));
        }
        let prefixes: Vec<&str> = name.match_indices('/').map(|(i, _)| &name[..i]).collect();
        if let Some(p) = prefixes.iter().find(|p| index.arrays.contains_key(**p)) {
            return Err(RecordError::Invalid(format!(
                "record name {name:?} clashes with {p:?}: a name cannot be both an array and a group"
            )));
        }
        let Layout { group_dir, leaf, chunk_rows, inner_rows, dim_names } =
            self.lay_out(&parts, part_shape, &global, dtype.itemsize, &context)?;
        let dir = group_dir.join(&leaf);
        let mut ids = Vec::new();
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
            let handle = Arc::new(ArrayHandle {
                meta_chunk_rows: self.meta_chunk_rows(),
                id: arrays.len(),
                name: name.to_string(),
                dir: dir.clone(),
                group_dir: group_dir.clone(),
                leaf: leaf.clone(),
                spec,
                state: Mutex::new(ArrayState::new()),
            });
            ids.push(handle.id);
            arrays.push(handle);
        }
        let first = Arc::clone(&arrays[ids[0]]);
        let store = &*self.store;
        for (suffix, _) in meta_specs(&leaf, self.meta_chunk_rows()) {
            let mdir = group_dir.join(format!("{leaf}.{suffix}"));
            store.create_dir(&mdir).map_err(|e| io_error("create", &mdir, &e).context(&context))?;
        }
        store.create_dir(&dir).map_err(|e| io_error("create", &dir, &e).context(&context))?;
        if commits && !store.exists(&dir.join("zarr.json")) {
            self.write_parted_metadata(&first, 0).map_err(|e| e.context(&context))?;
        }
        index.arrays.insert(name.to_string(), ids[0]);
        index.groups.extend(prefixes.iter().map(|p| (*p).to_string()));
        parted.insert(name.to_string(), ids.clone());
        Ok(ids)
    }

    fn write_parted_metadata(&self, a: &ArrayHandle, rows: u64) -> Result<(), RecordError> {
        let store = &*self.store;
        for (suffix, spec) in meta_specs(&a.leaf, a.meta_chunk_rows) {
            let mdir = a.group_dir.join(format!("{}.{suffix}", a.leaf));
            zarr::write_json(store, &mdir, &spec.metadata(rows, &json!({})))?;
        }
        zarr::write_json(store, &a.dir, &a.spec.metadata(rows, &self.attributes(a)))
    }

    fn parted_handles(&self, name: &str) -> Result<Vec<Arc<ArrayHandle>>, RecordError> {
        let ids = lock(&self.parted)
            .get(name)
            .cloned()
            .ok_or_else(|| RecordError::Invalid(format!("no parted array {name:?}")))?;
        let arrays = read_lock(&self.arrays);
        Ok(ids.iter().map(|&i| Arc::clone(&arrays[i])).collect())
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
        let parted = lock(&self.parted);
        let mut v: Vec<(ArrayId, String)> = parted.iter().map(|(n, ids)| (ids[0], n.clone())).collect();
        v.sort();
        v.into_iter().map(|(_, n)| n).collect()
    }

    /// Announces `rows` rows of parted array `name` in its `zarr.json` (and its metadata
    /// arrays'): the committer calls it with rows that every part has committed.
    ///
    /// # Errors
    /// An unknown name, I/O errors.
    pub fn commit_parted(&self, name: &str, rows: u64) -> Result<(), RecordError> {
        let handles = self.parted_handles(name)?;
        let a = &handles[0];
        self.write_parted_metadata(a, rows).map_err(|e| e.context(&a.context()))?;
        self.commits.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// A sink for the shard-by-shard messages of parted array `name` (see the module
    /// documentation): operand `step` (if any) holds the step.
    ///
    /// # Errors
    /// An unknown name.
    pub fn parted_sink(
        self: &Arc<Self>,
        name: &str,
        step: Option<usize>,
        transforms: &str,
    ) -> Result<Sink, RecordError> {
        let handles = self.parted_handles(name)?;
        Ok(Sink {
            recorder: Arc::clone(self),
            targets: Vec::new(),
            step,
            transforms: self.transforms_index(transforms),
            lanes: 1,
            parted: Some(handles),
        })
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

impl Sink {
    pub(crate) fn route_parted(&self, parts: &[Arc<ArrayHandle>], msg: Message, charged: usize) {
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
        let payload = Arc::new(Payload { buf: msg.data, charged, budget: Arc::clone(&rec.budget) });
        if let Some(p) = problem {
            lock(&rec.errors).push(RecordError::Invalid(format!("hostfeed internal error: {p}")));
            return;
        }
        let a = &parts[part.unwrap_or_default()];
        let meta = rec.meta(steps.first().copied().unwrap_or(-1), device, self.transforms);
        let len = a.spec.row_bytes();
        rec.route_row(a, Row { payload, offset, len, meta });
    }
}
