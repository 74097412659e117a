//! The queue's tests.

use super::*;

/// Runs one batch of up to `max` items through `q`, returning them.
fn drain<T>(q: &Queue<T>, max: usize) -> Vec<T> {
    let epoch = q.begin_batch(max).expect("a batch");
    let mut out = Vec::new();
    while let Some(x) = q.take(epoch) {
        out.push(x);
    }
    q.end_batch(epoch);
    out
}

#[test]
fn a_nudge_wakes_a_waiter_without_counting_as_progress() {
    let q = std::sync::Arc::new(Queue::<u32>::new(100));
    let progress = q.progress();
    let seen = q.wake_count();
    let (tx, rx) = std::sync::mpsc::channel();
    let q2 = std::sync::Arc::clone(&q);
    let waiter = std::thread::spawn(move || {
        q2.wait_woken(seen, Duration::from_secs(3600));
        tx.send(()).unwrap();
    });
    while !q.progressed.has_sleepers() {
        std::thread::yield_now();
    }
    q.nudge();
    assert!(rx.recv_timeout(Duration::from_secs(30)).is_ok(), "the nudge did not wake the waiter");
    waiter.join().unwrap();
    assert_eq!(q.progress(), progress, "stall detection must not see a nudge");
    assert_ne!(q.wake_count(), seen);
    // A waiter that read the count before a nudge does not sleep at all.
    q.wait_woken(seen, Duration::from_secs(3600));
}

/// A consumer thread for `q` that sends every message it takes.
fn consumer_of(
    q: &std::sync::Arc<Queue<u32>>,
) -> (std::thread::JoinHandle<()>, std::sync::mpsc::Receiver<u32>) {
    let (tx, rx) = std::sync::mpsc::channel();
    let q = std::sync::Arc::clone(q);
    let handle = std::thread::spawn(move || {
        while let Some(epoch) = q.begin_batch(16) {
            while let Some(m) = q.take(epoch) {
                tx.send(m).unwrap();
            }
            q.end_batch(epoch);
        }
    });
    (handle, rx)
}

fn until_napping(q: &Queue<u32>) {
    while !lock(&q.inner).napping {
        std::thread::yield_now();
    }
}

#[test]
fn a_napping_consumer_is_woken_by_urgent_messages_barriers_and_stops() {
    // Naps far longer than the test: only a wake-up gets a message to it in time.
    let nap = Nap {
        period: Duration::from_secs(600),
        window: Duration::from_secs(3600),
        urgent: |m: &u32| *m >= 100,
    };
    let q = std::sync::Arc::new(Queue::new(1000).with_nap(nap));
    q.clear_stop();
    let (consumer, rx) = consumer_of(&q);
    let within = Duration::from_secs(30);
    until_napping(&q);
    q.push(100, 1).unwrap(); // urgent: wakes it
    assert_eq!(rx.recv_timeout(within), Ok(100));
    until_napping(&q);
    q.push(1, 1).unwrap(); // lazy: waits for the nap's end, or a barrier
    assert!(q.wait_processed(2, within), "the barrier did not wake the napping consumer");
    assert_eq!(rx.recv_timeout(within), Ok(1));
    until_napping(&q);
    q.push(2, 1).unwrap();
    q.wake_napping();
    assert_eq!(rx.recv_timeout(within), Ok(2));
    until_napping(&q);
    q.request_stop();
    consumer.join().unwrap();
}

#[test]
fn after_the_nap_window_a_consumer_sleeps_and_every_push_wakes_it() {
    let nap = Nap { period: Duration::from_millis(1), window: Duration::ZERO, urgent: |_: &u32| false };
    let q = std::sync::Arc::new(Queue::new(1000).with_nap(nap));
    q.clear_stop();
    let (consumer, rx) = consumer_of(&q);
    while !q.not_empty.has_sleepers() {
        std::thread::yield_now();
    }
    assert!(!lock(&q.inner).napping);
    q.push(7, 1).unwrap();
    assert_eq!(rx.recv_timeout(Duration::from_secs(30)), Ok(7));
    q.request_stop();
    consumer.join().unwrap();
}

#[test]
fn fifo_and_sequence_numbers() {
    let q = Queue::new(100);
    q.clear_stop();
    assert_eq!(q.push('a', 10).unwrap().seq, 0);
    assert_eq!(q.push('b', 10), Ok(Pushed { seq: 1, consumer_active: true }));
    let epoch = q.begin_batch(10).unwrap();
    assert_eq!(q.enqueued(), 2);
    assert_eq!(q.processed(), 0);
    assert_eq!((q.take(epoch), q.take(epoch), q.take(epoch)), (Some('a'), Some('b'), None));
    assert_eq!(q.stats.snapshot().queued_bytes, 20, "bytes stay held until the batch ends");
    q.end_batch(epoch);
    assert_eq!(q.processed(), 2);
    assert_eq!(q.stats.snapshot().queued_bytes, 0);
    assert_eq!(q.stats.snapshot().peak_queued_bytes, 20);
}

