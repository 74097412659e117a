//! Host memory for messages: 16-byte-aligned buffers (2 MiB-aligned, with huge-page
//! advice, when large), and a small pool that recycles large buffers between the device
//! thread that fills them and the consumer thread that frees them. A buffer may instead
//! hold a [`PinnedBlock`], page-locked memory lent by a pool outside this layer (the GPU
//! platforms', `gpu/pinned.rs`, which implements [`GiveBack`]), and returned to that pool
//! when the buffer is dropped.
//!
//! Where the copy into a buffer runs, beside the consumer thread or on its CPU (a yield
//! after a push that leaves a few MiB queued, the streaming copies, which pooled buffer a
//! large tap takes), is decided here too: see the section "Where the copy into a buffer
//! runs" below.
//!
//! No Python here.

use std::alloc::{self, Layout};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::error::Error;
use crate::host::sync::lock;

/// Alignment of every buffer (and of every operand inside a message).
pub(crate) const ALIGN: usize = 16;

/// Buffers at least this large are recycled through [`POOL`]; smaller ones use malloc.
const POOL_MIN_BYTES: usize = 64 << 10;
/// Default of [`set_pool_limit`]: the most bytes the pool keeps idle.
pub const DEFAULT_POOL_BYTES: usize = 64 << 20;
static POOL_LIMIT: AtomicUsize = AtomicUsize::new(DEFAULT_POOL_BYTES);
/// Whether the user chose the limit (`HOSTFEED_BUFFER_POOL_BYTES`): then reservations do
/// not raise it.
static POOL_LIMIT_CHOSEN: AtomicBool = AtomicBool::new(false);
/// Bytes that live [`PoolReservation`]s ask the pool to keep, together.
static POOL_RESERVED: AtomicUsize = AtomicUsize::new(0);
/// Most bytes one reservation may ask for.
pub const MAX_RESERVATION: usize = 1 << 30;

/// Sets the most bytes the pool keeps idle (`HOSTFEED_BUFFER_POOL_BYTES`). A larger pool
/// spares large bursts of taps the page faults of fresh memory, at the price of keeping
/// that much memory when idle. A limit set here is kept even while reservations are live.
pub fn set_pool_limit(bytes: usize) {
    POOL_LIMIT.store(bytes, Ordering::Relaxed);
    POOL_LIMIT_CHOSEN.store(true, Ordering::Relaxed);
    trim_pool();
}

/// The most bytes the pool keeps idle now: the limit, raised to the live reservations
/// unless the user chose the limit.
#[must_use]
pub fn pool_limit() -> usize {
    let limit = POOL_LIMIT.load(Ordering::Relaxed);
    if POOL_LIMIT_CHOSEN.load(Ordering::Relaxed) {
        limit
    } else {
        limit.max(POOL_RESERVED.load(Ordering::Relaxed))
    }
}

/// Bytes of large buffers alive (at least [`POOL_MIN_BYTES`]: idle in the pool or holding
/// a message), which bounds how far a device thread grows the pool's rotation.
static LARGE_LIVE: AtomicUsize = AtomicUsize::new(0);
/// The most bytes of large buffers a device thread apart from the consumer keeps in
/// rotation (see [`take_buf`]): twice the last-level cache of a server processor's core
/// complex, so that a buffer comes round again after its lines left the consumer's caches.
pub(crate) const ROTATION_BYTES: usize = 64 << 20;

/// Bytes of idle buffers in the pool.
#[must_use]
pub fn pool_idle_bytes() -> usize {
    lock(&POOL).iter().map(|b| b.cap).sum()
}

/// Evicts the oldest idle buffers until the pool is within [`pool_limit`].
fn trim_pool() {
    let limit = pool_limit();
    let mut pool = lock(&POOL);
    let mut idle: usize = pool.iter().map(|b| b.cap).sum();
    while idle > limit && !pool.is_empty() {
        idle -= pool.remove(0).cap;
    }
}

/// A request that the pool keep up to `bytes` of idle buffers while it lives (when the
/// user did not choose the limit). A recorder holds one: it keeps rows until its writers
/// have written them, so the buffers of a burst of large rows all return to the pool
/// together, and the next burst should find them warm instead of faulting in fresh memory.
/// Dropping it trims the pool back.
#[derive(Debug)]
pub struct PoolReservation {
    bytes: usize,
}

