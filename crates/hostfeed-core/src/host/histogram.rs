//! Latency histograms recorded on the hot path: log-linear buckets (as HDR histograms
//! use) of nanoseconds, each an atomic counter, so recording is one relaxed `fetch_add`
//! from any thread, with no lock.
//!
//! Bucket layout: values below 2^`SUB_BITS` ns have a bucket each; above, each power of two
//! is split into 2^`SUB_BITS` equal sub-buckets, so a bucket's width is at most 1/2^`SUB_BITS`
//! (3 %) of its values. Values from 0 ns to 2^40 ns (18 minutes) are covered; larger ones
//! land in the last bucket.
//!
//! [`Timing`] groups the receiver's histograms (device-side cost of a tap, and hand-over
//! latency until the host takes it), with a switch that makes recording free when off.
//! Timestamps are raw CPU cycle counts (`quanta`, the TSC on x86-64: a few nanoseconds,
//! where a system clock read costs tens to a hundred on virtual machines), converted to
//! nanoseconds only when a span is recorded.
//!
//! No Python here.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

use quanta::Clock;

const SUB_BITS: u32 = 5;
const SUB: usize = 1 << SUB_BITS;
const MAX_BITS: u32 = 40;
/// Number of buckets.
pub(crate) const BUCKETS: usize = SUB + (MAX_BITS - SUB_BITS) as usize * SUB;

/// See the module documentation.
pub struct Histogram {
    counts: Box<[AtomicU64]>,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram { counts: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect() }
    }
}

/// The bucket of `value`.
fn bucket(value: u64) -> usize {
    if value < SUB as u64 {
        return usize::try_from(value).unwrap_or(0);
    }
    let bits = 64 - value.leading_zeros(); // value < 2^bits, >= 2^(bits-1)
    if bits > MAX_BITS {
        return BUCKETS - 1;
    }
    let shift = bits - 1 - SUB_BITS;
    let sub = usize::try_from((value >> shift) & (SUB as u64 - 1)).unwrap_or(0);
    SUB + (bits - 1 - SUB_BITS) as usize * SUB + sub
}

/// The largest value that falls in bucket `index` (its inclusive upper bound).
#[must_use]
pub(crate) fn upper_bound(index: usize) -> u64 {
    if index < SUB {
        return index as u64;
    }
    let octave = u32::try_from((index - SUB) / SUB).unwrap_or(0);
    let sub = ((index - SUB) % SUB) as u64;
    let shift = octave; // width of a sub-bucket is 2^shift
    let base = 1u64 << (octave + SUB_BITS);
    base + (sub + 1) * (1u64 << shift) - 1
}

impl Histogram {
    /// Counts one value.
    pub(crate) fn record(&self, value: u64) {
        self.counts[bucket(value)].fetch_add(1, Relaxed);
    }

    /// `(upper bound, count)` of every non-empty bucket, in increasing order.
    #[must_use]
    pub fn snapshot(&self) -> Vec<(u64, u64)> {
        self.counts
            .iter()
            .enumerate()
            .filter_map(|(i, c)| {
                let n = c.load(Relaxed);
                (n > 0).then(|| (upper_bound(i), n))
            })
            .collect()
    }

    /// Empties every bucket.
    pub fn reset(&self) {
        for c in &*self.counts {
            c.store(0, Relaxed);
        }
    }
}

/// The receiver's timing histograms (nanoseconds) and their switch.
pub struct Timing {
    enabled: AtomicBool,
    clock: Clock,
    /// Time a device spent in the tap handler (decoding, copying, queueing), per message.
    pub device: Histogram,
    /// Time from a message entering the queue to the consumer taking it for its callback.
    pub handover: Histogram,
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            enabled: AtomicBool::new(true),
            clock: Clock::new(),
            device: Histogram::default(),
            handover: Histogram::default(),
        }
    }
}

impl Timing {
    /// A raw timestamp (cycles), or 0 when timing is off (0 means "no timestamp" to the
    /// recording methods).
    #[must_use]
    pub(crate) fn now(&self) -> u64 {
        if !self.enabled.load(Relaxed) {
            return 0;
        }
        self.clock.raw().max(1)
    }

    /// A raw timestamp (cycles) whether timing is on or not.
    #[must_use]
    pub(crate) fn raw_now(&self) -> u64 {
        self.clock.raw()
    }

    /// Nanoseconds between two raw timestamps (0 if `end` is before `start`).
    #[must_use]
    pub(crate) fn nanos_between(&self, start: u64, end: u64) -> u64 {
        if end < start {
            0
        } else {
            self.clock.delta_as_nanos(start, end)
        }
    }

    fn span(&self, start: u64, end: u64) -> Option<u64> {
        (start != 0 && end >= start).then(|| self.clock.delta_as_nanos(start, end))
    }

    /// Records the device-side span `start..end` (timestamps from [`Timing::now`]).
    pub(crate) fn record_device(&self, start: u64, end: u64) {
        if let Some(ns) = self.span(start, end) {
            self.device.record(ns);
        }
    }

    #[cfg(test)]
    /// Records the hand-over of a message queued at `queued` (from [`Timing::now`]).
    pub(crate) fn record_handover(&self, queued: u64) {
        if queued != 0 {
            self.record_handover_at(queued, self.raw_now());
        }
    }

    /// Records the hand-over of a message queued at `queued`, taken at `now` (both raw
    /// timestamps; nothing when `queued` is 0, i.e. not timed).
    pub(crate) fn record_handover_at(&self, queued: u64, now: u64) {
        if let Some(ns) = self.span(queued, now) {
            self.handover.record(ns);
        }
    }

    /// Turns recording on or off (on by default).
    pub fn set_enabled(&self, on: bool) {
        self.enabled.store(on, Relaxed);
    }

    /// Whether recording is on.
    #[must_use]
    pub fn enabled(&self) -> bool {
        self.enabled.load(Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_monotonic_and_bounds_contain_their_values() {
        let mut last = 0;
        for v in (0..5000u64).chain([1 << 20, (1 << 20) + 12345, 1 << 39, (1 << 40) - 1]) {
            let b = bucket(v);
            assert!(b >= last || v < 5000, "bucket order");
            assert!(v <= upper_bound(b), "{v} above the bound of its bucket {b}");
            if b > 0 {
                assert!(v > upper_bound(b - 1), "{v} belongs to an earlier bucket");
            }
            last = b;
        }
        assert_eq!(bucket(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn relative_error_is_small() {
        for v in [40u64, 1000, 123_456, 9_876_543, 1 << 35] {
            let ub = upper_bound(bucket(v));
            assert!((ub - v) * SUB as u64 <= v, "{v} -> {ub}");
        }
    }

    #[test]
    fn snapshot_counts_and_reset() {
        let h = Histogram::default();
        for v in [5, 5, 100, 100_000] {
            h.record(v);
        }
        let s = h.snapshot();
        assert_eq!(s.iter().map(|x| x.1).sum::<u64>(), 4);
        assert_eq!(s[0], (5, 2));
        h.reset();
        assert!(h.snapshot().is_empty());
    }

    #[test]
    fn timing_off_records_nothing() {
        let t = Timing::default();
        t.set_enabled(false);
        let start = t.now();
        t.record_device(start, t.now());
        t.record_handover(start);
        assert!(t.device.snapshot().is_empty() && t.handover.snapshot().is_empty());
        t.set_enabled(true);
        let start = t.now();
        t.record_device(start, t.now());
        assert_eq!(t.device.snapshot().iter().map(|x| x.1).sum::<u64>(), 1);
    }
}
