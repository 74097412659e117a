//! The statistics of `Recorder.record(..., reduce="stats")` computed in one pass over the
//! value, for the CPU's `hostfeed_stats` custom call (XLA:CPU has no single-pass way to
//! compute several reductions of one array: four plain reductions read it four times, and
//! a variadic reduce is not vectorized).
//!
//! A row of values is taken in blocks small enough to stay in the L1 cache. Each block is
//! read twice: once for its sum, minimum, maximum, sum of magnitudes, zeros and least
//! non-zero magnitude (and, for `hostfeed.Stats(dtype=...)`, the values a cast to that
//! dtype underflows or overflows: integer comparisons of the magnitudes' bits), then, from
//! the cache, for the sum of squared deviations from its own mean (two passes, so the
//! variance does not suffer the cancellation of a sum of squares). The blocks' partial
//! results combine in `f64` (Chan et al.'s formula for the variance). A block whose sum is
//! not finite (a NaN, an infinity, or an overflow) is taken again with every non-finite
//! value masked out and counted. The
//! loops keep one accumulator per SIMD lane, so they vectorize; on x86-64 a copy compiled
//! for AVX-512 or AVX2 is chosen at run time where the CPU has it.
//!
//! A histogram (`reduce=Histogram(...)`, the `hostfeed_histogram` custom call) computes
//! the columns of a batch of values without branches (vectorized: a power of two's bin is
//! the float's exponent, an equal bin `floor((v - lo) * scale)` in `f32` as the JAX
//! operations compute it), then counts them into four tables in turn.
//!
//! No Python and no XLA here: the handlers (`summary_handlers.rs`) pass slices.
//!
//! Every helper is `#[inline(always)]`: a function compiled apart would not get the
//! target features of the caller it is inlined into, and would lose the wide vectors.
#![allow(clippy::inline_always)]

/// Values per block: 16 KiB of `f32`, half of a typical L1 data cache.
const BLOCK: usize = 4096;
/// Accumulators per statistic: one per lane of two 256-bit vectors.
const LANES: usize = 16;
/// The columns of a statistics row (`hostfeed.STATS`): count, mean, std, min, max, absmax,
/// l2, NaN count, infinity count, l1, zeros, the least non-zero magnitude.
pub(crate) const STATS: usize = 12;
/// The columns of a row with a narrower dtype's counts (`hostfeed.Stats(dtype=...)`):
/// [`STATS`]' and underflow, overflow.
pub(crate) const CAST_STATS: usize = 14;
/// The bits of an `f32` magnitude that is infinite (above them: NaN).
const INF: u32 = 0x7f80_0000;

/// What a cast to a narrower float dtype does to an `f32`, by the bits of its magnitude
/// (ordered as the magnitudes are): a non-zero magnitude whose bits are at most `under`
/// rounds to zero (underflows); a finite one whose bits are at least `over` becomes
/// infinite or NaN (overflows). Python takes both from `ml_dtypes`' casts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Cast {
    /// The greatest magnitude (bits) that rounds to zero.
    pub(crate) under: u32,
    /// The least magnitude (bits) that rounds beyond the dtype's largest finite value.
    pub(crate) over: u32,
}

/// The partial statistics of some values: the finite ones' count, mean, sum of squared
/// deviations from that mean, minimum, maximum and sum of magnitudes; how many were NaN,
/// infinite, zero (either sign), or under- and overflowed a [`Cast`]; the least non-zero
/// finite magnitude's bits, less one (`u32::MAX`: none).
#[derive(Clone, Copy, Debug)]
struct Partial {
    n: f64,
    mean: f64,
    m2: f64,
    lo: f32,
    hi: f32,
    l1: f64,
    nan: u64,
    inf: u64,
    zeros: u64,
    under: u64,
    over: u64,
    amin: u32,
}

impl Partial {
    const EMPTY: Partial = Partial {
        n: 0.0,
        mean: 0.0,
        m2: 0.0,
        lo: f32::INFINITY,
        hi: f32::NEG_INFINITY,
        l1: 0.0,
        nan: 0,
        inf: 0,
        zeros: 0,
        under: 0,
        over: 0,
        amin: u32::MAX,
    };