#[test]
fn oversized_message_is_admitted_alone() {
    let q = Queue::new(8);
    assert_eq!(q.push(1, 1000).unwrap().seq, 0);
    assert_eq!(q.stats.snapshot().queued_bytes, 1000);
}

#[test]
fn pending_bytes_count_what_the_consumer_has_not_moved_into_a_batch() {
    let q = Queue::new(1000);
    q.clear_stop();
    q.push('a', 10).unwrap();
    q.push('b', 20).unwrap();
    q.push('c', 40).unwrap();
    assert_eq!(q.pending_bytes(), 70);
    let epoch = q.begin_batch(2).unwrap(); // part of the queue: a and b
    assert_eq!(q.pending_bytes(), 40);
    assert_eq!(q.take(epoch), Some('a'));
    // A stuck consumer's batch goes back to the head of the queue: b is pending again.
    q.reclaim_batch();
    assert_eq!(q.pending_bytes(), 60);
    let epoch = q.begin_batch(10).unwrap(); // the whole queue
    assert_eq!(q.pending_bytes(), 0);
    q.push('d', 5).unwrap();
    assert_eq!(q.pending_bytes(), 5);
    q.end_batch(epoch);
    assert_eq!(q.close(), vec!['d']);
    assert_eq!(q.pending_bytes(), 0);
}

#[test]
fn batches_respect_max() {
    let q = Queue::new(1000);
    for i in 0..5 {
        q.push(i, 1).unwrap();
    }
    assert_eq!(drain(&q, 2), vec![0, 1]);
    assert_eq!(q.len(), 3);
}

#[test]
fn a_batch_that_takes_the_whole_queue_leaves_later_pushes_for_the_next_one() {
    let q = Queue::new(1000);
    q.clear_stop();
    for round in 0..3 {
        for i in 0..4 {
            q.push(round * 10 + i, 1).unwrap();
        }
        let epoch = q.begin_batch(4).unwrap(); // all four: the rings are swapped
        assert_eq!((q.len(), q.remaining(epoch)), (0, 4));
        assert_eq!(q.take(epoch), Some(round * 10));
        q.push(round * 10 + 4, 1).unwrap(); // pushed while the batch is worked through
        let rest: Vec<i32> = std::iter::from_fn(|| q.take(epoch)).collect();
        assert_eq!(rest, vec![round * 10 + 1, round * 10 + 2, round * 10 + 3]);
        q.end_batch(epoch);
        assert_eq!(drain(&q, 4), vec![round * 10 + 4]);
    }
    assert_eq!((q.processed(), q.enqueued(), q.held_bytes()), (15, 15, 0));
}

#[test]
fn at_most_one_ring_keeps_a_burst_capacity() {
    let q = Queue::new(usize::MAX);
    q.clear_stop();
    let burst = 4 * KEPT_RING_SLOTS;
    let push_burst = |from: usize| {
        for i in from..from + burst {
            q.push(i, 1).unwrap();
        }
    };
    let ring_capacities = || (lock(&q.inner).items.capacity(), lock(&q.in_flight).items.capacity());
    // One burst: its ring becomes the batch's, stays large while idle, and comes back
    // to the queue at the next swap (no regrowth).
    push_burst(0);
    assert_eq!(drain(&q, burst), (0..burst).collect::<Vec<_>>());
    let (queued, idle) = ring_capacities();
    assert!(queued <= KEPT_RING_SLOTS && idle >= burst, "{queued} {idle}");
    q.push(burst, 1).unwrap();
    assert_eq!(drain(&q, burst), vec![burst]);
    assert!(ring_capacities().0 >= burst, "the burst's ring is the queue's again");
    // A second burst while the first is in flight: the queue grows a second large ring,
    // and the batch's idle one is let go when the batch ends.
    push_burst(burst + 1);
    let epoch = q.begin_batch(burst).unwrap();
    push_burst(2 * burst + 1);
    let taken: Vec<usize> = std::iter::from_fn(|| q.take(epoch)).collect();
    assert_eq!(taken, ((burst + 1)..=(2 * burst)).collect::<Vec<_>>());
    q.end_batch(epoch);
    let (queued, idle) = ring_capacities();
    assert!(queued >= burst && idle <= KEPT_RING_SLOTS, "{queued} {idle}");
    assert_eq!(drain(&q, burst), ((2 * burst + 1)..=(3 * burst)).collect::<Vec<_>>());
    assert_eq!((q.processed(), q.held_bytes()), (3 * burst as u64 + 1, 0));
}

