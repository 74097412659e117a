//! Where a recording's bytes go: [`Store`], the seam between the recorder and a storage
//! back-end, and [`FsStore`], the local file system (object stores are `objects.rs`).
//!
//! The recorder names everything it stores by path: the store's root joined with Zarr's
//! keys (`layer1/h/zarr.json`, `layer1/h/c/0/0`). The file system uses the paths as they
//! are; a back-end of another kind maps a path to its own name for the object (an object
//! store: the path relative to the root, `/`-separated).
//!
//! The operations are what the recorder needs, in terms that every kind of store can
//! provide: directories made before objects are put below them (none to make in an object
//! store), whole objects put, read back, listed and removed, and writes into part of an
//! object, the one capability an object store lacks ([`Store::in_place`]: `None` there).
//! A whole-object put says what readers may see of the object meanwhile ([`Put`]): the
//! file system then writes a fresh object in place and replaces one that readers may hold
//! by renaming a temporary file over it, where an object store's put is atomic anyway.
//!
//! The lock on an open store is not part of this seam but of the back-end that owns the
//! store (`backend.rs`): on a file system an `flock` on a file in the store
//! (`storelock.rs`); in an object store, a conditionally created lock object with a lease
//! (`objects/lock.rs`).
//!
//! Operations of one step return the OS's [`io::Error`] for the caller to word; [`Store::put`]
//! and [`InPlace::write_at`], of several steps, return the [`RecordError`] that names the
//! step that failed and its path.
//!
//! No Python here.

use std::fs::{self, File, OpenOptions};
use std::io::{self, IoSlice, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::RecordError;

/// Most buffers in one vectored write (Linux's `IOV_MAX` is 1024).
pub(crate) const MAX_IOV: usize = 1024;

/// What readers may see of an object while [`Store::put`] writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Put {
    /// Nothing announced refers to it yet (a compressed chunk past the announced rows): no
    /// reader looks at it, so a torn write is harmless.
    Fresh,
    /// It may hold announced rows (a compressed chunk written again): readers see its old
    /// bytes or its new ones, never a mix.
    Replace,
    /// A metadata document (`zarr.json`): replaced as [`Put::Replace`], and on a durable
    /// store the replacement itself survives an OS crash.
    Document,
}

/// A storage back-end of the recorder (see the module documentation). Shared by the
/// recorder's threads.
pub(crate) trait Store: Send + Sync {
    /// Makes directory `dir` and its parents exist (nothing to do where objects need no
    /// directories).
    ///
    /// # Errors
    /// The OS's.
    fn create_dir(&self, dir: &Path) -> io::Result<()>;

    /// Whether something is stored at `path` (an object, or objects below it).
    fn exists(&self, path: &Path) -> bool;

    /// The bytes of the object at `path`.
    ///
    /// # Errors
    /// The OS's (no such object, among others).
    fn get(&self, path: &Path) -> io::Result<Vec<u8>>;

    /// Bytes `range` of the object at `path` (a partial read: only those bytes are read).
    ///
    /// # Errors
    /// The OS's (no such object, a range past its end, among others).
    fn get_range(&self, path: &Path, range: std::ops::Range<u64>) -> io::Result<Vec<u8>>;

    /// The paths directly below `dir` (objects and directories), in no particular order;
    /// entries that cannot be read are left out.
    ///
    /// # Errors
    /// `dir` cannot be listed.
    fn list(&self, dir: &Path) -> io::Result<Vec<PathBuf>>;

    /// Removes the object at `path`, or everything below it; nothing there is no error
    /// (removing twice succeeds, as in an object store).
    ///
    /// # Errors
    /// The OS's.
    fn remove(&self, path: &Path) -> io::Result<()>;

    /// Stores `bytes` as the whole object at `path` (its parent directory exists), readers
    /// seeing what `put` says meanwhile.
    ///
    /// # Errors
    /// [`RecordError::Io`] naming the step that failed and its path.
    fn put(&self, path: &Path, bytes: &[u8], put: Put) -> Result<(), RecordError>;

    /// Writes into part of an object, if this store can ([`InPlace`]); `None` for stores
    /// that only put whole objects.
    fn in_place(&self) -> Option<&dyn InPlace>;

    /// Starts an object written piece by piece ([`Streamed`]), if this store can (an object
    /// store's multipart upload); `None` where objects are put whole or written in place.
    ///
    /// # Errors
    /// [`RecordError::Io`] naming the object.
    fn stream(&self, _path: &Path) -> Option<Result<Box<dyn Streamed>, RecordError>> {
        None
    }

