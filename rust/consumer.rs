//! The receiver: the process-wide queue, the consumer thread that takes the GIL and hands
//! batches of messages to the Python dispatcher, and its start/stop/barrier protocol.
//!
//! Lifecycle: Python configures the receiver (dispatcher + dtype table) and starts it. A
//! handler that finds no consumer running (after `stop_outfeed_receiver`, say) restarts it
//! from the stored configuration, so compiled code never strands messages. `finalize`
//! (at interpreter exit) drains, joins and closes the queue for good.

use std::cell::Cell;
use std::collections::HashMap;
use std::ffi::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use numpy::npyffi::{self, npy_intp, PY_ARRAY_API};
use numpy::{PyArrayDescr, PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};

use crate::copy::{HostBuffer, Message};
use crate::error::{Error, ReceiverError};
use crate::queue::{PushError, Queue};
use crate::reply::ReplySlot;

/// Default byte bound, as in the legacy module (`256e6`).
pub const DEFAULT_MAX_QUEUE_BYTES: usize = 256_000_000;
/// Most messages handed to Python per GIL acquisition.
pub const MAX_BATCH: usize = 1024;
/// How long an idle consumer polls before sleeping (see `Queue::with_spin`).
const CONSUMER_SPIN: Duration = Duration::from_micros(200);
/// Longest single wait with the GIL released before re-checking signals.
const WAIT_SLICE: Duration = Duration::from_millis(100);

thread_local! {
    static IS_CONSUMER: Cell<bool> = const { Cell::new(false) };
}

/// Failure messages of `call`s that report through a status result, by ticket.
static FAILURES: Mutex<Vec<(i32, String)>> = Mutex::new(Vec::new());
static NEXT_FAILURE: AtomicU64 = AtomicU64::new(0);
/// Failure messages kept for `hostfeed_check` to find.
const KEPT_FAILURES: usize = 256;

/// Records a `call` failure and returns its ticket (a positive `i32`).
pub fn record_failure(message: String) -> i32 {
    let n = NEXT_FAILURE.fetch_add(1, Ordering::Relaxed);
    let ticket = i32::try_from(n % (i32::MAX as u64 - 1)).unwrap_or(0) + 1;
    let mut failures = lock(&FAILURES);
    if failures.len() >= KEPT_FAILURES {
        failures.remove(0);
    }
    failures.push((ticket, message));
    ticket
}

/// The message recorded under `ticket`.
#[must_use]
pub fn failure_message(ticket: i32) -> String {
    lock(&FAILURES)
        .iter()
        .rev()
        .find(|(t, _)| *t == ticket)
        .map_or_else(|| format!("hostfeed: a host call failed (ticket {ticket})"), |(_, m)| m.clone())
}

/// Whether the calling thread is the consumer thread (i.e. inside a host callback).
#[must_use]
pub fn in_consumer_thread() -> bool {
    IS_CONSUMER.with(Cell::get)
}

/// What the consumer needs from Python: the dispatcher and numpy dtypes per XLA code.
pub struct DispatchConfig {
    pub dispatcher: Py<PyAny>,
    /// Indexed by `XLA_FFI_DataType` code.
    pub descrs: Vec<Option<Py<PyArrayDescr>>>,
}

#[derive(Default)]
struct Control {
    thread: Option<JoinHandle<()>>,
    config: Option<Arc<DispatchConfig>>,
}

/// The process-wide receiver.
pub struct Receiver {
    pub queue: Queue<Message>,
    control: Mutex<Control>,
    finalized: AtomicBool,
    dispatcher_error: Mutex<Option<PyErr>>,
    /// `call` handlers waiting for a reply, so that `stop` can fail them.
    pending_calls: Mutex<HashMap<u64, Arc<ReplySlot>>>,
    next_ticket: AtomicU64,
    /// Bumped when a stuck consumer is abandoned; a consumer exits when it sees a newer one.
    generation: AtomicU64,
}

static RECEIVER: OnceLock<Receiver> = OnceLock::new();

/// The process-wide receiver (created on first use, not started).
pub fn global() -> &'static Receiver {
    RECEIVER.get_or_init(|| Receiver::new(DEFAULT_MAX_QUEUE_BYTES))
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Only this module's own code runs under these locks; a panic there leaves the state
    // consistent (fields are replaced whole), so recover the guard rather than poison
    // every later call.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Owner of a message's bytes on the Python side; numpy arrays use it as their base.
#[pyclass(frozen, module = "hostfeed._receiver")]
pub struct MessageData {
    buf: HostBuffer,
}

