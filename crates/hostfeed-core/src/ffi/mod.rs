//! The XLA FFI boundary: [`c_api`], a hand-written mirror of the parts of XLA's C API that
//! hostfeed uses (the crate's ground floor: it imports nothing of the crate);
//! [`handlers`], where a raw call frame is decoded once into a safe view (`Frame`), and the
//! CPU handlers (`hostfeed_tap` and its siblings) with the parts every platform's handlers
//! share (the panic guard, the macro that defines the `extern "C"`
//! symbols); [`summary`], the one-pass statistics and histograms of a record's
//! summaries, and [`summary_handlers`], the CPU's `hostfeed_stats` and `hostfeed_histogram`
//! handlers that compute them on the device's thread. The reply wait every platform shares is the host's (`host/call.rs`), and a
//! message's flags are the message's (`host/message.rs`).

pub(crate) mod c_api;
pub(crate) mod handlers;
pub(crate) mod summary;
pub(crate) mod summary_handlers;
