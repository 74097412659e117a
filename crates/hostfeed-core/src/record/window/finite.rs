//! Finding a non-finite value (NaN, +inf, -inf) in a row's bytes, for the non-finite
//! trigger: one pass over the row in blocks, each block reduced without a branch per
//! element (the loops vectorize), and only a block that holds one searched again for the
//! element. Float types of every width hostfeed records, complex types as pairs of floats,
//! and summary rows whose columns count the non-finite values of what they summarize.
//!
//! No Python here.

/// Bytes reduced per block before the scan looks whether the block held a match.
const BLOCK: usize = 4096;

/// How the values of a row are encoded, for the scan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scan {
    /// IEEE binary formats: non-finite where the exponent bits (`mask`) are all set; the
    /// value is infinite where the other bits but the sign (`mantissa`) are all clear.
    Ieee {
        /// Bytes per value.
        width: usize,
        /// The exponent bits.
        mask: u64,
        /// The mantissa bits.
        mantissa: u64,
        /// The sign bit.
        sign: u64,
    },
    /// One-byte formats whose only non-finite value is a NaN with these bits set (all of
    /// `mask`): `float8_e4m3fn` (`S.1111.111`), `float8_e8m0fnu` (`0xff`).
    NanOnly {
        /// The bits that are all set in a NaN (and the bits compared).
        mask: u8,
    },
    /// One-byte formats whose only non-finite value is the NaN `0x80` (the `fnuz` types).
    NegativeZeroNan,
}

/// What a non-finite value was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NonFinite {
    Nan,
    PosInf,
    NegInf,
}

impl NonFinite {
    /// How a trigger's reason names it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            NonFinite::Nan => "nan",
            NonFinite::PosInf => "inf",
            NonFinite::NegInf => "-inf",
        }
    }
}

impl Scan {
    /// The scan for values of the Zarr data type `name` (`None`: its values are always
    /// finite: integers, booleans).
    pub(crate) fn of(name: &str) -> Option<Scan> {
        let ieee = |width: usize, exponent: u32, mantissa: u32| Scan::Ieee {
            width,
            mask: ((1u64 << exponent) - 1) << mantissa,
            mantissa: (1u64 << mantissa) - 1,
            sign: 1u64 << (exponent + mantissa),
        };
        Some(match name {
            "float64" | "complex128" => ieee(8, 11, 52),
            "float32" | "complex64" => ieee(4, 8, 23),
            "float16" => ieee(2, 5, 10),
            "bfloat16" => ieee(2, 8, 7),
            "float8_e5m2" => ieee(1, 5, 2),
            "float8_e4m3" => ieee(1, 4, 3),
            "float8_e3m4" => ieee(1, 3, 4),
            "float8_e4m3fn" => Scan::NanOnly { mask: 0x7f },
            "float8_e8m0fnu" => Scan::NanOnly { mask: 0xff },
            "float8_e4m3fnuz" | "float8_e5m2fnuz" | "float8_e4m3b11fnuz" => Scan::NegativeZeroNan,
            _ => return None,
        })
    }

    /// Bytes per value.
    pub(crate) fn width(self) -> usize {
        match self {
            Scan::Ieee { width, .. } => width,
            Scan::NanOnly { .. } | Scan::NegativeZeroNan => 1,
        }
    }

    /// The first non-finite value of `bytes` (little-endian values; a trailing partial
    /// value is ignored): its index and what it is.
    pub(crate) fn first(self, bytes: &[u8]) -> Option<(usize, NonFinite)> {
        let width = self.width();
        let per_block = BLOCK / width * width;
        for (b, block) in bytes.chunks(per_block).enumerate() {
            if self.any(block) {
                let at = block.chunks_exact(width).position(|v| self.classify(word(v)).is_some())?;
                let index = b * (per_block / width) + at;
                return self.classify(word(&block[at * width..(at + 1) * width])).map(|k| (index, k));
            }
        }
        None
    }

    /// Whether `block` holds a non-finite value: a reduction without branches per value.
    fn any(self, block: &[u8]) -> bool {
        // Each value's test as 0 or 1, or-ed together: no branch per value.
        let hits = match self {
            Scan::Ieee { width: 8, mask, .. } => {
                block.chunks_exact(8).fold(0u8, |acc, v| acc | u8::from(word(v) & mask == mask))
            }
            Scan::Ieee { width: 4, mask, .. } => {
                let mask = u32::try_from(mask).unwrap_or(u32::MAX);
                block
                    .chunks_exact(4)
                    .fold(0u8, |acc, v| acc | u8::from(u32::from_le_bytes([v[0], v[1], v[2], v[3]]) & mask == mask))
            }
            Scan::Ieee { width: 2, mask, .. } => {
                let mask = u16::try_from(mask).unwrap_or(u16::MAX);
                block.chunks_exact(2).fold(0u8, |acc, v| acc | u8::from(u16::from_le_bytes([v[0], v[1]]) & mask == mask))
            }
            Scan::Ieee { mask, .. } => {
                let mask = u8::try_from(mask).unwrap_or(u8::MAX);
                block.iter().fold(0u8, |acc, &v| acc | u8::from(v & mask == mask))
            }
            Scan::NanOnly { mask } => block.iter().fold(0u8, |acc, &v| acc | u8::from(v & mask == mask)),
            Scan::NegativeZeroNan => block.iter().fold(0u8, |acc, &v| acc | u8::from(v == 0x80)),
        };
        hits != 0
    }

