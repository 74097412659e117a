//! Taps and calls on a GPU, written against a [`Stream`] (the device's work queue) so that
//! the logic is the same for any GPU platform and is tested with plain `cargo test`
//! against a fake stream; `cuda.rs` implements [`Stream`] with the CUDA driver API.
//!
//! ## Taps never make the device wait
//!
//! A tap handler runs on XLA's host thread, which *enqueues* the device's work; the
//! operands are produced by work still queued. So the handler:
//!
//! 1. lays the message out ([`message::layout`]) in one pinned buffer from the pool;
//! 2. reserves the message's bytes against the receiver's byte bound ([`Delivery::reserve`]),
//!    waiting (on the host thread: the device goes on with the work already enqueued)
//!    while this device's messages in flight plus the queue's would exceed it;
//! 3. enqueues an asynchronous device-to-host copy of each operand into the buffer, then
//!    records an *event* on the stream (a marker that completes when the copies have);
//! 4. hands (event, message) to the device's *courier* and returns.
//!
//! (The message holds the GPU's ordinal and the `FLAG_GPU` bit; Python gets the device as
//! [`device_key`], distinct from CPU devices.)
//!
//! The courier, a thread per device, waits for each event in turn and pushes the message
//! onto the queue. So the device never synchronises with the host, not even with a host
//! function (which would stall the stream until the driver's callback thread ran it): it
//! only runs the copies among its other work. The courier takes parcels in the order the
//! handler made them, which is the device's program order (the ordered-effect token
//! orders hostfeed's custom calls, on one stream or several), so each device's messages
//! reach the queue in order; devices interleave. The pinned buffer goes back to its pool
//! when the consumer drops the message (Python let go of the numpy views).
//!
//! Memory: what is reserved (in flight) plus what is queued stays within the bound per
//! device, as on CPU; a message alone may exceed it when nothing else is held. A courier
//! may still wait for queue space if CPU producers filled the queue meanwhile; the device
//! does not notice.
//!
//! `barrier_wait`, stop and exit first wait for the couriers to deliver what they were
//! handed ([`Delivery::wait_delivered`]): once JAX has seen the computations finish, every
//! event is complete, so this is quick.
//!
//! ## Calls block, by nature
//!
//! A call copies its operands to the host and synchronises the stream (its results are
//! needed before anything after it can run), waits for the courier to deliver the taps
//! before it (per-device order), enqueues the request and waits for the reply (shared
//! with CPU: [`handlers::await_reply`]), which the consumer writes into a pinned *staging*
//! buffer; the handler then enqueues host-to-device copies of the staging buffer into the
//! results, in stream order, and hands the buffer to the courier, which returns it to the
//! pool once an event after the copies completed. A failing call returns the same error
//! as on CPU (or, with a status result, zeros and the failure's ticket).
//!
//! ## Errors
//!
//! If enqueuing a copy or recording an event fails, the handler synchronises the stream
//! before the buffer can be reused (copies already enqueued might still write it) and
//! fails the computation. If even synchronising fails (the device is in an error state),
//! the buffer is leaked rather than reused; likewise when a courier's event reports an
//! error (the tap is then lost, with a note).
//!
//! No Python and no CUDA here.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::error::Error;
use crate::frame::Attrs;
use crate::handlers::{self, FLAG_GPU, FLAG_STATUS_OUTPUT};
use crate::hostbuf::{HostBuffer, ALIGN};
use crate::message::{self, Message, Operand};
use crate::receiver::{in_consumer_thread, Receiver};
use crate::reply::OutBuf;
use crate::sync::{lock, Waker};
use crate::xla_ffi::dtype;

/// How long a handler waiting for room under the bound sleeps between looks (it is woken
/// earlier by the consumer's progress).
const GATE_SLICE: Duration = Duration::from_millis(10);
/// How long a call looks for its device's courier to have delivered the taps before it,
/// before sleeping.
const IDLE_SPIN: Duration = Duration::from_micros(50);

