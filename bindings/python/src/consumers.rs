//! The contract between the receiver and Python's consumers, and what a consumer is handed.
//!
//! A [`Consumer`] is what a consumer id names (Python makes one per registered callback,
//! and one per eager tap), its [`ConsumerKind`] says how a message for it runs, and a
//! `call`'s consumer may carry a [`DirectCall`], its host function run without hostfeed's
//! Python frames. The receiver reads these fields directly, and looks consumers up in the
//! [`ConsumerTable`] Python's registry fills (the `consumers` submodule).
//!
//! What a consumer is handed (the `messages` submodule): each message the dispatcher takes
//! is a [`PyMessage`] with named fields, its arrays numpy views of the message buffer (no
//! second copy), a `call`'s with the [`Reply`] handle its host function answers.
//!
//! Only the consumer thread (or a device's thread running a call inline), attached to
//! Python, runs what is here; nothing here waits.

use std::collections::HashMap;
use std::ffi::c_int;
use std::ptr;
use std::sync::{Arc, Mutex};

use numpy::npyffi::{self, npy_intp, PY_ARRAY_API};
use numpy::{PyArrayDescr, PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::exceptions::{PyKeyError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyInt, PyString, PyTuple};

use crate::error::ReceiverError;
use hostfeed_core::{lock, ArrayMeta, HostBuffer, Message, ReplySlot};

// ---- Messages as Python objects --------------------------------------------------------

/// Adds the message classes and the `FLAG_*` bits a message carries to `m`.
pub(crate) fn register_messages(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<MessageData>()?;
    m.add_class::<PyMessage>()?;
    m.add_class::<Reply>()?;
    m.add("FLAG_STATUS_OUTPUT", hostfeed_core::FLAG_STATUS_OUTPUT)?;
    m.add("FLAG_SHARD", hostfeed_core::FLAG_SHARD)?;
    m.add("FLAG_EAGER", hostfeed_core::FLAG_EAGER)?;
    m.add("FLAG_SYNC_TAP", hostfeed_core::FLAG_SYNC_TAP)?;
    m.add("PORTABLE_KEY_BASE", hostfeed_core::PORTABLE_KEY_BASE)?;
    m.add("PORTABLE_ID_BITS", hostfeed_core::PORTABLE_ID_BITS)?;
    Ok(())
}

/// What the consumer needs from Python: numpy dtypes per XLA dtype code.
pub struct Dtypes {
    /// Indexed by `XLA_FFI_DataType` code.
    pub descrs: Vec<Option<Py<PyArrayDescr>>>,
}

/// Owner of a message's bytes on the Python side; numpy arrays use it as their base.
#[pyclass(frozen, module = "hostfeed._receiver.messages")]
pub struct MessageData {
    buf: HostBuffer,
}

/// One message as the Python dispatcher reads it, by name. Frozen, and every field a
/// Python object made once: reading a field is a slot read, as cheap as indexing a tuple.
/// (Python code builds them too: the dispatcher's unit tests.)
#[pyclass(frozen, name = "Message", module = "hostfeed._receiver.messages")]
pub struct PyMessage {
    /// The consumer's id (0: a control message; -1: an eager tap, which carries its
    /// consumer in `consumer`).
    #[pyo3(get)]
    consumer_id: Py<PyInt>,
    /// The device's key: a CPU device's ordinal, a GPU's or the portable transport's key.
    #[pyo3(get)]
    device: Py<PyInt>,
    /// The message's `FLAG_*` bits.
    #[pyo3(get)]
    flags: Py<PyInt>,
    /// The operands, as numpy arrays viewing the message's bytes.
    #[pyo3(get)]
    arrays: Py<PyTuple>,
    /// A call's [`Reply`] (a synchronous tap's too); `None` for a tap.
    #[pyo3(get)]
    reply: Py<PyAny>,
    /// XLA's run id of the execution that sent it (0 when unknown: the portable transport).
    #[pyo3(get)]
    run_id: Py<PyInt>,
    /// An eager tap's consumer (it is registered nowhere); `None` otherwise.
    #[pyo3(get)]
    consumer: Py<PyAny>,
    /// Its sequence number in the receiver's queue (`None` for a message made in Python):
    /// what the dispatcher names when it holds the message back (`hold_back`).
    #[pyo3(get)]
    seq: Option<u64>,
}

#[pymethods]
impl PyMessage {
    #[new]
    #[allow(clippy::too_many_arguments)] // one argument per field
    #[pyo3(signature = (consumer_id, device, flags, arrays, reply=None, run_id=0, consumer=None, seq=None))]
    fn py_new(
        py: Python<'_>,
        consumer_id: i64,
        device: i32,
        flags: i64,
        arrays: Py<PyTuple>,
        reply: Option<Py<PyAny>>,
        run_id: i64,
        consumer: Option<Py<PyAny>>,
        seq: Option<u64>,
    ) -> Self {
        let int = |v: i64| v.into_pyobject(py).map_or_else(|e| match e {}, Bound::unbind);
        PyMessage {
            consumer_id: int(consumer_id),
            device: int(i64::from(device)),
            flags: int(flags),
            arrays,
            reply: reply.unwrap_or_else(|| py.None()),
            run_id: int(run_id),
            consumer: consumer.unwrap_or_else(|| py.None()),
            seq,
        }
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "Message(consumer_id={}, device={}, flags={}, arrays={} array(s), reply={}, run_id={})",
            self.consumer_id.bind(py),
            self.device.bind(py),
            self.flags.bind(py),
            self.arrays.bind(py).len(),
            if self.reply.is_none(py) { "None" } else { "..." },
            self.run_id.bind(py),
        )
    }
}

