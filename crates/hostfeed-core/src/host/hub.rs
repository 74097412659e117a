//! The hub: the one place every handler pushes to and the consumer thread pulls from. It
//! owns the queue, the consumer thread's lifecycle (start, stop, restart, abandoning a
//! stuck consumer), the barrier, the `call`s waiting for replies and the failures they
//! report. (Python calls the whole native side "the receiver", which
//! `hostfeed._src.lifecycle` drives through the extension module `hostfeed._receiver`.)
//!
//! The consumer thread runs a [`Consume`] implementation. The Python binding provides the
//! real one (the binding's `host/consumer.rs` and `consumers.rs`: attach to Python, hand each batch
//! to the dispatcher); tests provide plain Rust ones, so this whole module is covered by `cargo test`.
//!
//! Lifecycle: the binding configures the receiver with its consumer and starts it. A
//! handler that finds no consumer running (after `stop_outfeed_receiver`, say) restarts it
//! from the stored configuration, so compiled code never strands messages. A consumer that
//! makes no progress for the stall timeout while stopping (a host callback that never
//! returns) is abandoned: the message it is stuck in is written off, the messages it had not
//! reached go back to the queue, the `call`s waiting on it fail, and a fresh consumer takes
//! over when needed. `finalize` (interpreter exit) drains, stops and closes for good.
//! Stopping lives in `hub/stopping.rs`, off the road of a tap; the consumer thread's side
//! (its [`Worker`], the [`Batch`] it processes) is here, beside the pushes.
//!
//! No Python here.

use std::cell::Cell;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::error::Error;
use crate::host::buffer;
use crate::host::histogram::Timing;
use crate::host::message::{Message, FLAG_SYNC_TAP};
use crate::host::queue::{Nap, PushError, Queue, Reclaimed};
use crate::host::reply::ReplySlot;
use crate::host::sync::{lock, spin_until, AdaptiveSpin, Waker};

mod stopping;

