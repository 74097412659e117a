//! Multi-threaded properties of the byte-bounded queue: many producers, one consumer.
#![cfg(not(loom))] // the loom build swaps the primitives; it runs only the models (--lib)

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use hostfeed_core::{PushError, Queue};

/// (producer, index) pairs as the consumer saw them, and the queue for its counters.
type RunResult = (Vec<(usize, usize)>, Arc<Queue<(usize, usize)>>);

/// Runs `producers` threads each pushing `per_producer` items of `bytes` bytes, and one
/// consumer that completes each batch after `work` (a closure run per batch). Returns what
/// the consumer saw, in order, as (producer, index).
fn run(
    bound: usize,
    producers: usize,
    per_producer: usize,
    bytes: impl Fn(usize) -> usize + Send + Sync + Copy + 'static,
) -> RunResult {
    let q = Arc::new(Queue::<(usize, usize)>::new(bound));
    q.clear_stop();
    let consumer = {
        let q = Arc::clone(&q);
        thread::spawn(move || {
            let mut seen = Vec::new();
            while let Some(epoch) = q.begin_batch(7) {
                let mut batch_bytes = 0;
                while let Some(x) = q.take(epoch) {
                    batch_bytes += bytes(x.1);
                    seen.push(x);
                }
                // Held bytes include this batch until it ends.
                assert!(q.held_bytes() >= batch_bytes);
                q.end_batch(epoch);
            }
            seen
        })
    };
    let handles: Vec<_> = (0..producers)
        .map(|p| {
            let q = Arc::clone(&q);
            thread::spawn(move || {
                for i in 0..per_producer {
                    q.push((p, i), bytes(i)).unwrap();
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert!(q.wait_processed((producers * per_producer) as u64, Duration::from_secs(60)));
    q.request_stop();
    (consumer.join().unwrap(), q)
}

#[test]
fn every_message_arrives_once_in_per_producer_order() {
    let (seen, q) = run(1000, 4, 2000, |i| 1 + i % 50);
    assert_eq!(seen.len(), 8000);
    for p in 0..4 {
        let mine: Vec<usize> = seen.iter().filter(|x| x.0 == p).map(|x| x.1).collect();
        assert_eq!(mine, (0..2000).collect::<Vec<_>>(), "producer {p} out of order");
    }
    let s = q.stats.snapshot();
    assert_eq!(s.messages_enqueued, 8000);
    assert_eq!(s.messages_processed, 8000);
    assert_eq!(s.bytes_enqueued, s.bytes_processed);
    assert_eq!(s.queued_bytes, 0);
}

#[test]
fn held_bytes_never_exceed_the_bound() {
    let (_, q) = run(100, 3, 500, |i| 10 + i % 20);
    let s = q.stats.snapshot();
    assert!(s.peak_queued_bytes <= 100, "peak {} > bound 100", s.peak_queued_bytes);
    assert!(s.producer_blocked_count > 0, "a 100-byte bound must make producers wait");
}

#[test]
fn oversized_messages_pass_one_at_a_time() {
    let (seen, q) = run(50, 2, 40, |i| if i % 3 == 0 { 500 } else { 5 });
    assert_eq!(seen.len(), 80);
    let s = q.stats.snapshot();
    // An oversized message is admitted only when nothing else is held.
    assert!(s.peak_queued_bytes <= 500, "peak {}", s.peak_queued_bytes);
}

#[test]
fn blocked_producer_resumes_when_bound_is_raised() {
    let q = Arc::new(Queue::new(10));
    q.clear_stop();
    q.push(1u32, 10).unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let producer = {
        let (q, done) = (Arc::clone(&q), Arc::clone(&done));
        thread::spawn(move || {
            q.push(2u32, 10).unwrap();
            done.store(true, Ordering::SeqCst);
        })
    };
    // Wait (bounded) until the producer is recorded as blocked.
    for _ in 0..10_000 {
        if q.stats.snapshot().producer_blocked_count > 0 {
            break;
        }
        thread::yield_now();
    }
    assert!(!done.load(Ordering::SeqCst));
    q.set_bound(100);
    producer.join().unwrap();
    assert!(done.load(Ordering::SeqCst));
    assert_eq!(q.len(), 2);
}

#[test]
fn producer_waiting_for_space_is_told_when_the_consumer_stops() {
    let q = Arc::new(Queue::new(10));
    q.clear_stop();
    q.push(1u32, 10).unwrap();
    let producer = {
        let q = Arc::clone(&q);
        thread::spawn(move || q.push(2u32, 10))
    };
    for _ in 0..10_000 {
        if q.stats.snapshot().producer_blocked_count > 0 {
            break;
        }
        thread::yield_now();
    }
    // The consumer drains the one item, then stops; the producer is admitted once the
    // bytes are freed (space is available), or told there is no consumer.
    let epoch = q.begin_batch(10).expect("one item");
    assert_eq!(q.take(epoch), Some(1));
    q.request_stop();
    q.end_batch(epoch);
    match producer.join().unwrap() {
        Ok(p) => assert_eq!(p.seq, 1),
        Err(PushError::NoConsumer(2)) => {}
        Err(e) => panic!("unexpected {e:?}"),
    }
}

#[test]
fn barrier_waits_for_everything_enqueued_before_it() {
    let q = Arc::new(Queue::new(1 << 20));
    q.clear_stop();
    for i in 0..100u32 {
        q.push(i, 1).unwrap();
    }
    let target = q.enqueued();
    let consumer = {
        let q = Arc::clone(&q);
        thread::spawn(move || {
            while let Some(epoch) = q.begin_batch(3) {
                while q.take(epoch).is_some() {}
                q.end_batch(epoch);
            }
        })
    };
    assert!(q.wait_processed(target, Duration::from_secs(30)));
    assert!(q.processed() >= 100);
    q.request_stop();
    consumer.join().unwrap();
}