    /// Both parts' values together (the pairwise update of Chan, Golub and `LeVeque`).
    fn merge(self, o: Partial) -> Partial {
        let n = self.n + o.n;
        let (mean, m2) = if o.n == 0.0 {
            (self.mean, self.m2)
        } else if self.n == 0.0 {
            (o.mean, o.m2)
        } else {
            let delta = o.mean - self.mean;
            (self.mean + delta * o.n / n, self.m2 + o.m2 + delta * delta * self.n * o.n / n)
        };
        Partial {
            n,
            mean,
            m2,
            lo: if o.lo < self.lo { o.lo } else { self.lo },
            hi: if o.hi > self.hi { o.hi } else { self.hi },
            l1: self.l1 + o.l1,
            nan: self.nan + o.nan,
            inf: self.inf + o.inf,
            zeros: self.zeros + o.zeros,
            under: self.under + o.under,
            over: self.over + o.over,
            amin: self.amin.min(o.amin),
        }
    }

    /// The statistics row: count (all values), then mean, std, min, max, absmax over the
    /// finite values (NaN when there is none), l2 over the finite values, NaN and
    /// infinity counts, l1 over the finite values, zeros, the least non-zero finite
    /// magnitude (NaN when there is none); underflows and overflows.
    #[allow(clippy::cast_possible_truncation, clippy::cast_precision_loss)]
    fn row(self, count: usize) -> [f32; CAST_STATS] {
        let none = self.n == 0.0;
        let pick = |v: f64| if none { f32::NAN } else { v as f32 };
        let var = if none { 0.0 } else { (self.m2 / self.n).max(0.0) };
        let l2 = (self.m2 + self.n * self.mean * self.mean).max(0.0).sqrt();
        [
            count as f32,
            pick(self.mean),
            pick(var.sqrt()),
            pick(f64::from(self.lo)),
            pick(f64::from(self.hi)),
            pick(f64::from(self.hi.max(-self.lo))),
            l2 as f32,
            self.nan as f32,
            self.inf as f32,
            self.l1 as f32,
            self.zeros as f32,
            if self.amin == u32::MAX { f32::NAN } else { f32::from_bits(self.amin + 1) },
            self.under as f32,
            self.over as f32,
        ]
    }
}

#[inline(always)]
fn lanes_sum(v: &[f32; LANES]) -> f32 {
    let mut s = 0.0;
    for &x in v {
        s += x;
    }
    s
}

#[inline(always)]
fn lanes_min(v: &[f32; LANES]) -> f32 {
    let mut m = f32::INFINITY;
    for &x in v {
        m = if x < m { x } else { m };
    }
    m
}

#[inline(always)]
fn lanes_max(v: &[f32; LANES]) -> f32 {
    let mut m = f32::NEG_INFINITY;
    for &x in v {
        m = if x > m { x } else { m };
    }
    m
}

/// What [`plain_pass`] finds in a block.
struct Plain {
    sum: f32,
    lo: f32,
    hi: f32,
    l1: f64,
    zeros: u64,
    amin: u32,
    under: u64,
    over: u64,
}

/// The accumulators of [`plain_pass`], one per lane.
struct PlainLanes {
    sum: [f32; LANES],
    lo: [f32; LANES],
    hi: [f32; LANES],
    l1: [f32; LANES],
    zeros: [u32; LANES],
    amin: [u32; LANES],
    under: [u32; LANES],
    over: [u32; LANES],
}

impl PlainLanes {
    /// Takes `v` into lane `i`. The magnitude's bits less one, wrapping, order the
    /// non-zero magnitudes and put zero last: their minimum is the least non-zero one's,
    /// and `0 < a <= under` is `a - 1 < under`. Without `CAST`, nothing is under- or
    /// overflowed (no code).
    #[inline(always)]
    fn take<const CAST: bool>(&mut self, i: usize, v: f32, cast: Cast) {
        let a = v.to_bits() & 0x7fff_ffff;
        let m = a.wrapping_sub(1);
        self.sum[i] += v;
        self.lo[i] = if v < self.lo[i] { v } else { self.lo[i] };
        self.hi[i] = if v > self.hi[i] { v } else { self.hi[i] };
        self.l1[i] += f32::from_bits(a);
        self.zeros[i] += u32::from(a == 0);
        self.amin[i] = self.amin[i].min(m);
        if CAST {
            self.under[i] += u32::from(m < cast.under);
            self.over[i] += u32::from(a >= cast.over);
        }
    }
}

