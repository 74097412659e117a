//! The recorder's threads: the writers, which write the jobs (a chunk, or part of one) the
//! recorder hands them, and the ticker, which runs the recorder's periodic work; and the
//! encoding of chunks for the store. What the bytes become in the store (files, objects) is
//! the [`Store`]'s business: the writers hand it whole objects ([`Store::put`]) and, for
//! uncompressed chunks, writes into part of one where the store can
//! ([`InPlace::write_at`](crate::record::store::InPlace::write_at)).

use std::collections::{HashMap, VecDeque};
use std::io::{Read, Write};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::error::RecordError;
use crate::host::sync::{lock, Waker};
use crate::record::arrays::{ArrayHandle, Job, Row};
use crate::record::common::{as_u64, as_usize, ArrayId};
use crate::record::failures::Failures;
use crate::record::shard::{self, ShardUpload};
use crate::record::store::{create_parent, io_error, Put, Store};
use crate::record::trace;
use crate::record::zarr::Codec;

/// How often the ticker runs the recorder's periodic work (looking for producers stuck
/// behind partial chunks, commits, the lease).
pub(crate) const TICK: Duration = Duration::from_millis(50);

/// The writers' jobs: waiting, running, and how many finished.
#[derive(Default)]
pub(crate) struct PoolState {
    jobs: VecDeque<Job>,
    /// Chunks being written: jobs of one chunk run one at a time, in submission order.
    running: Vec<(ArrayId, u64)>,
    /// Jobs finished so far (flush waits for this to move).
    finished: u64,
    stop: bool,
}

impl PoolState {
    /// Adds `job` after the jobs waiting.
    pub(crate) fn push(&mut self, job: Job) {
        self.jobs.push_back(job);
    }

    /// The first job whose chunk is not being written and has no earlier job waiting.
    pub(crate) fn next_job(&mut self) -> Option<Job> {
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

    /// Ends the running job of chunk `key` (written, or failed).
    pub(crate) fn finish(&mut self, key: (ArrayId, u64)) {
        self.running.retain(|k| *k != key);
        self.finished += 1;
    }

    fn idle(&self) -> bool {
        self.jobs.is_empty() && self.running.is_empty()
    }
}

/// See the module documentation.
#[derive(Default)]
pub(crate) struct Writers {
    /// The jobs, waiting and running.
    state: Mutex<PoolState>,
    /// Writers sleep here for jobs.
    work: Waker,
    /// Flushes sleep here for finished jobs.
    finished: Waker,
    /// Set to stop the ticker.
    ticker: Mutex<bool>,
    /// The ticker sleeps here between ticks.
    ticker_wake: Waker,
    /// The writer and ticker threads, joined by [`Writers::stop`].
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// Shards written in place: the inner chunks their index lists, by array and shard
    /// (the index only grows).
    shard_index: Mutex<HashMap<(ArrayId, u64), u64>>,
    /// Shards being streamed to their objects (object stores), by array and shard.
    uploads: Mutex<HashMap<(ArrayId, u64), ShardUpload>>,
    /// The rows of small partial chunks (shards) put whole or streamed, by array and chunk:
    /// the next write of the chunk starts from them instead of reading the object back.
    tails: Mutex<HashMap<(ArrayId, u64), Vec<u8>>>,
    /// Bytes of chunk data written.
    bytes_written: AtomicU64,
    /// Chunk files written.
    chunks_written: AtomicU64,
}

impl Writers {
    /// Starts thread `name` running `main`, joined by [`Writers::stop`].
    ///
    /// # Errors
    /// [`RecordError::Io`] when the thread cannot be started.
    pub(crate) fn spawn(&self, name: String, main: Box<dyn FnOnce() + Send>) -> Result<(), RecordError> {
        let t = std::thread::Builder::new().name(name).spawn(main).map_err(|e| RecordError::Io {
            errno: e.raw_os_error(),
            message: format!("cannot start a recorder thread: {e}"),
        })?;
        lock(&self.threads).push(t);
        Ok(())
    }

    /// Hands `job` to the writers (the caller submits the jobs of one chunk in order).
    pub(crate) fn submit(&self, job: Job) {
        lock(&self.state).push(job);
        self.work.notify_one();
    }

    /// Whether no job is waiting or running.
    pub(crate) fn idle(&self) -> bool {
        lock(&self.state).idle()
    }

