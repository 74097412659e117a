//! The consumer thread's Python side: [`PyConsumer`] runs each batch (attached, detached
//! while it waits for one): its plain taps and calls itself, every other message through
//! the Python dispatcher (its [`DispatcherState`]), and a `call` on its device's thread
//! when nothing else is pending; what the dispatcher raised, kept for the next barrier;
//! the notes the core left, logged.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyList;

use crate::consumers::{
    message_arrays, run_call, run_sync_tap, Consumer, ConsumerKind, ConsumerTable, Dtypes, PyMessage,
};
use crate::error::ReceiverError;
use hostfeed_core::lock;
use hostfeed_core::Message;
use hostfeed_core::{hub, sinks, Consume, RoutedBatch, Worker};

/// An exception the dispatcher raised (it should never), kept for the next barrier.
static DISPATCH_ERROR: Mutex<Option<PyErr>> = Mutex::new(None);
/// Whether `DISPATCH_ERROR` holds one (so that an idle barrier takes no lock).
static HAS_DISPATCH_ERROR: AtomicBool = AtomicBool::new(false);

/// Set by an eager tap (pushed by a thread that holds the GIL, so the consumer cannot take
/// the GIL before that thread lets go of it).
pub(crate) static EAGER_PUSHED: AtomicBool = AtomicBool::new(false);
/// Set while `barrier` waits with the GIL released.
pub(crate) static BARRIER_DETACHED: AtomicBool = AtomicBool::new(false);
/// How long the consumer, handed an eager tap, polls for the pusher to reach
/// `barrier_wait` before it asks for the GIL. A thread that asks for a GIL someone holds
/// is put to sleep, and waking it again costs more than the tap itself; a consumer that
/// sees the barrier let go of the GIL takes it at once. (Without a barrier soon after the
/// eager tap, the consumer asks for the GIL after this time.)
const EAGER_HANDOFF_SPIN: Duration = Duration::from_micros(30);

