//! The hub: the one place every handler pushes to and the consumer thread pulls from. It
//! owns the queue, the consumer thread's lifecycle (start, stop, restart, abandoning a
//! stuck consumer), the barrier, the `call`s waiting for replies and the failures they
//! report. (Python calls the whole native side "the receiver": `hostfeed.receiver`, the
//! only importer of the extension module `hostfeed._receiver`; in Rust that name is kept
//! for the variables that hold a [`Hub`], as in `receiver.push(msg)`.)
//!
//! The consumer thread runs a [`Consume`] implementation. The Python binding provides the
//! real one (the binding's `host.rs` and `messages.rs`: attach to Python, hand each batch
//! to the dispatcher); tests provide plain Rust ones, so this whole module is covered by `cargo test`.
//!
//! Lifecycle: the binding configures the receiver with its consumer and starts it. A
//! handler that finds no consumer running (after `stop_outfeed_receiver`, say) restarts it
//! from the stored configuration, so compiled code never strands messages. A consumer that
//! makes no progress for the stall timeout while stopping (a host callback that never
//! returns) is abandoned: the message it is stuck in is written off, the messages it had not
//! reached go back to the queue, the `call`s waiting on it fail, and a fresh consumer takes
//! over when needed. `finalize` (interpreter exit) drains, stops and closes for good.
//!
//! No Python here.

use std::cell::Cell;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::error::Error;
use crate::host::histogram::Timing;
use crate::host::message::{Message, FLAG_SYNC_TAP};
use crate::host::queue::{Nap, PushError, Queue, Reclaimed};
use crate::host::reply::ReplySlot;
use crate::host::sync::{lock, spin_until, AdaptiveSpin, Waker};

/// Default byte bound: `256e6`, the default of JAX's former `host_callback` module, which
/// hostfeed replaces.
pub const DEFAULT_MAX_QUEUE_BYTES: usize = 256_000_000;
/// Default time without progress after which stopping gives up on a stuck consumer.
pub const DEFAULT_STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// Most messages in one batch.
pub(crate) const MAX_BATCH: usize = 1024;
/// How long an idle consumer polls, yielding the CPU between looks, before sleeping (see
/// `Queue::with_spin`): not at all. Under load a yield can give the CPU away for a whole
/// scheduler time slice, so a polling consumer would take a message milliseconds late,
/// where a consumer woken from sleep takes it within microseconds.
const CONSUMER_SPIN: Duration = Duration::ZERO;
/// The longest an idle consumer spins (never yielding) before sleeping (see
/// `AdaptiveSpin`): a burst of calls or taps finds it awake while spinning pays, and it
/// stops spinning within a few waits when it does not (a loaded machine, taps far apart).
static CONSUMER_ADAPTIVE_SPIN: AdaptiveSpin = AdaptiveSpin::new(Duration::from_micros(100));
/// Then it naps (see `Queue::with_nap`): timed waits of this length, during which taps
/// and records do not wake it. Waking a sleeping thread costs the waker tens of
/// microseconds on a virtual machine, and the waker of a tap is the device's thread.
const CONSUMER_NAP_PERIOD: Duration = Duration::from_micros(50);
/// How long after it found the queue empty the consumer naps; then it sleeps until woken.
const CONSUMER_NAP_WINDOW: Duration = Duration::from_millis(2);

/// Messages a napping consumer must take at once: a call's device waits for its reply, a
/// synchronous tap's for its callback.
fn urgent(msg: &Message) -> bool {
    msg.reply.is_some() || msg.flags & FLAG_SYNC_TAP != 0
}

/// How long a consumer that took a batch during an inline run spins (never yielding)
/// before sleeping until the run ends (see `AdaptiveSpin`).
static INLINE_WAIT_SPIN: AdaptiveSpin = AdaptiveSpin::new(Duration::from_micros(100));

/// How long a call polls (yielding between rounds) for the consumer to finish what is
/// pending before it queues itself instead of running on its device's thread. Not
/// adaptive: the consumer usually ends its batch within a microsecond of answering the
/// previous call, and a call that queued itself leaves the consumer busy at the next, so
/// a budget that fell to nothing would keep every later call on the consumer thread.
const INLINE_IDLE_SPIN: Duration = Duration::from_micros(20);

/// How long a barrier polls before sleeping.
const BARRIER_SPIN: Duration = Duration::from_micros(100);
/// Failure messages kept for `hostfeed_check` to find.
const KEPT_FAILURES: usize = 256;

thread_local! {
    static IS_CONSUMER: Cell<bool> = const { Cell::new(false) };
}

/// Whether the calling thread is a consumer thread (i.e. inside a host callback).
#[must_use]
pub fn in_consumer_thread() -> bool {
    IS_CONSUMER.with(Cell::get)
}

/// What runs on the consumer thread.
pub trait Consume: Send + Sync + 'static {
    /// Processes batches from `worker` until `Worker::next_batch` returns `None`.
    fn run(&self, worker: &Worker);

    /// Runs one `call` request on the calling thread, the device's (see `Hub::run_inline`),
    /// answering its reply slot; or gives it back, unrun, when this consumer cannot run it
    /// there (its host function is not a plain call's, or other host work must come first).
    ///
    /// # Errors
    /// The message, untouched, to be queued for the consumer thread instead.
    #[allow(clippy::result_large_err)] // the message moves back once; boxing would allocate
    fn run_inline(&self, msg: Message) -> Result<(), Message> {
        Err(msg)
    }
}

