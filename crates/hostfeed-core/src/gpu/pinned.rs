//! A pool of page-locked ("pinned") host memory for messages from GPUs.
//!
//! A device-to-host copy is asynchronous (the device goes on computing) only into pinned
//! memory, and allocating or freeing pinned memory is slow (and freeing can wait for the
//! device), so a tap must not do either in steady state. The pool hands out *blocks*:
//!
//! - small requests (up to [`SMALL_MAX`] bytes) get a block of a power-of-two size class
//!   (at least [`SMALL_MIN`]) carved from a [`SLAB`]-byte allocation, so a tiny tap holds a
//!   few hundred bytes of pinned memory, not a page;
//! - larger requests get a block of their own, rounded up to a quarter-power-of-two class
//!   (at most 25% slack), or an idle block up to twice the size they need.
//!
//! A block returns to the pool when its [`PinnedBlock`] (a type of the host layer, which
//! holds it in a message's buffer) is dropped, typically on the
//! consumer thread when Python has let go of the numpy views of a message: returning is
//! bookkeeping under a mutex, never a CUDA call, so it cannot wait for the device. Memory
//! is only freed when a new large block is needed and the idle large blocks would
//! otherwise exceed the idle limit (oldest first), and then not on the thread that needs
//! the block (XLA's: freeing pinned memory synchronises the device) but on the pool's
//! *reaper* thread; slabs are never freed. So pinned memory stays within what was in use
//! at the peak (bounded by the queue's byte bound, which charges a message its block's
//! full capacity) plus the idle limit, plus blocks on their way to the reaper.
//!
//! [`PinnedPool::reset`] forgets every block, freeing none, for when the memory died with
//! the context it was allocated in: blocks handed out before are dropped from the books
//! when they come back.
//!
//! The allocator is a trait ([`PinnedAlloc`]) so that the bookkeeping is tested with a fake
//! one; `cuda/` provides the real one (`cuMemHostAlloc` / `cuMemFreeHost`).
//!
//! No Python and no CUDA here.

use std::collections::{BTreeMap, VecDeque};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::error::Error;
use crate::host::buffer::{GiveBack, PinnedBlock};
use crate::host::sync::{lock, Waker};

/// Smallest block handed out (also the alignment of every small block).
pub(crate) const SMALL_MIN: usize = 256;
/// Largest request served from slabs.
pub(crate) const SMALL_MAX: usize = 64 << 10;
/// Bytes of one slab (one allocation split into blocks of one small class).
pub(crate) const SLAB: usize = 1 << 20;
/// Default most bytes of idle large blocks kept.
pub(crate) const DEFAULT_IDLE_LIMIT: usize = 256 << 20;

/// Allocates and frees page-locked host memory.
pub(crate) trait PinnedAlloc: Send + Sync {
    /// `bytes` of page-locked host memory, aligned to at least [`SMALL_MIN`].
    ///
    /// # Errors
    /// When the memory cannot be had (a message for the user).
    fn alloc(&self, bytes: usize) -> Result<NonNull<u8>, Error>;

    /// Frees a block returned by [`PinnedAlloc::alloc`] with the same `bytes`.
    ///
    /// # Safety
    /// `ptr` came from `alloc(bytes)` of this allocator, is freed once, and nothing reads
    /// or writes it any more (no copy into it is pending).
    unsafe fn free(&self, ptr: NonNull<u8>, bytes: usize);
}

/// The size class of a request of `bytes`: the capacity of the block it gets.
#[must_use]
pub(crate) fn size_class(bytes: usize) -> usize {
    if bytes <= SMALL_MAX {
        return bytes.max(SMALL_MIN).next_power_of_two();
    }
    // Quarter steps between powers of two: 2^k * {1, 1.25, 1.5, 1.75}.
    let top = usize::BITS - 1 - bytes.leading_zeros(); // 2^top <= bytes < 2^(top+1)
    let step = 1usize << (top - 2);
    bytes.div_ceil(step) * step
}

