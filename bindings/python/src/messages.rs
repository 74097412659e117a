//! Messages as Python objects: each message the dispatcher takes is a [`PyMessage`] with
//! named fields, its arrays numpy views of the message buffer (no second copy), a `call`'s
//! with the [`Reply`] handle its host function answers.
//!
//! Only the consumer thread, attached to Python, makes these; nothing here waits.

use std::ffi::c_int;
use std::ptr;
use std::sync::Arc;

use numpy::npyffi::{self, npy_intp, PY_ARRAY_API};
use numpy::{PyArrayDescr, PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyInt, PyTuple};

use crate::error::ReceiverError;
use hostfeed_core::HostBuffer;
use hostfeed_core::ReplySlot;
use hostfeed_core::{ArrayMeta, Message};

/// Adds the message classes and the `FLAG_*` bits a message carries to `m`.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
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
