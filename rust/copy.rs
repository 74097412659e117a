//! Device-to-host copy of a custom call's operands into one host message.
//!
//! A message is one 16-byte-aligned buffer holding every operand back to back (each at a
//! 16-byte-aligned offset), plus a small table of (dtype, offset, dims). The consumer hands
//! views of that buffer to numpy without copying again.
//!
//! The only platform-specific piece is [`copy_to_host`]: on CPU the operand is already in
//! host memory and the copy is a `memcpy`. A GPU backend replaces that one function (with an
//! async copy on the handler's stream followed by a synchronise).

use std::alloc::{self, Layout};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, PoisonError};

use crate::error::Error;
use crate::reply::ReplySlot;
use crate::xla_ffi::dtype;

const ALIGN: usize = 16;

/// Buffers at least this large are recycled through [`POOL`]; smaller ones use malloc.
const POOL_MIN_BYTES: usize = 64 << 10;
/// Most bytes the pool keeps idle.
const POOL_MAX_BYTES: usize = 64 << 20;
/// Buffers at least this large are aligned to it and advised to use transparent huge
/// pages (as numpy does for its large arrays): fewer page faults and TLB misses.
const HUGE_PAGE: usize = 2 << 20;

/// One heap allocation, owned exclusively.
struct RawBuf {
    ptr: NonNull<u8>,
    cap: usize,
}

// SAFETY: a `RawBuf` is the sole owner of its allocation (like a `Box<[u8]>`), so moving it
// to another thread or sharing `&RawBuf` (which allows no mutation) is sound.
unsafe impl Send for RawBuf {}
// SAFETY: see above.
unsafe impl Sync for RawBuf {}

impl RawBuf {
    const fn empty() -> Self {
        RawBuf { ptr: NonNull::<u128>::dangling().cast(), cap: 0 }
    }

    fn layout(cap: usize) -> Option<Layout> {
        let align = if cap >= HUGE_PAGE { HUGE_PAGE } else { ALIGN };
        Layout::from_size_align(cap, align).ok()
    }

    /// A new allocation of `cap` bytes, or `None` when the memory cannot be had.
    fn new(cap: usize) -> Option<Self> {
        if cap == 0 {
            return Some(Self::empty());
        }
        let layout = Self::layout(cap)?;
        // SAFETY: `layout` has a non-zero size.
        let ptr = NonNull::new(unsafe { alloc::alloc(layout) })?;
        if cap >= HUGE_PAGE {
            // SAFETY: `ptr..ptr+cap` is a live allocation we own; MADV_HUGEPAGE is only advice
            // and cannot invalidate memory. Failure (e.g. THP disabled) is harmless.
            unsafe { libc::madvise(ptr.as_ptr().cast(), cap, libc::MADV_HUGEPAGE) };
        }
        Some(RawBuf { ptr, cap })
    }
}

impl Drop for RawBuf {
    fn drop(&mut self) {
        if let Some(layout) = Self::layout(self.cap).filter(|_| self.cap > 0) {
            // SAFETY: allocated in `RawBuf::new` with exactly this layout, freed once.
            unsafe { alloc::dealloc(self.ptr.as_ptr(), layout) };
        }
    }
}

/// Recently freed large buffers, most recent last. A tap's buffer is allocated on the
/// device thread and freed on the consumer thread; reusing the most recent one keeps large
/// taps on warm, already-faulted memory.
static POOL: Mutex<Vec<RawBuf>> = Mutex::new(Vec::new());

fn take_buf(cap: usize) -> Option<RawBuf> {
    if cap >= POOL_MIN_BYTES {
        // Only this module touches the pool and it never panics while holding the lock.
        let mut pool = POOL.lock().unwrap_or_else(PoisonError::into_inner);
        let fits = |b: &RawBuf| b.cap >= cap && b.cap / 2 <= cap;
        if let Some(i) = pool.iter().rposition(fits) {
            return Some(pool.swap_remove(i));
        }
    }
    RawBuf::new(cap)
}

fn give_back(buf: RawBuf) {
    if buf.cap < POOL_MIN_BYTES || buf.cap > POOL_MAX_BYTES {
        return;
    }
    let mut pool = POOL.lock().unwrap_or_else(PoisonError::into_inner);
    let mut idle: usize = pool.iter().map(|b| b.cap).sum();
    // Keep the newest buffers: evict the oldest until this one fits.
    while idle + buf.cap > POOL_MAX_BYTES && !pool.is_empty() {
        idle -= pool.remove(0).cap;
    }
    pool.push(buf);
}

/// A heap buffer aligned to 16 bytes (2 MiB when large) whose bytes are written once by
/// the handler and then only read.
pub struct HostBuffer {
    raw: RawBuf,
    len: usize,
}

impl HostBuffer {
    /// A buffer of at least `len` bytes.
    ///
    /// # Errors
    /// [`Error::Internal`] when the memory cannot be allocated.
    fn with_capacity(len: usize) -> Result<Self, Error> {
        let raw = take_buf(len).ok_or_else(|| {
            Error::Internal(format!(
                "cannot allocate {len} bytes of host memory for a tapped value"
            ))
        })?;
        Ok(HostBuffer { raw, len })
    }

