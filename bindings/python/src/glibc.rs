//! What the extension module needs from the C library beyond the glibc its wheel is tagged
//! for (`manylinux_2_27`, jaxlib's floor).
//!
//! Rust's standard library calls `gettid`, which glibc has only since 2.30. Linked against
//! glibc 2.27 (the wheel's build, by zig), the call stays an undefined symbol without a
//! version, which the wheel's tag check does not see and which a glibc before 2.30 cannot
//! resolve: importing the module would fail there ("undefined symbol: gettid"). This
//! module defines `gettid` itself, as the system call it stands for, so that the linker
//! resolves the standard library's calls inside the module on every glibc. (Loaded
//! privately, as Python loads extension modules, it replaces no other library's
//! `gettid`; where the C library has its own, both return the same.) CI checks the wheel
//! for undefined symbols without a version (`.ci/wheel_symbols.py`).

/// The calling thread's id, as `gettid(2)`.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[no_mangle]
pub extern "C" fn gettid() -> libc::pid_t {
    // SAFETY: SYS_gettid takes no argument, touches no memory and cannot fail.
    let tid = unsafe { libc::syscall(libc::SYS_gettid) };
    // A thread id is a pid_t; the system call returns it widened to a long.
    libc::pid_t::try_from(tid).unwrap_or(-1)
}