/// A marker in a stream that completes when the work enqueued before it has.
pub trait Completion: Send {
    /// Waits until the marker completed.
    ///
    /// # Errors
    /// The device reported an error (the work before the marker may not have run).
    fn wait(&self) -> Result<(), Error>;
}

/// A device's queue of work, as the GPU handlers use it. Every operation is enqueued
/// after the work already in the stream and completes before the work enqueued later.
pub trait Stream {
    /// Enqueues a copy of `n` bytes from device address `src` to host memory `dst`.
    ///
    /// # Errors
    /// The copy could not be enqueued.
    ///
    /// # Safety
    /// `src` must be device memory readable for `n` bytes until the copy ran; `dst` must
    /// be pinned host memory writable for `n` bytes, untouched until the copy completed.
    unsafe fn copy_to_host(&self, dst: *mut u8, src: *const u8, n: usize) -> Result<(), Error>;

    /// Enqueues a copy of `n` bytes from host memory `src` to device address `dst`.
    ///
    /// # Errors
    /// The copy could not be enqueued.
    ///
    /// # Safety
    /// `src` must be pinned host memory readable for `n` bytes, unchanged and alive until
    /// the copy completed; `dst` must be device memory writable for `n` bytes.
    unsafe fn copy_to_device(&self, dst: *mut u8, src: *const u8, n: usize) -> Result<(), Error>;

    /// Records a marker that completes once the work enqueued so far has.
    ///
    /// # Errors
    /// The marker could not be recorded.
    fn record(&self) -> Result<Box<dyn Completion>, Error>;

    /// Waits until everything enqueued so far has completed.
    ///
    /// # Errors
    /// The device reported an error.
    fn synchronize(&self) -> Result<(), Error>;

    /// A buffer of pinned host memory of `len` bytes (from the pool).
    ///
    /// # Errors
    /// The memory cannot be had.
    fn host_buffer(&self, len: usize) -> Result<HostBuffer, Error>;
}

/// The key Python gets for a GPU's messages in place of its ordinal: `-2 - ordinal`, so
/// that it never equals a CPU device's ordinal (non-negative) nor the host's own messages'
/// -1 (eager taps, control messages); `receiver.device_for_ordinal` decodes it. In Rust,
/// `Message::device` keeps the ordinal and `FLAG_GPU` marks the message.
#[must_use]
pub fn device_key(ordinal: i32) -> i32 {
    -2 - ordinal
}

/// What a courier does once a parcel's marker completed.
pub enum Job {
    /// Pushes a tap's message (its copies completed) and ends its reservation.
    Deliver { msg: Message, receiver: &'static Receiver, reserved: usize },
    /// Drops a staging buffer whose copies to the device completed (back to its pool).
    Release(HostBuffer),
}

/// A marker and what to do once it completed.
struct Parcel {
    ready: Box<dyn Completion>,
    job: Job,
}

/// One device's courier: parcels in the order they were handed over.
struct Courier {
    state: Mutex<CourierState>,
    /// The courier thread sleeps here for parcels.
    work: Waker,
    /// Callers of [`Delivery::wait_idle`] sleep here.
    done: Waker,
    /// Mirror of `CourierState::delivered`, for [`Delivery::wait_idle`]'s look before it
    /// sleeps (without taking the lock the courier takes).
    delivered: AtomicU64,
}

#[derive(Default)]
struct CourierState {
    parcels: VecDeque<Parcel>,
    submitted: u64,
    delivered: u64,
}

/// Whether a message of `bytes` may be reserved when its device has `mine` bytes in flight
/// and the queue holds `held`: within the bound, or alone.
#[must_use]
pub fn admits(mine: usize, held: usize, bytes: usize, bound: usize) -> bool {
    (mine == 0 && held == 0)
        || mine.checked_add(held).and_then(|b| b.checked_add(bytes)).is_some_and(|b| b <= bound)
}

/// Per device: bytes of tap messages reserved and not yet pushed, and the courier.
pub struct Delivery {
    /// Reserved bytes, by device ordinal.
    transit: Mutex<Vec<usize>>,
    couriers: Mutex<Vec<Option<Arc<Courier>>>>,
    /// Parcels handed to any courier, and delivered, over the process's life.
    submitted: AtomicU64,
    delivered: Mutex<u64>,
    /// Mirror of `delivered`, readable without the lock.
    delivered_fast: AtomicU64,
    delivered_cv: Condvar,
    /// Longest sleep of a handler waiting for room before it looks again.
    gate_slice: Duration,
}

/// The delivery of the process's GPU handlers.
pub static DELIVERY: Delivery = Delivery::new();

fn index(ordinal: i32) -> usize {
    usize::try_from(ordinal).unwrap_or(0)
}

impl Delivery {
    /// Nothing in flight, no courier yet.
    #[must_use]
    pub const fn new() -> Self {
        Delivery {
            transit: Mutex::new(Vec::new()),
            couriers: Mutex::new(Vec::new()),
            submitted: AtomicU64::new(0),
            delivered: Mutex::new(0),
            delivered_fast: AtomicU64::new(0),
            delivered_cv: Condvar::new(),
            gate_slice: GATE_SLICE,
        }
    }

