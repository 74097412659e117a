//! Object stores (S3, Google Cloud Storage, Azure Blob Storage, and an in-memory store for
//! tests) as a [`Store`], through the `object_store` crate, and the lock on a store that
//! lives in one ([`ObjectLock`]).
//!
//! ## Names
//!
//! The recorder names everything by path below its root; for an object store the root is
//! the URL itself as a path (`s3://bucket/runs/run1.zarr`), so that every message names
//! objects as the user does. An object's key is its path relative to the bucket
//! (`runs/run1.zarr/layer1/h/zarr.json`).
//!
//! ## What an object store changes
//!
//! * No directories: [`Store::create_dir`] does nothing; a "directory" exists while an
//!   object lies below it.
//! * No writes into part of an object ([`Store::in_place`] is `None`): the writers put
//!   whole chunks, reading back the rows of a chunk written earlier as a padded partial
//!   chunk.
//! * Every put is atomic, so [`Put::Replace`] needs no temporary object. A metadata
//!   document ([`Put::Document`]) is put *conditionally*: created only if absent the first
//!   time, then replaced only if it is still the version this process wrote (`If-Match` on
//!   its `ETag`). A second writer that got past the lock therefore cannot silently
//!   interleave its announcements with ours: one of the two fails.
//! * The lock is an object, `.hostfeed.lock`, created conditionally (`If-None-Match: *`)
//!   with a holder record and a lease that the recorder renews (conditionally again) while
//!   it is open. After a crash nobody renews it, and the store opens again once the lease
//!   has ended. The processes of one `jax.distributed` run share a store: the leader
//!   (process 0) takes the lock naming the run and renews it; the others only check that it
//!   names their run ([`ObjectLock::join`]). Each process writes the objects of its own
//!   arrays and parts; documents written by several processes (a group's) are created
//!   once, the others finding them there.
//!
//! ## Shards: one request when they can be held
//!
//! A shard ([`Store::stream`]) is held in memory while its inner chunks come and put in
//! one request when it is complete, as tensorstore and zarrs put theirs: one request per
//! object, and a server that assembles a multipart upload by copying its parts (moto
//! does) stores it once. The shards a store holds together stay within
//! [`SINGLE_PUT_BYTES`] (default [`DEFAULT_SINGLE_PUT_BYTES`]): a shard that would pass it
//! becomes a multipart upload, its held pieces its first parts, and the rest streamed as
//! its inner chunks fill (a few parts in flight; the writer waits beyond, so a slow
//! network holds rows back, and with them the devices). Either way the object appears
//! whole when it is complete, never before.
//!
//! ## Threads
//!
//! Requests are async; a small tokio runtime owned by the store runs them, and the
//! recorder's writer threads (never the device or the consumer thread) block on them.
//!
//! ## Secrets
//!
//! Credentials come from the provider's environment variables and from the
//! `storage_options` the user passes. No message of this module contains a value of a
//! secret option, nor any value of an environment variable that holds a secret: every
//! error text goes through [`Objects::redact`].
//!
//! No Python here.

use std::collections::HashMap;
use std::io;
use std::mem::ManuallyDrop;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures_util::TryStreamExt;
use object_store::path::Path as Key;
use object_store::{
    BackoffConfig, ObjectStore, ObjectStoreExt, ObjectStoreScheme, PutMode, PutOptions, PutPayload,
    RetryConfig, UpdateVersion, WriteMultipart,
};
use serde_json::{json, Value};

use crate::error::RecordError;
use crate::host::sync::lock;
use crate::record::store::{InPlace, Put, Store, Streamed};
use crate::record::storelock::{Access, LOCK_FILE};

/// Option names (lowercase, as `object_store`'s config keys or the environment variables
/// they come from) whose values are secrets: never shown.
const SECRET_WORDS: [&str; 6] = ["secret", "token", "key", "password", "credential", "sas"];

/// The options hostfeed itself reads from `storage_options` (the rest are the crate's).
pub(crate) const RETRY_TIMEOUT: &str = "retry_timeout";
/// See [`RETRY_TIMEOUT`].
pub(crate) const MAX_RETRIES: &str = "max_retries";
/// See [`RETRY_TIMEOUT`]: the most bytes of shards held to be put in one request each.
pub(crate) const SINGLE_PUT_BYTES: &str = "single_put_bytes";
/// Default of [`SINGLE_PUT_BYTES`]: four shards of the default 256 MiB with their indexes,
/// one for each of the four writers a recorder has in an object store by default.
pub(crate) const DEFAULT_SINGLE_PUT_BYTES: usize = (1 << 30) + (1 << 20);
/// The largest object S3 takes in one request (5 GiB; GCS and Azure take more).
const SINGLE_PUT_MAX: usize = 5 << 30;

/// Objects larger than this (shards) are put as multipart uploads, in parallel parts.
const MULTIPART_ABOVE: usize = 32 << 20;
/// Bytes of a part of a multipart upload (S3 takes 5 MiB to 5 GiB, the last part smaller).
const PART: usize = 16 << 20;
/// Parts of one upload in flight at a time.
const PARTS_IN_FLIGHT: usize = 4;
/// Google Cloud Storage's rate of updates of one object: one a second.
const GCS_UPDATE_EVERY: Duration = Duration::from_secs(1);

/// Whether the option (or environment variable) `name` holds a secret.
fn is_secret(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    SECRET_WORDS.iter().any(|w| n.contains(w)) && !n.ends_with("_id") && n != "aws_key_id"
}

