//! Ctrl-C (SIGINT) or SIGTERM while a `call` waits for its host function.
//!
//! The waiting XLA thread is not the main thread, and the main thread waits inside jaxlib,
//! so Python's own SIGINT handling runs only once the computation ends, which may be never
//! if the host function hangs. A process-level handler that counts the signal (an atomic
//! increment, async-signal-safe) and then chains to the previous handler (Python's, which
//! records the `KeyboardInterrupt` as usual) lets a waiting call see the count change and
//! fail at once. It is installed only in front of a real handler (never in place of the
//! default action or of "ignore"), re-installed if Python's `signal.signal` replaced it
//! while a call waits, and removed at interpreter exit.
//!
//! SIGTERM is watched the same way. Its default action ends the process, and then there
//! is nothing to chain to; but `jax.distributed.initialize` starts JAX's preemption
//! service, whose handler only records a preemption notice, so a multi-process program
//! whose call waits forever could not be ended by SIGTERM. In front of that handler (the
//! notice is still recorded), a SIGTERM fails the waiting calls, the computation raises
//! in its caller and the process can end.
//!
//! No Python here.

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::host::sync::lock;

/// The signals watched, and their names in messages.
const SIGNALS: [(libc::c_int, &str); 2] =
    [(libc::SIGINT, "KeyboardInterrupt: SIGINT"), (libc::SIGTERM, "SIGTERM")];

/// Number of each watched signal seen while the watch was installed.
static COUNTS: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];

/// How many of each watched signal have been seen (a waiting call remembers the counts
/// it started with).
#[must_use]
pub fn counts() -> [u64; 2] {
    [COUNTS[0].load(Ordering::Relaxed), COUNTS[1].load(Ordering::Relaxed)]
}

/// Which watched signal arrived since `before` (from [`counts`]), in words.
#[must_use]
pub fn signalled_since(before: [u64; 2]) -> Option<&'static str> {
    let now = counts();
    SIGNALS
        .iter()
        .zip(before.iter().zip(now.iter()))
        .find_map(|((_, name), (b, n))| (b != n).then_some(*name))
}

/// The handlers that were installed before ours: `(sa_sigaction, sa_flags)` per signal.
static PREVIOUS: Mutex<[Option<(usize, i32)>; 2]> = Mutex::new([None, None]);
/// Whether the watch was asked for (so a waiting call should keep it installed).
static WANTED: AtomicBool = AtomicBool::new(false);
/// Copy of `PREVIOUS` readable from the signal handler without locking.
static PREV_HANDLER: [AtomicUsize; 2] = [AtomicUsize::new(0), AtomicUsize::new(0)];
static PREV_FLAGS: [AtomicI32; 2] = [AtomicI32::new(0), AtomicI32::new(0)];

fn ours() -> usize {
    on_signal as extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut c_void) as usize
}

fn slot(sig: libc::c_int) -> Option<usize> {
    SIGNALS.iter().position(|&(s, _)| s == sig)
}

/// A file descriptor the handler writes a byte to after counting (-1: none): the write
/// end of the pipe a thread that interrupts host functions running on a device's thread
/// reads (see [`open_wake_pipe`]).
static WAKE_FD: AtomicI32 = AtomicI32::new(-1);

/// The read end of the wake pipe, and the process that made it (a forked child makes its
/// own).
static WAKE_PIPE: Mutex<Option<(u32, i32)>> = Mutex::new(None);

/// Makes the pipe that the handler writes a byte to after counting a signal, once per
/// process, so that a thread can wait for signals in [`wait_for_signal`]; returns `false`
/// if it cannot be made. A full pipe loses nothing: the reader looks at [`counts`].
pub fn open_wake_pipe() -> bool {
    let mut pipe = lock(&WAKE_PIPE);
    let pid = std::process::id();
    if pipe.is_some_and(|(p, _)| p == pid) {
        return true;
    }
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors `pipe2` writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return false;
    }
    // SAFETY: a descriptor just made; only its status flags change (the handler must never
    // block on a full pipe).
    unsafe { libc::fcntl(fds[1], libc::F_SETFL, libc::O_NONBLOCK) };
    *pipe = Some((pid, fds[0]));
    WAKE_FD.store(fds[1], Ordering::Release);
    true
}

/// Whether the calling thread is the process's initial thread: the one `CPython` delivers
/// signals to (its handlers run there, raising `KeyboardInterrupt` in whatever Python code
/// runs there).
#[must_use]
pub fn on_initial_thread() -> bool {
    // SAFETY: plain queries of the calling thread's and process's ids.
    unsafe { libc::gettid() == libc::getpid() }
}

