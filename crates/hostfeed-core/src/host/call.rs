//! A call's round trip, the same on every platform (the CPU and GPU handlers, the portable
//! transport): the request pushed with its reply slot, the wait for the consumer's reply
//! (its timeout, Ctrl-C and SIGTERM), and the error when no reply comes.
//!
//! The wait sits above the [`hub`](crate::host::hub), which keeps the waiting calls' slots
//! so that stopping can fail them; the slot itself ([`ReplySlot`]) sits below it.
//!
//! No Python here.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::Error;
use crate::host::hub::Hub;
use crate::host::interrupt;
use crate::host::message::{Message, FLAG_SYNC_TAP};
use crate::host::reply::{NoReply, OutBuf, ReplySlot};

/// Enqueues a `call`'s request `msg` and waits for the consumer's reply (no GIL involved),
/// which writes the results into `outs` (XLA's result buffers on CPU, a staging buffer on
/// GPUs). Honours the call's timeout (`timeout_ms`; 0 waits forever), Ctrl-C and SIGTERM;
/// `name` (the callback's) is for error messages. `run` is XLA's id of the execution
/// (`None` where there is none, in the portable transport): once a signal failed one of
/// its calls, its other calls fail too, those that wait and those still to come, without
/// running their host function.
///
/// # Errors
/// The host function's failure, a timeout or interruption, or a push error.
pub(crate) fn await_reply(
    receiver: &'static Hub,
    name: &[u8],
    timeout_ms: i64,
    run: Option<i64>,
    mut msg: Message,
    outs: Vec<OutBuf>,
) -> Result<(), Error> {
    if let Some(why) = run.and_then(interrupt::run_failed) {
        let name = String::from_utf8_lossy(name);
        return Err(Error::CallFailed(format!(
            "hostfeed: host callback {name} of hcb.call was not run: its execution was interrupted ({why})"
        )));
    }
    let slot = Arc::new(ReplySlot::new(outs));
    msg.reply = Some(Arc::clone(&slot));
    let call_id = receiver.begin_call(Arc::clone(&slot));
    let deadline = u64::try_from(timeout_ms)
        .ok()
        .filter(|&ms| ms > 0)
        .map(|ms| Instant::now() + Duration::from_millis(ms));
    // Ctrl-C or SIGTERM fails the wait at once (the host function may never return), and
    // so does one that failed another call of this execution.
    let signals = interrupt::counts();
    let interrupted = || {
        if interrupt::wanted() {
            interrupt::install(); // again, if Python's signal.signal replaced it meanwhile
        }
        if let Some(why) = interrupt::signalled_since(signals) {
            if let Some(run) = run {
                interrupt::fail_run(run, why);
            }
            return Some(why.to_string());
        }
        run.and_then(interrupt::run_failed).map(str::to_string)
    };
    let waited = receiver.push(msg).map(|()| slot.wait(deadline, interrupted));
    receiver.end_call(call_id);
    match waited {
        Ok(Ok(Ok(()))) => Ok(()),
        Ok(Ok(Err(message))) => Err(Error::CallFailed(message)),
        Ok(Err(why)) => Err(no_reply_error(receiver, &slot, name, timeout_ms, why)),
        Err(e) => Err(e),
    }
}

/// Why a `call` has no reply, in words.
fn no_reply_error(receiver: &Hub, slot: &ReplySlot, name: &[u8], timeout_ms: i64, why: NoReply) -> Error {
    let name = String::from_utf8_lossy(name).into_owned();
    match why {
        NoReply::Interrupted(reason) => Error::CallFailed(format!(
            "hostfeed: the wait for host callback {name} of hcb.call was interrupted ({reason})"
        )),
        NoReply::TimedOut => {
            let seconds = Duration::from_millis(u64::try_from(timeout_ms).unwrap_or(0)).as_secs_f64();
            let blocked_behind = if slot.is_started() {
                None
            } else {
                receiver.busy_with().map(|(id, busy)| (receiver.name(id), busy))
            };
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
    use crate::host::message::gather;
    use crate::host::sync::lock;
    use std::sync::mpsc;
    use std::sync::Mutex;

    /// A consumer that keeps every message without replying (a host function that never
    /// returns) and reports each consumer id it takes.
    struct NeverReplies {
        kept: Mutex<Vec<Message>>,
        taken: Mutex<mpsc::Sender<i64>>,
    }

    impl Consume for NeverReplies {
        fn run(&self, worker: &Worker) {
            while let Some(batch) = worker.next_batch() {
                while let Some(m) = batch.take() {
                    lock(&self.taken).send(m.consumer_id).unwrap();
                    lock(&self.kept).push(m);
                }
            }
        }
    }

    fn hub() -> (&'static Hub, mpsc::Receiver<i64>) {
        let r: &'static Hub = Box::leak(Box::new(Hub::new(1 << 20)));
        let (tx, rx) = mpsc::channel();
        r.configure(Arc::new(NeverReplies { kept: Mutex::new(Vec::new()), taken: Mutex::new(tx) }));
        (r, rx)
    }

    fn request(consumer_id: i64) -> Message {
        // SAFETY: no operands are read.
        unsafe { gather(consumer_id, 0, 0, std::iter::empty()) }.unwrap()
    }

    // Run ids of their own, so that no other test's calls are failed by these.
    const RUN: i64 = -7_000_001;
    const OTHER_RUN: i64 = -7_000_002;

    #[test]
    fn a_signal_that_failed_one_call_fails_the_rest_of_its_execution() {
        let (r, taken) = hub();
        // A call of the execution waits for a host function that never returns...
        // (Timeouts of 30 s: without the failure these would wait that long, and fail.)
        let waiting =
            std::thread::spawn(move || await_reply(r, b"stuck", 30_000, Some(RUN), request(1), Vec::new()));
        assert_eq!(taken.recv_timeout(Duration::from_secs(30)), Ok(1));
        // ...until a signal fails another call of the same execution.
        interrupt::fail_run(RUN, "SIGTERM");
        let err = waiting.join().unwrap().unwrap_err().to_string();
        assert!(err.contains("stuck") && err.contains("interrupted (SIGTERM)"), "{err}");
        // A call of that execution that comes later fails at once, without being sent.
        let err = await_reply(r, b"later", 30_000, Some(RUN), request(2), Vec::new()).unwrap_err().to_string();
        assert!(err.contains("later") && err.contains("was not run") && err.contains("(SIGTERM)"), "{err}");
        // Another execution's call and a call without a run id are not failed by it.
        for (run, id) in [(Some(OTHER_RUN), 3), (None, 4)] {
            let err = await_reply(r, b"other", 100, run, request(id), Vec::new()).unwrap_err();
            assert!(matches!(err, Error::CallTimeout { .. }), "{err}");
            assert_eq!(taken.recv_timeout(Duration::from_secs(30)), Ok(id));
        }
        assert!(taken.try_recv().is_err(), "the later call of the failed execution was sent");
        r.stop(Some(Duration::from_millis(100))).unwrap();
    }
}
