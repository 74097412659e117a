//! Ctrl-C while a `call` waits for its host function.
//!
//! The waiting XLA thread is not the main thread, and the main thread waits inside jaxlib,
//! so Python's own SIGINT handling runs only once the computation ends, which may be never
//! if the host function hangs. A process-level SIGINT handler that counts the signal (an
//! atomic increment, async-signal-safe) and then chains to the previous handler (Python's,
//! which records the `KeyboardInterrupt` as usual) lets a waiting call see the count change
//! and fail at once. It is installed only in front of a real handler (never in place of
//! the default action or of "ignore"), re-installed if Python's `signal.signal` replaced
//! it while a call waits, and removed at interpreter exit.
//!
//! No Python here.

use std::ffi::c_void;
use std::sync::atomic::{AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::sync::lock;

/// Number of SIGINTs seen while the watch was installed.
static INTERRUPTS: AtomicU64 = AtomicU64::new(0);

/// How many SIGINTs have been seen (a waiting call remembers the count it started with).
#[must_use]
pub fn count() -> u64 {
    INTERRUPTS.load(Ordering::Relaxed)
}

/// The handler that was installed before ours: `(sa_sigaction, sa_flags)`.
static PREVIOUS: Mutex<Option<(usize, i32)>> = Mutex::new(None);
/// Copy of `PREVIOUS` readable from the signal handler without locking.
static PREV_HANDLER: AtomicUsize = AtomicUsize::new(0);
static PREV_FLAGS: AtomicI32 = AtomicI32::new(0);

fn ours() -> usize {
    on_sigint as extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut c_void) as usize
}

extern "C" fn on_sigint(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut c_void) {
    INTERRUPTS.fetch_add(1, Ordering::Relaxed);
    let prev = PREV_HANDLER.load(Ordering::Relaxed);
    if prev == libc::SIG_DFL || prev == libc::SIG_IGN {
        return;
    }
    if PREV_FLAGS.load(Ordering::Relaxed) & libc::SA_SIGINFO != 0 {
        // SAFETY: `prev` is the `sa_sigaction` of the previously installed handler, which
        // declared SA_SIGINFO, called with the arguments the kernel passed to us.
        let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut c_void) =
            unsafe { std::mem::transmute(prev) };
        f(sig, info, ctx);
    } else {
        // SAFETY: `prev` is the `sa_handler` of the previously installed handler.
        let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(prev) };
        f(sig);
    }
}

fn current_sigint() -> Option<libc::sigaction> {
    // SAFETY: a zeroed `sigaction` is a valid out-parameter; a null `act` only queries.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        (libc::sigaction(libc::SIGINT, std::ptr::null(), &raw mut old) == 0).then_some(old)
    }
}

/// Installs the SIGINT counter in front of the current handler, unless it is installed
/// already (idempotent; also re-installs it after Python's `signal.signal` replaced it).
/// Returns whether it is installed.
pub fn install() -> bool {
    let mut prev = lock(&PREVIOUS);
    let Some(current) = current_sigint() else { return false };
    let ours = ours();
    if current.sa_sigaction == ours {
        return true;
    }
    if current.sa_sigaction == libc::SIG_IGN || current.sa_sigaction == libc::SIG_DFL {
        return false; // ignored, or the default action (terminate): nothing to chain to
    }
    PREV_HANDLER.store(current.sa_sigaction, Ordering::Relaxed);
    PREV_FLAGS.store(current.sa_flags, Ordering::Relaxed);
    // SAFETY: installing a handler whose body is async-signal-safe (an atomic increment,
    // then the previous handler); the struct is fully initialised from the current one.
    let installed = unsafe {
        let mut act: libc::sigaction = current;
        act.sa_sigaction = ours;
        act.sa_flags = (current.sa_flags | libc::SA_SIGINFO) & !libc::SA_RESETHAND;
        libc::sigaction(libc::SIGINT, &raw const act, std::ptr::null_mut()) == 0
    };
    if installed {
        *prev = Some((current.sa_sigaction, current.sa_flags));
    }
    installed
}

/// Whether [`install`] was ever called successfully (so a waiting call should keep it
/// installed).
#[must_use]
pub fn wanted() -> bool {
    lock(&PREVIOUS).is_some()
}

/// Puts the previous SIGINT handler back if ours is still installed (interpreter exit).
pub fn remove() {
    let mut prev = lock(&PREVIOUS);
    let Some((handler, flags)) = prev.take() else { return };
    let Some(current) = current_sigint() else { return };
    if current.sa_sigaction != ours() {
        return;
    }
    // SAFETY: restoring the handler that was installed before ours, with its flags.
    unsafe {
        let mut act: libc::sigaction = current;
        act.sa_sigaction = handler;
        act.sa_flags = flags;
        libc::sigaction(libc::SIGINT, &raw const act, std::ptr::null_mut());
    }
}
