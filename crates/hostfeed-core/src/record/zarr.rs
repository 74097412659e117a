//! Just enough Zarr v3 to write an append-only row store: data types, array and group
//! `zarr.json` documents, chunk keys, the crash-safe metadata write and record names. The
//! bytes go to a [`Store`].
//!
//! Spec: Zarr v3 core (`zarr_format: 3`, `regular` chunk grid, `default` chunk key
//! encoding, `bytes` codec, `zstd` codec) plus the zarr-extensions data types (`bfloat16`,
//! `float8_*`). Only what the recorder writes is modelled. Data type names and fill values
//! are the ones tensorstore writes and reads (the data types of its `zarr3` driver,
//! <https://google.github.io/tensorstore/driver/zarr3/index.html>):
//! `float8_e4m3fn` is tensorstore's name (zarr-extensions lacks it), the other float8
//! names are zarr-extensions'.
//!
//! No Python here.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::error::RecordError;
use crate::ffi::c_api::dtype as xla;
use crate::record::store::{Put, Store};

/// A Zarr v3 data type the recorder can write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DType {
    /// The `data_type` string in `zarr.json`.
    pub(crate) name: &'static str,
    pub(crate) itemsize: usize,
    kind: Kind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Bool,
    Int,
    Float,
    Complex,
}

impl DType {
    /// The Zarr data type for an XLA dtype code.
    ///
    /// # Errors
    /// [`RecordError::Dtype`] naming the type for sub-byte, token and unknown types.
    pub(crate) fn from_xla(code: i32) -> Result<DType, RecordError> {
        let d = |name, itemsize, kind| Ok(DType { name, itemsize, kind });
        match code {
            xla::PRED => d("bool", 1, Kind::Bool),
            xla::S8 => d("int8", 1, Kind::Int),
            xla::S16 => d("int16", 2, Kind::Int),
            xla::S32 => d("int32", 4, Kind::Int),
            xla::S64 => d("int64", 8, Kind::Int),
            xla::U8 => d("uint8", 1, Kind::Int),
            xla::U16 => d("uint16", 2, Kind::Int),
            xla::U32 => d("uint32", 4, Kind::Int),
            xla::U64 => d("uint64", 8, Kind::Int),
            xla::F16 => d("float16", 2, Kind::Float),
            xla::F32 => d("float32", 4, Kind::Float),
            xla::F64 => d("float64", 8, Kind::Float),
            xla::C64 => d("complex64", 8, Kind::Complex),
            xla::C128 => d("complex128", 16, Kind::Complex),
            xla::BF16 => d("bfloat16", 2, Kind::Float),
            xla::F8E5M2 => d("float8_e5m2", 1, Kind::Float),
            // Not (yet) in zarr-extensions; the name tensorstore writes and reads.
            xla::F8E4M3FN => d("float8_e4m3fn", 1, Kind::Float),
            xla::F8E4M3B11FNUZ => d("float8_e4m3b11fnuz", 1, Kind::Float),
            xla::F8E5M2FNUZ => d("float8_e5m2fnuz", 1, Kind::Float),
            xla::F8E4M3FNUZ => d("float8_e4m3fnuz", 1, Kind::Float),
            xla::F8E4M3 => d("float8_e4m3", 1, Kind::Float),
            xla::F8E3M4 => d("float8_e3m4", 1, Kind::Float),
            xla::F8E8M0FNU => d("float8_e8m0fnu", 1, Kind::Float),
            xla::S4 | xla::U4 | xla::S2 | xla::U2 | xla::S1 | xla::U1 | xla::F4E2M1FN => {
                Err(RecordError::Dtype(format!(
                    "XLA dtype code {code} is a sub-byte type; hostfeed cannot record it (cast to \
                     int8/uint8/float8 first)"
                )))
            }
            _ => Err(RecordError::Dtype(format!("XLA dtype code {code} cannot be recorded"))),
        }
    }

    /// The data type named `name` in a `zarr.json`, if the recorder writes it.
    pub(crate) fn from_name(name: &str) -> Option<DType> {
        (0..64).filter_map(|code| DType::from_xla(code).ok()).find(|d| d.name == name)
    }

