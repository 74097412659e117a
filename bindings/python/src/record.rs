//! The Python binding of the recorder (the core's `record/recorder.rs`): `hostfeed._receiver.record.Recorder`,
//! which `hostfeed._src.record.recorder` wraps. Argument conversion, and the release of the GIL
//! around every file system operation and wait (waits are sliced so that Ctrl-C works).
//! While `jax.profiler` traces, writer threads attach to Python around each chunk write to
//! put it on the timeline as a `TraceMe` (the core's `record/trace.rs`; see
//! [`PyWriteTracer`]); not tracing, they never attach.
#![allow(clippy::missing_errors_doc, clippy::must_use_candidate)]

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pyo3::buffer::PyUntypedBuffer;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::error::{IntoPy, ReceiverError};
use crate::host::{dict_of, duration};
use hostfeed_core::Codec;
use hostfeed_core::HostBuffer;
use hostfeed_core::{hub, sinks, Budget, Mode, Options, Recorder, Sink, Storage, WindowOptions};
use hostfeed_core::{install_write_tracer, open_recorders, set_write_tracing, WriteTracer};

/// Adds the recorder class and the recorder's functions to `m`.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyRecorder>()?;
    m.add_function(wrap_pyfunction!(after_fork_in_child, m)?)?;
    m.add_function(wrap_pyfunction!(write_tracing, m)?)?;
    m.add_function(wrap_pyfunction!(take_late_drops, m)?)?;
    Ok(())
}

/// Longest single wait with the GIL released before re-checking signals.
const WAIT_SLICE: Duration = Duration::from_millis(100);
/// A flush waiting this long logs what it waits for (again after four times as long...).
const FLUSH_NOTICE: Duration = Duration::from_secs(5);

/// Logs `text` as a warning of the `hostfeed` Python logger (what it cannot log is
/// printed).
fn warn(py: Python<'_>, text: &str) {
    let logged = py
        .import("logging")
        .and_then(|m| m.call_method1("getLogger", ("hostfeed",)))
        .and_then(|l| l.call_method1("warning", ("%s", text)));
    if let Err(e) = logged {
        e.display(py);
    }
}

// ---- Writes on jax.profiler's timeline ------------------------------------------------------
// Whether a trace is being collected is `TraceMe.is_enabled()`, which needs the GIL. The core
// keeps the answer in an atomic flag that writers read per write; it is refreshed from
// Python at every recorder's creation and flush (so a flush inside a trace is traced), and
// by a poller thread every `TRACE_POLL` while a recorder is open (so writes between flushes
// are traced within `TRACE_POLL` of the trace's start, also for a profiler server's capture).

