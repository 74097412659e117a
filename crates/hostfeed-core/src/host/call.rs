//! A call's round trip, the same on every platform (the CPU and GPU handlers, the portable
//! transport): the request pushed with its reply slot, the wait for the consumer's reply
//! (its timeout, Ctrl-C and SIGTERM), and the error when no reply comes.
//!
//! The wait sits above the [`hub`](crate::host::hub), which keeps the waiting calls' slots
//! so that stopping can fail them; the slot itself ([`ReplySlot`]) sits below it.
//!
//! No Python here.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::Error;
use crate::host::hub::Hub;
use crate::host::interrupt;
use crate::host::message::{Message, FLAG_STATUS_OUTPUT, FLAG_SYNC_TAP};
use crate::host::reply::{NoReply, OutBuf, ReplySlot};

/// Enqueues a `call`'s request `msg` and waits for the consumer's reply (no GIL involved),
/// which writes the results into `outs` (XLA's result buffers on CPU, a staging buffer on
/// GPUs). Honours the call's timeout (`timeout_ms`; 0 waits forever), Ctrl-C and SIGTERM;
/// `name` (the callback's) is for error messages. Once a signal failed a call, every call
/// fails at once, without running, while the consumer is still processing the message it
/// was processing then (see [`Hub::stalled_by_interrupt`]).
///
/// # Errors
/// The host function's failure, a timeout or interruption, or a push error.
pub(crate) fn await_reply(
    hub: &'static Hub,
    name: &[u8],
    timeout_ms: i64,
    mut msg: Message,
    outs: Vec<OutBuf>,
) -> Result<(), Error> {
    if let Some(stall) = stall_reason(hub) {
        let name = String::from_utf8_lossy(name);
        return Err(Error::CallFailed(format!("hostfeed: host callback {name} of hcb.call was not run: {stall}")));
    }
    let slot = Arc::new(ReplySlot::new(outs));
    msg.reply = Some(Arc::clone(&slot));
    let call_id = hub.begin_call(Arc::clone(&slot));
    let deadline = u64::try_from(timeout_ms)
        .ok()
        .filter(|&ms| ms > 0)
        .map(|ms| Instant::now() + Duration::from_millis(ms));
    // Ctrl-C or SIGTERM fails the wait at once (the host function may never return), and
    // so does a signal that failed another call while the consumer is stuck where it was.
    let signals = interrupt::counts();
    let interrupted = || {
        if interrupt::wanted() {
            interrupt::install(); // again, if Python's signal.signal replaced it meanwhile
        }
        if let Some(why) = interrupt::signalled_since(signals) {
            hub.note_interrupted(why);
            return Some(why.to_string());
        }
        stall_reason(hub)
    };
    let waited = hub.push(msg).map(|()| slot.wait(deadline, interrupted));
    hub.end_call(call_id);
    match waited {
        Ok(Ok(Ok(()))) => Ok(()),
        Ok(Ok(Err(message))) => Err(Error::CallFailed(message)),
        Ok(Err(why)) => Err(no_reply_error(hub, &slot, name, timeout_ms, why)),
        Err(e) => Err(e),
    }
}

/// A `call` from a device whose thread may run the host function itself (the CPU's): run
/// there when the hub lets it ([`Hub::run_inline`]: nothing else pending, no host function
/// running) and the call has no timeout (a host function on the device's thread cannot be
/// abandoned at a deadline), else queued for the consumer thread as [`await_reply`] does.
///
/// # Errors
/// As [`await_reply`].
pub(crate) fn call_on_device_thread(
    hub: &'static Hub,
    name: &[u8],
    timeout_ms: i64,
    mut msg: Message,
    outs: Vec<OutBuf>,
) -> Result<(), Error> {
    // A plain call, or a synchronous tap (a call without results whose host function is a
    // tap function's).
    let plain = msg.flags & !(FLAG_STATUS_OUTPUT | FLAG_SYNC_TAP) == 0 && msg.host.is_none();
    if timeout_ms > 0 || !plain || !INLINE_CALLS.load(Ordering::Relaxed) || stall_reason(hub).is_some() {
        return await_reply(hub, name, timeout_ms, msg, outs);
    }
    let slot = Arc::new(ReplySlot::new(outs));
    msg.reply = Some(Arc::clone(&slot));
    let signals = interrupt::counts();
    match hub.run_inline(msg) {
        Ok(()) => {}
        Err(mut msg) => {
            // Not run: queue it with the same slot's outputs.
            msg.reply = None;
            let outs = Arc::try_unwrap(slot).map_err(|_| Error::Internal("a call's reply slot is shared".into()))?;
            return await_reply(hub, name, timeout_ms, msg, outs.into_outputs());
        }
    }
    match slot.wait(None, || None) {
        Ok(Ok(())) => Ok(()),
        Ok(Err(message)) => match interrupt::signalled_since(signals) {
            // Ctrl-C or SIGTERM during the host function: the call was interrupted, as one
            // waiting for the consumer thread would be.
            Some(why) => Err(no_reply_error(hub, &slot, name, timeout_ms, NoReply::Interrupted(why.into()))),
            None => Err(Error::CallFailed(message)),
        },
        Err(why) => Err(no_reply_error(hub, &slot, name, timeout_ms, why)),
    }
}