#[test]
fn stop_request_ends_batches_only_when_empty() {
    let q = Queue::new(1000);
    q.clear_stop();
    q.push(7, 1).unwrap();
    q.request_stop();
    assert_eq!(drain(&q, 10), vec![7]);
    assert_eq!(q.begin_batch(10), None);
    q.clear_stop();
    assert!(q.push(8, 1).unwrap().consumer_active);
    assert_eq!(drain(&q, 10), vec![8]);
}

#[test]
fn close_rejects_pushes_and_returns_leftovers() {
    let q = Queue::new(1000);
    q.push(1, 1).unwrap();
    assert_eq!(q.close(), vec![1]);
    assert_eq!(q.push(2, 1), Err(PushError::Closed(2)));
    assert!(q.is_closed());
    assert_eq!((q.processed(), q.held_bytes()), (1, 0), "leftovers are accounted for");
}

#[test]
fn push_without_consumer_reports_instead_of_blocking() {
    let q = Queue::new(10);
    let first = q.push(1, 8).unwrap();
    assert!(!first.consumer_active);
    assert_eq!(q.push(2, 8), Err(PushError::NoConsumer(2)));
    q.clear_stop();
    assert_eq!(drain(&q, 10), vec![1]);
    assert_eq!(q.push(2, 8).unwrap().seq, 1);
}

#[test]
fn held_back_bytes_count_against_the_bound_but_never_keep_a_push_out() {
    let q = Queue::new(10);
    q.clear_stop();
    q.hold_back(None, 8);
    // Nothing but held-back bytes is charged: admitted, though over the bound.
    assert_eq!(q.try_push(1, 5).unwrap().seq, 0);
    assert_eq!(q.try_push(2, 1), Err(PushError::WouldBlock(2)), "13 bytes charged");
    assert_eq!(drain(&q, 10), vec![1]);
    assert_eq!(q.try_push(2, 1).unwrap().seq, 1);
    assert_eq!(q.try_push(3, 5), Err(PushError::WouldBlock(3)), "8 held back + 1 + 5");
    q.let_go(None, 8);
    assert_eq!((q.held_back_bytes(), q.held_bytes()), (0, 1));
    assert_eq!(q.try_push(3, 5).unwrap().seq, 2);
    q.let_go(None, 100); // nothing held back: frees nothing else
    assert_eq!(q.held_bytes(), 6);
}

#[test]
fn a_barrier_waits_for_a_message_held_back_after_its_batch_ended() {
    // The consumer holds message 0 back (behind a joined tap whose other parts have not
    // come) and runs messages 1 to 3: its batches end, every message counts as completed,
    // but a barrier taken after message 0's push must wait until it ran.
    let q = Queue::new(1000).with_seq(|item: &mut (u32, u64), seq| item.1 = seq);
    q.clear_stop();
    for i in 0..3 {
        q.push((i, u64::MAX), 10).unwrap();
    }
    let epoch = q.begin_batch(10).unwrap();
    let held = q.take(epoch).unwrap();
    assert_eq!(held, (0, 0), "stamped with its sequence number");
    q.hold_back(Some(held.1), 10);
    assert_eq!(q.take(epoch), Some((1, 1)));
    assert_eq!(q.take(epoch), Some((2, 2)));
    q.end_batch(epoch);
    q.push((3, u64::MAX), 10).unwrap();
    assert_eq!(drain(&q, 10), vec![(3, 3)]);
    assert_eq!(q.processed(), 4);
    assert!(!q.done_before(1) && !q.done_before(4) && q.done_before(0));
    assert!(q.only_held_before(4));
    assert_eq!(q.outstanding_before(4), 1);
    assert!(!q.wait_processed(1, Duration::from_millis(10)), "message 0 has not run");
    // Held again before the hold ends (the dispatcher re-offers it to a device held anew):
    // still outstanding until the last hold ends.
    q.hold_back(Some(held.1), 0);
    q.let_go(Some(held.1), 10);
    assert!(!q.done_before(1));
    q.let_go(Some(held.1), 0);
    assert!(q.done_before(4) && !q.only_held_before(4));
    assert!(q.wait_processed(4, Duration::ZERO));
    assert_eq!((q.outstanding_before(4), q.held_bytes(), q.held_back_bytes()), (0, 0, 0));
}

