//! The receiver's life as Python drives it: start (with the dispatcher), stop, finalize at
//! exit and its watchdog, barriers, and the messages Python pushes itself (eager taps,
//! control messages). Every wait here releases the GIL, in slices of at most
//! [`WAIT_SLICE`] so that Ctrl-C is honoured between them.

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use numpy::PyArrayDescr;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple};

use super::consumer::{
    report_notes, take_dispatch_error, DispatcherState, PyConsumer, BARRIER_DETACHED, EAGER_PUSHED,
};
use super::passthrough::{duration, set_max_queue_bytes};
use crate::consumers::{Dtypes, EagerTap};
use crate::error::{IntoPy, ReceiverError};
use hostfeed_core::lock;
use hostfeed_core::Error;
use hostfeed_core::Message;
use hostfeed_core::{hub, StopOutcome, TryPush};

/// Adds the lifecycle's functions to `m`.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(start, m)?)?;
    m.add_function(wrap_pyfunction!(stop, m)?)?;
    m.add_function(wrap_pyfunction!(finalize, m)?)?;
    m.add_function(wrap_pyfunction!(start_exit_watch, m)?)?;
    m.add_function(wrap_pyfunction!(stop_exit_watch, m)?)?;
    m.add_function(wrap_pyfunction!(push_control, m)?)?;
    m.add_function(wrap_pyfunction!(push_eager, m)?)?;
    m.add_function(wrap_pyfunction!(barrier, m)?)?;
    m.add_function(wrap_pyfunction!(is_running, m)?)?;
    m.add_function(wrap_pyfunction!(exit_status_if_clean, m)?)?;
    Ok(())
}

/// Longest single wait with the GIL released before re-checking signals.
pub(crate) const WAIT_SLICE: Duration = Duration::from_millis(100);

/// Waits (GIL released, signals checked) until the GPU couriers delivered every tap handed
/// to them so far.
fn wait_gpu_parcels(py: Python<'_>) -> PyResult<()> {
    let parcels = hostfeed_core::GPU_DELIVERY.submitted();
    while !hostfeed_core::GPU_DELIVERY.delivered_at_least(parcels) {
        if py.detach(|| hostfeed_core::GPU_DELIVERY.wait_delivered(parcels, WAIT_SLICE)) {
            break;
        }
        py.check_signals()?;
    }
    Ok(())
}

/// Waits (GIL released, `limit` at most) until the GPU couriers delivered every tap
/// handed to them, so that stopping or exiting does not leave GPU taps behind.
fn wait_gpu_deliveries(py: Python<'_>, limit: Duration) {
    let parcels = hostfeed_core::GPU_DELIVERY.submitted();
    py.detach(|| hostfeed_core::GPU_DELIVERY.wait_delivered(parcels, limit));
}