/// The consumer thread's access to the receiver.
pub struct Worker {
    receiver: &'static Hub,
    generation: u64,
}

impl Worker {
    /// Waits for the next batch; `None` when the consumer must exit (stopped, closed, or
    /// abandoned in favour of a newer consumer).
    #[must_use]
    pub(crate) fn next_batch(&self) -> Option<Batch> {
        let r = self.receiver;
        if r.generation.load(Ordering::Acquire) != self.generation {
            return None;
        }
        if r.inline.load(Ordering::Acquire) == 0 {
            r.mark_idle();
        }
        let epoch = r.queue.begin_batch(MAX_BATCH)?;
        r.enter_batch(self.generation);
        Some(Batch { receiver: r, epoch, generation: self.generation })
    }
}

/// A batch of messages being processed. Messages are taken one at a time so that a
/// consumer stuck in one of them can be relieved of the rest ([`Queue::reclaim_batch`]).
/// Ending (or dropping) the batch completes what was taken.
pub struct Batch {
    receiver: &'static Hub,
    epoch: u64,
    /// The consumer generation that took it (an abandoned consumer's batch may end later).
    generation: u64,
}

impl Batch {
    /// The next message, or `None` when the batch is exhausted (or was reclaimed).
    #[must_use]
    pub fn take(&self) -> Option<Message> {
        self.take_if(|_| true)
    }

    /// The next message if `accept` accepts it (it runs under the batch's lock: it must
    /// only look at the message); `None` when the batch is exhausted or `accept` refused.
    #[must_use]
    pub fn take_if(&self, accept: impl FnOnce(&Message) -> bool) -> Option<Message> {
        let m = self.receiver.queue.take_if(self.epoch, accept)?;
        let now = self.receiver.timing.raw_now();
        self.receiver.timing.record_handover_at(m.queued_at, now);
        self.receiver.mark_busy(m.consumer_id, now);
        Some(m)
    }

    /// The next message if `accept` accepts it, with its bytes still charged after the
    /// batch ends (see [`Queue::take_retained`]): the caller owes `release` of the returned
    /// byte count (the recorder keeps rows until they are written).
    #[must_use]
    pub(crate) fn take_retained(&self, accept: impl FnOnce(&Message) -> bool) -> Option<(Message, usize)> {
        let (m, bytes) = self.receiver.queue.take_retained(self.epoch, accept)?;
        self.receiver.mark_busy(m.consumer_id, self.receiver.timing.raw_now());
        Some((m, bytes))
    }

    /// Messages not taken yet.
    #[must_use]
    pub fn remaining(&self) -> usize {
        self.receiver.queue.remaining(self.epoch)
    }
}

impl Drop for Batch {
    fn drop(&mut self) {
        // Before the batch counts as processed: whoever sees it processed (a barrier, a
        // call that would run on its device's thread) sees the consumer busy with none of
        // its messages and holding no batch. (Not the batch of an abandoned consumer whose
        // callback returned at last: a newer consumer may be busy.)
        if self.receiver.generation.load(Ordering::Acquire) == self.generation {
            self.receiver.mark_idle();
            self.receiver.in_batch.store(false, Ordering::SeqCst);
        }
        // Messages not taken (the dispatcher failed) are dropped and counted.
        let dropped = self.receiver.queue.end_batch(self.epoch);
        if dropped > 0 {
            self.receiver.note(format!("{dropped} message(s) were dropped after the dispatcher failed"));
        }
    }
}

/// What [`Hub::try_push`] did.
#[allow(clippy::large_enum_variant)] // the message moves once; boxing it would allocate when full
pub enum TryPush {
    /// Queued, and a consumer will process it.
    Pushed,
    /// Queued, but no consumer runs: call [`Hub::start`].
    NeedsConsumer,
    /// Not queued: it must wait for space; call [`Hub::push`].
    Full(Message),
}

/// How a stop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopOutcome {
    /// No consumer was running.
    NotRunning,
    /// The consumer drained the queue and exited.
    Joined,
    /// The consumer made no progress for the stall timeout and was abandoned.
    Abandoned(Abandoned),
}

/// What abandoning a stuck consumer did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Abandoned {
    /// How long it had made no progress.
    pub(crate) stalled_for: Duration,
    /// Waiting `call`s failed.
    pub(crate) failed_calls: usize,
    /// The batch it held.
    pub(crate) reclaimed: Reclaimed,
}

#[derive(Default)]
struct Control {
    thread: Option<JoinHandle<()>>,
    consumer: Option<Arc<dyn Consume>>,
}

/// Failure messages of `call`s that report through a status result, by ticket.
#[derive(Default)]
struct Failures {
    next: u64,
    kept: VecDeque<(i32, String)>,
}

