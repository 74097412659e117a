//! The lock on an open store: at most one recorder writes a store at a time, across
//! threads and processes.
//!
//! The lock is an advisory `flock` on the file `.hostfeed.lock` inside the store. `flock`
//! locks belong to an open file description, so a second open of the same store conflicts
//! whether it comes from this process or another one, and the kernel releases the lock
//! when the holder closes it or dies (a killed process never leaves a store locked). The
//! file holds a JSON description of the holder ([`Holder`]), so a refused open can say who
//! holds the store. A holder removes the file when it closes (while still holding the
//! lock); an opener that locked a file removed meanwhile notices (the path no longer
//! names the file it locked) and tries again.
//!
//! ## Owners
//!
//! A lock is taken for an [`Access`]. [`Access::Exclusive`], one recorder in one process,
//! takes the `flock` exclusive. The processes of one `jax.distributed` run that write one
//! store together share it: the leader ([`Access::SharedLeader`]) takes it first and names
//! the run (its group) in the [`Holder`] record, then holds it shared; the members
//! ([`Access::SharedMember`]) take it shared and are admitted only for the same group.
//! Anyone else is refused with the [`RecordError`] that names the holder. The holder record
//! is JSON with named fields, so readers of an older format keep working when fields are
//! added.
//!
//! The lock is the one part of a store outside the storage seam (`store.rs`): it needs
//! `flock`, which only a file system offers.
//!
//! No Python here.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::error::RecordError;
use crate::record::store::io_error;

/// Name of the lock file inside a store.
pub const LOCK_FILE: &str = ".hostfeed.lock";

/// How a store is held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Access {
    /// One recorder of one process writes the store; every other open is refused.
    Exclusive,
    /// The processes of one `jax.distributed` run write the store together:
    /// the leader (process 0) takes the lock first and names the run (`group`) in the
    /// holder record; members take it shared and are admitted only for the same group.
    SharedLeader {
        group: String,
    },
    SharedMember {
        group: String,
    },
}

impl Access {
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Access::Exclusive => "exclusive",
            Access::SharedLeader { .. } | Access::SharedMember { .. } => "shared",
        }
    }

    pub(crate) fn group(&self) -> Option<&str> {
        match self {
            Access::Exclusive => None,
            Access::SharedLeader { group } | Access::SharedMember { group } => Some(group),
        }
    }
}

/// Who holds a store (the lock file's contents).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Holder {
    pub pid: u32,
    pub access: String,
    /// The run of a shared store (its leader's `group`).
    pub group: Option<String>,
    /// When the lock was taken (UNIX ns).
    pub since_ns: i64,
}

impl Holder {
    fn to_json(&self) -> Value {
        json!({"pid": self.pid, "access": self.access, "group": self.group, "since_ns": self.since_ns})
    }

    fn from_json(v: &Value) -> Option<Holder> {
        Some(Holder {
            pid: u32::try_from(v["pid"].as_u64()?).ok()?,
            access: v["access"].as_str().unwrap_or("exclusive").to_string(),
            group: v["group"].as_str().map(str::to_string),
            since_ns: v["since_ns"].as_i64().unwrap_or(0),
        })
    }
}

/// A held lock on a store; released (and its file removed) when dropped by the process
/// that took it. In a child process created by `fork` it is dropped without touching the
/// file: the parent still holds it.
#[derive(Debug)]
pub(crate) struct StoreLock {
    file: File,
    path: PathBuf,
    pid: u32,
    /// Removes the file at release (every holder but a shared store's members).
    removes: bool,
}

