//! A device's thread and the consumer thread on one CPU: keep them in step.
//!
//! On a machine whose other cores are busy (a 2-core virtual machine with anything else
//! running on it), the scheduler runs a device's thread and the consumer thread on the
//! same core, in turn, a time slice each (milliseconds). A device thread that taps large
//! arrays then copies a whole slice's worth of them before the consumer runs at all:
//! tens of megabytes, more than the caches hold. Every copy then writes to memory rather
//! than to the cache, the tap functions read their arrays back from memory, and what
//! goes beyond the buffer pool are fresh pages the kernel zeroes first. On one core the
//! two threads take turns either way; the only question is whether the bytes are still in
//! the cache when the consumer's turn comes.
//!
//! When the two run on separate cores, a large tap can be copied with non-temporal stores
//! ([`streams`]; the copy in `host/message.rs`), off by default ([`set_stream_bytes`]
//! turns it on from [`STREAM_BYTES`]): it spares the copy fetching the lines of a buffer
//! the consumer read last from the consumer's core's cache, but the bytes then go to
//! memory, and a tap function that reads its array (as most do) reads it back from there.
//! Measured side by side on this project's AMD EPYC machines, 4 MiB taps whose function
//! sums the array ran at 0.82-0.87x the time of a numpy copy and sum through the cache and
//! up to 1.85x with the streaming copies; only a function that touches no byte gained.
//!
//! So after a push that leaves at least [`STEP_BYTES`] queued for the consumer (bytes it
//! has not yet moved into a batch), a device's thread that finds the consumer last ran on
//! its own CPU yields that CPU ([`after_push`]): the consumer runs the tap functions while
//! the bytes are warm, and the device's thread continues after it. Small taps do not reach
//! the threshold before the consumer takes them in a batch, so nothing changes for them;
//! threads on separate cores (an idle machine) never yield, and the consumer keeps running
//! beside the device. A yield with nothing else to run on the CPU returns at once.
//!
//! The bench compares each choice with its absence side by side ([`set_step_bytes`],
//! [`set_stream_bytes`]: 0 never yields, never streams).
//!
//! No Python here.

use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};

/// Bytes queued for the consumer from which a device's thread on the consumer's CPU lets
/// it run first: a few L2 caches, well inside the last-level cache of a server processor.
pub const STEP_BYTES: usize = 2 << 20;

/// The CPU the consumer thread last took a batch on (-1: not known).
static CONSUMER_CPU: AtomicI32 = AtomicI32::new(-1);
/// The threshold in use ([`STEP_BYTES`] unless [`set_step_bytes`] changed it; 0: never).
static STEP: AtomicUsize = AtomicUsize::new(STEP_BYTES);
/// Operands from this size on are copied with non-temporal stores when the consumer runs
/// on another CPU, once [`set_stream_bytes`] turned them on: the size of an L2 cache, past
/// which a copy's lines would leave it anyway.
pub const STREAM_BYTES: usize = 1 << 20;
/// The threshold in use (0, never, unless [`set_stream_bytes`] changed it).
static STREAM: AtomicUsize = AtomicUsize::new(0);

/// The CPU the calling thread runs on, or -1 where the system does not say.
fn current_cpu() -> i32 {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: sched_getcpu takes no argument and only reads the calling thread's state.
        unsafe { libc::sched_getcpu() }
    }
    #[cfg(not(target_os = "linux"))]
    {
        -1
    }
}

/// Records the consumer thread's CPU (called by the consumer as it takes a batch).
pub(crate) fn note_consumer_cpu() {
    CONSUMER_CPU.store(current_cpu(), Ordering::Relaxed);
}

/// Whether a device's thread on `cpu` yields after a push that left `queued` bytes for
/// the consumer, last seen on `consumer_cpu` (-1: unknown), at threshold `step` (0: never).
fn should_yield(queued: usize, step: usize, cpu: i32, consumer_cpu: i32) -> bool {
    step > 0 && queued >= step && cpu >= 0 && cpu == consumer_cpu
}