/// Whether a CPU `call` may run its host function on the device's thread (see
/// [`call_on_device_thread`]); `HOSTFEED_INLINE_CALLS=0` keeps every call on the consumer
/// thread.
static INLINE_CALLS: AtomicBool = AtomicBool::new(true);

/// Sets whether CPU calls may run their host function on the device's thread when nothing
/// else is pending (`HOSTFEED_CALL_THREAD`); returns the previous setting.
pub fn set_inline_calls(enabled: bool) -> bool {
    INLINE_CALLS.swap(enabled, Ordering::Relaxed)
}

/// Why no call can be answered now, in words: the consumer is stuck where it was when a
/// signal failed a call (see [`Hub::stalled_by_interrupt`]).
fn stall_reason(hub: &Hub) -> Option<String> {
    hub.stalled_by_interrupt().map(|(busy, why)| {
        format!(
            "the receiver is still running the host callback {}, for which a call was \
             interrupted ({why}); calls run again once it returns, or once a stop gives up \
             on it (HOSTFEED_STOP_TIMEOUT)",
            hub.name(busy)
        )
    })
}

/// Why a `call` has no reply, in words.
fn no_reply_error(hub: &Hub, slot: &ReplySlot, name: &[u8], timeout_ms: i64, why: NoReply) -> Error {
    let name = String::from_utf8_lossy(name).into_owned();
    match why {
        NoReply::Interrupted(reason) => Error::CallFailed(format!(
            "hostfeed: the wait for host callback {name} of hcb.call was interrupted ({reason})"
        )),
        NoReply::TimedOut => {
            let seconds = Duration::from_millis(u64::try_from(timeout_ms).unwrap_or(0)).as_secs_f64();
            let blocked_behind =
                if slot.is_started() { None } else { hub.busy_with().map(|(id, busy)| (hub.name(id), busy)) };
            Error::CallTimeout { name, seconds, blocked_behind }
        }
    }
}

