//! The GPU drivers' tests, written once for each driver by two macros: the handlers of
//! a driver kind on this machine, and the stream over a fake queue.

/// Tests every driver's generic parts with a fake per driver kind (its codes, its names):
/// instantiated at the end for CUDA and for HIP.
macro_rules! driver_kind_tests {
    ($kind:ident, handlers: $handlers:expr, label: $label:literal, graph: $graph:literal, unusable: $unusable:expr) => {
        mod $kind {
            use crate::gpu::driver::*;
            use std::cell::Cell;

            #[test]
            fn handlers_are_registered_under_the_cpu_names() {
                let names: Vec<&str> = $handlers.iter().map(|r| r.0).collect();
                let cpu: Vec<&str> = crate::ffi::handlers::HANDLERS.iter().map(|r| r.0).collect();
                assert_eq!(names, cpu);
                // The four handlers are distinct functions, and not the CPU ones.
                let f: Vec<usize> = $handlers.iter().map(|r| r.1 as usize).collect();
                assert!(f.windows(2).all(|w| w[0] != w[1]));
                assert!(crate::ffi::handlers::HANDLERS.iter().all(|c| !f.contains(&(c.1 as usize))));
            }

            #[test]
            fn a_handler_called_without_a_frame_answers_instead_of_crashing() {
                for (_, handler) in $handlers {
                    // SAFETY: a null frame is allowed (nothing to run: no error).
                    let err = unsafe { handler(std::ptr::null_mut()) };
                    assert!(err.is_null());
                }
            }

            #[test]
            fn the_wait_polls_until_done_and_sleeps_only_when_pending_past_the_spin() {
                let polls = Cell::new(0);
                let done_at_third = || {
                    polls.set(polls.get() + 1);
                    Ok(if polls.get() >= 3 { Poll::Done } else { Poll::Pending })
                };
                poll_then_block(done_at_third, || panic!("slept although the work completed")).unwrap();
                assert_eq!(polls.get(), 3);
                let blocked = Cell::new(false);
                poll_then_block(|| Ok(Poll::Pending), || Ok(blocked.set(true))).unwrap();
                assert!(blocked.get());
                let err = poll_then_block(|| Err(captured($graph)), || Ok(())).unwrap_err().to_string();
                assert!(err.contains($graph) && err.contains("captured"), "{err}");
            }

            #[test]
            fn without_its_library_the_driver_says_why_in_its_own_words() {
                if let Some(why) = $unusable {
                    let why: String = why;
                    assert!(!why.is_empty());
                }
            }

            #[test]
            fn idle_events_come_back_per_owner_and_are_forgotten_with_it() {
                let pool = EventPool::new();
                assert_eq!(pool.take(1), None);
                pool.give(1, 10);
                pool.give(2, 20);
                assert_eq!(pool.take(2), Some(20));
                pool.forget(1);
                assert_eq!(pool.take(1), None);
            }
        }
    };
}

