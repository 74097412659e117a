//! The in-memory store as a back-end (`memory://bucket/path`): a store that lives in this
//! process's memory, for tests. A bucket is one [`Bucket`] (its objects by key, the locks
//! on the stores in it) shared by every store, lock and back-end opened on it, and freed
//! when the last of them lets go: a recorder closed and dropped, a `Storage` dropped. The
//! registry ([`BUCKETS`]) holds each bucket weakly, so that every open of one URL meanwhile
//! sees the same objects and the same lock, and a bucket nobody holds leaves nothing
//! behind.
//!
//! Its store has no directories (a "directory" exists while an object lies below it, as in
//! an object store) and writes into part of an object in place (as a file system does:
//! memory can). Its lock is a holder record in the bucket, held while the [`Held`] it
//! handed out lives; no lease (the process that holds it cannot outlive it). The processes
//! of a `jax.distributed` run cannot share it: each has its own memory.
//!
//! No Python here.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use super::api::{Backend, Held, Joined, Kind};
use super::root::{check_existing, clear_root};
use crate::error::RecordError;
use crate::host::sync::lock;
use crate::record::common::Mode;
use crate::record::store::{InPlace, Put, Store};
use crate::record::storelock::Access;

/// The registry's row.
pub(crate) const KIND: Kind = Kind { schemes: &["memory"], open };

/// The buckets of this process that something holds, by name (`memory:///run` is the
/// bucket `""`). A bucket removes its entry when it is dropped.
static BUCKETS: Mutex<Option<HashMap<String, Weak<Bucket>>>> = Mutex::new(None);

/// One bucket: its objects (by key, `/`-separated below the bucket) and the locks taken on
/// the stores in it (by the root's key).
#[derive(Debug)]
struct Bucket {
    name: String,
    objects: Mutex<BTreeMap<String, Vec<u8>>>,
    locks: Mutex<HashMap<String, Holder>>,
}

/// Who holds a store of the bucket.
#[derive(Debug, Clone)]
struct Holder {
    /// Tells this holding from a later one of the same store.
    token: u64,
    /// The run of a shared store's leader (`Access::SharedLeader`).
    group: Option<String>,
    since_ns: i64,
}

impl Drop for Bucket {
    fn drop(&mut self) {
        let mut buckets = lock(&BUCKETS);
        if let Some(map) = buckets.as_mut() {
            // The entry is this bucket's unless a new open of the name made another one
            // since the last holder let go (that one is alive).
            if map.get(&self.name).is_some_and(|w| w.strong_count() == 0) {
                map.remove(&self.name);
            }
        }
    }
}

/// The bucket `name`: the one held now, or a new, empty one.
fn bucket(name: &str) -> Arc<Bucket> {
    let mut buckets = lock(&BUCKETS);
    let map = buckets.get_or_insert_with(HashMap::new);
    if let Some(alive) = map.get(name).and_then(Weak::upgrade) {
        return alive;
    }
    let fresh = Arc::new(Bucket { name: name.to_string(), objects: Mutex::default(), locks: Mutex::default() });
    map.insert(name.to_string(), Arc::downgrade(&fresh));
    fresh
}

/// The names of the buckets held now (for the tests: a bucket nobody holds is gone).
#[cfg(test)]
pub(crate) fn buckets_held() -> Vec<String> {
    let buckets = lock(&BUCKETS);
    let mut names: Vec<String> = buckets
        .as_ref()
        .map(|m| m.iter().filter(|(_, w)| w.strong_count() > 0).map(|(n, _)| n.clone()).collect())
        .unwrap_or_default();
    names.sort();
    names
}