    /// Bytes of chunk data and chunk files written so far.
    pub(crate) fn written(&self) -> (u64, u64) {
        (self.bytes_written.load(Ordering::Relaxed), self.chunks_written.load(Ordering::Relaxed))
    }

    /// Waits up to `timeout` until every array of `targets` has written its target rows (or
    /// failed). Returns whether they have.
    pub(crate) fn wait_for(&self, targets: &[(Arc<ArrayHandle>, u64)], timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            let seen = lock(&self.state).finished;
            let done = targets.iter().all(|(a, target)| {
                let st = lock(&a.state);
                st.frontier >= *target || st.failed
            });
            if done {
                return true;
            }
            let mut g = lock(&self.state);
            while g.finished == seen {
                let now = Instant::now();
                if now >= deadline {
                    return false;
                }
                g = self.finished.wait_timeout(g, deadline - now);
            }
        }
    }

    /// Stops and joins the writer and ticker threads (once the writers ran out of jobs);
    /// `on_panic` for each that panicked.
    pub(crate) fn stop(&self, mut on_panic: impl FnMut()) {
        lock(&self.state).stop = true;
        self.work.notify_all();
        *lock(&self.ticker) = true;
        self.ticker_wake.notify_all();
        let threads = std::mem::take(&mut *lock(&self.threads));
        for t in threads {
            if t.join().is_err() {
                on_panic();
            }
        }
    }

