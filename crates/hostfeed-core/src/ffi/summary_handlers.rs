//! The CPU's summary handlers, `hostfeed_stats` and `hostfeed_histogram`: a record's
//! `reduce="stats"` (or `hostfeed.Stats(dtype=...)`) or `reduce=Histogram(...)` computed on the device's thread in one pass
//! ([`summary`]), in place into the custom call's result: no message, no host. CPU only
//! (a GPU lowers summaries to JAX reductions), so their table is apart from the transport
//! handlers every platform registers under the same names.

use crate::error::Error;
use crate::ffi::c_api::dtype;
use crate::ffi::handlers::{Buffer, Frame};
use crate::ffi::handlers::define_handlers;
use crate::ffi::summary;
use crate::host::hub::Hub;
use crate::host::message::Operand;

/// The body of the statistics handler: one `f32` operand whose rows are its leading
/// dimensions' elements (the lowering puts the reduced axes last), one `f32` result of
/// [`summary::STATS`] values a row, or of [`summary::CAST_STATS`] with a second operand:
/// the bits of the `f32` magnitudes a narrower dtype underflows and overflows at, two
/// `s32` (`summary::Cast`). Computed here, on the execution thread.
fn stats(frame: &Frame<'_>, _hub: &'static Hub, _start: u64) -> Result<(), Error> {
    let mut ops = frame.operands();
    let (Some(x), cast, Some(out)) = (ops.next(), ops.next(), frame.outputs().next()) else {
        return Err(Error::InvalidArgument("hostfeed_stats takes one or two operands and one result".into()));
    };
    if x.dtype != dtype::F32 || out.dtype() != dtype::F32 {
        return Err(Error::InvalidArgument("hostfeed_stats computes float32 statistics of float32".into()));
    }
    let width = out.dims().last().and_then(|&w| usize::try_from(w).ok()).unwrap_or(0);
    let cast = match (width, cast) {
        (summary::STATS, None) => None,
        (summary::CAST_STATS, Some(c))
            if c.dtype == dtype::S32 && elements(c.dims)? == 2 && c.data.align_offset(4) == 0 =>
        {
            // SAFETY: on CPU the operand is an XLA host buffer of two int32 values (dims,
            // dtype and alignment checked just above), alive for this call.
            #[allow(clippy::cast_ptr_alignment)]
            let t = unsafe { std::slice::from_raw_parts(c.data.cast::<i32>(), 2) };
            let (Ok(under), Ok(over)) = (u32::try_from(t[0]), u32::try_from(t[1])) else {
                return Err(Error::InvalidArgument(format!("hostfeed_stats: bad cast thresholds {t:?}")));
            };
            if under >= 0x7f80_0000 || over > 0x7f80_0000 {
                return Err(Error::InvalidArgument(format!("hostfeed_stats: bad cast thresholds {t:?}")));
            }
            Some(summary::Cast { under, over })
        }
        _ => {
            return Err(Error::InvalidArgument(format!(
                "hostfeed_stats: a row of {} statistics takes the value alone, one of {} the value and \
                 two int32 cast thresholds; got rows of {width}",
                summary::STATS,
                summary::CAST_STATS
            )))
        }
    };
    if let Some((x, out)) = rows::<f32>("hostfeed_stats", &x, &out, width)? {
        summary::stats_rows(x, out, cast);
    }
    Ok(())
}

