//! The host buffer pool's limit and reservations (a process of its own: the pool is global).
#![cfg(not(loom))] // the loom build swaps the primitives; it runs only the models (--lib)

use hostfeed_core::{
    pool_idle_bytes, pool_limit, set_pool_limit, HostBuffer, PoolReservation, DEFAULT_POOL_BYTES,
};

const MIB: usize = 1 << 20;

/// Allocates `n` buffers of `bytes` at once, then frees them all.
fn burst(n: usize, bytes: usize) {
    let bufs: Vec<HostBuffer> = (0..n).map(|_| HostBuffer::with_capacity(bytes).unwrap()).collect();
    assert!(bufs.iter().all(|b| b.capacity() >= bytes));
    drop(bufs);
}

#[test]
fn reservations_raise_the_pool_limit_unless_the_user_chose_it() {
    assert_eq!(pool_limit(), DEFAULT_POOL_BYTES);
    burst(12, 8 * MIB);
    assert_eq!(pool_idle_bytes(), DEFAULT_POOL_BYTES, "the default keeps 64 MiB of the 96 MiB burst");

    let reservation = PoolReservation::new(128 * MIB);
    assert_eq!(pool_limit(), 128 * MIB);
    burst(12, 8 * MIB);
    assert_eq!(pool_idle_bytes(), 96 * MIB, "a reservation keeps the whole burst warm");
    let second = PoolReservation::new(64 * MIB);
    assert_eq!(pool_limit(), 192 * MIB, "reservations add up");
    drop(second);
    assert_eq!(pool_limit(), 128 * MIB);
    assert_eq!(pool_idle_bytes(), 96 * MIB);
    drop(reservation);
    assert_eq!(pool_limit(), DEFAULT_POOL_BYTES);
    assert!(pool_idle_bytes() <= DEFAULT_POOL_BYTES, "releasing trims the pool back");

    let huge = PoolReservation::new(usize::MAX / 2);
    assert_eq!(pool_limit(), hostfeed_core::MAX_RESERVATION, "one reservation is capped");
    drop(huge);

    set_pool_limit(16 * MIB);
    assert!(pool_idle_bytes() <= 16 * MIB);
    let ignored = PoolReservation::new(128 * MIB);
    assert_eq!(pool_limit(), 16 * MIB, "HOSTFEED_BUFFER_POOL_BYTES wins over reservations");
    burst(12, 8 * MIB);
    assert!(pool_idle_bytes() <= 16 * MIB);
    drop(ignored);
}