/// See the module documentation.
pub struct Hub {
    /// The byte-bounded queue of messages for the consumer.
    pub queue: Queue<Message>,
    /// Device-side cost and hand-over latency histograms.
    pub timing: Timing,
    control: Mutex<Control>,
    finalized: AtomicBool,
    /// `call` handlers waiting for a reply, so that stopping can fail them.
    calls: Mutex<HashMap<u64, Arc<ReplySlot>>>,
    next_call: AtomicU64,
    failures: Mutex<Failures>,
    /// Bumped when a stuck consumer is abandoned; a consumer exits when it sees a newer one.
    generation: AtomicU64,
    /// Consumer id of the message being processed (-1: none), and since when.
    busy: AtomicI64,
    /// Raw cycle count (`Timing::raw_now`) when `busy` was set.
    busy_since: AtomicU64,
    /// The message being processed, by the order the consumer took it in (0: none).
    item: AtomicU64,
    takes: AtomicU64,
    /// The message the consumer was processing when a signal failed a waiting call (0:
    /// none), and the signal: see [`Hub::stalled_by_interrupt`].
    interrupted_item: AtomicU64,
    interrupted: Mutex<(u64, &'static str)>,
    /// Consumer names, for messages about them.
    names: Mutex<HashMap<i64, String>>,
    /// Things worth telling the user that happened where nobody could be told at once
    /// (taken by the binding and logged).
    notes: Mutex<Vec<String>>,
    has_notes: AtomicBool,
    /// Stall detection across [`Hub::drain_step`] calls: progress last seen, when.
    watch: Mutex<(u64, Instant)>,
    /// A host function running on a device's thread ([`Hub::run_inline`]): the consumer
    /// generation it started under, plus one; 0: none.
    inline: AtomicU64,
    /// Whether the consumer thread holds a batch (it runs host functions only then).
    in_batch: AtomicBool,
    /// Where a consumer with a batch waits for an inline run to end.
    inline_ended: (crate::host::sync::Mutex<()>, Waker),
}

static GLOBAL: OnceLock<Hub> = OnceLock::new();

/// The process-wide receiver (created on first use, not started).
pub fn global() -> &'static Hub {
    GLOBAL.get_or_init(|| Hub::new(DEFAULT_MAX_QUEUE_BYTES))
}

impl Hub {
    /// A receiver with a queue of `bound` bytes and no consumer.
    #[must_use]
    pub(crate) fn new(bound: usize) -> Self {
        Hub {
            queue: Queue::new(bound)
                .with_spin(CONSUMER_SPIN)
                .with_adaptive_spin(&CONSUMER_ADAPTIVE_SPIN)
                .with_nap(Nap { period: CONSUMER_NAP_PERIOD, window: CONSUMER_NAP_WINDOW, urgent }),
            timing: Timing::default(),
            control: Mutex::new(Control::default()),
            finalized: AtomicBool::new(false),
            calls: Mutex::new(HashMap::new()),
            next_call: AtomicU64::new(0),
            failures: Mutex::new(Failures::default()),
            generation: AtomicU64::new(0),
            busy: AtomicI64::new(-1),
            busy_since: AtomicU64::new(0),
            item: AtomicU64::new(0),
            takes: AtomicU64::new(0),
            interrupted_item: AtomicU64::new(0),
            interrupted: Mutex::new((0, "")),
            names: Mutex::new(HashMap::new()),
            notes: Mutex::new(Vec::new()),
            has_notes: AtomicBool::new(false),
            watch: Mutex::new((0, Instant::now())),
            inline: AtomicU64::new(0),
            in_batch: AtomicBool::new(false),
            inline_ended: (crate::host::sync::Mutex::new(()), Waker::new()),
        }
    }

    /// The consumer thread (of `generation`) took a batch: it may run host functions once
    /// no inline run is in progress (one host function at a time). An inline run of an
    /// older generation (abandoned with its consumer) does not hold it up.
    fn enter_batch(&self, generation: u64) {
        loop {
            self.in_batch.store(true, Ordering::SeqCst);
            if self.inline.load(Ordering::SeqCst) != generation + 1 {
                return;
            }
            self.in_batch.store(false, Ordering::SeqCst);
            let ended = || self.inline.load(Ordering::SeqCst) != generation + 1;
            if !INLINE_WAIT_SPIN.spin(ended) {
                let (m, waker) = &self.inline_ended;
                let mut g = lock(m);
                while !ended() {
                    g = waker.wait_timeout(g, Duration::from_millis(20));
                }
            }
        }
    }

    /// Runs a plain `call` request on the calling thread (the device's, which waits for the
    /// reply anyway) when nothing else is pending: no message is queued or being processed
    /// (so the device's earlier taps have all run) and the consumer thread holds no batch
    /// (one host function at a time: the consumer waits for this run before it takes the
    /// next). The reply slot is answered when this returns `Ok`.
    ///
    /// # Errors
    /// The message, untouched, when it must go through the queue instead.
    #[allow(clippy::result_large_err)] // the message moves back once; boxing would allocate
    pub(crate) fn run_inline(&'static self, msg: Message) -> Result<(), Message> {
        if self.is_finalized() || in_consumer_thread() {
            return Err(msg);
        }
        let Some(consumer) = lock(&self.control).consumer.clone() else { return Err(msg) };
        let generation = self.generation.load(Ordering::Acquire);
        // The consumer may be finishing what came before (its batch ends just after it
        // answers the previous call): worth a short wait, since the call would wait for it
        // anyway behind the queue.
        let idle = || !self.in_batch.load(Ordering::SeqCst) && self.queue.processed() >= self.queue.enqueued();
        if !idle() && !spin_until(INLINE_IDLE_SPIN, idle) {
            return Err(msg);
        }
        self.inline.store(generation + 1, Ordering::SeqCst);
        let idle = idle();
        let outcome = if idle {
            let now = self.timing.raw_now();
            self.mark_busy(msg.consumer_id, now);
            IS_CONSUMER.with(|c| c.set(true));
            let outcome = consumer.run_inline(msg);
            IS_CONSUMER.with(|c| c.set(false));
            self.mark_idle();
            outcome
        } else {
            Err(msg)
        };
        // Under the lock a waiting consumer checks it under (the `Waker` contract).
        let (m, waker) = &self.inline_ended;
        let g = lock(m);
        self.inline.store(0, Ordering::SeqCst);
        drop(g);
        waker.notify_all();
        outcome
    }