    /// As [`Delivery::new`], with handlers waiting for room looking again only every
    /// `slice` unless woken (tests: a missing wake-up then shows as a hang).
    #[must_use]
    pub const fn with_gate_slice(slice: Duration) -> Self {
        let mut d = Self::new();
        d.gate_slice = slice;
        d
    }

    /// Bytes reserved for device `ordinal` and not yet pushed.
    pub fn reserved(&self, ordinal: i32) -> usize {
        lock(&self.transit).get(index(ordinal)).copied().unwrap_or(0)
    }

    /// Reserves `bytes` for device `ordinal`, waiting while its bytes in flight plus the
    /// queue's would exceed the receiver's bound (a message alone may exceed it when the
    /// device has nothing in flight and the queue holds nothing).
    ///
    /// # Errors
    /// The receiver shut down, or no consumer could be started.
    pub fn reserve(&self, receiver: &'static Receiver, ordinal: i32, bytes: usize) -> Result<(), Error> {
        let i = index(ordinal);
        // A computation run from inside a host callback: the consumer is this thread, so
        // waiting for it would never end (as `Receiver::push` admits such a message).
        let on_consumer = in_consumer_thread();
        let stats = &receiver.queue.stats;
        let mut blocked_since: Option<Instant> = None;
        let outcome = loop {
            if receiver.is_finalized() {
                break Err(Error::Closed);
            }
            // Read before looking: a change after the look (the consumer's progress, or a
            // courier ending a reservation) changes it, so the wait below does not sleep
            // through it.
            let seen = receiver.queue.wake_count();
            let held = receiver.queue.held_bytes();
            {
                let mut t = lock(&self.transit);
                if t.len() <= i {
                    t.resize(i + 1, 0);
                }
                if on_consumer || admits(t[i], held, bytes, receiver.queue.bound()) {
                    t[i] += bytes;
                    break Ok(());
                }
            }
            if blocked_since.is_none() {
                // Counted as the queue counts producers waiting for space.
                blocked_since = Some(Instant::now());
                stats.producer_blocked_count.fetch_add(1, Ordering::Relaxed);
            }
            if held > 0 && !receiver.is_running() {
                if let Err(e) = receiver.start() {
                    break Err(e); // nobody would make room
                }
            }
            receiver.queue.wait_woken(seen, self.gate_slice);
        };
        if let Some(t0) = blocked_since {
            let ns = u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX);
            stats.producer_blocked_ns.fetch_add(ns, Ordering::Relaxed);
        }
        outcome
    }

    /// Ends a reservation made by [`Delivery::reserve`] for `receiver`, waking the
    /// handlers waiting for room (the room may be theirs now: the device's message was
    /// lost, or the consumer completed it before this, or the device has nothing in
    /// flight any more).
    pub fn unreserve(&self, receiver: &Receiver, ordinal: i32, bytes: usize) {
        if let Some(b) = lock(&self.transit).get_mut(index(ordinal)) {
            *b = b.saturating_sub(bytes);
        }
        receiver.queue.nudge();
    }