/// How often the poller asks whether `jax.profiler` traces, while a recorder is open.
const TRACE_POLL: Duration = Duration::from_millis(200);
/// The poller thread runs.
static POLLER_RUNNING: AtomicBool = AtomicBool::new(false);
/// A trace event could not be made once (said once, then not again).
static TRACE_FAILED: AtomicBool = AtomicBool::new(false);
/// jax's `TraceMe` (which `jax.profiler.TraceAnnotation` is), as the receiver's `start`
/// was given it (a recorder opens only once the receiver started).
fn trace_me(py: Python<'_>) -> PyResult<&Bound<'_, PyAny>> {
    crate::host::trace_me(py).ok_or_else(|| {
        crate::error::ReceiverError::new_err(
            "the receiver was never started: no TraceMe to trace writes with",
        )
    })
}

/// Whether `jax.profiler` traces now (false if that cannot be asked).
fn profiler_tracing(py: Python<'_>) -> bool {
    let Some(c) = crate::host::trace_me(py) else { return false };
    c.call_method0("is_enabled").and_then(|b| b.extract::<bool>()).unwrap_or(false)
}

/// Refreshes the core's flag; starts the poller if a recorder is open and none runs.
fn refresh_write_tracing(py: Python<'_>) {
    set_write_tracing(profiler_tracing(py));
    if open_recorders() > 0 && !POLLER_RUNNING.swap(true, Ordering::SeqCst) {
        let started = std::thread::Builder::new().name("hostfeed-trace".into()).spawn(poll_write_tracing);
        if started.is_err() {
            // Flushes still refresh the flag; only writes between them may go untraced.
            POLLER_RUNNING.store(false, Ordering::SeqCst);
        }
    }
}

/// The poller: refreshes the flag every `TRACE_POLL` while a recorder is open (attached
/// only for the question, about a microsecond); ends when none is, or Python is finalizing.
fn poll_write_tracing() {
    loop {
        if open_recorders() == 0 {
            POLLER_RUNNING.store(false, Ordering::SeqCst);
            // A recorder opened meanwhile may have seen the poller still running.
            if open_recorders() == 0 || POLLER_RUNNING.swap(true, Ordering::SeqCst) {
                return;
            }
        }
        let Some(on) = Python::try_attach(profiler_tracing) else {
            // Python is finalizing.
            POLLER_RUNNING.store(false, Ordering::SeqCst);
            return;
        };
        set_write_tracing(on);
        std::thread::sleep(TRACE_POLL);
    }
}

/// Puts each chunk write of a writer thread, while tracing, inside a trace event
/// `hostfeed record write: NAME` (metadata: the chunk's index and the bytes written) on
/// that thread's row of the timeline. Attached to Python only to enter and exit the
/// event: the write itself runs detached.
struct PyWriteTracer;

impl WriteTracer for PyWriteTracer {
    fn traced(&self, name: &str, chunk: u64, bytes: usize, write: &mut (dyn FnMut() + Send)) {
        let mut pending = Some(write);
        Python::try_attach(|py| {
            let event = (|| -> PyResult<Bound<'_, PyAny>> {
                let kwargs = PyDict::new(py);
                kwargs.set_item("chunk", chunk)?;
                kwargs.set_item("bytes", bytes)?;
                let t = trace_me(py)?.call((format!("hostfeed record write: {name}"),), Some(&kwargs))?;
                t.call_method0("__enter__")?;
                Ok(t)
            })();
            if let Some(w) = pending.take() {
                py.detach(w);
            }
            let ended = event.and_then(|t| t.call_method1("__exit__", (py.None(), py.None(), py.None())));
            if let Err(e) = ended {
                if !TRACE_FAILED.swap(true, Ordering::Relaxed) {
                    hub().note(format!("cannot put the recorder's writes on the profiler's timeline: {e}"));
                }
            }
        });
        // Python is finalizing (or not there): the write, untraced.
        if let Some(w) = pending.take() {
            w();
        }
    }
}

/// Installs the write tracer (once per process).
fn install_tracer() {
    install_write_tracer(Box::new(PyWriteTracer));
}

/// An option Python's checks should have refused (`record/options.py`): a bug, said so.
fn internal(what: String) -> PyErr {
    ReceiverError::new_err(format!("hostfeed internal error: the recorder was given {what}"))
}

/// A Zarr v3 store that recorded values are written to by Rust threads.
#[pyclass(frozen, module = "hostfeed._receiver.record", name = "Recorder")]
pub struct PyRecorder {
    inner: Arc<Recorder>,
}