    /// The `fill_value` JSON. Padding past the last row is never read (it lies beyond
    /// `shape`), so any valid value works; zero is the natural one.
    #[must_use]
    pub(crate) fn fill_value(&self) -> Value {
        match self.kind {
            Kind::Bool => json!(false),
            Kind::Int => json!(0),
            // One-byte floats as raw bits: the form every reader accepts (zarrs without its
            // `float8` feature parses only this one), and e8m0fnu has no zero (0x00 = 2^-127).
            Kind::Float if self.itemsize == 1 => json!("0x00"),
            Kind::Float => json!(0.0),
            Kind::Complex => json!([0.0, 0.0]),
        }
    }
}

/// Compression of data chunks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    /// Uncompressed: rows appended in place.
    Raw,
    /// zstd at this level.
    Zstd(i32),
    /// Blosc at this `clevel` (zstd inside, at c-blosc's level for it, `2 * clevel - 1`),
    /// each value's bytes shuffled (byte 0 of every value, then byte 1...): the per-row
    /// metadata's codec in an object store (`blosc_encode`); never a data array's.
    Blosc(i32),
}

/// What fixes an array's layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ArraySpec {
    pub(crate) dtype: DType,
    /// Shape of one row (the recorded value's shape).
    pub(crate) row_shape: Vec<u64>,
    /// Rows per chunk (the chunk's first dimension; the others are the full row).
    pub(crate) chunk_rows: u64,
    pub(crate) codec: Codec,
    /// `dimension_names`: the row dimension first.
    pub(crate) dim_names: Vec<Option<String>>,
    /// Chunk key separator: `/` (nested directories `c/k/0/0`) or `.` (flat `c.k.0.0`).
    pub(crate) sep: char,
    /// One part of a parted array: rows of this spec are the slice `index` of
    /// `count` equal slices along the row's first dimension; see [`Part`].
    pub(crate) part: Option<Part>,
    /// Sharded (Zarr's `sharding_indexed` codec): each chunk of `chunk_rows` rows is a
    /// shard, one object holding inner chunks of this many rows and an index of them at its
    /// end (`shard.rs`). `None`: a chunk is an object.
    pub(crate) inner_rows: Option<u64>,
}

/// A slice of a parted array: the array's rows have shape `[count * row_shape[0],
/// *row_shape[1..]]`, chunked `[chunk_rows, *row_shape]`, so that chunk `(k, index, 0...)`
/// holds exactly rows `k * chunk_rows..` of slice `index` (the bytes a writer of that slice
/// alone writes). Every process writes the chunks of the slices its devices hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Part {
    pub(crate) index: u64,
    pub(crate) count: u64,
}

/// Bytes of `shape` elements of `itemsize` bytes, if that fits in memory sizes.
#[must_use]
pub(crate) fn nbytes(shape: &[u64], itemsize: usize) -> Option<usize> {
    shape.iter().try_fold(itemsize, |acc, &d| usize::try_from(d).ok().and_then(|d| acc.checked_mul(d)))
}

impl ArraySpec {
    /// Bytes of one row.
    #[must_use]
    pub(crate) fn row_bytes(&self) -> usize {
        nbytes(&self.row_shape, self.dtype.itemsize).unwrap_or(usize::MAX)
    }

    /// Bytes of one (full) chunk.
    #[must_use]
    pub(crate) fn chunk_bytes(&self) -> usize {
        usize::try_from(self.chunk_rows).map_or(usize::MAX, |n| self.row_bytes().saturating_mul(n))
    }

    /// The array's `zarr.json` for `rows` rows.
    #[must_use]
    pub(crate) fn metadata(&self, rows: u64, attributes: &Value) -> Value {
        let mut shape = vec![rows];
        shape.extend(&self.row_shape);
        if let (Some(p), Some(d0)) = (self.part, shape.get_mut(1)) {
            *d0 *= p.count;
        }
        // Full rows per chunk; a zero-size dimension still needs a positive chunk extent.
        let chunk_of = |rows: u64| {
            let mut c = vec![rows];
            c.extend(self.row_shape.iter().map(|&d| d.max(1)));
            c
        };
        let chunk = chunk_of(self.chunk_rows);
        let bytes = if self.dtype.itemsize == 1 {
            // zarr-python refuses an endianness for one-byte types; the spec allows leaving
            // it out, and tensorstore writes it that way.
            json!({"name": "bytes"})
        } else {
            let endian = if cfg!(target_endian = "little") { "little" } else { "big" };
            json!({"name": "bytes", "configuration": {"endian": endian}})
        };
        let mut codecs = vec![bytes];
        match self.codec {
            Codec::Raw => {}
            Codec::Zstd(level) => {
                codecs.push(json!({"name": "zstd", "configuration": {"level": level, "checksum": false}}));
            }
            Codec::Blosc(clevel) => codecs.push(json!({"name": "blosc", "configuration": {
                "cname": "zstd", "clevel": clevel, "shuffle": "shuffle", "typesize": self.dtype.itemsize,
                "blocksize": 0,
            }})),
        }
        if let Some(inner) = self.inner_rows {
            codecs = vec![json!({"name": "sharding_indexed", "configuration": {
                "chunk_shape": chunk_of(inner),
                "codecs": codecs,
                "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}],
                "index_location": "end",
            }})];
        }
        json!({
            "zarr_format": 3,
            "node_type": "array",
            "shape": shape,
            "data_type": self.dtype.name,
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": chunk}},
            "chunk_key_encoding": {"name": "default", "configuration": {"separator": self.sep.to_string()}},
            "fill_value": self.dtype.fill_value(),
            "codecs": codecs,
            "attributes": attributes,
            "dimension_names": self.dim_names,
        })
    }

