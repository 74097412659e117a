//! The summaries' tests: statistics against a two-pass float64 reference, histograms
//! against numpy's binning, on flushing threads too.

#![allow(clippy::float_cmp)] // exact counts and exact copies

use super::{histogram_rows, stats_row, stats_rows, Bins, Cast, BLOCK, CAST_STATS, STATS};

/// The statistics in f64 the plain way (two passes), for comparison; the cast's counts
/// from its thresholds (0 without).
#[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation)]
fn reference(x: &[f32], cast: Option<Cast>) -> [f64; CAST_STATS] {
    let fin: Vec<f64> = x.iter().filter(|v| v.is_finite()).map(|&v| f64::from(v)).collect();
    let n = fin.len() as f64;
    let nan = x.iter().filter(|v| v.is_nan()).count() as f64;
    let inf = x.iter().filter(|v| v.is_infinite()).count() as f64;
    let l2 = fin.iter().map(|v| v * v).sum::<f64>().sqrt();
    let l1 = fin.iter().map(|v| v.abs()).sum::<f64>();
    let zeros = x.iter().filter(|&&v| v == 0.0).count() as f64;
    let amin = fin.iter().map(|v| v.abs()).filter(|&v| v != 0.0).fold(f64::NAN, f64::min);
    let (under, over) = cast.map_or((0.0, 0.0), |c| {
        let under = fin.iter().filter(|&&v| v != 0.0 && (v.abs() as f32).to_bits() <= c.under);
        let over = fin.iter().filter(|&&v| (v.abs() as f32).to_bits() >= c.over);
        (under.count() as f64, over.count() as f64)
    });
    if fin.is_empty() {
        let nan_ = f64::NAN;
        return [x.len() as f64, nan_, nan_, nan_, nan_, nan_, l2, nan, inf, l1, zeros, amin, under, over];
    }
    let mean = fin.iter().sum::<f64>() / n;
    let var = fin.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n;
    let lo = fin.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = fin.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    [x.len() as f64, mean, var.sqrt(), lo, hi, hi.max(-lo), l2, nan, inf, l1, zeros, amin, under, over]
}

fn check(x: &[f32]) {
    check_cast(x, None);
}

fn check_cast(x: &[f32], cast: Option<Cast>) {
    let got = stats_row(x, cast);
    let want = reference(x, cast);
    // Rounding is relative to the values' magnitude (a mean near zero of values near 5
    // is known to about 5 * 1e-7).
    let scale = if want[5].is_nan() { 1.0 } else { want[5] };
    for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
        #[allow(clippy::cast_possible_truncation)]
        let w32 = w as f32;
        if w.is_nan() {
            assert!(g.is_nan(), "column {i}: {g} for NaN");
        } else if matches!(i, 0 | 3..=5 | 7 | 8 | 10..) || w32.is_infinite() {
            // counts, values themselves, and sums beyond f32's range: exact
            assert_eq!(g.to_bits(), w32.to_bits(), "column {i}: {g} vs {w}");
        } else {
            let tol = 1e-5 * w.abs().max(scale).max(1e-3);
            assert!((f64::from(g) - w).abs() <= tol, "column {i}: {g} vs {w}");
        }
    }
}

/// A deterministic spread of values (no randomness crate).
#[allow(clippy::cast_precision_loss)]
fn values(n: usize, offset: f32) -> Vec<f32> {
    (0..n).map(|i| offset + ((i * 7919 % 1009) as f32 - 504.0) / 100.0).collect()
}

#[test]
fn finite_rows_match_a_two_pass_reference() {
    for n in [0, 1, 2, 15, 16, 17, BLOCK - 1, BLOCK, BLOCK + 1, 3 * BLOCK + 5, 100_000] {
        check(&values(n, 0.0));
    }
}

#[test]
fn a_large_mean_does_not_cancel_the_std() {
    // Sum of squares minus n·mean² would lose every digit of the spread here.
    let x = values(50_000, 10_000.0);
    check(&x);
    let got = stats_row(&x, None);
    assert!(got[2] > 2.0 && got[2] < 3.5, "std {}", got[2]);
}

