//! The storage back-ends as Python sees them (the core's `record/backend.rs`): which URLs
//! name a store (`is_object_url`, `STORE_SCHEMES`), whether a recorder holds a store
//! (`store_held`), and `Storage`, a back-end opened at a root with its store's operations
//! and its lock, which the store conformance suite drives
//! (`tests/python/test_store_conformance.py`). `hostfeed._src.record.stores` asks these
//! instead of knowing schemes or lock protocols itself. Every store operation releases
//! the GIL.
#![allow(clippy::missing_errors_doc, clippy::must_use_candidate)]

use std::path::PathBuf;

use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::error::IntoPy;
use crate::host::duration;
use hostfeed_core::{is_object_url, store_schemes, Storage, StorageLock, LOCK_FILE};

/// Adds the back-ends' class and functions to `m`.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyStorage>()?;
    m.add_class::<PyStorageLock>()?;
    m.add_function(wrap_pyfunction!(py_is_object_url, m)?)?;
    m.add_function(wrap_pyfunction!(store_held, m)?)?;
    m.add("STORE_SCHEMES", store_schemes())?;
    m.add("LOCK_FILE", LOCK_FILE)?;
    Ok(())
}

/// Whether `url` names a store of a back-end that URLs name (an object store's, or
/// `memory://`).
#[pyfunction]
#[pyo3(name = "is_object_url")]
fn py_is_object_url(url: &str) -> bool {
    is_object_url(url)
}

/// Whether a recorder holds the store at `path` (a local path, or with `url` an object
/// store's URL with its `storage_options`) now: a file system's `flock` taken, an object
/// store's lock object with a live lease. Read only; a store that cannot be opened or
/// whose lock cannot be read is not known to be held (`False`).
#[pyfunction]
#[pyo3(signature = (path, *, url=false, storage_options=None))]
#[allow(clippy::needless_pass_by_value)]
fn store_held(
    py: Python<'_>,
    path: PathBuf,
    url: bool,
    storage_options: Option<Vec<(String, String)>>,
) -> bool {
    let options = storage_options.unwrap_or_default();
    py.detach(|| {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            Storage::open(&path, url, &options).is_ok_and(|s| s.is_held())
        }))
        .unwrap_or(false)
    })
}

/// A store's back-end opened at a root (`Storage(path, url=False, storage_options=None)`):
/// whole objects put, read, listed and removed by key below the root, a byte range read,
/// and the store's lock.
#[pyclass(name = "Storage", module = "hostfeed._receiver.storage", frozen)]
pub(crate) struct PyStorage {
    inner: Storage,
}

#[pymethods]
impl PyStorage {
    #[new]
    #[pyo3(signature = (path, *, url=false, storage_options=None))]
    #[allow(clippy::needless_pass_by_value)]
    fn new(
        py: Python<'_>,
        path: PathBuf,
        url: bool,
        storage_options: Option<Vec<(String, String)>>,
    ) -> PyResult<Self> {
        let options = storage_options.unwrap_or_default();
        let inner = py.detach(|| Storage::open(&path, url, &options)).py()?;
        Ok(PyStorage { inner })
    }

    /// The store's root (a path, or the URL).
    #[getter]
    fn root(&self) -> String {
        self.inner.root().to_string_lossy().into_owned()
    }

    /// Stores `data` as the whole object `key`, replacing any object there.
    fn put(&self, py: Python<'_>, key: &str, data: &[u8]) -> PyResult<()> {
        py.detach(|| self.inner.put(key, data)).py()
    }

    /// The bytes of object `key`.
    fn get<'py>(&self, py: Python<'py>, key: &str) -> PyResult<Bound<'py, PyBytes>> {
        let bytes = py.detach(|| self.inner.get(key)).py()?;
        Ok(PyBytes::new(py, &bytes))
    }

    /// Bytes `start` to `end` (exclusive) of object `key`, read alone.
    fn get_range<'py>(
        &self,
        py: Python<'py>,
        key: &str,
        start: u64,
        end: u64,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let bytes = py.detach(|| self.inner.get_range(key, start..end)).py()?;
        Ok(PyBytes::new(py, &bytes))
    }

    /// The names directly below `key` (`""`: the root), sorted.
    #[pyo3(signature = (key=""))]
    fn list(&self, py: Python<'_>, key: &str) -> PyResult<Vec<String>> {
        py.detach(|| self.inner.list(key)).py()
    }

    /// Removes object `key`, or everything below it.
    fn remove(&self, py: Python<'_>, key: &str) -> PyResult<()> {
        py.detach(|| self.inner.remove(key)).py()
    }

    /// Takes the store's lock as a recorder does (`RecordingError` with `EBUSY`, naming the
    /// holder, while another holds it); held until the returned lock's `release()`.
    #[pyo3(signature = (lease=60.0))]
    fn lock(&self, py: Python<'_>, lease: f64) -> PyResult<PyStorageLock> {
        let lease = duration("lease", Some(lease))?.unwrap_or(std::time::Duration::MAX);
        let held = py.detach(|| self.inner.lock(lease)).py()?;
        Ok(PyStorageLock { held: std::sync::Mutex::new(Some(held)) })
    }

    /// Whether a recorder holds the store now (read only).
    fn is_held(&self, py: Python<'_>) -> bool {
        py.detach(|| self.inner.is_held())
    }
}

/// A lock that `Storage.lock` took.
#[pyclass(name = "StorageLock", module = "hostfeed._receiver.storage", frozen)]
pub(crate) struct PyStorageLock {
    held: std::sync::Mutex<Option<StorageLock>>,
}

#[pymethods]
impl PyStorageLock {
    /// Releases the lock (again: nothing).
    fn release(&self, py: Python<'_>) {
        let held = hostfeed_core::lock(&self.held).take();
        py.detach(move || drop(held));
    }
}
