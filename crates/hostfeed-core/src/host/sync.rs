//! Synchronisation helpers shared by the crate: [`lock`], the one way to take a mutex;
//! [`Waker`], a condition variable that skips the wake-up system call when nobody sleeps
//! on it; and the polls before a blocking wait, [`spin_until`] and [`AdaptiveSpin`].
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
use std::time::{Duration, Instant};

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

/// A spin before a blocking wait whose length adapts to whether spinning pays: it starts
/// at `max`, halves after every spin that saw nothing (down to none), and is back at `max`
/// after one that did. Once it is none, every [`AdaptiveSpin::PROBE_EVERY`]th wait spins
/// for `max` again, to find out whether spinning pays again. The probe is as long as a
/// full spin because the two sides of a `call` probe in turn: while one side sleeps, the
/// other's event comes only after the sleeper's wake-up, so a short probe on either side
/// would never see it and both would keep sleeping (every round trip paying two wake-ups)
/// until the two probes happened to coincide.
///
/// Waking a sleeping thread costs tens of microseconds on an idle virtual machine (its
/// CPU must be woken too), the whole cost of a `call` round trip when each side sleeps in
/// turn; a spin that sees the event first saves it. On a loaded machine the event comes
/// late, the spins see nothing and stop within a few waits, so busy processes do not take
/// the CPU from the spinner for scheduler time slices (the spin never yields: it only
/// polls, with `spin_loop`, for at most its budget).
///
/// Only a spin that saw its event restores the budget. A waiter cannot learn from an event
/// its spin missed: one that came soon after the waiter went to sleep may have come soon
/// *because* it slept (on a machine with every core busy, sleeping gives the CPU to the
/// thread that makes the event). Raising the budget from such waits (tried: twice the
/// wait, when the event came within `max`) took an eager tap + barrier from 44-48 us to
/// 1.4-2.0 ms with two busy processes on two cores. The cost of the probe alone: after a
/// long idle, a burst runs without the spin until the next probe (eager taps after the
/// bench's other methods, at about twice the time a tap takes right after its own).
pub struct AdaptiveSpin {
    max_ns: u64,
    budget_ns: std::sync::atomic::AtomicU64,
    waits: std::sync::atomic::AtomicU64,
}

impl AdaptiveSpin {
    /// While the budget is none, one wait in this many spins (for `max`) to find out
    /// whether spinning pays again.
    pub const PROBE_EVERY: u64 = 64;
    /// Budgets below this are none.
    const MIN_NS: u64 = 500;

    /// A spin of at most `max`.
    #[must_use]
    pub const fn new(max: Duration) -> Self {
        #[allow(clippy::cast_possible_truncation)] // a budget of microseconds
        let max_ns = max.as_nanos() as u64;
        AdaptiveSpin {
            max_ns,
            budget_ns: std::sync::atomic::AtomicU64::new(max_ns),
            waits: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// The current budget, in nanoseconds (for tests).
    #[must_use]
    pub fn budget_ns(&self) -> u64 {
        self.budget_ns.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Polls `ready` for up to the current budget; returns whether it became true, and
    /// adapts the budget to the outcome.
    pub fn spin(&self, mut ready: impl FnMut() -> bool) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        if cfg!(loom) {
            return ready(); // one look, as `spin_until` under loom
        }
        if ready() {
            return true;
        }
        let mut budget = self.budget_ns.load(Relaxed);
        let probe = budget == 0;
        if probe {
            if self.max_ns == 0 || (self.waits.fetch_add(1, Relaxed) + 1) % Self::PROBE_EVERY != 0 {
                return false;
            }
            budget = self.max_ns;
        }
        let seen = spin_for(budget, &mut ready);
        let next = if seen {
            self.max_ns
        } else if probe {
            0
        } else {
            Some(budget / 2).filter(|&b| b >= Self::MIN_NS).unwrap_or(0)
        };
        self.budget_ns.store(next, Relaxed);
        seen
    }
}

/// Polls `ready` (never yielding) for up to `budget_ns`.
fn spin_for(budget_ns: u64, ready: &mut impl FnMut() -> bool) -> bool {
    poll(Duration::from_nanos(budget_ns), false, ready)
}

/// Polls `ready` for up to `budget`; returns whether it became true. Used before a
/// blocking wait where the event is expected within microseconds.
///
/// Under loom, one look: a model explores the orders of events, not the passing of time.
#[cfg(loom)]
pub fn spin_until(_budget: Duration, mut ready: impl FnMut() -> bool) -> bool {
    ready()
}

/// Polls `ready` for up to `budget`, yielding the CPU between rounds; returns whether it
/// became true. Used before a blocking wait where the event is expected within
/// microseconds.
#[cfg(not(loom))]
pub fn spin_until(budget: Duration, mut ready: impl FnMut() -> bool) -> bool {
    poll(budget, true, &mut ready)
}

/// Polls `ready` in rounds of 64 looks until it is true or `budget` has passed, yielding
/// the CPU between rounds if `yielding`.
fn poll(budget: Duration, yielding: bool, ready: &mut impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    loop {
        for _ in 0..64 {
            if ready() {
                return true;
            }
            std::hint::spin_loop();
        }
        if start.elapsed() >= budget {
            return ready();
        }
        if yielding {
            std::thread::yield_now();
        }
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

    #[test]
    fn adaptive_spin_halves_when_it_sees_nothing_and_comes_back_when_it_pays() {
        let spin = AdaptiveSpin::new(Duration::from_micros(8));
        assert_eq!(spin.budget_ns(), 8_000);
        // Nothing happens: 8 us, 4, 2, 1, then none (below 0.5 us).
        for expected in [4_000, 2_000, 1_000, 500, 0] {
            assert!(!spin.spin(|| false));
            assert_eq!(spin.budget_ns(), expected);
        }
        // With no budget, only one wait in PROBE_EVERY looks again (for max), the others
        // return at once; a probe that sees the event restores the whole budget.
        let mut looks = 0;
        for _ in 0..AdaptiveSpin::PROBE_EVERY - 1 {
            assert!(!spin.spin(|| {
                looks += 1;
                false
            }));
        }
        assert_eq!(looks, AdaptiveSpin::PROBE_EVERY - 1, "no spin without a budget");
        assert_eq!(spin.budget_ns(), 0);
        // A probe that sees nothing leaves no budget (the next probe is the wait after).
        for _ in 0..AdaptiveSpin::PROBE_EVERY {
            assert!(!spin.spin(|| false));
        }
        assert_eq!(spin.budget_ns(), 0);
        let mut polls = 0;
        assert!(spin.spin(|| {
            polls += 1;
            polls > 3
        }));
        assert_eq!(spin.budget_ns(), 8_000);
        // An event already there costs one look and keeps the budget.
        assert!(spin.spin(|| true));
        assert_eq!(spin.budget_ns(), 8_000);
    }
}