impl Receiver {
    fn new(bound: usize) -> Self {
        Receiver {
            queue: Queue::new(bound).with_spin(CONSUMER_SPIN),
            control: Mutex::new(Control::default()),
            finalized: AtomicBool::new(false),
            dispatcher_error: Mutex::new(None),
            pending_calls: Mutex::new(HashMap::new()),
            next_ticket: AtomicU64::new(0),
            generation: AtomicU64::new(0),
        }
    }

    /// Records a waiting `call` handler; returns the ticket for `deregister_call`.
    pub fn register_call(&self, slot: Arc<ReplySlot>) -> u64 {
        let ticket = self.next_ticket.fetch_add(1, Ordering::Relaxed);
        lock(&self.pending_calls).insert(ticket, slot);
        ticket
    }

    /// Forgets a `call` handler that stopped waiting.
    pub fn deregister_call(&self, ticket: u64) {
        lock(&self.pending_calls).remove(&ticket);
    }

    /// Fails every waiting `call` with `message`; returns how many were failed.
    pub fn cancel_pending_calls(&self, message: &str) -> usize {
        let slots: Vec<Arc<ReplySlot>> = lock(&self.pending_calls).values().cloned().collect();
        slots.iter().filter(|s| s.fail(message.to_string())).count()
    }

    /// Installs the dispatcher configuration used by current and future consumer threads.
    ///
    /// Like every method that takes the control lock, call it detached from Python: a
    /// `stop` holds that lock while waiting for a consumer that needs the GIL.
    pub fn configure(&self, config: DispatchConfig) {
        lock(&self.control).config = Some(Arc::new(config));
    }

    /// Whether a consumer thread is running.
    pub fn is_running(&self) -> bool {
        lock(&self.control).thread.is_some()
    }

    /// Starts the consumer thread if it is not running. Returns whether it started one.
    ///
    /// # Errors
    /// [`Error::Closed`] after `finalize`, [`Error::NotConfigured`] before `configure`.
    pub fn start(&self) -> Result<bool, Error> {
        let mut control = lock(&self.control);
        self.start_locked(&mut control)
    }

    fn start_locked(&self, control: &mut Control) -> Result<bool, Error> {
        if self.finalized.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        if let Some(handle) = &control.thread {
            if !handle.is_finished() {
                return Ok(false);
            }
            // The thread ended on its own (it only does after a panic): replace it.
            if let Some(handle) = control.thread.take() {
                let _ = handle.join();
            }
        }
        let config = control.config.clone().ok_or(Error::NotConfigured)?;
        self.queue.clear_stop();
        let generation = self.generation.load(Ordering::Acquire);
        let handle = std::thread::Builder::new()
            .name("hostfeed-consumer".into())
            .spawn(move || consumer_main(&config, generation))
            .map_err(|e| Error::Internal(format!("cannot spawn the consumer thread: {e}")))?;
        control.thread = Some(handle);
        Ok(true)
    }

    /// Enqueues a message from a handler (no GIL), starting the consumer if none runs.
    ///
    /// # Errors
    /// [`Error::Closed`] after `finalize`; start errors.
    pub fn push(&self, msg: Message) -> Result<(), Error> {
        let bytes = msg.charged_bytes();
        let mut msg = msg;
        // A tap issued from inside a host callback runs on the consumer thread: waiting for
        // the consumer to make space would wait for ourselves.
        let on_consumer = in_consumer_thread();
        loop {
            let pushed = if on_consumer {
                self.queue.push_over_bound(msg, bytes)
            } else {
                self.queue.push(msg, bytes)
            };
            match pushed {
                Ok(pushed) => {
                    if !pushed.consumer_active {
                        self.start()?;
                    }
                    return Ok(());
                }
                Err(PushError::Closed(_)) => return Err(Error::Closed),
                Err(PushError::NoConsumer(m)) => {
                    // The message must wait for space, and nobody would make space.
                    self.start()?;
                    msg = m;
                }
            }
        }
    }