/// Default byte bound: `256e6`, the default of JAX's former `host_callback` module, which
/// hostfeed replaces.
pub const DEFAULT_MAX_QUEUE_BYTES: usize = 256_000_000;
/// Default time without progress after which stopping gives up on a stuck consumer.
pub const DEFAULT_STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// Most messages in one batch.
pub(crate) const MAX_BATCH: usize = 1024;
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
    /// Stall detection across [`Hub::drain_step`] calls: progress last seen, since when,
    /// and when a step last looked.
    watch: Mutex<(u64, Instant, Instant)>,
    /// A host function running on a device's thread ([`Hub::run_inline`]): the consumer
    /// generation it started under, plus one; 0: none.
    inline: AtomicU64,
    /// Whether the consumer thread holds a batch (it runs host functions only then).
    in_batch: AtomicBool,
    /// Set while [`Hub::stop`] holds the control lock to join the consumer: a handler
    /// whose message found no consumer then leaves the restart to `stop` instead of
    /// waiting for the lock (see [`Hub::push`]).
    stopping: AtomicBool,
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
            // No polling that yields the CPU (`Queue::with_spin`): under load a yield can
            // give the CPU away for a whole scheduler time slice, so a polling consumer would
            // take a message milliseconds late, where one woken from sleep takes it within
            // microseconds. It spins without yielding instead, adaptively.
            queue: Queue::new(bound)
                .with_adaptive_spin(&CONSUMER_ADAPTIVE_SPIN)
                .with_nap(Nap { period: CONSUMER_NAP_PERIOD, window: CONSUMER_NAP_WINDOW, urgent })
                .with_seq(|msg, seq| msg.seq = seq),
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
            watch: Mutex::new((0, Instant::now(), Instant::now())),
            inline: AtomicU64::new(0),
            in_batch: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
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

    /// Runs a plain `call` request (or a synchronous tap) on the calling thread (the
    /// device's, which waits for the reply anyway) when nothing else is pending: no message
    /// is queued or being processed (so the device's earlier taps have all run), the
    /// consumer thread holds no batch and no other device's thread runs one (one host
    /// function at a time: the consumer waits for this run before it takes the next). The
    /// reply slot is answered when this returns `Ok`.
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
        // One host function at a time: not while another device's thread runs one here.
        if self.inline.compare_exchange(0, generation + 1, Ordering::SeqCst, Ordering::SeqCst).is_err() {
            return Err(msg);
        }
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
        self.start_locked(&mut control)
    }

    fn start_locked(&'static self, control: &mut Control) -> Result<bool, Error> {
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
                    // The message is queued. While a stop joins the consumer, the stop
                    // starts a fresh one for it once joined (it looks at the queue after
                    // clearing `stopping`; the push above came first): the device does not
                    // wait for that join. (Stalling every device for each stop deadlocked
                    // XLA's CPU client when two threads dispatched multi-device
                    // computations beside single-device ones.)
                    if !pushed.consumer_active && !self.stopping.load(Ordering::SeqCst) {
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

    /// Waits up to `timeout` until the messages pushed before sequence number `target`
    /// have all run, held back ones included (`Queue::done_before`); returns whether they
    /// have. Starts a consumer if messages are pending and none runs.
    ///
    /// # Errors
    /// Start errors.
    pub fn wait_processed(&'static self, target: u64, timeout: Duration) -> Result<bool, Error> {
        if self.queue.done_before(target) {
            return Ok(true);
        }
        if !self.is_finalized() && !self.is_running() {
            self.start()?;
        }
        // The consumer usually finishes within microseconds; a sleeping waiter costs a
        // wake-up system call and a scheduler round trip (tens of microseconds on VMs).
        self.queue.wake_napping();
        let spin = BARRIER_SPIN.min(timeout);
        if !spin.is_zero() && spin_until(spin, || self.queue.done_before(target)) {
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
            let now = Instant::now();
            // A watch that was not looking (no step for a while: the last watch ended, the
            // messages pending now are new) starts again rather than count that time as a
            // stall: an exit watch started long after the last one abandoned a consumer
            // that had not yet had a moment to take the message just pushed.
            let resumed = now.duration_since(w.2) > (slice * 4).max(Duration::from_secs(1));
            w.2 = now;
            if progress != w.0 || !pending || resumed {
                *w = (progress, now, now);
            } else if stall.is_some_and(|s| w.1.elapsed() >= s) {
                let stalled_for = w.1.elapsed();
                *w = (progress, now, now);
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
}

// ---- The consumer thread's side: its access to the hub, and the batch it processes ----

/// The consumer thread's access to the hub.
pub struct Worker {
    hub: &'static Hub,
    generation: u64,
}

impl Worker {
    /// Waits for the next batch; `None` when the consumer must exit (stopped, closed, or
    /// abandoned in favour of a newer consumer).
    #[must_use]
    pub(crate) fn next_batch(&self) -> Option<Batch> {
        let r = self.hub;
        if r.generation.load(Ordering::Acquire) != self.generation {
            return None;
        }
        if r.inline.load(Ordering::Acquire) == 0 {
            r.mark_idle();
        }
        let epoch = r.queue.begin_batch(MAX_BATCH)?;
        r.enter_batch(self.generation);
        buffer::note_consumer_cpu();
        Some(Batch { hub: r, epoch, generation: self.generation })
    }
}

/// A batch of messages being processed. Messages are taken one at a time so that a
/// consumer stuck in one of them can be relieved of the rest ([`Queue::reclaim_batch`](crate::host::queue::Queue::reclaim_batch)).
/// Ending (or dropping) the batch completes what was taken.
pub struct Batch {
    hub: &'static Hub,
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
        let m = self.hub.queue.take_if(self.epoch, accept)?;
        let now = self.hub.timing.raw_now();
        self.hub.timing.record_handover_at(m.queued_at, now);
        self.hub.mark_busy(m.consumer_id, now);
        Some(m)
    }

    /// The next message if `accept` accepts it, with its bytes still charged after the
    /// batch ends (see [`Queue::take_retained`](crate::host::queue::Queue::take_retained)): the caller owes `release` of the returned
    /// byte count (the recorder keeps rows until they are written).
    #[must_use]
    pub(crate) fn take_retained(&self, accept: impl FnOnce(&Message) -> bool) -> Option<(Message, usize)> {
        let (m, bytes) = self.hub.queue.take_retained(self.epoch, accept)?;
        self.hub.mark_busy(m.consumer_id, self.hub.timing.raw_now());
        Some((m, bytes))
    }

    /// Messages not taken yet.
    #[must_use]
    pub fn remaining(&self) -> usize {
        self.hub.queue.remaining(self.epoch)
    }
}

impl Drop for Batch {
    fn drop(&mut self) {
        // Before the batch counts as processed: whoever sees it processed (a barrier, a
        // call that would run on its device's thread) sees the consumer busy with none of
        // its messages and holding no batch. (Not the batch of an abandoned consumer whose
        // callback returned at last: a newer consumer may be busy.)
        if self.hub.generation.load(Ordering::Acquire) == self.generation {
            self.hub.mark_idle();
            self.hub.in_batch.store(false, Ordering::SeqCst);
        }
        // Messages not taken (the dispatcher failed) are dropped and counted.
        let dropped = self.hub.queue.end_batch(self.epoch);
        if dropped > 0 {
            self.hub.note(format!("{dropped} message(s) were dropped after the dispatcher failed"));
        }
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

fn consumer_main(hub: &'static Hub, consumer: &dyn Consume, generation: u64) {
    IS_CONSUMER.with(|c| c.set(true));
    let _guard = ExitGuard(hub, generation);
    consumer.run(&Worker { hub, generation });
}

#[cfg(test)]
mod tests;
