//! Zarr v3 shards (the `sharding_indexed` codec, index at the end, as tensorstore and zarrs
//! write them by default): one object holds a chunk's inner chunks back to back, then an
//! index of `(offset, nbytes)` pairs (little-endian `u64`), one per inner chunk in order,
//! `(u64::MAX, u64::MAX)` for one not written (its rows read as the fill value), then the
//! index's CRC-32C (the `crc32c` index codec).
//!
//! A shard of rows is written two ways:
//!
//! * uncompressed, where the store writes into part of an object (a file system): every
//!   inner chunk has a fixed size and place (inner chunk `i` at `i * inner_bytes`), so row
//!   `r` of a shard lies at `r * row_bytes` as in an unsharded chunk; rows are written in
//!   place as they come and the index, at its fixed place after the last inner chunk, is
//!   written again after them, listing the inner chunks that hold rows ([`index_in_place`]);
//! * streamed, to a store that uploads an object piece by piece (an object store's
//!   multipart upload, [`Streamed`]): each inner chunk encoded and sent as soon as it is
//!   full, the index sent last, when the shard is full or a flush completes it as a partial
//!   shard ([`ShardUpload`]); rows that come later for a partial shard start a new upload
//!   with its rows read back;
//! * otherwise (compressed, on a file system) whole: the shard's rows, those of an
//!   earlier partial shard read back first ([`read_rows`]), split into inner chunks, each
//!   encoded, and the index after them ([`encode`]). Only inner chunks holding rows are
//!   stored; the last one is padded to its full size.
//!
//! No Python here.

use std::io::{Read, Write};

use std::path::Path;

use crate::error::RecordError;
use crate::record::store::Streamed;
use crate::record::zarr::Codec;

/// Bytes of an index entry.
const ENTRY: usize = 16;
/// An entry of an inner chunk not written.
const MISSING: u64 = u64::MAX;

/// Bytes of the index of a shard of `inner_chunks` inner chunks (with its checksum).
#[must_use]
pub(crate) fn index_bytes(inner_chunks: u64) -> usize {
    usize::try_from(inner_chunks).unwrap_or(usize::MAX / ENTRY).saturating_mul(ENTRY) + 4
}

/// The index of a shard whose first inner chunks are stored at `entries` (offset, bytes).
#[must_use]
pub(crate) fn index_of(entries: &[(u64, u64)], inner_chunks: u64) -> Vec<u8> {
    finish_index(entries, inner_chunks)
}

/// One inner chunk: `rows` with zeros to `inner_bytes`, encoded with `codec`.
///
/// # Errors
/// A compression failure, as the text of the error.
pub(crate) fn encode_inner(rows: &[u8], inner_bytes: usize, codec: Codec) -> Result<Vec<u8>, String> {
    match codec {
        Codec::Raw => {
            let mut out = Vec::with_capacity(inner_bytes);
            out.extend_from_slice(rows);
            out.resize(inner_bytes.max(rows.len()), 0);
            Ok(out)
        }
        Codec::Zstd(level) => {
            let mut enc = zstd::stream::Encoder::new(Vec::new(), level).map_err(|e| e.to_string())?;
            enc.write_all(rows).map_err(|e| e.to_string())?;
            enc.write_all(&vec![0u8; inner_bytes.saturating_sub(rows.len())]).map_err(|e| e.to_string())?;
            enc.finish().map_err(|e| e.to_string())
        }
        Codec::Blosc(_) => Err(BLOSC_DATA.into()),
    }
}

/// What a data array laid out with Blosc, the per-row metadata's codec, meets.
pub(crate) const BLOSC_DATA: &str = "hostfeed internal error: Blosc is the per-row metadata's codec, not a data array's";

fn finish_index(entries: &[(u64, u64)], inner_chunks: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(index_bytes(inner_chunks));
    for i in 0..usize::try_from(inner_chunks).unwrap_or(0) {
        let (offset, nbytes) = entries.get(i).copied().unwrap_or((MISSING, MISSING));
        out.extend_from_slice(&offset.to_le_bytes());
        out.extend_from_slice(&nbytes.to_le_bytes());
    }
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// The index of an uncompressed shard written in place whose first `present` inner chunks
/// (of `inner_chunks`, `inner_bytes` each) hold rows.
#[must_use]
pub(crate) fn index_in_place(present: u64, inner_chunks: u64, inner_bytes: u64) -> Vec<u8> {
    let entries: Vec<(u64, u64)> = (0..present.min(inner_chunks)).map(|i| (i * inner_bytes, inner_bytes)).collect();
    finish_index(&entries, inner_chunks)
}

/// A whole shard: `rows` (the bytes of its first rows, back to back) split into inner chunks
/// of `inner_bytes`, the last padded with zeros, each encoded with `codec`; then the index
/// for `inner_chunks` inner chunks.
///
/// # Errors
/// A compression failure, as the text of the error.
pub(crate) fn encode(rows: &[u8], inner_bytes: usize, inner_chunks: u64, codec: Codec) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(rows.len() + index_bytes(inner_chunks));
    let mut entries = Vec::new();
    for piece in rows.chunks(inner_bytes.max(1)) {
        let start = out.len() as u64;
        out.extend_from_slice(&encode_inner(piece, inner_bytes, codec)?);
        entries.push((start, out.len() as u64 - start));
    }
    out.extend_from_slice(&finish_index(&entries, inner_chunks));
    Ok(out)
}

