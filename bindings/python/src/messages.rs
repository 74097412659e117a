//! Messages as Python objects: a batch as an iterator of
//! `(consumer_id, device, flags, arrays, reply_or_None, run_id)` tuples, arrays as numpy
//! views of the message buffer (no second copy), and the `Reply` handle of a `call`.
//!
//! Only the consumer thread, attached to Python, uses this module; it never waits.

use std::ffi::c_int;
use std::ptr;
use std::sync::Arc;

use numpy::npyffi::{self, npy_intp, PY_ARRAY_API};
use numpy::{PyArrayDescr, PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::exceptions::PyStopIteration;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use crate::error::ReceiverError;
use hostfeed_core::Batch;
use hostfeed_core::HostBuffer;
use hostfeed_core::{sinks, ReplySlot};
use hostfeed_core::{ArrayMeta, Message};

/// Adds the message classes and the `FLAG_*` bits a message carries to `m`.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<MessageData>()?;
    m.add_class::<BatchIter>()?;
    m.add_class::<Reply>()?;
    m.add_class::<DirectCall>()?;
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
#[pyclass(frozen, module = "hostfeed._receiver")]
pub struct MessageData {
    buf: HostBuffer,
}

/// One batch of messages, handed to the Python dispatcher as an iterator. Messages are
/// taken from the receiver one at a time, as the dispatcher gets to them.
#[pyclass(module = "hostfeed._receiver")]
pub struct BatchIter {
    batch: Option<Batch>,
    dtypes: Arc<Dtypes>,
}

impl BatchIter {
    /// Wraps `batch` for the dispatcher.
    #[must_use]
    pub fn new(batch: Batch, dtypes: Arc<Dtypes>) -> Self {
        BatchIter { batch: Some(batch), dtypes }
    }

    /// Takes the batch back (to end it); later iteration stops.
    pub fn finish(&mut self) -> Option<Batch> {
        self.batch.take()
    }

    /// Messages of the batch the dispatcher has not taken yet.
    #[must_use]
    pub fn remaining(&self) -> usize {
        self.batch.as_ref().map_or(0, Batch::remaining)
    }
}

#[pymethods]
impl BatchIter {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// Runs the plain taps and calls at the head of the batch here, in queue order, and
    /// returns how many ran: while the next message is a tap without flags or reply whose
    /// consumer (looked up in ``consumers``, a dict by consumer id) has ``kind == "tap"``,
    /// calls ``consumer.invoke(arrays, device)``; an exception it raises goes to
    /// ``failed(exception, consumer)`` and the next message runs. With ``call_failed``,
    /// a call (a reply, no flags but a status output) whose consumer has
    /// ``kind == "call"`` runs the same way, as ``consumer.invoke(arrays, device, reply)``
    /// (true when it failed); a failed call, one that nobody waits for any more (not
    /// run) and one whose ``invoke`` raised go to ``call_failed(exception_or_None,
    /// consumer, run_id, device, reply)``. Stops, without taking it, at the first message
    /// that is not such a tap or call (the dispatcher's general path takes it), or at the
    /// end of the batch.
    ///
    /// The dispatcher's common case without a Python frame per message: a batch of small
    /// taps, or a call a computation waits for, spends most of its time here.
    #[pyo3(signature = (consumers, failed, call_failed=None))]
    fn run_taps(
        &self,
        py: Python<'_>,
        consumers: &Bound<'_, PyDict>,
        failed: &Bound<'_, PyAny>,
        call_failed: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<usize> {
        let Some(batch) = self.batch.as_ref() else { return Ok(0) };
        let (kind_tap, kind_call) = (intern!(py, "tap"), intern!(py, "call"));
        // The consumer of the last message run (whether it is a call's, the consumer and
        // its invoke): consecutive messages mostly share one.
        let mut last: Option<LastConsumer<'_>> = None;
        let mut ran = 0;
        loop {
            sinks().route_leading(batch);
            let mut unknown = None;
            let msg = batch.take_if(|m| {
                let tap = m.flags == 0 && m.reply.is_none();
                let call = call_failed.is_some()
                    && m.flags & !hostfeed_core::FLAG_STATUS_OUTPUT == 0
                    && m.reply.is_some();
                if m.host.is_some() || !(tap || call) {
                    return false;
                }
                if let Some((cid, is_call, ..)) = last.as_ref() {
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
                let Some(consumer) = consumers.get_item(cid)? else { return Ok(ran) };
                let kind = consumer.getattr(intern!(py, "kind"))?;
                let is_call = if kind.eq(kind_tap)? {
                    false
                } else if call_failed.is_some() && kind.eq(kind_call)? {
                    true
                } else {
                    return Ok(ran);
                };
                let invoke = consumer.getattr(intern!(py, "invoke"))?;
                let direct = if is_call { direct_of(py, &consumer)? } else { None };
                last = Some((cid, is_call, consumer, invoke, direct));
                continue;
            };
            let Some((_, _, consumer, invoke, direct)) = last.as_ref() else {
                unreachable!("accepted a known consumer")
            };
            if let (true, Some(call_failed)) = (msg.reply.is_some(), call_failed) {
                run_call(py, &self.dtypes, msg, consumer, invoke, direct.as_ref(), call_failed)?;
            } else {
                let Message { device, arrays, dims, data, .. } = msg;
                let arrays = message_arrays(py, &self.dtypes, &arrays, &dims, data)?;
                if let Err(e) = invoke.call1((arrays, device)) {
                    failed.call1((e.into_value(py), consumer))?;
                }
            }
            ran += 1;
        }
    }

    fn __next__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        // Messages for recorders met on the way are routed in Rust, in queue order.
        let msg = self.batch.as_ref().and_then(|b| {
            sinks().route_leading(b);
            b.take()
        });
        match msg {
            Some(m) => message_tuple(py, &self.dtypes, m),
            None => Err(PyStopIteration::new_err(())),
        }
    }
}

/// The consumer of the last message `run_taps` ran: its id, whether it is a call's, the
/// consumer, its `invoke` and its `direct`.
type LastConsumer<'py> = (i64, bool, Bound<'py, PyAny>, Bound<'py, PyAny>, Option<Bound<'py, DirectCall>>);

/// A call consumer's `direct` (a [`DirectCall`], or `None`).
pub(crate) fn direct_of<'py>(
    py: Python<'py>,
    consumer: &Bound<'py, PyAny>,
) -> PyResult<Option<Bound<'py, DirectCall>>> {
    let direct = consumer.getattr(intern!(py, "direct"))?;
    Ok(direct.cast_into::<DirectCall>().ok())
}

