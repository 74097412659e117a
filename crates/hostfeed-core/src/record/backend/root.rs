//! What every back-end's [`prepare`](super::api::Backend::prepare) shares: whether a root
//! holds a hostfeed recording, whether a mode may use a root as it is, an earlier
//! recording removed, and the error for a local root that cannot be created.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::error::RecordError;
use crate::record::common::Mode;
use crate::record::store::{io_error, Store};
use crate::record::storelock::LOCK_FILE;

/// What the root's attributes say a hostfeed recording is.
pub(crate) const ROOT_FORMAT: &str = "hostfeed-recording";

pub(crate) fn root_attributes() -> Value {
    json!({"hostfeed": {"format": ROOT_FORMAT, "version": 1}})
}

/// Whether `root` holds a hostfeed recording (its `zarr.json` says so).
pub(crate) fn is_recording(store: &dyn Store, root: &Path) -> bool {
    store
        .get(&root.join("zarr.json"))
        .ok()
        .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
        .is_some_and(|v| v["attributes"]["hostfeed"]["format"] == json!(ROOT_FORMAT))
}

/// The entries of `root` besides the lock file (`None`: `root` is not a readable directory).
fn entries(store: &dyn Store, root: &Path) -> Option<Vec<PathBuf>> {
    let listed = store.list(root).ok()?;
    Some(listed.into_iter().filter(|p| p.file_name() != Some(OsStr::new(LOCK_FILE))).collect())
}

/// Whether `mode` may use `root` (an existing path) as it is.
pub(crate) fn check_existing(store: &dyn Store, root: &Path, mode: Mode) -> Result<(), RecordError> {
    if entries(store, root).is_some_and(|e| e.is_empty()) {
        return Ok(());
    }
    match mode {
        Mode::Create => Err(RecordError::Io {
            errno: Some(libc::EEXIST),
            message: format!(
                "{} exists and is not an empty directory; choose a new path, or pass mode=\"w\" to \
                 replace an earlier recording",
                root.display()
            ),
        }),
        Mode::Overwrite | Mode::Append { .. } if is_recording(store, root) => Ok(()),
        Mode::Overwrite | Mode::Append { .. } => Err(RecordError::Io {
            errno: Some(libc::EEXIST),
            message: format!(
                "{} exists and is not a hostfeed recording; mode=\"w\" only replaces earlier \
                 recordings, and mode=\"a\" only appends to them",
                root.display()
            ),
        }),
    }
}

/// Removes an earlier recording at `root` entry by entry (the directory, and the lock in
/// it, stay), unless `mode` appends to it.
pub(crate) fn clear_root(store: &dyn Store, root: &Path, mode: Mode) -> Result<(), RecordError> {
    if matches!(mode, Mode::Append { .. }) {
        return Ok(());
    }
    for entry in entries(store, root).unwrap_or_default() {
        store.remove(&entry).map_err(|e| io_error("remove the old recording's", &entry, &e))?;
    }
    Ok(())
}

/// The error for a local recording's root that cannot be created, naming what stands in
/// the way: the nearest folder above it that exists (the one that is read-only or will
/// not take a folder), or a file where a folder should be.
pub(crate) fn create_error(root: &Path, e: &std::io::Error) -> RecordError {
    let err = io_error("create", root, e);
    let Some(why) = blocking_ancestor(root, e) else { return err };
    match err {
        RecordError::Io { errno, message } => RecordError::Io { errno, message: format!("{message}: {why}") },
        other => other,
    }
}

/// What keeps the folders of `path` from being made, read from the nearest path above it
/// that exists (None when nothing above it exists, as for a relative path's first part).
fn blocking_ancestor(path: &Path, e: &std::io::Error) -> Option<String> {
    let mut dir = path.parent();
    while let Some(d) = dir.filter(|d| !d.as_os_str().is_empty()) {
        if let Ok(meta) = std::fs::metadata(d) {
            return Some(if !meta.is_dir() {
                format!("{} is a file, not a folder: choose a path under a folder", d.display())
            } else if e.raw_os_error() == Some(libc::EROFS) {
                format!("{} is on a read-only file system: choose a writable folder", d.display())
            } else if e.kind() == std::io::ErrorKind::PermissionDenied {
                format!("the folder {} cannot be written (no permission): choose a writable folder", d.display())
            } else {
                format!(
                    "{} exists, but no folder could be made in it (a special file system?): \
                     choose a writable folder",
                    d.display()
                )
            });
        }
        dir = d.parent();
    }
    None
}