/// The body of the histogram handler: an `f32` operand whose rows are its leading
/// dimensions' elements, then the binning as four `f32`s (`[0, lo, 0, scale]` for equal
/// bins, `[1, lo_exp, 0, 0]` for powers of two) and the edges' exact `f32` comparisons
/// (`bins + 2` values: the least `f32` at or above each edge, then the greatest at or below
/// the last; see `summary::Bins`); one `s32` result of `bins + 2` counts a row
/// (`summary::histogram_rows`). Computed here, on the execution thread.
fn histogram(frame: &Frame<'_>, _hub: &'static Hub, _start: u64) -> Result<(), Error> {
    let mut ops = frame.operands();
    let (Some(x), Some(params), Some(edges), Some(out)) = (ops.next(), ops.next(), ops.next(), frame.outputs().next())
    else {
        return Err(Error::InvalidArgument("hostfeed_histogram takes three operands and one result".into()));
    };
    if x.dtype != dtype::F32 || params.dtype != dtype::F32 || edges.dtype != dtype::F32 || out.dtype() != dtype::S32
    {
        return Err(Error::InvalidArgument("hostfeed_histogram counts float32 values into int32".into()));
    }
    let width = out.dims().last().and_then(|&w| usize::try_from(w).ok()).unwrap_or(0);
    if elements(params.dims)? != 4
        || params.data.align_offset(4) != 0
        || width < 3
        || elements(edges.dims)? != width
        || edges.data.align_offset(4) != 0
    {
        return Err(Error::InvalidArgument("hostfeed_histogram: bad binning operands or result".into()));
    }
    // SAFETY: on CPU the binning operands are XLA host buffers of 4 and `width` float32
    // values (dims and alignment checked just above), alive for this call.
    #[allow(clippy::cast_ptr_alignment)]
    let (p, lower) = unsafe {
        (
            std::slice::from_raw_parts(params.data.cast::<f32>(), 4),
            std::slice::from_raw_parts(edges.data.cast::<f32>(), width),
        )
    };
    let top = lower[width - 1];
    #[allow(clippy::cast_possible_truncation)] // an exponent from -65536 to 0, exact in f32
    let how = if p[0] == 0.0 {
        summary::Bins::Linear { lo: p[1], scale: p[3], lower: &lower[..width - 1], top }
    } else {
        summary::Bins::Log { lo_exp: p[1] as i32, least: lower[0], top }
    };
    if let Some((x, out)) = rows::<i32>("hostfeed_histogram", &x, &out, width)? {
        summary::histogram_rows(x, width - 2, how, out);
    }
    Ok(())
}

/// A summary's values and its result.
type Rows<'a, T> = (&'a [f32], &'a mut [T]);

/// A summary's operand (`f32` values) and result (`width` values of `T` a row) as slices,
/// once the result's rows divide the values evenly; `None` for an empty result.
fn rows<'a, T>(
    name: &str,
    x: &Operand<'a>,
    out: &Buffer<'a>,
    width: usize,
) -> Result<Option<Rows<'a, T>>, Error> {
    let (n, m) = (elements(x.dims)?, elements(out.dims())?);
    let rows = m / width;
    if m % width != 0 || (rows == 0 && n != 0) || (rows > 0 && n % rows != 0) {
        return Err(Error::InvalidArgument(format!("{name}: {n} values do not make the {rows} rows of the result")));
    }
    if m == 0 {
        return Ok(None);
    }
    if x.data.align_offset(4) != 0 || out.data().align_offset(std::mem::align_of::<T>()) != 0 {
        return Err(Error::InvalidArgument(format!("{name}: buffers not aligned for their dtypes")));
    }
    #[allow(clippy::cast_ptr_alignment)] // checked just above
    let values: &[f32] = if n == 0 {
        &[]
    } else {
        // SAFETY: on CPU the operand is an XLA host buffer of `n` float32 values (non-null,
        // aligned: checked), alive and unchanged for this call ('a).
        unsafe { std::slice::from_raw_parts(x.data.cast::<f32>(), n) }
    };
    // SAFETY: the result is an XLA host buffer of `m > 0` values of `T` (the caller checked
    // its dtype; aligned: checked), alive for this call ('a) and written by nothing else;
    // XLA aliases no operand with it (the custom call declares no aliasing), so it does not
    // overlap `values`.
    #[allow(clippy::cast_ptr_alignment)]
    let result = unsafe { std::slice::from_raw_parts_mut(out.data().cast::<T>(), m) };
    Ok(Some((values, result)))
}

/// The number of elements of `dims`.
fn elements(dims: &[i64]) -> Result<usize, Error> {
    dims.iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(usize::try_from(d).ok()?))
        .ok_or_else(|| Error::InvalidArgument(format!("invalid dims {dims:?}")))
}

define_handlers! {
    "";
    pub const HANDLERS;
    /// XLA FFI handler `hostfeed_stats`: the statistics of `reduce="stats"` in one pass.
    hostfeed_stats => stats;
    /// XLA FFI handler `hostfeed_histogram`: the counts of `reduce=Histogram(...)` in one
    /// pass.
    hostfeed_histogram => histogram;
}
