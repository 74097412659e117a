//! Queue throughput: hostfeed's byte-bounded queue vs `std::sync::mpsc::sync_channel`, with
//! 4 producers and 1 consumer moving small messages. Prints messages/s and the ratio.

#![allow(clippy::cast_precision_loss)] // counts and rates far below 2^52

use std::sync::mpsc::sync_channel;
use std::sync::Arc;
use std::thread;
use std::time::Instant;

use _receiver::queue::Queue;

const PRODUCERS: usize = 4;
const PER_PRODUCER: usize = 250_000;

fn hostfeed_queue() -> f64 {
    let q = Arc::new(Queue::new(1 << 20));
    q.clear_stop();
    let t0 = Instant::now();
    let consumer = {
        let q = Arc::clone(&q);
        thread::spawn(move || {
            let mut n = 0;
            while n < PRODUCERS * PER_PRODUCER {
                let Some(epoch) = q.begin_batch(1024) else { break };
                while q.take(epoch).is_some() {
                    n += 1;
                }
                q.end_batch(epoch);
            }
        })
    };
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|p| {
            let q = Arc::clone(&q);
            thread::spawn(move || {
                for i in 0..PER_PRODUCER {
                    q.push([p as u64, i as u64], 16).unwrap();
                }
            })
        })
        .collect();
    for p in producers {
        p.join().unwrap();
    }
    consumer.join().unwrap();
    (PRODUCERS * PER_PRODUCER) as f64 / t0.elapsed().as_secs_f64()
}

fn std_sync_channel() -> f64 {
    let (tx, rx) = sync_channel::<[u64; 2]>(65_536);
    let t0 = Instant::now();
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|p| {
            let tx = tx.clone();
            thread::spawn(move || {
                for i in 0..PER_PRODUCER {
                    tx.send([p as u64, i as u64]).unwrap();
                }
            })
        })
        .collect();
    drop(tx);
    let mut n = 0usize;
    while rx.recv().is_ok() {
        n += 1;
    }
    assert_eq!(n, PRODUCERS * PER_PRODUCER);
    for p in producers {
        p.join().unwrap();
    }
    (PRODUCERS * PER_PRODUCER) as f64 / t0.elapsed().as_secs_f64()
}

fn main() {
    let mut best = (0.0f64, 0.0f64);
    for _ in 0..3 {
        best.0 = best.0.max(hostfeed_queue());
        best.1 = best.1.max(std_sync_channel());
    }
    println!("queue throughput, {PRODUCERS} producers -> 1 consumer (best of 3)");
    println!("  hostfeed Queue      {:>12.0} msg/s", best.0);
    println!("  std sync_channel    {:>12.0} msg/s", best.1);
    println!("  ratio hostfeed/std  {:>12.2}", best.0 / best.1);
}