/// Sum, minimum, maximum and sum of magnitudes of a block, every value taken as it is (a
/// NaN or an infinity makes the sum non-finite, which the caller checks: then the rest is
/// taken again by [`careful`]); its zeros, least non-zero magnitude and, with `CAST`,
/// its under- and overflows.
#[inline(always)]
fn plain_pass<const CAST: bool>(x: &[f32], cast: Cast) -> Plain {
    let mut acc = PlainLanes {
        sum: [0.0; LANES],
        lo: [f32::INFINITY; LANES],
        hi: [f32::NEG_INFINITY; LANES],
        l1: [0.0; LANES],
        zeros: [0; LANES],
        amin: [u32::MAX; LANES],
        under: [0; LANES],
        over: [0; LANES],
    };
    let chunks = x.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for (i, &v) in c.iter().enumerate() {
            acc.take::<CAST>(i, v, cast);
        }
    }
    for (i, &v) in rest.iter().enumerate() {
        acc.take::<CAST>(i, v, cast);
    }
    let count = |v: &[u32; LANES]| v.iter().map(|&c| u64::from(c)).sum::<u64>();
    Plain {
        sum: lanes_sum(&acc.sum),
        lo: lanes_min(&acc.lo),
        hi: lanes_max(&acc.hi),
        l1: acc.l1.iter().map(|&s| f64::from(s)).sum(),
        zeros: count(&acc.zeros),
        amin: acc.amin.iter().copied().fold(u32::MAX, u32::min),
        under: count(&acc.under),
        over: count(&acc.over),
    }
}

/// The sum of the deviations of `scale * v` from `mean` and of their squares (`scale` a
/// power of two, so that the scaling is exact).
#[inline(always)]
fn deviations(vals: &[f32], mean: f32, scale: f32) -> (f32, f32) {
    let mut dev = [0.0f32; LANES];
    let mut sq = [0.0f32; LANES];
    let chunks = vals.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for i in 0..LANES {
            let d = c[i] * scale - mean;
            dev[i] += d;
            sq[i] += d * d;
        }
    }
    for (i, &v) in rest.iter().enumerate() {
        let d = v * scale - mean;
        dev[i] += d;
        sq[i] += d * d;
    }
    (lanes_sum(&dev), lanes_sum(&sq))
}

/// The power of two that brings `amax` (a block's largest magnitude) to `[1, 2)` when it is
/// so small that squares of deviations would underflow `f32` (below `2**-32`), else 1.
#[inline(always)]
fn scale_for(amax: f32) -> f32 {
    if amax == 0.0 || amax >= 2f32.powi(-32) || !amax.is_finite() {
        return 1.0;
    }
    // amax < 2**-32: its exponent e (the subnormals' taken as the least) gives 2**-e,
    // at most 2**149, applied in two exact steps by the caller's f64 arithmetic.
    let e = i32::try_from((amax.to_bits() >> 23) & 0xff).unwrap_or(0) - 127;
    2f32.powi((-e).min(127))
}

/// Whether `v` is neither NaN nor infinite, from its bits (vectorizes as an integer test).
#[inline(always)]
fn finite(v: f32) -> bool {
    v.to_bits() & INF != INF
}

/// Minimum and maximum of the finite values of a block; NaN and infinity counts.
#[inline(always)]
fn masked_pass(x: &[f32]) -> (f32, f32, u64, u64) {
    let mut lo = [f32::INFINITY; LANES];
    let mut hi = [f32::NEG_INFINITY; LANES];
    let mut bad = [0u32; LANES];
    let mut nan = [0u32; LANES];
    let mut lane = |i: usize, v: f32| {
        let ok = finite(v);
        lo[i] = if ok && v < lo[i] { v } else { lo[i] };
        hi[i] = if ok && v > hi[i] { v } else { hi[i] };
        bad[i] += u32::from(!ok);
        nan[i] += u32::from(v.to_bits() & 0x7fff_ffff > INF);
    };
    let chunks = x.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for (i, &v) in c.iter().enumerate() {
            lane(i, v);
        }
    }
    for (i, &v) in rest.iter().enumerate() {
        lane(i, v);
    }
    let bad: u64 = bad.iter().map(|&b| u64::from(b)).sum();
    let nan: u64 = nan.iter().map(|&b| u64::from(b)).sum();
    (lanes_min(&lo), lanes_max(&hi), nan, bad - nan)
}