/// An object store and where in it the recording lives. See the module documentation.
pub(crate) struct Objects {
    inner: Arc<dyn ObjectStore>,
    /// Dropped only by the process that made it: a forked child has none of its threads
    /// (shutting it down there would wait for them forever).
    rt: ManuallyDrop<tokio::runtime::Runtime>,
    pid: u32,
    /// The path that stands for the bucket's top (`s3://bucket`): a path's key is the path
    /// relative to it.
    base: PathBuf,
    /// The store's root, as given (`s3://bucket/runs/run1.zarr`).
    root: PathBuf,
    /// Values never to show.
    secrets: Vec<String>,
    /// The version this process last wrote of each metadata document (by key): the next
    /// replacement is conditional on it.
    versions: Mutex<HashMap<String, UpdateVersion>>,
    /// This store itself (it lives in an `Arc`), for the uploads it starts.
    me: std::sync::Weak<Objects>,
    /// The least time between two writes of one object (Google Cloud Storage allows one
    /// update of an object a second; zero elsewhere), and when each key was last written.
    update_every: Duration,
    updated: Mutex<HashMap<String, Instant>>,
    /// The most bytes of shards held at once to be put in one request each
    /// ([`SINGLE_PUT_BYTES`]), and the bytes held now.
    hold_limit: usize,
    held: AtomicUsize,
    /// Objects put in one request and multipart uploads completed (for the tests).
    single_puts: AtomicU64,
    multipart_puts: AtomicU64,
}

impl std::fmt::Debug for Objects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The root only: never the options (credentials).
        f.debug_struct("Objects").field("root", &self.root).finish_non_exhaustive()
    }
}

/// Whether `url` names an object store hostfeed can write (`s3://`, `gs://`, `az://` and
/// their aliases, `memory://`).
#[must_use]
pub fn is_object_url(url: &str) -> bool {
    url::Url::parse(url).ok().and_then(|u| ObjectStoreScheme::parse(&u).ok()).is_some_and(|(s, _)| {
        matches!(
            s,
            ObjectStoreScheme::AmazonS3
                | ObjectStoreScheme::GoogleCloudStorage
                | ObjectStoreScheme::MicrosoftAzure
                | ObjectStoreScheme::Memory
        )
    })
}

fn invalid(message: String) -> RecordError {
    RecordError::Invalid(message)
}

/// The error for option `k`, which provider `name` does not know.
fn unknown_option(k: &str, name: &str) -> RecordError {
    invalid(format!(
        "unknown storage option {k:?} for {name} (the object_store crate's config keys, e.g. \
         \"aws_endpoint\", \"aws_region\", \"google_service_account\", \
         \"azure_storage_account_name\", or hostfeed's \"{RETRY_TIMEOUT}\", \"{MAX_RETRIES}\" and \"{SINGLE_PUT_BYTES}\")"
    ))
}

/// Each option as provider `name`'s config key `K` (its name in any case), with its value.
///
/// # Errors
/// [`unknown_option`] for the first option the provider does not know.
fn config_keys<'o, K: std::str::FromStr>(
    options: &'o [(String, String)],
    name: &str,
) -> Result<Vec<(K, &'o str)>, RecordError> {
    options
        .iter()
        .map(|(k, v)| k.to_ascii_lowercase().parse().map(|key| (key, v.as_str())).map_err(|_| unknown_option(k, name)))
        .collect()
}