    /// Records that the consumer took a message of consumer `id` at `now` (a raw
    /// timestamp; this runs for every message).
    fn mark_busy(&self, id: i64, now: u64) {
        self.busy.store(id, Ordering::Relaxed);
        self.busy_since.store(now, Ordering::Relaxed);
        self.item.store(self.takes.fetch_add(1, Ordering::Relaxed) + 1, Ordering::Release);
    }

    /// Records that the consumer is not processing any message.
    fn mark_idle(&self) {
        self.busy.store(-1, Ordering::Relaxed);
        self.item.store(0, Ordering::Release);
    }

    /// Records that signal `why` failed a waiting call: the message the consumer is
    /// processing now (a host function that may never return) stalls every call behind it.
    pub fn note_interrupted(&self, why: &'static str) {
        let item = self.item.load(Ordering::Acquire);
        if item != 0 {
            *lock(&self.interrupted) = (item, why);
            self.interrupted_item.store(item, Ordering::Release);
        }
    }

    /// Whether the consumer is still processing the message it was processing when a
    /// signal failed a waiting call: then the consumer id of that message and the signal.
    /// A call would wait behind it, maybe forever (another device of the execution whose
    /// call the signal failed, coming to its own call later, and its peers with it in the
    /// collective that combines the calls' statuses), so it fails instead, until the
    /// consumer moves on (the host function returns, or stopping abandons it).
    pub(crate) fn stalled_by_interrupt(&self) -> Option<(i64, &'static str)> {
        let stalled = self.interrupted_item.load(Ordering::Acquire);
        if stalled == 0 || self.item.load(Ordering::Acquire) != stalled {
            return None;
        }
        let (item, why) = *lock(&self.interrupted);
        (item == stalled).then(|| (self.busy.load(Ordering::Relaxed), why))
    }

    /// Installs the consumer used by current and future consumer threads.
    ///
    /// Like every method that takes the control lock, a binding must call it without
    /// holding locks a consumer needs (for Python: detached), since `stop` holds that lock
    /// while waiting for the consumer.
    pub fn configure(&self, consumer: Arc<dyn Consume>) {
        lock(&self.control).consumer = Some(consumer);
    }

    /// Whether a consumer thread is running.
    pub fn is_running(&self) -> bool {
        lock(&self.control).thread.as_ref().is_some_and(|h| !h.is_finished())
    }

    /// Whether [`Hub::finalize`] ran.
    pub(crate) fn is_finalized(&self) -> bool {
        self.finalized.load(Ordering::Acquire)
    }

    /// Starts the consumer thread if none is running. Returns whether it started one.
    ///
    /// # Errors
    /// [`Error::Closed`] after `finalize`, [`Error::NotConfigured`] before `configure`.
    pub fn start(&'static self) -> Result<bool, Error> {
        let mut control = lock(&self.control);
        if self.is_finalized() {
            return Err(Error::Closed);
        }
        if let Some(handle) = &control.thread {
            if !handle.is_finished() {
                return Ok(false);
            }
            // The thread ended on its own (only after a panic): replace it.
            if let Some(handle) = control.thread.take() {
                if handle.join().is_err() {
                    self.note("the consumer thread panicked; a new one was started".into());
                }
            }
        }
        let consumer = control.consumer.clone().ok_or(Error::NotConfigured)?;
        self.queue.clear_stop();
        let generation = self.generation.load(Ordering::Acquire);
        let handle = std::thread::Builder::new()
            .name("hostfeed-consumer".into())
            .spawn(move || consumer_main(self, &*consumer, generation))
            .map_err(|e| Error::Internal(format!("cannot spawn the consumer thread: {e}")))?;
        control.thread = Some(handle);
        Ok(true)
    }

    /// Enqueues a message from a handler, starting the consumer if none runs.
    ///
    /// # Errors
    /// [`Error::Closed`] after `finalize`; start errors.
    pub fn push(&'static self, msg: Message) -> Result<(), Error> {
        let bytes = msg.charged_bytes();
        let mut msg = msg;
        if msg.queued_at == 0 {
            msg.queued_at = self.timing.now();
        }
        // A tap issued from inside a host callback runs on the consumer thread: waiting for
        // the consumer to make space would wait for ourselves.
        let on_consumer = in_consumer_thread();
        loop {
            let pushed = if on_consumer {
                self.queue.push_over_bound(msg, bytes)
            } else {
                self.queue.push(msg, bytes)
            };
            match pushed {
                Ok(pushed) => {
                    if !pushed.consumer_active {
                        self.start()?;
                    }
                    return Ok(());
                }
                Err(PushError::Closed(_)) => return Err(Error::Closed),
                Err(PushError::NoConsumer(m) | PushError::WouldBlock(m)) => {
                    // The message must wait for space, and nobody would make space.
                    self.start()?;
                    msg = m;
                }
            }
        }
    }

    /// Enqueues a message without waiting for space or starting a consumer, for a caller
    /// that holds a resource the consumer needs (the GIL) and must release it before it
    /// waits or takes the control lock.
    ///
    /// # Errors
    /// [`Error::Closed`] after `finalize`.
    pub fn try_push(&self, mut msg: Message) -> Result<TryPush, Error> {
        let bytes = msg.charged_bytes();
        msg.queued_at = self.timing.now();
        match self.queue.try_push(msg, bytes) {
            Ok(pushed) if pushed.consumer_active => Ok(TryPush::Pushed),
            Ok(_) => Ok(TryPush::NeedsConsumer),
            Err(PushError::WouldBlock(m) | PushError::NoConsumer(m)) => Ok(TryPush::Full(m)),
            Err(PushError::Closed(_)) => Err(Error::Closed),
        }
    }

