//! A batch as the Python dispatcher sees it ([`BatchIter`]): an iterator of
//! [`PyMessage`]s, and the run of plain taps and calls at its head done here, without a
//! Python frame of the dispatcher per message. Messages for recorders never reach it: the
//! core's [`RoutedBatch`] routes them on the way. [`DispatcherState`] is what the receiver
//! holds of the dispatcher (handed over at `start`): no attribute is looked up by name.
//!
//! Only the consumer thread, attached to Python, uses this module; it never waits.

use std::sync::Arc;

use pyo3::exceptions::{PyStopIteration, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::consumers::{run_call, Consumer, ConsumerKind};
use crate::messages::{message_arrays, Dtypes, PyMessage};
use hostfeed_core::{Message, RoutedBatch};

/// Adds the batch class and the dispatcher's state to `m`.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<DispatcherState>()?;
    m.add_class::<BatchIter>()?;
    Ok(())
}

/// What the receiver holds of the Python dispatcher, made by Python and handed to
/// `start`: the callable run with each batch, the dispatcher's dicts the receiver reads
/// (mutated in place, never rebound) and the callables that take failures. Frozen: the
/// receiver reads its fields without a lookup by name.
#[pyclass(frozen, module = "hostfeed._receiver.batch")]
pub struct DispatcherState {
    /// `dispatch(batch)`, run with each batch (a [`BatchIter`]) on the consumer thread.
    pub(crate) dispatch: Py<PyAny>,
    /// Devices held for a joined callback: while any is, taps and calls run in Python.
    pub(crate) held: Py<PyDict>,
    /// Messages an abandoned consumer left to run first: while any wait, as for `held`.
    pub(crate) orphans: Py<PyDict>,
    /// The consumer registry: consumer id -> `Consumer`.
    pub(crate) consumers: Py<PyDict>,
    /// `tap_failed(exception, consumer)`: a plain tap's function raised.
    pub(crate) tap_failed: Py<PyAny>,
    /// `call_failed(exception_or_None, consumer, run_id, device, reply)`: a plain call
    /// failed, was not run (nobody waits for it), or its `invoke` raised.
    pub(crate) call_failed: Py<PyAny>,
}

#[pymethods]
impl DispatcherState {
    #[new]
    #[pyo3(signature = (dispatch, *, held, orphans, consumers, tap_failed, call_failed))]
    fn py_new(
        dispatch: Bound<'_, PyAny>,
        held: Bound<'_, PyDict>,
        orphans: Bound<'_, PyDict>,
        consumers: Bound<'_, PyDict>,
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
            held: held.unbind(),
            orphans: orphans.unbind(),
            consumers: consumers.unbind(),
            tap_failed: tap_failed.unbind(),
            call_failed: call_failed.unbind(),
        })
    }
}

impl DispatcherState {
    /// Whether no device is held and no orphan waits: plain taps and calls may run here.
    pub(crate) fn nothing_held(&self, py: Python<'_>) -> bool {
        self.held.bind(py).is_empty() && self.orphans.bind(py).is_empty()
    }
}

/// One batch of messages, handed to the Python dispatcher as an iterator. Messages are
/// taken from the receiver one at a time, as the dispatcher gets to them.
#[pyclass(module = "hostfeed._receiver.batch")]
pub struct BatchIter {
    batch: Option<RoutedBatch>,
    dtypes: Arc<Dtypes>,
    state: Py<DispatcherState>,
}

impl BatchIter {
    /// Wraps `batch` for the dispatcher `state` names.
    #[must_use]
    pub fn new(batch: RoutedBatch, dtypes: Arc<Dtypes>, state: Py<DispatcherState>) -> Self {
        BatchIter { batch: Some(batch), dtypes, state }
    }

    /// Takes the batch back (to end it); later iteration stops.
    pub fn finish(&mut self) -> Option<RoutedBatch> {
        self.batch.take()
    }

    /// Messages of the batch the dispatcher has not taken yet.
    #[must_use]
    pub fn remaining(&self) -> usize {
        self.batch.as_ref().map_or(0, RoutedBatch::remaining)
    }
}

/// The consumer of the last message `run_taps` ran: its id, whether it is a call's, and
/// the consumer.
type LastConsumer<'py> = (i64, bool, Bound<'py, Consumer>);

#[pymethods]
impl BatchIter {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// Runs the plain taps and calls at the head of the batch here, in queue order, and
    /// returns how many ran (none while the dispatcher holds a device or has orphans):
    /// while the next message is a tap without flags or reply whose consumer (looked up
    /// in the dispatcher state's ``consumers``) is a ``ConsumerKind.TAP`` one, calls
    /// ``consumer.invoke(arrays, device)``; an exception it raises goes to the state's
    /// ``tap_failed(exception, consumer)`` and the next message runs. A call (a reply, no
    /// flags but a status output) whose consumer is a ``ConsumerKind.CALL`` one runs the
    /// same way, with its ``DirectCall`` or as ``consumer.invoke(arrays, device, reply)``
    /// (true when it failed); a failed call, one that nobody waits for any more (not run)
    /// and one whose ``invoke`` raised go to the state's ``call_failed(exception_or_None,
    /// consumer, run_id, device, reply)``. Stops, without taking it, at the first message
    /// that is not such a tap or call (the dispatcher's general path takes it), or at the
    /// end of the batch.
    ///
    /// The dispatcher's common case without a Python frame per message: a batch of small
    /// taps, or a call a computation waits for, spends most of its time here.
    fn run_taps(&self, py: Python<'_>) -> PyResult<usize> {
        let Some(batch) = self.batch.as_ref() else { return Ok(0) };
        let state = self.state.get();
        if !state.nothing_held(py) {
            return Ok(0);
        }
        let consumers = state.consumers.bind(py);
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
                let Some(found) = consumers.get_item(cid)? else { return Ok(ran) };
                let Ok(consumer) = found.cast_into::<Consumer>() else { return Ok(ran) };
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
                run_call(py, &self.dtypes, msg, consumer, call_failed)?;
            } else {
                let Message { device, arrays, dims, data, .. } = msg;
                let arrays = message_arrays(py, &self.dtypes, &arrays, &dims, data)?;
                if let Err(e) = consumer.get().invoke(py).call1((arrays, device)) {
                    failed.call1((e.into_value(py), consumer))?;
                }
            }
            ran += 1;
        }
    }

    fn __next__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyMessage>> {
        match self.batch.as_ref().and_then(RoutedBatch::take) {
            Some(m) => PyMessage::from_message(py, &self.dtypes, m),
            None => Err(PyStopIteration::new_err(())),
        }
    }
}