impl PoolReservation {
    /// Reserves `bytes` (at most [`MAX_RESERVATION`]).
    #[must_use]
    pub fn new(bytes: usize) -> Self {
        let bytes = bytes.min(MAX_RESERVATION);
        POOL_RESERVED.fetch_add(bytes, Ordering::Relaxed);
        PoolReservation { bytes }
    }
}

impl Drop for PoolReservation {
    fn drop(&mut self) {
        POOL_RESERVED.fetch_sub(self.bytes, Ordering::Relaxed);
        trim_pool();
    }
}

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
        if cap >= POOL_MIN_BYTES {
            LARGE_LIVE.fetch_add(cap, Ordering::Relaxed);
        }
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
        if self.cap >= POOL_MIN_BYTES {
            LARGE_LIVE.fetch_sub(self.cap, Ordering::Relaxed);
        }
        if let Some(layout) = Self::layout(self.cap).filter(|_| self.cap > 0) {
            // SAFETY: allocated in `RawBuf::new` with exactly this layout, freed once.
            unsafe { alloc::dealloc(self.ptr.as_ptr(), layout) };
        }
    }
}

/// Recently freed large buffers, oldest first. A tap's buffer is allocated on the device
/// thread and freed on the consumer thread; reusing one keeps large taps on memory already
/// faulted in (fresh memory costs a page fault and the zeroing of every page at its first
/// write).
static POOL: Mutex<Vec<RawBuf>> = Mutex::new(Vec::new());

/// How a device's thread apart from the consumer picks a large buffer from the pool.
///
/// On the consumer's CPU (or where the CPUs are not known) a thread always takes the
/// newest idle buffer that fits: its lines are likely still in this CPU's cache. Apart from
/// the consumer, which buffer copies fastest depends on what the tap function did with it,
/// which the pool cannot see. If the function read the array (as one that logs statistics
/// or writes it does), the newest buffer's lines sit in the consumer's caches, and writing
/// them from another core first takes each line from there: measured on this project's AMD
/// EPYC machines, a 4 MiB copy into a buffer the other core had just read took 6x as long
/// as into one read sixteen buffers earlier, and a device thread slower than its consumer
/// then cycles the same two buffers and stays slow (the consumer always waits for it, so
/// nothing builds up to rotate). If the function left the bytes alone, the newest buffer's
/// lines are still in the device thread's own cache, the fastest place to write. So the
/// device's threads measure both ways, copy by copy, and take the faster.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Reuse {
    /// The newest idle buffer that fits (no fresh allocation while one fits).
    Newest = 0,
    /// The oldest idle buffer that fits, and a fresh one while the large buffers alive
    /// leave room in a rotation of [`ROTATION_BYTES`] (within the pool's limit).
    Rotate = 1,
}

/// Per [`Reuse`], the recent copy time in picoseconds per byte (a moving average; 0: not
/// measured yet, which counts as fastest, so that each way is tried).
static COPY_PS_PER_BYTE: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];
/// Large buffers taken apart from the consumer; every [`EXPLORE`]th takes the way that
/// measured slower, so that a change of the tap functions' habits shows.
static APART_TAKES: AtomicU64 = AtomicU64::new(0);
const EXPLORE: u64 = 64;

/// The way a device thread apart from the consumer takes its next large buffer.
fn choose() -> Reuse {
    let n = APART_TAKES.fetch_add(1, Ordering::Relaxed);
    let newest = COPY_PS_PER_BYTE[Reuse::Newest as usize].load(Ordering::Relaxed);
    let rotate = COPY_PS_PER_BYTE[Reuse::Rotate as usize].load(Ordering::Relaxed);
    faster(newest, rotate, n % EXPLORE == EXPLORE - 1)
}

/// The way to take given each way's measured cost (0: unmeasured), or the other way when
/// `explore`.
fn faster(newest: u64, rotate: u64, explore: bool) -> Reuse {
    let best = if newest == 0 || (rotate != 0 && newest <= rotate) { Reuse::Newest } else { Reuse::Rotate };
    match (best, explore) {
        (b, false) => b,
        (Reuse::Newest, true) => Reuse::Rotate,
        (Reuse::Rotate, true) => Reuse::Newest,
    }
}

/// A large buffer taken apart from the consumer, whose copy is to be timed
/// ([`CopyTrial::done`]).
#[derive(Debug)]
#[must_use]
pub(crate) struct CopyTrial {
    way: Reuse,
    started: std::time::Instant,
}