    /// Records a waiting `call`; returns its id for [`Hub::end_call`].
    pub(crate) fn begin_call(&self, slot: Arc<ReplySlot>) -> u64 {
        let call_id = self.next_call.fetch_add(1, Ordering::Relaxed);
        lock(&self.calls).insert(call_id, slot);
        call_id
    }

    /// Forgets a `call` that stopped waiting.
    pub(crate) fn end_call(&self, call_id: u64) {
        lock(&self.calls).remove(&call_id);
    }

    /// Fails every waiting `call` with `message`; returns how many were failed.
    pub(crate) fn cancel_calls(&self, message: &str) -> usize {
        let slots: Vec<Arc<ReplySlot>> = lock(&self.calls).values().cloned().collect();
        slots.iter().filter(|s| s.fail(message.to_string())).count()
    }

    /// Records a `call` failure and returns its ticket (a positive `i32`).
    pub(crate) fn record_failure(&self, message: String) -> i32 {
        let mut f = lock(&self.failures);
        let ticket = i32::try_from(f.next % (i32::MAX as u64 - 1)).unwrap_or(0) + 1;
        f.next += 1;
        if f.kept.len() >= KEPT_FAILURES {
            f.kept.pop_front();
        }
        f.kept.push_back((ticket, message));
        ticket
    }

    /// The message recorded under `ticket`.
    #[must_use]
    pub(crate) fn failure_message(&self, ticket: i32) -> String {
        lock(&self.failures)
            .kept
            .iter()
            .rev()
            .find(|(t, _)| *t == ticket)
            .map_or_else(|| format!("hostfeed: a host call failed (ticket {ticket})"), |(_, m)| m.clone())
    }

    /// Remembers `name` for consumer `id` (used in messages about it).
    pub fn set_name(&self, id: i64, name: String) {
        lock(&self.names).insert(id, name);
    }

    /// The name of consumer `id`, or `#id`.
    #[must_use]
    pub(crate) fn name(&self, id: i64) -> String {
        lock(&self.names).get(&id).cloned().unwrap_or_else(|| format!("#{id}"))
    }

    /// What the consumer is processing now: the consumer id and for how long.
    #[must_use]
    pub(crate) fn busy_with(&self) -> Option<(i64, Duration)> {
        let id = self.busy.load(Ordering::Relaxed);
        (id >= 0).then(|| {
            let since = self.busy_since.load(Ordering::Relaxed);
            (id, Duration::from_nanos(self.timing.nanos_between(since, self.timing.raw_now())))
        })
    }

    /// Keeps a note for the binding to report.
    pub fn note(&self, text: String) {
        lock(&self.notes).push(text);
        self.has_notes.store(true, Ordering::Release);
    }

    /// Takes the notes kept so far (without locking when there are none).
    pub fn take_notes(&self) -> Vec<String> {
        if !self.has_notes.swap(false, Ordering::AcqRel) {
            return Vec::new();
        }
        std::mem::take(&mut *lock(&self.notes))
    }

    /// Waits up to `timeout` until `target` messages are processed; returns whether they
    /// were. Starts a consumer if messages are pending and none runs.
    ///
    /// # Errors
    /// Start errors.
    pub fn wait_processed(&'static self, target: u64, timeout: Duration) -> Result<bool, Error> {
        if self.queue.processed() >= target {
            return Ok(true);
        }
        if !self.is_finalized() && !self.is_running() {
            self.start()?;
        }
        // The consumer usually finishes within microseconds; a sleeping waiter costs a
        // wake-up system call and a scheduler round trip (tens of microseconds on VMs).
        self.queue.wake_napping();
        let spin = BARRIER_SPIN.min(timeout);
        if !spin.is_zero() && spin_until(spin, || self.queue.processed() >= target) {
            return Ok(true);
        }
        Ok(self.queue.wait_processed(target, timeout.saturating_sub(spin)))
    }

    /// One step of draining while something else (computations finishing) is awaited:
    /// makes sure a consumer runs while messages are pending, abandons it if it made no
    /// progress for `stall` since the last steps saw progress, then waits up to `slice`
    /// for progress. Returns `Some` when it abandoned a consumer.
    ///
    /// # Errors
    /// Start errors.
    pub fn drain_step(
        &'static self,
        stall: Option<Duration>,
        slice: Duration,
    ) -> Result<Option<Abandoned>, Error> {
        let progress = self.queue.progress();
        let pending = self.queue.processed() < self.queue.enqueued();
        let mut abandoned = None;
        {
            let mut w = lock(&self.watch);
            if progress != w.0 || !pending {
                *w = (progress, Instant::now());
            } else if stall.is_some_and(|s| w.1.elapsed() >= s) {
                let stalled_for = w.1.elapsed();
                *w = (progress, Instant::now());
                drop(w);
                let mut control = lock(&self.control);
                if control.thread.is_some() {
                    abandoned = Some(self.abandon(&mut control, stalled_for));
                }
            }
        }
        if pending && !self.is_finalized() && !self.is_running() {
            self.start()?;
        }
        if pending {
            self.queue.wait_progress(progress, slice);
        }
        Ok(abandoned)
    }

