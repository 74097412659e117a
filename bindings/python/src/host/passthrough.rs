//! The receiver's settings and counters as Python functions (each a thin call into the
//! core, none waits), and the conversions the binding's modules share (`duration`,
//! `dict_of`).

use std::time::Duration;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use hostfeed_core::dtype;
use hostfeed_core::hub;

/// Adds the receiver's constants, settings and counters to `m`.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("DEFAULT_MAX_QUEUE_BYTES", hostfeed_core::DEFAULT_MAX_QUEUE_BYTES)?;
    m.add("DEFAULT_STOP_TIMEOUT", hostfeed_core::DEFAULT_STOP_TIMEOUT.as_secs_f64())?;
    m.add("DEFAULT_BUFFER_POOL_BYTES", hostfeed_core::DEFAULT_POOL_BYTES)?;
    m.add("DEFAULT_CPU_SHARE_STEP_BYTES", hostfeed_core::CPU_SHARE_STEP_BYTES)?;
    m.add("DEFAULT_CPU_SHARE_STREAM_BYTES", hostfeed_core::CPU_SHARE_STREAM_BYTES)?;
    m.add("DTYPE_CODES", dtype_codes(py)?)?;
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
    m.add_function(wrap_pyfunction!(set_cpu_share_step_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(set_cpu_share_stream_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(set_buffer_pool_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(set_consumer_name, m)?)?;
    m.add_function(wrap_pyfunction!(install_interrupt_watch, m)?)?;
    Ok(())
}

/// Longest timeout accepted (about 31 years); longer is spelled `None` (no limit).
const MAX_SECONDS: f64 = 1e9;

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

/// Sets the bytes queued for the receiver thread from which a device's thread that shares
/// its CPU with it yields that CPU after a tap, so that the tap functions run while their
/// bytes are in the cache (`DEFAULT_CPU_SHARE_STEP_BYTES` by default; 0: never yield, the
/// device's thread runs on). Returns the previous threshold.
#[pyfunction]
pub fn set_cpu_share_step_bytes(bytes: usize) -> usize {
    hostfeed_core::set_cpu_share_step_bytes(bytes)
}

/// Sets the size from which a device's thread that runs apart from the receiver thread copies
/// a tap's operand with non-temporal stores, which do not fetch the buffer's lines from
/// the receiver's core first, but send the bytes to memory, where a tap function reads them
/// back (0, never, by default; `DEFAULT_CPU_SHARE_STREAM_BYTES` the size to turn it on with).
/// Returns the previous threshold.
#[pyfunction]
pub fn set_cpu_share_stream_bytes(bytes: usize) -> usize {
    hostfeed_core::set_cpu_share_stream_bytes(bytes)
}

/// Sets the most bytes of host buffers kept for reuse when idle.
#[pyfunction]
pub fn set_buffer_pool_bytes(bytes: usize) {
    hostfeed_core::set_pool_limit(bytes);
}

/// Holds back the message of sequence number `seq` (`Message.seq`; None: a message made
/// in Python, which no barrier waits for) that the dispatcher keeps for a joined tap:
/// barriers wait until `let_go` says it ran; its `bytes` count against the bound
/// meanwhile (never waits; see `Queue::hold_back`).
#[pyfunction]
#[pyo3(signature = (seq, bytes))]
pub fn hold_back(seq: Option<u64>, bytes: usize) {
    hub().queue.hold_back(seq, bytes);
}

/// Ends a hold of `hold_back` once its message ran, freeing the `bytes` it charged.
#[pyfunction]
#[pyo3(signature = (seq, bytes))]
pub fn let_go(seq: Option<u64>, bytes: usize) {
    hub().queue.let_go(seq, bytes);
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