#[test]
fn non_finite_values_are_counted_and_left_out() {
    let mut x = values(3 * BLOCK, 1.0);
    x[5] = f32::NAN;
    x[BLOCK + 3] = f32::INFINITY;
    x[2 * BLOCK + 9] = f32::NEG_INFINITY;
    x[2 * BLOCK + 10] = -f32::NAN;
    check(&x);
    let got = stats_row(&x, None);
    assert_eq!((got[7], got[8]), (2.0, 2.0));
    assert!(got[3].is_finite() && got[4].is_finite());
}

#[test]
fn no_finite_value_gives_nan_statistics_and_zero_l2() {
    let got = stats_row(&[f32::NAN, f32::INFINITY, f32::NAN], None);
    assert_eq!(got[0], 3.0);
    assert!(got[1..6].iter().all(|v| v.is_nan()));
    assert_eq!(&got[6..11], &[0.0, 2.0, 1.0, 0.0, 0.0]);
    assert!(got[11].is_nan());
    let empty = stats_row(&[], None);
    assert_eq!(empty[0], 0.0);
    assert!(empty[1].is_nan() && empty[11].is_nan());
    assert_eq!(&empty[6..11], &[0.0; 5]);
}

#[test]
fn an_overflowing_sum_is_taken_again_over_the_finite_values() {
    let x = vec![1.0e37f32; 64]; // the sum overflows f32, l2 (8e37) does not
    check(&x);
    assert_eq!(stats_row(&x, None)[8], 0.0);
}

/// Runs `f` with subnormals flushed, as XLA's CPU threads run custom calls.
fn flushing<T>(f: impl FnOnce() -> T) -> T {
    #[cfg(target_arch = "x86_64")]
    {
        let mut csr: u32 = 0;
        // SAFETY: stores MXCSR into a valid local u32.
        unsafe { std::arch::asm!("stmxcsr [{}]", in(reg) &raw mut csr, options(nostack, preserves_flags)) };
        let flushing = csr | (1 << 15) | (1 << 6);
        // SAFETY: loads MXCSR with the FTZ and DAZ bits set, as XLA does.
        unsafe { std::arch::asm!("ldmxcsr [{}]", in(reg) &raw const flushing, options(nostack, preserves_flags, readonly)) };
        let out = f();
        // SAFETY: restores the MXCSR value read above.
        unsafe { std::arch::asm!("ldmxcsr [{}]", in(reg) &raw const csr, options(nostack, preserves_flags, readonly)) };
        out
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        f()
    }
}

#[test]
fn subnormal_and_tiny_values_are_summarized_as_numpy_does_on_a_flushing_thread() {
    let subnormal = [1e-45f32, 2e-45, -3e-40, 5e-41];
    #[allow(clippy::cast_precision_loss)]
    let tiny: Vec<f32> = values(5000, 0.0).iter().map(|v| v * 1e-25).collect();
    for x in [&subnormal[..], &tiny[..]] {
        let want = reference(x, None);
        let mut got = [0.0f32; STATS];
        flushing(|| stats_rows(x, &mut got, None));
        // min, max, absmax, the least non-zero magnitude exactly (the values themselves,
        // bit for bit)
        for c in [3, 4, 5, 11] {
            #[allow(clippy::cast_possible_truncation)]
            let w = want[c] as f32;
            assert_eq!(got[c].to_bits(), w.to_bits(), "column {c}: {got:?} vs {want:?}");
        }
        // mean, std and l2 to float32's rounding of the values' magnitude (the mean of
        // subnormals is itself subnormal: a few units of the least one)
        let scale = want[5];
        assert!((f64::from(got[9]) - want[9]).abs() <= want[9] * 1e-6, "l1: {got:?} vs {want:?}");
        for c in [1, 2, 6] {
            let err = (f64::from(got[c]) - want[c]).abs();
            assert!(err <= scale * 1e-5 + 3e-45, "column {c}: {} vs {}", got[c], want[c]);
        }
        assert!(got[2] > 0.0 && got[6] > 0.0, "std and l2 did not underflow: {got:?}");
    }
}

