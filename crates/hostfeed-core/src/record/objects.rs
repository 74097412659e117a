//! Object stores (S3, Google Cloud Storage, Azure Blob Storage; the `object_store` crate's
//! in-memory store for `cargo test`) as a [`Store`], through the `object_store` crate, and the lock on a store that
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
use std::time::{Duration, Instant};

use futures_util::TryStreamExt;
use object_store::path::Path as Key;
use object_store::{
    BackoffConfig, ObjectStore, ObjectStoreExt, ObjectStoreScheme, PutMode, PutOptions, PutPayload,
    RetryConfig, UpdateVersion, WriteMultipart,
};

use crate::error::RecordError;
use crate::host::sync::lock;
use crate::record::store::{InPlace, Put, Store, Streamed};

mod lock;
mod upload;
pub(crate) use lock::ObjectLock;
use upload::Upload;

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
/// The longest `Recorder(...)` tries to reach an object store before it fails (requests
/// after the open are retried for the whole `retry_timeout`).
const REACH_TIMEOUT: Duration = Duration::from_secs(15);
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
    /// Objects put in one request, multipart uploads completed and aborted (for the tests).
    single_puts: AtomicU64,
    multipart_puts: AtomicU64,
    multipart_aborts: AtomicU64,
}

impl std::fmt::Debug for Objects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The root only: never the options (credentials).
        f.debug_struct("Objects").field("root", &self.root).finish_non_exhaustive()
    }
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

/// Whether option (or environment variable) `key` holds an absolute URL: an endpoint, a
/// base URL, a proxy, a full credentials URI.
fn is_url_option(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    k.contains("endpoint") || k.ends_with("_url") || k.ends_with("full_uri")
}