    fn courier(&'static self, ordinal: i32) -> Result<Arc<Courier>, Error> {
        let i = index(ordinal);
        let mut couriers = lock(&self.couriers);
        if couriers.len() <= i {
            couriers.resize_with(i + 1, || None);
        }
        if let Some(c) = &couriers[i] {
            return Ok(Arc::clone(c));
        }
        let c = Arc::new(Courier {
            state: Mutex::new(CourierState::default()),
            work: Waker::new(),
            done: Waker::new(),
            delivered: AtomicU64::new(0),
        });
        let c2 = Arc::clone(&c);
        std::thread::Builder::new()
            .name(format!("hostfeed-gpu{ordinal}"))
            .spawn(move || self.run_courier(ordinal, &c2))
            .map_err(|e| Error::Internal(format!("cannot spawn the courier thread of GPU {ordinal}: {e}")))?;
        couriers[i] = Some(Arc::clone(&c));
        Ok(c)
    }

    /// Hands `job` to device `ordinal`'s courier, to run once `ready` completed. If the
    /// courier thread cannot be started, waits for `ready` and runs the job here.
    pub fn submit(&'static self, ordinal: i32, ready: Box<dyn Completion>, job: Job) {
        self.submitted.fetch_add(1, Ordering::AcqRel);
        let parcel = Parcel { ready, job };
        match self.courier(ordinal) {
            Ok(courier) => {
                let mut g = lock(&courier.state);
                g.parcels.push_back(parcel);
                g.submitted += 1;
                drop(g);
                courier.work.notify_one();
            }
            Err(e) => {
                if let Job::Deliver { receiver, .. } = &parcel.job {
                    receiver.note(e.to_string());
                }
                self.deliver(ordinal, parcel);
            }
        }
    }

    /// The courier thread of device `ordinal`.
    fn run_courier(&'static self, ordinal: i32, c: &Courier) {
        loop {
            let parcel = {
                let mut g = lock(&c.state);
                loop {
                    if let Some(p) = g.parcels.pop_front() {
                        break p;
                    }
                    g = c.work.wait(g);
                }
            };
            self.deliver(ordinal, parcel);
            let mut g = lock(&c.state);
            g.delivered += 1;
            c.delivered.store(g.delivered, Ordering::Release);
            drop(g);
            c.done.notify_all();
        }
    }

    /// Waits for a parcel's marker, then does its job.
    fn deliver(&self, ordinal: i32, parcel: Parcel) {
        let Parcel { ready, job } = parcel;
        let outcome = ready.wait();
        drop(ready);
        match (outcome, job) {
            (Ok(()), Job::Deliver { msg, receiver, reserved }) => {
                if let Err(e) = receiver.push(msg) {
                    receiver.note(format!("hostfeed: a tap from GPU {ordinal} could not be delivered: {e}"));
                }
                self.unreserve(receiver, ordinal, reserved);
            }
            (Ok(()), Job::Release(buf)) => drop(buf),
            (Err(e), Job::Deliver { msg, receiver, reserved }) => {
                receiver.note(format!("hostfeed: a tap from GPU {ordinal} was lost: {e}"));
                std::mem::forget(msg); // a copy into it may not have completed
                self.unreserve(receiver, ordinal, reserved);
            }
            (Err(_), Job::Release(buf)) => std::mem::forget(buf),
        }
        let mut delivered = lock(&self.delivered);
        *delivered += 1;
        self.delivered_fast.store(*delivered, Ordering::Release);
        drop(delivered);
        self.delivered_cv.notify_all();
    }

    /// Waits until device `ordinal`'s courier has delivered every parcel handed to it so far.
    pub fn wait_idle(&self, ordinal: i32) {
        let courier = lock(&self.couriers).get(index(ordinal)).and_then(Clone::clone);
        let Some(c) = courier else { return };
        let target = lock(&c.state).submitted;
        // The courier usually delivers within microseconds (the call synchronised the
        // stream, so every marker before it completed): look a while before sleeping.
        if crate::queue::spin_until(IDLE_SPIN, || c.delivered.load(Ordering::Acquire) >= target) {
            return;
        }
        let mut g = lock(&c.state);
        while g.delivered < target {
            g = c.done.wait(g);
        }
    }