    /// Drains the queue, then stops and joins the consumer thread. The GIL is released
    /// while waiting.
    ///
    /// If the consumer makes no progress for `stall` (a host callback that never returns),
    /// every waiting `call` is failed, the stuck thread is abandoned (it exits if its
    /// callback ever returns) and `stop` returns `Ok(false)`; otherwise `Ok(true)`.
    ///
    /// # Errors
    /// [`Error::InsideCallback`] when called from a host callback.
    pub fn stop(&self, py: Python<'_>, stall: Duration) -> Result<bool, Error> {
        if in_consumer_thread() {
            return Err(Error::InsideCallback("stop_outfeed_receiver"));
        }
        // Hold the control lock through the join so that a handler that needs a consumer
        // waits for this stop to finish and then starts a fresh one.
        py.detach(|| {
            let mut control = lock(&self.control);
            let Some(handle) = control.thread.take() else { return Ok(true) };
            self.queue.request_stop();
            let mut last = (self.queue.processed(), Instant::now());
            while !handle.is_finished() {
                let processed = self.queue.processed();
                if processed != last.0 {
                    last = (processed, Instant::now());
                } else if last.1.elapsed() >= stall {
                    let failed = self.cancel_pending_calls(&format!(
                        "hostfeed: stop_outfeed_receiver gave up on a host callback that made \
                         no progress for {:.1} s; this call was failed instead of waiting \
                         forever",
                        stall.as_secs_f64()
                    ));
                    self.generation.fetch_add(1, Ordering::AcqRel);
                    eprintln!(
                        "hostfeed: a host callback has been running for over {:.1} s; \
                         abandoning the receiver thread ({failed} waiting call(s) failed)",
                        stall.as_secs_f64()
                    );
                    return Ok(false);
                }
                self.queue.wait_processed(processed + 1, Duration::from_millis(20));
            }
            handle.join().map_err(|_| Error::Internal("the consumer thread panicked".into()))?;
            Ok(true)
        })
    }

    /// Stops the receiver and refuses all later messages (interpreter exit).
    ///
    /// # Errors
    /// As [`Receiver::stop`].
    pub fn finalize(&self, py: Python<'_>, stall: Duration) -> Result<(), Error> {
        self.stop(py, stall)?;
        let (config, leftovers) = py.detach(|| {
            let mut control = lock(&self.control);
            self.finalized.store(true, Ordering::Release);
            self.cancel_pending_calls("hostfeed: the receiver shut down (interpreter exit)");
            (control.config.take(), self.queue.close())
        });
        // Drop Python objects while attached.
        drop(config);
        drop(leftovers);
        Ok(())
    }

    /// Waits until every message enqueued before this call has been processed, with the
    /// GIL released (in slices, so Ctrl-C works). `timeout` of `None` waits indefinitely.
    ///
    /// # Errors
    /// [`Error::InsideCallback`] from a host callback, [`Error::Timeout`], a pending
    /// dispatcher error, or a signal's `KeyboardInterrupt`.
    pub fn barrier(&self, py: Python<'_>, timeout: Option<Duration>) -> Result<(), Error> {
        if in_consumer_thread() {
            return Err(Error::InsideCallback("barrier_wait"));
        }
        let target = self.queue.enqueued();
        let start = Instant::now();
        if self.queue.processed() < target && !self.finalized.load(Ordering::Acquire) {
            // Messages are pending; make sure someone will process them. (Detached: the
            // control lock may be held by a `stop` that waits for the GIL-needing consumer.)
            py.detach(|| self.start())?;
        }
        loop {
            let slice = match timeout {
                Some(t) => {
                    let left = t.saturating_sub(start.elapsed());
                    if left.is_zero() {
                        return Err(Error::Timeout {
                            what: "barrier_wait",
                            seconds: t.as_secs_f64(),
                            pending: target.saturating_sub(self.queue.processed()),
                        });
                    }
                    left.min(WAIT_SLICE)
                }
                None => WAIT_SLICE,
            };
            if py.detach(|| self.queue.wait_processed(target, slice)) {
                break;
            }
            py.check_signals().map_err(Error::Python)?;
        }
        match lock(&self.dispatcher_error).take() {
            Some(e) => Err(Error::Python(e)),
            None => Ok(()),
        }
    }

    fn record_dispatcher_error(&self, py: Python<'_>, err: PyErr) {
        err.display(py);
        *lock(&self.dispatcher_error) = Some(err);
    }
}

