//! The lock on a store that lives in an object store (see the parent module's
//! documentation): a conditionally created object with a holder record and a lease.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use object_store::path::Path as Key;
use object_store::{ObjectStoreExt, PutMode, UpdateVersion};
use serde_json::{json, Value};

use super::Objects;
use crate::error::RecordError;
use crate::host::sync::lock;
use crate::record::store::Store;
use crate::record::storelock::{Access, LOCK_FILE};

fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: `buf` is writable for its whole length, which is what we pass.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "?".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

fn as_ns(d: Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

/// The lock on a store in an object store (see the module documentation): held while
/// this value lives, renewed by [`ObjectLock::renew_if_due`], deleted when dropped by the
/// process that took it.
pub(crate) struct ObjectLock {
    objects: Arc<Objects>,
    key: Key,
    path: PathBuf,
    record: Value,
    lease: Duration,
    state: Mutex<LeaseState>,
}

struct LeaseState {
    version: UpdateVersion,
    renewed: Instant,
    /// Renewal found the lock taken over: never renew or delete it again.
    lost: bool,
}

impl std::fmt::Debug for ObjectLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectLock").field("path", &self.path).finish_non_exhaustive()
    }
}

/// The refusal of a store held by the recorder that `holder` describes.
fn busy(root: &Path, holder: Option<&Value>) -> RecordError {
    let who = holder.map_or_else(
        || "another hostfeed.Recorder has it open (holder unknown)".to_string(),
        |h| {
            let left = (h["lease_until_ns"].as_i64().unwrap_or(0) - now_ns()).max(0);
            #[allow(clippy::cast_precision_loss)] // seconds for a message
            let (since, left) = (h["since_ns"].as_i64().unwrap_or(0) as f64 / 1e9, left as f64 / 1e9);
            format!(
                "a hostfeed.Recorder of process {} on host {} has it open (since UNIX time {since:.0}; \
                 its lease ends in {left:.1} s unless renewed)",
                h["pid"],
                h["host"].as_str().unwrap_or("?"),
            )
        },
    );
    RecordError::Io {
        errno: Some(libc::EBUSY),
        message: format!(
            "{} is locked: {who}; close that recorder first (a live recorder renews its lease; \
             if its process died, the store opens again once the lease has ended), or record \
             to another path",
            root.display()
        ),
    }
}

impl ObjectLock {
    /// The lock object's key and path for the store at `root`.
    fn location(objects: &Objects, root: &Path) -> Result<(Key, PathBuf), RecordError> {
        let path = root.join(LOCK_FILE);
        let key = objects.key(&path).map_err(|e| RecordError::Io { errno: Some(libc::EINVAL), message: e.to_string() })?;
        Ok((key, path))
    }

    /// Whether a live recorder holds the store at `root` (its lease has not ended).
    ///
    /// # Errors
    /// The busy error naming the holder; the store's errors.
    pub(crate) fn check_free(objects: &Objects, root: &Path) -> Result<(), RecordError> {
        let (key, path) = Self::location(objects, root)?;
        match objects.get_versioned(&key) {
            Ok(None) => Ok(()),
            Ok(Some((bytes, _))) => {
                let holder = serde_json::from_slice::<Value>(&bytes).ok();
                if holder.as_ref().is_some_and(|h| h["lease_until_ns"].as_i64().unwrap_or(0) > now_ns()) {
                    Err(busy(root, holder.as_ref()))
                } else {
                    Ok(())
                }
            }
            Err(e) => Err(objects.fail("read the lock", &path, &e)),
        }
    }

    /// Whether a live recorder holds the store at `root`, read only: a lock object whose
    /// lease has not ended (one that is not a holder record counts as held: someone wrote
    /// it); `false` where there is none, or it cannot be read.
    pub(crate) fn is_live(objects: &Objects, root: &Path) -> bool {
        let Ok((key, _)) = Self::location(objects, root) else { return false };
        match objects.get_versioned(&key) {
            Ok(Some((bytes, _))) => serde_json::from_slice::<Value>(&bytes)
                .ok()
                .and_then(|h| h["lease_until_ns"].as_i64())
                .is_none_or(|until| until > now_ns()),
            Ok(None) | Err(_) => false,
        }
    }

    /// Takes the lock of the store at `root` for `lease`; a lock whose lease has ended is
    /// taken over (conditionally: of two openers, one wins).
    ///
    /// # Errors
    /// [`RecordError::Io`] with `EBUSY` naming the holder; the store's errors.
    pub(crate) fn acquire(
        objects: &Arc<Objects>,
        root: &Path,
        lease: Duration,
        access: &Access,
    ) -> Result<ObjectLock, RecordError> {
        let (key, path) = Self::location(objects, root)?;
        let since = now_ns();
        let mut record = json!({
            "pid": std::process::id(),
            "host": hostname(),
            "access": access.name(),
            "since_ns": since,
            "lease_ns": as_ns(lease),
            "lease_until_ns": since.saturating_add(as_ns(lease)),
        });
        if let Some(group) = access.group() {
            record["group"] = json!(group);
        }
        let bytes = record.to_string().into_bytes();
        let taken = match objects.put_mode(&key, &bytes, PutMode::Create) {
            Ok(v) => v,
            Err(object_store::Error::AlreadyExists { .. } | object_store::Error::Precondition { .. }) => {
                let current = objects.get_versioned(&key).map_err(|e| objects.fail("read the lock", &path, &e))?;
                let Some((held, version)) = current else {
                    // Released meanwhile: try once more.
                    return Self::acquire_fresh(objects, root, lease, key, path, record);
                };
                let holder = serde_json::from_slice::<Value>(&held).ok();
                if holder.as_ref().is_some_and(|h| h["lease_until_ns"].as_i64().unwrap_or(0) > now_ns()) {
                    return Err(busy(root, holder.as_ref()));
                }
                objects.put_mode(&key, &bytes, PutMode::Update(version)).map_err(|e| match e {
                    object_store::Error::Precondition { .. } | object_store::Error::AlreadyExists { .. } => {
                        busy(root, None)
                    }
                    e => objects.fail("take over the lock", &path, &e),
                })?
            }
            Err(e) => return Err(objects.fail("create the lock", &path, &e)),
        };
        Ok(Self::held(objects, key, path, record, lease, taken))
    }

