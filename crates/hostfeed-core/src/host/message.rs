//! A message: what one custom call sends to the host, its `FLAG_*` bits, and the
//! device-to-host copy of its operands that builds it.
//!
//! A message is one 16-byte-aligned buffer holding every operand back to back (each at a
//! 16-byte-aligned offset), plus a small table of (dtype, offset, dims), held inline for up
//! to two operands, and the buffer itself is inline up to 32 bytes: a small tap costs one
//! heap allocation, its buffer, and a scalar or a short vector none. The consumer hands
//! views of that buffer to numpy without copying again.
//!
//! On CPU the operand is already in host memory and [`copy_to_host`] is a `memcpy`; GPUs
//! use the same [`layout`] with asynchronous copies into pinned memory (`gpu/`).
//!
//! No Python here.

use std::any::Any;
use std::mem::size_of;
use std::sync::Arc;

use smallvec::SmallVec;

use crate::error::Error;
use crate::ffi::c_api::dtype;
use crate::host::buffer::{self, HostBuffer, ALIGN};
use crate::host::reply::ReplySlot;

/// `flags` bit: the call has an int32 status result (first after the token) and reports
/// failures there instead of failing the computation on this device alone; a later
/// `hostfeed_check`, reached by every device after the status is combined, raises.
pub const FLAG_STATUS_OUTPUT: i64 = 1 << 1;

/// `flags` bit: a part of a global-view tap or call sent shard by shard (the host joins
/// the parts of one execution).
pub const FLAG_SHARD: i64 = 1 << 2;

/// `flags` bit of a message made on the host by an eager tap (no device involved): it
/// carries the callback and its arrays instead of a consumer id.
pub const FLAG_EAGER: i64 = 1 << 3;

/// `flags` bit of a synchronous tap: lowered as a `hostfeed_call` without results, so that
/// the device waits until the tap function has run (the consumer replies with nothing).
pub const FLAG_SYNC_TAP: i64 = 1 << 5;

/// `flags` bit set by the GPU handlers (not the lowering): the message came from a GPU,
/// whose device ordinal `Message::device` holds.
pub const FLAG_GPU: i64 = 1 << 4;

/// Device keys at or below this one name devices of the portable transport (TPUs, and any
/// platform it serves): `PORTABLE_KEY_BASE - (slot << PORTABLE_ID_BITS | id)`, `id` the
/// device's JAX id and `slot` its platform's place among the portable ones seen.
pub const PORTABLE_KEY_BASE: i32 = -(1 << 24);

/// How many low bits of a portable key's offset from [`PORTABLE_KEY_BASE`] hold the id.
pub const PORTABLE_ID_BITS: u32 = 20;

/// The device a recorded row names for the device key `key` of its message: the JAX id of
/// a portable transport's device, else the key itself (a CPU's or GPU's ordinal).
#[must_use]
pub fn recorded_device(key: i32) -> i32 {
    if key <= PORTABLE_KEY_BASE {
        PORTABLE_KEY_BASE.wrapping_sub(key) & ((1 << PORTABLE_ID_BITS) - 1)
    } else {
        key
    }
}

/// What the allocator adds to every heap allocation (glibc malloc: a 16-byte header and
/// 16-byte granularity), charged against the queue bound with each allocation a message
/// holds.
const MALLOC_OVERHEAD: usize = 16;

/// One operand inside a message.
#[derive(Debug, Clone, Copy)]
pub struct ArrayMeta {
    /// `XLA_FFI_DataType` code.
    pub dtype: i32,
    /// Byte offset in the message buffer.
    pub offset: usize,
    /// Byte length.
    pub(crate) nbytes: usize,
    /// Index of the first dimension in [`Message::dims`].
    pub dims_start: usize,
    /// Number of dimensions.
    pub rank: usize,
}

/// A message's operand table: inline for up to two operands (a tap's value, or a record's
/// row and its step), so that a small tap's only heap allocation is its data buffer.
pub type ArrayTable = SmallVec<[ArrayMeta; 2]>;
/// A message's dimensions, every operand's one after the other: inline up to four.
pub type DimTable = SmallVec<[i64; 4]>;