impl PyMessage {
    /// One message of the receiver's queue for the dispatcher; an eager tap's carries its
    /// consumer (`consumer_id` -1).
    pub(crate) fn from_message<'py>(
        py: Python<'py>,
        dtypes: &Dtypes,
        msg: Message,
    ) -> PyResult<Bound<'py, PyMessage>> {
        let Message { consumer_id, flags, device, arrays, dims, data, reply, run_id, host, seq, .. } = msg;
        if let Some(host) = host {
            let eager = host
                .downcast::<EagerTap>()
                .map_err(|_| ReceiverError::new_err("hostfeed internal error: unknown host message"))?;
            let EagerTap { entry, arrays } = *eager;
            return Bound::new(
                py,
                PyMessage::py_new(py, consumer_id, device, flags, arrays, None, 0, Some(entry), Some(seq)),
            );
        }
        // The reply first: if building the arrays fails, dropping it fails the call.
        let reply = reply
            .map(|slot| {
                slot.mark_started();
                Bound::new(py, Reply { slot }).map(|r| r.into_any().unbind())
            })
            .transpose()?;
        let arrays = message_arrays(py, dtypes, &arrays, &dims, data)?.unbind();
        // A GPU's messages reach Python with a key of their own (see `hostfeed_core::gpu_device_key`).
        let device =
            if flags & hostfeed_core::FLAG_GPU == 0 { device } else { hostfeed_core::gpu_device_key(device) };
        Bound::new(
            py,
            PyMessage::py_new(py, consumer_id, device, flags, arrays, reply, run_id, None, Some(seq)),
        )
    }
}

/// The host payload of an eager tap's message: its consumer (a `Consumer`, registered
/// nowhere) and the arrays, made in Python.
pub struct EagerTap {
    pub entry: Py<PyAny>,
    pub arrays: Py<PyTuple>,
}