    /// Abandons the running consumer: it is stuck (made no progress for `stalled_for`).
    fn abandon(&self, control: &mut Control, stalled_for: Duration) -> Abandoned {
        self.generation.fetch_add(1, Ordering::AcqRel);
        control.thread = None; // detached: it exits if its callback ever returns
        let reclaimed = self.queue.reclaim_batch();
        self.queue.consumer_exited();
        let name = self.busy_with().map_or_else(|| "?".to_string(), |(id, _)| self.name(id));
        self.mark_idle();
        let failed_calls = self.cancel_calls(&format!(
            "hostfeed: the host callback {name} made no progress for {:.1} s \
             (HOSTFEED_STOP_TIMEOUT) while the receiver was stopping; this call was failed \
             instead of waiting forever",
            stalled_for.as_secs_f64()
        ));
        let abandoned = Abandoned { stalled_for, failed_calls, reclaimed };
        self.note(format!(
            "the host callback {name} made no progress for {:.1} s; its receiver thread was \
             abandoned ({} message(s) written off, {} handed to a new thread, {failed_calls} \
             waiting call(s) failed)",
            stalled_for.as_secs_f64(),
            reclaimed.written_off,
            reclaimed.requeued
        ));
        abandoned
    }

    /// Lets the consumer drain the queue, then stops and joins it. If it makes no progress
    /// for `stall` (`None`: wait forever), it is abandoned (see the module documentation).
    ///
    /// # Errors
    /// [`Error::InsideCallback`] when called from a host callback.
    pub fn stop(&'static self, stall: Option<Duration>) -> Result<StopOutcome, Error> {
        if in_consumer_thread() {
            return Err(Error::InsideCallback("stop_outfeed_receiver"));
        }
        // Hold the control lock through the join so that a handler that needs a consumer
        // waits for this stop to finish and then starts a fresh one.
        let mut control = lock(&self.control);
        let Some(handle) = control.thread.take() else { return Ok(StopOutcome::NotRunning) };
        self.queue.request_stop();
        let mut seen = (self.queue.progress(), Instant::now());
        while !handle.is_finished() {
            let progress = self.queue.progress();
            if progress != seen.0 {
                seen = (progress, Instant::now());
            } else if stall.is_some_and(|s| seen.1.elapsed() >= s) {
                control.thread = Some(handle);
                return Ok(StopOutcome::Abandoned(self.abandon(&mut control, seen.1.elapsed())));
            }
            self.queue.wait_progress(progress, Duration::from_millis(20));
        }
        if handle.join().is_err() {
            self.note("the consumer thread panicked".into());
        }
        Ok(StopOutcome::Joined)
    }

    /// In a child process created by `fork`: the consumer thread (and every other thread)
    /// exists only in the parent, so the child starts with a fresh, stopped receiver: the
    /// parent's thread is forgotten (never joined: it is not there), queued messages and
    /// waiting calls are written off. The next message starts a consumer as usual.
    pub fn after_fork_in_child(&self) {
        if let Some(mut control) = crate::host::sync::try_lock(&self.control) {
            std::mem::forget(control.thread.take());
        }
        if let Some(mut calls) = crate::host::sync::try_lock(&self.calls) {
            std::mem::forget(std::mem::take(&mut *calls));
        }
        self.queue.reset_after_fork();
        self.mark_idle();
    }

    /// Processes what is queued (restarting the consumer once after abandoning a stuck
    /// one), then stops the receiver for good: later messages are refused, waiting calls
    /// fail. Returns the messages that could not be processed (dropped).
    ///
    /// # Errors
    /// As [`Hub::stop`].
    pub fn finalize(&'static self, stall: Option<Duration>) -> Result<usize, Error> {
        let mut abandons = 0;
        loop {
            let outcome = self.stop(stall)?;
            let pending = self.queue.processed() < self.queue.enqueued();
            if matches!(outcome, StopOutcome::Abandoned(_)) {
                abandons += 1;
            }
            if !pending || abandons >= 2 {
                break;
            }
            self.start()?;
        }
        let mut control = lock(&self.control);
        self.finalized.store(true, Ordering::Release);
        self.cancel_calls("hostfeed: the receiver shut down (interpreter exit)");
        let leftovers = self.queue.close();
        control.consumer = None;
        drop(control);
        if !leftovers.is_empty() {
            self.note(format!("{} message(s) were still queued at exit and were dropped", leftovers.len()));
        }
        Ok(leftovers.len())
    }
}

