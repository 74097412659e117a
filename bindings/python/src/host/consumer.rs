//! The consumer thread's Python side: [`PyConsumer`] runs the Python dispatcher on each
//! batch (attached, detached while it waits for one) and a `call` on its device's thread
//! when nothing else is pending; what the dispatcher raised, kept for the next barrier;
//! the notes the core left, logged.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::batch::BatchIter;
use crate::consumers::{run_call, Consumer, ConsumerKind};
use crate::error::ReceiverError;
use crate::messages::Dtypes;
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
    dispatcher: Py<PyAny>,
    dtypes: Arc<Dtypes>,
    /// What an inline call needs from the dispatcher, looked up at the first one.
    inline: std::sync::OnceLock<Option<InlineContext>>,
}

impl PyConsumer {
    /// The consumer that calls `dispatcher(batch)` with each batch.
    pub(crate) fn new(dispatcher: Py<PyAny>, dtypes: Dtypes) -> Self {
        PyConsumer { dispatcher, dtypes: Arc::new(dtypes), inline: std::sync::OnceLock::new() }
    }
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
            let Ok(consumer) = consumer.cast_into::<Consumer>() else { return Err(msg) };
            // Only a call the receiver runs without Python frames of hostfeed's (a
            // `DirectCall`, not one that takes the device): an interruption then ends in
            // hostfeed's own code.
            let c = consumer.get();
            if c.kind() != ConsumerKind::Call || c.direct_call(py).is_none() || !crate::interrupts::watch() {
                return Err(msg);
            }
            let outcome = catch_unwind(AssertUnwindSafe(|| {
                run_call(py, &self.dtypes, msg, &consumer, ctx.call_failed.bind(py))
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
