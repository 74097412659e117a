//! The contract between the receiver and Python's consumers: a [`Consumer`] is what a
//! consumer id names (Python makes one per registered callback, and one per eager tap),
//! its [`ConsumerKind`] says how a message for it runs, and a `call`'s consumer may carry
//! a [`DirectCall`], its host function run without hostfeed's Python frames. The receiver
//! reads these fields directly, and looks consumers up in the [`ConsumerTable`] Python's
//! registry fills.
//!
//! Only the consumer thread (or a device's thread running a call inline), attached to
//! Python, runs what is here; nothing here waits.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use numpy::npyffi;
use numpy::{PyArrayDescr, PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::exceptions::{PyKeyError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyString, PyTuple};

use crate::error::ReceiverError;
use crate::messages::{as_result_arrays, message_arrays, send_results, Dtypes, Reply};
use hostfeed_core::{lock, Message, ReplySlot};

/// Adds the consumer classes to `m`.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<ConsumerKind>()?;
    m.add_class::<Consumer>()?;
    m.add_class::<DirectCall>()?;
    m.add_class::<ConsumerTable>()?;
    Ok(())
}

/// How a consumer's messages run. Each kind is one Python object, its class attribute
/// (`ConsumerKind.TAP`, ...: the class has no constructor, and the binding makes none), so
/// Python compares kinds with `is`.
#[pyclass(frozen, eq, hash, module = "hostfeed._receiver.consumers")]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ConsumerKind {
    /// A tap: `invoke(arrays, device)`; a synchronous tap's message also has a reply,
    /// answered with no results once it ran.
    #[pyo3(name = "TAP")]
    Tap,
    /// A call: `invoke(arrays, device, reply) -> failed`, which answers `reply`.
    #[pyo3(name = "CALL")]
    Call,
    /// One part of a global-view tap or call sent shard by shard: `invoke` is the
    /// `Joiner` that joins the parts (`invoke.add(run, arrays, device, reply)`).
    #[pyo3(name = "JOINED")]
    Joined,
}

#[pymethods]
impl ConsumerKind {
    /// The kind's word, as trace events name it (`tap`, `call`, `joined`).
    #[allow(clippy::trivially_copy_pass_by_ref)] // PyO3 passes `self` by reference
    fn __str__(&self) -> &'static str {
        match self {
            ConsumerKind::Tap => "tap",
            ConsumerKind::Call => "call",
            ConsumerKind::Joined => "joined",
        }
    }
}

/// A registered consumer (or an eager tap's): how the receiver runs the user's callable
/// for one message. Frozen; the fields Python reads are slot reads.
#[pyclass(frozen, module = "hostfeed._receiver.consumers")]
pub struct Consumer {
    /// What runs a message (see [`ConsumerKind`]).
    #[pyo3(get)]
    invoke: Py<PyAny>,
    /// The callback's name, for messages about it.
    #[pyo3(get)]
    name: Py<PyString>,
    /// The kind's Python object (the one that was given: there is one per kind).
    #[pyo3(get, name = "kind")]
    kind_object: Py<ConsumerKind>,
    /// The kind, for the receiver.
    kind: ConsumerKind,
    /// A call's host function run without `invoke`'s Python frames (`None`: use `invoke`).
    direct: Option<Py<DirectCall>>,
}

#[pymethods]
impl Consumer {
    #[new]
    #[pyo3(signature = (invoke, name, kind, direct=None))]
    fn new(
        invoke: Py<PyAny>,
        name: Py<PyString>,
        kind: Bound<'_, ConsumerKind>,
        direct: Option<Py<DirectCall>>,
    ) -> PyResult<Self> {
        let (kind, kind_object) = (*kind.get(), kind.unbind());
        if direct.is_some() && kind != ConsumerKind::Call {
            return Err(PyValueError::new_err(format!(
                "only a ConsumerKind.CALL consumer runs a DirectCall, not a {} one",
                kind.__str__()
            )));
        }
        Ok(Consumer { invoke, name, kind_object, kind, direct })
    }

    /// A call's [`DirectCall`], or `None`.
    #[getter(direct)]
    fn direct_object(&self, py: Python<'_>) -> Option<Py<DirectCall>> {
        self.direct.as_ref().map(|d| d.clone_ref(py))
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        format!("Consumer({}, {:?})", self.kind.__str__(), self.name.bind(py).to_string_lossy())
    }
}

impl Consumer {
    /// How its messages run.
    pub(crate) fn kind(&self) -> ConsumerKind {
        self.kind
    }

    /// What runs a message.
    pub(crate) fn invoke<'py>(&self, py: Python<'py>) -> &Bound<'py, PyAny> {
        self.invoke.bind(py)
    }

    /// A call's [`DirectCall`], if it has one.
    pub(crate) fn direct_call<'py>(&self, py: Python<'py>) -> Option<&Bound<'py, DirectCall>> {
        self.direct.as_ref().map(|d| d.bind(py))
    }
}

