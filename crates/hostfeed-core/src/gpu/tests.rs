//! The GPU room's tests, against a fake [`Stream`](super::Stream).

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::error::Error;
use crate::ffi::c_api::dtype;
use crate::ffi::handlers::Attrs;
use crate::host::message::FLAG_STATUS_OUTPUT;
use crate::host::buffer::HostBuffer;
use crate::host::hub::Hub;
use crate::host::message::Operand;
use crate::host::reply::OutBuf;
use crate::host::sync::lock;

use super::*;
use crate::gpu::delivery::admits;
use crate::gpu::ops::new_message;
use crate::gpu::pinned::{PinnedAlloc, PinnedPool};
use crate::gpu::{Completion, Delivery, Header, Stream};
use crate::host::hub::{Consume, Worker};
use std::alloc::{self, Layout};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::OnceLock;

/// Heap memory standing in for pinned memory.
struct HeapPinned;

impl PinnedAlloc for HeapPinned {
    fn alloc(&self, bytes: usize) -> Result<NonNull<u8>, Error> {
        // SAFETY: non-zero size (the pool never asks for 0).
        NonNull::new(unsafe { alloc::alloc(Layout::from_size_align(bytes, 4096).unwrap()) })
            .ok_or_else(|| Error::Internal("out of memory".into()))
    }

    unsafe fn free(&self, ptr: NonNull<u8>, bytes: usize) {
        // SAFETY: allocated above with this layout.
        unsafe { alloc::dealloc(ptr.as_ptr(), Layout::from_size_align(bytes, 4096).unwrap()) };
    }
}

enum Op {
    Copy { dst: usize, src: usize, n: usize },
    Mark(Arc<FakeEvent>),
    Sync(mpsc::Sender<()>),
}

/// A marker the fake device completes when it reaches it.
#[derive(Default)]
struct FakeEvent {
    done: Mutex<bool>,
    cv: Condvar,
}

/// A marker, and whether the fake device reports an error at it.
struct EventRef(Arc<FakeEvent>, bool);

impl Completion for EventRef {
    fn wait(&self) -> Result<(), Error> {
        let mut g = lock(&self.0.done);
        while !*g {
            g = self.0.cv.wait(g).unwrap();
        }
        if self.1 {
            return Err(Error::Internal("the fake device failed".into()));
        }
        Ok(())
    }
}

/// A device that runs its work on a thread of its own, in order; it can be paused
/// (work waits) and made to refuse copies or host functions. "Device memory" is host
/// memory.
struct FakeStream {
    ops: mpsc::Sender<Op>,
    paused: Arc<(Mutex<bool>, Condvar)>,
    pool: &'static PinnedPool<HeapPinned>,
    fail_copies_after: AtomicUsize,
    fail_record: AtomicBool,
    /// Markers recorded while set report an error when reached.
    fail_events: AtomicBool,
    copies: AtomicUsize,
}

impl FakeStream {
    fn new() -> Self {
        let (tx, rx) = mpsc::channel::<Op>();
        let paused = Arc::new((Mutex::new(false), Condvar::new()));
        let p2 = Arc::clone(&paused);
        std::thread::spawn(move || {
            for op in rx {
                let mut g = lock(&p2.0);
                while *g {
                    g = p2.1.wait(g).unwrap();
                }
                drop(g);
                match op {
                    // SAFETY: the handler enqueued a copy between valid, disjoint ranges.
                    Op::Copy { dst, src, n } => unsafe {
                        std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, n);
                    },
                    Op::Mark(e) => {
                        *lock(&e.done) = true;
                        e.cv.notify_all();
                    }
                    Op::Sync(done) => drop(done.send(())),
                }
            }
        });
        let pool = *TEST_POOL.get_or_init(|| Box::leak(Box::new(PinnedPool::new(HeapPinned))));
        FakeStream {
            ops: tx,
            paused,
            pool,
            fail_copies_after: AtomicUsize::new(usize::MAX),
            fail_record: AtomicBool::new(false),
            fail_events: AtomicBool::new(false),
            copies: AtomicUsize::new(0),
        }
    }

    fn pause(&self, on: bool) {
        *lock(&self.paused.0) = on;
        self.paused.1.notify_all();
    }

    fn copy(&self, dst: *mut u8, src: *const u8, n: usize) -> Result<(), Error> {
        if self.copies.fetch_add(1, Ordering::SeqCst) >= self.fail_copies_after.load(Ordering::SeqCst) {
            return Err(Error::Internal("copy refused".into()));
        }
        self.ops.send(Op::Copy { dst: dst as usize, src: src as usize, n }).unwrap();
        Ok(())
    }
}

