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
/// `name` (the callback's) is for error messages.
///
/// # Errors
/// The host function's failure, a timeout or interruption, or a push error.
pub(crate) fn await_reply(
    receiver: &'static Hub,
    name: &[u8],
    timeout_ms: i64,
    mut msg: Message,
    outs: Vec<OutBuf>,
) -> Result<(), Error> {
    let slot = Arc::new(ReplySlot::new(outs));
    msg.reply = Some(Arc::clone(&slot));
    let call_id = receiver.begin_call(Arc::clone(&slot));
    let deadline = u64::try_from(timeout_ms)
        .ok()
        .filter(|&ms| ms > 0)
        .map(|ms| Instant::now() + Duration::from_millis(ms));
    // Ctrl-C or SIGTERM fails the wait at once (the host function may never return).
    let signals = interrupt::counts();
    let interrupted = || {
        if interrupt::wanted() {
            interrupt::install(); // again, if Python's signal.signal replaced it meanwhile
        }
        interrupt::signalled_since(signals).map(str::to_string)
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