impl Objects {
    /// Opens the object store of `url` with `options` (the `object_store` crate's config
    /// keys of that provider, over the provider's environment variables; plus
    /// [`RETRY_TIMEOUT`] and [`MAX_RETRIES`]). Makes no request.
    ///
    /// # Errors
    /// [`RecordError::Invalid`]: not a URL of an object store, an unknown option, a value
    /// the provider's client refuses.
    pub(crate) fn open(url: &str, options: &[(String, String)]) -> Result<Arc<Objects>, RecordError> {
        let trimmed = url.trim_end_matches('/');
        let parsed = url::Url::parse(trimmed).map_err(|e| invalid(format!("{url:?} is not a URL: {e}")))?;
        let (scheme, prefix) = ObjectStoreScheme::parse(&parsed)
            .map_err(|e| invalid(format!("{url:?} names no object store hostfeed knows: {e}")))?;
        let mut retry = RetryConfig::default();
        let mut hold_limit = DEFAULT_SINGLE_PUT_BYTES;
        let mut provider: Vec<(String, String)> = Vec::new();
        let mut secrets: Vec<String> = std::env::vars()
            .filter(|(k, v)| is_secret(k) && v.len() >= 4)
            .map(|(_, v)| v)
            .collect();
        for (k, v) in options {
            let seconds = |v: &str| {
                v.trim().parse::<f64>().ok().filter(|s| s.is_finite() && *s >= 0.0).ok_or_else(|| {
                    invalid(format!("storage option {k:?} must be a number of seconds, got {v:?}"))
                })
            };
            match k.to_ascii_lowercase().as_str() {
                RETRY_TIMEOUT => retry.retry_timeout = Duration::from_secs_f64(seconds(v)?),
                MAX_RETRIES => {
                    retry.max_retries = v.trim().parse().map_err(|_| {
                        invalid(format!("storage option {k:?} must be a whole number, got {v:?}"))
                    })?;
                }
                SINGLE_PUT_BYTES => {
                    hold_limit = v.trim().parse().map_err(|_| {
                        invalid(format!("storage option {k:?} must be a whole number of bytes, got {v:?}"))
                    })?;
                }
                _ => provider.push((k.clone(), v.clone())),
            }
            if is_secret(k) && !v.is_empty() {
                secrets.push(v.clone());
            }
        }
        retry.backoff = BackoffConfig {
            init_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(15),
            base: 2.0,
        };
        let secrets_for = secrets.clone();
        let redact = move |s: String| redact_with(&secrets_for, s);
        let built: Result<Arc<dyn ObjectStore>, object_store::Error> = match scheme {
            ObjectStoreScheme::AmazonS3 => {
                // Payloads unsigned (`UNSIGNED-PAYLOAD`, as botocore sends over HTTPS, where
                // TLS protects them) unless the user says otherwise: signing hashes every
                // byte with SHA-256 on the writer threads.
                let said = std::env::var_os("AWS_UNSIGNED_PAYLOAD").is_some()
                    || provider.iter().any(|(k, _)| k.to_ascii_lowercase().ends_with("unsigned_payload"));
                let mut b = object_store::aws::AmazonS3Builder::from_env().with_url(trimmed);
                if !said {
                    b = b.with_unsigned_payload(true);
                }
                for (k, v) in config_keys(&provider, "S3")? {
                    b = b.with_config(k, v);
                }
                b.with_retry(retry).build().map(|s| Arc::new(s) as _)
            }
            ObjectStoreScheme::GoogleCloudStorage => {
                let mut b = object_store::gcp::GoogleCloudStorageBuilder::from_env().with_url(trimmed);
                for (k, v) in config_keys(&provider, "Google Cloud Storage")? {
                    b = b.with_config(k, v);
                }
                b.with_retry(retry).build().map(|s| Arc::new(s) as _)
            }
            ObjectStoreScheme::MicrosoftAzure => {
                let mut b = object_store::azure::MicrosoftAzureBuilder::from_env().with_url(trimmed);
                for (k, v) in config_keys(&provider, "Azure Blob Storage")? {
                    b = b.with_config(k, v);
                }
                b.with_retry(retry).build().map(|s| Arc::new(s) as _)
            }
            ObjectStoreScheme::Memory => {
                if let Some((k, _)) = provider.first() {
                    return Err(unknown_option(k, "memory://"));
                }
                Ok(Arc::new(object_store::memory::InMemory::new()) as _)
            }
            other => {
                return Err(invalid(format!(
                    "{url:?}: hostfeed records to s3://, gs://, az:// (abfs://, azure://) and local \
                     paths, not to {other:?} URLs"
                )))
            }
        };
        let inner = built.map_err(|e| invalid(redact(format!("cannot open {trimmed}: {e}"))))?;
        let update_every = if matches!(scheme, ObjectStoreScheme::GoogleCloudStorage) {
            GCS_UPDATE_EVERY
        } else {
            Duration::ZERO
        };
        Self::with_store(inner, trimmed, prefix.as_ref(), secrets, update_every, hold_limit)
    }

    /// An in-memory store standing for `url` (its root): the store of `cargo test`.
    ///
    /// # Errors
    /// As [`Objects::open`].
    #[cfg(test)]
    pub(crate) fn in_memory(url: &str) -> Result<Arc<Objects>, RecordError> {
        Self::in_memory_paced(url, Duration::ZERO)
    }

    /// [`Objects::in_memory`] writing an object at most once every `every`, as on GCS.
    #[cfg(test)]
    pub(crate) fn in_memory_paced(url: &str, every: Duration) -> Result<Arc<Objects>, RecordError> {
        Self::in_memory_with(url, every, DEFAULT_SINGLE_PUT_BYTES)
    }

    /// [`Objects::in_memory`] holding at most `hold_limit` bytes of shards
    /// ([`SINGLE_PUT_BYTES`]).
    #[cfg(test)]
    pub(crate) fn in_memory_holding(url: &str, hold_limit: usize) -> Result<Arc<Objects>, RecordError> {
        Self::in_memory_with(url, Duration::ZERO, hold_limit)
    }

    #[cfg(test)]
    fn in_memory_with(url: &str, every: Duration, hold_limit: usize) -> Result<Arc<Objects>, RecordError> {
        let inner = Arc::new(object_store::memory::InMemory::new());
        let parsed = url::Url::parse(url).map_err(|e| invalid(format!("{url:?} is not a URL: {e}")))?;
        let prefix = parsed.path().trim_start_matches('/').trim_end_matches('/').to_string();
        Self::with_store(inner, url.trim_end_matches('/'), &prefix, Vec::new(), every, hold_limit)
    }

    fn with_store(
        inner: Arc<dyn ObjectStore>,
        root: &str,
        prefix: &str,
        secrets: Vec<String>,
        update_every: Duration,
        hold_limit: usize,
    ) -> Result<Arc<Objects>, RecordError> {
        let base = root.strip_suffix(prefix).unwrap_or(root).trim_end_matches('/');
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("hostfeed-objects")
            .enable_all()
            .build()
            .map_err(|e| RecordError::Io {
                errno: e.raw_os_error(),
                message: format!("cannot start the object store client's threads: {e}"),
            })?;
        Ok(Arc::new_cyclic(|me| Objects {
            inner,
            rt: ManuallyDrop::new(rt),
            pid: std::process::id(),
            base: PathBuf::from(base),
            root: PathBuf::from(root),
            secrets,
            versions: Mutex::new(HashMap::new()),
            me: me.clone(),
            update_every,
            updated: Mutex::new(HashMap::new()),
            hold_limit,
            held: AtomicUsize::new(0),
            single_puts: AtomicU64::new(0),
            multipart_puts: AtomicU64::new(0),
        }))
    }