fn flock(file: &File, op: libc::c_int) -> std::io::Result<()> {
    // SAFETY: `flock` on a descriptor this `File` owns and keeps open; no memory is passed.
    if unsafe { libc::flock(file.as_raw_fd(), op) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// How long [`lock_exclusive`] retries a lock held by someone else: a reader asking whether
/// a writer holds the store (`check_free`, `hostfeed.follow`) holds it shared for
/// microseconds, and must not make a recorder opening at that moment fail as busy.
const READER_GRACE: std::time::Duration = std::time::Duration::from_millis(200);

/// The exclusive lock of `file`, retried (every millisecond) for [`READER_GRACE`] while
/// someone holds it: a recorder holds it for its whole life, a reader only for a look.
fn lock_exclusive(file: &File) -> std::io::Result<()> {
    let deadline = std::time::Instant::now() + READER_GRACE;
    loop {
        match flock(file, libc::LOCK_EX | libc::LOCK_NB) {
            Err(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) && std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            other => return other,
        }
    }
}

fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

/// The holder named by the lock file at `path`, if it can be read.
fn read_holder(path: &Path) -> Option<Holder> {
    let mut text = String::new();
    File::open(path).ok()?.read_to_string(&mut text).ok()?;
    Holder::from_json(&serde_json::from_str(&text).ok()?)
}

fn busy(root: &Path, holder: Option<&Holder>) -> RecordError {
    let me = std::process::id();
    let who = match holder {
        Some(h) if h.pid == me => {
            format!("another hostfeed.Recorder of this process (pid {me}) has it open ({} access)", h.access)
        }
        Some(Holder { pid, access, group: Some(g), .. }) => format!(
            "the hostfeed.Recorders of another jax.distributed run (led by process {pid}, run {g}) \
             have it open ({access} access)"
        ),
        Some(h) => format!("a hostfeed.Recorder of process {} has it open ({} access)", h.pid, h.access),
        None => "another hostfeed.Recorder has it open (holder unknown)".to_string(),
    };
    RecordError::Io {
        errno: Some(libc::EBUSY),
        message: format!(
            "{} is locked: {who}; close that recorder first (the lock is released when it closes \
             or its process ends), or record to another path",
            root.display()
        ),
    }
}

impl StoreLock {
    /// Whether a live recorder holds the store at `root` now; the error names it. Creates
    /// nothing (a store without a lock file is not held).
    ///
    /// # Errors
    /// The busy error, naming the holder.
    pub(crate) fn check_free(root: &Path) -> Result<(), RecordError> {
        let path = root.join(LOCK_FILE);
        let Ok(file) = OpenOptions::new().read(true).open(&path) else { return Ok(()) };
        match flock(&file, libc::LOCK_SH | libc::LOCK_NB) {
            Err(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) => {
                Err(busy(root, read_holder(&path).as_ref()))
            }
            // Free, or a file system without flock (then `acquire` reports it).
            _ => Ok(()),
        }
    }

    /// Whether a recorder holds the store at `root` now, read only: its lock taken
    /// exclusively, or shared by the recorders of a run (the lock file names the run, and
    /// someone besides this look holds it). Takes nothing a recorder could wait for beyond
    /// an instant (a look is what `lock_exclusive` gives [`READER_GRACE`] to); a store
    /// without a lock file, or whose file names no run and is free, is not held.
    pub(crate) fn is_held(root: &Path) -> bool {
        let path = root.join(LOCK_FILE);
        let Ok(file) = OpenOptions::new().read(true).open(&path) else { return false };
        match flock(&file, libc::LOCK_SH | libc::LOCK_NB) {
            Err(e) => e.raw_os_error() == Some(libc::EWOULDBLOCK),
            Ok(()) if read_holder(&path).is_some_and(|h| h.group.is_some()) => {
                // A run holds it shared, or held it and crashed (the file stays): alone, this
                // look may turn its shared lock exclusive.
                let alone = flock(&file, libc::LOCK_EX | libc::LOCK_NB).is_ok();
                let _ = flock(&file, libc::LOCK_UN);
                !alone
            }
            Ok(()) => {
                let _ = flock(&file, libc::LOCK_UN);
                false
            }
        }
    }

    /// Takes the lock of the store at `root` (an existing directory) for `access`.
    ///
    /// # Errors
    /// [`RecordError::Io`] with `EBUSY` naming the holder when someone holds it; I/O errors.
    pub(crate) fn acquire(root: &Path, access: &Access) -> Result<StoreLock, RecordError> {
        let path = root.join(LOCK_FILE);
        if let Access::SharedMember { group } = access {
            return Self::join(root, &path, group);
        }
        loop {
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)
                .map_err(|e| io_error("create the lock file", &path, &e))?;
            match lock_exclusive(&file) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) => {
                    return Err(busy(root, read_holder(&path).as_ref()));
                }
                Err(e) => return Err(io_error("lock", &path, &e)),
            }
            // The previous holder may have removed the file between our open and our lock:
            // then we hold a file nobody else will ever open. Try again.
            let ours = file.metadata().map_err(|e| io_error("stat", &path, &e))?;
            match fs::metadata(&path) {
                Ok(now) if now.ino() == ours.ino() && now.dev() == ours.dev() => {}
                _ => continue,
            }
            let holder = Holder {
                pid: std::process::id(),
                access: access.name().into(),
                group: access.group().map(str::to_string),
                since_ns: now_ns(),
            };
            let mut f = &file;
            file.set_len(0).map_err(|e| io_error("write", &path, &e))?;
            f.write_all(holder.to_json().to_string().as_bytes()).map_err(|e| io_error("write", &path, &e))?;
            if access.group().is_some() {
                // A shared store's leader: the members of its run take the lock shared too.
                // (Linux converts a flock by releasing and retaking it; an opener that
                // slips in between takes it exclusive and the leader's call fails busy.)
                flock(&file, libc::LOCK_SH | libc::LOCK_NB).map_err(|e| io_error("lock", &path, &e))?;
            }
            return Ok(StoreLock { file, path, pid: holder.pid, removes: true });
        }
    }

    /// A member of a shared store's run joins the lock its leader took.
    fn join(root: &Path, path: &Path, group: &str) -> Result<StoreLock, RecordError> {
        let file =
            OpenOptions::new().read(true).open(path).map_err(|e| io_error("open the lock file", path, &e))?;
        match flock(&file, libc::LOCK_SH | libc::LOCK_NB) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) => {
                return Err(busy(root, read_holder(path).as_ref()));
            }
            Err(e) => return Err(io_error("lock", path, &e)),
        }
        let holder = read_holder(path);
        if holder.as_ref().and_then(|h| h.group.as_deref()) != Some(group) {
            let _ = flock(&file, libc::LOCK_UN);
            return Err(busy(root, holder.as_ref()));
        }
        Ok(StoreLock { file, path: path.to_path_buf(), pid: std::process::id(), removes: false })
    }
}

