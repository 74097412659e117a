//! The Python exception types of `hostfeed._receiver` and the single conversion of the
//! crate's [`Error`] into them. Each subclasses the builtin a caller already catches.

use pyo3::exceptions::{PyRuntimeError, PyTimeoutError};
use pyo3::{create_exception, PyErr};

use crate::error::Error;

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

impl From<Error> for PyErr {
    fn from(e: Error) -> PyErr {
        match e {
            Error::Timeout { .. } => ReceiverTimeoutError::new_err(e.to_string()),
            Error::InsideCallback(_) => CallbackContextError::new_err(e.to_string()),
            _ => ReceiverError::new_err(e.to_string()),
        }
    }
}