#[derive(Default)]
struct State {
    /// Idle blocks by class; small classes and large ones alike.
    idle: BTreeMap<usize, Vec<NonNull<u8>>>,
    /// Idle large blocks, oldest first (for eviction): (class, address).
    idle_large_order: VecDeque<(usize, usize)>,
    idle_large_bytes: usize,
}

/// Counters of a pool (`GpuPlatform.pool_stats()` in Python).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Allocations made from the allocator (slabs and large blocks).
    pub allocations: u64,
    /// Frees made to the allocator (evicted idle large blocks).
    pub frees: u64,
    /// Bytes currently allocated from the allocator.
    pub allocated_bytes: u64,
    /// Bytes of blocks currently handed out.
    pub in_use_bytes: u64,
    /// Blocks handed out so far.
    pub blocks_taken: u64,
    /// Times the pool forgot its memory (`PinnedPool::reset`).
    pub resets: u64,
}

/// Evicted blocks waiting for the reaper thread: (address, bytes, generation).
#[derive(Default)]
struct Reap {
    pending: Vec<(usize, usize, u64)>,
    /// Whether the reaper thread runs (started at the first eviction).
    started: bool,
    /// Blocks freed so far (or dropped: from a generation before a reset).
    reaped: u64,
}

/// See the module documentation.
pub(crate) struct PinnedPool<A> {
    alloc: A,
    state: Mutex<State>,
    idle_limit: AtomicUsize,
    allocations: AtomicU64,
    frees: AtomicU64,
    allocated_bytes: AtomicU64,
    in_use_bytes: AtomicU64,
    blocks_taken: AtomicU64,
    /// Bumped by [`PinnedPool::reset`]; blocks carry the one they were handed out in.
    generation: AtomicU64,
    reap: Mutex<Reap>,
    /// The reaper sleeps here for blocks; `PinnedPool::wait_reaped` for their frees.
    reap_work: Waker,
    reap_done: Waker,
}

// SAFETY: the raw pointers in `State` are addresses of idle blocks owned by the pool and
// only touched under the mutex; the allocator is `Send + Sync`.
unsafe impl<A: PinnedAlloc> Send for PinnedPool<A> {}
// SAFETY: see above.
unsafe impl<A: PinnedAlloc> Sync for PinnedPool<A> {}

impl<A: PinnedAlloc> PinnedPool<A> {
    /// An empty pool over `alloc`.
    pub(crate) fn new(alloc: A) -> Self {
        PinnedPool {
            alloc,
            state: Mutex::new(State::default()),
            idle_limit: AtomicUsize::new(DEFAULT_IDLE_LIMIT),
            allocations: AtomicU64::new(0),
            frees: AtomicU64::new(0),
            allocated_bytes: AtomicU64::new(0),
            in_use_bytes: AtomicU64::new(0),
            blocks_taken: AtomicU64::new(0),
            generation: AtomicU64::new(0),
            reap: Mutex::new(Reap { pending: Vec::new(), started: false, reaped: 0 }),
            reap_work: Waker::new(),
            reap_done: Waker::new(),
        }
    }

    /// Forgets every block without freeing any, for when the memory is gone (it died
    /// with the CUDA context it was allocated in): idle blocks are dropped from the books,
    /// blocks handed out are when they come back, evicted blocks not yet freed are not
    /// freed. The next requests allocate afresh.
    pub(crate) fn reset(&self) {
        let mut st = lock(&self.state);
        self.generation.fetch_add(1, Ordering::AcqRel);
        *st = State::default();
        self.allocated_bytes.store(0, Ordering::Relaxed);
    }

    /// Waits until the reaper freed (or dropped) `n` blocks in all; for tests and exit.
    #[cfg(test)]
    pub(crate) fn wait_reaped(&self, n: u64) {
        let mut r = lock(&self.reap);
        while r.reaped < n {
            r = self.reap_done.wait(r);
        }
    }