#[test]
fn rows_are_taken_one_after_another() {
    let x = values(30, 0.0);
    let mut out = [0.0f32; 3 * STATS];
    stats_rows(&x, &mut out, None);
    for r in 0..3 {
        assert_eq!(&out[r * STATS..(r + 1) * STATS], &stats_row(&x[r * 10..r * 10 + 10], None)[..STATS]);
    }
    let mut wide = [0.0f32; 3 * CAST_STATS];
    stats_rows(&x, &mut wide, Some(E4M3FN));
    for r in 0..3 {
        let want = stats_row(&x[r * 10..r * 10 + 10], Some(E4M3FN));
        assert_eq!(&wide[r * CAST_STATS..(r + 1) * CAST_STATS], &want);
    }
}

/// `float8_e4m3fn` from float32, as `ml_dtypes` casts: 2**-10 (half the least subnormal,
/// 2**-9) rounds to zero (to even), anything above to 2**-9; 464 (halfway between 448,
/// the largest finite value, and 480) rounds to 448 (even), anything above to NaN.
const E4M3FN: Cast = Cast { under: 0x3a80_0000, over: 0x43e8_0001 };

#[test]
fn magnitudes_zeros_and_casts_are_counted_as_the_reference_counts_them() {
    let near = |v: f32| [v.next_down(), v, v.next_up(), -v.next_down(), -v, -v.next_up()];
    let mut x: Vec<f32> = [2f32.powi(-10), 2f32.powi(-9), 448.0, 464.0, 480.0].iter().flat_map(|&v| near(v)).collect();
    x.extend([0.0, -0.0, 0.0, f32::from_bits(1), -f32::from_bits(7), 1e-40, f32::MAX, f32::MIN]);
    assert_eq!(stats_row(&x, Some(E4M3FN))[12..], [7.0, 10.0]);
    x.extend(values(3 * BLOCK, 2.0));
    check(&x);
    check_cast(&x, Some(E4M3FN));
    // The same values in a block with a NaN and infinities (taken one by one).
    x.extend([f32::NAN, f32::INFINITY, f32::NEG_INFINITY]);
    check_cast(&x, Some(E4M3FN));
    let got = stats_row(&x, Some(E4M3FN));
    assert_eq!((got[7], got[8], got[11]), (1.0, 2.0, f32::from_bits(1)));
    // Only zeros: no least non-zero magnitude; only non-finite values: no magnitude at all.
    let zeros = stats_row(&[0.0, -0.0], Some(E4M3FN));
    assert!(zeros[11].is_nan());
    assert_eq!((zeros[9], zeros[10], zeros[12], zeros[13]), (0.0, 2.0, 0.0, 0.0));
    let bad = stats_row(&[f32::NAN, f32::INFINITY], Some(E4M3FN));
    assert!(bad[11].is_nan());
    assert_eq!((bad[9], bad[10], bad[12], bad[13]), (0.0, 0.0, 0.0, 0.0));
    // Without a cast nothing is counted under or over.
    assert_eq!(stats_row(&x, None)[12..], [0.0, 0.0]);
}

#[test]
fn magnitudes_of_subnormals_are_exact_on_a_flushing_thread() {
    let x = [f32::from_bits(3), -f32::from_bits(1), 0.0, -0.0, 1e-39, 2e-45, f32::from_bits(0x3a80_0000)];
    let mut got = [0.0f32; CAST_STATS];
    flushing(|| stats_rows(&x, &mut got, Some(E4M3FN)));
    let want = reference(&x, Some(E4M3FN));
    assert_eq!(got[10], 2.0, "zeros: {got:?}");
    assert_eq!(got[11], f32::from_bits(1), "least non-zero magnitude: {got:?}");
    assert_eq!(got[12], 5.0, "underflows: {got:?}");
    #[allow(clippy::cast_possible_truncation)]
    let l1 = want[9] as f32;
    assert_eq!(got[9], l1, "l1: {got:?}");
}

/// `numpy.linspace(lo, hi, bins + 1)`'s edges (float64), as numpy computes them.
#[allow(clippy::cast_precision_loss)]
fn linspace(lo: f64, hi: f64, bins: usize) -> Vec<f64> {
    let step = (hi - lo) / bins as f64;
    let mut e: Vec<f64> = (0..=bins).map(|i| i as f64 * step + lo).collect();
    e[bins] = hi;
    e
}