impl Drop for StoreLock {
    fn drop(&mut self) {
        if std::process::id() == self.pid {
            // Removed while held, so that nobody locks the file we are about to release.
            if self.removes {
                let _ = fs::remove_file(&self.path);
            }
            let _ = flock(&self.file, libc::LOCK_UN);
        }
        // In a forked child the descriptor is closed without unlocking: the lock belongs
        // to the open file description the parent shares, and stays the parent's.
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reader_looking_at_the_lock_does_not_make_a_recorder_busy() {
        let root = std::env::temp_dir().join(format!("hostfeed_lock_reader_{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        fs::create_dir_all(&root).unwrap();
        // A reader (hostfeed.follow, check_free) holds the lock shared while it looks: here
        // for 50 ms, from the moment it has it, which is before the recorder tries.
        fs::write(root.join(LOCK_FILE), b"").unwrap();
        let (held_tx, held_rx) = std::sync::mpsc::channel();
        let reader = {
            let path = root.join(LOCK_FILE);
            std::thread::spawn(move || {
                let file = File::open(&path).unwrap();
                flock(&file, libc::LOCK_SH | libc::LOCK_NB).unwrap();
                held_tx.send(()).unwrap();
                std::thread::sleep(std::time::Duration::from_millis(50)); // the reader's look
                flock(&file, libc::LOCK_UN).unwrap();
            })
        };
        held_rx.recv().unwrap();
        let lock = StoreLock::acquire(&root, &Access::Exclusive).expect("a look is not a holder");
        reader.join().unwrap();
        drop(lock);
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_second_lock_is_refused_with_the_holder_and_released_on_drop() {
        let root = std::env::temp_dir().join(format!("hostfeed_lock_{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        fs::create_dir_all(&root).unwrap();
        let first = StoreLock::acquire(&root, &Access::Exclusive).unwrap();
        let e = StoreLock::acquire(&root, &Access::Exclusive).unwrap_err();
        assert!(matches!(e, RecordError::Io { errno: Some(libc::EBUSY), .. }), "{e}");
        assert!(e.to_string().contains(&format!("pid {}", std::process::id())), "{e}");
        assert!(StoreLock::check_free(&root).is_err());
        drop(first);
        assert!(!root.join(LOCK_FILE).exists(), "the lock file is removed at release");
        StoreLock::check_free(&root).unwrap();
        let again = StoreLock::acquire(&root, &Access::Exclusive).unwrap();
        drop(again);
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_shared_store_admits_its_run_and_refuses_others() {
        let root = std::env::temp_dir().join(format!("hostfeed_lock_shared_{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        fs::create_dir_all(&root).unwrap();
        let run = |g: &str| g.to_string();
        let leader = StoreLock::acquire(&root, &Access::SharedLeader { group: run("a") }).unwrap();
        let member = StoreLock::acquire(&root, &Access::SharedMember { group: run("a") }).unwrap();
        let other = StoreLock::acquire(&root, &Access::SharedMember { group: run("b") }).unwrap_err();
        assert!(matches!(other, RecordError::Io { errno: Some(libc::EBUSY), .. }), "{other}");
        let e = StoreLock::acquire(&root, &Access::Exclusive).unwrap_err();
        assert!(matches!(e, RecordError::Io { errno: Some(libc::EBUSY), .. }), "{e}");
        assert!(StoreLock::acquire(&root, &Access::SharedLeader { group: run("b") }).is_err());
        drop(member);
        assert!(root.join(LOCK_FILE).exists(), "a member leaves the file to its leader");
        drop(leader);
        assert!(!root.join(LOCK_FILE).exists());
        fs::remove_dir_all(&root).unwrap();
    }
}
