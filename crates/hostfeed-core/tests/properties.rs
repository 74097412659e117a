//! Property tests of the queue and the reply slot.
//!
//! * The queue against a model: random sequences of pushes (from several producers), batch
//!   begin/take/end, reclaims of a stuck consumer's batch and bound changes, checked after
//!   every step against a plain model of what must hold (FIFO per producer, exactly-once
//!   delivery, byte and message accounting, the bound).
//! * The queue and the reply slot under random thread interleavings: producers, consumers
//!   that get stuck and are reclaimed, repliers racing deadlines and failures, with
//!   schedules perturbed by generated yield counts; every run checks the invariants.
#![cfg(not(loom))] // the loom build swaps the primitives; it runs only the models (--lib)
#![allow(clippy::cast_possible_truncation)] // test counts and sizes are small

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use hostfeed_core::{NoReply, OutBuf, ReplySlot};
use hostfeed_core::{Queue, Reclaimed};
use proptest::prelude::*;

/// A test model of the queue, in plain collections.
type Item = ((usize, u64), usize);
/// The batch in flight: epoch, items not taken, taken count, taken bytes.
type InFlight = (u64, VecDeque<Item>, u64, usize);

#[derive(Debug, Clone)]
enum Op {
    Push { producer: usize, bytes: usize },
    Begin { max: usize },
    Take,
    End,
    Reclaim,
    SetBound(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..3usize, 0..40usize).prop_map(|(producer, bytes)| Op::Push { producer, bytes }),
        2 => (1..5usize).prop_map(|max| Op::Begin { max }),
        3 => Just(Op::Take),
        2 => Just(Op::End),
        1 => Just(Op::Reclaim),
        1 => (1..120usize).prop_map(Op::SetBound),
    ]
}

/// What must hold: the queue as a list, the batch in flight, the counts.
#[derive(Default)]
struct Model {
    queued: VecDeque<Item>,
    batch: Option<InFlight>,
    held: usize,
    enqueued: u64,
    processed: u64,
    next: [u64; 3],
    delivered: Vec<(usize, u64)>,
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn queue_matches_its_model(ops in proptest::collection::vec(op(), 1..120)) {
        let q: Queue<(usize, u64)> = Queue::new(60);
        q.clear_stop();
        let mut m = Model::default();
        let mut bound = 60;
        for op in ops {
            match op {
                Op::Push { producer, bytes } => {
                    // A push waits while the bytes held would exceed the bound; in this
                    // single-threaded run only pushes that are admitted at once are made.
                    if m.held != 0 && m.held + bytes > bound {
                        continue;
                    }
                    let item = (producer, m.next[producer]);
                    m.next[producer] += 1;
                    let pushed = q.push(item, bytes).unwrap();
                    prop_assert_eq!(pushed.seq, m.enqueued);
                    m.enqueued += 1;
                    m.held += bytes;
                    m.queued.push_back((item, bytes));
                }
                Op::Begin { max } => {
                    if m.batch.is_some() || m.queued.is_empty() {
                        continue; // the consumer holds one batch at a time; never blocks here
                    }
                    let epoch = q.begin_batch(max).expect("items are queued");
                    let n = m.queued.len().min(max);
                    m.batch = Some((epoch, m.queued.drain(..n).collect(), 0, 0));
                }
                Op::Take => {
                    if let Some((epoch, items, taken, bytes)) = m.batch.as_mut() {
                        let got = q.take(*epoch);
                        let want = items.pop_front();
                        prop_assert_eq!(got, want.map(|w| w.0));
                        if let Some((item, b)) = want {
                            *taken += 1;
                            *bytes += b;
                            m.delivered.push(item);
                        }
                    }
                }
                Op::End => {
                    if let Some((epoch, items, taken, bytes)) = m.batch.take() {
                        let dropped: usize = items.iter().map(|x| x.1).sum();
                        prop_assert_eq!(q.end_batch(epoch), items.len());
                        m.processed += taken + items.len() as u64;
                        m.held -= bytes + dropped;
                        // A dropped (untaken) item counts as processed: record it so the
                        // per-producer order check below still sees every item once.
                        m.delivered.extend(items.iter().map(|x| x.0));
                        prop_assert_eq!(q.end_batch(epoch), 0, "ending twice changes nothing");
                    }
                }
                Op::Reclaim => {
                    let (written_off, requeued, bytes) = match m.batch.take() {
                        Some((_, items, taken, bytes)) => {
                            let n = items.len();
                            for it in items.into_iter().rev() {
                                m.queued.push_front(it);
                            }
                            (taken, n, bytes)
                        }
                        None => (0, 0, 0),
                    };
                    prop_assert_eq!(q.reclaim_batch(), Reclaimed { written_off, requeued });
                    m.processed += written_off;
                    m.held -= bytes;
                }
                Op::SetBound(b) => {
                    q.set_bound(b);
                    bound = b;
                }
            }
            prop_assert_eq!(q.enqueued(), m.enqueued);
            prop_assert_eq!(q.processed(), m.processed);
            prop_assert_eq!(q.held_bytes(), m.held);
            prop_assert_eq!(q.len(), m.queued.len());
            let s = q.stats.snapshot();
            prop_assert_eq!(s.queued_bytes, m.held as u64);
            prop_assert!(s.peak_queued_bytes >= m.held as u64);
        }
        // Every producer's items were delivered in order, each once.
        for p in 0..3 {
            let mine: Vec<u64> = m.delivered.iter().filter(|x| x.0 == p).map(|x| x.1).collect();
            prop_assert_eq!(mine.clone(), (0..mine.len() as u64).collect::<Vec<_>>());
        }
    }
}