    #[cfg(test)]
    /// Sets the most bytes of idle large blocks kept (applied at the next allocation).
    pub(crate) fn set_idle_limit(&self, bytes: usize) {
        self.idle_limit.store(bytes, Ordering::Relaxed);
    }

    /// The allocator.
    pub(crate) fn allocator(&self) -> &A {
        &self.alloc
    }

    /// Counters.
    pub(crate) fn stats(&self) -> PoolStats {
        PoolStats {
            allocations: self.allocations.load(Ordering::Relaxed),
            frees: self.frees.load(Ordering::Relaxed),
            allocated_bytes: self.allocated_bytes.load(Ordering::Relaxed),
            in_use_bytes: self.in_use_bytes.load(Ordering::Relaxed),
            blocks_taken: self.blocks_taken.load(Ordering::Relaxed),
            resets: self.generation.load(Ordering::Relaxed),
        }
    }

    /// A block of at least `bytes` (at least one byte is handed out for 0). Called on
    /// the thread that may allocate (where the allocator's preconditions hold, e.g. a CUDA
    /// context is current).
    ///
    /// # Errors
    /// The allocator's, when memory must be allocated and cannot be.
    pub(crate) fn take(&'static self, bytes: usize) -> Result<PinnedBlock, Error> {
        let class = size_class(bytes);
        let (ptr, cap, generation) =
            if class <= SMALL_MAX { self.take_small(class)? } else { self.take_large(class)? };
        self.in_use_bytes.fetch_add(cap as u64, Ordering::Relaxed);
        self.blocks_taken.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the block was just taken off this pool's books (idle lists or a fresh
        // allocation of at least `cap` bytes): nobody else holds it until it comes back
        // through `give_back`.
        Ok(unsafe { PinnedBlock::lent(ptr, cap, generation, self) })
    }

    /// A small block, its capacity and generation.
    fn take_small(&self, class: usize) -> Result<(NonNull<u8>, usize, u64), Error> {
        {
            let mut st = lock(&self.state);
            if let Some(p) = st.idle.get_mut(&class).and_then(Vec::pop) {
                return Ok((p, class, self.generation.load(Ordering::Acquire)));
            }
        }
        // A new slab, split into blocks of this class: one handed out, the rest idle.
        let slab = self.alloc.alloc(SLAB)?;
        self.allocations.fetch_add(1, Ordering::Relaxed);
        self.allocated_bytes.fetch_add(SLAB as u64, Ordering::Relaxed);
        let n = SLAB / class;
        let mut st = lock(&self.state);
        let free = st.idle.entry(class).or_default();
        free.reserve(n - 1);
        for i in (1..n).rev() {
            // SAFETY: `i * class < SLAB`: inside the slab just allocated.
            free.push(unsafe { slab.add(i * class) });
        }
        Ok((slab, class, self.generation.load(Ordering::Acquire)))
    }

    /// A large block of at least `class` bytes, its capacity and generation.
    fn take_large(&'static self, class: usize) -> Result<(NonNull<u8>, usize, u64), Error> {
        let mut evict = Vec::new();
        {
            let mut st = lock(&self.state);
            // An idle block of this class or up to twice as large.
            let found = st
                .idle
                .range_mut(class..=class.saturating_mul(2))
                .find_map(|(&c, v)| v.pop().map(|p| (c, p)));
            if let Some((c, p)) = found {
                st.idle_large_bytes -= c;
                let addr = p.as_ptr() as usize;
                if let Some(i) = st.idle_large_order.iter().position(|&(_, a)| a == addr) {
                    st.idle_large_order.remove(i);
                }
                // The block keeps its real capacity (charged as such against the bound).
                return Ok((p, c, self.generation.load(Ordering::Acquire)));
            }
            // Make room under the idle limit for what the new block may become.
            let limit = self.idle_limit.load(Ordering::Relaxed);
            while st.idle_large_bytes + class > limit {
                let Some((c, addr)) = st.idle_large_order.pop_front() else { break };
                if let Some(v) = st.idle.get_mut(&c) {
                    if let Some(i) = v.iter().position(|p| p.as_ptr() as usize == addr) {
                        evict.push((v.swap_remove(i), c));
                        st.idle_large_bytes -= c;
                    }
                }
            }
        }
        if !evict.is_empty() {
            self.free_elsewhere(&evict);
        }
        let generation = self.generation.load(Ordering::Acquire);
        let p = self.alloc.alloc(class)?;
        self.allocations.fetch_add(1, Ordering::Relaxed);
        self.allocated_bytes.fetch_add(class as u64, Ordering::Relaxed);
        Ok((p, class, generation))
    }