    /// What the value with bits `v` is, if it is not finite.
    fn classify(self, v: u64) -> Option<NonFinite> {
        match self {
            Scan::Ieee { mask, mantissa, sign, .. } => {
                if v & mask != mask {
                    None
                } else if v & mantissa != 0 {
                    Some(NonFinite::Nan)
                } else if v & sign != 0 {
                    Some(NonFinite::NegInf)
                } else {
                    Some(NonFinite::PosInf)
                }
            }
            Scan::NanOnly { mask } => (v & u64::from(mask) == u64::from(mask)).then_some(NonFinite::Nan),
            Scan::NegativeZeroNan => (v == 0x80).then_some(NonFinite::Nan),
        }
    }
}

/// The little-endian value of up to 8 bytes.
fn word(v: &[u8]) -> u64 {
    let mut raw = [0u8; 8];
    let n = v.len().min(8);
    raw[..n].copy_from_slice(&v[..n]);
    u64::from_le_bytes(raw)
}

/// The first position of a summary row (float32 values, `width` to a kept position) whose
/// column is one of `columns` (they count the non-finite values summarized) and holds a
/// non-zero count: its value index.
pub(crate) fn first_counted(bytes: &[u8], width: usize, columns: &[usize]) -> Option<usize> {
    if width == 0 || columns.is_empty() {
        return None;
    }
    bytes.chunks_exact(4).enumerate().find_map(|(i, v)| {
        let count = f32::from_le_bytes([v[0], v[1], v[2], v[3]]);
        // A NaN count is no count of zero either.
        (columns.contains(&(i % width)) && count != 0.0).then_some(i)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn finds_the_first_non_finite_float32_across_blocks() {
        let mut v = vec![1.0f32; 5000];
        let scan = Scan::of("float32").unwrap();
        assert_eq!(scan.first(&f32s(&v)), None);
        v[4321] = f32::NEG_INFINITY;
        v[4999] = f32::NAN;
        assert_eq!(scan.first(&f32s(&v)), Some((4321, NonFinite::NegInf)));
        v[7] = f32::INFINITY;
        assert_eq!(scan.first(&f32s(&v)), Some((7, NonFinite::PosInf)));
        // The largest finite value and subnormals are finite.
        assert_eq!(scan.first(&f32s(&[f32::MAX, -f32::MAX, 1e-45, -0.0])), None);
    }

    #[test]
    fn every_width_tells_nan_from_infinities() {
        let f64s: Vec<u8> = [1.0f64, f64::NAN].iter().flat_map(|x| x.to_le_bytes()).collect();
        assert_eq!(Scan::of("float64").unwrap().first(&f64s), Some((1, NonFinite::Nan)));
        // float16: 0x7c00 is +inf, 0xfc00 -inf, 0x7e00 NaN; 0x7bff the largest finite.
        let f16 = |bits: &[u16]| bits.iter().flat_map(|b| b.to_le_bytes()).collect::<Vec<u8>>();
        let s = Scan::of("float16").unwrap();
        assert_eq!(s.first(&f16(&[0x7bff, 0xfc00])), Some((1, NonFinite::NegInf)));
        assert_eq!(s.first(&f16(&[0x7e00])), Some((0, NonFinite::Nan)));
        // bfloat16: the top half of a float32.
        let s = Scan::of("bfloat16").unwrap();
        assert_eq!(s.first(&f16(&[0x3f80, 0x7f80])), Some((1, NonFinite::PosInf)));
        assert_eq!(s.first(&f16(&[0x7f7f])), None);
        // float8_e5m2: 0x7c inf, 0x7d NaN, 0x7b finite; e4m3fn: 0x7f NaN only, 0x7e finite.
        let s = Scan::of("float8_e5m2").unwrap();
        assert_eq!(s.first(&[0x7b, 0xfc]), Some((1, NonFinite::NegInf)));
        assert_eq!(s.first(&[0x7d]), Some((0, NonFinite::Nan)));
        let s = Scan::of("float8_e4m3fn").unwrap();
        assert_eq!(s.first(&[0x7e, 0xfe]), None);
        assert_eq!(s.first(&[0x7e, 0xff]), Some((1, NonFinite::Nan)));
        let s = Scan::of("float8_e4m3fnuz").unwrap();
        assert_eq!(s.first(&[0x00, 0x7f, 0x80]), Some((2, NonFinite::Nan)));
        assert_eq!(Scan::of("int32"), None);
    }

    #[test]
    fn counted_columns_find_a_count() {
        // Two kept positions of 3 columns; column 2 counts NaNs.
        let row = f32s(&[5.0, f32::NAN, 0.0, 5.0, 1.0, 2.0]);
        assert_eq!(first_counted(&row, 3, &[2]), Some(5));
        assert_eq!(first_counted(&row, 3, &[]), None);
        assert_eq!(first_counted(&f32s(&[5.0, f32::NAN, 0.0]), 3, &[2]), None);
    }
}