    /// A member of a shared store's run joins the lock its leader took: the lock object
    /// must name the run `group` and its lease must not have ended (nothing is written;
    /// the leader renews the lease for the run).
    ///
    /// # Errors
    /// The busy error naming the holder when another run (or no one) holds the store; the
    /// store's errors.
    pub(crate) fn join(objects: &Objects, root: &Path, group: &str) -> Result<(), RecordError> {
        let (key, path) = Self::location(objects, root)?;
        let held = objects.get_versioned(&key).map_err(|e| objects.fail("read the lock", &path, &e))?;
        let holder = held.and_then(|(bytes, _)| serde_json::from_slice::<Value>(&bytes).ok());
        let live = holder.as_ref().is_some_and(|h| h["lease_until_ns"].as_i64().unwrap_or(0) > now_ns());
        if live && holder.as_ref().is_some_and(|h| h["group"].as_str() == Some(group)) {
            return Ok(());
        }
        if holder.is_none() {
            return Err(RecordError::Io {
                errno: Some(libc::ENOENT),
                message: format!(
                    "{}: the leader of this run (process 0) holds no lock on the store (it closed \
                     it, or never opened it)",
                    root.display()
                ),
            });
        }
        Err(busy(root, holder.as_ref()))
    }

    fn acquire_fresh(
        objects: &Arc<Objects>,
        root: &Path,
        lease: Duration,
        key: Key,
        path: PathBuf,
        record: Value,
    ) -> Result<ObjectLock, RecordError> {
        let bytes = record.to_string().into_bytes();
        match objects.put_mode(&key, &bytes, PutMode::Create) {
            Ok(v) => Ok(Self::held(objects, key, path, record, lease, v)),
            Err(object_store::Error::AlreadyExists { .. } | object_store::Error::Precondition { .. }) => {
                let holder = objects.get(&path).ok().and_then(|b| serde_json::from_slice::<Value>(&b).ok());
                Err(busy(root, holder.as_ref()))
            }
            Err(e) => Err(objects.fail("create the lock", &path, &e)),
        }
    }

    fn held(objects: &Arc<Objects>, key: Key, path: PathBuf, record: Value, lease: Duration, v: UpdateVersion) -> Self {
        ObjectLock {
            objects: Arc::clone(objects),
            key,
            path,
            record,
            lease,
            state: Mutex::new(LeaseState { version: v, renewed: Instant::now(), lost: false }),
        }
    }

    /// Renews the lease when a third of it has passed since the last renewal.
    ///
    /// # Errors
    /// The lock was taken over (our lease had ended) or cannot be renewed; reported once.
    pub(crate) fn renew_if_due(&self) -> Result<(), RecordError> {
        let mut st = lock(&self.state);
        if st.lost || st.renewed.elapsed() < self.lease / 3 {
            return Ok(());
        }
        let mut record = self.record.clone();
        record["lease_until_ns"] = json!(now_ns().saturating_add(as_ns(self.lease)));
        let bytes = record.to_string().into_bytes();
        self.objects.pace(&self.key);
        match self.objects.put_mode(&self.key, &bytes, PutMode::Update(st.version.clone())) {
            Ok(v) => {
                st.version = v;
                st.renewed = Instant::now();
                Ok(())
            }
            Err(e @ (object_store::Error::Precondition { .. } | object_store::Error::NotFound { .. })) => {
                st.lost = true;
                let mut err = self.objects.fail("renew the lease of", &self.path, &e);
                if let RecordError::Io { message, .. } = &mut err {
                    message.push_str(
                        ": another recorder took the store over (this one's lease had ended without \
                         renewal); rows recorded from now on may not be announced",
                    );
                }
                Err(err)
            }
            // A transient failure (after the client's own retries): try again next tick;
            // the lease has two more thirds to go.
            Err(e) if st.renewed.elapsed() < self.lease / 3 * 2 => {
                drop(e);
                Ok(())
            }
            Err(e) => Err(self.objects.fail("renew the lease of", &self.path, &e)),
        }
    }
}

impl Drop for ObjectLock {
    fn drop(&mut self) {
        let st = lock(&self.state);
        if std::process::id() != self.objects.pid || st.lost {
            return;
        }
        // Only if the lock object is still ours (a store whose conditional create is not
        // atomic may have let a second recorder believe it holds it too).
        let ours = |held: &Value| {
            ["pid", "host", "since_ns"].iter().all(|k| held[*k] == self.record[*k])
        };
        if let Ok(Some((bytes, _))) = self.objects.get_versioned(&self.key) {
            if serde_json::from_slice::<Value>(&bytes).is_ok_and(|h| ours(&h)) {
                let _ = self.objects.run(self.objects.inner.delete(&self.key));
            }
        }
    }
}