/// Waits until a watched signal arrives (a byte in the wake pipe; several signals may
/// come as one wake-up); returns `false` when there is no pipe to wait on.
#[must_use]
pub fn wait_for_signal() -> bool {
    let Some((_, fd)) = *lock(&WAKE_PIPE) else { return false };
    let mut buf = [0u8; 64];
    loop {
        // SAFETY: reading into a local buffer of its length from our pipe's read end.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if n > 0 {
            return true;
        }
        if n == 0 || std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            return false;
        }
    }
}

extern "C" fn on_signal(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut c_void) {
    let Some(i) = slot(sig) else { return };
    COUNTS[i].fetch_add(1, Ordering::Relaxed);
    let fd = WAKE_FD.load(Ordering::Acquire);
    #[cfg(target_os = "linux")]
    if fd >= 0 {
        // SAFETY: `write` is async-signal-safe; one byte from a live local; a failure (a
        // full pipe, a closed descriptor) is ignored. errno is saved and restored, as a
        // handler must.
        unsafe {
            let errno = *libc::__errno_location();
            let byte = 1u8;
            libc::write(fd, (&raw const byte).cast(), 1);
            *libc::__errno_location() = errno;
        }
    }
    let prev = PREV_HANDLER[i].load(Ordering::Relaxed);
    if prev == libc::SIG_DFL || prev == libc::SIG_IGN {
        return;
    }
    if PREV_FLAGS[i].load(Ordering::Relaxed) & libc::SA_SIGINFO != 0 {
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

fn current(sig: libc::c_int) -> Option<libc::sigaction> {
    // SAFETY: a zeroed `sigaction` is a valid out-parameter; a null `act` only queries.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        (libc::sigaction(sig, std::ptr::null(), &raw mut old) == 0).then_some(old)
    }
}

/// Installs our counter for signal number `i` of [`SIGNALS`] in front of its current
/// handler (with `PREVIOUS` locked by the caller); returns whether it is installed.
fn install_one(prev: &mut [Option<(usize, i32)>; 2], i: usize) -> bool {
    let sig = SIGNALS[i].0;
    let Some(current) = current(sig) else { return false };
    let ours = ours();
    if current.sa_sigaction == ours {
        return true;
    }
    if current.sa_sigaction == libc::SIG_IGN || current.sa_sigaction == libc::SIG_DFL {
        return false; // ignored, or the default action (terminate): nothing to chain to
    }
    PREV_HANDLER[i].store(current.sa_sigaction, Ordering::Relaxed);
    PREV_FLAGS[i].store(current.sa_flags, Ordering::Relaxed);
    // SAFETY: installing a handler whose body is async-signal-safe (an atomic increment,
    // then the previous handler); the struct is fully initialised from the current one.
    let installed = unsafe {
        let mut act: libc::sigaction = current;
        act.sa_sigaction = ours;
        act.sa_flags = (current.sa_flags | libc::SA_SIGINFO) & !libc::SA_RESETHAND;
        libc::sigaction(sig, &raw const act, std::ptr::null_mut()) == 0
    };
    if installed {
        prev[i] = Some((current.sa_sigaction, current.sa_flags));
    }
    installed
}

/// Installs the counters in front of the current SIGINT and SIGTERM handlers, where
/// there is a handler to chain to (idempotent; also re-installs them after Python's
/// `signal.signal` or JAX replaced them). Returns whether the SIGINT counter is installed.
pub fn install() -> bool {
    let mut prev = lock(&PREVIOUS);
    WANTED.store(true, Ordering::Relaxed);
    let sigint = install_one(&mut prev, 0);
    install_one(&mut prev, 1);
    sigint
}

/// Whether [`install`] was ever called (so a waiting call should keep the counters
/// installed).
#[must_use]
pub(crate) fn wanted() -> bool {
    WANTED.load(Ordering::Relaxed)
}

/// Puts the previous handlers back where ours are still installed (interpreter exit).
pub fn remove() {
    let mut prev = lock(&PREVIOUS);
    WANTED.store(false, Ordering::Relaxed);
    for (i, &(sig, _)) in SIGNALS.iter().enumerate() {
        let Some((handler, flags)) = prev[i].take() else { continue };
        let Some(current) = current(sig) else { continue };
        if current.sa_sigaction != ours() {
            continue;
        }
        // SAFETY: restoring the handler that was installed before ours, with its flags.
        unsafe {
            let mut act: libc::sigaction = current;
            act.sa_sigaction = handler;
            act.sa_flags = flags;
            libc::sigaction(sig, &raw const act, std::ptr::null_mut());
        }
    }
}
