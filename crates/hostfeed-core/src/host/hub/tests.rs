//! The hub's tests: the consumer's lifecycle, barriers, stalls and abandons, inline runs.

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
fn one_inline_run_at_a_time_another_devices_goes_through_the_queue() {
    let (r, c) = logging_after_one();
    let (run_side, (entered, go)) = hold();
    *lock(&c.hold_inline) = Some(run_side);
    let inline = std::thread::spawn(move || r.run_inline(message(2)).is_ok());
    entered.recv().unwrap();
    // Another device's thread, nothing queued: still given back while message 2 runs.
    let back = r.run_inline(message(3)).expect_err("message 2 runs inline");
    assert_eq!(back.consumer_id, 3);
    r.push(back).unwrap();
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

/// A consumer that records consumer ids and, the first time it is about to end (asked
/// to stop, the queue empty), waits for the test's go-ahead: a consumer slow to exit, as
/// one waiting for the GIL is.
struct SlowExit {
    seen: Mutex<Vec<i64>>,
    exiting: Mutex<Option<(mpsc::Sender<()>, mpsc::Receiver<()>)>>,
}

impl Consume for SlowExit {
    fn run(&self, worker: &Worker) {
        while let Some(batch) = worker.next_batch() {
            while let Some(m) = batch.take() {
                lock(&self.seen).push(m.consumer_id);
            }
        }
        if let Some((exiting, go)) = lock(&self.exiting).take() {
            exiting.send(()).unwrap();
            go.recv().unwrap();
        }
    }
}

#[test]
fn a_push_during_a_stop_does_not_wait_for_it_and_the_stop_restarts_the_consumer() {
    let r = leak(1 << 20);
    let ((exiting, go), (exiting_rx, go_tx)) = hold();
    let c = Arc::new(SlowExit { seen: Mutex::new(Vec::new()), exiting: Mutex::new(Some((exiting, go))) });
    r.configure(c.clone());
    r.push(message(1)).unwrap();
    let stopper = std::thread::spawn(move || r.stop(None).unwrap());
    exiting_rx.recv().unwrap(); // the stop is joining a consumer that is ending
    // A device's push returns at once: it neither waits for the join nor starts a
    // consumer of its own (the stop holds the control lock).
    let (pushed_tx, pushed_rx) = mpsc::channel();
    std::thread::spawn(move || {
        r.push(message(2)).unwrap();
        pushed_tx.send(()).unwrap();
    });
    pushed_rx.recv_timeout(Duration::from_secs(30)).expect("the push waited for the stop");
    go_tx.send(()).unwrap();
    assert_eq!(stopper.join().unwrap(), StopOutcome::Joined);
    // The stop started a fresh consumer for the message pushed meanwhile.
    assert!(r.wait_processed(2, Duration::from_secs(30)).unwrap());
    assert_eq!(*lock(&c.seen), vec![1, 2]);
    assert_eq!(r.stop(None).unwrap(), StopOutcome::Joined);
    assert!(!r.is_running());
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