/// What waits for the consumer thread in a call (a `call`, or a synchronous tap lowered as
/// one), in the words of [`Error::InsideCallback`], from the call's flags.
pub(crate) fn waiting_computation(flags: i64) -> &'static str {
    if flags & FLAG_SYNC_TAP != 0 {
        "a computation with synchronous taps"
    } else {
        "a computation containing hcb.call"
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::host::hub::{Consume, Worker};
    use crate::host::message::{gather, FLAG_SHARD};
    use crate::host::sync::lock;
    use std::sync::{mpsc, Condvar, Mutex};

    /// A consumer whose host function for consumer id 1 does not return until released;
    /// it answers every other call at once. Reports each consumer id it takes.
    struct StuckOnOne {
        released: Mutex<bool>,
        release: Condvar,
        taken: Mutex<mpsc::Sender<i64>>,
    }

    impl Consume for StuckOnOne {
        fn run(&self, worker: &Worker) {
            while let Some(batch) = worker.next_batch() {
                while let Some(m) = batch.take() {
                    lock(&self.taken).send(m.consumer_id).unwrap();
                    if m.consumer_id == 1 {
                        let mut released = lock(&self.released);
                        while !*released {
                            released = self.release.wait(released).unwrap();
                        }
                    } else if let Some(slot) = &m.reply {
                        slot.reply_with(|_| Ok(()));
                    }
                }
            }
        }
    }

    fn request(consumer_id: i64) -> Message {
        // SAFETY: no operands are read.
        unsafe { gather(consumer_id, 0, 0, std::iter::empty()) }.unwrap()
    }

    /// Answers every request, noting where it ran: `("inline", id)` on the device's
    /// thread, `("queue", id)` on the consumer's.
    struct Where {
        log: Mutex<Vec<(&'static str, i64)>>,
    }

    impl Consume for Where {
        fn run(&self, worker: &Worker) {
            while let Some(batch) = worker.next_batch() {
                while let Some(m) = batch.take() {
                    lock(&self.log).push(("queue", m.consumer_id));
                    if let Some(slot) = &m.reply {
                        slot.reply_with(|_| Ok(()));
                    }
                }
            }
        }

        fn run_inline(&self, msg: Message) -> Result<(), Message> {
            lock(&self.log).push(("inline", msg.consumer_id));
            if let Some(slot) = &msg.reply {
                slot.reply_with(|_| Ok(()));
            }
            Ok(())
        }
    }

    #[test]
    fn a_synchronous_tap_with_nothing_pending_runs_on_the_devices_thread() {
        let r: &'static Hub = Box::leak(Box::new(Hub::new(1 << 20)));
        let c = Arc::new(Where { log: Mutex::new(Vec::new()) });
        r.configure(c.clone());
        r.push(request(1)).unwrap();
        assert!(r.wait_processed(r.queue.enqueued(), Duration::from_secs(30)).unwrap());
        let sync_tap = |id: i64, flags: i64| {
            // SAFETY: no operands are read.
            unsafe { gather(id, FLAG_SYNC_TAP | flags, 0, std::iter::empty()) }.unwrap()
        };
        // A synchronous tap (a call without results): on the device's thread, as a call.
        call_on_device_thread(r, b"tap", 0, sync_tap(2, 0), Vec::new()).unwrap();
        // A joined one's part waits for its set: the consumer's; so does one with a limit.
        call_on_device_thread(r, b"part", 0, sync_tap(3, FLAG_SHARD), Vec::new()).unwrap();
        call_on_device_thread(r, b"timed", 30_000, sync_tap(4, 0), Vec::new()).unwrap();
        assert_eq!(*lock(&c.log), vec![("queue", 1), ("inline", 2), ("queue", 3), ("queue", 4)]);
        r.stop(Some(Duration::from_secs(30))).unwrap();
    }

    #[test]
    fn a_call_behind_a_host_function_a_signal_gave_up_on_fails_at_once() {
        let r: &'static Hub = Box::leak(Box::new(Hub::new(1 << 20)));
        r.set_name(1, "stuck".into());
        let (tx, taken) = mpsc::channel();
        let c = Arc::new(StuckOnOne { released: Mutex::new(false), release: Condvar::new(), taken: Mutex::new(tx) });
        r.configure(c.clone());
        // A call waits for a host function that does not return... (Timeouts of 30 s:
        // without the failures below these calls would wait that long, and fail.)
        let waiting = std::thread::spawn(move || await_reply(r, b"stuck", 30_000, request(1), Vec::new()));
        assert_eq!(taken.recv_timeout(Duration::from_secs(30)), Ok(1));
        // ...and before any signal, another call waits behind it.
        let err = await_reply(r, b"behind", 100, request(2), Vec::new()).unwrap_err();
        assert!(matches!(err, Error::CallTimeout { .. }), "{err}");
        assert_eq!(taken.try_recv(), Err(mpsc::TryRecvError::Empty));
        // A signal fails the waiting call (as `interrupted` does when it sees one)...
        r.note_interrupted("SIGTERM");
        let err = waiting.join().unwrap().unwrap_err().to_string();
        assert!(err.contains("stuck") && err.contains("interrupted (SIGTERM)"), "{err}");
        // ...and a call made while the receiver is still stuck there fails at once, unsent.
        let err = await_reply(r, b"later", 30_000, request(3), Vec::new()).unwrap_err().to_string();
        assert!(
            err.contains("later of hcb.call was not run")
                && err.contains("still running the host callback stuck")
                && err.contains("interrupted (SIGTERM)"),
            "{err}"
        );
        // Once the host function returns, calls run again: the one that timed out behind
        // it is taken (and not answered: nobody waits), then a new one is answered.
        *lock(&c.released) = true;
        c.release.notify_all();
        let deadline = Instant::now() + Duration::from_secs(30);
        while r.stalled_by_interrupt().is_some() {
            assert!(Instant::now() < deadline, "the consumer never moved on");
            std::thread::yield_now();
        }
        await_reply(r, b"again", 30_000, request(4), Vec::new()).unwrap();
        assert_eq!(taken.try_iter().collect::<Vec<_>>(), vec![2, 4]);
        r.stop(Some(Duration::from_secs(30))).unwrap();
    }
}
