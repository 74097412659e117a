//! The consumer thread's Python side: [`PyConsumer`] runs each batch (attached, detached
//! while it waits for one): its plain taps and calls itself, every other message through
//! the Python dispatcher (its [`DispatcherState`]), and a `call` on its device's thread
//! when nothing else is pending; what the dispatcher raised, kept for the next barrier;
//! the notes the core left, logged.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pyo3::prelude::*;

use crate::batch::{run_plain, DispatcherState};
use crate::consumers::{run_call, run_sync_tap, ConsumerKind};
use crate::error::ReceiverError;
use crate::messages::{Dtypes, PyMessage};
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