    /// Hands evicted blocks to the reaper thread (started the first time), so that the
    /// thread that needs a block never waits for a free (`cuMemFreeHost` synchronises the
    /// device). If the thread cannot be started, frees them here.
    fn free_elsewhere(&'static self, evict: &[(NonNull<u8>, usize)]) {
        let generation = self.generation.load(Ordering::Acquire);
        let mut r = lock(&self.reap);
        r.pending.extend(evict.iter().map(|&(p, c)| (p.as_ptr() as usize, c, generation)));
        if !r.started {
            let spawned = std::thread::Builder::new()
                .name("hostfeed-pinned-free".into())
                .spawn(move || self.run_reaper());
            r.started = spawned.is_ok();
        }
        let here = if r.started { Vec::new() } else { std::mem::take(&mut r.pending) };
        drop(r);
        self.reap_work.notify_one();
        self.free_now(&here);
    }

    /// The reaper thread: frees what is handed to it, forever.
    fn run_reaper(&self) {
        loop {
            let batch = {
                let mut r = lock(&self.reap);
                while r.pending.is_empty() {
                    r = self.reap_work.wait(r);
                }
                std::mem::take(&mut r.pending)
            };
            self.free_now(&batch);
        }
    }

    /// Frees evicted blocks of the current generation (older ones died with their memory).
    fn free_now(&self, batch: &[(usize, usize, u64)]) {
        if batch.is_empty() {
            return;
        }
        let current = self.generation.load(Ordering::Acquire);
        for &(addr, c, generation) in batch {
            if generation != current {
                continue;
            }
            let Some(p) = NonNull::new(addr as *mut u8) else { continue };
            // SAFETY: an evicted block was idle (handed out to nobody, no copy into it
            // pending: it was given back after its consumer was done), was removed from
            // the idle lists under the lock, and is freed once, here.
            unsafe { self.alloc.free(p, c) };
            self.frees.fetch_add(1, Ordering::Relaxed);
            self.allocated_bytes.fetch_sub(c as u64, Ordering::Relaxed);
        }
        lock(&self.reap).reaped += batch.len() as u64;
        self.reap_done.notify_all();
    }
}