/// Logs what the Rust side noted (abandoned threads, dropped messages) to the `hostfeed`
/// Python logger.
pub(crate) fn report_notes(py: Python<'_>) {
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

pub(crate) fn record_dispatch_error(py: Python<'_>, err: PyErr) {
    err.display(py);
    *lock(&DISPATCH_ERROR) = Some(err);
    HAS_DISPATCH_ERROR.store(true, Ordering::Release);
}

/// The exception the dispatcher raised since the last call, if any (an idle barrier
/// takes no lock).
pub(crate) fn take_dispatch_error() -> Option<PyErr> {
    if HAS_DISPATCH_ERROR.swap(false, Ordering::AcqRel) {
        lock(&DISPATCH_ERROR).take()
    } else {
        None
    }
}

/// The consumer: attached to Python for the thread's life (re-attaching a detached thread
/// is cheap, attaching from scratch creates a thread state each time), detached while it
/// waits for messages.
pub(crate) struct PyConsumer {
    /// The dispatcher, as Python handed it over at `start`.
    state: Py<DispatcherState>,
    dtypes: Arc<Dtypes>,
    /// `TraceMe.is_enabled`: whether `jax.profiler` traces (then every callback is traced
    /// by the dispatcher, none runs inline).
    tracing: Py<PyAny>,
}

impl PyConsumer {
    /// The consumer that calls the dispatcher of `state` with each batch; `tracing()` says
    /// whether `jax.profiler` traces.
    pub(crate) fn new(state: Py<DispatcherState>, dtypes: Dtypes, tracing: Py<PyAny>) -> Self {
        PyConsumer { state, dtypes: Arc::new(dtypes), tracing }
    }

    /// Whether `jax.profiler` traces (an error: not known).
    fn tracing(&self, py: Python<'_>) -> PyResult<bool> {
        self.tracing.bind(py).call0()?.is_truthy()
    }

    /// Runs `batch` in queue order: its plain taps and calls here (`run_plain`) while no
    /// device is held and `jax.profiler` does not trace (then the dispatcher runs each
    /// message inside a trace event), every other message through the dispatcher, one
    /// message per call. What either raises (they should not) is kept for the next
    /// barrier, and the batch goes on.
    fn dispatch(&self, py: Python<'_>, batch: &RoutedBatch) {
        let state = self.state.get();
        let tracing = self.tracing(py).unwrap_or(false);
        loop {
            if !tracing && state.nothing_held() {
                match catch_unwind(AssertUnwindSafe(|| run_plain(py, batch, state, &self.dtypes))) {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => record_dispatch_error(py, e),
                    Err(_) => record_dispatch_error(
                        py,
                        ReceiverError::new_err("hostfeed internal error: a panic while running taps"),
                    ),
                }
            }
            let Some(msg) = batch.take() else { return };
            let outcome = catch_unwind(AssertUnwindSafe(|| {
                let msg = PyMessage::from_message(py, &self.dtypes, msg)?;
                state.dispatch.call1(py, (msg,))
            }));
            match outcome {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => record_dispatch_error(py, e),
                Err(_) => record_dispatch_error(
                    py,
                    ReceiverError::new_err("hostfeed internal error: a panic while dispatching"),
                ),
            }
        }
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
            let state = self.state.get();
            if !state.nothing_held() || self.tracing(py).unwrap_or(true) {
                return Err(msg);
            }
            let Some(consumer) = state.consumers.get().lookup(py, msg.consumer_id) else {
                return Err(msg);
            };
            // Only a call the receiver runs without Python frames of hostfeed's (a
            // `DirectCall`, not one that takes the device): an interruption then ends in
            // hostfeed's own code; or a synchronous tap, whose invoker records nothing of
            // its own, so that an interruption anywhere in it only fails the tap's wait.
            let c = consumer.get();
            let sync_tap = msg.flags & hostfeed_core::FLAG_SYNC_TAP != 0;
            let runnable = if sync_tap {
                c.kind() == ConsumerKind::Tap
            } else {
                c.kind() == ConsumerKind::Call && c.direct_call(py).is_some()
            };
            if !runnable || !crate::interrupts::watch() {
                return Err(msg);
            }
            let outcome = catch_unwind(AssertUnwindSafe(|| {
                if sync_tap {
                    run_sync_tap(py, &self.dtypes, msg, &consumer, state.tap_failed.bind(py))
                } else {
                    run_call(py, &self.dtypes, msg, &consumer, state.call_failed.bind(py))
                }
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
            let mut done: Option<RoutedBatch> = None;
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
                self.dispatch(py, &batch);
                done = Some(batch);
                report_notes(py);
            }
            drop(done);
        });
    }
}

// ---- A batch's plain run, and the state the receiver shares with the Python dispatcher ----
//
// A batch as the consumer thread runs it: its plain taps and calls run here
// ([`run_plain`]), without a Python frame of the dispatcher per message; every other
// message goes to the Python dispatcher, one at a time. Messages for recorders never
// reach this module: the core's [`RoutedBatch`] routes them on the way.
//
// What the receiver and the Python dispatcher share is typed: [`DispatcherState`] (made
// once by `Dispatcher.state()`, handed to `start`) and [`Holds`], the devices the
// dispatcher holds and the messages an abandoned consumer left, which both languages
// change and read only through its methods (no Python container is lent to Rust).
//
// Only the consumer thread (or a device's thread running a call inline), attached to
// Python, uses this module; it never waits.

/// Adds the dispatcher's state classes to `m`.
pub(crate) fn register_state(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Holds>()?;
    m.add_class::<DispatcherState>()?;
    Ok(())
}

/// The devices the dispatcher holds (each with what it holds of it: a device waiting for
/// its joined tap, and its later messages) and the messages an abandoned consumer left to
/// run first (per device, in order). While either is non-empty the receiver runs no tap
/// or call itself: every message goes to the dispatcher, which keeps each device's order.
///
/// Both languages go through its methods; the receiver asks [`Holds::is_empty`], one
/// atomic load.
#[pyclass(frozen, module = "hostfeed._receiver.batch")]
pub struct Holds {
    inner: Mutex<HoldsInner>,
    /// Whether nothing is held and no orphan waits (kept with every change).
    empty: AtomicBool,
}

/// [`Holds`]' contents, in the order the devices were held (or left).
#[derive(Default)]
struct HoldsInner {
    held: Vec<(i64, Py<PyAny>)>,
    orphans: Vec<(i64, Vec<Py<PyAny>>)>,
}

impl HoldsInner {
    fn held_at(&self, device: i64) -> Option<usize> {
        self.held.iter().position(|(d, _)| *d == device)
    }
}

impl Holds {
    /// Runs `change` on the contents, then notes whether they are empty.
    fn change<T>(&self, change: impl FnOnce(&mut HoldsInner) -> T) -> T {
        let mut inner = lock(&self.inner);
        let out = change(&mut inner);
        self.empty.store(inner.held.is_empty() && inner.orphans.is_empty(), Ordering::Release);
        out
    }
}

#[pymethods]
impl Holds {
    #[new]
    fn new() -> Self {
        Holds { inner: Mutex::new(HoldsInner::default()), empty: AtomicBool::new(true) }
    }

    /// Whether no device is held and no orphan waits (then plain taps and calls run in
    /// the receiver).
    pub(crate) fn is_empty(&self) -> bool {
        self.empty.load(Ordering::Acquire)
    }

    /// What holds `device`, or None if it is not held.
    fn get(&self, py: Python<'_>, device: i64) -> Option<Py<PyAny>> {
        let inner = lock(&self.inner);
        inner.held_at(device).map(|i| inner.held[i].1.clone_ref(py))
    }

    /// Holds `device` on `entry` (what it waits for, and its messages held back).
    ///
    /// Raises `ValueError` if it is held already.
    fn hold(&self, device: i64, entry: Py<PyAny>) -> PyResult<()> {
        self.change(|inner| {
            if inner.held_at(device).is_some() {
                return Err(PyValueError::new_err(format!("device {device} is held already")));
            }
            inner.held.push((device, entry));
            Ok(())
        })
    }

    /// Lets `device` go; returns what held it (None if it was not held).
    fn release(&self, device: i64) -> Option<Py<PyAny>> {
        self.change(|inner| inner.held_at(device).map(|i| inner.held.remove(i).1))
    }

    /// The held devices with what holds each, in the order they were held.
    fn items(&self, py: Python<'_>) -> Vec<(i64, Py<PyAny>)> {
        lock(&self.inner).held.iter().map(|(d, e)| (*d, e.clone_ref(py))).collect()
    }

    /// Leaves `message` (a held-back message an abandoned consumer did not run) to be run
    /// first, after the others left for `device`.
    fn leave(&self, device: i64, message: Py<PyAny>) {
        self.change(|inner| match inner.orphans.iter_mut().find(|(d, _)| *d == device) {
            Some((_, left)) => left.push(message),
            None => inner.orphans.push((device, vec![message])),
        });
    }

    /// Takes the messages left for `device`, in order (an empty list if none).
    fn take_orphans<'py>(&self, py: Python<'py>, device: i64) -> PyResult<Bound<'py, PyList>> {
        let left = self.change(|inner| {
            inner.orphans.iter().position(|(d, _)| *d == device).map(|i| inner.orphans.remove(i).1)
        });
        PyList::new(py, left.unwrap_or_default())
    }

    /// The devices that have messages left, in the order they were left.
    fn orphaned(&self) -> Vec<i64> {
        lock(&self.inner).orphans.iter().map(|(d, _)| *d).collect()
    }

    /// Whether `device` is held.
    fn __contains__(&self, device: i64) -> bool {
        lock(&self.inner).held_at(device).is_some()
    }

    /// How many devices are held.
    fn __len__(&self) -> usize {
        lock(&self.inner).held.len()
    }

    /// The held devices, in the order they were held.
    fn __iter__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let devices: Vec<i64> = lock(&self.inner).held.iter().map(|(d, _)| *d).collect();
        PyList::new(py, devices)?.try_iter().map(Bound::into_any)
    }

    fn __repr__(&self) -> String {
        let inner = lock(&self.inner);
        let held: Vec<i64> = inner.held.iter().map(|(d, _)| *d).collect();
        let orphans: Vec<i64> = inner.orphans.iter().map(|(d, _)| *d).collect();
        format!("Holds(held={held:?}, orphans={orphans:?})")
    }
}