    /// Reserves `n` more bytes for an object held as `held_now` bytes so far, if the
    /// object and everything held stay within the limits.
    fn try_hold(&self, held_now: usize, n: usize) -> bool {
        if held_now + n > SINGLE_PUT_MAX.min(self.hold_limit) {
            return false;
        }
        self.held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |h| {
                Some(h + n).filter(|&t| t <= self.hold_limit)
            })
            .is_ok()
    }

    fn release_held(&self, n: usize) {
        if n > 0 {
            self.held.fetch_sub(n, Ordering::AcqRel);
        }
    }

    /// Waits, if `key` was written less than `update_every` ago, until that much time has
    /// passed (the provider would refuse the write, or throttle the bucket), then notes the
    /// write. Only writer threads and a flush or close (the GIL released) wait here.
    fn pace(&self, key: &Key) {
        if self.update_every.is_zero() {
            return;
        }
        let wait = {
            let mut updated = lock(&self.updated);
            if updated.len() > 4096 {
                updated.retain(|_, t| t.elapsed() < self.update_every);
            }
            updated.get(key.as_ref()).map_or(Duration::ZERO, |t| self.update_every.saturating_sub(t.elapsed()))
        };
        if !wait.is_zero() {
            std::thread::sleep(wait);
        }
        lock(&self.updated).insert(key.as_ref().to_string(), Instant::now());
    }

    /// The store's root as a path (the URL).
    #[must_use]
    pub(crate) fn root(&self) -> &Path {
        &self.root
    }

    /// `text` with every secret replaced by `***`.
    #[must_use]
    pub(crate) fn redact(&self, text: String) -> String {
        redact_with(&self.secrets, text)
    }

    /// The key of the object at `path` (a path below the bucket's top).
    fn key(&self, path: &Path) -> io::Result<Key> {
        let rel = path.strip_prefix(&self.base).map_err(|_| {
            io::Error::new(io::ErrorKind::InvalidInput, format!("{} is outside {}", path.display(), self.base.display()))
        })?;
        let parts: Vec<&str> = rel.iter().filter_map(|c| c.to_str()).collect();
        Key::parse(parts.join("/")).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))
    }

    fn path_of(&self, key: &Key) -> PathBuf {
        self.base.join(key.as_ref())
    }

    fn run<F: std::future::Future>(&self, f: F) -> F::Output {
        self.rt.block_on(f)
    }

    /// An `object_store` error as an [`io::Error`] of the matching kind, its text redacted.
    fn io(&self, e: &object_store::Error) -> io::Error {
        let kind = match e {
            object_store::Error::NotFound { .. } => io::ErrorKind::NotFound,
            object_store::Error::AlreadyExists { .. } | object_store::Error::Precondition { .. } => {
                io::ErrorKind::AlreadyExists
            }
            object_store::Error::PermissionDenied { .. } | object_store::Error::Unauthenticated { .. } => {
                io::ErrorKind::PermissionDenied
            }
            _ => io::ErrorKind::Other,
        };
        io::Error::new(kind, self.redact(tidy(&e.to_string())))
    }

    /// The error for operation `op` on `path`.
    fn fail(&self, op: &str, path: &Path, e: &object_store::Error) -> RecordError {
        let errno = match e {
            object_store::Error::NotFound { .. } => Some(libc::ENOENT),
            object_store::Error::AlreadyExists { .. } | object_store::Error::Precondition { .. } => {
                Some(libc::EEXIST)
            }
            object_store::Error::PermissionDenied { .. } | object_store::Error::Unauthenticated { .. } => {
                Some(libc::EACCES)
            }
            _ => Some(libc::EIO),
        };
        RecordError::Io { errno, message: self.redact(format!("cannot {op} {}: {}", path.display(), tidy(&e.to_string()))) }
    }

    /// Puts a large object (a shard) as a multipart upload, [`PART`] bytes a part and up to
    /// [`PARTS_IN_FLIGHT`] parts at a time; the object appears whole when it completes (an
    /// upload that fails is aborted).
    fn put_large(&self, key: &Key, bytes: &[u8]) -> Result<(), object_store::Error> {
        self.run(async {
            let upload = self.inner.put_multipart(key).await?;
            let mut w = WriteMultipart::new_with_chunk_size(upload, PART);
            for piece in bytes.chunks(PART) {
                if let Err(e) = w.wait_for_capacity(PARTS_IN_FLIGHT).await {
                    let _ = w.abort().await;
                    return Err(e);
                }
                w.write(piece);
            }
            w.finish().await.map(|_| ())
        })
    }

    /// Puts `bytes` at `key` with `mode`; returns the new version.
    fn put_mode(&self, key: &Key, bytes: &[u8], mode: PutMode) -> Result<UpdateVersion, object_store::Error> {
        let payload = PutPayload::from(bytes.to_vec());
        let opts = PutOptions { mode, ..PutOptions::default() };
        self.run(self.inner.put_opts(key, payload, opts)).map(UpdateVersion::from)
    }

    /// The bytes and version of the object at `key` (`None`: there is none).
    fn get_versioned(&self, key: &Key) -> Result<Option<(Vec<u8>, UpdateVersion)>, object_store::Error> {
        self.run(async {
            match self.inner.get(key).await {
                Ok(r) => {
                    let version = UpdateVersion { e_tag: r.meta.e_tag.clone(), version: r.meta.version.clone() };
                    Ok(Some((r.bytes().await?.to_vec(), version)))
                }
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(e),
            }
        })
    }

    /// A request that touches the bucket, so that a missing bucket, wrong credentials or an
    /// unreachable server fail at open, naming the store.
    ///
    /// # Errors
    /// The store's error.
    pub(crate) fn check_reachable(&self) -> Result<(), RecordError> {
        let key = self.key(&self.root).map_err(|e| RecordError::Io { errno: None, message: e.to_string() })?;
        self.run(self.inner.list_with_delimiter(Some(&key))).map(|_| ()).map_err(|e| {
            let mut err = self.fail("reach", &self.root, &e);
            if let RecordError::Io { message, .. } = &mut err {
                message.push_str(
                    " (check the URL's bucket, the endpoint, region and credentials: the provider's \
                     environment variables or storage_options)",
                );
            }
            err
        })
    }
}