/// What a custom call sends to the host.
pub struct Message {
    /// The consumer the lowering registered (the callback and its transforms).
    pub consumer_id: i64,
    /// `FLAG_*` bits ([`FLAG_STATUS_OUTPUT`], ...).
    pub flags: i64,
    /// XLA device ordinal of the device that sent it.
    pub device: i32,
    /// One entry per operand.
    pub arrays: ArrayTable,
    /// Every operand's dimensions, one after the other.
    pub dims: DimTable,
    /// The operands' bytes, 16-byte aligned each.
    pub data: HostBuffer,
    /// For a `call`: where the consumer sends the results.
    pub reply: Option<Arc<ReplySlot>>,
    /// XLA's id of the execution that sent it (the same on every device of one launch).
    pub run_id: i64,
    /// A message made on the host rather than by a device (an eager tap): what the
    /// binding put there (for Python, the callback and its arrays); `data` is then empty.
    pub host: Option<Box<dyn Any + Send>>,
    /// Bytes the host payload holds, charged against the bound with the rest.
    pub host_bytes: usize,
    /// When it entered the queue (`Timing::now`; 0: not timed).
    pub queued_at: u64,
    /// Its sequence number in the hub's queue (set as it is pushed): what the consumer
    /// names when it holds the message back (`Queue::hold_back`).
    pub seq: u64,
}

impl Message {
    #[cfg(test)]
    /// Dimensions of operand `a`.
    #[must_use]
    pub(crate) fn dims_of(&self, a: &ArrayMeta) -> &[i64] {
        &self.dims[a.dims_start..a.dims_start + a.rank]
    }

    /// Bytes charged against the queue bound for this message: everything it holds in
    /// memory while queued (its queue slot, its tables and its data buffer, each heap
    /// allocation with the allocator's overhead), so that the bound bounds memory even
    /// for tiny or empty operands.
    #[must_use]
    pub fn charged_bytes(&self) -> usize {
        fn heap(bytes: usize) -> usize {
            if bytes == 0 {
                0
            } else {
                bytes.next_multiple_of(16) + MALLOC_OVERHEAD
            }
        }
        size_of::<(usize, Message)>()
            + if self.arrays.spilled() { heap(self.arrays.capacity() * size_of::<ArrayMeta>()) } else { 0 }
            + if self.dims.spilled() { heap(self.dims.capacity() * size_of::<i64>()) } else { 0 }
            + heap(self.data.heap_capacity())
            + self.reply.as_ref().map_or(0, |_| heap(size_of::<ReplySlot>() + 16))
            + self.host_bytes
    }

    /// A message carrying a host payload of `bytes` bytes (see [`Message::host`]).
    #[must_use]
    pub fn from_host(flags: i64, device: i32, payload: Box<dyn Any + Send>, bytes: usize) -> Message {
        Message {
            consumer_id: -1,
            flags,
            device,
            arrays: ArrayTable::new(),
            dims: DimTable::new(),
            data: HostBuffer::empty(),
            reply: None,
            run_id: 0,
            host: Some(payload),
            host_bytes: bytes,
            queued_at: 0,
            seq: 0,
        }
    }
}

/// A view of one device operand as the handler sees it.
#[derive(Clone, Copy)]
pub struct Operand<'a> {
    /// `XLA_FFI_DataType` code.
    pub dtype: i32,
    /// The operand's bytes (host memory).
    pub data: *const u8,
    /// Its dimensions.
    pub dims: &'a [i64],
}

fn nbytes(op: &Operand<'_>) -> Result<usize, Error> {
    let elem = dtype::element_size(op.dtype).ok_or_else(|| {
        Error::InvalidArgument(format!(
            "operand dtype code {} cannot be transferred (sub-byte and token types are not \
             supported)",
            op.dtype
        ))
    })?;
    op.dims
        .iter()
        .try_fold(elem, |acc, &d| usize::try_from(d).ok().and_then(|d| acc.checked_mul(d)))
        .ok_or_else(|| Error::InvalidArgument(format!("operand has invalid dims {:?}", op.dims)))
}

/// Copies `n` bytes of an operand from device memory at `src` to host memory at `dst`.
///
/// # Safety
/// `src` must be readable and `dst` writable for `n` bytes, and they must not overlap.
#[inline]
pub(crate) unsafe fn copy_to_host(dst: *mut u8, src: *const u8, n: usize) {
    if n > 0 {
        // SAFETY: the caller guarantees both ranges are valid for `n` bytes and disjoint;
        // on CPU device memory is host memory.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, n) };
    }
}