fn open(place: &Path, options: &[(String, String)]) -> Result<Box<dyn Backend>, RecordError> {
    let url = place.to_str().ok_or_else(|| RecordError::Invalid("a store URL must be text".into()))?;
    if let Some((k, _)) = options.first() {
        return Err(RecordError::Invalid(format!("unknown storage option {k:?} for memory:// (it takes none)")));
    }
    let root = url.trim_end_matches('/');
    let parsed = url::Url::parse(root).map_err(|e| RecordError::Invalid(format!("{url:?} is not a URL: {e}")))?;
    let name = parsed.host_str().unwrap_or("").to_string();
    let store = MemoryStore { bucket: bucket(&name), base: PathBuf::from(format!("memory://{name}")) };
    let root_key = store.key(Path::new(root)).map_err(|e| RecordError::Invalid(format!("{url:?}: {e}")))?;
    Ok(Box::new(Memory { root: PathBuf::from(root), root_key, store }))
}

/// A store in a bucket of this process's memory (see the module documentation).
#[derive(Debug, Clone)]
pub(crate) struct MemoryStore {
    bucket: Arc<Bucket>,
    /// The path that stands for the bucket's top (`memory://bucket`): a path's key is the
    /// path relative to it.
    base: PathBuf,
}

impl MemoryStore {
    /// The key of the object at `path` (`""`: the bucket's top).
    fn key(&self, path: &Path) -> io::Result<String> {
        let rel = path.strip_prefix(&self.base).map_err(|_| {
            io::Error::new(io::ErrorKind::InvalidInput, format!("{} is outside {}", path.display(), self.base.display()))
        })?;
        let mut parts = Vec::new();
        for c in rel.components() {
            match c {
                Component::Normal(p) => parts.push(p.to_str().ok_or_else(|| {
                    io::Error::new(io::ErrorKind::InvalidInput, format!("{} is not text", path.display()))
                })?),
                _ => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("{}: a key's parts are names (no '.', '..' or root)", path.display()),
                    ))
                }
            }
        }
        Ok(parts.join("/"))
    }

    /// The keys' prefix of everything below `key`.
    fn below(key: &str) -> String {
        if key.is_empty() {
            String::new()
        } else {
            format!("{key}/")
        }
    }
}

fn not_found(path: &Path) -> io::Error {
    io::Error::new(io::ErrorKind::NotFound, format!("no object {}", path.display()))
}

impl Store for MemoryStore {
    fn create_dir(&self, _dir: &Path) -> io::Result<()> {
        Ok(())
    }

    fn exists(&self, path: &Path) -> bool {
        let Ok(key) = self.key(path) else { return false };
        let objects = lock(&self.bucket.objects);
        let below = Self::below(&key);
        objects.contains_key(&key) || objects.range(below.clone()..).next().is_some_and(|(k, _)| k.starts_with(&below))
    }

    fn get(&self, path: &Path) -> io::Result<Vec<u8>> {
        let key = self.key(path)?;
        lock(&self.bucket.objects).get(&key).cloned().ok_or_else(|| not_found(path))
    }

    fn get_range(&self, path: &Path, range: std::ops::Range<u64>) -> io::Result<Vec<u8>> {
        let key = self.key(path)?;
        let objects = lock(&self.bucket.objects);
        let bytes = objects.get(&key).ok_or_else(|| not_found(path))?;
        let (start, end) = (usize::try_from(range.start), usize::try_from(range.end));
        match (start, end) {
            (Ok(s), Ok(e)) if s <= e && e <= bytes.len() => Ok(bytes[s..e].to_vec()),
            _ => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("bytes {range:?} of {} are not all there: it has {}", path.display(), bytes.len()),
            )),
        }
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<PathBuf>> {
        let below = Self::below(&self.key(dir)?);
        let objects = lock(&self.bucket.objects);
        let mut names: Vec<&str> = objects
            .range(below.clone()..)
            .take_while(|(k, _)| k.starts_with(&below))
            .filter_map(|(k, _)| k[below.len()..].split('/').next())
            .collect();
        names.sort_unstable();
        names.dedup();
        Ok(names.into_iter().map(|n| dir.join(n)).collect())
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        let key = self.key(path)?;
        let below = Self::below(&key);
        let mut objects = lock(&self.bucket.objects);
        objects.remove(&key);
        let doomed: Vec<String> = objects.range(below.clone()..).take_while(|(k, _)| k.starts_with(&below)).map(|(k, _)| k.clone()).collect();
        for k in doomed {
            objects.remove(&k);
        }
        Ok(())
    }

    fn put(&self, path: &Path, bytes: &[u8], _put: Put) -> Result<(), RecordError> {
        // Every put is atomic here: readers see the old bytes or the new ones.
        let key = self.key(path).map_err(|e| RecordError::Io { errno: Some(libc::EINVAL), message: e.to_string() })?;
        lock(&self.bucket.objects).insert(key, bytes.to_vec());
        Ok(())
    }

    fn in_place(&self) -> Option<&dyn InPlace> {
        Some(self)
    }
}

