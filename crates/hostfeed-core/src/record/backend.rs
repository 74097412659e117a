//! Storage back-ends: where a recording lives. A [`Backend`] is one kind of
//! storage opened at a recording's root; it owns the store the recorder writes through
//! (`store.rs`'s [`Store`]), the store's lock (`storelock.rs` on a file system, the lock
//! object of `objects/lock.rs` in an object store) and, in its registry row
//! ([`Kind`]), the URL schemes that name it. [`KINDS`] is the registry; the
//! recorder, the binding and Python (`is_object_url`, the schemes, whether a store is
//! held) ask it, and nothing else knows a scheme or a lock protocol.
//!
//! Its files: `api.rs` (the traits and the registry row), `root.rs` (the checks every
//! back-end's `prepare` shares), and one file per back-end: `fs.rs` (the file system),
//! `memory.rs` (the in-memory store), `cloud.rs` (S3, GCS, Azure). Adding a back-end: a
//! file implementing [`Backend`] with its `KIND`, and a line in [`KINDS`].
//!
//! [`Storage`] is the public face of a back-end opened at a root: what the binding's
//! `Storage` class and the store conformance suite (`tests/python/test_store_conformance.py`)
//! drive.
//!
//! No Python here.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Duration;

use self::api::{Backend, Held, Kind};
use crate::error::RecordError;
use crate::record::store::{create_parent, io_error, Put, Store};
use crate::record::storelock::Access;

pub(crate) mod api;
mod cloud;
#[cfg(test)]
mod conformance;
pub(crate) mod fs;
mod memory;
pub(crate) mod root;

#[cfg(test)]
pub(crate) use cloud::ObjectBackend;

/// The back-ends, by kind: the file system first (local paths name it), then those that URL
/// schemes name.
pub(crate) const KINDS: [Kind; 3] = [fs::KIND, memory::KIND, cloud::KIND];

/// The scheme of `url` (lowercase), if it has one (`scheme://...`).
fn scheme_of(url: &str) -> Option<String> {
    let (scheme, _) = url.split_once("://")?;
    let mut chars = scheme.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphabetic());
    (first_ok && chars.all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))).then(|| scheme.to_ascii_lowercase())
}

/// The registry row whose schemes name `url`'s.
fn kind_of(url: &str) -> Option<&'static Kind> {
    let scheme = scheme_of(url)?;
    KINDS.iter().find(|k| k.schemes.contains(&scheme.as_str()))
}

/// Whether `url` names a store of a back-end that URLs name (`s3://`, `gs://`, `az://`
/// and their aliases, `memory://`).
#[must_use]
pub fn is_object_url(url: &str) -> bool {
    kind_of(url).is_some()
}

/// The URL schemes of every back-end (lowercase, without `://`), in registry order.
#[must_use]
pub fn store_schemes() -> Vec<&'static str> {
    KINDS.iter().flat_map(|k| k.schemes.iter().copied()).collect()
}

/// Opens the back-end of `place`: a local path (`url` false), or a URL of a scheme a
/// back-end serves, with its storage options. Makes no request.
///
/// # Errors
/// [`RecordError::Invalid`]: a URL no back-end serves, an unknown option, a value the
/// provider's client refuses.
pub(crate) fn open(place: &Path, url: bool, options: &[(String, String)]) -> Result<Box<dyn Backend>, RecordError> {
    if !url {
        return (fs::KIND.open)(place, options);
    }
    let text = place.to_str().ok_or_else(|| RecordError::Invalid("a store URL must be text".into()))?;
    let Some(kind) = kind_of(text) else {
        let schemes: Vec<String> = store_schemes().iter().map(|s| format!("{s}://")).collect();
        return Err(RecordError::Invalid(format!(
            "{text:?} is not the URL of a store hostfeed writes ({})",
            schemes.join(", ")
        )));
    };
    (kind.open)(place, options)
}

/// A back-end opened at a root (see the module documentation): its store's operations on
/// keys below the root, and its lock.
pub struct Storage {
    backend: Box<dyn Backend>,
    store: Box<dyn Store>,
}

impl std::fmt::Debug for Storage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Storage").field("root", &self.backend.root()).finish_non_exhaustive()
    }
}

/// A lock a [`Storage`] took: held while this value lives.
#[derive(Debug)]
pub struct StorageLock {
    #[expect(dead_code, reason = "held for its Drop")]
    held: Box<dyn Held>,
}

impl Storage {
    /// The back-end, for a recorder to open.
    pub(crate) fn backend(&self) -> &dyn Backend {
        &*self.backend
    }