impl<A: PinnedAlloc> GiveBack for PinnedPool<A> {
    fn give_back(&self, ptr: NonNull<u8>, cap: usize, generation: u64) {
        self.in_use_bytes.fetch_sub(cap as u64, Ordering::Relaxed);
        let mut st = lock(&self.state);
        if generation != self.generation.load(Ordering::Acquire) {
            return; // handed out before a reset: its memory is gone
        }
        st.idle.entry(cap).or_default().push(ptr);
        if cap > SMALL_MAX {
            st.idle_large_bytes += cap;
            st.idle_large_order.push_back((cap, ptr.as_ptr() as usize));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::alloc::{self, Layout};
    use std::collections::HashMap;

    /// Heap memory standing in for pinned memory; records every live allocation.
    #[derive(Default)]
    struct FakeAlloc {
        live: Mutex<HashMap<usize, usize>>,
        fail_above: AtomicUsize,
        /// The thread of every free.
        freed_on: Mutex<Vec<std::thread::ThreadId>>,
    }

    impl PinnedAlloc for FakeAlloc {
        fn alloc(&self, bytes: usize) -> Result<NonNull<u8>, Error> {
            let limit = self.fail_above.load(Ordering::Relaxed);
            if limit > 0 && bytes > limit {
                return Err(Error::Internal(format!("cannot pin {bytes} bytes")));
            }
            let layout = Layout::from_size_align(bytes, 4096).unwrap();
            // SAFETY: non-zero size.
            let p = NonNull::new(unsafe { alloc::alloc(layout) }).unwrap();
            lock(&self.live).insert(p.as_ptr() as usize, bytes);
            Ok(p)
        }

        unsafe fn free(&self, ptr: NonNull<u8>, bytes: usize) {
            lock(&self.freed_on).push(std::thread::current().id());
            assert_eq!(lock(&self.live).remove(&(ptr.as_ptr() as usize)), Some(bytes), "double or bad free");
            // SAFETY: allocated above with this layout.
            unsafe { alloc::dealloc(ptr.as_ptr(), Layout::from_size_align(bytes, 4096).unwrap()) };
        }
    }

    fn pool() -> &'static PinnedPool<FakeAlloc> {
        Box::leak(Box::new(PinnedPool::new(FakeAlloc::default())))
    }

    fn live_bytes(p: &PinnedPool<FakeAlloc>) -> usize {
        lock(&p.allocator().live).values().sum()
    }

    #[test]
    fn classes_bound_the_slack() {
        assert_eq!(size_class(0), SMALL_MIN);
        assert_eq!(size_class(1), SMALL_MIN);
        assert_eq!(size_class(257), 512);
        assert_eq!(size_class(SMALL_MAX), SMALL_MAX);
        assert_eq!(size_class(SMALL_MAX + 1), SMALL_MAX + SMALL_MAX / 4);
        assert_eq!(size_class(64 << 20), 64 << 20); // a 64 MiB tap: no slack at all
        for n in [SMALL_MAX + 1, 100_000, 1 << 20, (1 << 20) + 1, 3 << 20, 1_000_000_007] {
            let c = size_class(n);
            assert!(c >= n && c - n <= n / 4, "{n} -> {c}");
            assert_eq!(size_class(c), c, "a class is its own class");
        }
    }

    #[test]
    fn steady_state_reuses_blocks_without_allocating() {
        let p = pool();
        for _ in 0..3 {
            let blocks: Vec<_> = (0..100).map(|i| p.take(4 + i % 3).unwrap()).collect();
            assert!(blocks.iter().all(|b| b.capacity() == SMALL_MIN && b.as_ptr() as usize % SMALL_MIN == 0));
            let mut addrs: Vec<_> = blocks.iter().map(|b| b.as_ptr() as usize).collect();
            addrs.sort_unstable();
            addrs.dedup();
            assert_eq!(addrs.len(), 100, "blocks must not overlap");
            drop(blocks);
        }
        // 100 small blocks fit in one slab; three rounds allocated it once.
        assert_eq!(p.stats().allocations, 1);
        assert_eq!(live_bytes(p), SLAB);
        for _ in 0..10 {
            drop(p.take(48 << 20).unwrap());
        }
        let s = p.stats();
        assert_eq!((s.allocations, s.frees, s.in_use_bytes, s.blocks_taken), (2, 0, 0, 310));
    }

    #[test]
    fn a_large_request_reuses_an_idle_block_up_to_twice_its_size() {
        let p = pool();
        drop(p.take(8 << 20).unwrap());
        let b = p.take(5 << 20).unwrap();
        assert_eq!(b.capacity(), 8 << 20, "the idle 8 MiB block serves 5 MiB");
        assert_eq!(p.stats().in_use_bytes, 8 << 20);
        drop(b);
        let b = p.take(3 << 20).unwrap();
        assert_eq!(b.capacity(), 3 << 20, "more than twice too large: a new block");
        drop(b);
        assert_eq!(p.stats().allocations, 2);
    }

    #[test]
    fn idle_large_blocks_are_evicted_oldest_first_over_the_limit() {
        let p = pool();
        p.set_idle_limit(10 << 20);
        let first = p.take(4 << 20).unwrap();
        let second = p.take(5 << 20).unwrap();
        let a_addr = first.as_ptr() as usize;
        drop(first); // oldest idle
        drop(second);
        assert_eq!(live_bytes(p), 9 << 20);
        // 1.5 MiB fits neither idle block (each more than twice as large); idle 9 + 1.5 >
        // 10: the oldest (4 MiB) goes.
        let c = p.take(3 << 19).unwrap();
        p.wait_reaped(1);
        assert!(lock(&p.allocator().live).get(&a_addr).is_none(), "the oldest idle block was freed");
        assert_eq!(live_bytes(p), (5 << 20) + (3 << 19));
        assert_eq!(p.stats().frees, 1);
        drop(c);
        // Blocks in use are never freed, whatever the limit.
        p.set_idle_limit(0);
        let d = p.take(20 << 20).unwrap();
        p.wait_reaped(3);
        assert_eq!(live_bytes(p), 20 << 20);
        drop(d);
        assert_eq!(p.stats().allocated_bytes, 20 << 20);
    }

    #[test]
    fn evicted_blocks_are_freed_on_another_thread_than_the_one_taking_a_block() {
        let p = pool();
        p.set_idle_limit(4 << 20);
        drop(p.take(4 << 20).unwrap());
        // Idle 4 MiB + a new 1.5 MiB block > 4 MiB: the idle block is evicted.
        let b = p.take(3 << 19).unwrap();
        p.wait_reaped(1);
        let freed_on = lock(&p.allocator().freed_on).clone();
        assert_eq!(freed_on.len(), 1);
        assert_ne!(freed_on[0], std::thread::current().id(), "freed on the taking thread");
        assert_eq!(p.stats().frees, 1);
        assert_eq!(p.stats().allocated_bytes, 3 << 19);
        drop(b);
    }

    #[test]
    fn a_reset_forgets_every_block_and_frees_none() {
        let p = pool();
        let small = p.take(100).unwrap();
        let large = p.take(2 << 20).unwrap();
        drop(p.take(3 << 20).unwrap()); // idle
        p.reset();
        assert_eq!(p.stats().resets, 1);
        assert_eq!(p.stats().allocated_bytes, 0);
        // Blocks handed out before come back and are forgotten, not reused nor freed.
        let (small_addr, large_addr) = (small.as_ptr() as usize, large.as_ptr() as usize);
        drop((small, large));
        assert_eq!(p.stats().in_use_bytes, 0);
        let again = p.take(100).unwrap();
        let big = p.take(2 << 20).unwrap();
        assert_ne!(again.as_ptr() as usize, small_addr);
        assert_ne!(big.as_ptr() as usize, large_addr);
        assert_eq!(p.stats().allocations, 3 + 2, "fresh allocations after the reset");
        assert!(lock(&p.allocator().freed_on).is_empty(), "nothing freed: the memory is gone");
        // (The fake's memory is really live: leaked here, as the real pool's would be gone.)
        drop((again, big));
    }

    #[test]
    fn allocation_failure_is_an_error_and_leaves_the_pool_usable() {
        let p = pool();
        p.allocator().fail_above.store(SLAB, Ordering::Relaxed);
        assert!(matches!(p.take(2 << 20), Err(Error::Internal(_))));
        assert_eq!(p.stats().in_use_bytes, 0);
        let b = p.take(100).unwrap();
        assert_eq!(b.capacity(), SMALL_MIN);
    }

    #[test]
    fn blocks_return_from_other_threads() {
        let p = pool();
        let blocks: Vec<_> = (0..64).map(|_| p.take(1000).unwrap()).collect();
        std::thread::spawn(move || drop(blocks)).join().unwrap();
        assert_eq!(p.stats().in_use_bytes, 0);
        let again: Vec<_> = (0..64).map(|_| p.take(1000).unwrap()).collect();
        assert_eq!(p.stats().allocations, 1);
        drop(again);
    }
}