/// [`InPlace::write_at`] on an object's bytes: `bufs` back to back at `offset`, the
/// object then at least `size` bytes long (bytes never written are zeros).
fn write_at_in(object: &mut Vec<u8>, offset: u64, bufs: &[&[u8]], size: u64) -> Result<(), String> {
    let len: usize = bufs.iter().map(|b| b.len()).sum();
    let too_large = || format!("offset {offset} and size {size} are too large for memory");
    let start = usize::try_from(offset).map_err(|_| too_large())?;
    let end = start.checked_add(len).ok_or_else(too_large)?;
    let size = usize::try_from(size).map_err(|_| too_large())?;
    if object.len() < end.max(size) {
        object.resize(end.max(size), 0);
    }
    let mut at = start;
    for b in bufs {
        object[at..at + b.len()].copy_from_slice(b);
        at += b.len();
    }
    Ok(())
}

impl InPlace for MemoryStore {
    fn write_at(&self, path: &Path, offset: u64, bufs: &[&[u8]], size: u64) -> Result<(), RecordError> {
        let key = self.key(path).map_err(|e| RecordError::Io { errno: Some(libc::EINVAL), message: e.to_string() })?;
        let mut objects = lock(&self.bucket.objects);
        write_at_in(objects.entry(key).or_default(), offset, bufs, size)
            .map_err(|e| RecordError::Io { errno: Some(libc::EFBIG), message: format!("cannot write {}: {e}", path.display()) })
    }
}

/// A store in a bucket of this process's memory, opened at its root.
#[derive(Debug)]
struct Memory {
    root: PathBuf,
    root_key: String,
    store: MemoryStore,
}

/// The lock [`Memory`] hands out: the bucket's holder record of the root, removed when
/// this value is dropped.
#[derive(Debug)]
struct MemoryLock {
    bucket: Arc<Bucket>,
    root_key: String,
    token: u64,
}

impl Held for MemoryLock {}

impl Drop for MemoryLock {
    fn drop(&mut self) {
        let mut locks = lock(&self.bucket.locks);
        if locks.get(&self.root_key).is_some_and(|h| h.token == self.token) {
            locks.remove(&self.root_key);
        }
    }
}

fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

impl Memory {
    /// The refusal of the store `holder` holds.
    fn busy(&self, holder: &Holder) -> RecordError {
        #[allow(clippy::cast_precision_loss)] // seconds for a message
        let since = holder.since_ns as f64 / 1e9;
        let who = match &holder.group {
            Some(g) => format!("the hostfeed.Recorders of run {g} in this process have it open"),
            None => format!("another hostfeed.Recorder of this process (pid {}) has it open", std::process::id()),
        };
        RecordError::Io {
            errno: Some(libc::EBUSY),
            message: format!(
                "{} is locked: {who} (since UNIX time {since:.0}); close that recorder first, or record to \
                 another path",
                self.root.display()
            ),
        }
    }