    /// Whether [`Store::stream`] starts objects here.
    fn streams(&self) -> bool {
        false
    }
}

/// An object written piece by piece: the pieces go up while the next ones are made, and
/// the object appears whole, atomically, at [`Streamed::finish`] (nothing of it before).
pub(crate) trait Streamed: Send {
    /// Adds `bytes` to the object (they may be sent later, with the next pieces).
    ///
    /// # Errors
    /// A piece sent earlier failed.
    fn push(&mut self, bytes: Vec<u8>) -> Result<(), RecordError>;

    /// Sends what is left and makes the object exist.
    ///
    /// # Errors
    /// A piece failed, or the completion did.
    fn finish(self: Box<Self>) -> Result<(), RecordError>;
}

/// A store shared with others (an object store's client is shared by the recorder and its
/// lock).
impl<S: Store + ?Sized> Store for std::sync::Arc<S> {
    fn create_dir(&self, dir: &Path) -> io::Result<()> {
        (**self).create_dir(dir)
    }
    fn exists(&self, path: &Path) -> bool {
        (**self).exists(path)
    }
    fn get(&self, path: &Path) -> io::Result<Vec<u8>> {
        (**self).get(path)
    }
    fn get_range(&self, path: &Path, range: std::ops::Range<u64>) -> io::Result<Vec<u8>> {
        (**self).get_range(path, range)
    }
    fn list(&self, dir: &Path) -> io::Result<Vec<PathBuf>> {
        (**self).list(dir)
    }
    fn remove(&self, path: &Path) -> io::Result<()> {
        (**self).remove(path)
    }
    fn put(&self, path: &Path, bytes: &[u8], put: Put) -> Result<(), RecordError> {
        (**self).put(path, bytes, put)
    }
    fn in_place(&self) -> Option<&dyn InPlace> {
        (**self).in_place()
    }
    fn stream(&self, path: &Path) -> Option<Result<Box<dyn Streamed>, RecordError>> {
        (**self).stream(path)
    }
    fn streams(&self) -> bool {
        (**self).streams()
    }
}

/// Writes into part of an object (a file system's files): what appends rows to an
/// uncompressed chunk and to the per-row metadata arrays without rewriting what they
/// hold already.
pub(crate) trait InPlace {
    /// Writes `bufs` back to back at byte `offset` of the object at `path` (created if
    /// missing, its other bytes untouched; its parent directory exists), then makes it at
    /// least `size` bytes long (bytes never written read as zeros).
    ///
    /// # Errors
    /// [`RecordError::Io`] naming the step that failed and its path.
    fn write_at(&self, path: &Path, offset: u64, bufs: &[&[u8]], size: u64) -> Result<(), RecordError>;
}

/// The local file system. With `durable`, every write is fsynced (and a document's rename
/// too, with its directory), so that it survives an OS crash, not just a killed process.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FsStore {
    pub(crate) durable: bool,
}

impl Store for FsStore {
    fn create_dir(&self, dir: &Path) -> io::Result<()> {
        fs::create_dir_all(dir)
    }

    fn exists(&self, path: &Path) -> bool {
        path.exists()
    }

    fn get(&self, path: &Path) -> io::Result<Vec<u8>> {
        fs::read(path)
    }