impl Stream for FakeStream {
    unsafe fn copy_to_host(&self, dst: *mut u8, src: *const u8, n: usize) -> Result<(), Error> {
        self.copy(dst, src, n)
    }

    unsafe fn copy_to_device(&self, dst: *mut u8, src: *const u8, n: usize) -> Result<(), Error> {
        self.copy(dst, src, n)
    }

    fn record(&self) -> Result<Box<dyn Completion>, Error> {
        if self.fail_record.load(Ordering::SeqCst) {
            return Err(Error::Internal("record refused".into()));
        }
        let e = Arc::new(FakeEvent::default());
        self.ops.send(Op::Mark(Arc::clone(&e))).unwrap();
        Ok(Box::new(EventRef(e, self.fail_events.load(Ordering::SeqCst))))
    }

    fn synchronize(&self) -> Result<(), Error> {
        let (tx, rx) = mpsc::channel();
        self.ops.send(Op::Sync(tx)).unwrap();
        rx.recv().map_err(|_| Error::Internal("device gone".into()))
    }

    fn host_buffer(&self, len: usize) -> Result<HostBuffer, Error> {
        Ok(HostBuffer::pinned(self.pool.take(len)?, len))
    }
}

static TEST_POOL: OnceLock<&'static PinnedPool<HeapPinned>> = OnceLock::new();

/// What the consumer saw: (device key, consumer id, bytes, pinned).
type Seen = Vec<(i32, i64, Vec<u8>, bool)>;

/// Records messages; replies to calls with each operand's bytes plus one (or fails
/// them, for consumer id 13).
struct Recording {
    seen: Mutex<Seen>,
}

impl Consume for Recording {
    fn run(&self, worker: &Worker) {
        while let Some(batch) = worker.next_batch() {
            while let Some(m) = batch.take() {
                let bytes =
                    // SAFETY: the message's buffer holds `len` written bytes.
                    unsafe { std::slice::from_raw_parts(m.data.as_ptr(), m.data.len()) }.to_vec();
                // Seen before the reply: the test reads `seen` once its call returned.
                lock(&self.seen).push((m.device, m.consumer_id, bytes.clone(), m.data.is_pinned()));
                if let Some(slot) = &m.reply {
                    if m.consumer_id == 13 {
                        slot.fail("host function raised".into());
                    } else {
                        slot.reply_with(|outs| {
                            for (o, b) in outs.iter().zip(&bytes) {
                                // SAFETY: the slot is pending, `o` holds `nbytes` bytes.
                                unsafe { std::ptr::write_bytes(o.data, b + 1, o.nbytes) };
                            }
                            Ok(())
                        });
                    }
                }
            }
        }
    }
}

fn setup(bound: usize) -> (&'static Hub, Arc<Recording>, &'static Delivery) {
    let r: &'static Hub = Box::leak(Box::new(Hub::new(bound)));
    let c = Arc::new(Recording { seen: Mutex::new(Vec::new()) });
    r.configure(c.clone());
    (r, c, Box::leak(Box::new(Delivery::new())))
}

fn header(consumer_id: i64, ordinal: i32) -> Header {
    Header { consumer_id, flags: 0, ordinal, run_id: 7 }
}