/// A provider's error text with its XML body (`<?xml …><Error><Code>NoSuchBucket</Code>
/// <Message>The specified bucket does not exist</Message>…`) reduced to `Code: Message`.
fn tidy(text: &str) -> String {
    let Some(start) = text.find("<?xml") else { return text.to_string() };
    let field = |tag: &str| {
        let open = format!("<{tag}>");
        let from = text.find(&open)? + open.len();
        let to = text[from..].find(&format!("</{tag}>"))? + from;
        Some(text[from..to].to_string())
    };
    match (field("Code"), field("Message")) {
        (Some(code), Some(message)) => format!("{}{code}: {message}", &text[..start]),
        (Some(code), None) => format!("{}{code}", &text[..start]),
        _ => text.to_string(),
    }
}

fn redact_with(secrets: &[String], mut text: String) -> String {
    for s in secrets {
        if !s.is_empty() && text.contains(s.as_str()) {
            text = text.replace(s.as_str(), "***");
        }
    }
    text
}

impl Store for Objects {
    fn create_dir(&self, _dir: &Path) -> io::Result<()> {
        Ok(())
    }

    fn exists(&self, path: &Path) -> bool {
        let Ok(key) = self.key(path) else { return false };
        self.run(async {
            if self.inner.head(&key).await.is_ok() {
                return true;
            }
            self.inner
                .list_with_delimiter(Some(&key))
                .await
                .is_ok_and(|l| !l.objects.is_empty() || !l.common_prefixes.is_empty())
        })
    }

    fn get(&self, path: &Path) -> io::Result<Vec<u8>> {
        let key = self.key(path)?;
        match self.get_versioned(&key) {
            Ok(Some((bytes, version))) => {
                if key.filename() == Some("zarr.json") {
                    // A document read (a store appended to): its next replacement is
                    // conditional on the version read.
                    lock(&self.versions).entry(key.as_ref().to_string()).or_insert(version);
                }
                Ok(bytes)
            }
            Ok(None) => Err(io::Error::new(io::ErrorKind::NotFound, format!("no object {}", path.display()))),
            Err(e) => Err(self.io(&e)),
        }
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<PathBuf>> {
        let key = self.key(dir)?;
        let listed = self.run(self.inner.list_with_delimiter(Some(&key))).map_err(|e| self.io(&e))?;
        let mut out: Vec<PathBuf> = listed.objects.iter().map(|m| self.path_of(&m.location)).collect();
        out.extend(listed.common_prefixes.iter().map(|p| self.path_of(p)));
        Ok(out)
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        let key = self.key(path)?;
        self.run(async {
            let mut doomed: Vec<Key> =
                self.inner.list(Some(&key)).map_ok(|m| m.location).try_collect().await.map_err(|e| self.io(&e))?;
            // The key itself only if it names an object (not just a prefix: some servers,
            // such as s3s-fs, refuse to delete what is a folder in their files).
            if self.inner.head(&key).await.is_ok() {
                doomed.push(key.clone());
            }
            for k in &doomed {
                lock(&self.versions).remove(k.as_ref());
                match self.inner.delete(k).await {
                    Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                    Err(e) => return Err(self.io(&e)),
                }
            }
            Ok(())
        })
    }

    fn put(&self, path: &Path, bytes: &[u8], put: Put) -> Result<(), RecordError> {
        let key = self.key(path).map_err(|e| RecordError::Io { errno: None, message: e.to_string() })?;
        self.pace(&key);
        if put != Put::Document {
            let done = if bytes.len() > MULTIPART_ABOVE {
                self.put_large(&key, bytes)
            } else {
                self.put_mode(&key, bytes, PutMode::Overwrite).map(|_| ())
            };
            return done.map_err(|e| self.fail("put", path, &e));
        }
        let known = lock(&self.versions).get(key.as_ref()).cloned();
        let mode = match known {
            Some(v) if v.e_tag.is_some() || v.version.is_some() => PutMode::Update(v),
            Some(_) => PutMode::Overwrite,
            None => PutMode::Create,
        };
        match self.put_mode(&key, bytes, mode) {
            Ok(v) => {
                lock(&self.versions).insert(key.as_ref().to_string(), v);
                Ok(())
            }
            Err(e @ (object_store::Error::AlreadyExists { .. } | object_store::Error::Precondition { .. })) => {
                let mut err = self.fail("replace", path, &e);
                if let RecordError::Io { message, .. } = &mut err {
                    message.push_str(
                        ": another writer changed it meanwhile (two recorders writing one store: \
                         this one stops announcing rows)",
                    );
                }
                Err(err)
            }
            Err(e) => Err(self.fail("put", path, &e)),
        }
    }

    fn in_place(&self) -> Option<&dyn InPlace> {
        None
    }

    fn streams(&self) -> bool {
        true
    }

    fn stream(&self, path: &Path) -> Option<Result<Box<dyn Streamed>, RecordError>> {
        let started = self
            .key(path)
            .map_err(|e| RecordError::Io { errno: None, message: e.to_string() })
            .map(|key| {
                Box::new(Upload {
                    objects: self.me.upgrade().unwrap_or_else(|| unreachable!("an Objects lives in its Arc")),
                    path: path.to_path_buf(),
                    key,
                    held: Vec::new(),
                    held_bytes: 0,
                    parts: None,
                    buffer: Vec::new(),
                    in_flight: std::collections::VecDeque::new(),
                }) as Box<dyn Streamed>
            });
        Some(started)
    }
}

/// An object written piece by piece ([`Streamed`]; see "Shards" in the module
/// documentation): its pieces held while the store may hold them, and put in one request
/// at [`Streamed::finish`]; else a multipart upload, the pieces gathered into parts of at
/// least [`PART`] bytes (S3's least is 5 MiB, but for the last), each sent as soon as it is
/// complete, up to [`PARTS_IN_FLIGHT`] at a time (the writer waits for the oldest beyond
/// that).
struct Upload {
    objects: Arc<Objects>,
    path: PathBuf,
    key: Key,
    /// The pieces held (while `parts` is `None`), and their bytes, reserved in the store.
    held: Vec<bytes::Bytes>,
    held_bytes: usize,
    /// The multipart upload, once the object could not be held.
    parts: Option<Box<dyn object_store::MultipartUpload>>,
    buffer: Vec<u8>,
    in_flight: std::collections::VecDeque<tokio::task::JoinHandle<Result<(), object_store::Error>>>,
}

impl Upload {
    fn send(&mut self, bytes: Vec<u8>) -> Result<(), RecordError> {
        while self.in_flight.len() >= PARTS_IN_FLIGHT {
            self.wait_oldest()?;
        }
        let Some(parts) = self.parts.as_mut() else {
            unreachable!("parts are sent once the multipart upload has started")
        };
        let part = parts.put_part(PutPayload::from(bytes));
        self.in_flight.push_back(self.objects.rt.spawn(part));
        Ok(())
    }