/// `jax.profiler`'s `TraceMe`, as the first `start` handed it over (the recorder's writes
/// and the dispatcher's inline calls ask it whether a trace is collected).
static TRACE_ME: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// `TraceMe` as `start` was given it; None before the first start.
pub(crate) fn trace_me(py: Python<'_>) -> Option<&Bound<'_, PyAny>> {
    TRACE_ME.get(py).map(|c| c.bind(py))
}

/// Configures and starts the receiver.
///
/// The consumer thread runs each batch's plain taps and calls itself and calls
/// `dispatcher.dispatch(message)` with every other `Message`, in queue order; `dtypes` maps XLA dtype codes to numpy dtypes; `trace_me` is
/// `jax.profiler`'s `TraceMe` class (`TraceMe(name, **metadata)` a context manager,
/// `TraceMe.is_enabled()` whether a trace is collected). Returns whether a consumer thread
/// was started.
#[pyfunction]
#[pyo3(signature = (dispatcher, dtypes, trace_me, max_queue_bytes=None))]
pub fn start(
    py: Python<'_>,
    dispatcher: Py<DispatcherState>,
    dtypes: &Bound<'_, PyDict>,
    trace_me: &Bound<'_, PyAny>,
    max_queue_bytes: Option<u64>,
) -> PyResult<bool> {
    let tracing = trace_me.getattr("is_enabled")?;
    if !tracing.is_callable() {
        return Err(PyTypeError::new_err("trace_me.is_enabled must be callable"));
    }
    let _ = TRACE_ME.get_or_init(py, || trace_me.clone().unbind());
    let mut descrs: Vec<Option<Py<PyArrayDescr>>> = Vec::new();
    for (k, v) in dtypes.iter() {
        let code: usize = k.extract()?;
        let descr = v
            .cast_into::<PyArrayDescr>()
            .map_err(|e| PyTypeError::new_err(format!("dtypes[{code}] must be a numpy dtype: {e}")))?;
        if descrs.len() <= code {
            descrs.resize_with(code + 1, || None);
        }
        descrs[code] = Some(descr.unbind());
    }
    if let Some(bound) = max_queue_bytes {
        set_max_queue_bytes(bound)?;
    }
    let consumer = Arc::new(PyConsumer::new(dispatcher, Dtypes { descrs }, tracing.unbind()));
    let r = hub();
    // Detached: the control lock may be held by a `stop` waiting for the consumer, which
    // needs the GIL.
    py.detach(move || {
        r.configure(consumer);
        r.start()
    })
    .py()
}

/// What stopping and finalizing share: the GPU taps delivered first (for at most the stall
/// timeout, or the default stop timeout without one), then `end` of the hub with the GIL
/// released, then the notes it left reported to Python's logging.
fn wind_down<R: Send>(
    py: Python<'_>,
    stall_timeout: Option<f64>,
    end: impl FnOnce(Option<Duration>) -> R + Send,
) -> PyResult<R> {
    let stall = duration("stall_timeout", stall_timeout)?;
    wait_gpu_deliveries(py, stall.unwrap_or(hostfeed_core::DEFAULT_STOP_TIMEOUT));
    let out = py.detach(|| end(stall));
    report_notes(py);
    Ok(out)
}

/// Drains the queue, then stops and joins the consumer thread (GIL released). If a
/// callback makes no progress for `stall_timeout` seconds (None: no limit), waiting calls
/// are failed and the thread is abandoned; returns whether the thread was joined.
#[pyfunction]
#[pyo3(signature = (stall_timeout))]
pub fn stop(py: Python<'_>, stall_timeout: Option<f64>) -> PyResult<bool> {
    let outcome = wind_down(py, stall_timeout, |stall| hub().stop(stall))?;
    Ok(!matches!(outcome.py()?, StopOutcome::Abandoned(_)))
}

/// Stops the receiver for good (interpreter exit): drains what is queued (abandoning
/// callbacks stuck for `stall_timeout` seconds), then refuses later messages. Returns the
/// number of messages that could not be processed.
#[pyfunction]
#[pyo3(signature = (stall_timeout))]
pub fn finalize(py: Python<'_>, stall_timeout: Option<f64>) -> PyResult<usize> {
    let dropped = wind_down(py, stall_timeout, |stall| hub().finalize(stall))?;
    hostfeed_core::remove_interrupt_handlers();
    dropped.py()
}

/// The exit watchdog: a native thread that keeps the receiver draining while the main
/// thread waits for computations at interpreter exit (no Python thread can be started
/// then). It abandons a consumer stuck for the stall timeout, so that computations
/// blocked on a full queue, or calls waiting for a stuck callback, can finish.
static EXIT_WATCH: Mutex<Option<(Arc<AtomicBool>, std::thread::JoinHandle<()>)>> = Mutex::new(None);

/// Starts the exit watchdog (see above): abandons a callback that makes no progress for
/// `stall_timeout` seconds (None: never). Idempotent.
#[pyfunction]
#[pyo3(signature = (stall_timeout))]
pub fn start_exit_watch(stall_timeout: Option<f64>) -> PyResult<()> {
    let stall = duration("stall_timeout", stall_timeout)?;
    let mut watch = lock(&EXIT_WATCH);
    if watch.is_some() {
        return Ok(());
    }
    let stop = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&stop);
    let r = hub();
    let handle = std::thread::Builder::new()
        .name("hostfeed-exit-watch".into())
        .spawn(move || {
            while !flag.load(Ordering::Acquire) {
                if let Err(e) = r.drain_step(stall, Duration::from_millis(20)) {
                    r.note(format!("exit watchdog: {e}"));
                    break;
                }
                if r.queue.processed() >= r.queue.enqueued() {
                    std::thread::park_timeout(Duration::from_millis(20));
                }
            }
        })
        .map_err(|e| ReceiverError::new_err(format!("cannot start the exit watchdog: {e}")))?;
    *watch = Some((stop, handle));
    Ok(())
}