/// Marks the consumer as gone when its thread ends, however it ends (unless it was
/// abandoned by `stop`, in which case a newer consumer may be running).
struct ExitGuard(&'static Receiver, u64);

impl Drop for ExitGuard {
    fn drop(&mut self) {
        if self.0.generation.load(Ordering::Acquire) == self.1 {
            self.0.queue.consumer_exited();
        }
    }
}

fn consumer_main(config: &Arc<DispatchConfig>, generation: u64) {
    IS_CONSUMER.with(|c| c.set(true));
    let receiver = global();
    let _guard = ExitGuard(receiver, generation);
    let mut batch: Vec<(usize, Message)> = Vec::with_capacity(MAX_BATCH);
    // Attach once for the thread's life and detach around each wait: re-attaching a
    // detached thread is cheap, while attaching from scratch creates and destroys a
    // Python thread state every time.
    Python::attach(|py| {
        while receiver.generation.load(Ordering::Acquire) == generation
            && py.detach(|| receiver.queue.pop_batch(MAX_BATCH, &mut batch))
        {
            let count = batch.len() as u64;
            let bytes: usize = batch.iter().map(|(b, _)| *b).sum();
            let outcome = catch_unwind(AssertUnwindSafe(|| dispatch(py, config, &mut batch)));
            match outcome {
                Ok(Ok(())) => {}
                Ok(Err(e)) => receiver.record_dispatcher_error(py, e),
                Err(_) => receiver.record_dispatcher_error(
                    py,
                    ReceiverError::new_err("hostfeed internal error: a panic while dispatching"),
                ),
            }
            // Drop whatever was not handed over (after an error) while attached.
            batch.clear();
            receiver.queue.complete(count, bytes);
        }
    });
}

/// Hands a batch to the Python dispatcher as
/// `[(consumer_id, device, flags, arrays, reply_or_None, run_id), ...]`.
fn dispatch(
    py: Python<'_>,
    config: &DispatchConfig,
    batch: &mut Vec<(usize, Message)>,
) -> PyResult<()> {
    let items = PyList::empty(py);
    for (_, msg) in batch.drain(..) {
        let Message { consumer_id, flags, device, arrays, dims, data, reply, run_id } = msg;
        let owner = Bound::new(py, MessageData { buf: data })?;
        let base = owner.get().buf.as_ptr();
        let mut views = Vec::with_capacity(arrays.len());
        for a in &arrays {
            let shape = &dims[a.dims_start..a.dims_start + a.rank];
            // SAFETY: `base + a.offset` starts `a.nbytes` bytes of the owner's buffer written
            // by the handler, exactly the size of an array of this dtype and shape; the
            // owner becomes the array's base object and keeps the bytes alive.
            views.push(unsafe { make_array(py, config, &owner, base.add(a.offset), a.dtype, shape) }?);
        }
        let arrays = PyTuple::new(py, views)?;
        let reply = reply.map(|slot| Reply { slot }).map(|r| Bound::new(py, r)).transpose()?;
        items.append((consumer_id, device, flags, arrays, reply, run_id))?;
    }
    config.dispatcher.call1(py, (items,))?;
    Ok(())
}

/// A numpy array viewing `data` (owned by `owner`) with the dtype registered for `code`.
///
/// # Safety
/// `data` must point at a C-contiguous array of `shape` elements of that dtype inside
/// `owner`'s buffer.
unsafe fn make_array<'py>(
    py: Python<'py>,
    config: &DispatchConfig,
    owner: &Bound<'py, MessageData>,
    data: *const u8,
    code: i32,
    shape: &[i64],
) -> PyResult<Bound<'py, PyAny>> {
    let descr = usize::try_from(code)
        .ok()
        .and_then(|i| config.descrs.get(i))
        .and_then(Option::as_ref)
        .ok_or_else(|| {
            ReceiverError::new_err(format!(
                "hostfeed: no numpy dtype registered for XLA dtype code {code}"
            ))
        })?;
    // Dimensions as numpy wants them, on the stack for the usual ranks.
    let mut inline = [0 as npy_intp; 8];
    let mut heap: Vec<npy_intp> = Vec::new();
    let dims: &mut [npy_intp] = if shape.len() <= inline.len() {
        for (d, &s) in inline.iter_mut().zip(shape) {
            *d = s as npy_intp;
        }
        &mut inline[..shape.len()]
    } else {
        heap.extend(shape.iter().map(|&d| d as npy_intp));
        &mut heap
    };
    let rank = c_int::try_from(dims.len())
        .map_err(|_| ReceiverError::new_err("array rank too large"))?;
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
    fn send(&self, results: Vec<Bound<'_, PyAny>>) -> PyResult<bool> {
        let mut arrays = Vec::with_capacity(results.len());
        for (i, r) in results.iter().enumerate() {
            let a = r.cast::<PyUntypedArray>().map_err(|_| {
                ReceiverError::new_err(format!("result {i} is not a numpy array"))
            })?;
            if !a.is_c_contiguous() {
                return Err(ReceiverError::new_err(format!("result {i} is not C-contiguous")));
            }
            arrays.push(a.clone());
        }
        let mut problem: Option<String> = None;
        let sent = self.slot.reply_with(|outs| {
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