/// The exact `f32` comparisons of `edges` (what `Histogram.thresholds()` computes).
#[allow(clippy::cast_possible_truncation)]
fn thresholds(edges: &[f64]) -> (Vec<f32>, f32) {
    let up = |e: f64| {
        let f = e as f32;
        if f64::from(f) < e { f.next_up() } else { f }
    };
    let down = |e: f64| {
        let f = e as f32;
        if f64::from(f) > e { f.next_down() } else { f }
    };
    (edges.iter().map(|&e| up(e)).collect(), down(edges[edges.len() - 1]))
}

/// A value's column as `numpy.histogram` bins it (comparisons in float64), with the
/// values below and above counted in the first and last columns.
fn numpy_column(v: f32, edges: &[f64]) -> Option<usize> {
    let (v, n) = (f64::from(v), edges.len() - 1);
    if v.is_nan() {
        None
    } else if v < edges[0] {
        Some(0)
    } else if v > edges[n] {
        Some(n + 1)
    } else {
        Some(edges.partition_point(|&e| e <= v).min(n))
    }
}

fn linear(lo: f64, hi: f64, bins: usize) -> (Vec<f64>, Vec<f32>, f32, f32, f32) {
    let edges = linspace(lo, hi, bins);
    let (lower, top) = thresholds(&edges);
    #[allow(clippy::cast_possible_truncation, clippy::cast_precision_loss)]
    let (lo32, scale) = (lo as f32, (bins as f64 / (hi - lo)) as f32);
    (edges, lower, top, lo32, scale)
}

#[test]
fn linear_histograms_count_as_numpy_does() {
    // 4 bins over [-2, 2]: -2 is in bin 0, 2 in the last, beyond either end outside,
    // NaN nowhere, infinities at the ends.
    let (_, lower, top, lo, scale) = linear(-2.0, 2.0, 4);
    let x = [-2.0, 2.0, -2.5, 2.5, 0.0, -0.1, 1.99, f32::NAN, f32::INFINITY, f32::NEG_INFINITY];
    let mut out = [0i32; 6];
    histogram_rows(&x, 4, Bins::Linear { lo, scale, lower: &lower, top }, &mut out);
    assert_eq!(out, [2, 1, 1, 1, 2, 2]);
}

#[test]
fn values_at_and_beside_every_edge_are_binned_as_numpy_bins_them() {
    for (lo, hi, bins) in [(-2.0, 2.0, 16), (-0.3, 0.7, 10), (-1.0, 3.0, 7), (1e-3, 1e3, 1000)] {
        let (edges, lower, top, lo32, scale) = linear(lo, hi, bins);
        let how = Bins::Linear { lo: lo32, scale, lower: &lower, top };
        #[allow(clippy::cast_possible_truncation)]
        let mut vals: Vec<f32> = edges.iter().flat_map(|&e| {
            let f = e as f32;
            [f.next_down(), f, f.next_up()]
        }).collect();
        vals.extend((0..5000).map(|i| {
            let t = f64::from(i) / 4999.0;
            #[allow(clippy::cast_possible_truncation)]
            let v = (lo - 0.1 + t * (hi - lo + 0.2)) as f32;
            v
        }));
        let mut cols = vec![0u32; vals.len()];
        super::columns(&vals, bins, how, &mut cols);
        for (v, c) in vals.iter().zip(&cols) {
            let want = numpy_column(*v, &edges);
            assert_eq!(super::column(*v, bins, how), want, "{v} in [{lo}, {hi}] / {bins}");
            assert_eq!(*c as usize, want.unwrap_or(bins + 2), "{v} in [{lo}, {hi}] / {bins}");
        }
    }
}

#[test]
fn subnormals_beside_a_zero_edge_are_binned_as_numpy_bins_them() {
    // XLA's threads flush subnormals to zero in float comparisons; the bins are
    // decided on the values' bits. Edge 2 of 4 bins over [-2, 2] is 0.
    let (edges, lower, top, lo, scale) = linear(-2.0, 2.0, 4);
    let how = Bins::Linear { lo, scale, lower: &lower, top };
    let x = [-f32::from_bits(1), -0.0, 0.0, f32::from_bits(1)];
    let mut cols = [0u32; 4];
    super::columns(&x, 4, how, &mut cols);
    let want: Vec<u32> =
        x.iter().map(|&v| u32::try_from(numpy_column(v, &edges).unwrap()).unwrap()).collect();
    assert_eq!(cols.to_vec(), want);
    assert_eq!(want, [2, 3, 3, 3]);
}