/// The first `want` bytes of the rows a stored shard holds (its inner chunks decoded in
/// order; an inner chunk not written reads as zeros).
///
/// # Errors
/// A shard too short for its index, a checksum that does not match, an entry outside the
/// shard, a decompression failure: the text of the error.
pub(crate) fn read_rows(
    shard: &[u8],
    want: usize,
    inner_bytes: usize,
    inner_chunks: u64,
    codec: Codec,
) -> Result<Vec<u8>, String> {
    let ib = index_bytes(inner_chunks);
    if shard.len() < ib {
        return Err(format!("the shard has {} bytes, less than its index's {ib}", shard.len()));
    }
    let (data, index) = shard.split_at(shard.len() - ib);
    let (entries, crc) = index.split_at(ib - 4);
    if crc32c::crc32c(entries).to_le_bytes() != crc {
        return Err("the shard's index does not match its checksum".into());
    }
    let mut out = Vec::with_capacity(want);
    for e in entries.chunks(ENTRY) {
        if out.len() >= want {
            break;
        }
        let word = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap_or([0xff; 8]));
        let (offset, nbytes) = (word(&e[..8]), word(&e[8..]));
        if offset == MISSING {
            out.resize(out.len() + inner_bytes, 0);
            continue;
        }
        let range = usize::try_from(offset).ok().zip(usize::try_from(offset + nbytes).ok());
        let stored = range
            .and_then(|(a, b)| data.get(a..b))
            .ok_or_else(|| format!("an index entry ({offset}, {nbytes}) lies outside the shard"))?;
        match codec {
            Codec::Raw => out.extend_from_slice(stored),
            Codec::Zstd(_) => {
                let mut dec = zstd::stream::Decoder::with_buffer(stored).map_err(|e| e.to_string())?;
                let start = out.len();
                out.resize(start + inner_bytes, 0);
                dec.read_exact(&mut out[start..]).map_err(|e| e.to_string())?;
            }
            Codec::Blosc(_) => return Err(BLOSC_DATA.into()),
        }
    }
    if out.len() < want {
        return Err(format!("the shard holds {} bytes of rows, not {want}", out.len()));
    }
    out.truncate(want);
    Ok(out)
}

/// [`read_rows`]'s error for the shard at `what`.
#[must_use]
pub(crate) fn unreadable(what: &Path, why: &str) -> RecordError {
    RecordError::Io { errno: Some(libc::EIO), message: format!("cannot read back the shard {}: {why}", what.display()) }
}

/// A shard being streamed to its object: the rows of its current inner chunk, the index
/// entries of the inner chunks sent, and the first row this upload holds.
pub(crate) struct ShardUpload {
    pub(crate) object: Box<dyn Streamed>,
    pub(crate) tail: Vec<u8>,
    pub(crate) entries: Vec<(u64, u64)>,
    offset: u64,
    pub(crate) first_row: u64,
}

impl ShardUpload {
    /// An upload of `object` whose first rows (`tail`, read back) begin at `first_row`.
    pub(crate) fn new(object: Box<dyn Streamed>, tail: Vec<u8>, first_row: u64) -> Self {
        ShardUpload { object, tail, entries: Vec::new(), offset: 0, first_row }
    }

    /// Encodes an inner chunk's rows (zeros to its full size) and sends them.
    pub(crate) fn add(&mut self, rows: Vec<u8>, inner_bytes: usize, codec: Codec, path: &Path) -> Result<(), RecordError> {
        let bytes = match codec {
            // A full uncompressed inner chunk is sent as it is, not copied.
            Codec::Raw if rows.len() == inner_bytes => rows,
            _ => encode_inner(&rows, inner_bytes, codec).map_err(|why| RecordError::Io {
                errno: Some(libc::EIO),
                message: format!("cannot compress {}: {why}", path.display()),
            })?,
        };
        let n = bytes.len() as u64;
        self.entries.push((self.offset, n));
        self.offset += n;
        self.object.push(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shard_reads_back_what_was_encoded() {
        for codec in [Codec::Raw, Codec::Zstd(1)] {
            let rows: Vec<u8> = (0..50u8).collect(); // 2.5 inner chunks of 20 bytes
            let shard = encode(&rows, 20, 4, codec).unwrap();
            assert_eq!(read_rows(&shard, 50, 20, 4, codec).unwrap(), rows);
            assert_eq!(read_rows(&shard, 23, 20, 4, codec).unwrap(), &rows[..23]);
            // The index: three entries, one missing, then the checksum.
            let index = &shard[shard.len() - index_bytes(4)..];
            assert_eq!(&index[48..64], &[0xff; 16]);
            let mut torn = shard.clone();
            let n = torn.len();
            torn[n - 10] ^= 1;
            assert!(read_rows(&torn, 20, 20, 4, codec).unwrap_err().contains("checksum"));
            // An inner chunk not written reads as the fill value; past the shard, an error.
            assert_eq!(read_rows(&shard, 70, 20, 4, codec).unwrap()[50..], [0u8; 20]);
            assert!(read_rows(&shard, 90, 20, 4, codec).is_err(), "more rows than a shard holds");
        }
    }

    #[test]
    fn an_in_place_index_lists_the_inner_chunks_written() {
        let index = index_in_place(2, 3, 100);
        assert_eq!(index.len(), 3 * 16 + 4);
        assert_eq!(u64::from_le_bytes(index[16..24].try_into().unwrap()), 100);
        assert_eq!(&index[32..48], &[0xff; 16]);
        // The layout matches `encode` of the same rows, uncompressed.
        let rows = vec![7u8; 150];
        let shard = encode(&rows, 100, 3, Codec::Raw).unwrap();
        assert_eq!(&shard[shard.len() - index.len()..], &index[..]);
    }
}