    /// A writer thread: writes jobs as they come until the writers stop and no job is left;
    /// a failed write fails its array (`failures`).
    pub(crate) fn writer_main(&self, store: &dyn Store, failures: &Failures) {
        lower_priority();
        loop {
            let job = {
                let mut g = lock(&self.state);
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
                        self.work.notify_all();
                        return;
                    }
                    g = self.work.wait(g);
                }
            };
            self.run(store, failures, job);
        }
    }

    /// Writes jobs on the calling thread (the ticker's, at its own priority: the writers'
    /// is lowered) until every array of `targets` has written its target rows or failed,
    /// no job it may take is left, or `timeout` has passed: a live cycle's small writes on
    /// a busy machine, where lowered writer threads may wait long for the CPU.
    pub(crate) fn help(
        &self,
        store: &dyn Store,
        failures: &Failures,
        targets: &[(Arc<ArrayHandle>, u64)],
        timeout: Duration,
    ) {
        let deadline = Instant::now() + timeout;
        let done = || {
            targets.iter().all(|(a, target)| {
                let st = lock(&a.state);
                st.frontier >= *target || st.failed
            })
        };
        while Instant::now() < deadline && !done() {
            let Some(job) = lock(&self.state).next_job() else { return };
            self.run(store, failures, job);
        }
    }

    /// Writes `job` (one taken with [`PoolState::next_job`]) and does its bookkeeping: the
    /// array's frontier, or its failure; the job finished, the waiters woken.
    fn run(&self, store: &dyn Store, failures: &Failures, job: Job) {
        let a = Arc::clone(&job.array);
        let key = job.key();
        let bytes = job.rows.len() * a.spec.row_bytes();
        let streamed = a.spec.inner_rows.is_some() && store.streams();
        // A panic must not lose the job's bookkeeping (a flush would wait for it forever).
        let result = trace::traced_write(&a.name, job.chunk, bytes, || {
            catch_unwind(AssertUnwindSafe(|| {
                if streamed {
                    self.write_streamed(store, &job)
                } else {
                    write_chunk(store, &job, &self.shard_index, &self.tails)
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
                        failures.record(&a, &mut st, e);
                    }
                }
            }
        }
        let mut g = lock(&self.state);
        g.finish(key);
        let more = !g.jobs.is_empty();
        drop(g);
        self.finished.notify_all();
        if more {
            // A job of the chunk just finished may be next.
            self.work.notify_one();
        }
    }

    /// The ticker thread: runs `tick` every [`TICK`] until the threads stop.
    pub(crate) fn ticker_main(&self, tick: impl Fn()) {
        let mut g = lock(&self.ticker);
        while !*g {
            g = self.ticker_wake.wait_timeout(g, TICK);
            if *g {
                break;
            }
            drop(g);
            tick();
            g = lock(&self.ticker);
        }
    }

    /// Writes a job's rows into its shard's streamed object (an object store's multipart
    /// upload), started by the shard's first job (after reading back the rows of a partial
    /// shard completed earlier) and completed by the job that fills the shard or a partial
    /// job (a flush or spill). Returns the rows made durable: those of the shard's object
    /// when this job completed it, else none (they are in an upload nobody can read yet).
    fn write_streamed(&self, store: &dyn Store, job: &Job) -> Result<Option<(u64, u64)>, RecordError> {
        let a = &job.array;
        let spec = &a.spec;
        let rb = spec.row_bytes();
        let inner = spec.inner_rows.unwrap_or(spec.chunk_rows);
        let (inner_bytes, inner_chunks) = (as_usize(inner) * rb, spec.chunk_rows / inner);
        let path = spec.chunk_path(&a.dir, job.chunk);
        let shard_start = job.chunk * spec.chunk_rows;
        let taken = lock(&self.uploads).remove(&job.key());
        let in_shard = job.first_row - shard_start;
        let want = as_usize(in_shard) * rb;
        // A small shard's rows so far, kept for its next upload (see `tails`).
        let mut kept = match &taken {
            None if job.rows.is_empty() => None,
            _ if as_usize(spec.chunk_rows) * rb > TAIL_BYTES => None,
            _ if in_shard == 0 => Some(Vec::new()),
            _ => lock(&self.tails).remove(&job.key()).filter(|k| k.len() == want),
        };
        let mut up = match taken {
            Some(up) => up,
            // A flush's job without rows, for a shard whose object is complete already.
            None if job.rows.is_empty() => return Ok(Some((job.first_row, job.first_row))),
            None => {
                let object = store.stream(&path).unwrap_or_else(|| {
                    Err(RecordError::Invalid("hostfeed internal error: a store that cannot stream".into()))
                })?;
                let tail = match &kept {
                    Some(rows) => rows.clone(),
                    None if in_shard > 0 => {
                        let stored = store.get(&path).map_err(|e| io_error("reopen", &path, &e))?;
                        shard::read_rows(&stored, want, inner_bytes, inner_chunks, spec.codec)
                            .map_err(|why| shard::unreadable(&path, &why))?
                    }
                    None => Vec::new(),
                };
                ShardUpload::new(object, tail, job.first_row)
            }
        };
        up.tail.reserve(job.rows.len() * rb);
        for r in &job.rows {
            up.tail.extend_from_slice(r.bytes());
            if let Some(k) = &mut kept {
                k.extend_from_slice(r.bytes());
            }
        }
        while up.tail.len() >= inner_bytes {
            let rest = up.tail.split_off(inner_bytes);
            let piece = std::mem::replace(&mut up.tail, rest);
            up.add(piece, inner_bytes, spec.codec, &path)?;
        }
        let full = job.end_row() - shard_start >= spec.chunk_rows;
        if let Some(k) = kept.filter(|_| !full) {
            lock(&self.tails).insert(job.key(), k);
        }
        if !full && !job.partial {
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

/// Writes a job's rows into its chunk: appended in place to an uncompressed chunk where
/// the store can write into part of an object; otherwise (compressed, or an object store)
/// the chunk is put whole, its rows written earlier read back first.
fn write_chunk(
    store: &dyn Store,
    job: &Job,
    shard_index: &Mutex<HashMap<(ArrayId, u64), u64>>,
    tails: &Mutex<HashMap<(ArrayId, u64), Vec<u8>>>,
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
    let earlier = lock(tails).remove(&job.key());
    let (out, tail) = encode_whole(store, job, &path, earlier)?;
    // A chunk that may hold announced rows is replaced whole, atomically; a fresh
    // chunk lies past the announced shape, so a torn write of it is invisible.
    let replace = job.partial || job.disk_prefix > 0 || store.exists(&path);
    store.put(&path, &out, if replace { Put::Replace } else { Put::Fresh })?;
    if let Some(tail) = tail {
        lock(tails).insert(job.key(), tail);
    }
    Ok(())
}

/// The most bytes of rows of a partial chunk (shard) kept for its next write
/// ([`encode_whole`]): the objects of small rows, which a flush every few hundred rows
/// puts again, each time a request to read them back saved.
const TAIL_BYTES: usize = 16 << 10;

/// The rows at the start of `job`'s chunk put earlier (`job.disk_prefix` of them, at
/// `path`), as raw bytes: `earlier`, the rows kept from that write, where it holds as
/// many; else read back and decoded (`decode`: from the object's bytes).
fn earlier_rows(
    store: &dyn Store,
    job: &Job,
    path: &Path,
    earlier: Option<Vec<u8>>,
    decode: impl FnOnce(Vec<u8>, usize) -> Result<Vec<u8>, RecordError>,
) -> Result<Vec<u8>, RecordError> {
    let want = as_usize(job.disk_prefix) * job.array.spec.row_bytes();
    match earlier {
        Some(rows) if rows.len() == want => Ok(rows),
        _ if want == 0 => Ok(Vec::new()),
        _ => decode(store.get(path).map_err(|e| io_error("reopen", path, &e))?, want),
    }
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

/// The whole chunk of `job` as stored: the rows of this chunk written earlier (`earlier`,
/// kept from that write, or read back from the store), the job's rows, and for a chunk
/// not complete yet, zeros to its full size (the fill value, past the announced shape).
/// Also, for a partial chunk of at most [`TAIL_BYTES`] of rows put whole (an object
/// store), its rows, to be kept for its next write.
fn encode_whole(
    store: &dyn Store,
    job: &Job,
    path: &Path,
    earlier: Option<Vec<u8>>,
) -> Result<(Vec<u8>, Option<Vec<u8>>), RecordError> {
    let spec = &job.array.spec;
    let rb = spec.row_bytes();
    let keep = |rows: &[u8]| {
        (job.partial && store.in_place().is_none() && rows.len() <= TAIL_BYTES).then(|| rows.to_vec())
    };
    if let Some(inner) = spec.inner_rows {
        let (inner_bytes, inner_chunks) = (as_usize(inner) * rb, spec.chunk_rows / inner);
        // Rows of this shard put earlier in a partial shard.
        let mut rows = earlier_rows(store, job, path, earlier, |stored, want| {
            shard::read_rows(&stored, want, inner_bytes, inner_chunks, spec.codec)
                .map_err(|why| shard::unreadable(path, &why))
        })?;
        rows.reserve(job.rows.len() * rb);
        for r in &job.rows {
            rows.extend_from_slice(r.bytes());
        }
        let out = shard::encode(&rows, inner_bytes, inner_chunks, spec.codec).map_err(|why| RecordError::Io {
            errno: Some(libc::EIO),
            message: format!("cannot compress {}: {why}", path.display()),
        })?;
        return Ok((out, keep(&rows)));
    }
    let chunk_bytes = spec.chunk_bytes();
    let fail = |op: &str, e: std::io::Error| io_error(op, path, &e);
    let mut enc = match spec.codec {
        Codec::Raw => Encoding::Raw(Vec::with_capacity(chunk_bytes)),
        Codec::Zstd(level) => Encoding::Zstd(
            zstd::stream::Encoder::new(Vec::with_capacity(chunk_bytes / 2), level)
                .map_err(|e| fail("start compressing", e))?,
        ),
        Codec::Blosc(_) => return Err(RecordError::Invalid(shard::BLOSC_DATA.into())),
    };
    // Rows of this chunk put earlier as a padded partial chunk.
    let mut rows = earlier_rows(store, job, path, earlier, |stored, want| match spec.codec {
        Codec::Raw => stored
            .get(..want)
            .map(<[u8]>::to_vec)
            .ok_or_else(|| fail("read back", std::io::Error::from(std::io::ErrorKind::UnexpectedEof))),
        Codec::Zstd(_) => {
            let mut dec = zstd::stream::Decoder::with_buffer(&stored[..]).map_err(|e| fail("decompress", e))?;
            let mut prefix = vec![0u8; want];
            dec.read_exact(&mut prefix).map_err(|e| fail("read back", e))?;
            Ok(prefix)
        }
        Codec::Blosc(_) => Err(RecordError::Invalid(shard::BLOSC_DATA.into())),
    })?;
    enc.write_all(&rows).map_err(|e| fail("copy", e))?;
    let mut written = rows.len();
    debug_assert_eq!(as_u64(written), (job.first_row - job.chunk * spec.chunk_rows) * as_u64(rb));
    let small = written + job.rows.len() * rb <= TAIL_BYTES;
    for r in &job.rows {
        enc.write_all(r.bytes()).map_err(|e| fail("compress", e))?;
        if small {
            rows.extend_from_slice(r.bytes());
        }
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
    let tail = if small { keep(&rows) } else { None };
    Ok((enc.finish().map_err(|e| fail("finish compressing", e))?, tail))
}
