//! Per-device reservations against the byte bound, and the couriers that push each GPU
//! tap onto the queue once its copies completed, in the device's program order.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::error::Error;
use crate::host::buffer::HostBuffer;
use crate::host::hub::{in_consumer_thread, Hub};
use crate::host::message::Message;
use crate::host::sync::{lock, spin_until, Waker};

use crate::gpu::Completion;

/// How long a handler waiting for room under the bound sleeps between looks (it is woken
/// earlier by the consumer's progress).
const GATE_SLICE: Duration = Duration::from_millis(10);
/// How long a call looks for its device's courier to have delivered the taps before it,
/// before sleeping.
const IDLE_SPIN: Duration = Duration::from_micros(50);

/// What a courier does once a parcel's marker completed.
#[allow(clippy::large_enum_variant)] // moved once into its parcel; boxing would allocate per tap
pub(crate) enum Job {
    /// Pushes a tap's message (its copies completed) and ends its reservation.
    Deliver { msg: Message, hub: &'static Hub, reserved: usize },
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
pub(crate) fn admits(mine: usize, held: usize, bytes: usize, bound: usize) -> bool {
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
    pub(crate) const fn new() -> Self {
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
    #[cfg(test)]
    #[must_use]
    pub(crate) const fn with_gate_slice(slice: Duration) -> Self {
        let mut d = Self::new();
        d.gate_slice = slice;
        d
    }

    #[cfg(test)]
    /// Bytes reserved for device `ordinal` and not yet pushed.
    pub(crate) fn reserved(&self, ordinal: i32) -> usize {
        lock(&self.transit).get(index(ordinal)).copied().unwrap_or(0)
    }

    /// Reserves `bytes` for device `ordinal`, waiting while its bytes in flight plus the
    /// queue's would exceed the receiver's bound (a message alone may exceed it when the
    /// device has nothing in flight and the queue holds nothing).
    ///
    /// # Errors
    /// The receiver shut down, or no consumer could be started.
    pub(crate) fn reserve(&self, hub: &'static Hub, ordinal: i32, bytes: usize) -> Result<(), Error> {
        let i = index(ordinal);
        // A computation run from inside a host callback: the consumer is this thread, so
        // waiting for it would never end (as `Hub::push` admits such a message).
        let on_consumer = in_consumer_thread();
        let stats = &hub.queue.stats;
        let mut blocked_since: Option<Instant> = None;
        let outcome = loop {
            if hub.is_finalized() {
                break Err(Error::Closed);
            }
            // Read before looking: a change after the look (the consumer's progress, or a
            // courier ending a reservation) changes it, so the wait below does not sleep
            // through it.
            let seen = hub.queue.wake_count();
            let held = hub.queue.held_bytes();
            {
                let mut t = lock(&self.transit);
                if t.len() <= i {
                    t.resize(i + 1, 0);
                }
                if on_consumer || admits(t[i], held, bytes, hub.queue.bound()) {
                    t[i] += bytes;
                    break Ok(());
                }
            }
            if blocked_since.is_none() {
                // Counted as the queue counts producers waiting for space.
                blocked_since = Some(Instant::now());
                stats.producer_blocked_count.fetch_add(1, Ordering::Relaxed);
            }
            if held > 0 && !hub.is_running() {
                if let Err(e) = hub.start() {
                    break Err(e); // nobody would make room
                }
            }
            hub.queue.wait_woken(seen, self.gate_slice);
        };
        if let Some(t0) = blocked_since {
            let ns = u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX);
            stats.producer_blocked_ns.fetch_add(ns, Ordering::Relaxed);
        }
        outcome
    }

    /// Ends a reservation made by [`Delivery::reserve`] for `hub`, waking the
    /// handlers waiting for room (the room may be theirs now: the device's message was
    /// lost, or the consumer completed it before this, or the device has nothing in
    /// flight any more).
    pub(crate) fn unreserve(&self, hub: &Hub, ordinal: i32, bytes: usize) {
        if let Some(b) = lock(&self.transit).get_mut(index(ordinal)) {
            *b = b.saturating_sub(bytes);
        }
        hub.queue.nudge();
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
    pub(crate) fn submit(&'static self, ordinal: i32, ready: Box<dyn Completion>, job: Job) {
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
                if let Job::Deliver { hub, .. } = &parcel.job {
                    hub.note(e.to_string());
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
            (Ok(()), Job::Deliver { msg, hub, reserved }) => {
                if let Err(e) = hub.push(msg) {
                    hub.note(format!("hostfeed: a tap from GPU {ordinal} could not be delivered: {e}"));
                }
                self.unreserve(hub, ordinal, reserved);
            }
            (Ok(()), Job::Release(buf)) => drop(buf),
            (Err(e), Job::Deliver { msg, hub, reserved }) => {
                hub.note(format!("hostfeed: a tap from GPU {ordinal} was lost: {e}"));
                std::mem::forget(msg); // a copy into it may not have completed
                self.unreserve(hub, ordinal, reserved);
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
    pub(crate) fn wait_idle(&self, ordinal: i32) {
        let courier = lock(&self.couriers).get(index(ordinal)).and_then(Clone::clone);
        let Some(c) = courier else { return };
        let target = lock(&c.state).submitted;
        // The courier usually delivers within microseconds (the call synchronised the
        // stream, so every marker before it completed): look a while before sleeping.
        if spin_until(IDLE_SPIN, || c.delivered.load(Ordering::Acquire) >= target) {
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