/// The partial statistics of one block (at most [`BLOCK`] values).
#[inline(always)]
#[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation)]
fn block<const CAST: bool>(x: &[f32], cast: Cast) -> Partial {
    let plain = plain_pass::<CAST>(x, cast);
    if plain.sum.is_finite() && !x.is_empty() {
        let nf = x.len() as f64;
        // Tiny values are scaled up first: their squared deviations would underflow.
        let scale = scale_for(plain.hi.max(-plain.lo));
        let m = (f64::from(plain.sum) * f64::from(scale) / nf) as f32;
        let (s, q) = deviations(x, m, scale);
        if q.is_finite() {
            // The deviations are from `m`, the rounded mean: their own mean `s / n`
            // corrects it.
            let (s, q, factor) = (f64::from(s), f64::from(q), f64::from(scale));
            let mean = (f64::from(m) + s / nf) / factor;
            return Partial {
                n: nf,
                mean,
                m2: (q - s * s / nf).max(0.0) / (factor * factor),
                lo: plain.lo,
                hi: plain.hi,
                l1: plain.l1,
                nan: 0,
                inf: 0,
                zeros: plain.zeros,
                under: plain.under,
                over: plain.over,
                amin: plain.amin,
            };
        }
    }
    careful::<CAST>(x, cast)
}

/// [`block`] for a block holding a NaN or an infinity, or whose sums overflow `f32`: the
/// finite values in `f64` (rare: taken one by one).
#[cold]
#[allow(clippy::cast_precision_loss)]
fn careful<const CAST: bool>(x: &[f32], cast: Cast) -> Partial {
    let (lo, hi, nan, inf) = masked_pass(x);
    let mut part = Partial { nan, inf, ..Partial::EMPTY };
    for &v in x {
        let a = v.to_bits() & 0x7fff_ffff;
        let m = a.wrapping_sub(1);
        part.zeros += u64::from(a == 0);
        if a < INF {
            part.l1 += f64::from(f32::from_bits(a));
            part.amin = part.amin.min(m);
            part.over += u64::from(CAST && a >= cast.over);
        }
        part.under += u64::from(CAST && m < cast.under);
    }
    let fin = || x.iter().filter(|v| finite(**v)).map(|&v| f64::from(v));
    let n = fin().count() as f64;
    if n == 0.0 {
        return part;
    }
    let mean = fin().sum::<f64>() / n;
    let m2 = fin().map(|v| (v - mean) * (v - mean)).sum::<f64>();
    Partial { n, mean, m2, lo, hi, ..part }
}

/// The statistics row of `x`. Plain loops, so that everything inlines into the caller
/// (iterator adapters would be compiled apart, without the caller's target features).
#[inline(always)]
fn row_generic<const CAST: bool>(x: &[f32], cast: Cast) -> [f32; CAST_STATS] {
    let mut acc = Partial::EMPTY;
    let mut start = 0;
    while start < x.len() {
        let end = x.len().min(start + BLOCK);
        acc = acc.merge(block::<CAST>(&x[start..end], cast));
        start = end;
    }
    acc.row(x.len())
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
/// # Safety
/// The CPU must have AVX-512F.
unsafe fn row_avx512<const CAST: bool>(x: &[f32], cast: Cast) -> [f32; CAST_STATS] {
    row_generic::<CAST>(x, cast)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
/// # Safety
/// The CPU must have AVX2 and FMA.
unsafe fn row_avx2<const CAST: bool>(x: &[f32], cast: Cast) -> [f32; CAST_STATS] {
    row_generic::<CAST>(x, cast)
}

/// The statistics row of `x` with `CAST`'s counts (zero without).
#[inline(always)]
fn row_dispatch<const CAST: bool>(x: &[f32], cast: Cast) -> [f32; CAST_STATS] {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F (checked just above).
            return unsafe { row_avx512::<CAST>(x, cast) };
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU has AVX2 and FMA (checked just above).
            return unsafe { row_avx2::<CAST>(x, cast) };
        }
    }
    row_generic::<CAST>(x, cast)
}

/// The statistics row of `x`: count, mean, std, min, max, absmax, l2, NaN count, infinity
/// count, l1, zeros, the least non-zero magnitude (the columns of `hostfeed.STATS`), then,
/// with a `cast`, the values it underflows and overflows (0 without). Mean, std, min, max,
/// absmax, l2, l1 and the least non-zero magnitude are over the finite values (NaN when
/// there is none, l2 and l1 0); count is every value.
#[must_use]
pub(crate) fn stats_row(x: &[f32], cast: Option<Cast>) -> [f32; CAST_STATS] {
    match cast {
        Some(cast) => row_dispatch::<true>(x, cast),
        None => row_dispatch::<false>(x, Cast { under: 0, over: INF }),
    }
}