impl CopyTrial {
    /// Records that `bytes` were copied into the buffer since it was taken.
    pub(crate) fn done(self, bytes: usize) {
        if bytes == 0 {
            return;
        }
        let ns = u64::try_from(self.started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let cost = ns.saturating_mul(1000) / bytes as u64;
        let slot = &COPY_PS_PER_BYTE[self.way as usize];
        let old = slot.load(Ordering::Relaxed);
        // A moving average over about four copies (racing threads may each store theirs).
        slot.store(if old == 0 { cost.max(1) } else { (old * 3 + cost) / 4 }.max(1), Ordering::Relaxed);
    }
}

/// Which of the idle buffers `idle` (oldest first, `cap_of` their capacities) a new
/// message of `cap` bytes takes the `way` says (`grow`: the rotation has room for a fresh
/// buffer); `None`: a fresh allocation.
fn pick<T>(idle: &[T], cap_of: impl Fn(&T) -> usize, cap: usize, way: Reuse, grow: bool) -> Option<usize> {
    let fits = |b: &T| {
        let c = cap_of(b);
        c >= cap && c / 2 <= cap
    };
    match way {
        Reuse::Newest => idle.iter().rposition(fits),
        Reuse::Rotate if grow => None,
        Reuse::Rotate => idle.iter().position(fits),
    }
}

/// A buffer of at least `cap` bytes, from the pool if one fits; with `trial`, a device's
/// copy: apart from the consumer the way is chosen (see [`Reuse`]) and, unless the buffer
/// is fresh (its copy pays page faults, which say nothing of the way), returned to time.
fn take_buf(cap: usize, trial: bool) -> Option<(RawBuf, Option<CopyTrial>)> {
    if cap >= POOL_MIN_BYTES {
        let way = if trial && consumer_elsewhere() { Some(choose()) } else { None };
        let room = LARGE_LIVE.load(Ordering::Relaxed) + cap <= pool_limit().min(ROTATION_BYTES);
        let mut pool = lock(&POOL);
        if let Some(i) = pick(&pool, |b| b.cap, cap, way.unwrap_or(Reuse::Newest), room) {
            let buf = pool.remove(i);
            drop(pool);
            let started = std::time::Instant::now();
            return Some((buf, way.map(|way| CopyTrial { way, started })));
        }
    }
    RawBuf::new(cap).map(|b| (b, None))
}

fn give_back(buf: RawBuf) {
    let limit = pool_limit();
    if buf.cap < POOL_MIN_BYTES || buf.cap > limit {
        return;
    }
    let mut pool = lock(&POOL);
    let mut idle: usize = pool.iter().map(|b| b.cap).sum();
    // Keep the newest buffers: evict the oldest until this one fits.
    while idle + buf.cap > limit && !pool.is_empty() {
        idle -= pool.remove(0).cap;
    }
    pool.push(buf);
}

/// Where a [`PinnedBlock`] goes back to when dropped: the pool that lent it.
pub(crate) trait GiveBack: Send + Sync {
    /// Takes back a block handed out with capacity `cap` in generation `generation`.
    fn give_back(&self, ptr: NonNull<u8>, cap: usize, generation: u64);
}

/// A block of page-locked ("pinned") host memory lent by a pool, returned to it on drop.
pub(crate) struct PinnedBlock {
    ptr: NonNull<u8>,
    cap: usize,
    generation: u64,
    home: &'static dyn GiveBack,
}

// SAFETY: a block is the sole owner of its bytes (like a `Box<[u8]>`, the contract of
// `PinnedBlock::lent`); the pool it returns to is `Sync`.
unsafe impl Send for PinnedBlock {}
// SAFETY: `&PinnedBlock` allows no mutation.
unsafe impl Sync for PinnedBlock {}

impl PinnedBlock {
    /// The `cap` bytes at `ptr`, lent by `home` in its generation `generation`, to which
    /// they go back when the block is dropped.
    ///
    /// # Safety
    /// `ptr..ptr + cap` is memory readable and writable by the block alone until `home`
    /// takes it back (no other block holds any of it meanwhile).
    #[must_use]
    pub(crate) unsafe fn lent(
        ptr: NonNull<u8>,
        cap: usize,
        generation: u64,
        home: &'static dyn GiveBack,
    ) -> Self {
        PinnedBlock { ptr, cap, generation, home }
    }

