//! Queue and small-tap throughput, with divan (`cargo bench --bench queue`).
//!
//! * `transfer`: 4 producers send 100,000 small messages to 1 consumer, through hostfeed's
//!   byte-bounded queue (batches taken message by message, byte accounting, sequence
//!   numbers), `std::sync::mpsc::sync_channel` and `crossbeam_channel::bounded`, all with
//!   room for 65,536 messages. Divan prints each one's time and throughput side by side.
//! * `small_tap`: what the `hostfeed_tap` handler does per float32[4] message without XLA
//!   (copy the operand into a message, charge it, push it) with a consumer draining, and
//!   the copy alone.
#![allow(clippy::cast_possible_truncation, clippy::cast_possible_wrap)] // small counts
#![allow(clippy::wildcard_imports)] // the bench groups below use this file's items

use std::sync::mpsc::sync_channel;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use divan::counter::ItemsCount;
use divan::Bencher;
use hostfeed_core::dtype;
use hostfeed_core::Queue;
use hostfeed_core::{gather, Operand};

const PRODUCERS: usize = 4;
const PER_PRODUCER: usize = 25_000;
const TOTAL: usize = PRODUCERS * PER_PRODUCER;
const CAPACITY: usize = 65_536;

fn main() {
    divan::main();
}

/// Runs `PRODUCERS` threads calling `send(p, i)` and one consumer calling `recv()` until
/// `TOTAL` messages arrived.
fn transfer<S, R>(make: impl FnOnce() -> (S, R), send: fn(&S, [u64; 2]), recv: fn(&R) -> usize)
where
    S: Clone + Send + 'static,
    R: Send + 'static,
{
    let (tx, rx) = make();
    let consumer = thread::spawn(move || {
        let mut n = 0;
        while n < TOTAL {
            n += recv(&rx);
        }
    });
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|p| {
            let tx = tx.clone();
            thread::spawn(move || {
                for i in 0..PER_PRODUCER {
                    send(&tx, [p as u64, i as u64]);
                }
            })
        })
        .collect();
    for p in producers {
        p.join().unwrap();
    }
    consumer.join().unwrap();
}

mod transfer {
    use super::*;

    #[divan::bench(sample_count = 10)]
    fn hostfeed_queue(bencher: Bencher) {
        bencher.counter(ItemsCount::new(TOTAL)).bench(|| {
            transfer(
                || {
                    let q = Arc::new(Queue::new(CAPACITY * 16).with_spin(Duration::from_micros(200)));
                    q.clear_stop();
                    (Arc::clone(&q), q)
                },
                |q, m| {
                    q.push(m, 16).unwrap();
                },
                |q| {
                    let Some(epoch) = q.begin_batch(1024) else { return 0 };
                    let mut n = 0;
                    while q.take(epoch).is_some() {
                        n += 1;
                    }
                    q.end_batch(epoch);
                    n
                },
            );
        });
    }

    #[divan::bench(sample_count = 10)]
    fn std_sync_channel(bencher: Bencher) {
        bencher.counter(ItemsCount::new(TOTAL)).bench(|| {
            transfer(
                || sync_channel::<[u64; 2]>(CAPACITY),
                |tx, m| tx.send(m).unwrap(),
                |rx| rx.recv().map_or(0, |_| 1),
            );
        });
    }

    #[divan::bench(sample_count = 10)]
    fn crossbeam_bounded(bencher: Bencher) {
        bencher.counter(ItemsCount::new(TOTAL)).bench(|| {
            transfer(
                || crossbeam_channel::bounded::<[u64; 2]>(CAPACITY),
                |tx, m| tx.send(m).unwrap(),
                |rx| rx.recv().map_or(0, |_| 1),
            );
        });
    }
}

mod small_tap {
    use super::*;

    const N: usize = 100_000;

    fn operand(x: &[f32; 4]) -> Operand<'_> {
        Operand { dtype: dtype::F32, data: x.as_ptr().cast(), dims: &[4] }
    }

    /// Copy + charge + push of a float32[4] message, with a consumer draining alongside.
    #[divan::bench(sample_count = 10)]
    fn gather_and_push(bencher: Bencher) {
        bencher.counter(ItemsCount::new(N)).bench(|| {
            let q = Arc::new(Queue::new(256_000_000).with_spin(Duration::from_micros(200)));
            q.clear_stop();
            let consumer = {
                let q = Arc::clone(&q);
                thread::spawn(move || {
                    let mut n = 0;
                    while n < N {
                        let Some(epoch) = q.begin_batch(1024) else { break };
                        while q.take(epoch).is_some() {
                            n += 1;
                        }
                        q.end_batch(epoch);
                    }
                })
            };
            let x = [1.0f32, 2.0, 3.0, 4.0];
            for i in 0..N {
                // SAFETY: the operand points at a live local array of 4 float32.
                let msg = unsafe { gather(i as i64, 0, 0, std::iter::once(operand(&x))) }.unwrap();
                let bytes = msg.charged_bytes();
                assert!(q.push(msg, bytes).is_ok());
            }
            consumer.join().unwrap();
        });
    }

    /// The copy into a message alone (no queue), as a floor.
    #[divan::bench(sample_count = 10)]
    fn gather_only(bencher: Bencher) {
        let x = [1.0f32, 2.0, 3.0, 4.0];
        bencher.counter(ItemsCount::new(1usize)).bench(|| {
            // SAFETY: as above.
            let msg = unsafe { gather(1, 0, 0, std::iter::once(operand(&x))) }.unwrap();
            divan::black_box(msg);
        });
    }
}