/// The consumers by id, as Python's registry fills it and the receiver looks them up: a
/// mapping of `int` to [`Consumer`] that both languages use through its methods.
#[pyclass(frozen, mapping, module = "hostfeed._receiver.consumers")]
pub struct ConsumerTable {
    map: Mutex<HashMap<i64, Py<Consumer>>>,
}

#[pymethods]
impl ConsumerTable {
    #[new]
    fn new() -> Self {
        ConsumerTable { map: Mutex::new(HashMap::new()) }
    }

    /// The consumer of `cid`, or None.
    fn get(&self, py: Python<'_>, cid: i64) -> Option<Py<Consumer>> {
        lock(&self.map).get(&cid).map(|c| c.clone_ref(py))
    }

    /// Removes the consumer of `cid` and returns it (`KeyError` if there is none).
    fn pop(&self, cid: i64) -> PyResult<Py<Consumer>> {
        lock(&self.map).remove(&cid).ok_or_else(|| PyKeyError::new_err(cid))
    }

    /// The consumers (in no particular order).
    fn values(&self, py: Python<'_>) -> Vec<Py<Consumer>> {
        lock(&self.map).values().map(|c| c.clone_ref(py)).collect()
    }

    fn __getitem__(&self, py: Python<'_>, cid: i64) -> PyResult<Py<Consumer>> {
        self.get(py, cid).ok_or_else(|| PyKeyError::new_err(cid))
    }

    fn __setitem__(&self, cid: i64, consumer: Py<Consumer>) {
        // (A consumer replaced is dropped once the lock is released.)
        let replaced = lock(&self.map).insert(cid, consumer);
        drop(replaced);
    }

    fn __contains__(&self, cid: i64) -> bool {
        lock(&self.map).contains_key(&cid)
    }

    fn __len__(&self) -> usize {
        lock(&self.map).len()
    }

    fn __repr__(&self) -> String {
        format!("ConsumerTable({} consumers)", lock(&self.map).len())
    }
}

impl ConsumerTable {
    /// The consumer of `cid`, bound, or None.
    pub(crate) fn lookup<'py>(&self, py: Python<'py>, cid: i64) -> Option<Bound<'py, Consumer>> {
        lock(&self.map).get(&cid).map(|c| c.bind(py).clone())
    }
}

/// Runs a plain `call` message (it has a reply slot) of `consumer`: with its
/// [`DirectCall`] when it has one, else with its `invoke`. The results are sent to the
/// reply, or the failure goes to `call_failed` (the `DispatcherState`'s). Used by
/// `host::consumer::run_plain` on the consumer thread and by a call run on its device's thread.
pub(crate) fn run_call(
    py: Python<'_>,
    dtypes: &Dtypes,
    msg: Message,
    consumer: &Bound<'_, Consumer>,
    call_failed: &Bound<'_, PyAny>,
) -> PyResult<()> {
    let Message { device, arrays, dims, data, reply, run_id, .. } = msg;
    let Some(slot) = reply else {
        return Err(ReceiverError::new_err("hostfeed internal error: a call without a reply"));
    };
    let c = consumer.get();
    // The reply first: if building the arrays fails, dropping it fails the call.
    slot.mark_started();
    let pending = slot.is_pending();
    if let (Some(direct), true) = (c.direct_call(py), pending) {
        let arrays = message_arrays(py, dtypes, &arrays, &dims, data);
        let arrays = match arrays {
            Ok(a) => a,
            Err(e) => {
                let reply = Bound::new(py, Reply::new(slot))?;
                call_failed.call1((e.into_value(py), consumer, run_id, device, reply))?;
                return Ok(());
            }
        };
        if direct.get().run(py, &slot, arrays)? {
            return Ok(());
        }
        let reply = Bound::new(py, Reply::new(slot))?;
        call_failed.call1((py.None(), consumer, run_id, device, reply))?;
        return Ok(());
    }
    let reply = Bound::new(py, Reply::new(slot))?;
    let arrays = message_arrays(py, dtypes, &arrays, &dims, data)?;
    // A call nobody waits for any more (timed out, cancelled) is not run.
    let outcome =
        if pending { c.invoke(py).call1((arrays, device, &reply)) } else { Ok(py.None().into_bound(py)) };
    match outcome {
        Ok(failed) if pending && !failed.is_truthy()? => {}
        Ok(_) => {
            call_failed.call1((py.None(), consumer, run_id, device, reply))?;
        }
        Err(e) => {
            call_failed.call1((e.into_value(py), consumer, run_id, device, reply))?;
        }
    }
    Ok(())
}