    /// Start of the block.
    #[must_use]
    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Capacity in bytes (the size class).
    #[must_use]
    pub(crate) fn capacity(&self) -> usize {
        self.cap
    }
}

impl Drop for PinnedBlock {
    fn drop(&mut self) {
        self.home.give_back(self.ptr, self.cap, self.generation);
    }
}

impl std::fmt::Debug for PinnedBlock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinnedBlock").field("ptr", &self.ptr).field("cap", &self.cap).finish_non_exhaustive()
    }
}

/// Buffers of at most this many bytes live inside the [`HostBuffer`] itself.
pub(crate) const INLINE_BYTES: usize = 32;

/// The bytes of a small buffer, aligned like every buffer.
#[repr(C, align(16))]
#[derive(Clone, Copy)]
struct InlineBytes([u8; INLINE_BYTES]);

/// The memory behind a [`HostBuffer`].
enum Storage {
    Heap(RawBuf),
    Pinned(PinnedBlock),
    /// A small buffer (scalars, short vectors: most taps of a loss or a step) inside the
    /// `HostBuffer`: no allocation on the device's thread, no free on the consumer's. Its
    /// address changes when the `HostBuffer` moves, so it is written only by the
    /// synchronous copy that fills it before the buffer moves into its message (never by
    /// an asynchronous device copy: GPUs fill pinned blocks), and read where the buffer
    /// rests (in its message, in a record's `Payload`, in the Python owner of its views).
    Inline(InlineBytes),
    /// Bytes someone else owns (a host copy of a computation's output, held by Python),
    /// valid and unchanged while their keeper lives; dropping the storage drops the keeper.
    Lent(LentBytes),
}

/// See [`Storage::Lent`].
struct LentBytes {
    ptr: NonNull<u8>,
    cap: usize,
    _keeper: Box<dyn Send + Sync>,
}

// SAFETY: the bytes are only read, never written, and [`HostBuffer::lent`]'s caller
// guarantees they stay valid and unchanged from any thread while the keeper (itself Send
// and Sync) lives, which is as long as this value.
unsafe impl Send for LentBytes {}
// SAFETY: as for Send: shared access only reads bytes nobody changes.
unsafe impl Sync for LentBytes {}

/// A heap buffer aligned to 16 bytes (2 MiB when large), a block of pinned memory, or up
/// to 32 bytes held inline, whose bytes are written once (by the handler or
/// a device-to-host copy) and then only read. A pointer into a buffer is valid only while
/// the buffer does not move (inline bytes move with it).
pub struct HostBuffer {
    storage: Storage,
    len: usize,
}

impl HostBuffer {
    /// A buffer of at least `len` bytes, of which `len` count as used.
    ///
    /// # Errors
    /// [`Error::Internal`] when the memory cannot be allocated.
    pub fn with_capacity(len: usize) -> Result<Self, Error> {
        Ok(Self::for_copy(len, false)?.0)
    }

    /// [`HostBuffer::with_capacity`] for a device thread's copy of a message (`trial`): a
    /// large buffer then comes with the [`CopyTrial`] to time its copy by, where the thread
    /// runs apart from the consumer (see [`Reuse`]).
    pub(crate) fn for_copy(len: usize, trial: bool) -> Result<(Self, Option<CopyTrial>), Error> {
        if len > 0 && len <= INLINE_BYTES {
            return Ok((HostBuffer { storage: Storage::Inline(InlineBytes([0; INLINE_BYTES])), len }, None));
        }
        let (raw, trial) = take_buf(len, trial).ok_or_else(|| {
            Error::Internal(format!("cannot allocate {len} bytes of host memory for a tapped value"))
        })?;
        Ok((HostBuffer { storage: Storage::Heap(raw), len }, trial))
    }

    /// Whether the bytes are this buffer's own heap (or inline) memory: not a pinned block
    /// a pool lent, nor bytes someone else owns.
    #[must_use]
    pub(crate) fn is_plain_heap(&self) -> bool {
        matches!(self.storage, Storage::Heap(_) | Storage::Inline(_))
    }

    /// The `len` bytes at `ptr`, owned by `keeper`: no copy.
    ///
    /// # Safety
    /// `ptr` must point to `len` readable bytes (aligned to 16 bytes where the buffer will
    /// be read as a message's operands; a recorder reads rows as bytes) that stay valid and
    /// unchanged for as long as `keeper` lives, from any thread.
    #[must_use]
    pub unsafe fn lent(ptr: *const u8, len: usize, keeper: Box<dyn Send + Sync>) -> Self {
        let ptr = NonNull::new(ptr.cast_mut()).unwrap_or(NonNull::dangling());
        HostBuffer { storage: Storage::Lent(LentBytes { ptr, cap: len, _keeper: keeper }), len }
    }