/// Stops the exit watchdog and waits for it (GIL released).
#[pyfunction]
pub fn stop_exit_watch(py: Python<'_>) {
    let taken = lock(&EXIT_WATCH).take();
    if let Some((stop, handle)) = taken {
        stop.store(true, Ordering::Release);
        handle.thread().unpark();
        py.detach(|| drop(handle.join()));
    }
    report_notes(py);
}

/// Waits until every message enqueued before the call has run (`timeout` seconds at most;
/// None: no limit), with the GIL released in slices so that Ctrl-C works, and returns
/// True. Messages the dispatcher holds back (a device's later messages behind a joined tap
/// whose other parts have not come) have not run: it waits for them too
/// (`Queue::done_before`). With `patience`, it returns False instead once only such held
/// messages kept it waiting for `patience` seconds (the caller then waits for the
/// computations dispatched since, which send those parts, and calls it again). Raises an
/// error the dispatcher raised meanwhile.
#[pyfunction]
#[pyo3(signature = (timeout=None, patience=None))]
pub fn barrier(py: Python<'_>, timeout: Option<f64>, patience: Option<f64>) -> PyResult<bool> {
    let timeout = duration("timeout", timeout)?;
    let patience = duration("patience", patience)?;
    if hostfeed_core::in_consumer_thread() {
        return Err(Error::InsideCallback("barrier_wait")).py();
    }
    let r = hub();
    let start = Instant::now();
    // Taps GPUs sent before the barrier reach the queue first (without GPUs:
    // one atomic load).
    let parcels = hostfeed_core::GPU_DELIVERY.submitted();
    while !hostfeed_core::GPU_DELIVERY.delivered_at_least(parcels) {
        if py.detach(|| hostfeed_core::GPU_DELIVERY.wait_delivered(parcels, WAIT_SLICE)) {
            break;
        }
        py.check_signals()?;
        if timeout.is_some_and(|t| start.elapsed() >= t) {
            break; // the queue wait below reports the timeout
        }
    }
    let target = r.queue.enqueued();
    // Since when only held-back messages keep it waiting.
    let mut held_since: Option<Instant> = None;
    // Idle (the usual case after the first one): two atomic loads, no lock, no detach.
    while !r.queue.done_before(target) {
        let mut slice = match timeout {
            Some(t) => {
                let left = t.saturating_sub(start.elapsed());
                if left.is_zero() && !r.queue.done_before(target) {
                    return Err(Error::Timeout {
                        what: "barrier_wait",
                        seconds: t.as_secs_f64(),
                        pending: r.queue.outstanding_before(target),
                    })
                    .py();
                }
                left.min(WAIT_SLICE)
            }
            None => WAIT_SLICE,
        };
        if let Some(p) = patience {
            if r.queue.only_held_before(target) {
                let since = *held_since.get_or_insert_with(Instant::now);
                let left = p.saturating_sub(since.elapsed());
                if left.is_zero() {
                    report_notes(py);
                    return Ok(false);
                }
                slice = slice.min(left);
            } else {
                held_since = None;
            }
        }
        BARRIER_DETACHED.store(true, Ordering::Release);
        let processed = py.detach(|| r.wait_processed(target, slice));
        BARRIER_DETACHED.store(false, Ordering::Release);
        if processed.py()? {
            break;
        }
        py.check_signals()?;
    }
    report_notes(py);
    take_dispatch_error().map_or(Ok(true), Err)
}