fn u8s<'a>(data: &'a [u8], dims: &'a [i64]) -> Operand<'a> {
    Operand { dtype: dtype::U8, data: data.as_ptr(), dims }
}

fn wait_all(recv: &'static Hub, n: u64) {
    assert!(recv.wait_processed(n, Duration::from_secs(60)).unwrap(), "messages not processed");
}

/// Waits until device `device` holds no reservation: a courier ends its reservation after
/// pushing the message, so the consumer may have processed the message first.
fn wait_unreserved(delivery: &Delivery, device: i32) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while delivery.reserved(device) != 0 {
        assert!(Instant::now() < deadline, "a reservation never ended: {} bytes", delivery.reserved(device));
        std::thread::yield_now();
    }
}

#[test]
fn admission_is_within_the_bound_or_alone() {
    assert!(admits(0, 0, 1000, 10), "alone, even over the bound");
    assert!(admits(4, 3, 3, 10));
    assert!(!admits(4, 3, 4, 10));
    assert!(!admits(1, 0, 10, 10), "not alone: the device has a message in flight");
    assert!(!admits(0, 1, 10, 10), "not alone: the queue holds a message");
    assert!(!admits(usize::MAX, 1, 1, usize::MAX), "no overflow");
}

#[test]
fn a_tap_returns_before_the_device_ran_and_arrives_in_stream_order() {
    let (recv, c, delivery) = setup(1 << 20);
    let stream = FakeStream::new();
    let dev: Vec<[u8; 3]> = (0..50u8).map(|i| [i, i, i]).collect();
    stream.pause(true);
    for (i, d) in dev.iter().enumerate() {
        // SAFETY: the fake device memory outlives the copies (waited for below).
        unsafe {
            tap(&stream, recv, delivery, header(i64::try_from(i).unwrap(), 2), [u8s(d, &[3])].into_iter())
        }
        .unwrap();
    }
    // Every handler returned while the device has run nothing: nothing was delivered
    // (the courier waits for the device) and the bytes are reserved, not queued.
    assert_eq!(recv.queue.enqueued(), 0);
    assert_eq!(delivery.submitted(), 50);
    assert!(!delivery.wait_delivered(1, Duration::from_millis(1)));
    assert!(delivery.reserved(2) > 0);
    stream.pause(false);
    wait_all(recv, 50);
    let seen = lock(&c.seen).clone();
    let ids: Vec<i64> = seen.iter().map(|m| m.1).collect();
    assert_eq!(ids, (0..50).collect::<Vec<_>>());
    assert!(seen.iter().all(|m| m.0 == 2 && m.3), "GPU 2's ordinal, pinned buffers");
    assert_eq!(seen[49].2, vec![49, 49, 49]);
    assert_eq!(delivery.reserved(2), 0);
}

#[test]
fn the_copy_reads_what_the_device_computed_before_it() {
    let (recv, c, delivery) = setup(1 << 20);
    let stream = FakeStream::new();
    let mut dev = [0u8; 4];
    stream.pause(true);
    // SAFETY: `dev` outlives the copy (waited for below).
    unsafe { tap(&stream, recv, delivery, header(1, 0), [u8s(&dev, &[4])].into_iter()) }.unwrap();
    // The "kernel" producing the operand runs later than the handler; the copy is
    // enqueued after it in the real stream, which the fake models by writing now.
    // SAFETY: the fake device is paused; nothing reads `dev` concurrently.
    unsafe { std::ptr::write_volatile(dev.as_mut_ptr().cast::<[u8; 4]>(), [9, 8, 7, 6]) };
    stream.pause(false);
    wait_all(recv, 1);
    assert_eq!(lock(&c.seen)[0].2, vec![9, 8, 7, 6]);
}

