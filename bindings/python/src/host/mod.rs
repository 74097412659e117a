//! The Python binding of the receiver: the `#[pyfunction]`s of `hostfeed._receiver` and the
//! consumer that runs the Python dispatcher, one concern a file:
//!
//! - `consumer`: the consumer thread's Python side ([`consumer::PyConsumer`]), a batch's
//!   plain taps and calls run without the dispatcher (`run_plain`), the state the receiver
//!   shares with the Python dispatcher (`DispatcherState`, `Holds`: the `batch`
//!   submodule), what the dispatcher raised, the core's notes;
//! - `lifecycle`: start, stop, finalize and the exit watchdog, barriers, eager and control
//!   messages;
//! - `passthrough`: settings and counters, thin calls into the core; shared conversions;
//! - `ffi_targets`: the FFI handlers as capsules for `jax.ffi.register_ffi_target`.
//!
//! Argument checks and conversions happen here, and so does every release of the GIL
//! around a wait (the recorder's are in `record.rs`, the portable transport's in
//! `portable.rs`): waits are sliced (at most `lifecycle::WAIT_SLICE` each) so that Ctrl-C
//! is honoured between slices.
//!
//! The doc comments of the `#[pyfunction]`s are their Python docstrings; the exceptions
//! they raise are described in words there and typed in `python/hostfeed/_receiver/host.pyi`.
#![allow(clippy::missing_errors_doc, clippy::must_use_candidate)]

mod consumer;
mod ffi_targets;
mod lifecycle;
mod passthrough;

use pyo3::prelude::*;

pub(crate) use self::consumer::{register_state, EAGER_PUSHED};
pub(crate) use self::ffi_targets::handler_capsules;
pub(crate) use self::lifecycle::trace_me;
pub(crate) use self::passthrough::{dict_of, duration};

/// Adds the receiver's functions and constants to `m`.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    passthrough::register(m)?;
    lifecycle::register(m)?;
    ffi_targets::register(m)?;
    Ok(())
}
