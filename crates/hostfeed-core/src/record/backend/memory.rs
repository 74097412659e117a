//! The in-memory store as a back-end (`memory://bucket/path`): the object store back-end
//! (`cloud.rs`) over the `object_store` crate's in-memory client, one per bucket for the
//! life of the process, so that every open of one URL in a process sees the same objects
//! (and the same lock). Nothing leaves the process: for tests, and for the conformance
//! suite that runs over every back-end.
//!
//! No Python here.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use object_store::memory::InMemory;

use super::api::{Backend, Kind};
use super::cloud::ObjectBackend;
use crate::error::RecordError;
use crate::host::sync::lock;
use crate::record::objects::Objects;

/// The registry's row.
pub(crate) const KIND: Kind = Kind { schemes: &["memory"], open };

/// The buckets of this process, by name (`memory:///run` is the bucket `""`).
static BUCKETS: Mutex<Option<HashMap<String, Arc<InMemory>>>> = Mutex::new(None);

fn open(place: &Path, options: &[(String, String)]) -> Result<Box<dyn Backend>, RecordError> {
    let url = place.to_str().ok_or_else(|| RecordError::Invalid("a store URL must be text".into()))?;
    if let Some((k, _)) = options.first() {
        return Err(RecordError::Invalid(format!("unknown storage option {k:?} for memory:// (it takes none)")));
    }
    let parsed = url::Url::parse(url).map_err(|e| RecordError::Invalid(format!("{url:?} is not a URL: {e}")))?;
    let bucket = parsed.host_str().unwrap_or("").to_string();
    let inner = Arc::clone(lock(&BUCKETS).get_or_insert_with(HashMap::new).entry(bucket).or_default());
    Ok(Box::new(ObjectBackend { objects: Objects::over(inner, url)? }))
}