/// The statistics of each row of `x` (`rows` rows of equal length, one after another) into
/// `out`: [`STATS`] values a row without a `cast`, [`CAST_STATS`] with one.
///
/// # Panics
/// If `x` does not split into that many rows.
pub(crate) fn stats_rows(x: &[f32], out: &mut [f32], cast: Option<Cast>) {
    let _ieee = KeepSubnormals::new();
    let width = if cast.is_some() { CAST_STATS } else { STATS };
    let rows = out.len() / width;
    assert!(out.len() % width == 0 && (rows == 0 && x.is_empty() || rows > 0 && x.len() % rows == 0));
    if rows == 0 {
        return;
    }
    let per = x.len() / rows;
    for (r, o) in out.chunks_exact_mut(width).enumerate() {
        o.copy_from_slice(&stats_row(&x[r * per..(r + 1) * per], cast)[..width]);
    }
}

/// While alive, the thread's float arithmetic keeps subnormal numbers, as IEEE 754 and
/// numpy do: XLA's CPU threads run with them flushed to zero (x86-64's MXCSR FTZ and DAZ
/// bits, `AArch64`'s `FPCR.FZ`), under which a subnormal compares equal to zero and converts
/// to zero (min, max and absmax of subnormal values came out 0). The previous mode is
/// restored on drop.
pub(crate) struct KeepSubnormals {
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    saved: u64,
}

impl KeepSubnormals {
    /// Turns flushing off for the current thread (until dropped).
    #[must_use]
    pub(crate) fn new() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            const FTZ: u32 = 1 << 15;
            const DAZ: u32 = 1 << 6;
            let mut csr: u32 = 0;
            // SAFETY: `stmxcsr` stores the 32-bit MXCSR register at the address given, a
            // valid, aligned `u32` on this stack frame; it touches nothing else.
            unsafe { std::arch::asm!("stmxcsr [{}]", in(reg) &raw mut csr, options(nostack, preserves_flags)) };
            let cleared = csr & !(FTZ | DAZ);
            // SAFETY: `ldmxcsr` loads MXCSR from a valid `u32`: the current value with only
            // the two flush bits cleared, a setting every SSE CPU accepts.
            unsafe { std::arch::asm!("ldmxcsr [{}]", in(reg) &raw const cleared, options(nostack, preserves_flags, readonly)) };
            KeepSubnormals { saved: u64::from(csr) }
        }
        #[cfg(target_arch = "aarch64")]
        {
            const FZ: u64 = 1 << 24;
            let fpcr: u64;
            // SAFETY: reading FPCR has no side effect.
            unsafe { std::arch::asm!("mrs {}, fpcr", out(reg) fpcr, options(nomem, nostack, preserves_flags)) };
            // SAFETY: writing FPCR with only its flush-to-zero bit changed.
            unsafe { std::arch::asm!("msr fpcr, {}", in(reg) fpcr & !FZ, options(nomem, nostack, preserves_flags)) };
            KeepSubnormals { saved: fpcr }
        }
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        {
            KeepSubnormals {}
        }
    }
}

impl Drop for KeepSubnormals {
    fn drop(&mut self) {
        #[cfg(target_arch = "x86_64")]
        {
            #[allow(clippy::cast_possible_truncation)]
            let csr = self.saved as u32;
            // SAFETY: restores the MXCSR value read in `new` on this thread.
            unsafe { std::arch::asm!("ldmxcsr [{}]", in(reg) &raw const csr, options(nostack, preserves_flags, readonly)) };
        }
        #[cfg(target_arch = "aarch64")]
        {
            // SAFETY: restores the FPCR value read in `new` on this thread.
            unsafe { std::arch::asm!("msr fpcr, {}", in(reg) self.saved, options(nomem, nostack, preserves_flags)) };
        }
    }
}

