//! Ctrl-C and SIGTERM while a `call`'s host function runs on a device's thread (see
//! `PyConsumer::run_inline`). On the process's initial thread Python raises
//! `KeyboardInterrupt` in the host function itself. On another thread, the signal handler
//! (the core's) writes a byte to a pipe, and a watcher thread reading it raises
//! `KeyboardInterrupt` (SIGINT) or `SystemExit` (SIGTERM) in the host function, at its
//! next Python instruction. Either way the call then fails as an interrupted wait does.
//! A run is the host function's own call, nothing of hostfeed's around it; its start and
//! end and the raising happen with the GIL held, so an exception is never raised in a
//! thread once its run ended (one raised too late to be seen is withdrawn).

use std::ffi::c_ulong;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use hostfeed_core::lock;

/// The run in progress on a thread other than the initial one: its Python ident and
/// the signal counts at its start.
static RUN: Mutex<Option<(c_ulong, [u64; 2])>> = Mutex::new(None);
/// Whether the watcher raised an exception in the run in progress.
static RAISED: AtomicBool = AtomicBool::new(false);
/// The process whose watcher runs (after a fork, the child starts its own).
static WATCHER: Mutex<Option<u32>> = Mutex::new(None);

/// Starts the watcher once per process; `false` if it cannot run (no pipe or thread).
pub(crate) fn watch() -> bool {
    let mut w = lock(&WATCHER);
    let pid = std::process::id();
    if *w == Some(pid) {
        return true;
    }
    if !hostfeed_core::open_wake_pipe()
        || std::thread::Builder::new().name("hostfeed-interrupt".into()).spawn(run_watcher).is_err()
    {
        return false;
    }
    *w = Some(pid);
    true
}

fn run_watcher() {
    while hostfeed_core::wait_for_signal() {
        let Some((_, counts)) = *lock(&RUN) else { continue };
        if hostfeed_core::signalled_since(counts).is_none() {
            continue;
        }
        // SAFETY: a plain query of the interpreter's state.
        if unsafe { pyo3::ffi::Py_IsInitialized() } == 0 {
            return;
        }
        pyo3::Python::attach(|_py| {
            // Again with the GIL held: the run may have ended meanwhile.
            let Some((ident, counts)) = *lock(&RUN) else { return };
            let Some(why) = hostfeed_core::signalled_since(counts) else { return };
            if RAISED.swap(true, Ordering::AcqRel) {
                return;
            }
            // SAFETY: the GIL is held; `ident` is the thread running the host function
            // now (the run ends only with the GIL held); the exception types are
            // CPython's static objects.
            unsafe {
                let exc = if why.starts_with("KeyboardInterrupt") {
                    pyo3::ffi::PyExc_KeyboardInterrupt
                } else {
                    pyo3::ffi::PyExc_SystemExit
                };
                pyo3::ffi::PyThreadState_SetAsyncExc(as_c_long(ident), exc);
            }
            hostfeed_core::hub().note_interrupted(why);
        });
    }
}

/// A thread ident as the `long` that `PyO3` declares `PyThreadState_SetAsyncExc` to take
/// (`CPython`'s is an `unsigned long`: the same bits).
fn as_c_long(ident: c_ulong) -> std::ffi::c_long {
    std::ffi::c_long::from_ne_bytes(ident.to_ne_bytes())
}

/// A run starts on this thread (with the GIL held); returns the signal counts, for
/// [`interrupted`].
pub(crate) fn begin_run() -> [u64; 2] {
    let counts = hostfeed_core::signal_counts();
    if !hostfeed_core::on_initial_thread() {
        // SAFETY: the GIL is held.
        let ident = unsafe { pyo3::ffi::PyThread_get_thread_ident() };
        *lock(&RUN) = Some((ident, counts));
    }
    counts
}

/// The run on this thread ended (with the GIL held): an exception raised for it and not
/// delivered yet is withdrawn.
pub(crate) fn end_run() {
    let ident = lock(&RUN).take().map(|(ident, _)| ident);
    if let (Some(ident), true) = (ident, RAISED.swap(false, Ordering::AcqRel)) {
        // SAFETY: the GIL is held; a null exception clears the thread's pending one.
        unsafe { pyo3::ffi::PyThreadState_SetAsyncExc(as_c_long(ident), std::ptr::null_mut()) };
    }
}

/// Whether `err`, raised by a host function whose run began with `counts`, is the
/// interruption of a watched signal that came since (a `KeyboardInterrupt` or
/// `SystemExit`, raised by Python on the initial thread or by the watcher elsewhere).
pub(crate) fn interrupted(py: pyo3::Python<'_>, err: &pyo3::PyErr, counts: [u64; 2]) -> bool {
    hostfeed_core::signalled_since(counts).is_some()
        && (err.is_instance_of::<pyo3::exceptions::PyKeyboardInterrupt>(py)
            || err.is_instance_of::<pyo3::exceptions::PySystemExit>(py))
}
