//! Synchronisation helpers shared by the crate: [`lock`], the one way to take a mutex,
//! and [`Waker`], a condition variable that skips the wake-up system call when nobody
//! sleeps on it.
//!
//! ## `Waker`
//!
//! Waking a thread costs a futex system call even when no thread waits; on the hot paths
//! of the queue (a push, a completed batch) and of a `call` reply, the other side is
//! usually awake (spinning or busy), so that call is pure overhead. [`Waker`] counts its
//! sleepers (crossbeam-channel's `SyncWaker` is the model) and notifies only when there
//! are some.
//!
//! Contract: the state a sleeper waits for is guarded by the mutex it passes to
//! [`Waker::wait`], and a notifier changes that state while holding the same mutex and
//! calls `notify_*` afterwards (with or without the lock). A sleeper registers itself
//! under the mutex before releasing it inside the wait, so a notifier that changed the
//! state under the mutex is ordered after the registration and sees the sleeper.
//!
//! ## Models
//!
//! The primitives below are std's, or loom's under `--cfg loom` (crossbeam-epoch's
//! pattern): the modules built on them ([`Waker`] here, the reply slot and the queue's
//! wait/notify) are then checked by the loom models in `host/loom_models.rs`, which explore
//! every interleaving of the real code:
//! `RUSTFLAGS="--cfg loom" cargo test -p hostfeed-core --release --lib loom`.
//!
//! No Python here.

use std::sync::PoisonError;
use std::time::Duration;

#[cfg(loom)]
pub(crate) use loom::sync::{atomic, Condvar, Mutex, MutexGuard};
#[cfg(not(loom))]
pub(crate) use std::sync::{atomic, Condvar, Mutex, MutexGuard};

use atomic::{AtomicUsize, Ordering};

/// `T` alone on its cache lines: 128 bytes, a line and the one the prefetcher pairs with
/// it (crossbeam-utils' `CachePadded` is the model). For state that one thread writes on
/// every message while another thread writes state next to it: without the padding, each
/// write evicts the other thread's line (false sharing), and the next access misses.
#[repr(align(128))]
#[derive(Debug, Default)]
pub(crate) struct CachePadded<T>(pub(crate) T);

impl<T> std::ops::Deref for CachePadded<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0
    }
}

/// Locks `m`, recovering the guard if a panic poisoned it.
///
/// No user code runs under the crate's locks, and every update under them leaves the
/// state consistent (fields are replaced whole, counters updated together), so a panic
/// elsewhere cannot leave a half-written state behind; recovering is sound, whereas
/// propagating the poison would turn one bug into a failure of every later call.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Locks `m` if no thread holds it (recovering a poisoned guard, as [`lock`]); `None` if
/// one does. For a forked child, where a lock held at the fork stays held forever.
pub(crate) fn try_lock<T>(m: &Mutex<T>) -> Option<MutexGuard<'_, T>> {
    match m.try_lock() {
        Ok(g) => Some(g),
        Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
        Err(std::sync::TryLockError::WouldBlock) => None,
    }
}

/// See the module documentation.
#[derive(Default)]
pub(crate) struct Waker {
    condvar: Condvar,
    sleepers: AtomicUsize,
}

impl Waker {
    /// A waker nobody sleeps on.
    #[must_use]
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Sleeps until notified (or a spurious wake-up); the caller re-checks its condition.
    pub(crate) fn wait<'a, T>(&self, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        let guard = self.condvar.wait(guard).unwrap_or_else(PoisonError::into_inner);
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
        guard
    }

    /// Sleeps until notified or `timeout` passed; the caller re-checks its condition and
    /// its deadline.
    pub(crate) fn wait_timeout<'a, T>(
        &self,
        guard: MutexGuard<'a, T>,
        timeout: Duration,
    ) -> MutexGuard<'a, T> {
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        let (guard, _) = self.condvar.wait_timeout(guard, timeout).unwrap_or_else(PoisonError::into_inner);
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
        guard
    }

    /// Wakes one sleeper, if any.
    pub(crate) fn notify_one(&self) {
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            self.condvar.notify_one();
        }
    }

    /// Wakes every sleeper, if any.
    pub(crate) fn notify_all(&self) {
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            self.condvar.notify_all();
        }
    }

    /// Whether some thread sleeps on this waker now.
    #[must_use]
    pub(crate) fn has_sleepers(&self) -> bool {
        self.sleepers.load(Ordering::SeqCst) > 0
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn notify_without_sleepers_is_a_no_op_and_a_sleeper_is_woken() {
        let pair = Arc::new((Mutex::new(false), Waker::new()));
        pair.1.notify_all();
        assert!(!pair.1.has_sleepers());
        let p2 = Arc::clone(&pair);
        let t = std::thread::spawn(move || {
            let mut g = p2.0.lock().unwrap();
            while !*g {
                g = p2.1.wait(g);
            }
        });
        // Set the flag under the lock, then notify: the sleeper cannot miss it.
        *pair.0.lock().unwrap() = true;
        pair.1.notify_all();
        t.join().unwrap();
        assert!(!pair.1.has_sleepers());
    }

    #[test]
    fn wait_timeout_returns() {
        let m = Mutex::new(());
        let w = Waker::new();
        let g = w.wait_timeout(m.lock().unwrap(), Duration::from_millis(1));
        drop(g);
        assert!(!w.has_sleepers());
    }
}