/// How a histogram bins a value (the two kinds of `hostfeed.Histogram`), as
/// `numpy.histogram` bins it against the same edges (float64): a value `v` is in bin `k`
/// when `edge[k] <= v < edge[k + 1]`, the last bin holding its upper edge too; below when
/// `v < edge[0]`, above when `v > edge[bins]`. Each comparison with an edge is exact in
/// `f32`: `lower` holds, for each edge, the least `f32` at or above it (`v < edge[k]`
/// exactly when `v < lower[k]`), and `top` the greatest `f32` at or below the last edge.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Bins<'a> {
    /// Equal bins from `lo`: `floor((v - lo) * scale)` in `f32` is off by at most one bin
    /// near an edge, which the comparisons with `lower` (`bins + 1` values) correct.
    Linear { lo: f32, scale: f32, lower: &'a [f32], top: f32 },
    /// Powers of two of the magnitude: `|v|` in `[2**(lo_exp + k), 2**(lo_exp + k + 1))`
    /// is in bin `k`, read from the float's exponent; `least` is `lower[0]`.
    Log { lo_exp: i32, least: f32, top: f32 },
}

/// `v` as an `i32` key in the same order (`-0.0` as `0.0`; NaNs aside). Edges are compared
/// on keys: XLA's threads flush subnormals to zero in float comparisons, numpy does not.
#[inline(always)]
#[allow(clippy::cast_possible_wrap)]
fn key(v: f32) -> i32 {
    let b = v.to_bits() as i32;
    let k = if b < 0 { b ^ 0x7fff_ffff } else { b };
    if k == -1 {
        0
    } else {
        k
    }
}

/// The column of `v` in a row of `bins + 2` counts (below, the bins, above), or `None`
/// for a NaN (not counted).
#[inline(always)]
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, clippy::cast_possible_wrap, clippy::cast_precision_loss)]
fn column(v: f32, bins: usize, how: Bins<'_>) -> Option<usize> {
    let mag = v.to_bits() & 0x7fff_ffff;
    if mag > 0x7f80_0000 {
        return None;
    }
    Some(match how {
        Bins::Linear { lo, scale, lower, top } => {
            let kv = key(v);
            if kv < key(lower[0]) {
                0
            } else if kv > key(top) {
                bins + 1
            } else {
                let q = ((v - lo) * scale).floor();
                let mut k = if q >= bins as f32 { bins - 1 } else if q > 0.0 { q as usize } else { 0 };
                if kv < key(lower[k]) {
                    k = k.saturating_sub(1);
                } else if k + 1 < bins && kv >= key(lower[k + 1]) {
                    k += 1;
                }
                k + 1
            }
        }
        Bins::Log { lo_exp, least, top } => {
            let a = key(f32::from_bits(mag));
            if a < key(least) {
                0
            } else if a > key(top) {
                bins + 1
            } else {
                let exp = (mag >> 23) as i32;
                // floor(log2 |v|), subnormals included (their exponent is in the mantissa).
                let log2 = if exp == 0 { 31 - mag.leading_zeros() as i32 - 149 } else { exp - 127 };
                let k = i64::from(log2) - i64::from(lo_exp);
                (k.clamp(0, bins as i64 - 1) + 1) as usize
            }
        }
    })
}

/// Values whose columns are computed at once (on the stack), then counted.
const BATCH: usize = 256;