/// Where each operand goes in a message's buffer.
pub(crate) struct Layout {
    pub(crate) arrays: ArrayTable,
    pub(crate) dims: DimTable,
    /// Bytes of buffer needed (each operand padded to [`ALIGN`]).
    pub(crate) capacity: usize,
}

impl Layout {
    /// Bytes in use: up to the end of the last operand (its padding not counted).
    #[must_use]
    pub(crate) fn len(&self) -> usize {
        self.arrays.last().map_or(0, |m| m.offset + m.nbytes)
    }

    /// The message for these tables and `data` (which holds the operands as laid out).
    #[must_use]
    pub(crate) fn into_message(self, consumer_id: i64, flags: i64, device: i32, data: HostBuffer) -> Message {
        Message {
            consumer_id,
            flags,
            device,
            arrays: self.arrays,
            dims: self.dims,
            data,
            reply: None,
            run_id: 0,
            host: None,
            host_bytes: 0,
            queued_at: 0,
            seq: 0,
        }
    }
}

/// Lays the operands out back to back, each at a 16-byte-aligned offset.
///
/// # Errors
/// [`Error::InvalidArgument`] for an unsupported dtype or invalid dims.
pub(crate) fn layout<'a>(operands: impl Iterator<Item = Operand<'a>>) -> Result<Layout, Error> {
    let (lower, _) = operands.size_hint();
    let mut arrays = ArrayTable::with_capacity(lower);
    let mut dims = DimTable::new();
    let mut total = 0usize;
    for op in operands {
        let n = nbytes(&op)?;
        arrays.push(ArrayMeta {
            dtype: op.dtype,
            offset: total,
            nbytes: n,
            dims_start: dims.len(),
            rank: op.dims.len(),
        });
        dims.extend_from_slice(op.dims);
        total = total
            .checked_add(n.next_multiple_of(ALIGN))
            .ok_or_else(|| Error::InvalidArgument("operands too large".into()))?;
    }
    Ok(Layout { arrays, dims, capacity: total })
}

/// Copies `n` bytes like [`copy_to_host`], but writes whole cache lines with non-temporal
/// stores, which go to memory without first reading each line into this core's cache (and
/// so without fetching it from another core that holds it). For a large operand that
/// another core will read: the buffers the pool hands back were last read there, and
/// ordinary stores would pull every line of them back across first. Ends with a store
/// fence, so the bytes are visible to any thread that sees the message afterwards.
///
/// # Safety
/// As [`copy_to_host`].
#[allow(clippy::cast_ptr_alignment)] // its loads are unaligned, its stores aligned
pub(crate) unsafe fn stream_to_host(dst: *mut u8, src: *const u8, n: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
        const LINE: usize = 64;
        // Up to the first cache-line boundary of `dst`, and the tail, through the caches.
        let head = dst.align_offset(LINE).min(n);
        let body = (n - head) / LINE * LINE;
        // SAFETY: `head <= n`: both ranges are valid for it (the caller's guarantee).
        unsafe { copy_to_host(dst, src, head) };
        let mut at = head;
        while at < head + body {
            // SAFETY: `at + LINE <= head + body <= n`, so the four 16-byte loads and stores
            // lie within the ranges the caller guarantees; `dst + at` is 64-byte aligned (it
            // starts at the boundary `head` reached and moves a line at a time), as
            // `_mm_stream_si128` requires 16 (the unaligned loads require none); SSE2 is part
            // of every x86-64 processor.
            unsafe {
                let from = src.add(at).cast::<__m128i>();
                let to = dst.add(at).cast::<__m128i>();
                let line = [
                    _mm_loadu_si128(from),
                    _mm_loadu_si128(from.add(1)),
                    _mm_loadu_si128(from.add(2)),
                    _mm_loadu_si128(from.add(3)),
                ];
                for (k, part) in line.into_iter().enumerate() {
                    _mm_stream_si128(to.add(k), part);
                }
            }
            at += LINE;
        }
        // SAFETY: a fence touches no memory; SSE is part of every x86-64 processor.
        unsafe { _mm_sfence() };
        // SAFETY: the tail `head + body..n` lies within both ranges.
        unsafe { copy_to_host(dst.add(head + body), src.add(head + body), n - head - body) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        // SAFETY: the caller's guarantee, passed on.
        unsafe { copy_to_host(dst, src, n) };
    }
}