    /// Starts the multipart upload and sends the pieces held so far as its first parts
    /// (their reservation released: from now on at most [`PARTS_IN_FLIGHT`] parts wait).
    fn start_multipart(&mut self) -> Result<(), RecordError> {
        let upload = self.objects.run(self.objects.inner.put_multipart(&self.key));
        self.parts = Some(upload.map_err(|e| self.objects.fail("start", &self.path, &e))?);
        self.objects.release_held(std::mem::take(&mut self.held_bytes));
        for piece in std::mem::take(&mut self.held) {
            self.gather(Vec::from(piece))?;
        }
        Ok(())
    }

    /// Adds a piece to the part being gathered; sends the part once it is large enough.
    fn gather(&mut self, bytes: Vec<u8>) -> Result<(), RecordError> {
        if self.buffer.is_empty() {
            self.buffer = bytes; // no copy: a piece of a part's size or more goes as it is
        } else {
            self.buffer.extend_from_slice(&bytes);
        }
        if self.buffer.len() >= PART {
            let part = std::mem::take(&mut self.buffer);
            self.send(part)?;
        }
        Ok(())
    }

    fn wait_oldest(&mut self) -> Result<(), RecordError> {
        let Some(h) = self.in_flight.pop_front() else { return Ok(()) };
        match self.objects.run(h) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(self.objects.fail("upload a part of", &self.path, &e)),
            Err(e) => Err(RecordError::Io { errno: Some(libc::EIO), message: format!("cannot upload a part of {}: {e}", self.path.display()) }),
        }
    }

    fn abort(&mut self) {
        for h in self.in_flight.drain(..) {
            h.abort();
        }
        if let Some(parts) = self.parts.as_mut() {
            let _ = self.objects.run(parts.abort());
        }
    }
}

impl Drop for Upload {
    fn drop(&mut self) {
        self.objects.release_held(std::mem::take(&mut self.held_bytes));
    }
}

impl Streamed for Upload {
    fn push(&mut self, bytes: Vec<u8>) -> Result<(), RecordError> {
        if self.parts.is_none() {
            if self.objects.try_hold(self.held_bytes, bytes.len()) {
                self.held_bytes += bytes.len();
                self.held.push(bytes::Bytes::from(bytes));
                return Ok(());
            }
            if let Err(e) = self.start_multipart() {
                self.abort();
                return Err(e);
            }
        }
        if let Err(e) = self.gather(bytes) {
            self.abort();
            return Err(e);
        }
        Ok(())
    }

    fn finish(mut self: Box<Self>) -> Result<(), RecordError> {
        if self.parts.is_none() {
            // Held whole: one request (retried as a whole by the client).
            let payload: PutPayload = std::mem::take(&mut self.held).into_iter().collect();
            self.objects.pace(&self.key);
            let opts = PutOptions { mode: PutMode::Overwrite, ..PutOptions::default() };
            let done = self.objects.run(self.objects.inner.put_opts(&self.key, payload, opts));
            self.objects.single_puts.fetch_add(1, Ordering::Relaxed);
            return done.map(|_| ()).map_err(|e| self.objects.fail("put", &self.path, &e));
        }
        let last = std::mem::take(&mut self.buffer);
        let sent = (if last.is_empty() { Ok(()) } else { self.send(last) }).and_then(|()| {
            while !self.in_flight.is_empty() {
                self.wait_oldest()?;
            }
            Ok(())
        });
        if let Err(e) = sent {
            self.abort();
            return Err(e);
        }
        self.objects.pace(&self.key);
        let Some(parts) = self.parts.as_mut() else { unreachable!("a multipart upload was started") };
        let done = self.objects.run(parts.complete());
        self.objects.multipart_puts.fetch_add(1, Ordering::Relaxed);
        done.map(|_| ()).map_err(|e| self.objects.fail("complete", &self.path, &e))
    }
}