/// Runs a synchronous tap (a call without results whose host function is the tap
/// function of `consumer`, a `Tap`) on the calling thread, then answers its reply slot
/// with nothing: the device goes on once the tap function has run. A failing tap function
/// is handed to `tap_failed` (recorded for `barrier_wait`, as for any tap) and the
/// computation goes on; Ctrl-C or SIGTERM during it fails the slot as an interrupted wait
/// does (nothing recorded).
pub(crate) fn run_sync_tap(
    py: Python<'_>,
    dtypes: &Dtypes,
    msg: Message,
    consumer: &Bound<'_, Consumer>,
    tap_failed: &Bound<'_, PyAny>,
) -> PyResult<()> {
    let Message { device, arrays, dims, data, reply, .. } = msg;
    let Some(slot) = reply else {
        return Err(ReceiverError::new_err("hostfeed internal error: a synchronous tap without a reply"));
    };
    slot.mark_started();
    if !slot.is_pending() {
        return Ok(());
    }
    // (If building the arrays fails, the slot dropped on the way out fails the tap.)
    let arrays = message_arrays(py, dtypes, &arrays, &dims, data)?;
    let counts = crate::interrupts::begin_run();
    let outcome = consumer.get().invoke(py).call1((arrays, device));
    crate::interrupts::end_run();
    match outcome {
        Ok(_) => {}
        Err(e) if crate::interrupts::interrupted(py, &e, counts) => {
            slot.fail("hostfeed: interrupted".into());
            return Ok(());
        }
        Err(e) => {
            tap_failed.call1((e.into_value(py), consumer))?;
        }
    }
    slot.reply_with(|_| Ok(()));
    Ok(())
}

/// A `call`'s host function as the receiver runs it without hostfeed's Python frames
/// around it (made by `runtime.make_direct_call`): the argument is the one array or the
/// tree made of the arrays; one result of exactly the expected shape and dtype, a
/// C-contiguous numpy array, is copied straight into the call's results; an exception
/// and any other results go to the Python parts that `invoke` uses too, so that errors
/// and records are the same.
#[pyclass(frozen, module = "hostfeed._receiver.consumers")]
pub struct DirectCall {
    func: Py<PyAny>,
    /// The argument's tree (`None`: the argument is the one array).
    treedef: Option<Py<PyAny>>,
    /// The one result's shape and dtype (`None`: not a single result).
    result: Option<(Vec<usize>, Py<PyArrayDescr>)>,
    /// `raised(exc) -> message`.
    raised: Py<PyAny>,
    /// `results(res) -> (flat, None) | (None, message)`.
    results: Py<PyAny>,
}

#[pymethods]
impl DirectCall {
    #[new]
    #[pyo3(signature = (func, treedef, shape, dtype, raised, results))]
    fn new(
        func: Py<PyAny>,
        treedef: Option<Py<PyAny>>,
        shape: Option<Vec<usize>>,
        dtype: Option<Py<PyArrayDescr>>,
        raised: Py<PyAny>,
        results: Py<PyAny>,
    ) -> Self {
        let result = shape.zip(dtype);
        DirectCall { func, treedef, result, raised, results }
    }
}

impl DirectCall {
    /// Runs the function on `arrays` and answers `slot`; returns whether it succeeded
    /// (on failure the slot has the error).
    fn run(&self, py: Python<'_>, slot: &Arc<ReplySlot>, arrays: Bound<'_, PyTuple>) -> PyResult<bool> {
        let arg = match &self.treedef {
            None => arrays.get_item(0)?,
            Some(treedef) => treedef.bind(py).call_method1(intern!(py, "unflatten"), (arrays,))?,
        };
        let counts = crate::interrupts::begin_run();
        let res = self.func.bind(py).call1((arg,));
        crate::interrupts::end_run();
        let res = match res {
            Ok(res) => res,
            Err(e) if crate::interrupts::interrupted(py, &e, counts) => {
                // Ctrl-C or SIGTERM interrupted it: the call fails as interrupted (its
                // caller words the error), and nothing is recorded for barrier_wait.
                slot.fail("hostfeed: interrupted".into());
                return Ok(false);
            }
            Err(e) => {
                let message: String = self.raised.bind(py).call1((e.into_value(py),))?.extract()?;
                slot.fail(message);
                return Ok(false);
            }
        };
        if let Some((shape, dtype)) = &self.result {
            if let Ok(a) = res.cast::<PyUntypedArray>() {
                // SAFETY: `a` is a live numpy array object (checked by the cast).
                let exact = unsafe { npyffi::PyArray_CheckExact(py, a.as_ptr()) } != 0;
                if exact
                    && a.is_c_contiguous()
                    && a.shape() == shape.as_slice()
                    && a.dtype().is_equiv_to(dtype.bind(py))
                {
                    return send_results(slot, std::slice::from_ref(a));
                }
            }
        }
        let checked = self.results.bind(py).call1((res,))?;
        let (flat, error): (Option<Vec<Bound<'_, PyAny>>>, Option<String>) = checked.extract()?;
        match (flat, error) {
            (Some(flat), None) => {
                let arrays = as_result_arrays(&flat)?;
                send_results(slot, &arrays)
            }
            (_, error) => {
                slot.fail(
                    error.unwrap_or_else(|| {
                        "hostfeed internal error: a call's results were not checked".into()
                    }),
                );
                Ok(false)
            }
        }
    }
}