    /// A buffer of `len` bytes in a block of pinned memory (at least `len` bytes).
    #[must_use]
    pub(crate) fn pinned(block: PinnedBlock, len: usize) -> Self {
        let len = len.min(block.capacity());
        HostBuffer { storage: Storage::Pinned(block), len }
    }

    #[cfg(test)]
    /// Whether the bytes are in pinned memory.
    #[must_use]
    pub(crate) fn is_pinned(&self) -> bool {
        matches!(self.storage, Storage::Pinned(_))
    }

    /// A buffer of no bytes (no allocation).
    #[must_use]
    pub(crate) fn empty() -> Self {
        HostBuffer { storage: Storage::Heap(RawBuf::empty()), len: 0 }
    }

    #[cfg(test)]
    /// Number of bytes in use.
    #[must_use]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Start of the buffer (dangling but aligned when empty).
    #[must_use]
    pub fn as_ptr(&self) -> *const u8 {
        match &self.storage {
            Storage::Heap(raw) => raw.ptr.as_ptr(),
            Storage::Pinned(block) => block.as_ptr(),
            Storage::Inline(bytes) => bytes.0.as_ptr(),
            Storage::Lent(lent) => lent.ptr.as_ptr(),
        }
    }

    /// Start of the buffer, for writing.
    pub(crate) fn as_mut_ptr(&mut self) -> *mut u8 {
        self.as_ptr().cast_mut()
    }

    /// Sets the number of bytes in use (at most the capacity).
    pub(crate) fn set_len(&mut self, len: usize) {
        self.len = len.min(self.capacity());
    }

    /// Bytes allocated for this buffer.
    #[must_use]
    pub fn capacity(&self) -> usize {
        match &self.storage {
            Storage::Heap(raw) => raw.cap,
            Storage::Pinned(block) => block.capacity(),
            Storage::Inline(_) => INLINE_BYTES,
            Storage::Lent(lent) => lent.cap,
        }
    }

    /// Bytes of this buffer allocated on the heap, apart from the `HostBuffer` itself.
    #[must_use]
    pub(crate) fn heap_capacity(&self) -> usize {
        match &self.storage {
            Storage::Inline(_) => 0,
            _ => self.capacity(),
        }
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        // A pinned block returns to its pool when dropped with the storage.
        if let Storage::Heap(raw) = &mut self.storage {
            give_back(std::mem::replace(raw, RawBuf::empty()));
        }
    }
}