fn log(lo_exp: i32, bins: usize) -> (Vec<f64>, Bins<'static>) {
    #[allow(clippy::cast_possible_wrap, clippy::cast_possible_truncation)]
    let edges: Vec<f64> = (0..=bins).map(|i| 2f64.powi(lo_exp + i as i32)).collect();
    let (lower, top) = thresholds(&edges);
    (edges, Bins::Log { lo_exp, least: lower[0], top })
}

#[test]
fn log_histograms_bin_by_the_exponent_as_numpy_bins_the_magnitude() {
    // lo_exp -2: bins [1/4, 1/2), [1/2, 1), [1, 2), [2, 4]; zero and tiny below, beyond
    // 4 and infinity above; the sign does not matter; a subnormal is below.
    let (_, how) = log(-2, 4);
    let x = [0.0, 0.3, -0.3, 0.5, 1.0, 1.999, -3.0, 4.0, 4.001, f32::INFINITY, 1e-40, f32::NAN, 0.1];
    let mut out = [0i32; 6];
    histogram_rows(&x, 4, how, &mut out);
    assert_eq!(out, [3, 2, 1, 2, 2, 2]);
    // Wide enough for subnormals: 1e-40 is 2**-133 and some.
    let (_, wide_how) = log(-150, 300);
    let mut wide = vec![0i32; 302];
    histogram_rows(&[1e-40], 300, wide_how, &mut wide);
    assert_eq!(wide.iter().position(|&c| c == 1), Some(1 + 150 - 133));
}

#[test]
fn histogram_rows_count_each_row_apart() {
    let x: Vec<f32> = (0..4003).map(|i| f32::from(u16::try_from(i % 8).unwrap())).collect();
    let (_, lower, top, lo, scale) = linear(0.0, 8.0, 8);
    let mut out = vec![0i32; 2 * 10];
    histogram_rows(&x[..4002], 8, Bins::Linear { lo, scale, lower: &lower, top }, &mut out);
    let per_row = out.chunks(10).map(|r| r.iter().sum::<i32>()).collect::<Vec<_>>();
    assert_eq!(per_row, [2001, 2001]);
    assert_eq!(out[0], 0);
    assert_eq!(out[9], 0);
}

#[test]
fn batched_columns_are_the_columns_of_each_value_and_numpys() {
    let mut vals = vec![
        0.0, -0.0, 1e-40, -1e-40, 1.2e-38, 0.25, 0.5, -0.5, 1.0, 1.5, 2.0, 3.999, 4.0, 1e30, -1e30,
        f32::MAX, f32::MIN, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, -f32::NAN, f32::EPSILON,
    ];
    vals.extend((0..300).map(|i| (f32::from(u16::try_from(i).unwrap()) - 150.0) / 37.0));
    let lin4 = linear(-2.0, 2.0, 4);
    let lin7 = linear(-1.0, 3.0, 7);
    let binnings = [
        (4, log(-2, 4), false),
        (64, log(-32, 64), false),
        (300, log(-150, 300), false),
        (4, (lin4.0.clone(), Bins::Linear { lo: lin4.3, scale: lin4.4, lower: &lin4.1, top: lin4.2 }), true),
        (7, (lin7.0.clone(), Bins::Linear { lo: lin7.3, scale: lin7.4, lower: &lin7.1, top: lin7.2 }), true),
    ];
    for (bins, (edges, how), signed) in binnings {
        let mut cols = vec![0u32; vals.len()];
        super::columns(&vals, bins, how, &mut cols);
        for (v, c) in vals.iter().zip(&cols) {
            let want = u32::try_from(super::column(*v, bins, how).unwrap_or(bins + 2)).unwrap();
            assert_eq!(*c, want, "{v} in {how:?}");
            let numpy = numpy_column(if signed { *v } else { v.abs() }, &edges);
            assert_eq!(super::column(*v, bins, how), numpy, "{v} in {how:?}");
        }
    }
}
