//! One error type for the crate and its mapping to XLA FFI error codes (for handlers).
//! Its single conversion into a Python exception lives in the binding crate
//! (`bindings/python/src/error.rs`, `CoreError`).
//!
//! No Python here.

use std::fmt;
use std::time::Duration;

use crate::ffi::c_api as ffi;

/// Everything that can go wrong in the crate.
#[derive(Debug)]
pub enum Error {
    /// The handler was given something it cannot transfer (bad attribute, dtype, frame).
    InvalidArgument(String),
    /// The receiver was shut down for good (interpreter exit); no more messages accepted.
    Closed,
    /// A handler ran before Python ever configured the receiver.
    NotConfigured,
    /// A blocking operation was attempted on the consumer thread.
    InsideCallback(&'static str),
    /// A wait ran past its deadline.
    Timeout {
        /// The operation that waited (`barrier_wait`, `stop`).
        what: &'static str,
        /// The timeout, in seconds.
        seconds: f64,
        /// Messages still unprocessed when it passed.
        pending: u64,
    },
    /// A `call`'s host callback failed; the message (built by Python) says how.
    CallFailed(String),
    /// A `call` got no reply before `HOSTFEED_CALL_TIMEOUT`; `blocked_behind` names the
    /// host callback the receiver was busy with (and for how long) if this call's own
    /// host function never started.
    CallTimeout {
        /// The host callback's name.
        name: String,
        /// The timeout, in seconds.
        seconds: f64,
        /// The callback the consumer was busy with, and for how long.
        blocked_behind: Option<(String, Duration)>,
    },
    /// An internal failure (a panic caught at the FFI boundary, a poisoned invariant).
    Internal(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidArgument(m) => write!(f, "hostfeed: {m}"),
            Error::Closed => write!(
                f,
                "hostfeed: the receiver has shut down (interpreter exit); host callbacks can no \
                 longer be delivered"
            ),
            Error::NotConfigured => write!(
                f,
                "hostfeed: a host callback ran before the receiver was configured; use \
                 hostfeed.host_callback (id_tap/id_print/call) so the receiver starts first"
            ),
            Error::InsideCallback(what) => write!(
                f,
                "hostfeed: {what} was called from inside a host callback; it waits for the \
                 callback thread itself and would deadlock. Call it from the main program instead"
            ),
            Error::Timeout { what, seconds, pending } => write!(
                f,
                "hostfeed: {what} timed out after {seconds:.3} s with {pending} message(s) \
                 still unprocessed; a host callback may be blocked"
            ),
            Error::CallFailed(m) => write!(f, "{m}"),
            Error::CallTimeout { name, seconds, blocked_behind: None } => write!(
                f,
                "hostfeed: the host callback {name} of hcb.call did not reply within \
                 {seconds:.3} s (HOSTFEED_CALL_TIMEOUT); the device computation was failed"
            ),
            Error::CallTimeout { name, seconds, blocked_behind: Some((busy, for_)) } => write!(
                f,
                "hostfeed: hcb.call of {name} timed out after {seconds:.3} s \
                 (HOSTFEED_CALL_TIMEOUT) without {name} ever starting: the receiver has been \
                 busy for {:.3} s running the host callback {busy}, which has not returned; \
                 the device computation was failed",
                for_.as_secs_f64()
            ),
            Error::Internal(m) => write!(f, "hostfeed internal error: {m}"),
        }
    }
}

impl Error {
    /// The XLA FFI error code a handler returns for this error.
    #[must_use]
    pub(crate) fn ffi_code(&self) -> ffi::XLA_FFI_Error_Code {
        match self {
            Error::InvalidArgument(_) => ffi::XLA_FFI_Error_Code_INVALID_ARGUMENT,
            Error::Closed => ffi::XLA_FFI_Error_Code_UNAVAILABLE,
            Error::NotConfigured | Error::InsideCallback(_) | Error::CallFailed(_) => {
                ffi::XLA_FFI_Error_Code_FAILED_PRECONDITION
            }
            Error::Timeout { .. } | Error::CallTimeout { .. } => ffi::XLA_FFI_Error_Code_DEADLINE_EXCEEDED,
            Error::Internal(_) => ffi::XLA_FFI_Error_Code_INTERNAL,
        }
    }
}

/// What can go wrong while recording to a Zarr store (`record/`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordError {
    /// A file system operation on the store failed; `errno` as the OS reported it.
    Io {
        /// The OS error number, when there was one.
        errno: Option<i32>,
        /// What failed, with the path.
        message: String,
    },
    /// An invalid record name, or a name recorded again with another shape or dtype.
    Invalid(String),
    /// A value of a dtype the store cannot hold (sub-byte types).
    Dtype(String),
    /// The recorder was closed.
    Closed(String),
}

impl fmt::Display for RecordError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RecordError::Io { message, .. }
            | RecordError::Invalid(message)
            | RecordError::Dtype(message)
            | RecordError::Closed(message) => write!(f, "hostfeed: {message}"),
        }
    }
}

impl RecordError {
    /// The message without the `hostfeed: ` prefix of its display.
    #[must_use]
    pub fn message(&self) -> &str {
        match self {
            RecordError::Io { message, .. }
            | RecordError::Invalid(message)
            | RecordError::Dtype(message)
            | RecordError::Closed(message) => message,
        }
    }

    /// The same error with `context` ("recording \"layer1/h\"") in front of its message.
    #[must_use]
    pub(crate) fn context(self, context: &str) -> RecordError {
        let add = |m: String| format!("{context}: {m}");
        match self {
            RecordError::Io { errno, message } => RecordError::Io { errno, message: add(message) },
            RecordError::Invalid(m) => RecordError::Invalid(add(m)),
            RecordError::Dtype(m) => RecordError::Dtype(add(m)),
            RecordError::Closed(m) => RecordError::Closed(add(m)),
        }
    }
}