/// The columns of a batch of values into `cols` ([`column()`]'s, a NaN's being `bins + 2`,
/// a slot that is not counted). Written without branches, so that it vectorizes; powers of
/// two binned below 2**-126 (where subnormals would need their own exponent) go value by
/// value through [`column()`].
#[inline(always)]
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, clippy::cast_possible_wrap, clippy::cast_precision_loss)]
fn columns(x: &[f32], bins: usize, how: Bins<'_>, cols: &mut [u32]) {
    let nb = bins as i32;
    match how {
        Bins::Linear { lo, scale, lower, top } => {
            assert!(lower.len() > bins, "a linear histogram needs bins + 1 lower edges");
            let last = (nb - 1) as f32;
            let (first, top) = (key(lower[0]), key(top));
            for (c, &v) in cols.iter_mut().zip(x) {
                // floor((v - lo) * scale) within the bins: at or above zero, truncating
                // is flooring (below `lo`, the value is below anyway).
                let q = (v - lo) * scale;
                let q = if q > 0.0 { q } else { 0.0 };
                let q = if q < last { q } else { last };
                // SAFETY: `q` is in [0, bins - 1] (a NaN became 0 above): finite and
                // within i32. (`as` would saturate, which does not vectorize.)
                let k = unsafe { q.to_int_unchecked::<i32>() };
                let kv = key(v);
                // SAFETY: `k` is in [0, bins - 1] and `lower` holds `bins + 1` values.
                let k = k - i32::from(kv < key(unsafe { *lower.get_unchecked(k as usize) }));
                let k = if k > 0 { k } else { 0 };
                // SAFETY: `k + 1` is in [1, bins] (the last bin's upper edge at most).
                let up = k < nb - 1 && kv >= key(unsafe { *lower.get_unchecked((k + 1) as usize) });
                let k = k + i32::from(up) + 1;
                let k = if kv < first { 0 } else { k };
                let k = if kv > top { nb + 1 } else { k };
                *c = (if v.is_nan() { nb + 2 } else { k }) as u32;
            }
        }
        Bins::Log { lo_exp, least, top } if lo_exp > -126 => {
            let (least, top) = (key(least), key(top));
            for (c, &v) in cols.iter_mut().zip(x) {
                let mag = v.to_bits() & 0x7fff_ffff;
                #[allow(clippy::cast_possible_wrap)] // at most 0x7fff_ffff
                let a = mag as i32;
                let k = ((mag >> 23) as i32 - 127 - lo_exp).clamp(0, nb - 1) + 1;
                let k = if a < least { 0 } else { k };
                let k = if a > top { nb + 1 } else { k };
                *c = (if mag > 0x7f80_0000 { nb + 2 } else { k }) as u32;
            }
        }
        Bins::Log { .. } => {
            for (c, &v) in cols.iter_mut().zip(x) {
                *c = column(v, bins, how).map_or(nb as u32 + 2, |k| k as u32);
            }
        }
    }
}

/// The counts of one row into `out` (`bins + 2` columns). Columns are computed a batch at
/// a time, then counted into four tables in turn, so that values falling in the same bin
/// one after another do not wait on each other's count.
#[inline(always)]
fn histogram_generic(x: &[f32], bins: usize, how: Bins<'_>, tables: &mut [u32], out: &mut [i32]) {
    let width = bins + 3; // the columns, and the uncounted slot of NaNs
    tables.fill(0);
    let mut cols = [0u32; BATCH];
    for batch in x.chunks(BATCH) {
        let cols = &mut cols[..batch.len()];
        columns(batch, bins, how, cols);
        let quads = cols.chunks_exact(4);
        let rest = quads.remainder();
        for q in quads {
            for (t, &c) in q.iter().enumerate() {
                tables[t * width + c as usize] += 1;
            }
        }
        for &c in rest {
            tables[c as usize] += 1;
        }
    }
    for (j, o) in out.iter_mut().enumerate() {
        let total = tables[j] + tables[width + j] + tables[2 * width + j] + tables[3 * width + j];
        *o = i32::try_from(total).unwrap_or(i32::MAX);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,bmi1,lzcnt")]
/// # Safety
/// The CPU must have AVX2, BMI1 and LZCNT.
unsafe fn histogram_avx2(x: &[f32], bins: usize, how: Bins<'_>, tables: &mut [u32], out: &mut [i32]) {
    histogram_generic(x, bins, how, tables, out);
}

/// The histogram of each row of `x` (`out.len() / (bins + 2)` rows of equal length, one
/// after another) into `out`: per row, values below, the `bins` counts, values above; NaNs
/// are not counted.
///
/// # Panics
/// If `x` does not split into that many rows.
pub(crate) fn histogram_rows(x: &[f32], bins: usize, how: Bins<'_>, out: &mut [i32]) {
    let width = bins + 2;
    let rows = out.len() / width;
    assert!(out.len() % width == 0 && (rows == 0 && x.is_empty() || rows > 0 && x.len() % rows == 0));
    if rows == 0 {
        return;
    }
    let per = x.len() / rows;
    let mut tables = vec![0u32; 4 * (width + 1)];
    #[cfg(target_arch = "x86_64")]
    let wide = std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("bmi1")
        && std::arch::is_x86_feature_detected!("lzcnt");
    for (r, o) in out.chunks_exact_mut(width).enumerate() {
        let row = &x[r * per..(r + 1) * per];
        #[cfg(target_arch = "x86_64")]
        if wide {
            // SAFETY: the CPU has AVX2, BMI1 and LZCNT (checked above).
            unsafe { histogram_avx2(row, bins, how, &mut tables, o) };
            continue;
        }
        histogram_generic(row, bins, how, &mut tables, o);
    }
}

#[cfg(test)]
mod tests;