/// What the receiver holds of the Python dispatcher, made by Python and handed to
/// `start`: the callable run with each message the receiver does not run itself, the
/// dispatcher's [`Holds`], the consumer table, and the callables that take the failures
/// of the taps and calls the receiver runs. Frozen: the receiver reads its fields without
/// a lookup by name.
#[pyclass(frozen, module = "hostfeed._receiver.batch")]
pub struct DispatcherState {
    /// `dispatch(message)`, run on the consumer thread with each message (a `Message`)
    /// that is not a plain tap or call, or any while a device is held.
    pub(crate) dispatch: Py<PyAny>,
    /// The devices held and the orphans: while any is, every message goes to `dispatch`.
    pub(crate) holds: Py<Holds>,
    /// The consumers by id.
    pub(crate) consumers: Py<ConsumerTable>,
    /// `tap_failed(exception, consumer)`: a plain tap's function raised.
    pub(crate) tap_failed: Py<PyAny>,
    /// `call_failed(exception_or_None, consumer, run_id, device, reply)`: a plain call
    /// failed, was not run (nobody waits for it), or its `invoke` raised.
    pub(crate) call_failed: Py<PyAny>,
}

#[pymethods]
impl DispatcherState {
    #[new]
    #[pyo3(signature = (dispatch, *, holds, consumers, tap_failed, call_failed))]
    fn py_new(
        dispatch: Bound<'_, PyAny>,
        holds: Py<Holds>,
        consumers: Py<ConsumerTable>,
        tap_failed: Bound<'_, PyAny>,
        call_failed: Bound<'_, PyAny>,
    ) -> PyResult<Self> {
        for (name, f) in [("dispatch", &dispatch), ("tap_failed", &tap_failed), ("call_failed", &call_failed)]
        {
            if !f.is_callable() {
                return Err(PyTypeError::new_err(format!("{name} must be callable")));
            }
        }
        Ok(DispatcherState {
            dispatch: dispatch.unbind(),
            holds,
            consumers,
            tap_failed: tap_failed.unbind(),
            call_failed: call_failed.unbind(),
        })
    }