/// A message's operands as a tuple of numpy arrays viewing its buffer (which they keep
/// alive through one `MessageData` owner).
pub(crate) fn message_arrays<'py>(
    py: Python<'py>,
    dtypes: &Dtypes,
    arrays: &[ArrayMeta],
    dims: &[i64],
    data: HostBuffer,
) -> PyResult<Bound<'py, PyTuple>> {
    let owner = Bound::new(py, MessageData { buf: data })?;
    let base = owner.get().buf.as_ptr();
    let mut views = Vec::with_capacity(arrays.len());
    for a in arrays {
        let shape = &dims[a.dims_start..a.dims_start + a.rank];
        // SAFETY: `base + a.offset` starts `a.nbytes` bytes of the owner's buffer written by
        // the handler, exactly the size of an array of this dtype and shape; the owner
        // becomes the array's base object and keeps the bytes alive.
        views.push(unsafe { make_array(py, dtypes, &owner, base.add(a.offset), a.dtype, shape) }?);
    }
    PyTuple::new(py, views)
}

/// A numpy array viewing `data` (owned by `owner`) with the dtype registered for `code`.
///
/// # Safety
/// `data` must point at a C-contiguous array of `shape` elements of that dtype inside
/// `owner`'s buffer.
unsafe fn make_array<'py>(
    py: Python<'py>,
    dtypes: &Dtypes,
    owner: &Bound<'py, MessageData>,
    data: *const u8,
    code: i32,
    shape: &[i64],
) -> PyResult<Bound<'py, PyAny>> {
    let descr = usize::try_from(code)
        .ok()
        .and_then(|i| dtypes.descrs.get(i))
        .and_then(Option::as_ref)
        .ok_or_else(|| {
            ReceiverError::new_err(format!("hostfeed: no numpy dtype registered for XLA dtype code {code}"))
        })?;
    // Dimensions as numpy wants them, on the stack for the usual ranks.
    let mut inline = [0 as npy_intp; 8];
    let mut heap: Vec<npy_intp> = Vec::new();
    let dims: &mut [npy_intp] = if shape.len() <= inline.len() {
        for (d, &s) in inline.iter_mut().zip(shape) {
            *d = npy_intp::try_from(s).map_err(|_| ReceiverError::new_err("dimension too large"))?;
        }
        &mut inline[..shape.len()]
    } else {
        for &d in shape {
            heap.push(npy_intp::try_from(d).map_err(|_| ReceiverError::new_err("dimension too large"))?);
        }
        &mut heap
    };
    let rank = c_int::try_from(dims.len()).map_err(|_| ReceiverError::new_err("array rank too large"))?;
    // SAFETY: the numpy C API is initialised by `PY_ARRAY_API` on first use while attached;
    // `PyArray_NewFromDescr` steals the descriptor reference we pass (`into_ptr` hands one
    // over); `dims` holds `rank` entries; null strides mean C order; `data` is valid for
    // the array's bytes (caller contract). `PyArray_SetBaseObject` steals the reference to
    // the owner that `into_ptr` on a clone creates.
    unsafe {
        let arr = PY_ARRAY_API.PyArray_NewFromDescr(
            py,
            npyffi::get_type_object(py, npyffi::NpyTypes::PyArray_Type),
            descr.clone_ref(py).into_ptr().cast(),
            rank,
            dims.as_mut_ptr(),
            ptr::null_mut(),
            data.cast_mut().cast(),
            npyffi::NPY_ARRAY_WRITEABLE,
            ptr::null_mut(),
        );
        if arr.is_null() {
            return Err(PyErr::fetch(py));
        }
        let arr = Bound::from_owned_ptr(py, arr);
        if PY_ARRAY_API.PyArray_SetBaseObject(py, arr.as_ptr().cast(), owner.clone().into_ptr()) != 0 {
            return Err(PyErr::fetch(py));
        }
        Ok(arr)
    }
}

/// `results` as C-contiguous numpy arrays, or the error naming the first that is not.
pub(crate) fn as_result_arrays<'py>(
    results: &[Bound<'py, PyAny>],
) -> PyResult<Vec<Bound<'py, PyUntypedArray>>> {
    let mut arrays = Vec::with_capacity(results.len());
    for (i, r) in results.iter().enumerate() {
        let a = r
            .cast::<PyUntypedArray>()
            .map_err(|_| ReceiverError::new_err(format!("result {i} is not a numpy array")))?;
        if !a.is_c_contiguous() {
            return Err(ReceiverError::new_err(format!("result {i} is not C-contiguous")));
        }
        arrays.push(a.clone());
    }
    Ok(arrays)
}

