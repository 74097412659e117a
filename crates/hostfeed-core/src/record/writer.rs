//! The recorder's writer and ticker threads, commits, and the encoding of chunks and
//! metadata rows for the store. What the bytes become in the store (files, objects) is the
//! [`Store`]'s business: the writers hand it whole objects ([`Store::put`]) and, for
//! uncompressed chunks and metadata rows, writes into part of one where the store can
//! ([`InPlace::write_at`](crate::record::store::InPlace::write_at)).

use std::io::{Read, Write};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::error::RecordError;
use crate::host::sync::lock;
use crate::record::arrays::{meta_specs, ArrayHandle, ArrayState, Job, Row};
use crate::record::common::ArrayId;
use crate::record::common::{as_u64, as_usize, read_lock};
use crate::record::recorder::{HeldLock, Recorder};
use crate::record::shard::{self, ShardUpload};
use crate::record::store::{io_error, Put, Store};
use crate::record::trace;
use crate::record::zarr::{self, ArraySpec, Codec};

/// How often the ticker looks for producers stuck behind partial chunks, and for commits.
pub(crate) const TICK: Duration = Duration::from_millis(50);

impl Recorder {
    // ---- threads --------------------------------------------------------------------

    pub(crate) fn writer_main(&self) {
        lower_priority();
        loop {
            let job = {
                let mut g = lock(&self.pool.state);
                loop {
                    if let Some(j) = g.next_job() {
                        break j;
                    }
                    if g.stop && g.jobs.is_empty() {
                        drop(g);
                        // Wake the writers still asleep: one may have gone back to sleep on
                        // a job of a chunk another writer was running when the stop came
                        // (the stop's wake-up found it blocked), and the job that ended
                        // last woke nobody, the queue being empty: it would sleep forever,
                        // and close with it, waiting to join it.
                        self.pool.work.notify_all();
                        return;
                    }
                    g = self.pool.work.wait(g);
                }
            };
            let a = Arc::clone(&job.array);
            let key = job.key();
            let bytes = job.rows.len() * a.spec.row_bytes();
            let streamed = a.spec.inner_rows.is_some() && self.store.streams();
            // A panic must not lose the job's bookkeeping (a flush would wait for it forever).
            let result = trace::traced_write(&a.name, job.chunk, bytes, || {
                catch_unwind(AssertUnwindSafe(|| {
                    if streamed {
                        self.write_streamed(&job)
                    } else {
                        write_chunk(&*self.store, &job, &self.shard_index)
                            .map(|()| Some((job.first_row, job.end_row())))
                    }
                }))
                .unwrap_or_else(|_| {
                    lock(&self.uploads).remove(&key);
                    Err(RecordError::Invalid("hostfeed internal error: a panic while writing a chunk".into()))
                })
            });
            // The rows are on disk (or failed): their bytes no longer count.
            drop(job);
            {
                let mut st = lock(&a.state);
                match result {
                    Ok(durable) => {
                        self.bytes_written.fetch_add(as_u64(bytes), Ordering::Relaxed);
                        self.chunks_written.fetch_add(1, Ordering::Relaxed);
                        // Rows of a streamed shard are durable once its object is complete.
                        if let Some((first, end)) = durable {
                            st.done.insert(first, end);
                        }
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

    pub(crate) fn ticker_main(&self) {
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
            self.renew_lease();
            let arrays = read_lock(&self.arrays).clone();
            for a in &arrays {
                self.commit(a, false);
            }
            g = lock(&self.ticker);
        }
    }

    /// Writes a job's rows into its shard's streamed object (an object store's multipart
    /// upload), started by the shard's first job (after reading back the rows of a partial
    /// shard completed earlier) and completed by the job that fills the shard or a partial
    /// job (a flush or spill). Returns the rows made durable: those of the shard's object
    /// when this job completed it, else none (they are in an upload nobody can read yet).
    fn write_streamed(&self, job: &Job) -> Result<Option<(u64, u64)>, RecordError> {
        let a = &job.array;
        let spec = &a.spec;
        let rb = spec.row_bytes();
        let inner = spec.inner_rows.unwrap_or(spec.chunk_rows);
        let (inner_bytes, inner_chunks) = (as_usize(inner) * rb, spec.chunk_rows / inner);
        let path = spec.chunk_path(&a.dir, job.chunk);
        let shard_start = job.chunk * spec.chunk_rows;
        let taken = lock(&self.uploads).remove(&job.key());
        let mut up = match taken {
            Some(up) => up,
            // A flush's job without rows, for a shard whose object is complete already.
            None if job.rows.is_empty() => return Ok(Some((job.first_row, job.first_row))),
            None => {
                let object = self.store.stream(&path).unwrap_or_else(|| {
                    Err(RecordError::Invalid("hostfeed internal error: a store that cannot stream".into()))
                })?;
                let in_shard = job.first_row - shard_start;
                let tail = if in_shard > 0 {
                    let stored = self.store.get(&path).map_err(|e| io_error("reopen", &path, &e))?;
                    shard::read_rows(&stored, as_usize(in_shard) * rb, inner_bytes, inner_chunks, spec.codec)
                        .map_err(|why| shard::unreadable(&path, &why))?
                } else {
                    Vec::new()
                };
                ShardUpload::new(object, tail, job.first_row)
            }
        };
        up.tail.reserve(job.rows.len() * rb);
        for r in &job.rows {
            up.tail.extend_from_slice(r.bytes());
        }
        while up.tail.len() >= inner_bytes {
            let rest = up.tail.split_off(inner_bytes);
            let piece = std::mem::replace(&mut up.tail, rest);
            up.add(piece, inner_bytes, spec.codec, &path)?;
        }
        if job.end_row() - shard_start < spec.chunk_rows && !job.partial {
            lock(&self.uploads).insert(job.key(), up);
            return Ok(None);
        }
        if !up.tail.is_empty() {
            let piece = std::mem::take(&mut up.tail);
            up.add(piece, inner_bytes, spec.codec, &path)?;
        }
        let index = shard::index_of(&up.entries, inner_chunks);
        up.object.push(index)?;
        up.object.finish()?;
        Ok(Some((up.first_row, job.end_row())))
    }

    /// Renews an object store lock's lease when due; a failure is reported by the next flush.
    fn renew_lease(&self) {
        let renewed = match &*lock(&self.store_lock) {
            Some(HeldLock::Object(l)) => l.renew_if_due(),
            _ => Ok(()),
        };
        if let Err(e) = renewed {
            lock(&self.errors).push(e);
        }
    }

    /// Announces the rows written so far in `zarr.json` (per-row metadata first), if due.
    pub(crate) fn commit(&self, a: &ArrayHandle, force: bool) {
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
        let store = &*self.store;
        let from = st.committed;
        let lo = as_usize(from - st.meta_first);
        let hi = as_usize(rows - st.meta_first);
        let meta = &st.meta[lo..hi];
        for (suffix, spec) in meta_specs(&a.leaf, a.meta_chunk_rows) {
            let values: Vec<u8> = match suffix {
                "seq" => meta.iter().flat_map(|m| m.seq.to_le_bytes()).collect(),
                "step" => meta.iter().flat_map(|m| m.step.to_le_bytes()).collect(),
                "device" => meta.iter().flat_map(|m| m.device.to_le_bytes()).collect(),
                "time_ns" => meta.iter().flat_map(|m| m.time_ns.to_le_bytes()).collect(),
                _ => meta.iter().flat_map(|m| m.transforms.to_le_bytes()).collect(),
            };
            let mdir = a.group_dir.join(format!("{}.{suffix}", a.leaf));
            match a.spec.part {
                // A parted array: part 0 writes the rows' metadata; `zarr.json` is written
                // by the store's committer once every part has its rows (`parts.rs`).
                Some(p) if p.index != 0 => {}
                Some(_) => write_rows_in_place(store, &spec, &mdir, from, &values)?,
                None => {
                    write_rows_in_place(store, &spec, &mdir, from, &values)?;
                    zarr::write_json(store, &mdir, &spec.metadata(rows, &json!({})))?;
                }
            }
        }
        if a.spec.part.is_none() {
            zarr::write_json(store, &a.dir, &a.spec.metadata(rows, &self.attributes(a)))?;
        }
        st.committed = rows;
        st.last_commit = Instant::now();
        // Forget metadata that is on disk.
        st.meta.drain(..hi);
        st.meta_first = rows;
        Ok(())
    }
}

/// Writes the rows `from..` of an uncompressed array whose bytes are `values`: in place
/// (each chunk object at full size, its rows written at their offsets) where the store
/// can, else each chunk put whole.
fn write_rows_in_place(
    store: &dyn Store,
    spec: &ArraySpec,
    dir: &Path,
    from: u64,
    values: &[u8],
) -> Result<(), RecordError> {
    let in_place = store.in_place();
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
            None => put_rows_whole(store, spec, &path, as_usize(at), new)?,
        }
        off += n;
        row = end;
    }
    Ok(())
}

/// Puts the chunk at `path` again whole with `new` at byte `at`: its earlier rows read back
/// (a chunk begun at an earlier commit), zeros (the fill value) where none were written.
fn put_rows_whole(store: &dyn Store, spec: &ArraySpec, path: &Path, at: usize, new: &[u8]) -> Result<(), RecordError> {
    let mut chunk = match store.get(path) {
        Ok(b) if b.len() == spec.chunk_bytes() => b,
        Ok(b) => {
            return Err(RecordError::Io {
                errno: Some(libc::EIO),
                message: format!(
                    "cannot append to {}: it holds {} bytes, not a chunk of {}",
                    path.display(),
                    b.len(),
                    spec.chunk_bytes()
                ),
            })
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => vec![0u8; spec.chunk_bytes()],
        Err(e) => return Err(io_error("read back", path, &e)),
    };
    chunk[at..at + new.len()].copy_from_slice(new);
    store.put(path, &chunk, Put::Replace)
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

fn create_parent(store: &dyn Store, path: &Path) -> Result<(), RecordError> {
    match path.parent() {
        Some(p) => store.create_dir(p).map_err(|e| io_error("create", p, &e)),
        None => Ok(()),
    }
}

/// Writes a job's rows into its chunk: appended in place to an uncompressed chunk where
/// the store can write into part of an object; otherwise (compressed, or an object store)
/// the chunk is put whole, its rows written earlier read back first.
fn write_chunk(
    store: &dyn Store,
    job: &Job,
    shard_index: &Mutex<HashMap<(ArrayId, u64), u64>>,
) -> Result<(), RecordError> {
    let spec = &job.array.spec;
    let path = spec.chunk_path(&job.array.dir, job.chunk);
    let rb = spec.row_bytes();
    let in_chunk = job.first_row - job.chunk * spec.chunk_rows;
    create_parent(store, &path)?;
    if let (Codec::Raw, Some(in_place)) = (spec.codec, store.in_place()) {
        // Append in place: only bytes past the rows already in this chunk are written,
        // straight from their message buffers, no gathering copy. A partial chunk's
        // padding is never written: it reads as zeros (the fill value) and lies past
        // `shape`, so no reader sees it.
        let slices: Vec<&[u8]> = job.rows.iter().map(Row::bytes).collect();
        let data = as_u64(spec.chunk_bytes());
        in_place.write_at(&path, in_chunk * as_u64(rb), &slices, data)?;
        if let Some(inner) = spec.inner_rows {
            // A shard: its index, at its fixed place after the inner chunks, lists the inner
            // chunks up to this job's, and only grows (an inner chunk listed before all its
            // rows are written lies past the announced rows, which are all listed).
            let mut listed = lock(shard_index);
            let entry = listed.entry(job.key()).or_insert(0);
            let present = (*entry).max((in_chunk + as_u64(job.rows.len())).div_ceil(inner));
            if present > *entry {
                let index = shard::index_in_place(present, spec.chunk_rows / inner, inner * as_u64(rb));
                in_place.write_at(&path, data, &[&index], 0)?;
                *entry = present;
            }
        }
        return Ok(());
    }
    let out = encode_whole(store, job, &path)?;
    // A chunk that may hold announced rows is replaced whole, atomically; a fresh
    // chunk lies past the announced shape, so a torn write of it is invisible.
    let replace = job.partial || job.disk_prefix > 0 || store.exists(&path);
    store.put(&path, &out, if replace { Put::Replace } else { Put::Fresh })
}

/// A chunk's bytes being made whole: as they are, or zstd-compressed.
enum Encoding {
    Raw(Vec<u8>),
    Zstd(zstd::stream::Encoder<'static, Vec<u8>>),
}

impl Encoding {
    fn write_all(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        match self {
            Encoding::Raw(v) => {
                v.extend_from_slice(bytes);
                Ok(())
            }
            Encoding::Zstd(e) => e.write_all(bytes),
        }
    }

    fn finish(self) -> std::io::Result<Vec<u8>> {
        match self {
            Encoding::Raw(v) => Ok(v),
            Encoding::Zstd(e) => e.finish(),
        }
    }
}

/// The whole chunk of `job` as stored: the rows of this chunk written earlier (read back
/// from the store), the job's rows, and for a chunk not complete yet, zeros to its full
/// size (the fill value, past the announced shape).
fn encode_whole(store: &dyn Store, job: &Job, path: &Path) -> Result<Vec<u8>, RecordError> {
    let spec = &job.array.spec;
    let rb = spec.row_bytes();
    if let Some(inner) = spec.inner_rows {
        let (inner_bytes, inner_chunks) = (as_usize(inner) * rb, spec.chunk_rows / inner);
        let mut rows = if job.disk_prefix > 0 {
            // Rows of this shard put earlier in a partial shard.
            let stored = store.get(path).map_err(|e| io_error("reopen", path, &e))?;
            shard::read_rows(&stored, as_usize(job.disk_prefix) * rb, inner_bytes, inner_chunks, spec.codec)
                .map_err(|why| shard::unreadable(path, &why))?
        } else {
            Vec::new()
        };
        rows.reserve(job.rows.len() * rb);
        for r in &job.rows {
            rows.extend_from_slice(r.bytes());
        }
        return shard::encode(&rows, inner_bytes, inner_chunks, spec.codec).map_err(|why| RecordError::Io {
            errno: Some(libc::EIO),
            message: format!("cannot compress {}: {why}", path.display()),
        });
    }
    let chunk_bytes = spec.chunk_bytes();
    let fail = |op: &str, e: std::io::Error| io_error(op, path, &e);
    let mut enc = match spec.codec {
        Codec::Raw => Encoding::Raw(Vec::with_capacity(chunk_bytes)),
        Codec::Zstd(level) => Encoding::Zstd(
            zstd::stream::Encoder::new(Vec::with_capacity(chunk_bytes / 2), level)
                .map_err(|e| fail("start compressing", e))?,
        ),
    };
    let mut written = 0usize;
    if job.disk_prefix > 0 {
        // Rows of this chunk put earlier as a padded partial chunk.
        let want = as_usize(job.disk_prefix) * rb;
        let stored = store.get(path).map_err(|e| fail("reopen", e))?;
        match spec.codec {
            Codec::Raw => {
                let prefix = stored.get(..want).ok_or_else(|| {
                    fail("read back", std::io::Error::from(std::io::ErrorKind::UnexpectedEof))
                })?;
                enc.write_all(prefix).map_err(|e| fail("copy", e))?;
            }
            Codec::Zstd(_) => {
                let mut dec =
                    zstd::stream::Decoder::with_buffer(&stored[..]).map_err(|e| fail("decompress", e))?;
                let mut prefix = vec![0u8; want];
                dec.read_exact(&mut prefix).map_err(|e| fail("read back", e))?;
                enc.write_all(&prefix).map_err(|e| fail("compress", e))?;
            }
        }
        written += want;
    }
    debug_assert_eq!(as_u64(written), (job.first_row - job.chunk * spec.chunk_rows) * as_u64(rb));
    for r in &job.rows {
        enc.write_all(r.bytes()).map_err(|e| fail("compress", e))?;
        written += rb;
    }
    if written < chunk_bytes {
        let zeros = vec![0u8; (chunk_bytes - written).min(1 << 20)];
        while written < chunk_bytes {
            let n = zeros.len().min(chunk_bytes - written);
            enc.write_all(&zeros[..n]).map_err(|e| fail("compress", e))?;
            written += n;
        }
    }
    enc.finish().map_err(|e| fail("finish compressing", e))
}