    /// Takes the lock for `access` (a shared store's member joins its leader's).
    fn take(&self, access: &Access) -> Result<Box<dyn Held>, RecordError> {
        static TOKENS: AtomicU64 = AtomicU64::new(1);
        let mut locks = lock(&self.store.bucket.locks);
        if let Access::SharedMember { group } = access {
            return match locks.get(&self.root_key) {
                Some(h) if h.group.as_deref() == Some(group.as_str()) => Ok(Box::new(Joined)),
                Some(h) => Err(self.busy(h)),
                None => Err(RecordError::Io {
                    errno: Some(libc::ENOENT),
                    message: format!(
                        "{}: the leader of this run holds no lock on the store in this process: a memory:// \
                         store lives in the memory of one process, and the processes of a jax.distributed \
                         run cannot share it; record to a shared file system or an object store",
                        self.root.display()
                    ),
                }),
            };
        }
        if let Some(h) = locks.get(&self.root_key) {
            return Err(self.busy(h));
        }
        let token = TOKENS.fetch_add(1, Ordering::Relaxed);
        let holder = Holder { token, group: access.group().map(str::to_string), since_ns: now_ns() };
        locks.insert(self.root_key.clone(), holder);
        Ok(Box::new(MemoryLock { bucket: Arc::clone(&self.store.bucket), root_key: self.root_key.clone(), token }))
    }
}

impl Backend for Memory {
    fn root(&self) -> &Path {
        &self.root
    }

    fn store(&self, _durable: bool) -> Box<dyn Store> {
        Box::new(self.store.clone())
    }

    /// The lock is taken first (in one step: nothing else can come between a look and
    /// the taking, in one process), then the root checked and an earlier recording
    /// removed; a refusal after the lock releases it.
    fn prepare(&self, mode: Mode, _lease: Duration, access: &Access) -> Result<Box<dyn Held>, RecordError> {
        let held = self.take(access)?;
        if matches!(access, Access::SharedMember { .. }) {
            return Ok(held); // its leader prepared the store
        }
        check_existing(&self.store, &self.root, mode)?;
        clear_root(&self.store, &self.root, mode)?;
        Ok(held)
    }

    fn lock(&self, _lease: Duration, access: &Access) -> Result<Box<dyn Held>, RecordError> {
        self.take(access)
    }

    fn is_held(&self) -> bool {
        lock(&self.store.bucket.locks).contains_key(&self.root_key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::backend::conformance::{self, Offers};

    #[test]
    fn the_memory_store_passes_the_store_conformance_suite() {
        let bucket = format!("conformance-{}", std::process::id());
        conformance::run(
            &|name| open(Path::new(&format!("memory://{bucket}/{name}")), &[]).unwrap(),
            Offers { in_place: true, streams: false },
        );
        assert!(!buckets_held().contains(&bucket), "the bucket is freed once nothing holds it");
    }

    #[test]
    fn a_bucket_lives_while_a_store_lock_or_back_end_holds_it() {
        let url = "memory://held-by-whom/run.zarr";
        let opened = open(Path::new(url), &[]).unwrap();
        let store = opened.store(false);
        let held = opened.lock(Duration::from_secs(60), &Access::Exclusive).unwrap();
        drop(opened);
        store.put(&Path::new(url).join("k"), b"kept", Put::Fresh).unwrap();
        let again = open(Path::new(url), &[]).unwrap();
        assert!(again.is_held(), "one bucket for every open of its URL meanwhile");
        assert_eq!(again.store(false).get(&Path::new(url).join("k")).unwrap(), b"kept");
        drop((store, again));
        assert_eq!(buckets_held(), ["held-by-whom"], "the lock alone keeps it");
        drop(held);
        assert!(buckets_held().is_empty(), "freed once the last holder lets go");
        let fresh = open(Path::new(url), &[]).unwrap();
        assert!(!fresh.store(false).exists(&Path::new(url).join("k")), "a new bucket is empty");
    }

    #[test]
    fn a_memory_store_takes_no_options_and_refuses_other_processes_of_a_run() {
        let e = open(Path::new("memory://b/r.zarr"), &[("aws_region".into(), "x".into())]).err().unwrap();
        assert!(e.to_string().contains("unknown storage option \"aws_region\" for memory://"), "{e}");
        let m = open(Path::new("memory://b/r.zarr"), &[]).unwrap();
        let e = m.prepare(Mode::Create, Duration::from_secs(60), &Access::SharedMember { group: "g".into() }).err().unwrap();
        assert!(e.to_string().contains("cannot share it"), "{e}");
    }
}