#[pymethods]
impl PyRecorder {
    /// Creates the store at `path` and starts its writer threads. The options are
    /// `hostfeed.Recorder`'s, checked by Python (`record/options.py`) and taken as they
    /// are: `mode` is `"create"`, `"overwrite"` or `"append"`, `zstd_level` None for
    /// uncompressed chunks, `commit_interval` None for commits at flushes only.
    #[new]
    #[pyo3(signature = (path, *, mode, zstd_level, chunk_bytes, writers, durable, commit_interval,
                        separator, url, storage_options, lease, resume_after_step, shard_bytes,
                        shared=None, leader=true))]
    #[allow(clippy::too_many_arguments, clippy::needless_pass_by_value)]
    fn new(
        py: Python<'_>,
        path: PathBuf,
        mode: &str,
        zstd_level: Option<i32>,
        chunk_bytes: usize,
        writers: usize,
        durable: bool,
        commit_interval: Option<f64>,
        separator: char,
        url: bool,
        storage_options: Vec<(String, String)>,
        lease: f64,
        resume_after_step: Option<i64>,
        shard_bytes: Option<usize>,
        shared: Option<String>,
        leader: bool,
    ) -> PyResult<Self> {
        let mode = match mode {
            "create" => Mode::Create,
            "overwrite" => Mode::Overwrite,
            "append" => Mode::Append { resume_after_step },
            other => return Err(internal(format!("an unknown mode {other:?}"))),
        };
        let seconds = |what: &str, t: f64| {
            Duration::try_from_secs_f64(t).map_err(|e| internal(format!("{what} of {t} s: {e}")))
        };
        let opts = Options {
            codec: zstd_level.map_or(Codec::Raw, Codec::Zstd),
            chunk_bytes,
            writers,
            durable,
            commit_interval: commit_interval.map_or(Ok(Duration::MAX), |t| seconds("commit_interval", t))?,
            sep: separator,
            shard_bytes,
            lease: seconds("lease", lease)?,
        };
        let budget: Arc<dyn Budget> = Arc::new(hub());
        // A URL no back-end serves is refused by the registry (`Storage::open`), its message
        // listing every back-end's schemes.
        let run = shared.as_deref().map(|run| (run, leader));
        // No argument may reach the caller as a Rust panic (a `BaseException`): one in a
        // storage client, on input that hostfeed's checks did not foresee, is a ValueError.
        let opened = py.detach(|| {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let storage = Storage::open(&path, url, &storage_options)?;
                Recorder::open(&storage, mode, opts, budget, run)
            }))
        });
        let inner = match opened {
            Ok(result) => result.py()?,
            Err(panic) => {
                let why = panic
                    .downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| panic.downcast_ref::<&str>().copied())
                    .unwrap_or("a panic");
                return Err(PyValueError::new_err(format!(
                    "hostfeed: opening {} failed in the storage client ({why}); check the path and \
                     storage_options",
                    path.display()
                )));
            }
        };
        install_tracer();
        refresh_write_tracing(py);
        Ok(PyRecorder { inner })
    }

    /// The store's path, or its URL (an object store's).
    #[getter]
    fn path(&self) -> String {
        self.inner.root().to_string_lossy().into_owned()
    }

    /// Whether `close` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.inner.is_closed()
    }

    /// Says what the rows of array `name` summarize (JSON object), for its attributes.
    fn describe_summary(&self, name: &str, summary: &str) -> PyResult<()> {
        self.inner.describe_summary(name, summary).py()
    }

    /// Names the axes of array `name`'s rows (a JSON array of strings or nulls), written
    /// as `hostfeed.axes` in its attributes; raises `ValueError` for anything else.
    fn describe_axes(&self, name: &str, axes: &str) -> PyResult<()> {
        self.inner.describe_axes(name, axes).py()
    }

    /// Checks record name `name` for rows of `ndim` dimensions (every part, lengths, the
    /// paths it makes) without creating anything; raises `ValueError` saying what is wrong.
    fn check_name(&self, name: &str, ndim: usize) -> PyResult<()> {
        self.inner.check_name(name, ndim).py()?;
        Ok(())
    }

    /// Declares array `name` with rows of `shape` and XLA dtype `dtype_code` (creating its
    /// directories and empty metadata); returns its id. Raises `ValueError` for an invalid
    /// name or a clash with an earlier declaration, `TypeError` for a dtype that cannot be
    /// recorded, `RecordingError` for I/O errors.
    #[allow(clippy::needless_pass_by_value)]
    fn declare(&self, py: Python<'_>, name: &str, dtype_code: i32, shape: Vec<u64>) -> PyResult<usize> {
        py.detach(|| self.inner.declare(name, dtype_code, &shape)).py()
    }

    /// Routes the messages of `consumer_id` to this recorder from now on, in Rust: operand
    /// `i` holds `lanes` rows of array `targets[i]` (None: not recorded), operand `step`
    /// (if given) the rows' step; `transforms` (JSON) describes the transformations.
    #[allow(clippy::needless_pass_by_value)]
    #[pyo3(signature = (consumer_id, targets, step, transforms, lanes=1))]
    fn bind(
        &self,
        consumer_id: i64,
        targets: Vec<Option<usize>>,
        step: Option<usize>,
        transforms: &str,
        lanes: usize,
    ) -> PyResult<()> {
        let sink = Sink::new(&self.inner, &targets, step, transforms, lanes).py()?;
        sinks().bind(consumer_id, sink);
        Ok(())
    }

    /// Declares parted array `name`: `count` parts, each a `part_shape` slice
    /// along the first dimension of rows `[count * part_shape[0], ...]`; returns the part
    /// handles' ids. `commits`: this process writes the array's `zarr.json`.
    #[allow(clippy::needless_pass_by_value)]
    fn declare_parted(
        &self,
        py: Python<'_>,
        name: &str,
        dtype_code: i32,
        part_shape: Vec<u64>,
        count: u64,
        commits: bool,
    ) -> PyResult<Vec<usize>> {
        py.detach(|| self.inner.declare_parted(name, dtype_code, &part_shape, count, commits)).py()
    }

    /// Routes the shard-by-shard messages of `consumer_id` (`[group, part]`, the slice,
    /// the step at operand `step` if given) to parted array `name`.
    #[pyo3(signature = (consumer_id, name, step, transforms))]
    fn bind_parted(
        &self,
        consumer_id: i64,
        name: &str,
        step: Option<usize>,
        transforms: &str,
    ) -> PyResult<()> {
        let sink = Sink::parted(&self.inner, name, step, transforms).py()?;
        sinks().bind(consumer_id, sink);
        Ok(())
    }

    /// Rows committed (data and metadata on disk) by each part of parted array `name`.
    fn parted_rows(&self, name: &str) -> PyResult<Vec<u64>> {
        self.inner.parted_rows(name).py()
    }

    /// The parted arrays' names, in declaration order.
    fn parted_names(&self) -> Vec<String> {
        self.inner.parted_names()
    }

    /// Announces `rows` rows of parted array `name` in its `zarr.json`.
    fn commit_parted(&self, py: Python<'_>, name: &str, rows: u64) -> PyResult<()> {
        py.detach(|| self.inner.commit_parted(name, rows)).py()
    }

    /// Records one row of array `array_id` from `data`, a C-contiguous buffer of its bytes
    /// (values that reach the host through Python: global-view records, inline mode, the
    /// outputs of a recorded step). With `wait`, first waits (GIL released) for room under
    /// the byte bound, then copies with the GIL released: never on the consumer thread,
    /// which makes the room.
    #[pyo3(signature = (array_id, data, step, device, transforms, wait=false, lend=false))]
    #[allow(clippy::too_many_arguments)]
    fn append(
        &self,
        py: Python<'_>,
        array_id: usize,
        data: &Bound<'_, PyAny>,
        step: i64,
        device: i32,
        transforms: &str,
        wait: bool,
        lend: bool,
    ) -> PyResult<()> {
        let buf = PyUntypedBuffer::get(data)?;
        if !buf.is_c_contiguous() {
            return Err(PyValueError::new_err("append needs a C-contiguous buffer"));
        }
        let len = buf.len_bytes();
        let t = self.inner.transforms_index(transforms);
        if len == 0 {
            return self.inner.append(array_id, &[], step, device, t).py();
        }
        if lend {
            // No copy: the row is the numpy array's own bytes, kept alive (a reference to
            // the array) until written. Its reference is dropped wherever the row is, and
            // released by Python when it next runs (PyO3's deferred reference counting).
            let ptr = buf.buf_ptr().cast::<u8>().cast_const();
            drop(buf);
            let keeper: Box<dyn Send + Sync> = Box::new(data.clone().unbind());
            // SAFETY: `ptr` is the start of the C-contiguous `len` bytes of `data`, a numpy
            // array (the pipeline of a recorded step lends only the read-only host copies
            // of a computation's outputs, or views of them, which nobody writes); a numpy
            // array's bytes live as long as the array, which `keeper` keeps alive.
            let lent_buf = unsafe { HostBuffer::lent(ptr, len, keeper) };
            let inner = &self.inner;
            return py.detach(|| inner.append_lent(array_id, lent_buf, len, step, device, t)).py();
        }
        // The address as an integer, so that the slice can be made on the detached side.
        let ptr = buf.buf_ptr() as usize;
        let inner = &self.inner;
        let copy = || {
            // SAFETY: the buffer is C-contiguous with `len` bytes at `ptr`, exported by its
            // owner for as long as `buf` lives, which outlives this call. Read while
            // detached only with `wait`, from the outputs of a recorded step (read-only
            // host copies nobody writes); else attached, so no Python code runs meanwhile
            // on this thread.
            let bytes = unsafe { std::slice::from_raw_parts(ptr as *const u8, len) };
            if wait {
                inner.append_waiting(array_id, bytes, step, device, t)
            } else {
                inner.append(array_id, bytes, step, device, t)
            }
        };
        let appended = if wait { py.detach(copy) } else { copy() };
        drop(buf);
        appended.py()
    }

    /// Writes every row received so far and announces it in the store's metadata, waiting
    /// at most `timeout` seconds (None: no limit) with the GIL released. Raises
    /// `RecordingError` for write errors since the last flush. Returns False if the writes
    /// did not finish in time (what was written is announced).
    #[pyo3(signature = (timeout=None))]
    fn flush(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<bool> {
        let timeout = duration("timeout", timeout)?;
        refresh_write_tracing(py);
        let inner = &self.inner;
        let targets = py.detach(|| inner.flush_begin());
        let start = Instant::now();
        let mut finished = false;
        let mut notice = FLUSH_NOTICE;
        loop {
            let slice = timeout.map_or(WAIT_SLICE, |t| t.saturating_sub(start.elapsed()).min(WAIT_SLICE));
            if py.detach(|| inner.flush_wait(&targets, slice)) {
                finished = true;
                break;
            }
            if timeout.is_some_and(|t| start.elapsed() >= t) {
                break;
            }
            if start.elapsed() >= notice {
                // A flush (or close) that takes long says what it waits for, and again
                // after four times as long.
                let what = py.detach(|| inner.flush_waiting_for(&targets));
                warn(
                    py,
                    &format!(
                        "hostfeed: the recorder of {} has waited {} s to write what it received (a flush, \
                         close or barrier_wait): {}",
                        inner.root().display(),
                        start.elapsed().as_secs(),
                        what
                    ),
                );
                notice *= 4;
            }
            py.check_signals()?;
        }
        py.detach(|| inner.flush_end()).py()?;
        Ok(finished)
    }

    /// Flushes, then stops the writer threads (rows that arrive later are dropped with a
    /// warning). Closing twice does nothing.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        if self.inner.is_closed() {
            return Ok(());
        }
        let flushed = self.flush(py, None);
        let inner = &self.inner;
        py.detach(|| inner.close()).py()?;
        flushed.map(|_| ())
    }

    /// Rows array `name` received (those it held when resumed included), or `None` if no
    /// array has that name.
    fn rows_received(&self, name: &str) -> Option<u64> {
        self.inner.rows_received(name)
    }

    /// Counters: rows received, bytes and chunks written, spills, commits, rows dropped.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.inner.stats();
        dict_of(
            py,
            [
                ("rows", s.rows),
                ("bytes_written", s.bytes_written),
                ("chunks_written", s.chunks_written),
                ("spills", s.spills),
                ("commits", s.commits),
                ("rows_dropped", s.rows_dropped),
            ],
        )
    }

    // ---- The flight recorder (the core's `record/window`) ----------------------------------

    /// Gives the recorder a window of `steps` steps (0: none; triggers only) and at most
    /// `window_bytes` bytes, writing `after` more steps when a trigger fires; `nonfinite`:
    /// the first non-finite value of a recorded row fires one. `process` names this
    /// process's triggers; `writes_doc`: this process writes the store's list of triggers.
    #[pyo3(signature = (steps, window_bytes, after, nonfinite, process=0, writes_doc=true,
                        resume_after_step=None))]
    #[allow(clippy::too_many_arguments)]
    fn configure_window(
        &self,
        py: Python<'_>,
        steps: usize,
        window_bytes: usize,
        after: u64,
        nonfinite: bool,
        process: u32,
        writes_doc: bool,
        resume_after_step: Option<i64>,
    ) -> PyResult<()> {
        let opts = WindowOptions { steps, bytes: window_bytes, after, nonfinite, process, writes_doc };
        py.detach(|| self.inner.configure_window(opts, resume_after_step)).py()
    }

    /// Says whether array `array_id`'s rows are kept in the window (`windowed`), and for a
    /// summary, which of its `width` columns count non-finite values (`columns`: `(width,
    /// [column, ...])`; None: every value of a row is searched).
    #[pyo3(signature = (array_id, windowed, columns=None))]
    fn window_array(
        &self,
        array_id: usize,
        windowed: bool,
        columns: Option<(usize, Vec<usize>)>,
    ) -> PyResult<()> {
        self.inner.window_array(array_id, windowed, columns).py()
    }

    /// Fires a trigger of `kind` (`"watch"`, `"keep"`) at `step` (GIL released: the
    /// window's rows go to the writers); returns its description (JSON).
    #[pyo3(signature = (kind, step, reason, name=None))]
    fn fire_trigger(
        &self,
        py: Python<'_>,
        kind: &str,
        step: i64,
        reason: &str,
        name: Option<&str>,
    ) -> PyResult<String> {
        py.detach(|| self.inner.fire_trigger(kind, step, reason, name)).py()
    }

    /// Applies another process's trigger (its description, JSON); whether it was new.
    fn apply_remote_trigger(&self, py: Python<'_>, description: &str) -> PyResult<bool> {
        py.detach(|| self.inner.apply_remote_trigger(description)).py()
    }

    /// Triggers fired or applied so far.
    #[getter]
    fn trigger_count(&self) -> u64 {
        self.inner.trigger_count()
    }

    /// The descriptions (JSON) of the triggers not taken by this call before.
    fn take_triggers(&self) -> Vec<String> {
        self.inner.take_triggers()
    }

    /// The descriptions (JSON) of this process's triggers not taken by this call before,
    /// waiting up to `timeout` seconds for one (GIL released).
    fn take_unpublished_triggers(&self, py: Python<'_>, timeout: f64) -> PyResult<Vec<String>> {
        let timeout = duration("timeout", Some(timeout))?.unwrap_or(WAIT_SLICE).min(WAIT_SLICE * 10);
        Ok(py.detach(|| self.inner.take_unpublished_triggers(timeout)))
    }

    /// What this process kept for each trigger: `(uid, JSON)`.
    fn trigger_parts(&self) -> Vec<(String, String)> {
        self.inner.trigger_parts()
    }

    /// Merges what process `process` kept for trigger `uid` (JSON), for the store's list.
    fn merge_trigger_part(&self, uid: &str, process: u32, part: &str) -> PyResult<()> {
        self.inner.merge_trigger_part(uid, process, part).py()
    }

    /// Every trigger's description (a JSON list): an appended recording's, then this one's.
    fn triggers(&self) -> String {
        self.inner.triggers()
    }

    /// The window's `(bytes, steps)` held now, or None without a window.
    fn window_held(&self) -> Option<(usize, usize)> {
        let held = self.inner.window_held();
        Some((usize::try_from(held["bytes"].as_u64()?).ok()?, usize::try_from(held["steps"].as_u64()?).ok()?))
    }
}

/// In a child process created by `fork` (`os.register_at_fork`): the receiver starts
/// fresh and stopped (the parent's consumer thread does not exist here), and every
/// recorder opened before the fork counts as closed, without touching its store.
#[pyfunction]
pub fn after_fork_in_child() {
    hostfeed_core::after_fork_in_child();
    // The parent's poller thread does not exist here.
    POLLER_RUNNING.store(false, Ordering::SeqCst);
}

/// The rows dropped since the last call because they reached a closed recorder (compiled
/// code run after `close`), as `(store, array, rows)` tuples; empty (without a lock) when
/// there are none. `barrier_wait` raises them, interpreter exit reports them.
#[pyfunction]
pub fn take_late_drops() -> Vec<(String, String, u64)> {
    hostfeed_core::take_late_drops().into_iter().map(|d| (d.store, d.array, d.rows)).collect()
}

/// Whether the recorders' writer threads put their writes on `jax.profiler`'s timeline now
/// (the flag refreshed at every recorder creation and flush, and every 200 ms by a poller
/// while a recorder is open).
#[pyfunction]
pub fn write_tracing() -> bool {
    hostfeed_core::write_tracing()
}