#[test]
fn each_device_keeps_its_own_order() {
    let (recv, c, delivery) = setup(1 << 20);
    let per_device = 300usize;
    std::thread::scope(|scope| {
        for ordinal in 0..3 {
            scope.spawn(move || {
                let stream = FakeStream::new();
                let data: Vec<[u8; 8]> = (0..per_device).map(|i| (i as u64).to_ne_bytes()).collect();
                for (i, d) in data.iter().enumerate() {
                    let h = header(i64::try_from(i).unwrap(), ordinal);
                    // SAFETY: `data` outlives the copies (synchronised below).
                    unsafe { tap(&stream, recv, delivery, h, [u8s(d, &[8])].into_iter()) }.unwrap();
                }
                stream.synchronize().unwrap();
            });
        }
    });
    wait_all(recv, 3 * per_device as u64);
    let seen = lock(&c.seen).clone();
    for ordinal in 0..3 {
        let mine: Vec<i64> = seen.iter().filter(|m| m.0 == ordinal).map(|m| m.1).collect();
        assert_eq!(mine, (0..i64::try_from(per_device).unwrap()).collect::<Vec<_>>(), "device {ordinal}");
    }
}

#[test]
fn a_small_bound_holds_the_host_thread_back_and_everything_arrives() {
    let data = [5u8; 4000];
    let charged = {
        let probe = FakeStream::new();
        new_message(&probe, header(0, 0), [u8s(&data, &[4000])].into_iter()).unwrap().charged_bytes()
    };
    // Room for two messages in flight.
    let (recv, c, delivery) = setup(2 * charged + 1);
    let stream = Arc::new(FakeStream::new());
    // The device is paused: two taps are admitted, the third must wait on the host
    // thread for the device (and the consumer) to make room.
    stream.pause(true);
    let s2 = Arc::clone(&stream);
    let producer = std::thread::spawn(move || {
        for i in 0..40 {
            // SAFETY: `data` is copied into the closure and outlives the copies.
            unsafe { tap(&*s2, recv, delivery, header(i, 0), [u8s(&data, &[4000])].into_iter()) }.unwrap();
            assert!(
                delivery.reserved(0) + recv.queue.held_bytes() <= 3 * charged,
                "the reservation bounds memory"
            );
        }
        s2.synchronize().unwrap();
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    while recv.queue.stats.snapshot().producer_blocked_count == 0 {
        assert!(Instant::now() < deadline, "the third tap never waited");
        std::thread::yield_now();
    }
    assert_eq!(delivery.submitted(), 2, "only two taps were admitted while the device was paused");
    stream.pause(false);
    producer.join().unwrap();
    wait_all(recv, 40);
    assert_eq!(lock(&c.seen).len(), 40);
    wait_unreserved(delivery, 0);
    assert!(recv.queue.stats.snapshot().producer_blocked_ns > 0, "the wait is counted");
}

#[test]
fn ending_a_reservation_wakes_a_handler_waiting_for_room() {
    // Every message is over the bound: one is admitted only alone. The handler of
    // the second waits for the first's reservation to end; the first's marker fails,
    // so its courier ends the reservation without queueing anything (no progress of
    // the consumer to wake the handler). Waiters look again only every hour: the
    // handler must be woken by the courier itself.
    let (recv, c, _) = setup(1);
    let delivery: &'static Delivery =
        Box::leak(Box::new(Delivery::with_gate_slice(Duration::from_secs(3600))));
    let stream = Arc::new(FakeStream::new());
    let data = [7u8; 64];
    stream.pause(true);
    stream.fail_events.store(true, Ordering::SeqCst);
    // SAFETY: `data` outlives the copies (the device runs them before the test ends).
    unsafe { tap(&*stream, recv, delivery, header(1, 0), [u8s(&data, &[64])].into_iter()) }.unwrap();
    stream.fail_events.store(false, Ordering::SeqCst);
    let (done_tx, done_rx) = mpsc::channel();
    let s2 = Arc::clone(&stream);
    let producer = std::thread::spawn(move || {
        // SAFETY: as above.
        let got = unsafe { tap(&*s2, recv, delivery, header(2, 0), [u8s(&data, &[64])].into_iter()) };
        done_tx.send(got.is_ok()).unwrap();
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    while recv.queue.stats.snapshot().producer_blocked_count == 0 {
        assert!(Instant::now() < deadline, "the second tap never waited");
        std::thread::yield_now();
    }
    stream.pause(false);
    let admitted = done_rx.recv_timeout(Duration::from_secs(30));
    assert_eq!(admitted, Ok(true), "the waiting handler was not woken when the reservation ended");
    producer.join().unwrap();
    wait_all(recv, 1);
    let ids: Vec<i64> = lock(&c.seen).iter().map(|m| m.1).collect();
    assert_eq!(ids, vec![2], "the first tap was lost (its marker failed), the second arrived");
    wait_unreserved(delivery, 0);
    assert!(recv.take_notes().iter().any(|n| n.contains("was lost")));
}

#[test]
fn operands_adjacent_on_the_device_and_in_the_message_go_in_one_copy() {
    let (recv, c, delivery) = setup(1 << 20);
    let stream = FakeStream::new();
    // One "device allocation" holding three operands back to back (32 + 16 bytes,
    // multiples of ALIGN, then 5), and one elsewhere.
    let dev: Vec<u8> = (0..53u8).collect();
    let other = [200u8; 16];
    let ops = [u8s(&dev[..32], &[32]), u8s(&dev[32..48], &[16]), u8s(&dev[48..], &[5])];
    let before = stream.copies.load(Ordering::SeqCst);
    // SAFETY: the operands outlive the copies (waited for below).
    unsafe { tap(&stream, recv, delivery, header(1, 0), ops.iter().copied()) }.unwrap();
    assert_eq!(stream.copies.load(Ordering::SeqCst) - before, 1, "three adjacent operands, one copy");
    let ops = [u8s(&dev[..32], &[32]), u8s(&other, &[16]), u8s(&dev[48..], &[5])];
    let before = stream.copies.load(Ordering::SeqCst);
    // SAFETY: as above.
    unsafe { tap(&stream, recv, delivery, header(2, 0), ops.iter().copied()) }.unwrap();
    assert_eq!(stream.copies.load(Ordering::SeqCst) - before, 3, "not adjacent: a copy each");
    // A 5-byte operand leaves padding in the message: the next one is copied apart.
    let ops = [u8s(&dev[48..], &[5]), u8s(&dev[..32], &[32])];
    let before = stream.copies.load(Ordering::SeqCst);
    // SAFETY: as above.
    unsafe { tap(&stream, recv, delivery, header(3, 0), ops.iter().copied()) }.unwrap();
    assert_eq!(stream.copies.load(Ordering::SeqCst) - before, 2);
    wait_all(recv, 3);
    let seen = lock(&c.seen).clone();
    let mut want1 = dev.clone();
    want1.resize(64, 0);
    assert_eq!(seen[0].2[..53], want1[..53], "the values, in place");
    assert_eq!(seen[1].2[32..48], other);
    assert_eq!(seen[1].2[48..53], dev[48..]);
    assert_eq!(seen[2].2[..5], dev[48..]);
    assert_eq!(seen[2].2[16..48], dev[..32]);
}

#[test]
fn pinned_buffers_go_back_to_the_pool_and_are_reused() {
    let (recv, _c, delivery) = setup(1 << 24);
    let stream = FakeStream::new();
    let data = vec![1u8; 300_000];
    for round in 0..5 {
        for i in 0..4 {
            // SAFETY: `data` outlives the copies.
            unsafe { tap(&stream, recv, delivery, header(i, 0), [u8s(&data, &[300_000])].into_iter()) }
                .unwrap();
        }
        wait_all(recv, 4 * (round + 1));
    }
    // Other tests share the pool, so compare against what one round could need.
    let stats = stream.pool.stats();
    assert!(stats.blocks_taken >= 20);
    assert!(stats.allocations < stats.blocks_taken, "blocks were reused: {stats:?}");
}

#[test]
fn a_failed_copy_fails_the_tap_and_leaves_nothing_behind() {
    let (recv, c, delivery) = setup(1 << 20);
    let stream = FakeStream::new();
    stream.fail_copies_after.store(1, Ordering::SeqCst);
    // Not adjacent (stack and heap): two copies, the second refused.
    let (a, b) = ([1u8; 16], vec![2u8; 16]);
    // SAFETY: the operands outlive the copies.
    let got =
        unsafe { tap(&stream, recv, delivery, header(1, 0), [u8s(&a, &[16]), u8s(&b, &[16])].into_iter()) };
    assert!(matches!(got, Err(Error::Internal(_))));
    assert_eq!(delivery.reserved(0), 0, "the reservation was ended");
    stream.synchronize().unwrap();
    assert_eq!(recv.queue.enqueued(), 0);
    assert!(lock(&c.seen).is_empty());
}

#[test]
fn a_failed_marker_fails_the_tap_and_leaves_nothing_behind() {
    let (recv, c, delivery) = setup(1 << 20);
    let stream = FakeStream::new();
    stream.fail_record.store(true, Ordering::SeqCst);
    let a = [3u8; 5];
    // SAFETY: the operand outlives the copy.
    let got = unsafe { tap(&stream, recv, delivery, header(4, 1), [u8s(&a, &[5])].into_iter()) };
    assert!(matches!(got, Err(Error::Internal(_))));
    assert_eq!(delivery.reserved(1), 0);
    assert_eq!(delivery.submitted(), 0);
    assert!(lock(&c.seen).is_empty());
}

#[test]
fn a_call_waits_for_the_taps_before_it() {
    let (recv, c, delivery) = setup(1 << 20);
    let stream = FakeStream::new();
    let a = [1u8; 4];
    for i in 0..20 {
        // SAFETY: the operand outlives the copies.
        unsafe { tap(&stream, recv, delivery, header(i, 0), [u8s(&a, &[4])].into_iter()) }.unwrap();
    }
    let mut y = [0u8; 1];
    let outs = [out(&mut y, dtype::U8)];
    // SAFETY: as above; `y` outlives the copy (synchronised below).
    unsafe { call_one(&stream, recv, delivery, header(99, 0), u8s(&a, &[1]), &outs) }.unwrap();
    stream.synchronize().unwrap();
    assert!(delivery.wait_delivered(delivery.submitted(), Duration::from_secs(60)));
    let ids: Vec<i64> = lock(&c.seen).iter().map(|m| m.1).collect();
    assert_eq!(ids, (0..20).chain([99]).collect::<Vec<_>>());
    assert_eq!(y, [2]);
}

/// A call with one operand and no status, on the fake stream.
///
/// # Safety
/// As [`call`]: the operand and the outputs outlive the copies.
unsafe fn call_one(
    stream: &FakeStream,
    recv: &'static Hub,
    delivery: &'static Delivery,
    h: Header,
    x: Operand<'_>,
    outs: &[OutBuf],
) -> Result<(), Error> {
    // SAFETY: forwarded to the caller.
    unsafe { call(stream, recv, delivery, h, &Attrs::default(), [x].into_iter(), outs, None) }
}

fn out(buf: &mut [u8], dt: i32) -> OutBuf {
    OutBuf {
        dtype: dt,
        data: buf.as_mut_ptr(),
        nbytes: buf.len(),
        dims: vec![i64::try_from(buf.len()).unwrap()],
    }
}

#[test]
fn a_call_writes_its_results_through_the_stream() {
    let (recv, c, delivery) = setup(1 << 20);
    let stream = FakeStream::new();
    let x = [10u8, 20];
    let (mut y0, mut y1) = ([0u8; 3], [0u8; 2]);
    let outs = [out(&mut y0, dtype::U8), out(&mut y1, dtype::U8)];
    // SAFETY: operands and outputs outlive the copies (synchronised below).
    unsafe { call_one(&stream, recv, delivery, header(1, 0), u8s(&x, &[2]), &outs) }.unwrap();
    stream.synchronize().unwrap();
    // The consumer replied with each result filled with (operand byte + 1).
    assert_eq!((y0, y1), ([11; 3], [21; 2]));
    assert_eq!(lock(&c.seen)[0].2, vec![10, 20]);
}

#[test]
fn a_failing_call_fails_with_the_host_message() {
    let (recv, _c, delivery) = setup(1 << 20);
    let stream = FakeStream::new();
    let x = [1u8];
    let mut y = [0u8; 1];
    let outs = [out(&mut y, dtype::U8)];
    // SAFETY: as above.
    let got = unsafe { call_one(&stream, recv, delivery, header(13, 0), u8s(&x, &[1]), &outs) };
    match got {
        Err(Error::CallFailed(m)) => assert_eq!(m, "host function raised"),
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn a_call_with_a_status_reports_failure_there_and_zeroes_its_results() {
    let (recv, _c, delivery) = setup(1 << 20);
    let stream = FakeStream::new();
    let x = [1u8];
    let mut y = [7u8; 2];
    let mut status = [0xffu8; 4];
    let outs = [out(&mut y, dtype::U8)];
    let st = OutBuf { dtype: dtype::S32, data: status.as_mut_ptr(), nbytes: 4, dims: vec![] };
    let h = Header { flags: FLAG_STATUS_OUTPUT, ..header(13, 0) };
    // SAFETY: as above.
    unsafe {
        call(&stream, recv, delivery, h, &Attrs::default(), [u8s(&x, &[1])].into_iter(), &outs, Some(&st))
    }
    .unwrap();
    stream.synchronize().unwrap();
    let ticket = i32::from_ne_bytes(status);
    assert!(ticket != 0);
    assert_eq!(y, [0, 0]);
    assert_eq!(recv.failure_message(ticket), "host function raised");
    // hostfeed_check on the device raises it; a zero status passes.
    let ops = status;
    let op = Operand { dtype: dtype::S32, data: ops.as_ptr(), dims: &[] };
    // SAFETY: `ops` is a live int32 scalar.
    match unsafe { check(&stream, recv, &op, None) } {
        Err(Error::CallFailed(m)) => assert_eq!(m, "host function raised"),
        other => panic!("unexpected {other:?}"),
    }
    let zero = [0u8; 4];
    let op = Operand { dtype: dtype::S32, data: zero.as_ptr(), dims: &[] };
    // SAFETY: as above.
    unsafe { check(&stream, recv, &op, None) }.unwrap();
    // hostfeed_failure writes the text, padded, into a uint8 result.
    let mut text = [1u8; 30];
    let t = out(&mut text, dtype::U8);
    let op = Operand { dtype: dtype::S32, data: ops.as_ptr(), dims: &[] };
    // SAFETY: as above; `text` outlives the copy (synchronised below).
    unsafe { failure(&stream, recv, delivery, 0, &op, &t) }.unwrap();
    stream.synchronize().unwrap();
    assert_eq!(&text[..20], b"host function raised");
    assert!(text[20..].iter().all(|&b| b == 0));
}

#[test]
fn a_call_without_its_int32_status_is_refused() {
    let (recv, _c, delivery) = setup(1 << 20);
    let stream = FakeStream::new();
    let h = Header { flags: FLAG_STATUS_OUTPUT, ..header(1, 0) };
    // SAFETY: refused before any copy.
    let got = unsafe { call(&stream, recv, delivery, h, &Attrs::default(), std::iter::empty(), &[], None) };
    assert!(matches!(got, Err(Error::InvalidArgument(_))));
}