#[test]
fn a_barrier_sleeping_for_a_held_message_is_woken_when_it_is_let_go() {
    let q = std::sync::Arc::new(Queue::new(1000).with_seq(|item: &mut (u32, u64), seq| item.1 = seq));
    q.clear_stop();
    q.push((0, 0), 10).unwrap();
    let epoch = q.begin_batch(10).unwrap();
    let (_, seq) = q.take(epoch).unwrap();
    q.hold_back(Some(seq), 0);
    q.end_batch(epoch);
    let q2 = std::sync::Arc::clone(&q);
    let barrier = std::thread::spawn(move || q2.wait_processed(1, Duration::from_secs(3600)));
    while !q.progressed.has_sleepers() {
        std::thread::yield_now();
    }
    q.let_go(Some(seq), 0);
    assert!(barrier.join().unwrap());
}

#[test]
fn closing_the_queue_ends_every_hold() {
    let q = Queue::new(1000).with_seq(|item: &mut (u32, u64), seq| item.1 = seq);
    q.clear_stop();
    q.push((0, 0), 10).unwrap();
    let epoch = q.begin_batch(10).unwrap();
    let (_, seq) = q.take(epoch).unwrap();
    q.hold_back(Some(seq), 0);
    q.end_batch(epoch);
    assert!(!q.done_before(1));
    q.close();
    assert!(q.done_before(1), "nothing held runs after close: no barrier waits for it");
}

#[test]
fn push_over_bound_never_waits() {
    let q = Queue::new(10);
    q.clear_stop();
    q.push(1, 10).unwrap();
    assert_eq!(q.push_over_bound(2, 10).unwrap().seq, 1);
    assert_eq!(q.stats.snapshot().queued_bytes, 20);
}

#[test]
fn try_push_refuses_instead_of_waiting() {
    let q = Queue::new(10);
    q.clear_stop();
    q.try_push(1, 8).unwrap();
    assert_eq!(q.try_push(2, 8), Err(PushError::WouldBlock(2)));
    assert_eq!(drain(&q, 10), vec![1]);
    assert_eq!(q.try_push(2, 8).unwrap().seq, 1);
}

#[test]
fn wait_processed_times_out() {
    let q = Queue::new(1000);
    q.push(1, 1).unwrap();
    assert!(!q.wait_processed(1, Duration::from_millis(10)));
    assert!(q.wait_processed(0, Duration::from_millis(0)));
}

#[test]
fn reclaim_writes_off_taken_and_requeues_the_rest_in_order() {
    let q = Queue::new(1000);
    q.clear_stop();
    for i in 0..5 {
        q.push(i, 10).unwrap();
    }
    let stuck = q.begin_batch(3).unwrap();
    assert_eq!(q.take(stuck), Some(0));
    assert_eq!(q.take(stuck), Some(1)); // the consumer is stuck in message 1
    let r = q.reclaim_batch();
    assert_eq!(r, Reclaimed { written_off: 2, requeued: 1 });
    assert_eq!((q.processed(), q.held_bytes()), (2, 30));
    // The stuck consumer's batch is gone: its later calls change nothing.
    assert_eq!(q.take(stuck), None);
    assert_eq!(q.end_batch(stuck), 0);
    assert_eq!((q.processed(), q.held_bytes()), (2, 30));
    // A new consumer gets message 2 first, then 3 and 4.
    assert_eq!(drain(&q, 10), vec![2, 3, 4]);
    assert_eq!((q.processed(), q.held_bytes()), (5, 0));
    assert!(q.wait_processed(5, Duration::ZERO));
}

#[test]
fn retained_bytes_stay_charged_until_released() {
    let q = Queue::new(100);
    q.push(1, 60).unwrap();
    q.push(2, 30).unwrap();
    let e = q.begin_batch(10).unwrap();
    assert_eq!(q.take_retained(e, |&x| x == 2), None, "the head is not accepted");
    assert_eq!(q.take_retained(e, |&x| x == 1), Some((1, 60)));
    assert_eq!(q.take(e), Some(2));
    q.end_batch(e);
    assert_eq!((q.processed(), q.held_bytes()), (2, 60), "processed, but still charged");
    // A producer waits for the retained bytes, not for the batch.
    assert_eq!(q.push(3, 50), Err(PushError::NoConsumer(3)));
    q.release(60);
    assert_eq!(q.held_bytes(), 0);
    q.charge(70);
    assert_eq!(q.stats.snapshot().peak_queued_bytes, 90);
    assert_eq!(q.push(3, 50), Err(PushError::NoConsumer(3)));
    q.release(70);
    assert_eq!(q.push(3, 50).unwrap().seq, 2);
    assert!(!q.producers_waiting());
}

#[test]
fn end_batch_counts_untaken_messages_as_dropped() {
    let q = Queue::new(1000);
    q.push(1, 4).unwrap();
    q.push(2, 4).unwrap();
    let e = q.begin_batch(10).unwrap();
    assert_eq!(q.take(e), Some(1));
    assert_eq!(q.end_batch(e), 1);
    assert_eq!((q.processed(), q.held_bytes()), (2, 0));
}