    /// The dispatcher's holds.
    #[getter]
    fn holds(&self, py: Python<'_>) -> Py<Holds> {
        self.holds.clone_ref(py)
    }

    /// The consumer table.
    #[getter]
    fn consumers(&self, py: Python<'_>) -> Py<ConsumerTable> {
        self.consumers.clone_ref(py)
    }
}

impl DispatcherState {
    /// Whether no device is held and no orphan waits: plain taps and calls may run here.
    pub(crate) fn nothing_held(&self) -> bool {
        self.holds.get().is_empty()
    }
}

/// The consumer of the last message `run_plain` ran: its id, whether it is a call's, and
/// the consumer.
type LastConsumer<'py> = (i64, bool, Bound<'py, Consumer>);

/// Runs the plain taps and calls at the head of `batch`, in queue order, and returns how
/// many ran: while the next message is a tap without flags or reply whose consumer (in
/// `state`'s table) is a `ConsumerKind.TAP` one, calls `consumer.invoke(arrays, device)`;
/// an exception it raises goes to `state`'s `tap_failed(exception, consumer)` and the next
/// message runs. A call (a reply, no flags but a status output) whose consumer is a
/// `ConsumerKind.CALL` one runs the same way, with its `DirectCall` or as
/// `consumer.invoke(arrays, device, reply)` (true when it failed); a failed call, one that
/// nobody waits for any more (not run) and one whose `invoke` raised go to `state`'s
/// `call_failed(exception_or_None, consumer, run_id, device, reply)`. Stops, without
/// taking it, at the first message that is not such a tap or call (the dispatcher takes
/// it), or at the end of the batch. The caller checks that no device is held.
///
/// The receiver's common case without a Python frame of hostfeed's per message: a batch
/// of small taps, or a call a computation waits for, spends most of its time here.
pub(crate) fn run_plain(
    py: Python<'_>,
    batch: &RoutedBatch,
    state: &DispatcherState,
    dtypes: &Dtypes,
) -> PyResult<usize> {
    let consumers = state.consumers.get();
    let failed = state.tap_failed.bind(py);
    let call_failed = state.call_failed.bind(py);
    // The consumer of the last message run: consecutive messages mostly share one.
    let mut last: Option<LastConsumer<'_>> = None;
    let mut ran = 0;
    loop {
        let mut unknown = None;
        let msg = batch.take_if(|m| {
            let tap = m.flags == 0 && m.reply.is_none();
            let call = m.flags & !hostfeed_core::FLAG_STATUS_OUTPUT == 0 && m.reply.is_some();
            if m.host.is_some() || !(tap || call) {
                return false;
            }
            if let Some((cid, is_call, _)) = last.as_ref() {
                if *cid == m.consumer_id {
                    return *is_call == call;
                }
            }
            unknown = Some(m.consumer_id);
            false
        });
        let Some(msg) = msg else {
            // Not a plain tap or call, the end, or one whose consumer is not looked up yet.
            let Some(cid) = unknown else { return Ok(ran) };
            let Some(consumer) = consumers.lookup(py, cid) else { return Ok(ran) };
            let is_call = match consumer.get().kind() {
                ConsumerKind::Tap => false,
                ConsumerKind::Call => true,
                ConsumerKind::Joined => return Ok(ran),
            };
            last = Some((cid, is_call, consumer));
            continue;
        };
        let Some((_, _, consumer)) = last.as_ref() else { unreachable!("accepted a known consumer") };
        if msg.reply.is_some() {
            run_call(py, dtypes, msg, consumer, call_failed)?;
        } else {
            let Message { device, arrays, dims, data, .. } = msg;
            let arrays = message_arrays(py, dtypes, &arrays, &dims, data)?;
            if let Err(e) = consumer.get().invoke(py).call1((arrays, device)) {
                failed.call1((e.into_value(py), consumer))?;
            }
        }
        ran += 1;
    }
}