/// Whether a device's thread copies an operand of `nbytes` with non-temporal stores: a large
/// one, while the consumer runs on another CPU (by its last record; see the module
/// documentation).
pub(crate) fn streams(nbytes: usize) -> bool {
    let step = STREAM.load(Ordering::Relaxed);
    if step == 0 || nbytes < step {
        return false; // the common case, without asking for the CPU
    }
    consumer_elsewhere()
}

/// Whether the calling thread runs on another CPU than the consumer last took a batch on
/// (both known): the pool then hands it the buffer the consumer read longest ago
/// (`host/buffer.rs`).
pub(crate) fn consumer_elsewhere() -> bool {
    apart(current_cpu(), CONSUMER_CPU.load(Ordering::Relaxed))
}

/// Whether a device's thread on `cpu` runs apart from the consumer, last seen on
/// `consumer_cpu` (both known, and different).
fn apart(cpu: i32, consumer_cpu: i32) -> bool {
    cpu >= 0 && consumer_cpu >= 0 && cpu != consumer_cpu
}

/// Called by a device's thread after a push that left `queued` bytes waiting for the
/// consumer: yields the CPU if the consumer shares it and that many bytes wait (see the
/// module documentation). Returns whether it yielded.
pub(crate) fn after_push(queued: usize) -> bool {
    let step = STEP.load(Ordering::Relaxed);
    if step == 0 || queued < step {
        return false; // the common case, without a system call
    }
    let consumer = CONSUMER_CPU.load(Ordering::Relaxed);
    if !should_yield(queued, step, current_cpu(), consumer) {
        return false;
    }
    #[cfg(unix)]
    {
        // SAFETY: sched_yield takes no argument and touches no memory; it cannot fail on
        // Linux.
        unsafe { libc::sched_yield() };
        true
    }
    #[cfg(not(unix))]
    {
        false
    }
}

/// Sets the size from which a device thread apart from the consumer copies an operand with
/// non-temporal stores (0: never); returns the previous threshold. For the bench.
pub fn set_stream_bytes(bytes: usize) -> usize {
    STREAM.swap(bytes, Ordering::Relaxed)
}

/// Sets the bytes queued from which a device thread on the consumer's CPU yields after a push
/// (0: never); returns the previous threshold. For the bench, which measures large taps both
/// ways side by side.
pub fn set_step_bytes(bytes: usize) -> usize {
    STEP.swap(bytes, Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_thread_yields_only_on_the_consumers_cpu_with_enough_queued() {
        assert!(should_yield(STEP_BYTES, STEP_BYTES, 3, 3));
        assert!(should_yield(64 << 20, STEP_BYTES, 0, 0));
        assert!(!should_yield(STEP_BYTES - 1, STEP_BYTES, 3, 3), "below the threshold");
        assert!(!should_yield(STEP_BYTES, STEP_BYTES, 3, 2), "another CPU: the consumer runs beside it");
        assert!(!should_yield(STEP_BYTES, STEP_BYTES, 3, -1), "the consumer's CPU not known yet");
        assert!(!should_yield(STEP_BYTES, STEP_BYTES, -1, -1), "the system gives no CPU");
        assert!(!should_yield(64 << 20, 0, 3, 3), "turned off");
        assert!(should_yield(1, 1, 3, 3) && !should_yield(1 << 20, 2 << 20, 3, 3), "a threshold set");
    }

    #[test]
    fn a_device_thread_streams_only_apart_from_the_consumer() {
        assert!(apart(0, 1) && apart(3, 0));
        assert!(!apart(1, 1), "the same CPU: through the cache, where the consumer reads it");
        assert!(!apart(1, -1) && !apart(-1, 1), "a CPU not known");
        assert!(!streams(STREAM_BYTES - 1), "small operands never stream");
        assert!(!streams(64 << 20), "off by default");
    }

    #[test]
    fn the_current_cpu_is_known_on_linux() {
        if cfg!(target_os = "linux") {
            let cpu = current_cpu();
            let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
            assert!(cpu >= 0, "sched_getcpu gave {cpu}");
            assert!(usize::try_from(cpu).unwrap() < cores.max(1024));
        }
        assert!(!after_push(STEP_BYTES - 1), "no system call below the threshold");
    }
}
