//! What a storage back-end is ([`Backend`]), the lock it hands out ([`Held`]), and its row
//! in the registry ([`Kind`]). Every back-end module implements these; nothing here knows
//! any back-end.
//!
//! No Python here.

use std::path::Path;
use std::time::Duration;

use crate::error::RecordError;
use crate::record::common::Mode;
use crate::record::store::Store;
use crate::record::storelock::Access;

/// One kind of storage (the file system, the in-memory store, an object store) opened at
/// a recording's root: it owns the store the recorder writes through, the store's lock
/// and (in its [`Kind`]) the URL schemes that name it.
pub(crate) trait Backend: Send + Sync {
    /// The store's root: a path, or an object store's URL as a path.
    fn root(&self) -> &Path;

    /// The store the recorder writes through; `durable`: every write fsynced (where that
    /// means something: file systems).
    fn store(&self, durable: bool) -> Box<dyn Store>;

    /// Makes the root ready for `mode` under the store's lock, which it takes first and
    /// returns: a store another recorder holds is refused (naming the holder) before
    /// anything is created or removed; an earlier recording is removed (unless `mode`
    /// appends). A member of a shared store's run (`access`) joins its leader's lock and
    /// prepares nothing.
    ///
    /// # Errors
    /// [`RecordError::Io`] with `EBUSY` naming the holder; the store's errors; a root
    /// that `mode` may not use as it is.
    fn prepare(&self, mode: Mode, lease: Duration, access: &Access) -> Result<Box<dyn Held>, RecordError>;

    /// Takes the store's lock and nothing else (the root made to exist where it must, for
    /// the lock to live in it): what [`Backend::prepare`] takes, for the conformance tests
    /// and for whoever needs only the lock.
    ///
    /// # Errors
    /// As [`Backend::prepare`].
    fn lock(&self, lease: Duration, access: &Access) -> Result<Box<dyn Held>, RecordError>;

    /// Whether a recorder holds the store now (read only: takes nothing). A store whose
    /// lock cannot be read is not known to be held: `false`.
    fn is_held(&self) -> bool;
}

/// A lock a [`Backend`] handed out: held while this value lives, released when dropped (by
/// the process that took it).
pub(crate) trait Held: Send + std::fmt::Debug {
    /// Renews the lock's lease when due (the recorder's ticker calls it); nothing for a
    /// lock without a lease.
    ///
    /// # Errors
    /// The lease cannot be renewed, or was taken over.
    fn renew_if_due(&self) -> Result<(), RecordError> {
        Ok(())
    }
}

/// A member of a shared store's run: its leader holds (and renews) the lock.
#[derive(Debug)]
pub(crate) struct Joined;

impl Held for Joined {}

/// A back-end's row in the registry (`backend.rs`): the URL schemes it serves and how it
/// opens a store at a root.
pub(crate) struct Kind {
    /// The URL schemes (lowercase, without `://`) that name a store of this kind; empty for
    /// the file system, which local paths name.
    pub(crate) schemes: &'static [&'static str],
    /// Opens the store at `place` (a path, or a URL of one of `schemes`) with the storage
    /// options given (config keys of the back-end, as pairs). Makes no request.
    pub(crate) open: Open,
}

/// How a back-end opens the store at `place` with the storage options given ([`Kind::open`]).
pub(crate) type Open = fn(place: &Path, options: &[(String, String)]) -> Result<Box<dyn Backend>, RecordError>;