    /// Path of chunk `k` below the array's directory (`c/k/0/0...` or `c.k.0.0...`).
    #[must_use]
    pub(crate) fn chunk_path(&self, array_dir: &Path, k: u64) -> PathBuf {
        if self.sep == '.' {
            let mut name = format!("c.{k}");
            for i in 0..self.row_shape.len() {
                name.push('.');
                name.push_str(&self.key_index(i).to_string());
            }
            return array_dir.join(name);
        }
        let mut p = array_dir.join("c").join(k.to_string());
        for i in 0..self.row_shape.len() {
            p.push(self.key_index(i).to_string());
        }
        p
    }

    /// The chunk index along row dimension `i` (the part's index along the first).
    fn key_index(&self, i: usize) -> u64 {
        match self.part {
            Some(p) if i == 0 => p.index,
            _ => 0,
        }
    }
}

/// A group's `zarr.json`.
#[must_use]
pub(crate) fn group_metadata(attributes: &Value) -> Value {
    json!({"zarr_format": 3, "node_type": "group", "attributes": attributes})
}

/// Writes `doc` to `dir/zarr.json` atomically: a reader sees the old or the new document,
/// never a torn one, even if this process is killed mid-write ([`Put::Document`]: on a
/// file system, a temporary file renamed over the old one; with `durable`, the document
/// and the rename also survive an OS crash).
///
/// # Errors
/// I/O errors, with the path.
pub(crate) fn write_json(store: &dyn Store, dir: &Path, doc: &Value) -> Result<(), RecordError> {
    // Indented on a file system, for whoever reads it; compact in an object store, where an
    // array's document is put again at every commit.
    let text = if store.in_place().is_some() { serde_json::to_vec_pretty(doc) } else { serde_json::to_vec(doc) }
        .map_err(|e| RecordError::Invalid(format!("cannot encode metadata for {}: {e}", dir.display())))?;
    store.put(&dir.join("zarr.json"), &text, Put::Document)
}

/// Blosc's header flags: bytes shuffled, stored as they are (too little to gain), one
/// stream a block (not one per byte of a value), and the compressor (zstd) in bits 5-7.
const BLOSC_SHUFFLE: u8 = 0x01;
const BLOSC_MEMCPYED: u8 = 0x02;
const BLOSC_DONT_SPLIT: u8 = 0x10;
const BLOSC_ZSTD: u8 = 4 << 5;

