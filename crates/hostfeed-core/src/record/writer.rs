//! The recorder's writer and ticker threads, commits, and the functions that write
//! chunk files.

use std::fs::{self, File, OpenOptions};
use std::io::{IoSlice, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use serde_json::json;

use crate::error::RecordError;
use crate::ffi::c_api::dtype as xla;
use crate::host::sync::lock;
use crate::record::zarr::{self, io_error, ArraySpec, Codec, DType, ROW_METADATA};

use crate::record::arrays::{ArrayHandle, ArrayState, Job, Row};
use crate::record::recorder::{
    as_u64, as_usize, read_lock, Options, Recorder, MAX_IOV, META_CHUNK_ROWS, TICK,
};
use crate::record::trace;

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
                        return;
                    }
                    g = self.pool.work.wait(g);
                }
            };
            let a = Arc::clone(&job.array);
            let key = job.key();
            let (first, n) = (job.first_row, as_u64(job.rows.len()));
            let bytes = job.rows.len() * a.spec.row_bytes();
            // A panic must not lose the job's bookkeeping (a flush would wait for it forever).
            let result = trace::traced_write(&a.name, job.chunk, bytes, || {
                catch_unwind(AssertUnwindSafe(|| write_chunk(&self.opts, &job))).unwrap_or_else(|_| {
                    Err(RecordError::Invalid("hostfeed internal error: a panic while writing a chunk".into()))
                })
            });
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
            let arrays = read_lock(&self.arrays).clone();
            for a in &arrays {
                self.commit(a, false);
            }
            g = lock(&self.ticker);
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
            match a.spec.part {
                // A parted array: part 0 writes the rows' metadata; `zarr.json` is written
                // by the store's committer once every part has its rows (`parts.rs`).
                Some(p) if p.index != 0 => {}
                Some(_) => write_rows_in_place(&spec, &mdir, from, &values, durable)?,
                None => {
                    write_rows_in_place(&spec, &mdir, from, &values, durable)?;
                    zarr::write_json_atomic(&mdir, &spec.metadata(rows, &json!({})), durable)?;
                }
            }
        }
        if a.spec.part.is_none() {
            zarr::write_json_atomic(&a.dir, &a.spec.metadata(rows, &self.attributes(a)), durable)?;
        }
        st.committed = rows;
        st.last_commit = Instant::now();
        // Forget metadata that is on disk.
        st.meta.drain(..hi);
        st.meta_first = rows;
        Ok(())
    }
}

/// The per-row metadata arrays of data array `leaf`: suffix and layout.
pub(crate) fn meta_specs(leaf: &str) -> impl Iterator<Item = (&'static str, ArraySpec)> + '_ {
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
            part: None,
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
pub(crate) fn write_all_vectored_at(f: &File, bufs: &[&[u8]], offset: u64) -> std::io::Result<()> {
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