    /// Parcels handed to couriers so far (a target for [`Delivery::wait_delivered`]).
    pub fn submitted(&self) -> u64 {
        self.submitted.load(Ordering::Acquire)
    }

    /// Whether at least `target` parcels were delivered (no lock).
    pub fn delivered_at_least(&self, target: u64) -> bool {
        self.delivered_fast.load(Ordering::Acquire) >= target
    }

    /// Waits up to `timeout` until at least `target` parcels were delivered; returns
    /// whether they were.
    pub fn wait_delivered(&self, target: u64, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut g = lock(&self.delivered);
        while *g < target {
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            g = self.delivered_cv.wait_timeout(g, deadline - now).unwrap_or_else(PoisonError::into_inner).0;
        }
        true
    }
}

impl Default for Delivery {
    fn default() -> Self {
        Self::new()
    }
}

/// What a tap or call sends, besides its operands.
#[derive(Debug, Clone, Copy)]
pub struct Header {
    pub consumer_id: i64,
    pub flags: i64,
    /// XLA device ordinal of the executing GPU.
    pub ordinal: i32,
    pub run_id: i64,
}

/// A pinned buffer of `len` bytes, or an empty heap one when `len` is 0.
fn buffer_for<S: Stream>(stream: &S, len: usize) -> Result<HostBuffer, Error> {
    if len == 0 {
        HostBuffer::with_capacity(0)
    } else {
        stream.host_buffer(len)
    }
}

/// After a failure with work possibly still writing `keep`: waits for the stream, then
/// drops `keep`; if even that fails, leaks it (never reuse memory a copy may write).
fn settle<S: Stream, T>(stream: &S, keep: T) {
    if stream.synchronize().is_ok() {
        drop(keep);
    } else {
        std::mem::forget(keep);
    }
}

/// A message for `operands` with a new (pinned) buffer, not yet filled.
fn new_message<'a>(
    stream: &impl Stream,
    header: Header,
    operands: impl Iterator<Item = Operand<'a>>,
) -> Result<Message, Error> {
    let lay = message::layout(operands)?;
    let mut data = buffer_for(stream, lay.capacity)?;
    data.set_len(lay.len());
    let mut msg = lay.into_message(header.consumer_id, header.flags | FLAG_GPU, header.ordinal, data);
    msg.run_id = header.run_id;
    Ok(msg)
}

/// Enqueues the copies of `operands` into `msg`'s buffer (laid out for them). On error,
/// some copies may be pending: the caller must [`settle`] the message.
///
/// # Safety
/// Each operand's `data` must be device memory readable for its bytes until the copies
/// ran (XLA's operand buffers, when called from a handler); `msg` must have been made by
/// [`new_message`] for the same operands.
unsafe fn enqueue_copies<'a>(
    stream: &impl Stream,
    msg: &mut Message,
    operands: impl Iterator<Item = Operand<'a>>,
) -> Result<(), Error> {
    let base = msg.data.as_mut_ptr();
    // Operands adjacent in device memory whose places in the message are adjacent too
    // (each but the last a multiple of ALIGN bytes: XLA often packs a call's operands
    // into one allocation) go in one copy: one driver call instead of several.
    let mut run: Option<(usize, *const u8, usize)> = None; // (offset, source, bytes)
    for (op, meta) in operands.zip(&msg.arrays) {
        if meta.nbytes == 0 {
            continue;
        }
        if let Some((offset, src, n)) = &mut run {
            if *offset + *n == meta.offset && src.wrapping_add(*n) == op.data {
                *n += meta.nbytes;
                continue;
            }
            // SAFETY: the run lies inside the message's pinned buffer (each operand's
            // offset + nbytes <= capacity), which nothing else uses until the copies
            // completed; its source is the caller's operands, one after the other.
            unsafe { stream.copy_to_host(base.add(*offset), *src, *n) }?;
        }
        run = Some((meta.offset, op.data, meta.nbytes));
    }
    if let Some((offset, src, n)) = run {
        // SAFETY: as above.
        unsafe { stream.copy_to_host(base.add(offset), src, n) }?;
    }
    Ok(())
}

