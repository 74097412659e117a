//! The Python exception types of `hostfeed._receiver` and the single conversion of the
//! crate's [`Error`] into them. Each subclasses the builtin a caller already catches.

use pyo3::exceptions::{PyOSError, PyRuntimeError, PyTimeoutError, PyTypeError, PyValueError};
use pyo3::{create_exception, PyErr};

use crate::error::{Error, RecordError};

create_exception!(
    _receiver,
    ReceiverError,
    PyRuntimeError,
    "The hostfeed receiver cannot do what was asked (stopped, shut down, misconfigured)."
);
create_exception!(
    _receiver,
    ReceiverTimeoutError,
    PyTimeoutError,
    "A wait on the hostfeed receiver (barrier, stop) ran past its timeout."
);
create_exception!(
    _receiver,
    CallbackContextError,
    PyRuntimeError,
    "A blocking receiver operation was called from inside a host callback, where it would deadlock."
);

create_exception!(
    _receiver,
    RecordingError,
    PyOSError,
    "Recording to a Zarr store failed (a write, a file that cannot be created, a full disk); \
     `errno` says how when the OS reported it."
);

impl From<Error> for PyErr {
    fn from(e: Error) -> PyErr {
        match e {
            Error::Timeout { .. } => ReceiverTimeoutError::new_err(e.to_string()),
            Error::InsideCallback(_) => CallbackContextError::new_err(e.to_string()),
            _ => ReceiverError::new_err(e.to_string()),
        }
    }
}

impl From<RecordError> for PyErr {
    fn from(e: RecordError) -> PyErr {
        let text = e.to_string();
        match e {
            RecordError::Io { errno: Some(errno), .. } => RecordingError::new_err((errno, text)),
            RecordError::Io { errno: None, .. } => RecordingError::new_err(text),
            RecordError::Invalid(_) | RecordError::Closed(_) => PyValueError::new_err(text),
            RecordError::Dtype(_) => PyTypeError::new_err(text),
        }
    }
}