/// Enqueues an eager tap: `entry` (its `Consumer`, registered nowhere: the message carries
/// it; anything else fails when it runs, recorded for the next barrier) runs on the consumer
/// thread with `arrays`, after everything already enqueued. `nbytes`
/// (the arrays' bytes) counts against the queue bound; when the queue is full this waits
/// for space with the GIL released.
#[pyfunction]
pub fn push_eager(
    py: Python<'_>,
    entry: Bound<'_, PyAny>,
    arrays: Bound<'_, PyTuple>,
    nbytes: usize,
) -> PyResult<()> {
    // Python waited for the computations dispatched before this tap; their GPU
    // taps reach the queue first (without GPUs: two atomic loads).
    wait_gpu_parcels(py)?;
    let payload = EagerTap { entry: entry.unbind(), arrays: arrays.unbind() };
    let msg = Message::from_host(hostfeed_core::FLAG_EAGER, -1, Box::new(payload), nbytes);
    EAGER_PUSHED.store(true, Ordering::Release);
    // (`try_push`/`push` stamp the message for the hand-over histogram.)
    let r = hub();
    // While attached only what cannot wait; waiting (or starting a consumer, which takes
    // the control lock a `stop` may hold while it waits for the GIL) happens detached.
    match r.try_push(msg).py()? {
        TryPush::Pushed => Ok(()),
        TryPush::NeedsConsumer => Ok(py.detach(|| r.start().map(drop)).py()?),
        TryPush::Full(msg) => Ok(py.detach(|| r.push(msg)).py()?),
    }
}

/// Enqueues a control message (consumer id 0, no data) that the dispatcher acts on in
/// queue order. The GIL is released while the queue is full.
#[pyfunction]
pub fn push_control(py: Python<'_>) -> PyResult<()> {
    // SAFETY: no operands are read.
    let msg = unsafe { hostfeed_core::gather(0, 0, -1, std::iter::empty()) }.py()?;
    let r = hub();
    py.detach(|| r.push(msg)).py()
}

/// Whether the consumer thread is running.
#[pyfunction]
pub fn is_running(py: Python<'_>) -> bool {
    py.detach(|| hub().is_running())
}

/// The status [`exit_status_if_clean`] asked for (0: none).
static EXIT_STATUS: AtomicI32 = AtomicI32::new(0);

/// Makes the process exit with `status` (1..=255) where it would exit with status 0: a
/// program that ends while a host callback's exception was never raised (interpreter exit
/// reports it). Done at the C library's exit, after Python has finalized (every `atexit`
/// function run, every file flushed), by a glibc `on_exit` function, which sees the status
/// the program ends with: a non-zero one (an uncaught exception's 1, `sys.exit(3)`) is
/// kept. Returns whether this platform can (glibc Linux; elsewhere the status stays).
#[pyfunction]
pub fn exit_status_if_clean(status: i32) -> PyResult<bool> {
    if !(1..=255).contains(&status) {
        return Err(pyo3::exceptions::PyValueError::new_err(format!(
            "an exit status is 1..=255, got {status}"
        )));
    }
    EXIT_STATUS.store(status, Ordering::SeqCst);
    Ok(on_exit::install())
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
mod on_exit {
    use std::ffi::{c_int, c_void};
    use std::sync::atomic::Ordering;
    use std::sync::OnceLock;

    extern "C" {
        /// glibc's `on_exit(3)`: `function(status, arg)` runs at `exit(status)`.
        fn on_exit(function: extern "C" fn(c_int, *mut c_void), arg: *mut c_void) -> c_int;
    }

    /// At `exit(status)`: a clean status becomes the one asked for.
    extern "C" fn at_exit(status: c_int, _arg: *mut c_void) {
        let wanted = super::EXIT_STATUS.load(Ordering::SeqCst);
        if status == 0 && wanted != 0 {
            // SAFETY: `fflush(NULL)` flushes every C stream (what `exit` would do after the
            // exit functions); `_exit` then ends the process with `wanted`, skipping only
            // the exit functions registered before this one (Python has finalized).
            unsafe {
                libc::fflush(std::ptr::null_mut());
                libc::_exit(wanted);
            }
        }
    }

    /// Registers [`at_exit`] once; whether it is registered.
    pub(super) fn install() -> bool {
        static DONE: OnceLock<bool> = OnceLock::new();
        // SAFETY: `at_exit` is a plain `extern "C"` function that lives as long as the
        // process, and its argument is unused (null).
        *DONE.get_or_init(|| unsafe { on_exit(at_exit, std::ptr::null_mut()) } == 0)
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
mod on_exit {
    /// No `on_exit` here: the exit status cannot be changed after Python's finalization.
    pub(super) fn install() -> bool {
        false
    }
}