/// The tap handler's body on a GPU (see the module documentation).
///
/// # Errors
/// Bad operands, no pinned memory, a failure to enqueue on the stream, a closed receiver.
///
/// # Safety
/// As [`enqueue_copies`].
pub unsafe fn tap<'a, S: Stream>(
    stream: &S,
    receiver: &'static Receiver,
    delivery: &'static Delivery,
    header: Header,
    operands: impl Iterator<Item = Operand<'a>> + Clone,
) -> Result<(), Error> {
    // Size the message first (its buffer's class decides its charge), then reserve, then
    // copy: nothing is enqueued for a message that cannot be admitted.
    let mut msg = new_message(stream, header, operands.clone())?;
    let reserved = msg.charged_bytes();
    delivery.reserve(receiver, header.ordinal, reserved)?;
    // SAFETY: caller contract; `msg` was laid out for these operands.
    let ready = unsafe { enqueue_copies(stream, &mut msg, operands) }.and_then(|()| stream.record());
    let ready = match ready {
        Ok(r) => r,
        Err(e) => {
            settle(stream, msg);
            delivery.unreserve(receiver, header.ordinal, reserved);
            return Err(e);
        }
    };
    delivery.submit(header.ordinal, ready, Job::Deliver { msg, receiver, reserved });
    Ok(())
}

/// Where each result of a call goes in its staging buffer.
struct Staging {
    buf: HostBuffer,
    /// (offset in `buf`, device address, bytes) per result; the status last, if any.
    slots: Vec<(usize, *mut u8, usize)>,
}

fn staging<S: Stream>(stream: &S, outs: &[OutBuf], status: Option<&OutBuf>) -> Result<Staging, Error> {
    let mut slots = Vec::with_capacity(outs.len() + 1);
    let mut total = 0usize;
    for o in outs.iter().chain(status) {
        slots.push((total, o.data, o.nbytes));
        total = total
            .checked_add(o.nbytes.next_multiple_of(ALIGN))
            .ok_or_else(|| Error::InvalidArgument("results too large".into()))?;
    }
    let mut buf = buffer_for(stream, total)?;
    buf.set_len(total);
    Ok(Staging { buf, slots })
}

/// Enqueues the copies of the staging buffer into the results, then hands the buffer to
/// the courier, which releases it once they completed.
fn write_back<S: Stream>(
    stream: &S,
    delivery: &'static Delivery,
    ordinal: i32,
    st: Staging,
) -> Result<(), Error> {
    if st.slots.iter().all(|&(_, _, n)| n == 0) {
        return Ok(()); // nothing to copy: the buffer is not in use
    }
    let base = st.buf.as_ptr();
    for &(offset, dst, n) in &st.slots {
        if n > 0 {
            // SAFETY: `dst` is an XLA result buffer of `n` bytes on this stream's device;
            // the source lies inside the staging buffer, kept alive (and unchanged) until
            // the courier saw a marker recorded after the copy.
            if let Err(e) = unsafe { stream.copy_to_device(dst, base.add(offset), n) } {
                settle(stream, st.buf);
                return Err(e);
            }
        }
    }
    let ready = match stream.record() {
        Ok(r) => r,
        Err(e) => {
            settle(stream, st.buf);
            return Err(e);
        }
    };
    delivery.submit(ordinal, ready, Job::Release(st.buf));
    Ok(())
}