    /// Opens the store at `place` (a local path when `url` is false, else a URL of a scheme
    /// [`store_schemes`] lists) with `options` (an object store's config keys). Makes no
    /// request.
    ///
    /// # Errors
    /// As the back-end's `open` (its `Kind`): an unknown scheme, bad options, an unusable place.
    pub fn open(place: &Path, url: bool, options: &[(String, String)]) -> Result<Storage, RecordError> {
        let backend = open(place, url, options)?;
        let store = backend.store(false);
        Ok(Storage { backend, store })
    }

    /// The store's root (a path, or the URL).
    #[must_use]
    pub fn root(&self) -> &Path {
        self.backend.root()
    }

    fn path(&self, key: &str) -> PathBuf {
        self.backend.root().join(key)
    }

    /// Stores `bytes` as the whole object `key` (a `/`-separated key below the root),
    /// replacing any object there.
    ///
    /// # Errors
    /// The store's, naming the object.
    pub fn put(&self, key: &str, bytes: &[u8]) -> Result<(), RecordError> {
        let path = self.path(key);
        create_parent(&*self.store, &path)?;
        self.store.put(&path, bytes, Put::Replace)
    }

    /// The bytes of object `key`.
    ///
    /// # Errors
    /// The store's (`ENOENT`: no such object), naming the object.
    pub fn get(&self, key: &str) -> Result<Vec<u8>, RecordError> {
        let path = self.path(key);
        self.store.get(&path).map_err(|e| io_error("read", &path, &e))
    }

    /// Bytes `range` of object `key`, read alone (a partial read).
    ///
    /// # Errors
    /// The store's, naming the object.
    pub fn get_range(&self, key: &str, range: Range<u64>) -> Result<Vec<u8>, RecordError> {
        let path = self.path(key);
        self.store.get_range(&path, range).map_err(|e| io_error("read", &path, &e))
    }

    /// The names directly below `key` (`""`: the root), objects and prefixes alike, sorted;
    /// none where nothing is stored.
    ///
    /// # Errors
    /// The store's.
    pub fn list(&self, key: &str) -> Result<Vec<String>, RecordError> {
        let dir = if key.is_empty() { self.backend.root().to_path_buf() } else { self.path(key) };
        let listed = match self.store.list(&dir) {
            // Nothing stored there: no names (an object store has no empty directories).
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            other => other.map_err(|e| io_error("list", &dir, &e))?,
        };
        let mut names: Vec<String> = listed
            .iter()
            .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .collect();
        names.sort();
        Ok(names)
    }

    /// Removes object `key`, or everything below it.
    ///
    /// # Errors
    /// The store's.
    pub fn remove(&self, key: &str) -> Result<(), RecordError> {
        let path = self.path(key);
        self.store.remove(&path).map_err(|e| io_error("remove", &path, &e))
    }

    /// Takes the store's lock, as a recorder does (with `lease` where the lock has one).
    ///
    /// # Errors
    /// [`RecordError::Io`] with `EBUSY` naming the holder; the store's errors.
    pub fn lock(&self, lease: Duration) -> Result<StorageLock, RecordError> {
        Ok(StorageLock { held: self.backend.lock(lease, &Access::Exclusive)? })
    }

    /// Whether a recorder holds the store now (read only; a lock that cannot be read: not
    /// known to be held, `false`).
    #[must_use]
    pub fn is_held(&self) -> bool {
        self.backend.is_held()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_their_backend() {
        assert!(is_object_url("s3://b/x") && is_object_url("gs://b/x") && is_object_url("az://c/x"));
        assert!(is_object_url("S3://b/x") && is_object_url("memory:///x") && is_object_url("abfss://c/x"));
        assert!(!is_object_url("file:///tmp/x") && !is_object_url("/tmp/x") && !is_object_url("ftp://h/x"));
        assert!(store_schemes().contains(&"memory") && store_schemes().contains(&"s3"));
        let e = open(Path::new("ftp://h/x"), true, &[]).err().expect("no back-end serves ftp://");
        assert!(e.to_string().contains("is not the URL of a store hostfeed writes (memory://, s3://"), "{e}");
    }

    #[test]
    fn one_memory_url_is_one_store_in_a_process() {
        let a = Storage::open(Path::new("memory://conformance-unit/r.zarr"), true, &[]).unwrap();
        let b = Storage::open(Path::new("memory://conformance-unit/r.zarr"), true, &[]).unwrap();
        a.put("k/x", b"abcdef").unwrap();
        assert_eq!(b.get("k/x").unwrap(), b"abcdef");
        assert_eq!(b.get_range("k/x", 1..4).unwrap(), b"bcd");
        let held = a.lock(Duration::from_secs(60)).unwrap();
        assert!(b.is_held());
        assert!(b.lock(Duration::from_secs(60)).is_err());
        drop(held);
        assert!(!b.is_held());
        b.remove("k").unwrap();
        assert!(a.list("").unwrap().is_empty());
    }
}