/// Checks that every URL among `options` ([`is_url_option`]) and in the
/// environment variables the provider reads (`env_prefix`: `AWS_ENDPOINT`, ...) is an
/// absolute `http://` or `https://` URL with a host: the `object_store` crate panics on a
/// request to an endpoint it cannot make a URI of (`"not a url"`, `""`, `"http://"`).
///
/// # Errors
/// [`RecordError::Invalid`] naming the option (or variable) and its value.
fn check_endpoints(options: &[(String, String)], env_prefix: &str) -> Result<(), RecordError> {
    let from_env = std::env::vars()
        .filter(|(k, _)| {
            let k = k.to_ascii_uppercase();
            k.starts_with(env_prefix) && is_url_option(&k)
        })
        .map(|(k, v)| (format!("environment variable {k}"), v));
    let given = options
        .iter()
        .filter(|(k, _)| is_url_option(k))
        .map(|(k, v)| (format!("storage option {k:?}"), v.clone()));
    // Values go into HTTP headers (credentials, tokens), where the crate panics on a
    // control character.
    if let Some((k, _)) = options.iter().find(|(_, v)| v.chars().any(char::is_control)) {
        return Err(invalid(format!("storage option {k:?} contains a control character")));
    }
    for (what, value) in given.chain(from_env) {
        let ok = url::Url::parse(value.trim())
            .ok()
            .is_some_and(|u| matches!(u.scheme(), "http" | "https") && u.host_str().is_some_and(|h| !h.is_empty()));
        if !ok {
            return Err(invalid(format!(
                "{what} must be an http:// or https:// URL with a host (e.g. \"http://127.0.0.1:9000\"), got {value:?}"
            )));
        }
    }
    Ok(())
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
        // Transient errors are retried for `retry_timeout` (object_store's default, 180 s),
        // however many retries that takes, unless `max_retries` says otherwise: with the
        // crate's default of 10 retries, backing off from 100 ms, a server away for more
        // than 2-4 s failed the write long before the timeout the docs promise.
        let mut retry = RetryConfig { max_retries: usize::MAX, ..RetryConfig::default() };
        let mut hold_limit = DEFAULT_SINGLE_PUT_BYTES;
        let mut provider: Vec<(String, String)> = Vec::new();
        let mut secrets: Vec<String> = std::env::vars()
            .filter(|(k, v)| is_secret(k) && v.len() >= 4)
            .map(|(_, v)| v)
            .collect();
        let env_prefix = match scheme {
            ObjectStoreScheme::AmazonS3 => "AWS_",
            ObjectStoreScheme::GoogleCloudStorage => "GOOGLE_",
            ObjectStoreScheme::MicrosoftAzure => "AZURE_",
            _ => "HOSTFEED_NONE_",
        };
        check_endpoints(options, env_prefix)?;
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
            // The registry (`backend.rs`) hands this back-end only the schemes of its row,
            // each one the crate parses as one of the three above; it names the others.
            other => return Err(invalid(format!("{url:?} names a {other:?} store, which no client here serves"))),
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
            multipart_aborts: AtomicU64::new(0),
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

    /// What a read of `path` that found no object says: a provider answers "not found" for
    /// a missing bucket too, so the bucket is looked at (one listing, the error path only)
    /// to say when it is gone rather than the object.
    fn no_object(&self, path: &Path) -> String {
        let listed = self.key(&self.root).ok().map(|key| {
            self.run(async { tokio::time::timeout(REACH_TIMEOUT, self.inner.list_with_delimiter(Some(&key))).await })
        });
        let bucket_gone = match &listed {
            Some(Ok(Err(e))) => {
                let text = e.to_string();
                matches!(e, object_store::Error::NotFound { .. })
                    || ["NoSuchBucket", "bucket does not exist", "ContainerNotFound"].iter().any(|m| text.contains(m))
            }
            _ => false,
        };
        if bucket_gone {
            format!(
                "no object {}: the bucket {} is gone (deleted while the recorder was open?): recreate it, or \
                 record to another store",
                path.display(),
                self.base.display()
            )
        } else {
            format!("no object {}", path.display())
        }
    }

    /// A request that touches the bucket, so that a missing bucket, wrong credentials or an
    /// unreachable server fail at open, naming the store.
    ///
    /// # Errors
    /// The store's error.
    pub(crate) fn check_reachable(&self) -> Result<(), RecordError> {
        const ADVICE: &str = " (check the URL's bucket, the endpoint, region and credentials: the provider's \
                              environment variables or storage_options)";
        let key = self.key(&self.root).map_err(|e| RecordError::Io { errno: Some(libc::EINVAL), message: e.to_string() })?;
        // Retried like any request, but for at most REACH_TIMEOUT: a wrong endpoint is an
        // error at open, not a wait of the whole retry_timeout.
        let listed = self.run(async {
            tokio::time::timeout(REACH_TIMEOUT, self.inner.list_with_delimiter(Some(&key))).await
        });
        match listed {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => {
                let mut err = self.fail("reach", &self.root, &e);
                if let RecordError::Io { message, .. } = &mut err {
                    message.push_str(ADVICE);
                }
                Err(err)
            }
            Err(_) => Err(RecordError::Io {
                errno: Some(libc::ETIMEDOUT),
                message: format!(
                    "cannot reach {}: no answer in {} s{ADVICE}",
                    self.root.display(),
                    REACH_TIMEOUT.as_secs()
                ),
            }),
        }
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
            Ok(None) => Err(io::Error::new(io::ErrorKind::NotFound, self.no_object(path))),
            Err(e) => Err(self.io(&e)),
        }
    }

    fn get_range(&self, path: &Path, range: std::ops::Range<u64>) -> io::Result<Vec<u8>> {
        let key = self.key(path)?;
        match self.run(self.inner.get_range(&key, range)) {
            Ok(bytes) => Ok(bytes.to_vec()),
            Err(object_store::Error::NotFound { .. }) => Err(io::Error::new(io::ErrorKind::NotFound, self.no_object(path))),
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
            // such as s3s-fs, refuse to delete what is a folder in their files, and answer a
            // HEAD of one with a 500 that would be retried for the whole retry_timeout).
            // hostfeed never writes an object and objects below it under one key.
            if doomed.is_empty() && self.inner.head(&key).await.is_ok() {
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
        let key = self.key(path).map_err(|e| RecordError::Io { errno: Some(libc::EINVAL), message: e.to_string() })?;
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
            .map_err(|e| RecordError::Io { errno: Some(libc::EINVAL), message: e.to_string() })
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

impl Drop for Objects {
    fn drop(&mut self) {
        if std::process::id() == self.pid {
            // SAFETY: dropped once, here, and never used again.
            unsafe { ManuallyDrop::drop(&mut self.rt) };
        }
    }
}

#[cfg(test)]
mod tests;
