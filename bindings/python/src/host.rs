//! The Python binding of the receiver: the `#[pyfunction]`s of `hostfeed._receiver` and the
//! consumer that runs the Python dispatcher. Argument checks and conversions happen here,
//! and so does every release of the GIL around a wait (the recorder's are in `record.rs`,
//! the portable transport's in `portable.rs`):
//! waits are sliced (at most [`WAIT_SLICE`] each) so that Ctrl-C is honoured between slices.
//!
//! The doc comments of the `#[pyfunction]`s are their Python docstrings; the exceptions
//! they raise are described in words there and typed in `_receiver.pyi`.
#![allow(clippy::missing_errors_doc, clippy::must_use_candidate)]

use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use numpy::PyArrayDescr;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyDict, PyTuple};

use crate::error::{IntoPy, ReceiverError};
use crate::messages::{BatchIter, Dtypes, EagerTap};
use hostfeed_core::lock;
use hostfeed_core::Error;
use hostfeed_core::Message;
use hostfeed_core::{dtype, XLA_FFI_Handler};
use hostfeed_core::{hub, sinks, Batch, Consume, StopOutcome, TryPush, Worker};

/// Longest single wait with the GIL released before re-checking signals.
pub(crate) const WAIT_SLICE: Duration = Duration::from_millis(100);
/// Longest timeout accepted (about 31 years); longer is spelled `None` (no limit).
const MAX_SECONDS: f64 = 1e9;

/// An exception the dispatcher raised (it should never), kept for the next barrier.
static DISPATCH_ERROR: Mutex<Option<PyErr>> = Mutex::new(None);
/// Whether `DISPATCH_ERROR` holds one (so that an idle barrier takes no lock).
static HAS_DISPATCH_ERROR: AtomicBool = AtomicBool::new(false);

/// Set by an eager tap (pushed by a thread that holds the GIL, so the consumer cannot take
/// the GIL before that thread lets go of it).
pub(crate) static EAGER_PUSHED: AtomicBool = AtomicBool::new(false);
/// Set while `barrier` waits with the GIL released.
static BARRIER_DETACHED: AtomicBool = AtomicBool::new(false);
/// How long the consumer, handed an eager tap, polls for the pusher to reach
/// `barrier_wait` before it asks for the GIL. A thread that asks for a GIL someone holds
/// is put to sleep, and waking it again costs more than the tap itself; a consumer that
/// sees the barrier let go of the GIL takes it at once. (Without a barrier soon after the
/// eager tap, the consumer asks for the GIL after this time.)
const EAGER_HANDOFF_SPIN: Duration = Duration::from_micros(30);