/// Runs a plain `call` message (it has a reply slot): with its consumer's [`DirectCall`]
/// when it has one, else with its `invoke`. The results are sent to the reply, or the
/// failure goes to `call_failed` (the dispatcher's `_call_failed`). Used by
/// [`BatchIter::run_taps`] on the consumer thread and by a call run on its device's thread.
pub(crate) fn run_call(
    py: Python<'_>,
    dtypes: &Dtypes,
    msg: Message,
    consumer: &Bound<'_, PyAny>,
    invoke: &Bound<'_, PyAny>,
    direct: Option<&Bound<'_, DirectCall>>,
    call_failed: &Bound<'_, PyAny>,
) -> PyResult<()> {
    let Message { device, arrays, dims, data, reply, run_id, .. } = msg;
    let Some(slot) = reply else {
        return Err(ReceiverError::new_err("hostfeed internal error: a call without a reply"));
    };
    // The reply first: if building the arrays fails, dropping it fails the call.
    slot.mark_started();
    let pending = slot.is_pending();
    if let (Some(direct), true) = (direct, pending) {
        let arrays = message_arrays(py, dtypes, &arrays, &dims, data);
        let arrays = match arrays {
            Ok(a) => a,
            Err(e) => {
                let reply = Bound::new(py, Reply { slot })?;
                call_failed.call1((e.into_value(py), consumer, run_id, device, reply))?;
                return Ok(());
            }
        };
        if direct.get().run(py, &slot, arrays)? {
            return Ok(());
        }
        let reply = Bound::new(py, Reply { slot })?;
        call_failed.call1((py.None(), consumer, run_id, device, reply))?;
        return Ok(());
    }
    let reply = Bound::new(py, Reply { slot })?;
    let arrays = message_arrays(py, dtypes, &arrays, &dims, data)?;
    // A call nobody waits for any more (timed out, cancelled) is not run.
    let outcome = if pending { invoke.call1((arrays, device, &reply)) } else { Ok(py.None().into_bound(py)) };
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

/// A `call`'s host function as the receiver runs it without hostfeed's Python frames
/// around it (made by `runtime.make_direct_call`): the argument is the one array or the
/// tree made of the arrays; one result of exactly the expected shape and dtype, a
/// C-contiguous numpy array, is copied straight into the call's results; an exception
/// and any other results go to the Python parts that `invoke` uses too, so that errors
/// and records are the same.
#[pyclass(frozen, module = "hostfeed._receiver")]
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

/// `results` as C-contiguous numpy arrays, or the error naming the first that is not.
fn as_result_arrays<'py>(results: &[Bound<'py, PyAny>]) -> PyResult<Vec<Bound<'py, PyUntypedArray>>> {
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
fn send_results(slot: &ReplySlot, arrays: &[Bound<'_, PyUntypedArray>]) -> PyResult<bool> {
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

/// The host payload of an eager tap's message: the dispatcher entry (standing in for a
/// consumer) and the arrays, made in Python.
pub struct EagerTap {
    pub entry: Py<PyAny>,
    pub arrays: Py<PyTuple>,
}

/// `(consumer_id, device, flags, arrays, reply_or_None, run_id)` for one message; for an
/// eager tap `(entry, device, flags, arrays, None, 0)`.
fn message_tuple<'py>(py: Python<'py>, dtypes: &Dtypes, msg: Message) -> PyResult<Bound<'py, PyTuple>> {
    let Message { consumer_id, flags, device, arrays, dims, data, reply, run_id, host, .. } = msg;
    if let Some(host) = host {
        let eager = host
            .downcast::<EagerTap>()
            .map_err(|_| ReceiverError::new_err("hostfeed internal error: unknown host message"))?;
        let EagerTap { entry, arrays } = *eager;
        return (entry, device, flags, arrays, py.None(), 0i64).into_pyobject(py);
    }
    // The reply first: if building the arrays fails, dropping it fails the call.
    let reply = reply
        .map(|slot| {
            slot.mark_started();
            Bound::new(py, Reply { slot })
        })
        .transpose()?;
    let arrays = message_arrays(py, dtypes, &arrays, &dims, data)?;
    // A GPU's messages reach Python with a key of their own (see `hostfeed_core::gpu_device_key`).
    let device =
        if flags & hostfeed_core::FLAG_GPU == 0 { device } else { hostfeed_core::gpu_device_key(device) };
    (consumer_id, device, flags, arrays, reply, run_id).into_pyobject(py)
}

/// A message's operands as a tuple of numpy arrays viewing its buffer (which they keep
/// alive through one `MessageData` owner).
fn message_arrays<'py>(
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

/// The consumer's handle on a waiting `call`: send the results or an error, once.
#[pyclass(frozen, module = "hostfeed._receiver")]
pub struct Reply {
    slot: Arc<ReplySlot>,
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
