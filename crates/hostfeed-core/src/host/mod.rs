//! The host transport, the same for every platform: host memory ([`buffer`]; where the copy
//! into it runs: a device's thread keeping in step with the consumer on a shared CPU), a message,
//! its flags and the copy that builds it ([`message`]), the byte-bounded queue ([`queue`]),
//! a call's reply slot ([`reply`]), the [`hub`] that owns the queue and the consumer
//! thread's lifecycle, the barrier and the calls waiting for replies, a call's round trip
//! ([`call`]: push the request, wait for the reply), the portable transport's way in
//! ([`portable`]), the synchronisation helpers and the polls before a wait ([`sync`]), the
//! counters and latency histograms ([`stats`], [`histogram`]) and Ctrl-C during a call
//! ([`interrupt`]).
//!
//! Under `--cfg loom` only the modelled parts compile: [`sync`], [`queue`], [`reply`] and
//! what they use.

cfg_not_loom! {
    pub(crate) mod buffer;
    pub(crate) mod call;
    pub(crate) mod hub;
    pub(crate) mod interrupt;
    pub(crate) mod message;
    pub mod portable;
}
pub(crate) mod histogram;
#[cfg(all(test, loom))]
mod loom_models;
pub(crate) mod queue;
pub(crate) mod reply;
pub(crate) mod stats;
pub(crate) mod sync;