/// `data`, values of `typesize` bytes, as a Blosc frame (the format c-blosc 1 writes and
/// every Zarr reader's Blosc reads: a 16-byte header, one block's start, then its one
/// stream): the bytes shuffled, then zstd at c-blosc's level for `clevel`; stored as they
/// are where that does not gain. Record numbers, steps and times are values that differ
/// in their low bytes only: shuffled, their high bytes make long runs, and they compress
/// several times better than zstd alone does.
///
/// # Errors
/// A compression failure or a chunk of 2 GiB or more, as text.
pub(crate) fn blosc_encode(data: &[u8], typesize: usize, clevel: i32) -> Result<Vec<u8>, String> {
    let n = data.len();
    let nbytes = i32::try_from(n).map_err(|_| format!("a chunk of {n} bytes is too large for Blosc"))?;
    let t = typesize.clamp(1, 255);
    let per = n / t;
    let mut shuffled = vec![0u8; n];
    for (i, value) in data[..per * t].chunks_exact(t).enumerate() {
        for (j, &b) in value.iter().enumerate() {
            shuffled[j * per + i] = b;
        }
    }
    shuffled[per * t..].copy_from_slice(&data[per * t..]);
    let packed = zstd::bulk::compress(&shuffled, 2 * clevel.clamp(1, 9) - 1).map_err(|e| e.to_string())?;
    let header = |flags: u8, cbytes: usize| {
        let mut h = vec![2, 1, flags | BLOSC_DONT_SPLIT | BLOSC_ZSTD, u8::try_from(t).unwrap_or(u8::MAX)];
        h.extend_from_slice(&nbytes.to_le_bytes());
        h.extend_from_slice(&nbytes.to_le_bytes()); // one block
        h.extend_from_slice(&i32::try_from(cbytes).unwrap_or(i32::MAX).to_le_bytes());
        h
    };
    // Header, the block's start, the stream's length and the stream.
    let cbytes = 16 + 4 + 4 + packed.len();
    if packed.len() >= n || cbytes >= 16 + n {
        let mut out = header(BLOSC_MEMCPYED, 16 + n);
        out.extend_from_slice(data);
        return Ok(out);
    }
    let mut out = header(BLOSC_SHUFFLE, cbytes);
    out.extend_from_slice(&20i32.to_le_bytes());
    out.extend_from_slice(&i32::try_from(packed.len()).unwrap_or(i32::MAX).to_le_bytes());
    out.extend_from_slice(&packed);
    Ok(out)
}

/// The bytes of a Blosc frame of [`blosc_encode`]'s kind (zstd, one stream a block).
///
/// # Errors
/// A frame of another kind, or damaged, as text.
pub(crate) fn blosc_decode(frame: &[u8]) -> Result<Vec<u8>, String> {
    let word = |at: usize| -> Result<usize, String> {
        frame
            .get(at..at + 4)
            .and_then(|b| usize::try_from(i32::from_le_bytes(b.try_into().unwrap_or([0; 4]))).ok())
            .ok_or_else(|| format!("a Blosc frame of {} bytes is cut short", frame.len()))
    };
    let (flags, t) = match frame {
        [_, _, flags, t, ..] => (*flags, usize::from(*t).max(1)),
        _ => return Err("a Blosc frame shorter than its header".into()),
    };
    let (n, blocksize) = (word(4)?, word(8)?.max(1));
    if flags & BLOSC_MEMCPYED != 0 {
        return frame.get(16..16 + n).map(<[u8]>::to_vec).ok_or_else(|| "a Blosc frame is cut short".into());
    }
    if flags & 0xe0 != BLOSC_ZSTD || flags & BLOSC_DONT_SPLIT == 0 || flags & 0x04 != 0 {
        return Err(format!("a Blosc frame of a kind hostfeed does not write (flags {flags:#04x})"));
    }
    let mut out = Vec::with_capacity(n);
    for b in 0..n.div_ceil(blocksize) {
        let len = blocksize.min(n - b * blocksize);
        let start = word(16 + 4 * b)?;
        let csize = word(start)?;
        let stream = frame.get(start + 4..start + 4 + csize).ok_or("a Blosc frame is cut short")?;
        let block = if csize == len { stream.to_vec() } else { zstd::bulk::decompress(stream, len).map_err(|e| e.to_string())? };
        if block.len() != len {
            return Err(format!("a Blosc block holds {} bytes, not {len}", block.len()));
        }
        if flags & BLOSC_SHUFFLE == 0 {
            out.extend_from_slice(&block);
            continue;
        }
        let per = len / t;
        let at = out.len();
        out.resize(at + per * t, 0);
        for (j, plane) in block[..per * t].chunks_exact(per.max(1)).enumerate().take(t) {
            for (i, &v) in plane.iter().enumerate() {
                out[at + i * t + j] = v;
            }
        }
        out.extend_from_slice(&block[per * t..]);
    }
    Ok(out)
}

/// Suffixes of the per-row metadata arrays stored next to each data array (`h.step`...).
pub(crate) const ROW_METADATA: [&str; 5] = ["seq", "step", "device", "time_ns", "transforms"];

/// Longest component of a record name, in bytes: the per-row metadata arrays add up to 11
/// bytes (`.transforms`) to the last one, and a file name has at most 255.
pub(crate) const MAX_COMPONENT_BYTES: usize = 200;
/// Longest record name, in bytes.
pub(crate) const MAX_NAME_BYTES: usize = 1024;

