//! The file system as a back-end: a local (or shared) directory, written through
//! [`FsStore`] (in place where it can), locked with an `flock` ([`StoreLock`]). Local
//! paths name it (Python turns a `file://` URL into its path).
//!
//! No Python here.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::api::{Backend, Held, Kind};
use super::root::{check_existing, clear_root, create_error};
use crate::error::RecordError;
use crate::record::common::Mode;
use crate::record::store::{FsStore, Store};
use crate::record::storelock::{Access, StoreLock};

/// The registry's row.
pub(crate) const KIND: Kind = Kind { schemes: &[], open };

fn open(place: &Path, options: &[(String, String)]) -> Result<Box<dyn Backend>, RecordError> {
    if let Some((k, _)) = options.first() {
        return Err(RecordError::Invalid(format!(
            "storage option {k:?}: storage options apply to object store URLs, not to a local path"
        )));
    }
    Ok(Box::new(FileSystem { root: place.to_path_buf() }))
}

/// A store in a directory of the file system.
#[derive(Debug)]
pub(crate) struct FileSystem {
    pub(crate) root: PathBuf,
}

impl Held for StoreLock {}

impl Backend for FileSystem {
    fn root(&self) -> &Path {
        &self.root
    }

    fn store(&self, durable: bool) -> Box<dyn Store> {
        Box::new(FsStore { durable })
    }

    /// Makes the root an empty directory (or a recording `mode` may use) held by the
    /// returned lock.
    fn prepare(&self, mode: Mode, _lease: Duration, access: &Access) -> Result<Box<dyn Held>, RecordError> {
        let root = &self.root;
        let store = FsStore { durable: false };
        if matches!(access, Access::SharedMember { .. }) {
            // A member of a shared store's run: its leader prepared the directory.
            return Ok(Box::new(StoreLock::acquire(root, access)?));
        }
        StoreLock::check_free(root)?;
        if store.exists(root) {
            check_existing(&store, root, mode)?;
        }
        store.create_dir(root).map_err(|e| create_error(root, &e))?;
        let held = StoreLock::acquire(root, access)?;
        // Again under the lock: another process may have written meanwhile.
        check_existing(&store, root, mode)?;
        // An earlier recording is replaced entry by entry: the directory (and the lock file
        // in it) stays, so the lock keeps guarding the path.
        clear_root(&store, root, mode)?;
        Ok(Box::new(held))
    }

    fn lock(&self, _lease: Duration, access: &Access) -> Result<Box<dyn Held>, RecordError> {
        if !matches!(access, Access::SharedMember { .. }) {
            std::fs::create_dir_all(&self.root).map_err(|e| create_error(&self.root, &e))?;
        }
        Ok(Box::new(StoreLock::acquire(&self.root, access)?))
    }

    fn is_held(&self) -> bool {
        StoreLock::is_held(&self.root)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::backend::conformance::{self, Offers};

    #[test]
    fn the_file_system_passes_the_store_conformance_suite() {
        let base = std::env::temp_dir().join(format!("hostfeed-conformance-fs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        conformance::run(&|name| open(&base.join(name), &[]).unwrap(), Offers { in_place: true, streams: false });
        std::fs::remove_dir_all(&base).unwrap();
    }
}