/// Spins `n` times, yielding now and then: generated schedules perturb interleavings.
fn jitter(n: u8) {
    for i in 0..n {
        if i % 4 == 0 {
            thread::yield_now();
        }
        std::hint::spin_loop();
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Producers push; a consumer takes messages, sometimes "gets stuck" (stops ending its
    /// batch), in which case another thread reclaims the batch and a fresh consumer goes
    /// on. Every message is taken exactly once, in per-producer order, and at the end
    /// everything is accounted for and no byte stays held.
    #[test]
    fn messages_are_taken_once_across_reclaimed_consumers(
        bound in 20usize..200,
        per_producer in 50u64..300,
        stuck_every in 7u64..60,
        delays in proptest::collection::vec(0u8..40, 8),
    ) {
        let q = Arc::new(Queue::new(bound));
        q.clear_stop();
        let taken = Arc::new(Mutex::new(Vec::new()));
        let producers: Vec<_> = (0..3u64).map(|p| {
            let (q, d) = (Arc::clone(&q), delays[p as usize]);
            thread::spawn(move || for i in 0..per_producer {
                q.push((p, i), 1 + (i as usize % 13)).unwrap();
                jitter(d);
            })
        }).collect();
        let total = 3 * per_producer;
        let count = Arc::new(AtomicUsize::new(0));
        let reclaims = Arc::new(AtomicUsize::new(0));
        while count.load(Ordering::SeqCst) < total as usize {
            // One consumer generation: runs until it decides to get stuck or all is done.
            let stuck = Arc::new(AtomicBool::new(false));
            let consumer = {
                let (q, taken, count, stuck, d) =
                    (Arc::clone(&q), Arc::clone(&taken), Arc::clone(&count), Arc::clone(&stuck), delays[5]);
                thread::spawn(move || {
                    while count.load(Ordering::SeqCst) < total as usize {
                        let Some(epoch) = q.begin_batch(8) else { return };
                        while let Some(item) = q.take(epoch) {
                            taken.lock().unwrap().push(item);
                            let n = count.fetch_add(1, Ordering::SeqCst) + 1;
                            jitter(d);
                            if n as u64 % stuck_every == 0 {
                                stuck.store(true, Ordering::SeqCst);
                                return; // stuck: never ends this batch
                            }
                        }
                        q.end_batch(epoch);
                    }
                })
            };
            consumer.join().unwrap();
            if stuck.load(Ordering::SeqCst) {
                q.reclaim_batch();
                reclaims.fetch_add(1, Ordering::SeqCst);
            }
        }
        for p in producers {
            p.join().unwrap();
        }
        let taken = taken.lock().unwrap();
        prop_assert_eq!(taken.len() as u64, total);
        for p in 0..3 {
            let mine: Vec<u64> = taken.iter().filter(|x| x.0 == p).map(|x| x.1).collect();
            prop_assert_eq!(mine, (0..per_producer).collect::<Vec<_>>());
        }
        prop_assert!(q.wait_processed(total, Duration::from_secs(30)));
        prop_assert_eq!(q.held_bytes(), 0);
        prop_assert!(reclaims.load(Ordering::SeqCst) >= 1);
    }

    /// A reply, a failure and the waiter's deadline race: exactly one outcome wins, the
    /// outputs are written only while the waiter still waits, and what the waiter reports
    /// is what won.
    #[test]
    fn reply_slot_has_exactly_one_outcome(
        reply_delay in 0u8..60,
        fail_delay in 0u8..60,
        deadline_us in 0u64..300,
        send_first in any::<bool>(),
    ) {
        let mut buf = vec![0u8; 4];
        let out = OutBuf { dtype: 6, data: buf.as_mut_ptr(), nbytes: 4, dims: vec![4] };
        let slot = Arc::new(ReplySlot::new(vec![out]));
        let wrote = Arc::new(AtomicBool::new(false));
        let waiter = {
            let slot = Arc::clone(&slot);
            thread::spawn(move || slot.wait(Some(Instant::now() + Duration::from_micros(deadline_us)), || None))
        };
        let sender = {
            let (slot, wrote) = (Arc::clone(&slot), Arc::clone(&wrote));
            thread::spawn(move || {
                jitter(if send_first { 0 } else { reply_delay });
                slot.reply_with(|outs| {
                    // SAFETY: `reply_with` calls this only while the waiter still waits,
                    // so the 4-byte buffer behind `outs[0]` is alive and unshared.
                    unsafe { std::ptr::write_bytes(outs[0].data, 7, 4) };
                    wrote.store(true, Ordering::SeqCst);
                    Ok(())
                })
            })
        };
        let failer = {
            let slot = Arc::clone(&slot);
            thread::spawn(move || {
                jitter(fail_delay);
                slot.fail("failed".into())
            })
        };
        let got = waiter.join().unwrap();
        let sent = sender.join().unwrap();
        let failed = failer.join().unwrap();
        prop_assert!(!(sent && failed), "two outcomes won");
        match got {
            Ok(Ok(())) => prop_assert!(sent && wrote.load(Ordering::SeqCst)),
            Ok(Err(m)) => { prop_assert!(failed); prop_assert_eq!(m, "failed"); }
            Err(NoReply::TimedOut) => prop_assert!(!sent && !failed),
            Err(NoReply::Interrupted(_)) => prop_assert!(false, "nothing interrupts"),
        }
        // After the waiter returned, the outputs are XLA's again: nobody writes them.
        prop_assert!(!slot.reply_with(|_| Err("late".into())));
        prop_assert!(!slot.is_pending());
        drop(slot);
        prop_assert_eq!(buf == [7u8; 4], wrote.load(Ordering::SeqCst));
    }
}