/// The call handler's body on a GPU: `outputs` are the call's result buffers (device
/// memory) after the status, which `status` is when the call reports through one.
///
/// # Errors
/// As on CPU: the host function's failure (unless reported through `status`), timeouts,
/// interruptions; failures to enqueue on the stream.
///
/// # Safety
/// As [`enqueue_copies`]; each output must be device memory writable for its bytes.
#[allow(clippy::too_many_arguments)] // the pieces of a decoded frame
pub unsafe fn call<'a, S: Stream>(
    stream: &S,
    receiver: &'static Receiver,
    delivery: &'static Delivery,
    header: Header,
    attrs: &Attrs<'_>,
    operands: impl Iterator<Item = Operand<'a>> + Clone,
    outputs: &[OutBuf],
    status: Option<&OutBuf>,
) -> Result<(), Error> {
    if in_consumer_thread() {
        return Err(Error::InsideCallback(crate::handlers::waiting_computation(header.flags)));
    }
    if header.flags & FLAG_STATUS_OUTPUT != 0 && status.is_none_or(|s| s.dtype != dtype::S32 || s.nbytes != 4)
    {
        return Err(Error::InvalidArgument("status result must be an int32 scalar".into()));
    }
    let mut msg = new_message(stream, header, operands.clone())?;
    let st = staging(stream, outputs, status)?;
    // SAFETY: caller contract; `msg` was laid out for these operands.
    let copied = unsafe { enqueue_copies(stream, &mut msg, operands) };
    // The operands must be on the host before the request goes out.
    if let Err(e) = copied.and_then(|()| stream.synchronize()) {
        settle(stream, msg);
        return Err(e);
    }
    // The device's taps before this call reach the queue before it.
    delivery.wait_idle(header.ordinal);
    let base = st.buf.as_ptr().cast_mut();
    let outs: Vec<OutBuf> = outputs
        .iter()
        .zip(&st.slots)
        .map(|(o, &(offset, _, n))| OutBuf {
            dtype: o.dtype,
            // SAFETY: the slot lies inside the staging buffer.
            data: unsafe { base.add(offset) },
            nbytes: n,
            dims: o.dims.clone(),
        })
        .collect();
    let outcome = handlers::await_reply(receiver, attrs, msg, outs);
    if status.is_none() {
        outcome?;
        return write_back(stream, delivery, header.ordinal, st);
    }
    let code = match outcome {
        Ok(()) => 0,
        Err(e) => {
            for &(offset, _, n) in &st.slots {
                // SAFETY: inside the staging buffer, which nobody else writes any more
                // (the reply slot is no longer pending).
                unsafe { std::ptr::write_bytes(base.add(offset), 0, n) };
            }
            receiver.record_failure(e.to_string())
        }
    };
    let (status_offset, _, _) = st.slots[st.slots.len() - 1];
    // SAFETY: the status slot holds 4 bytes of the staging buffer.
    unsafe { base.add(status_offset).cast::<i32>().write_unaligned(code) };
    write_back(stream, delivery, header.ordinal, st)
}

/// Reads `n` bytes of device memory (synchronously: the stream is waited for).
///
/// # Safety
/// `src` must be device memory readable for `n` bytes.
unsafe fn read_device<S: Stream>(stream: &S, src: *const u8, n: usize) -> Result<Vec<u8>, Error> {
    let mut buf = buffer_for(stream, n)?;
    if n > 0 {
        // SAFETY: the pinned buffer holds `n` bytes; caller contract for `src`.
        if let Err(e) = unsafe { stream.copy_to_host(buf.as_mut_ptr(), src, n) } {
            settle(stream, buf);
            return Err(e);
        }
    }
    if let Err(e) = stream.synchronize() {
        std::mem::forget(buf);
        return Err(e);
    }
    // SAFETY: the copy of `n` bytes completed.
    Ok(unsafe { std::slice::from_raw_parts(buf.as_ptr(), n) }.to_vec())
}

