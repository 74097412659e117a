//! The Python exception types of `hostfeed._receiver` and the single conversion of the
//! core's errors ([`Error`], [`RecordError`]) into them, through the newtype [`CoreError`]
//! (the orphan rule forbids `impl From<hostfeed_core::Error> for PyErr` in this crate).
//! Each exception subclasses the builtin a caller already catches.

use pyo3::create_exception;
use pyo3::exceptions::{PyOSError, PyRuntimeError, PyTimeoutError, PyTypeError, PyValueError};
use pyo3::prelude::*;

use hostfeed_core::{Error, RecordError};

create_exception!(
    hostfeed,
    ReceiverError,
    PyRuntimeError,
    "The hostfeed receiver cannot do what was asked (stopped, shut down, misconfigured)."
);
create_exception!(
    hostfeed,
    ReceiverTimeoutError,
    PyTimeoutError,
    "A wait on the hostfeed receiver (barrier, stop) ran past its timeout."
);
create_exception!(
    hostfeed,
    CallbackContextError,
    PyRuntimeError,
    "A blocking receiver operation was called from inside a host callback, where it would deadlock."
);

create_exception!(
    hostfeed,
    RecordingError,
    PyOSError,
    "Recording to a Zarr store failed (a write, a file that cannot be created, a full disk); \
     `errno` says how when the OS reported it."
);

/// Adds the exception types to `m`.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("ReceiverError", py.get_type::<ReceiverError>())?;
    m.add("ReceiverTimeoutError", py.get_type::<ReceiverTimeoutError>())?;
    m.add("CallbackContextError", py.get_type::<CallbackContextError>())?;
    m.add("RecordingError", py.get_type::<RecordingError>())?;
    Ok(())
}

/// A core error on its way into Python: the one conversion of [`Error`] and [`RecordError`]
/// into Python exceptions. Call sites write `result.py()?` ([`IntoPy::py`]).
pub(crate) struct CoreError(PyErr);

impl From<Error> for CoreError {
    fn from(e: Error) -> Self {
        CoreError(match e {
            Error::Timeout { .. } => ReceiverTimeoutError::new_err(e.to_string()),
            Error::InsideCallback(_) => CallbackContextError::new_err(e.to_string()),
            _ => ReceiverError::new_err(e.to_string()),
        })
    }
}

impl From<RecordError> for CoreError {
    fn from(e: RecordError) -> Self {
        let text = e.to_string();
        CoreError(match e {
            RecordError::Io { errno: Some(errno), .. } => RecordingError::new_err((errno, text)),
            RecordError::Io { errno: None, .. } => RecordingError::new_err(text),
            RecordError::Invalid(_) | RecordError::Closed(_) => PyValueError::new_err(text),
            RecordError::Dtype(_) => PyTypeError::new_err(text),
        })
    }
}

impl From<CoreError> for PyErr {
    fn from(e: CoreError) -> PyErr {
        e.0
    }
}

/// A core result as a Python result: `result.py()?` in a function returning `PyResult`.
pub(crate) trait IntoPy<T> {
    /// The value, or the error as the Python exception [`CoreError`] maps it to.
    fn py(self) -> PyResult<T>;
}

impl<T, E: Into<CoreError>> IntoPy<T> for Result<T, E> {
    fn py(self) -> PyResult<T> {
        self.map_err(|e| PyErr::from(e.into()))
    }
}