/// Copies `arrays` (C-contiguous, checked) into the call's result buffers, checking their
/// number, shapes and sizes. Returns `False` if the call no longer waits; an error (the
/// call failed with it) if they do not fit.
pub(crate) fn send_results(slot: &ReplySlot, arrays: &[Bound<'_, PyUntypedArray>]) -> PyResult<bool> {
    let mut problem: Option<String> = None;
    let sent = slot.reply_with(|outs| {
        if outs.len() != arrays.len() {
            let m = format!("expected {} result arrays, got {}", outs.len(), arrays.len());
            problem = Some(m.clone());
            return Err(m);
        }
        for (i, (a, out)) in arrays.iter().zip(outs).enumerate() {
            let nbytes = a.len() * a.dtype().itemsize();
            let shape_ok = a.shape().len() == out.dims.len()
                && a.shape().iter().zip(&out.dims).all(|(&x, &y)| i64::try_from(x).is_ok_and(|x| x == y));
            if nbytes != out.nbytes || !shape_ok {
                let m = format!(
                    "result {i} has shape {:?} and {nbytes} bytes, expected dims {:?} and {} bytes",
                    a.shape(),
                    out.dims,
                    out.nbytes
                );
                problem = Some(m.clone());
                return Err(m);
            }
            if nbytes > 0 {
                // SAFETY: the array is C-contiguous with `nbytes` bytes of data; the
                // output buffer holds `out.nbytes == nbytes` bytes and stays alive while
                // the slot is pending (`reply_with` runs this under the slot lock);
                // numpy memory and XLA's buffer cannot overlap.
                unsafe {
                    let src = (*npyffi::_PyArray_GET_ITEM_DATA(a.as_array_ptr())).data.cast::<u8>();
                    std::ptr::copy_nonoverlapping(src, out.data, nbytes);
                }
            }
        }
        Ok(())
    });
    match problem {
        Some(m) => Err(ReceiverError::new_err(format!("hostfeed: bad call results: {m}"))),
        None => Ok(sent),
    }
}

/// The consumer's handle on a waiting `call`: send the results or an error, once.
#[pyclass(frozen, module = "hostfeed._receiver.messages")]
pub struct Reply {
    slot: Arc<ReplySlot>,
}

impl Reply {
    /// The handle on `slot`, which it fails if dropped unanswered.
    pub(crate) fn new(slot: Arc<ReplySlot>) -> Self {
        Reply { slot }
    }
}

#[pymethods]
impl Reply {
    /// Whether the call still waits (not replied, timed out or cancelled).
    #[getter]
    fn pending(&self) -> bool {
        self.slot.is_pending()
    }

    /// Copies `results` (C-contiguous numpy arrays of exactly the expected dtypes and
    /// shapes, in order) into the call's result buffers. Returns `False` if the call no
    /// longer waits.
    #[allow(clippy::needless_pass_by_value)] // PyO3 extracts the argument as an owned list
    fn send(&self, results: Vec<Bound<'_, PyAny>>) -> PyResult<bool> {
        send_results(&self.slot, &as_result_arrays(&results)?)
    }

    /// Fails the call with `message` (raised in the JAX caller). Returns `False` if the
    /// call no longer waits.
    fn fail(&self, message: String) -> bool {
        self.slot.fail(message)
    }
}

impl Drop for Reply {
    fn drop(&mut self) {
        // A reply object dropped without an answer must not leave the device waiting.
        self.slot.fail("hostfeed internal error: the host dropped a call without replying".into());
    }
}

// ---- Consumers ------------------------------------------------------------------------

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