/// The shared [`Stream`] ([`OnStream`], [`Pooled`]) against a fake [`StreamOps`] of one driver
/// kind: what its events belong to (`owner`: a context's address on CUDA, a device ordinal
/// on HIP) and whether a courier must make it current before waiting (`enters`).
macro_rules! fake_queue_tests {
    ($kind:ident, owner: $owner:expr, enters: $enters:expr) => {
        mod $kind {
            use crate::gpu::driver::*;
            use std::sync::atomic::{AtomicUsize, Ordering};

            /// What the fake driver was asked, in order.
            static LOG: Mutex<Vec<String>> = Mutex::new(Vec::new());
            /// Polls answered `Pending` before `Done`.
            static PENDING: AtomicUsize = AtomicUsize::new(0);
            static CREATED: AtomicUsize = AtomicUsize::new(0);
            static EVENTS: EventPool = EventPool::new();

            fn log(what: String) {
                lock(&LOG).push(what);
            }

            fn take_log() -> Vec<String> {
                std::mem::take(&mut *lock(&LOG))
            }

            fn countdown() -> Poll {
                match PENDING.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)) {
                    Ok(_) => Poll::Pending,
                    Err(_) => Poll::Done,
                }
            }

            /// Heap memory standing in for pinned memory.
            struct Heap;

            impl PinnedAlloc for Heap {
                fn alloc(&self, bytes: usize) -> Result<std::ptr::NonNull<u8>, Error> {
                    let layout = std::alloc::Layout::from_size_align(bytes, 64).unwrap();
                    // SAFETY: non-zero size (the pool never asks for 0).
                    std::ptr::NonNull::new(unsafe { std::alloc::alloc(layout) })
                        .ok_or_else(|| Error::Internal("out of memory".into()))
                }

                unsafe fn free(&self, ptr: std::ptr::NonNull<u8>, bytes: usize) {
                    let layout = std::alloc::Layout::from_size_align(bytes, 64).unwrap();
                    // SAFETY: allocated above with this layout.
                    unsafe { std::alloc::dealloc(ptr.as_ptr(), layout) };
                }
            }

            struct Fake;

            impl Pools for Fake {
                type Alloc = Heap;

                fn pinned() -> &'static PinnedPool<Heap> {
                    static POOL: OnceLock<PinnedPool<Heap>> = OnceLock::new();
                    POOL.get_or_init(|| PinnedPool::new(Heap))
                }

                fn events() -> &'static EventPool {
                    &EVENTS
                }
            }

            impl StreamOps for Fake {
                fn owner(&self) -> usize {
                    $owner
                }

                unsafe fn copy(&self, dst: *mut u8, src: *const u8, n: usize) -> Result<(), Error> {
                    log(format!("copy {n}"));
                    // SAFETY: caller contract; the fake device runs the copy at once.
                    unsafe { std::ptr::copy_nonoverlapping(src, dst, n) };
                    Ok(())
                }

                fn record_on(&self, event: usize) -> Result<(), Error> {
                    log(format!("record {event}"));
                    Ok(())
                }

                fn query(&self) -> Result<Poll, Error> {
                    Ok(countdown())
                }

                fn block(&self) -> Result<(), Error> {
                    log("block stream".into());
                    PENDING.store(0, Ordering::SeqCst);
                    Ok(())
                }

                fn create_event(&self) -> Result<usize, Error> {
                    let e = 100 + CREATED.fetch_add(1, Ordering::SeqCst);
                    log(format!("create {e}"));
                    Ok(e)
                }

                fn enter(owner: usize) -> Result<(), Error> {
                    if $enters {
                        log(format!("enter {owner}"));
                    }
                    Ok(())
                }

                fn event_query(_event: usize) -> Result<Poll, Error> {
                    Ok(countdown())
                }

                fn event_block(event: usize) -> Result<(), Error> {
                    log(format!("block {event}"));
                    PENDING.store(0, Ordering::SeqCst);
                    Ok(())
                }
            }

            #[test]
            fn the_shared_stream_copies_pools_events_per_owner_and_polls_before_sleeping() {
                let stream = OnStream(Fake);
                let src = [1u8, 2, 3];
                let mut dst = [0u8; 3];
                // SAFETY: both arrays hold 3 bytes; the fake copies at once.
                unsafe {
                    stream.copy_to_host(dst.as_mut_ptr(), src.as_ptr(), 3).unwrap();
                    stream.copy_to_device(dst.as_mut_ptr(), [7u8, 8, 9].as_ptr(), 2).unwrap();
                }
                assert_eq!(dst, [7, 8, 3]);
                assert_eq!(take_log(), ["copy 3", "copy 2"]);

                // The first event is created; waited for within the spin, no sleep.
                PENDING.store(2, Ordering::SeqCst);
                let event = stream.record().unwrap();
                event.wait().unwrap();
                let enter = format!("enter {}", $owner);
                let mut expected = vec!["create 100".to_string(), "record 100".into()];
                if $enters {
                    expected.push(enter.clone());
                }
                assert_eq!(take_log(), expected);
                // Dropped: back to the owner's pool, reused by the next tap.
                drop(event);
                let again = stream.record().unwrap();
                assert_eq!(take_log(), ["record 100"]);
                // Pending past the spin: the courier sleeps in the driver.
                PENDING.store(usize::MAX, Ordering::SeqCst);
                again.wait().unwrap();
                let log = take_log();
                assert_eq!(log.last().map(String::as_str), Some("block 100"), "{log:?}");
                drop(again);
                assert_eq!(EVENTS.take($owner), Some(100));
                assert_eq!(EVENTS.take($owner), None);

                // The stream's own wait: polls, then sleeps.
                PENDING.store(usize::MAX, Ordering::SeqCst);
                stream.synchronize().unwrap();
                assert_eq!(take_log(), ["block stream"]);

                // Pinned buffers come from the driver's pool.
                let buf = stream.host_buffer(100).unwrap();
                assert_eq!(buf.len(), 100);
                assert_eq!(Fake::pinned().stats().allocations, 1);
            }
        }
    };
}

driver_kind_tests!(cuda, handlers: crate::gpu::cuda::HANDLERS, label: " (CUDA)", graph: "a CUDA graph",
    unusable: crate::gpu::cuda::driver_library().err());
driver_kind_tests!(hip, handlers: crate::gpu::hip::HANDLERS, label: " (ROCm)", graph: "a HIP graph",
    unusable: crate::gpu::hip::runtime_library().err());

mod fakes {
    // CUDA: events belong to a context (its address), made current before a wait.
    fake_queue_tests!(cuda, owner: 0x7f00_c0de_0000_usize, enters: true);
    // HIP: events belong to a device (its ordinal), waited for from any thread.
    fake_queue_tests!(hip, owner: 1_usize, enters: false);
}