/// The status operand of `hostfeed_check`/`hostfeed_failure`, read from the device.
///
/// # Safety
/// `status.data` must be device memory of an int32 scalar.
unsafe fn read_status<S: Stream>(stream: &S, status: &Operand<'_>, what: &str) -> Result<i32, Error> {
    if status.dtype != dtype::S32 || !status.dims.is_empty() {
        return Err(Error::InvalidArgument(format!("{what} status must be an int32 scalar")));
    }
    // SAFETY: caller contract.
    let bytes = unsafe { read_device(stream, status.data, 4) }?;
    Ok(i32::from_ne_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
}

/// The check handler's body on a GPU (as `handlers::check`): `status` is the combined
/// status, `sent` the optional `uint8[n]` failure text from another process.
///
/// # Errors
/// The recorded failure when the status names one.
///
/// # Safety
/// The operands must be device memory of their dtypes and dims.
pub unsafe fn check<S: Stream>(
    stream: &S,
    receiver: &'static Receiver,
    status: &Operand<'_>,
    sent: Option<&Operand<'_>>,
) -> Result<(), Error> {
    // SAFETY: caller contract.
    let ticket = unsafe { read_status(stream, status, "hostfeed_check") }?;
    if ticket == 0 {
        return Ok(());
    }
    let text = match sent.filter(|b| b.dtype == dtype::U8) {
        Some(b) => {
            let n = b.dims.iter().map(|&d| usize::try_from(d).unwrap_or(0)).product();
            // SAFETY: caller contract: a uint8 buffer of `n` bytes.
            let raw = unsafe { read_device(stream, b.data, n) }?;
            let end = raw.iter().position(|&c| c == 0).unwrap_or(n);
            String::from_utf8_lossy(&raw[..end]).into_owned()
        }
        None => String::new(),
    };
    let text = if text.is_empty() { receiver.failure_message(ticket) } else { text };
    Err(Error::CallFailed(text))
}

/// The failure handler's body on a GPU (as `handlers::failure`): writes the message of
/// the failure recorded under `status` into `out` (`uint8[n]`).
///
/// # Errors
/// Bad operands, failures to enqueue on the stream.
///
/// # Safety
/// `status` must be device memory of an int32 scalar, `out` device memory of its bytes.
pub unsafe fn failure<S: Stream>(
    stream: &S,
    receiver: &'static Receiver,
    delivery: &'static Delivery,
    ordinal: i32,
    status: &Operand<'_>,
    out: &OutBuf,
) -> Result<(), Error> {
    if out.dtype != dtype::U8 {
        return Err(Error::InvalidArgument("hostfeed_failure needs a uint8 result".into()));
    }
    // SAFETY: caller contract.
    let ticket = unsafe { read_status(stream, status, "hostfeed_failure") }?;
    let text = if ticket == 0 { String::new() } else { receiver.failure_message(ticket) };
    let bytes = handlers::padded(text, out.nbytes);
    let mut st = staging(stream, std::slice::from_ref(out), None)?;
    // SAFETY: the staging buffer holds `out.nbytes` bytes at offset 0.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), st.buf.as_mut_ptr(), out.nbytes) };
    write_back(stream, delivery, ordinal, st)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pinned::{PinnedAlloc, PinnedPool};
    use crate::receiver::{Consume, Worker};
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
                    // Seen before the reply, as a host function runs before its call returns.
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

    fn setup(bound: usize) -> (&'static Receiver, Arc<Recording>, &'static Delivery) {
        let r: &'static Receiver = Box::leak(Box::new(Receiver::new(bound)));
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

    fn wait_all(recv: &'static Receiver, n: u64) {
        assert!(recv.wait_processed(n, Duration::from_secs(60)).unwrap(), "messages not processed");
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
                unsafe { tap(&*s2, recv, delivery, header(i, 0), [u8s(&data, &[4000])].into_iter()) }
                    .unwrap();
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
        assert_eq!(delivery.reserved(0), 0);
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
        assert_eq!(delivery.reserved(0), 0);
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
        let got = unsafe {
            tap(&stream, recv, delivery, header(1, 0), [u8s(&a, &[16]), u8s(&b, &[16])].into_iter())
        };
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
        recv: &'static Receiver,
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
        let got =
            unsafe { call(&stream, recv, delivery, h, &Attrs::default(), std::iter::empty(), &[], None) };
        assert!(matches!(got, Err(Error::InvalidArgument(_))));
    }
}