// ---- Where the copy into a buffer runs: beside the consumer, or on its CPU -------------
//
// A device's thread and the consumer thread on one CPU: keep them in step (once
// `host/cpu_share.rs`).
//
// On a machine whose other cores are busy (a 2-core virtual machine with anything else
// running on it), the scheduler runs a device's thread and the consumer thread on the
// same core, in turn, a time slice each (milliseconds). A device thread that taps large
// arrays then copies a whole slice's worth of them before the consumer runs at all:
// tens of megabytes, more than the caches hold. Every copy then writes to memory rather
// than to the cache, the tap functions read their arrays back from memory, and what
// goes beyond the buffer pool are fresh pages the kernel zeroes first. On one core the
// two threads take turns either way; the only question is whether the bytes are still in
// the cache when the consumer's turn comes.
//
// When the two run on separate cores, a large tap can be copied with non-temporal stores
// ([`streams`]; the copy in `host/message.rs`), off by default ([`set_stream_bytes`]
// turns it on from [`STREAM_BYTES`]): it spares the copy fetching the lines of a buffer
// the consumer read last from the consumer's core's cache, but the bytes then go to
// memory, and a tap function that reads its array (as most do) reads it back from there.
// Measured side by side on this project's AMD EPYC machines, 4 MiB taps whose function
// sums the array ran at 0.82-0.87x the time of a numpy copy and sum through the cache and
// up to 1.85x with the streaming copies; only a function that touches no byte gained.
//
// So after a push that leaves at least [`STEP_BYTES`] queued for the consumer (bytes it
// has not yet moved into a batch), a device's thread that finds the consumer last ran on
// its own CPU yields that CPU ([`after_push`]): the consumer runs the tap functions while
// the bytes are warm, and the device's thread continues after it. Small taps do not reach
// the threshold before the consumer takes them in a batch, so nothing changes for them;
// threads on separate cores (an idle machine) never yield, and the consumer keeps running
// beside the device. A yield with nothing else to run on the CPU returns at once.
//
// The bench compares each choice with its absence side by side ([`set_step_bytes`],
// [`set_stream_bytes`]: 0 never yields, never streams).

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
    fn large_buffers_are_recycled() {
        let cap = POOL_MIN_BYTES * 3;
        let first = HostBuffer::with_capacity(cap).unwrap();
        drop(first);
        let again = HostBuffer::with_capacity(cap).unwrap();
        // Another test may race on the pool; the buffer we got must at least fit.
        assert!(again.capacity() >= cap);
        let huge = HostBuffer::with_capacity(HUGE_PAGE * 2).unwrap();
        assert_eq!(huge.as_ptr() as usize % HUGE_PAGE, 0);
    }

    #[test]
    fn small_buffers_are_inline_aligned_and_keep_their_bytes_when_moved() {
        let mut small = HostBuffer::with_capacity(INLINE_BYTES).unwrap();
        assert!(matches!(small.storage, Storage::Inline(_)));
        assert_eq!((small.capacity(), small.heap_capacity()), (INLINE_BYTES, 0));
        assert_eq!(small.as_ptr() as usize % ALIGN, 0);
        // SAFETY: the buffer has INLINE_BYTES writable bytes.
        unsafe {
            std::ptr::copy_nonoverlapping([7u8; INLINE_BYTES].as_ptr(), small.as_mut_ptr(), INLINE_BYTES);
        }
        let moved = Box::new(small);
        assert_eq!(moved.as_ptr() as usize % ALIGN, 0);
        // SAFETY: INLINE_BYTES bytes written above.
        assert_eq!(unsafe { std::slice::from_raw_parts(moved.as_ptr(), INLINE_BYTES) }, &[7u8; INLINE_BYTES]);
        let larger = HostBuffer::with_capacity(INLINE_BYTES + 1).unwrap();
        assert!(matches!(larger.storage, Storage::Heap(_)));
        assert!(larger.heap_capacity() > INLINE_BYTES);
        assert!(matches!(HostBuffer::with_capacity(0).unwrap().storage, Storage::Heap(_)), "empty: no bytes");
    }

    #[test]
    fn newest_takes_the_newest_buffer_and_rotate_the_oldest_once_the_rotation_is_full() {
        let mb = 1 << 20;
        // Oldest first: a 4 MiB buffer, one too large to fit 4 MiB (more than twice), two
        // more 4 MiB ones, a 1 MiB one.
        let idle = [4 * mb, 16 * mb, 4 * mb, 4 * mb, mb];
        let id = |c: &usize| *c;
        assert_eq!(pick(&idle, id, 4 * mb, Reuse::Newest, false), Some(3), "the newest that fits");
        assert_eq!(pick(&idle, id, 4 * mb, Reuse::Newest, true), Some(3), "newest never grows");
        assert_eq!(pick(&idle, id, 4 * mb, Reuse::Rotate, false), Some(0), "rotation full: the oldest");
        assert_eq!(pick(&idle, id, 4 * mb, Reuse::Rotate, true), None, "room left: a fresh one");
        assert_eq!(pick(&idle, id, 8 * mb, Reuse::Rotate, false), Some(1), "a larger buffer fits up to twice");
        assert_eq!(pick(&idle, id, 64 * mb, Reuse::Rotate, false), None, "none fits");
        assert_eq!(pick(&[] as &[usize], id, mb, Reuse::Newest, false), None);
    }

    #[test]
    fn the_faster_way_is_taken_each_tried_first_and_the_other_explored() {
        assert_eq!(faster(0, 0, false), Reuse::Newest, "nothing measured: newest first");
        assert_eq!(faster(500, 0, false), Reuse::Rotate, "rotate not measured yet: tried");
        assert_eq!(faster(500, 200, false), Reuse::Rotate);
        assert_eq!(faster(200, 500, false), Reuse::Newest);
        assert_eq!(faster(200, 500, true), Reuse::Rotate, "exploring: the slower");
        assert_eq!(faster(500, 200, true), Reuse::Newest);
    }

    #[test]
    fn impossible_allocation_is_an_error_not_an_abort() {
        assert!(matches!(HostBuffer::with_capacity(usize::MAX - 8), Err(Error::Internal(_))));
    }


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