/// Adds the receiver's functions and constants to `m`.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("DEFAULT_MAX_QUEUE_BYTES", hostfeed_core::DEFAULT_MAX_QUEUE_BYTES)?;
    m.add("DEFAULT_STOP_TIMEOUT", hostfeed_core::DEFAULT_STOP_TIMEOUT.as_secs_f64())?;
    m.add("DEFAULT_BUFFER_POOL_BYTES", hostfeed_core::DEFAULT_POOL_BYTES)?;
    m.add("DTYPE_CODES", dtype_codes(py)?)?;
    m.add_function(wrap_pyfunction!(start, m)?)?;
    m.add_function(wrap_pyfunction!(stop, m)?)?;
    m.add_function(wrap_pyfunction!(finalize, m)?)?;
    m.add_function(wrap_pyfunction!(start_exit_watch, m)?)?;
    m.add_function(wrap_pyfunction!(stop_exit_watch, m)?)?;
    m.add_function(wrap_pyfunction!(push_control, m)?)?;
    m.add_function(wrap_pyfunction!(push_eager, m)?)?;
    m.add_function(wrap_pyfunction!(barrier, m)?)?;
    m.add_function(wrap_pyfunction!(is_running, m)?)?;
    m.add_function(wrap_pyfunction!(in_callback_thread, m)?)?;
    m.add_function(wrap_pyfunction!(max_queue_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(set_max_queue_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(stats, m)?)?;
    m.add_function(wrap_pyfunction!(reset_peak, m)?)?;
    m.add_function(wrap_pyfunction!(hold_back, m)?)?;
    m.add_function(wrap_pyfunction!(let_go, m)?)?;
    m.add_function(wrap_pyfunction!(histograms, m)?)?;
    m.add_function(wrap_pyfunction!(reset_histograms, m)?)?;
    m.add_function(wrap_pyfunction!(set_timing, m)?)?;
    m.add_function(wrap_pyfunction!(set_inline_calls, m)?)?;
    m.add_function(wrap_pyfunction!(set_buffer_pool_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(set_consumer_name, m)?)?;
    m.add_function(wrap_pyfunction!(install_interrupt_watch, m)?)?;
    m.add_function(wrap_pyfunction!(registrations, m)?)?;
    m.add_function(wrap_pyfunction!(summary_registrations, m)?)?;
    Ok(())
}

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

pub(crate) fn duration(what: &str, seconds: Option<f64>) -> PyResult<Option<Duration>> {
    match seconds {
        None => Ok(None),
        Some(t) if t.is_infinite() && t > 0.0 => Ok(None),
        Some(t) if (0.0..=MAX_SECONDS).contains(&t) => Ok(Some(Duration::from_secs_f64(t))),
        Some(t) => Err(PyValueError::new_err(format!(
            "{what} must be a number of seconds between 0 and {MAX_SECONDS:.0e}, or None/inf for \
             no limit; got {t}"
        ))),
    }
}

/// Logs what the Rust side noted (abandoned threads, dropped messages) to the `hostfeed`
/// Python logger.
fn report_notes(py: Python<'_>) {
    let notes = hub().take_notes();
    if notes.is_empty() {
        return;
    }
    let logger = py.import("logging").and_then(|m| m.call_method1("getLogger", ("hostfeed",)));
    for note in notes {
        match &logger {
            Ok(l) => {
                if let Err(e) = l.call_method1("warning", ("hostfeed: %s", note)) {
                    e.display(py);
                }
            }
            Err(e) => e.display(py),
        }
    }
}

fn record_dispatch_error(py: Python<'_>, err: PyErr) {
    err.display(py);
    *lock(&DISPATCH_ERROR) = Some(err);
    HAS_DISPATCH_ERROR.store(true, Ordering::Release);
}

/// The consumer: attached to Python for the thread's life (re-attaching a detached thread
/// is cheap, attaching from scratch creates a thread state each time), detached while it
/// waits for messages.
struct PyConsumer {
    dispatcher: Py<PyAny>,
    dtypes: Arc<Dtypes>,
    /// What an inline call needs from the dispatcher, looked up at the first one.
    inline: std::sync::OnceLock<Option<InlineContext>>,
}

/// The dispatcher's state an inline call looks at (dicts mutated in place, never
/// rebound) and what it calls.
struct InlineContext {
    /// Devices held for a joined callback: their messages wait in the dispatcher.
    held: Py<PyDict>,
    /// Messages an abandoned consumer left to run first.
    orphans: Py<PyDict>,
    /// The consumer registry.
    consumers: Py<PyDict>,
    /// `Dispatcher._call_failed`.
    call_failed: Py<PyAny>,
    /// Whether `jax.profiler` traces (then every callback is traced by the dispatcher).
    tracing: Py<PyAny>,
}

impl InlineContext {
    fn new(dispatcher: &Bound<'_, PyAny>) -> Option<Self> {
        let dict = |name: &str| dispatcher.getattr(name).ok()?.cast_into::<PyDict>().ok().map(Bound::unbind);
        Some(InlineContext {
            held: dict("held")?,
            orphans: dict("orphans")?,
            consumers: dict("consumers")?,
            call_failed: dispatcher.getattr("_call_failed").ok()?.unbind(),
            tracing: dispatcher.getattr("tracing").ok()?.unbind(),
        })
    }
}

thread_local! {
    /// Whether this (device) thread keeps a Python thread state for inline calls.
    static KEPT_THREAD_STATE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Gives the calling thread a Python thread state that outlives each attach (attaching a
/// thread without one creates and destroys one every time, a microsecond or more);
/// returns `false` when Python cannot be entered (not initialized). A thread Python knows
/// already (the main thread, when JAX runs a computation on the thread that dispatched it,
/// with the GIL released) keeps its own.
fn keep_thread_state() -> bool {
    KEPT_THREAD_STATE.with(|kept| {
        if kept.get() {
            return true;
        }
        // SAFETY: plain queries of the interpreter's state, valid without the GIL.
        unsafe {
            if pyo3::ffi::Py_IsInitialized() == 0 {
                return false;
            }
            if !pyo3::ffi::PyGILState_GetThisThreadState().is_null() {
                return true;
            }
        }
        // SAFETY: the interpreter is initialized and this thread has no thread state (so it
        // does not hold the GIL): `PyGILState_Ensure` gives it a thread state and the GIL;
        // `PyEval_SaveThread` releases the GIL and keeps the state, whose GIL-state count
        // stays at one, so later attaches of this thread reuse it. It is never released
        // (the threads are XLA's, few and long-lived); the interpreter frees it at exit.
        unsafe {
            pyo3::ffi::PyGILState_Ensure();
            pyo3::ffi::PyEval_SaveThread();
        }
        kept.set(true);
        true
    })
}

impl Consume for PyConsumer {
    #[allow(clippy::result_large_err)] // the message moves back once; boxing would allocate
    fn run_inline(&self, msg: Message) -> Result<(), Message> {
        if !keep_thread_state() {
            return Err(msg);
        }
        Python::attach(|py| {
            let ctx = self.inline.get_or_init(|| InlineContext::new(self.dispatcher.bind(py)));
            let Some(ctx) = ctx.as_ref() else { return Err(msg) };
            if !ctx.held.bind(py).is_empty()
                || !ctx.orphans.bind(py).is_empty()
                || ctx.tracing.bind(py).call0().and_then(|t| t.is_truthy()).unwrap_or(true)
            {
                return Err(msg);
            }
            let Ok(Some(consumer)) = ctx.consumers.bind(py).get_item(msg.consumer_id) else {
                return Err(msg);
            };
            let is_call = consumer
                .getattr(pyo3::intern!(py, "kind"))
                .and_then(|k| k.eq(pyo3::intern!(py, "call")))
                .unwrap_or(false);
            let Ok(invoke) = consumer.getattr(pyo3::intern!(py, "invoke")) else { return Err(msg) };
            // Only a function the receiver runs without Python frames of hostfeed's (not one
            // that takes the device): an interruption then ends in hostfeed's own code.
            let Ok(Some(direct)) = crate::messages::direct_of(py, &consumer) else { return Err(msg) };
            if !is_call || !crate::interrupts::watch() {
                return Err(msg);
            }
            let outcome = catch_unwind(AssertUnwindSafe(|| {
                let call_failed = ctx.call_failed.bind(py);
                crate::messages::run_call(
                    py,
                    &self.dtypes,
                    msg,
                    &consumer,
                    &invoke,
                    Some(&direct),
                    call_failed,
                )
            }));
            match outcome {
                Ok(Ok(())) => {}
                Ok(Err(e)) => record_dispatch_error(py, e),
                Err(_) => record_dispatch_error(
                    py,
                    ReceiverError::new_err("hostfeed internal error: a panic while running a call"),
                ),
            }
            report_notes(py);
            Ok(())
        })
    }

    fn run(&self, worker: &Worker) {
        Python::attach(|py| {
            // A batch is completed only once the GIL is released again, so that a barrier
            // that sees it complete can take the GIL at once. Messages for recorders are
            // routed in Rust on the way, without attaching; a batch of records alone never
            // reaches Python.
            let mut done: Option<Batch> = None;
            while let Some(batch) = py.detach(|| {
                drop(done.take());
                let batch = sinks().next_batch(worker);
                if EAGER_PUSHED.swap(false, Ordering::AcqRel) {
                    hostfeed_core::spin_until(EAGER_HANDOFF_SPIN, || {
                        BARRIER_DETACHED.load(Ordering::Acquire)
                    });
                }
                batch
            }) {
                let iter = match Bound::new(py, BatchIter::new(batch, Arc::clone(&self.dtypes))) {
                    Ok(it) => it,
                    Err(e) => {
                        record_dispatch_error(py, e);
                        continue;
                    }
                };
                loop {
                    let before = iter.borrow().remaining();
                    let outcome =
                        catch_unwind(AssertUnwindSafe(|| self.dispatcher.call1(py, (iter.clone(),))));
                    match outcome {
                        Ok(Ok(_)) => {}
                        Ok(Err(e)) => record_dispatch_error(py, e),
                        Err(_) => record_dispatch_error(
                            py,
                            ReceiverError::new_err("hostfeed internal error: a panic while dispatching"),
                        ),
                    }
                    // A dispatcher that failed part-way is given the rest of the batch.
                    let after = iter.borrow().remaining();
                    if after == 0 || after == before {
                        break;
                    }
                }
                done = iter.borrow_mut().finish();
                report_notes(py);
            }
            drop(done);
        });
    }
}

/// Configures and starts the receiver.
///
/// `dispatcher(batch)` is called on the consumer thread with an iterator of
/// `(consumer_id, device_ordinal, flags, arrays, reply_or_None, run_id)` tuples; `dtypes`
/// maps XLA dtype codes to numpy dtypes. Returns whether a consumer thread was started.
#[pyfunction]
#[pyo3(signature = (dispatcher, dtypes, max_queue_bytes=None))]
pub fn start(
    py: Python<'_>,
    dispatcher: Bound<'_, PyAny>,
    dtypes: &Bound<'_, PyDict>,
    max_queue_bytes: Option<u64>,
) -> PyResult<bool> {
    if !dispatcher.is_callable() {
        return Err(PyTypeError::new_err("dispatcher must be callable"));
    }
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
    let consumer = Arc::new(PyConsumer {
        dispatcher: dispatcher.unbind(),
        dtypes: Arc::new(Dtypes { descrs }),
        inline: std::sync::OnceLock::new(),
    });
    let r = hub();
    // Detached: the control lock may be held by a `stop` waiting for the consumer, which
    // needs the GIL.
    py.detach(move || {
        r.configure(consumer);
        r.start()
    })
    .py()
}

/// Drains the queue, then stops and joins the consumer thread (GIL released). If a
/// callback makes no progress for `stall_timeout` seconds (None: no limit), waiting calls
/// are failed and the thread is abandoned; returns whether the thread was joined.
#[pyfunction]
#[pyo3(signature = (stall_timeout))]
pub fn stop(py: Python<'_>, stall_timeout: Option<f64>) -> PyResult<bool> {
    let stall = duration("stall_timeout", stall_timeout)?;
    wait_gpu_deliveries(py, stall.unwrap_or(hostfeed_core::DEFAULT_STOP_TIMEOUT)); // GPU taps first
    let outcome = py.detach(|| hub().stop(stall));
    report_notes(py);
    Ok(!matches!(outcome.py()?, StopOutcome::Abandoned(_)))
}

/// Stops the receiver for good (interpreter exit): drains what is queued (abandoning
/// callbacks stuck for `stall_timeout` seconds), then refuses later messages. Returns the
/// number of messages that could not be processed.
#[pyfunction]
#[pyo3(signature = (stall_timeout))]
pub fn finalize(py: Python<'_>, stall_timeout: Option<f64>) -> PyResult<usize> {
    let stall = duration("stall_timeout", stall_timeout)?;
    wait_gpu_deliveries(py, stall.unwrap_or(hostfeed_core::DEFAULT_STOP_TIMEOUT)); // GPU taps first
    let dropped = py.detach(|| hub().finalize(stall));
    report_notes(py);
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

/// Waits until every message enqueued before the call is processed (`timeout` seconds at
/// most; None: no limit), with the GIL released in slices so that Ctrl-C works. Raises an
/// error the dispatcher raised meanwhile.
#[pyfunction]
#[pyo3(signature = (timeout=None))]
pub fn barrier(py: Python<'_>, timeout: Option<f64>) -> PyResult<()> {
    let timeout = duration("timeout", timeout)?;
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
    // Idle (the usual case after the first one): two atomic loads, no lock, no detach.
    while r.queue.processed() < target {
        let slice = match timeout {
            Some(t) => {
                let left = t.saturating_sub(start.elapsed());
                if left.is_zero() && r.queue.processed() < target {
                    return Err(Error::Timeout {
                        what: "barrier_wait",
                        seconds: t.as_secs_f64(),
                        pending: target.saturating_sub(r.queue.processed()),
                    })
                    .py();
                }
                left.min(WAIT_SLICE)
            }
            None => WAIT_SLICE,
        };
        BARRIER_DETACHED.store(true, Ordering::Release);
        let processed = py.detach(|| r.wait_processed(target, slice));
        BARRIER_DETACHED.store(false, Ordering::Release);
        if processed.py()? {
            break;
        }
        py.check_signals()?;
    }
    report_notes(py);
    if HAS_DISPATCH_ERROR.swap(false, Ordering::AcqRel) {
        if let Some(e) = lock(&DISPATCH_ERROR).take() {
            return Err(e);
        }
    }
    Ok(())
}

/// Enqueues an eager tap: `entry` (what the dispatcher calls, standing in for a consumer)
/// runs on the consumer thread with `arrays`, after everything already enqueued. `nbytes`
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

/// Whether the caller runs on the consumer thread (inside a host callback).
#[pyfunction]
pub fn in_callback_thread() -> bool {
    hostfeed_core::in_consumer_thread()
}

/// The queue's byte bound.
#[pyfunction]
pub fn max_queue_bytes() -> u64 {
    hub().queue.bound() as u64
}

/// Sets the queue's byte bound (takes effect at once, also for blocked producers).
#[pyfunction]
pub fn set_max_queue_bytes(bound: u64) -> PyResult<()> {
    if bound == 0 {
        return Err(PyValueError::new_err("max_queue_bytes must be positive"));
    }
    let bound = usize::try_from(bound).map_err(|_| PyValueError::new_err("bound too large"))?;
    hub().queue.set_bound(bound);
    Ok(())
}

/// The receiver's counters as a dict.
#[pyfunction]
pub fn stats(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let d = dict_of(py, hub().queue.stats.snapshot().fields())?;
    d.set_item("max_queue_bytes", max_queue_bytes())?;
    d.set_item("buffer_pool_bytes", hostfeed_core::pool_limit())?;
    d.set_item("buffer_pool_idle_bytes", hostfeed_core::pool_idle_bytes())?;
    Ok(d)
}

/// The timing histograms: `{"device_ns": [(upper_ns, count), ...], "handover_ns": [...]}`
/// (non-empty log-linear buckets, 3 % wide at most): the device-side cost of each tap
/// (from the handler's start until its message is queued) and the hand-over latency of
/// each message (from entering the queue until the consumer takes it for its callback).
#[pyfunction]
pub fn histograms(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let t = &hub().timing;
    let d = PyDict::new(py);
    d.set_item("device_ns", t.device.snapshot())?;
    d.set_item("handover_ns", t.handover.snapshot())?;
    Ok(d)
}

/// Empties the timing histograms.
#[pyfunction]
pub fn reset_histograms() {
    let t = &hub().timing;
    t.device.reset();
    t.handover.reset();
}

/// Turns the recording of the timing histograms on or off (on by default); returns the
/// previous setting.
#[pyfunction]
pub fn set_timing(enabled: bool) -> bool {
    let t = &hub().timing;
    let before = t.enabled();
    t.set_enabled(enabled);
    before
}

/// Lets a CPU `call` run its host function on the device's thread when nothing else is
/// pending (`True`, the default), or keeps every call on the receiver thread (`False`);
/// returns the previous setting.
#[pyfunction]
pub fn set_inline_calls(enabled: bool) -> bool {
    hostfeed_core::set_inline_calls(enabled)
}

/// Sets the most bytes of host buffers kept for reuse when idle.
#[pyfunction]
pub fn set_buffer_pool_bytes(bytes: usize) {
    hostfeed_core::set_pool_limit(bytes);
}

/// Charges `bytes` of messages the dispatcher holds back for a joined tap against the
/// bound (never waits; see `Queue::hold_back`).
#[pyfunction]
pub fn hold_back(bytes: usize) {
    hub().queue.hold_back(bytes);
}

/// Frees `bytes` charged by `hold_back`.
#[pyfunction]
pub fn let_go(bytes: usize) {
    hub().queue.let_go(bytes);
}

/// Resets `peak_queued_bytes` to the current queued bytes.
#[pyfunction]
pub fn reset_peak() {
    hub().queue.reset_peak();
}

/// Remembers the name of consumer `consumer_id`, for error messages about it.
#[pyfunction]
pub fn set_consumer_name(consumer_id: i64, name: String) {
    hub().set_name(consumer_id, name);
}

fn capsule(py: Python<'_>, f: XLA_FFI_Handler) -> PyResult<Bound<'_, PyCapsule>> {
    // SAFETY: `PyCapsule_New` with a non-null pointer, no name (what
    // `jax.ffi.register_ffi_target` expects) and no destructor; the pointer is a static
    // function that lives as long as the process.
    unsafe {
        let raw = pyo3::ffi::PyCapsule_New(f as *mut c_void, std::ptr::null(), None);
        Ok(Bound::from_owned_ptr_or_err(py, raw)?.cast_into_unchecked())
    }
}

/// `{target_name: PyCapsule}` for `jax.ffi.register_ffi_target(..., platform="cpu")`.
#[pyfunction]
pub fn registrations(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    handler_capsules(py, hostfeed_core::CPU_HANDLERS)
}

/// `{target_name: PyCapsule}` of the CPU's summary handlers (`hostfeed_stats`,
/// `hostfeed_histogram`), for `jax.ffi.register_ffi_target(..., platform="cpu")`.
#[pyfunction]
pub fn summary_registrations(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    handler_capsules(py, hostfeed_core::CPU_SUMMARY_HANDLERS)
}

/// `{name: PyCapsule}` of FFI handlers.
pub(crate) fn handler_capsules<'py>(
    py: Python<'py>,
    handlers: &[(&str, XLA_FFI_Handler)],
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    for &(name, f) in handlers {
        d.set_item(name, capsule(py, f)?)?;
    }
    Ok(d)
}

/// A dict of `(key, value)` pairs.
///
/// # Errors
/// As `PyDict::set_item` (a value that cannot be converted).
pub fn dict_of<'py, V: IntoPyObject<'py>>(
    py: Python<'py>,
    items: impl IntoIterator<Item = (&'static str, V)>,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    for (k, v) in items {
        d.set_item(k, v)?;
    }
    Ok(d)
}

/// `{numpy dtype name: XLA_FFI_DataType code}` for every dtype hostfeed transfers.
pub fn dtype_codes(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    use dtype as dt;
    let d = PyDict::new(py);
    for (name, code) in [
        ("bool", dt::PRED),
        ("int8", dt::S8),
        ("int16", dt::S16),
        ("int32", dt::S32),
        ("int64", dt::S64),
        ("uint8", dt::U8),
        ("uint16", dt::U16),
        ("uint32", dt::U32),
        ("uint64", dt::U64),
        ("float16", dt::F16),
        ("float32", dt::F32),
        ("float64", dt::F64),
        ("bfloat16", dt::BF16),
        ("complex64", dt::C64),
        ("complex128", dt::C128),
        ("float8_e5m2", dt::F8E5M2),
        ("float8_e4m3fn", dt::F8E4M3FN),
        ("float8_e4m3b11fnuz", dt::F8E4M3B11FNUZ),
        ("float8_e5m2fnuz", dt::F8E5M2FNUZ),
        ("float8_e4m3fnuz", dt::F8E4M3FNUZ),
        ("float8_e4m3", dt::F8E4M3),
        ("float8_e3m4", dt::F8E3M4),
        ("float8_e8m0fnu", dt::F8E8M0FNU),
    ] {
        d.set_item(name, code)?;
    }
    Ok(d)
}

/// Installs the SIGINT and SIGTERM counters that let a waiting `call` fail on Ctrl-C or
/// SIGTERM (see `interrupt.rs`); returns whether the SIGINT counter is installed.
#[pyfunction]
pub fn install_interrupt_watch() -> bool {
    hostfeed_core::install_interrupt_handlers()
}
