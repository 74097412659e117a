//! loom models of the hand-made synchronisation: [`Waker`] (no lost wake-up when the
//! notifier skips the system call), the reply slot (a reply reaches its waiting handler,
//! and of two racing answers exactly one wins) and the queue's wait/notify (a consumer
//! sleeping for messages, a producer sleeping for space, a barrier sleeping for progress).
//!
//! Compiled only under `--cfg loom`, where `host::sync` hands out loom's primitives:
//! `RUSTFLAGS="--cfg loom" cargo test -p hostfeed-core --release --lib loom`. Each model
//! bounds its preemptions (`LOOM_MAX_PREEMPTIONS` overrides) so that CI stays quick; loom
//! never lets a timed wait time out, so a model passes only if notifications alone suffice.

use std::time::Duration;

use loom::sync::Arc;
use loom::thread;

use crate::host::queue::Queue;
use crate::host::reply::{OutBuf, ReplySlot};
use crate::host::sync::{lock, Mutex, Waker};

/// Runs `f` under loom with at most `preemptions` preemptions per execution (unless
/// `LOOM_MAX_PREEMPTIONS` says otherwise).
fn model(preemptions: usize, f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(preemptions);
    }
    builder.check(f);
}

/// A timeout no model reaches (loom does not let time pass).
const FOREVER: Duration = Duration::from_secs(3600);

#[test]
fn loom_waker_never_loses_a_wake_up() {
    model(3, || {
        let state = Arc::new((Mutex::new(false), Waker::new()));
        let notifier = {
            let state = Arc::clone(&state);
            thread::spawn(move || {
                *lock(&state.0) = true; // the guard drops here: notify after unlocking
                state.1.notify_one();
            })
        };
        let mut g = lock(&state.0);
        while !*g {
            g = state.1.wait(g);
        }
        drop(g);
        notifier.join().unwrap();
        assert!(!state.1.has_sleepers());
    });
}

#[test]
fn loom_waker_notify_all_wakes_every_sleeper() {
    model(2, || {
        let state = Arc::new((Mutex::new(false), Waker::new()));
        let sleepers: Vec<_> = (0..2)
            .map(|_| {
                let state = Arc::clone(&state);
                thread::spawn(move || {
                    let mut g = lock(&state.0);
                    while !*g {
                        g = state.1.wait(g);
                    }
                })
            })
            .collect();
        *lock(&state.0) = true;
        state.1.notify_all();
        for s in sleepers {
            s.join().unwrap();
        }
        assert!(!state.1.has_sleepers());
    });
}

/// A slot over one 4-byte output, and the output (kept alive by the caller).
fn slot() -> (Arc<ReplySlot>, Box<[u8; 4]>) {
    let mut out = Box::new([0u8; 4]);
    let buf = OutBuf { dtype: 6, data: out.as_mut_ptr(), nbytes: 4, dims: vec![4] };
    (Arc::new(ReplySlot::new(vec![buf])), out)
}

#[test]
fn loom_a_reply_reaches_the_waiting_handler_with_its_results() {
    model(3, || {
        let (slot, out) = slot();
        let consumer = {
            let slot = Arc::clone(&slot);
            thread::spawn(move || {
                slot.mark_started();
                slot.reply_with(|outs| {
                    // SAFETY: the slot is pending, so the handler waits and `outs[0]` holds
                    // 4 writable bytes.
                    unsafe { std::ptr::write_bytes(outs[0].data, 7, outs[0].nbytes) };
                    Ok(())
                })
            })
        };
        assert_eq!(slot.wait(None, || None), Ok(Ok(())));
        assert!(consumer.join().unwrap(), "the only reply is accepted");
        assert_eq!(*out, [7; 4]);
        assert!(!slot.is_pending());
    });
}

#[test]
fn loom_of_a_reply_and_a_failure_exactly_one_wins() {
    model(2, || {
        let (slot, out) = slot();
        let answer = |fail: bool| {
            let slot = Arc::clone(&slot);
            thread::spawn(move || {
                if fail {
                    slot.fail("stopped".into())
                } else {
                    slot.reply_with(|outs| {
                        // SAFETY: as above: pending, 4 writable bytes.
                        unsafe { std::ptr::write_bytes(outs[0].data, 1, outs[0].nbytes) };
                        Ok(())
                    })
                }
            })
        };
        let (replier, failer) = (answer(false), answer(true));
        let got = slot.wait(None, || None).unwrap();
        let (reply_won, failure_won) = (replier.join().unwrap(), failer.join().unwrap());
        assert!(reply_won != failure_won, "exactly one answer is accepted");
        if reply_won {
            assert_eq!((got, *out), (Ok(()), [1; 4]));
        } else {
            assert_eq!((got, *out), (Err("stopped".to_string()), [0; 4]));
        }
    });
}

#[test]
fn loom_queue_producer_consumer_and_barrier_wake_each_other() {
    model(2, || {
        // Two items of 6 bytes under a bound of 10: the second push waits for space.
        let q = Arc::new(Queue::<u32>::new(10));
        q.clear_stop(); // a consumer is active: a full push waits instead of failing
        let producer = {
            let q = Arc::clone(&q);
            thread::spawn(move || {
                q.push(1, 6).unwrap();
                q.push(2, 6).unwrap();
            })
        };
        let consumer = {
            let q = Arc::clone(&q);
            thread::spawn(move || {
                let mut seen = Vec::new();
                while let Some(epoch) = q.begin_batch(1) {
                    while let Some(x) = q.take(epoch) {
                        seen.push(x);
                    }
                    q.end_batch(epoch);
                }
                seen
            })
        };
        assert!(q.wait_processed(2, FOREVER), "the barrier is woken by the consumer");
        q.request_stop();
        producer.join().unwrap();
        assert_eq!(consumer.join().unwrap(), vec![1, 2], "push order");
        assert_eq!(q.held_bytes(), 0);
    });
}

#[test]
fn loom_a_barrier_returns_only_after_a_held_message_ran() {
    model(3, || {
        // The consumer holds message 0 back past the end of its batch, then runs it (sets
        // `ran`) and lets it go; a barrier taken after its push, lock-free check first as
        // the binding does, must never see it completed before it ran.
        let q = Arc::new(Queue::<(u32, u64)>::new(100).with_seq(|item, seq| item.1 = seq));
        let ran = Arc::new(loom::sync::atomic::AtomicBool::new(false));
        q.clear_stop();
        let target = q.push((7, 0), 1).unwrap().seq + 1;
        let consumer = {
            let (q, ran) = (Arc::clone(&q), Arc::clone(&ran));
            thread::spawn(move || {
                let epoch = q.begin_batch(1).unwrap();
                let (_, seq) = q.take(epoch).unwrap();
                q.hold_back(Some(seq), 1);
                q.end_batch(epoch);
                ran.store(true, loom::sync::atomic::Ordering::Relaxed);
                q.let_go(Some(seq), 1);
            })
        };
        if !q.done_before(target) {
            assert!(q.wait_processed(target, FOREVER), "the barrier is woken by the let-go");
        }
        assert!(ran.load(loom::sync::atomic::Ordering::Relaxed), "returned before the message ran");
        consumer.join().unwrap();
        assert_eq!(q.held_bytes(), 0);
    });
}
