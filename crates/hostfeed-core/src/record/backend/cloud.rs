//! Object stores as a back-end: S3, Google Cloud Storage and Azure Blob Storage through the
//! `object_store` crate ([`Objects`], `objects.rs`), locked with a conditionally created
//! lock object that has a lease ([`ObjectLock`]).
//!
//! No Python here.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::api::{Backend, Held, Joined, Kind};
use super::root::{check_existing, clear_root};
use crate::error::RecordError;
use crate::record::common::Mode;
use crate::record::objects::{ObjectLock, Objects};
use crate::record::store::Store;
use crate::record::storelock::Access;

/// The registry's row: the schemes of the `object_store` crate's S3, GCS and Azure clients.
pub(crate) const KIND: Kind = Kind {
    schemes: &["s3", "s3a", "gs", "az", "adl", "azure", "abfs", "abfss"],
    open,
};

fn open(place: &Path, options: &[(String, String)]) -> Result<Box<dyn Backend>, RecordError> {
    let url = place.to_str().ok_or_else(|| RecordError::Invalid("a store URL must be text".into()))?;
    Ok(Box::new(ObjectBackend { objects: Objects::open(url, options)? }))
}

/// A store in an object store (see the module documentation).
#[derive(Debug)]
pub(crate) struct ObjectBackend {
    pub(crate) objects: Arc<Objects>,
}

impl Held for ObjectLock {
    fn renew_if_due(&self) -> Result<(), RecordError> {
        ObjectLock::renew_if_due(self)
    }
}

impl Backend for ObjectBackend {
    fn root(&self) -> &Path {
        self.objects.root()
    }

    fn store(&self, _durable: bool) -> Box<dyn Store> {
        Box::new(Arc::clone(&self.objects))
    }

    /// The bucket is reached first (a missing bucket or wrong credentials fail here, before
    /// anything is written), a live holder is refused, then the lock object is created and
    /// an earlier recording removed.
    fn prepare(&self, mode: Mode, lease: Duration, access: &Access) -> Result<Box<dyn Held>, RecordError> {
        let objects = &self.objects;
        let root = objects.root().to_path_buf();
        let store: &dyn Store = &**objects;
        objects.check_reachable()?;
        if let Access::SharedMember { group } = access {
            // A member of a shared store's run: its leader prepared the store.
            ObjectLock::join(objects, &root, group)?;
            return Ok(Box::new(Joined));
        }
        ObjectLock::check_free(objects, &root)?;
        check_existing(store, &root, mode)?;
        let held = ObjectLock::acquire(objects, &root, lease, access)?;
        check_existing(store, &root, mode)?;
        clear_root(store, &root, mode)?;
        Ok(Box::new(held))
    }

    fn lock(&self, lease: Duration, access: &Access) -> Result<Box<dyn Held>, RecordError> {
        let root = self.objects.root().to_path_buf();
        if let Access::SharedMember { group } = access {
            ObjectLock::join(&self.objects, &root, group)?;
            return Ok(Box::new(Joined));
        }
        Ok(Box::new(ObjectLock::acquire(&self.objects, &root, lease, access)?))
    }

    fn is_held(&self) -> bool {
        ObjectLock::is_live(&self.objects, self.objects.root())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Mutex;

    use super::*;
    use crate::host::sync::lock;
    use crate::record::backend::conformance::{self, Offers, S3sFs};

    const OFFERS: Offers = Offers { in_place: false, streams: true };

    /// The `object_store` crate's in-memory client: the object store's code without a server.
    #[test]
    fn an_object_store_in_memory_passes_the_store_conformance_suite() {
        let stores: Mutex<HashMap<String, Arc<Objects>>> = Mutex::default();
        conformance::run(
            &|name| {
                let objects = lock(&stores)
                    .entry(name.to_string())
                    .or_insert_with(|| Objects::in_memory_holding(&format!("memory:///{name}"), 64 << 10).unwrap())
                    .clone();
                Box::new(ObjectBackend { objects })
            },
            OFFERS,
        );
    }

    /// An S3 server (s3s-fs) started here; shards held up to 64 KiB, so that larger streams
    /// are multipart uploads. No retries: a server on this machine has no transient
    /// failures, and s3s-fs answers a HEAD of a key with objects below it (a folder in its
    /// files) with a 500 where S3 answers 404 (`exists` then lists, as it does after a 404),
    /// which the client would retry for the whole `retry_timeout`.
    #[test]
    fn an_s3_server_passes_the_store_conformance_suite() {
        use crate::record::objects::{MAX_RETRIES, SINGLE_PUT_BYTES};
        let Some(server) = S3sFs::start("conformance") else { return };
        let mut options = server.options();
        options.push((SINGLE_PUT_BYTES.into(), (64 << 10).to_string()));
        options.push((MAX_RETRIES.into(), "0".into()));
        conformance::run(&|name| open(Path::new(&format!("s3://conformance/{name}")), &options).unwrap(), OFFERS);
    }
}