/// How [`gather_as`] copies an operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CopyKind {
    /// Through the caches (`memcpy`).
    Cached,
    /// With non-temporal stores where `buffer::streams` says so (a large operand, the
    /// consumer on another CPU), through the caches otherwise.
    ForConsumer,
}

/// Builds a message from the operands, copying each one to host memory. The iterator is
/// walked twice (sizes, then copies), so it must yield the same operands both times.
///
/// # Errors
/// [`Error::InvalidArgument`] for an unsupported dtype or invalid dims.
///
/// # Safety
/// Each operand's `data` must be readable for the number of bytes implied by its dtype
/// and dims.
pub unsafe fn gather<'a>(
    consumer_id: i64,
    flags: i64,
    device: i32,
    operands: impl Iterator<Item = Operand<'a>> + Clone,
) -> Result<Message, Error> {
    // SAFETY: the caller's guarantee, passed on.
    unsafe { gather_as(CopyKind::Cached, consumer_id, flags, device, operands) }
}

/// [`gather`], copying as `kind` says.
///
/// # Errors
/// As [`gather`].
///
/// # Safety
/// As [`gather`].
pub(crate) unsafe fn gather_as<'a>(
    kind: CopyKind,
    consumer_id: i64,
    flags: i64,
    device: i32,
    operands: impl Iterator<Item = Operand<'a>> + Clone,
) -> Result<Message, Error> {
    let lay = layout(operands.clone())?;
    let (mut data, trial) = HostBuffer::for_copy(lay.capacity, kind == CopyKind::ForConsumer)?;
    let base = data.as_mut_ptr();
    for (op, meta) in operands.zip(&lay.arrays) {
        let streamed = kind == CopyKind::ForConsumer && buffer::streams(meta.nbytes);
        // SAFETY: `meta.offset + meta.nbytes <= capacity`, the buffer's capacity, so the
        // destination is in bounds; the caller guarantees the source is readable for that
        // many bytes; a freshly allocated buffer cannot overlap device data.
        unsafe {
            if streamed {
                stream_to_host(base.add(meta.offset), op.data, meta.nbytes);
            } else {
                copy_to_host(base.add(meta.offset), op.data, meta.nbytes);
            }
        }
    }
    if let Some(trial) = trial {
        trial.done(lay.len());
    }
    // The padding after the last operand is not counted.
    data.set_len(lay.len());
    Ok(lay.into_message(consumer_id, flags, device, data))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_record_a_portable_devices_id_and_an_ordinal_unchanged() {
        assert_eq!(recorded_device(0), 0);
        assert_eq!(recorded_device(3), 3);
        assert_eq!(recorded_device(-2), -2);
        assert_eq!(recorded_device(PORTABLE_KEY_BASE), 0);
        assert_eq!(recorded_device(PORTABLE_KEY_BASE - 7), 7);
        assert_eq!(recorded_device(PORTABLE_KEY_BASE - ((1 << PORTABLE_ID_BITS) | 5)), 5);
    }

    #[test]
    fn gather_copies_and_aligns() {
        let a: [f32; 3] = [1.0, 2.0, 3.0];
        let b: [u8; 1] = [7];
        let c: [f64; 2] = [0.5, -0.5];
        let ops = [
            Operand { dtype: dtype::F32, data: a.as_ptr().cast(), dims: &[3] },
            Operand { dtype: dtype::U8, data: b.as_ptr(), dims: &[] },
            Operand { dtype: dtype::F64, data: c.as_ptr().cast(), dims: &[1, 2] },
        ];
        // SAFETY: each operand points at a live local array of the described size.
        let m = unsafe { gather(5, 1, 2, ops.iter().copied()) }.unwrap();
        assert_eq!(m.arrays.iter().map(|x| x.offset).collect::<Vec<_>>(), vec![0, 16, 32]);
        assert_eq!(m.data.len(), 48);
        assert_eq!(m.data.as_ptr() as usize % 16, 0);
        assert_eq!(m.dims_of(&m.arrays[2]), &[1, 2]);
        // SAFETY: offsets and lengths are within the written part of the buffer.
        unsafe {
            assert_eq!(*m.data.as_ptr().add(16), 7);
            let c1 = m.data.as_ptr().add(32 + 8).cast::<f64>().read_unaligned();
            let a2 = m.data.as_ptr().add(8).cast::<f32>().read_unaligned();
            assert_eq!((c1.to_bits(), a2.to_bits()), ((-0.5f64).to_bits(), 3.0f32.to_bits()));
        }
    }

    #[test]
    fn a_streamed_copy_gives_the_same_bytes_at_any_alignment_and_length() {
        let src: Vec<u8> = (0..9000u32).map(|i| i.wrapping_mul(2_654_435_761).to_le_bytes()[2]).collect();
        let mut dst = vec![0u8; 9200];
        for (skew, len) in [(0, 0), (0, 1), (3, 63), (0, 64), (5, 65), (17, 4096), (1, 8999), (64, 9000)] {
            let s = skew.min(src.len() - len);
            dst.fill(0xAA);
            // SAFETY: `s + len <= src.len()` and `skew + len <= dst.len()`; two vectors.
            unsafe { stream_to_host(dst.as_mut_ptr().add(skew), src.as_ptr().add(s), len) };
            assert_eq!(&dst[skew..skew + len], &src[s..s + len], "skew {skew}, {len} bytes");
            assert!(dst[..skew].iter().chain(&dst[skew + len..]).all(|&b| b == 0xAA), "wrote outside");
        }
    }

    #[test]
    fn zero_size_and_no_operands() {
        let ops = [Operand { dtype: dtype::F32, data: std::ptr::null(), dims: &[0, 4] }];
        // SAFETY: a zero-size operand is never read.
        let m = unsafe { gather(1, 0, 0, ops.iter().copied()) }.unwrap();
        assert_eq!(m.data.len(), 0);
        // SAFETY: no operands.
        let m = unsafe { gather(1, 0, 0, std::iter::empty()) }.unwrap();
        assert!(m.arrays.is_empty());
    }

    #[test]
    fn charge_covers_what_a_tiny_message_holds() {
        let x = [0f32; 4];
        let ops = [Operand { dtype: dtype::F32, data: x.as_ptr().cast(), dims: &[4] }];
        // SAFETY: the operand points at a live local array of 16 bytes.
        let m = unsafe { gather(1, 0, 0, ops.iter().copied()) }.unwrap();
        // Its tables and its 16 bytes are inline: no heap allocation at all.
        assert!(!m.arrays.spilled() && !m.dims.spilled());
        assert_eq!(m.data.heap_capacity(), 0);
        assert_eq!(m.charged_bytes(), size_of::<(usize, Message)>());
        // SAFETY: the message holds the operand's 16 bytes, copied from `x`.
        assert_eq!(unsafe { std::slice::from_raw_parts(m.data.as_ptr(), 16) }, &[0u8; 16]);
        // Three operands of rank 2: both tables on the heap, and charged.
        let ops = [Operand { dtype: dtype::F32, data: x.as_ptr().cast(), dims: &[2, 2] }; 3];
        // SAFETY: each operand points at the same live local array of 16 bytes.
        let big = unsafe { gather(1, 0, 0, ops.iter().copied()) }.unwrap();
        assert!(big.arrays.spilled() && big.dims.spilled());
        let tables = (big.arrays.capacity() * size_of::<ArrayMeta>()).next_multiple_of(16)
            + (big.dims.capacity() * 8).next_multiple_of(16)
            + 2 * MALLOC_OVERHEAD;
        assert_eq!(big.charged_bytes(), size_of::<(usize, Message)>() + 48 + MALLOC_OVERHEAD + tables);
        // SAFETY: a zero-size operand is never read.
        let empty = unsafe {
            gather(1, 0, 0, [Operand { dtype: dtype::F32, data: std::ptr::null(), dims: &[0] }].into_iter())
        }
        .unwrap();
        assert!(empty.charged_bytes() >= size_of::<Message>(), "an empty tap is not free");
    }

    #[test]
    fn rejects_sub_byte_dtype() {
        let x = [0u8; 4];
        let ops = [Operand { dtype: dtype::S4, data: x.as_ptr(), dims: &[4] }];
        // SAFETY: rejected before any read.
        assert!(matches!(unsafe { gather(1, 0, 0, ops.iter().copied()) }, Err(Error::InvalidArgument(_))));
    }
}