    /// Number of bytes in use.
    #[must_use]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer holds no bytes.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Start of the buffer (dangling but aligned when empty).
    #[must_use]
    pub fn as_ptr(&self) -> *const u8 {
        self.raw.ptr.as_ptr()
    }

    fn as_mut_ptr(&mut self) -> *mut u8 {
        self.raw.ptr.as_ptr()
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        give_back(std::mem::replace(&mut self.raw, RawBuf::empty()));
    }
}

/// One operand inside a message.
#[derive(Debug, Clone, Copy)]
pub struct ArrayMeta {
    /// `XLA_FFI_DataType` code.
    pub dtype: i32,
    /// Byte offset in the message buffer.
    pub offset: usize,
    /// Byte length.
    pub nbytes: usize,
    /// Index of the first dimension in [`Message::dims`].
    pub dims_start: usize,
    pub rank: usize,
}

/// What a tap sends to the host.
pub struct Message {
    pub consumer_id: i64,
    pub flags: i64,
    pub device: i32,
    pub arrays: Vec<ArrayMeta>,
    pub dims: Vec<i64>,
    pub data: HostBuffer,
    /// For a `call`: where the consumer sends the results.
    pub reply: Option<Arc<ReplySlot>>,
    /// XLA's id of the execution that sent this (only read for shard-wise taps, else 0).
    pub run_id: i64,
}

impl Message {
    /// Dimensions of operand `a`.
    #[must_use]
    pub fn dims_of(&self, a: &ArrayMeta) -> &[i64] {
        &self.dims[a.dims_start..a.dims_start + a.rank]
    }

    /// Bytes charged against the queue bound for this message.
    #[must_use]
    pub fn charged_bytes(&self) -> usize {
        self.data.len()
    }
}

/// A view of one device operand as the handler sees it.
#[derive(Clone, Copy)]
pub struct Operand<'a> {
    pub dtype: i32,
    pub data: *const u8,
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
    op.dims.iter().try_fold(elem, |acc, &d| {
        usize::try_from(d).ok().and_then(|d| acc.checked_mul(d))
    })
    .ok_or_else(|| Error::InvalidArgument(format!("operand has invalid dims {:?}", op.dims)))
}

/// Copies `n` bytes of an operand from device memory at `src` to host memory at `dst`.
///
/// # Safety
/// `src` must be readable and `dst` writable for `n` bytes, and they must not overlap.
#[inline]
pub unsafe fn copy_to_host(dst: *mut u8, src: *const u8, n: usize) {
    if n > 0 {
        // SAFETY: the caller guarantees both ranges are valid for `n` bytes and disjoint;
        // on CPU device memory is host memory.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, n) };
    }
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
    let (lower, _) = operands.size_hint();
    let mut arrays = Vec::with_capacity(lower);
    let mut dims = Vec::new();
    let mut total = 0usize;
    for op in operands.clone() {
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
    let mut data = HostBuffer::with_capacity(total)?;
    let base = data.as_mut_ptr();
    for (op, meta) in operands.zip(&arrays) {
        // SAFETY: `meta.offset + meta.nbytes <= total`, the buffer's capacity, so the
        // destination is in bounds; the caller guarantees the source is readable for that
        // many bytes; a freshly allocated buffer cannot overlap device data.
        unsafe { copy_to_host(base.add(meta.offset), op.data, meta.nbytes) };
    }
    // The padding after the last operand is not counted.
    data.len = arrays.last().map_or(0, |m| m.offset + m.nbytes);
    Ok(Message { consumer_id, flags, device, arrays, dims, data, reply: None, run_id: 0 })
}

#[cfg(test)]
mod tests {
    use super::*;

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
            assert_eq!(*(m.data.as_ptr().add(32).cast::<f64>().add(1)), -0.5);
            assert_eq!(*(m.data.as_ptr().cast::<f32>().add(2)), 3.0);
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
    fn large_buffers_are_recycled() {
        let cap = POOL_MIN_BYTES * 3;
        let first = HostBuffer::with_capacity(cap).unwrap();
        drop(first);
        let again = HostBuffer::with_capacity(cap).unwrap();
        // Another test may race on the pool; the buffer we got must at least fit.
        assert!(again.raw.cap >= cap);
        let huge = HostBuffer::with_capacity(HUGE_PAGE * 2).unwrap();
        assert_eq!(huge.as_ptr() as usize % HUGE_PAGE, 0);
    }

    #[test]
    fn impossible_allocation_is_an_error_not_an_abort() {
        assert!(matches!(HostBuffer::with_capacity(usize::MAX - 8), Err(Error::Internal(_))));
    }

    #[test]
    fn rejects_sub_byte_dtype() {
        let x = [0u8; 4];
        let ops = [Operand { dtype: dtype::S4, data: x.as_ptr(), dims: &[4] }];
        // SAFETY: rejected before any read.
        assert!(matches!(unsafe { gather(1, 0, 0, ops.iter().copied()) }, Err(Error::InvalidArgument(_))));
    }
}