/// Checks one record name (`"layer1/h"`) and splits it into path segments.
///
/// Each `/`-separated part must be non-empty, at most [`MAX_COMPONENT_BYTES`] long, not
/// start with `.` (temporary files and `..`) or `__` (Zarr reserves that), not be
/// `zarr.json`, use only letters, digits, `_`, `-` and `.`, and not end with a per-row
/// metadata suffix (`.step`, ...): such a part would reach into a metadata array. The
/// whole name has at most [`MAX_NAME_BYTES`].
///
/// # Errors
/// [`RecordError::Invalid`] saying what is wrong with the name.
pub(crate) fn split_name(name: &str) -> Result<Vec<&str>, RecordError> {
    let bad = |why: String| Err(RecordError::Invalid(format!("invalid record name {name:?}: {why}")));
    if name.len() > MAX_NAME_BYTES {
        return bad(format!("it has {} bytes, at most {MAX_NAME_BYTES} are allowed", name.len()));
    }
    let parts: Vec<&str> = name.split('/').collect();
    for p in &parts {
        let ok_chars = p.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
        if p.is_empty() || p.starts_with('.') || p.starts_with("__") || !ok_chars {
            return bad(format!(
                "the part {p:?} is not allowed: each '/'-separated part must be non-empty, not \
                 start with '.' or '__', and use only letters, digits, '_', '-' and '.'"
            ));
        }
        if p.len() > MAX_COMPONENT_BYTES {
            return bad(format!("a part has {} bytes, at most {MAX_COMPONENT_BYTES} are allowed", p.len()));
        }
        if *p == "zarr.json" {
            return bad("'zarr.json' is the name of Zarr's metadata documents".into());
        }
        if let Some(suffix) = ROW_METADATA.iter().find(|s| p.ends_with(&format!(".{s}"))) {
            return bad(format!(
                "the suffix '.{suffix}' (in {p:?}) is reserved for the per-row metadata stored \
                 next to each recorded array"
            ));
        }
    }
    Ok(parts)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Blosc frames read back: shuffled and compressed (record numbers, a few bytes for a
    /// thousand), stored as they are (bytes that do not compress), zeros of 2-byte values.
    #[test]
    fn blosc_frames_read_back() {
        let seq: Vec<u8> = (5000i64..6024).flat_map(i64::to_le_bytes).collect();
        let frame = blosc_encode(&seq, 8, 2).unwrap();
        let zstd_alone = zstd::bulk::compress(&seq, 3).unwrap().len();
        assert!(frame.len() * 2 < zstd_alone, "1,024 record numbers in {} bytes, not {zstd_alone}", frame.len());
        assert_eq!(frame[2], 0x01 | 0x10 | 0x80, "shuffled, one stream, zstd");
        assert_eq!(blosc_decode(&frame).unwrap(), seq);
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let noise: Vec<u8> = (0..999)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x.to_le_bytes()[3]
            })
            .collect();
        let frame = blosc_encode(&noise, 8, 2).unwrap();
        assert_eq!((frame.len(), frame[2] & 0x02), (16 + 999, 0x02), "stored as it is");
        assert_eq!(blosc_decode(&frame).unwrap(), noise);
        let zeros = vec![0u8; 2048];
        assert_eq!(blosc_decode(&blosc_encode(&zeros, 2, 2).unwrap()).unwrap(), zeros);
        assert!(blosc_decode(&frame[..10]).is_err());
    }

    #[test]
    fn dtype_names_match_zarr_extensions_and_tensorstore() {
        assert_eq!(DType::from_xla(xla::BF16).unwrap().name, "bfloat16");
        assert_eq!(DType::from_xla(xla::F8E4M3FN).unwrap().name, "float8_e4m3fn");
        assert_eq!(DType::from_xla(xla::F8E8M0FNU).unwrap().fill_value(), json!("0x00"));
        assert_eq!(DType::from_xla(xla::BF16).unwrap().fill_value(), json!(0.0));
        assert_eq!(DType::from_xla(xla::C64).unwrap().fill_value(), json!([0.0, 0.0]));
        assert_eq!(DType::from_xla(xla::PRED).unwrap().fill_value(), json!(false));
        let sub_byte = DType::from_xla(xla::S4).unwrap_err().to_string();
        assert!(sub_byte.contains("sub-byte"), "{sub_byte}");
        assert!(DType::from_xla(xla::F4E2M1FN).is_err());
        assert!(DType::from_xla(xla::TOKEN).is_err());
    }

    #[test]
    fn array_metadata_and_chunk_keys() {
        let spec = ArraySpec {
            dtype: DType::from_xla(xla::F8E5M2).unwrap(),
            row_shape: vec![3, 0],
            chunk_rows: 4,
            codec: Codec::Zstd(2),
            dim_names: vec![Some("h.row".into()), None, None],
            sep: '/',
            part: None,
            inner_rows: None,
        };
        let m = spec.metadata(9, &json!({}));
        assert_eq!(m["shape"], json!([9, 3, 0]));
        assert_eq!(m["chunk_grid"]["configuration"]["chunk_shape"], json!([4, 3, 1]));
        assert_eq!(m["codecs"][0], json!({"name": "bytes"}), "one-byte types carry no endianness");
        assert_eq!(m["codecs"][1]["configuration"]["level"], json!(2));
        assert_eq!(spec.chunk_path(Path::new("a"), 2), Path::new("a/c/2/0/0"));
        let wide = ArraySpec { dtype: DType::from_xla(xla::F32).unwrap(), codec: Codec::Raw, ..spec.clone() };
        assert_eq!(
            wide.metadata(0, &json!({}))["codecs"],
            json!([{"name": "bytes", "configuration": {"endian": "little"}}])
        );
        let flat = ArraySpec { sep: '.', ..spec };
        assert_eq!(flat.chunk_path(Path::new("a"), 2), Path::new("a/c.2.0.0"));
        assert_eq!(flat.row_bytes(), 0);
        let parted = ArraySpec { part: Some(Part { index: 2, count: 3 }), ..flat.clone() };
        assert_eq!(parted.metadata(5, &json!({}))["shape"], json!([5, 9, 0]));
        assert_eq!(
            parted.metadata(5, &json!({}))["chunk_grid"]["configuration"]["chunk_shape"],
            json!([4, 3, 1])
        );
        assert_eq!(parted.chunk_path(Path::new("a"), 1), Path::new("a/c.1.2.0"));
        let nested = ArraySpec { sep: '/', ..parted };
        assert_eq!(nested.chunk_path(Path::new("a"), 1), Path::new("a/c/1/2/0"));
    }

    #[test]
    fn names() {
        assert_eq!(split_name("layer1/h").unwrap(), vec!["layer1", "h"]);
        assert_eq!(split_name("h.cotangent").unwrap(), vec!["h.cotangent"]);
        for bad in ["", "a//b", "/a", "a/", "..", "__x", "a b", "a/./b", "h.step", "g/h.time_ns"] {
            assert!(split_name(bad).is_err(), "{bad:?}");
        }
        // Every part is checked, not only the last.
        for bad in ["h.step/inner", "h.seq/c", "h.step/.zarr.json.tmp", "zarr.json", "c/zarr.json", ".x/y"] {
            assert!(split_name(bad).is_err(), "{bad:?}");
        }
        let long = "x".repeat(MAX_COMPONENT_BYTES + 1);
        assert!(split_name(&long).unwrap_err().to_string().contains("bytes"));
        assert!(split_name(&"x".repeat(MAX_COMPONENT_BYTES)).is_ok());
        let many = vec!["abcdefghi"; 110].join("/");
        assert!(split_name(&many).is_err(), "{} bytes", many.len());
    }

    #[test]
    fn json_is_replaced_atomically() {
        use crate::record::store::{temp_path, FsStore};
        use std::fs;
        let dir = std::env::temp_dir().join(format!("hostfeed_zarr_json_{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        write_json(&FsStore { durable: false }, &dir, &json!({"a": 1})).unwrap();
        write_json(&FsStore { durable: true }, &dir, &json!({"a": 2})).unwrap();
        let doc: Value = serde_json::from_slice(&fs::read(dir.join("zarr.json")).unwrap()).unwrap();
        assert_eq!(doc, json!({"a": 2}));
        let left: Vec<_> = fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(left, vec![std::ffi::OsString::from("zarr.json")], "no temporary file is left");
        let a = temp_path(&dir.join("c.1"));
        let b = temp_path(&dir.join("c.2"));
        assert_ne!(a, b);
        assert_ne!(temp_path(&dir.join("c.1")), a, "each call gets its own");
        fs::remove_dir_all(&dir).unwrap();
        let missing = write_json(&FsStore { durable: false }, &dir, &json!({})).unwrap_err();
        assert!(matches!(missing, RecordError::Io { errno: Some(libc::ENOENT), .. }), "{missing}");
    }
}