impl Drop for Objects {
    fn drop(&mut self) {
        if std::process::id() == self.pid {
            // SAFETY: dropped once, here, and never used again.
            unsafe { ManuallyDrop::drop(&mut self.rt) };
        }
    }
}

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
        let key = objects.key(&path).map_err(|e| RecordError::Io { errno: None, message: e.to_string() })?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_paths_below_the_bucket() {
        let o = Objects::in_memory("memory:///runs/run1.zarr").unwrap();
        let k = o.key(&o.root().join("layer1/h/zarr.json")).unwrap();
        assert_eq!(k.as_ref(), "runs/run1.zarr/layer1/h/zarr.json");
        assert_eq!(o.path_of(&k), o.root().join("layer1/h/zarr.json"));
    }

    #[test]
    fn put_get_list_remove() {
        let o = Objects::in_memory("memory:///r.zarr").unwrap();
        let root = o.root().to_path_buf();
        o.put(&root.join("a/zarr.json"), b"{}", Put::Document).unwrap();
        o.put(&root.join("a/c/0"), b"xy", Put::Fresh).unwrap();
        assert!(o.exists(&root.join("a")) && o.exists(&root.join("a/c/0")) && !o.exists(&root.join("b")));
        assert_eq!(o.get(&root.join("a/c/0")).unwrap(), b"xy");
        let mut listed = o.list(&root.join("a")).unwrap();
        listed.sort();
        assert_eq!(listed, vec![root.join("a/c"), root.join("a/zarr.json")]);
        o.remove(&root.join("a")).unwrap();
        assert!(!o.exists(&root.join("a")));
        assert_eq!(o.get(&root.join("a/c/0")).unwrap_err().kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn a_large_object_goes_up_in_parts_and_reads_back_whole() {
        let o = Objects::in_memory("memory:///r.zarr").unwrap();
        let path = o.root().join("g/x/c/0/0");
        let bytes: Vec<u8> = (0..MULTIPART_ABOVE + PART + 12_345).map(|i| u8::try_from(i % 251).unwrap()).collect();
        o.put(&path, &bytes, Put::Fresh).unwrap();
        assert!(o.get(&path).unwrap() == bytes);
    }

    /// Streams `pieces` to a new object of `o` and finishes it.
    fn streamed(o: &Arc<Objects>, name: &str, pieces: &[Vec<u8>]) -> (PathBuf, Vec<u8>) {
        let path = o.root().join(name);
        let mut up = o.stream(&path).unwrap().unwrap();
        for p in pieces {
            up.push(p.clone()).unwrap();
        }
        up.finish().unwrap();
        (path, pieces.concat())
    }

    fn piece(n: usize, seed: usize) -> Vec<u8> {
        (0..n).map(|i| u8::try_from((i * 7 + seed) % 251).unwrap()).collect()
    }

    #[test]
    fn a_shard_held_whole_goes_up_in_one_request() {
        let o = Objects::in_memory("memory:///r.zarr").unwrap();
        let pieces = [piece(1 << 20, 1), piece(1 << 20, 2), piece(100, 3)];
        let (path, whole) = streamed(&o, "x/c/0", &pieces);
        assert!(o.get(&path).unwrap() == whole);
        assert_eq!(o.single_puts.load(Ordering::Relaxed), 1);
        assert_eq!(o.multipart_puts.load(Ordering::Relaxed), 0);
        assert_eq!(o.held.load(Ordering::Relaxed), 0, "the reservation ends with the put");
    }

    #[test]
    fn a_shard_past_the_hold_limit_becomes_a_multipart_upload() {
        // One shard larger than the limit: its held pieces become the first part.
        let o = Objects::in_memory_holding("memory:///r.zarr", (5 << 20) / 2).unwrap();
        let pieces: Vec<Vec<u8>> = (0..20).map(|k| piece(1 << 20, k)).collect();
        let (path, whole) = streamed(&o, "x/c/0", &pieces);
        assert!(o.get(&path).unwrap() == whole);
        assert_eq!((o.single_puts.load(Ordering::Relaxed), o.multipart_puts.load(Ordering::Relaxed)), (0, 1));
        assert_eq!(o.held.load(Ordering::Relaxed), 0);
        // Limit 0: every shard is streamed.
        let o = Objects::in_memory_holding("memory:///r.zarr", 0).unwrap();
        streamed(&o, "x/c/0", &[piece(10, 1)]);
        assert_eq!((o.single_puts.load(Ordering::Relaxed), o.multipart_puts.load(Ordering::Relaxed)), (0, 1));
    }

    #[test]
    fn shards_held_together_stay_within_the_limit() {
        let o = Objects::in_memory_holding("memory:///r.zarr", 3 << 20).unwrap();
        let a_path = o.root().join("a/c/0");
        let mut a = o.stream(&a_path).unwrap().unwrap();
        a.push(piece(2 << 20, 1)).unwrap();
        assert_eq!(o.held.load(Ordering::Relaxed), 2 << 20);
        // A second shard finds 1 MiB left: it is held up to that, then streamed.
        let (b_path, b_whole) = streamed(&o, "b/c/0", &[piece(1 << 20, 2), piece(1 << 20, 3)]);
        assert_eq!(o.multipart_puts.load(Ordering::Relaxed), 1);
        assert_eq!(o.held.load(Ordering::Relaxed), 2 << 20, "b's held piece was released");
        a.push(piece(1 << 20, 4)).unwrap();
        a.finish().unwrap();
        assert_eq!(o.single_puts.load(Ordering::Relaxed), 1);
        assert!(o.get(&b_path).unwrap() == b_whole);
        assert!(o.get(&a_path).unwrap() == [piece(2 << 20, 1), piece(1 << 20, 4)].concat());
        // An upload dropped unfinished (a failed write) frees what it held; no object.
        let gone = o.root().join("c/c/0");
        let mut c = o.stream(&gone).unwrap().unwrap();
        c.push(piece(1 << 20, 5)).unwrap();
        drop(c);
        assert_eq!(o.held.load(Ordering::Relaxed), 0);
        assert!(!o.exists(&gone));
    }

    #[test]
    fn a_document_is_replaced_only_from_the_version_this_process_wrote() {
        let o = Objects::in_memory("memory:///r.zarr").unwrap();
        let doc = o.root().join("zarr.json");
        o.put(&doc, b"1", Put::Document).unwrap();
        o.put(&doc, b"2", Put::Document).unwrap();
        // Another writer replaces it behind our back: our next replacement fails.
        let key = o.key(&doc).unwrap();
        o.put_mode(&key, b"theirs", PutMode::Overwrite).unwrap();
        let e = o.put(&doc, b"3", Put::Document).unwrap_err();
        assert!(e.to_string().contains("another writer changed it"), "{e}");
        assert_eq!(o.get(&doc).unwrap(), b"theirs");
    }

    #[test]
    fn the_lock_refuses_a_second_holder_until_its_lease_ends() {
        let o = Objects::in_memory("memory:///r.zarr").unwrap();
        let root = o.root().to_path_buf();
        let first = ObjectLock::acquire(&o, &root, Duration::from_secs(60), &Access::Exclusive).unwrap();
        let e = ObjectLock::acquire(&o, &root, Duration::from_secs(60), &Access::Exclusive).unwrap_err();
        assert!(matches!(e, RecordError::Io { errno: Some(libc::EBUSY), .. }), "{e}");
        assert!(e.to_string().contains(&format!("process {} on host", std::process::id())), "{e}");
        assert!(ObjectLock::check_free(&o, &root).is_err());
        drop(first);
        ObjectLock::check_free(&o, &root).unwrap();
        // A holder that never renews (a crashed process): once its lease ends, the store
        // is taken over, and the old holder's renewal reports the loss.
        let crashed = ObjectLock::acquire(&o, &root, Duration::from_millis(30), &Access::Exclusive).unwrap();
        std::thread::sleep(Duration::from_millis(40));
        let next = ObjectLock::acquire(&o, &root, Duration::from_secs(60), &Access::Exclusive).unwrap();
        let lost = crashed.renew_if_due().unwrap_err();
        assert!(lost.to_string().contains("took the store over"), "{lost}");
        drop(crashed); // must not delete the new holder's lock
        assert!(ObjectLock::check_free(&o, &root).is_err());
        drop(next);
    }

    #[test]
    fn secrets_never_appear_in_messages() {
        let o = Objects::open(
            "s3://bucket/run.zarr",
            &[
                ("aws_secret_access_key".into(), "SUPERSECRETVALUE".into()),
                ("aws_access_key_id".into(), "AKIDPUBLIC".into()),
                ("aws_endpoint".into(), "http://127.0.0.1:9".into()),
                ("aws_allow_http".into(), "true".into()),
                ("aws_region".into(), "us-east-1".into()),
                (MAX_RETRIES.into(), "0".into()),
            ],
        )
        .unwrap();
        assert!(!format!("{o:?}").contains("SUPERSECRETVALUE"));
        assert_eq!(o.redact("x SUPERSECRETVALUE y".into()), "x *** y");
        let e = o.check_reachable().unwrap_err();
        assert!(!e.to_string().contains("SUPERSECRETVALUE"), "{e}");
        assert!(e.to_string().contains("s3://bucket/run.zarr"), "{e}");
    }

    #[test]
    fn provider_errors_are_shortened_to_their_code_and_message() {
        let raw = "list failed: 404 Not Found: <?xml version=\"1.0\"?><Error><Code>NoSuchBucket</Code>\
                   <Message>The specified bucket does not exist</Message><RequestId>x</RequestId></Error>";
        assert_eq!(tidy(raw), "list failed: 404 Not Found: NoSuchBucket: The specified bucket does not exist");
        assert_eq!(tidy("plain"), "plain");
    }

    #[test]
    fn unknown_options_and_schemes_are_refused() {
        let e = Objects::open("s3://b/r.zarr", &[("aws_bogus".into(), "1".into())]).unwrap_err();
        assert!(e.to_string().contains("unknown storage option \"aws_bogus\""), "{e}");
        let e = Objects::open("s3://b/r.zarr", &[(RETRY_TIMEOUT.into(), "soon".into())]).unwrap_err();
        assert!(e.to_string().contains("number of seconds"), "{e}");
        let e = Objects::open("s3://b/r.zarr", &[(SINGLE_PUT_BYTES.into(), "1GB".into())]).unwrap_err();
        assert!(e.to_string().contains("whole number of bytes"), "{e}");
        assert!(is_object_url("s3://b/x") && is_object_url("gs://b/x") && is_object_url("az://c/x"));
        assert!(!is_object_url("file:///tmp/x") && !is_object_url("/tmp/x"));
    }
}
