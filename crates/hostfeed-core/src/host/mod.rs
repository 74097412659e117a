//! The host transport, the same for every platform: host memory ([`buffer`]), a message
//! and the copy that builds it ([`message`]), the portable transport's way in ([`portable`]), the byte-bounded queue ([`queue`]), a call's
//! reply slot ([`reply`]), the [`hub`] that owns the queue and the consumer thread's
//! lifecycle, the barrier and the calls waiting for replies, the synchronisation helpers
//! ([`sync`]), the counters and latency histograms ([`stats`], [`histogram`]) and Ctrl-C
//! during a call ([`interrupt`]).
//!
//! Under `--cfg loom` only the modelled parts compile: [`sync`], [`queue`], [`reply`] and
//! what they use.

#[cfg(not(loom))]
pub(crate) mod buffer;
pub(crate) mod histogram;
#[cfg(not(loom))]
pub(crate) mod hub;
#[cfg(not(loom))]
pub(crate) mod interrupt;
#[cfg(all(test, loom))]
mod loom_models;
#[cfg(not(loom))]
pub(crate) mod message;
#[cfg(not(loom))]
pub mod portable;
pub(crate) mod queue;
pub(crate) mod reply;
pub(crate) mod stats;
pub(crate) mod sync;