/// Marks the consumer as gone when its thread ends, however it ends (unless it was
/// abandoned, in which case a newer consumer may be running).
struct ExitGuard(&'static Hub, u64);

impl Drop for ExitGuard {
    fn drop(&mut self) {
        if self.0.generation.load(Ordering::Acquire) == self.1 {
            self.0.mark_idle();
            self.0.queue.consumer_exited();
        }
    }
}

fn consumer_main(receiver: &'static Hub, consumer: &dyn Consume, generation: u64) {
    IS_CONSUMER.with(|c| c.set(true));
    let _guard = ExitGuard(receiver, generation);
    consumer.run(&Worker { receiver, generation });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::message::gather;
    use std::sync::mpsc;

    fn leak(bound: usize) -> &'static Hub {
        Box::leak(Box::new(Hub::new(bound)))
    }

    fn message(consumer_id: i64) -> Message {
        // SAFETY: no operands are read.
        unsafe { gather(consumer_id, 0, 0, std::iter::empty()) }.unwrap()
    }

    /// A consumer that records consumer ids and runs `hook` on each.
    struct Recording<F: Fn(i64) + Send + Sync + 'static> {
        seen: Mutex<Vec<i64>>,
        hook: F,
    }

    impl<F: Fn(i64) + Send + Sync + 'static> Consume for Recording<F> {
        fn run(&self, worker: &Worker) {
            while let Some(batch) = worker.next_batch() {
                while let Some(m) = batch.take() {
                    (self.hook)(m.consumer_id);
                    lock(&self.seen).push(m.consumer_id);
                }
            }
        }
    }

    fn recording<F: Fn(i64) + Send + Sync + 'static>(r: &'static Hub, hook: F) -> Arc<Recording<F>> {
        let c = Arc::new(Recording { seen: Mutex::new(Vec::new()), hook });
        r.configure(c.clone());
        c
    }

    /// A consumer that logs what it runs, where: `("queue", id)` on its thread, and
    /// `("inline", id)` for what a device's thread runs through `run_inline` (which waits
    /// for the test's go-ahead when `hold_inline` is set).
    struct Logging {
        log: Mutex<Vec<(&'static str, i64)>>,
        hold_inline: Mutex<Option<(mpsc::Sender<()>, mpsc::Receiver<()>)>>,
        hold_queue: Mutex<Option<(mpsc::Sender<()>, mpsc::Receiver<()>)>>,
    }

    impl Consume for Logging {
        fn run(&self, worker: &Worker) {
            while let Some(batch) = worker.next_batch() {
                while let Some(m) = batch.take() {
                    if let Some((entered, go)) = lock(&self.hold_queue).take() {
                        entered.send(()).unwrap();
                        go.recv().unwrap();
                    }
                    lock(&self.log).push(("queue", m.consumer_id));
                }
            }
        }

        fn run_inline(&self, msg: Message) -> Result<(), Message> {
            assert!(in_consumer_thread(), "an inline run counts as inside a callback");
            if let Some((entered, go)) = lock(&self.hold_inline).take() {
                entered.send(()).unwrap();
                go.recv().unwrap();
            }
            lock(&self.log).push(("inline", msg.consumer_id));
            Ok(())
        }
    }

    fn logging(r: &'static Hub) -> Arc<Logging> {
        let c = Arc::new(Logging { log: Mutex::new(Vec::new()), hold_inline: Mutex::new(None), hold_queue: Mutex::new(None) });
        r.configure(c.clone());
        c
    }

    /// A pair of channels holding a run until the test lets it go: `(entered, go)` for the
    /// run, `(entered_rx, go_tx)` for the test.
    #[allow(clippy::type_complexity)]
    fn hold() -> ((mpsc::Sender<()>, mpsc::Receiver<()>), (mpsc::Receiver<()>, mpsc::Sender<()>)) {
        let (entered_tx, entered_rx) = mpsc::channel();
        let (go_tx, go_rx) = mpsc::channel();
        ((entered_tx, go_rx), (entered_rx, go_tx))
    }

    /// A hub with a logging consumer that has processed message 1 (so it runs, and is idle).
    fn logging_after_one() -> (&'static Hub, Arc<Logging>) {
        let r = leak(1 << 20);
        let c = logging(r);
        r.push(message(1)).unwrap();
        assert!(r.wait_processed(r.queue.enqueued(), Duration::from_secs(30)).unwrap());
        (r, c)
    }

    /// Waits until everything is processed, checks it ran as message 1 queued, 2 inline, 3
    /// queued, and stops.
    fn ends_as_queue_inline_queue(r: &'static Hub, c: &Logging) {
        assert!(r.wait_processed(r.queue.enqueued(), Duration::from_secs(30)).unwrap());
        assert_eq!(*lock(&c.log), vec![("queue", 1), ("inline", 2), ("queue", 3)]);
        r.stop(None).unwrap();
    }

    #[test]
    fn a_call_runs_inline_when_nothing_is_pending_and_is_given_back_otherwise() {
        let (r, c) = logging_after_one();
        assert!(r.run_inline(message(2)).is_ok());
        assert!(!in_consumer_thread(), "the inline run's mark is removed");
        // The consumer is stuck in message 3: a call finds it pending and is given back.
        let (run_side, (entered, go)) = hold();
        *lock(&c.hold_queue) = Some(run_side);
        r.push(message(3)).unwrap();
        entered.recv().unwrap();
        let back = r.run_inline(message(4)).expect_err("message 3 is still being processed");
        assert_eq!(back.consumer_id, 4);
        go.send(()).unwrap();
        ends_as_queue_inline_queue(r, &c);
    }

    #[test]
    fn the_consumer_waits_for_an_inline_run_before_it_runs_anything() {
        let (r, c) = logging_after_one();
        let (run_side, (entered, go)) = hold();
        *lock(&c.hold_inline) = Some(run_side);
        let inline = std::thread::spawn(move || r.run_inline(message(2)).is_ok());
        entered.recv().unwrap();
        // Another device's message arrives while the inline run holds: it waits.
        r.push(message(3)).unwrap();
        assert!(!r.wait_processed(r.queue.enqueued(), Duration::from_millis(50)).unwrap());
        go.send(()).unwrap();
        assert!(inline.join().unwrap());
        ends_as_queue_inline_queue(r, &c);
    }

    #[test]
    fn no_inline_run_without_a_consumer_or_after_finalize() {
        let r = leak(1 << 20);
        assert!(r.run_inline(message(1)).is_err(), "not configured");
        let c = logging(r);
        r.finalize(None).unwrap();
        assert!(r.run_inline(message(2)).is_err());
        assert!(lock(&c.log).is_empty());
    }

    #[test]
    fn push_starts_the_consumer_and_barrier_waits_for_processing() {
        let r = leak(1 << 20);
        let c = recording(r, |_| {});
        for i in 0..100 {
            r.push(message(i)).unwrap();
        }
        assert!(r.wait_processed(r.queue.enqueued(), Duration::from_secs(30)).unwrap());
        assert_eq!(*lock(&c.seen), (0..100).collect::<Vec<_>>());
        assert_eq!(r.stop(None).unwrap(), StopOutcome::Joined);
        assert!(!r.is_running());
    }

    #[test]
    fn stop_then_push_restarts() {
        let r = leak(1 << 20);
        let c = recording(r, |_| {});
        r.push(message(1)).unwrap();
        assert_eq!(r.stop(None).unwrap(), StopOutcome::Joined);
        assert_eq!(r.stop(None).unwrap(), StopOutcome::NotRunning);
        r.push(message(2)).unwrap();
        assert!(r.wait_processed(2, Duration::from_secs(30)).unwrap());
        assert_eq!(*lock(&c.seen), vec![1, 2]);
        r.stop(None).unwrap();
    }

    #[test]
    fn a_stuck_consumer_is_abandoned_and_the_rest_is_processed_by_a_new_one() {
        let r = leak(1 << 20);
        let (release_tx, release_rx) = mpsc::channel::<()>();
        let release_rx = Mutex::new(release_rx);
        let (entered_tx, entered_rx) = mpsc::channel::<()>();
        let entered_tx = Mutex::new(entered_tx);
        let c = recording(r, move |id| {
            if id == 2 {
                lock(&entered_tx).send(()).unwrap();
                // Stuck until the test releases it (after the abandon).
                lock(&release_rx).recv().unwrap();
            }
        });
        for i in 1..=4 {
            r.push(message(i)).unwrap();
        }
        entered_rx.recv().unwrap();
        let slot = Arc::new(ReplySlot::new(Vec::new()));
        let call_id = r.begin_call(Arc::clone(&slot));
        let outcome = r.stop(Some(Duration::from_millis(50))).unwrap();
        let StopOutcome::Abandoned(a) = outcome else { panic!("expected an abandon, got {outcome:?}") };
        assert_eq!(a.failed_calls, 1);
        assert!(!slot.is_pending(), "the waiting call was failed");
        r.end_call(call_id);
        // Messages 1 and 2 were taken (2 is written off, with 1 if both came in one batch);
        // 3 and 4 went back to the queue.
        assert!(matches!(a.reclaimed.written_off, 1 | 2), "{a:?}");
        assert_eq!(a.reclaimed.requeued, 2);
        assert_eq!(r.queue.processed(), 2);
        assert!(!r.take_notes().is_empty());
        // A barrier now starts a fresh consumer that processes 3 and 4.
        assert!(r.wait_processed(4, Duration::from_secs(30)).unwrap());
        assert_eq!(r.queue.held_bytes(), 0, "the abandoned message's bytes are freed");
        release_tx.send(()).unwrap();
        assert!(r.wait_processed(4, Duration::from_secs(30)).unwrap());
        assert_eq!(r.stop(Some(Duration::from_secs(30))).unwrap(), StopOutcome::Joined);
        let seen = lock(&c.seen).clone();
        assert_eq!(seen.iter().filter(|&&x| x == 3).count(), 1);
        assert_eq!(seen.iter().filter(|&&x| x == 4).count(), 1);
        assert_eq!(r.queue.processed(), 4, "the stuck consumer's late return changes no count");
    }

    #[test]
    fn finalize_drains_then_refuses() {
        let r = leak(1 << 20);
        let c = recording(r, |_| {});
        r.push(message(7)).unwrap();
        assert_eq!(r.finalize(None).unwrap(), 0);
        assert_eq!(*lock(&c.seen), vec![7]);
        assert!(matches!(r.push(message(8)), Err(Error::Closed)));
        assert!(matches!(r.start(), Err(Error::Closed)));
    }

    #[test]
    fn finalize_gives_up_on_consumers_that_keep_getting_stuck() {
        let r = leak(1 << 20);
        let gate = Arc::new((Mutex::new(false), std::sync::Condvar::new()));
        let g2 = Arc::clone(&gate);
        let _c = recording(r, move |_| {
            let mut open = lock(&g2.0);
            while !*open {
                open = g2.1.wait(open).unwrap();
            }
        });
        for i in 0..3 {
            r.push(message(i)).unwrap();
        }
        let dropped = r.finalize(Some(Duration::from_millis(30))).unwrap();
        assert_eq!(dropped, 1, "two stuck consumers abandoned, the third message dropped");
        assert_eq!(r.queue.held_bytes(), 0);
        *lock(&gate.0) = true;
        gate.1.notify_all();
    }

    #[test]
    fn failures_are_kept_by_ticket() {
        let r = leak(16);
        let a = r.record_failure("first".into());
        let b = r.record_failure("second".into());
        assert_ne!(a, b);
        assert_eq!(r.failure_message(a), "first");
        assert!(r.failure_message(-5).contains("ticket -5"));
    }

    #[test]
    fn a_consumer_cannot_stop_itself() {
        let r = leak(1 << 20);
        let (tx, rx) = mpsc::channel();
        let tx = Mutex::new(tx);
        let _c = recording(r, move |_| {
            let err = leak(16).stop(None).unwrap_err();
            lock(&tx).send(matches!(err, Error::InsideCallback(_))).unwrap();
        });
        r.push(message(1)).unwrap();
        assert!(rx.recv().unwrap());
        r.stop(None).unwrap();
    }
}