    fn get_range(&self, path: &Path, range: std::ops::Range<u64>) -> io::Result<Vec<u8>> {
        use std::os::unix::fs::FileExt;
        let len = usize::try_from(range.end.saturating_sub(range.start))
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        let mut buf = vec![0u8; len];
        File::open(path)?.read_exact_at(&mut buf, range.start)?;
        Ok(buf)
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<PathBuf>> {
        Ok(fs::read_dir(dir)?.filter_map(Result::ok).map(|e| e.path()).collect())
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        let removed = if path.is_dir() && !path.is_symlink() { fs::remove_dir_all(path) } else { fs::remove_file(path) };
        match removed {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            other => other,
        }
    }

    fn put(&self, path: &Path, bytes: &[u8], put: Put) -> Result<(), RecordError> {
        // A temporary file of its own: never `with_extension`, which maps the flat chunk
        // keys `c.1` and `c.2` (and `c.1.0`, `c.1.1`...) to one name.
        let target = if put == Put::Fresh { path.to_path_buf() } else { temp_path(path) };
        let mut f = File::create(&target).map_err(|e| io_error("create", &target, &e))?;
        f.write_all(bytes).map_err(|e| io_error("write", &target, &e))?;
        if self.durable {
            f.sync_data().map_err(|e| io_error("fsync", &target, &e))?;
        }
        drop(f);
        match put {
            Put::Fresh => {}
            Put::Replace => fs::rename(&target, path).map_err(|e| {
                let _ = fs::remove_file(&target);
                io_error("rename over", path, &e)
            })?,
            Put::Document => {
                fs::rename(&target, path).map_err(|e| io_error("rename into place", path, &e))?;
                if let (true, Some(dir)) = (self.durable, path.parent()) {
                    sync_dir(dir)?;
                }
            }
        }
        Ok(())
    }

    fn in_place(&self) -> Option<&dyn InPlace> {
        Some(self)
    }
}

impl InPlace for FsStore {
    fn write_at(&self, path: &Path, offset: u64, bufs: &[&[u8]], size: u64) -> Result<(), RecordError> {
        let f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(|e| io_error("open", path, &e))?;
        write_all_vectored_at(&f, bufs, offset).map_err(|e| io_error("write", path, &e))?;
        let end = offset + bufs.iter().map(|b| b.len() as u64).sum::<u64>();
        if end < size {
            // The rest is a hole, no bytes written: it reads as zeros (the fill value).
            let len = f.metadata().map_err(|e| io_error("stat", path, &e))?.len();
            if len < size {
                f.set_len(size).map_err(|e| io_error("extend", path, &e))?;
            }
        }
        if self.durable {
            f.sync_data().map_err(|e| io_error("fsync", path, &e))?;
        }
        Ok(())
    }
}

/// The error for an I/O operation `op` ("write", "create") on `path`.
#[must_use]
pub(crate) fn io_error(op: &str, path: &Path, e: &io::Error) -> RecordError {
    RecordError::Io { errno: Some(errno_of(e)), message: format!("cannot {op} {}: {e}", path.display()) }
}

/// Creates the directory that holds `path` (and those above it) in `store`.
///
/// # Errors
/// I/O errors, with the directory's path.
pub(crate) fn create_parent(store: &dyn Store, path: &Path) -> Result<(), RecordError> {
    match path.parent() {
        Some(p) => store.create_dir(p).map_err(|e| io_error("create", p, &e)),
        None => Ok(()),
    }
}

/// The OS error number of `e`, or, for an error that has none (an object store's), the one
/// its kind stands for (`EIO` for any other).
#[must_use]
pub(crate) fn errno_of(e: &io::Error) -> i32 {
    e.raw_os_error().unwrap_or(match e.kind() {
        io::ErrorKind::NotFound => libc::ENOENT,
        io::ErrorKind::AlreadyExists => libc::EEXIST,
        io::ErrorKind::PermissionDenied => libc::EACCES,
        io::ErrorKind::TimedOut => libc::ETIMEDOUT,
        io::ErrorKind::ConnectionRefused => libc::ECONNREFUSED,
        io::ErrorKind::StorageFull => libc::ENOSPC,
        io::ErrorKind::InvalidData | io::ErrorKind::InvalidInput => libc::EINVAL,
        _ => libc::EIO,
    })
}

/// A temporary file name next to `path`, unique to this process and call: `.NAME.PID.N.tmp`
/// (a leading dot: no record name component may start with one, and no Zarr key does).
/// Two writers replacing two chunks, or one chunk twice, never share a temporary file.
#[must_use]
pub(crate) fn temp_path(path: &Path) -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let name = path.file_name().map_or_else(String::new, |f| f.to_string_lossy().into_owned());
    path.with_file_name(format!(".{name}.{}.{n}.tmp", std::process::id()))
}

/// fsync of a directory (makes renames and new entries in it durable).
///
/// # Errors
/// I/O errors, with the path.
pub(crate) fn sync_dir(dir: &Path) -> Result<(), RecordError> {
    OpenOptions::new().read(true).open(dir).and_then(|d| d.sync_all()).map_err(|e| io_error("fsync", dir, &e))
}

/// Writes `bufs` back to back at `offset` of `f` with vectored writes (at most
/// [`MAX_IOV`] buffers each, continuing after partial writes).
pub(crate) fn write_all_vectored_at(f: &File, bufs: &[&[u8]], offset: u64) -> io::Result<()> {
    let mut file = f;
    file.seek(SeekFrom::Start(offset))?;
    for group in bufs.chunks(MAX_IOV) {
        let mut slices: Vec<IoSlice<'_>> = group.iter().map(|b| IoSlice::new(b)).collect();
        let mut rest = &mut slices[..];
        IoSlice::advance_slices(&mut rest, 0); // skip empty leading buffers
        while !rest.is_empty() {
            match file.write_vectored(rest) {
                Ok(0) => return Err(io::Error::from(io::ErrorKind::WriteZero)),
                Ok(n) => IoSlice::advance_slices(&mut rest, n),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}
