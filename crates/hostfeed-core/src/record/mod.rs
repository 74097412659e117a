//! Recording: values recorded inside jitted code written as rows of Zarr v3 arrays by Rust
//! threads, with no Python per row. [`zarr`] holds just enough Zarr v3 (data types,
//! `zarr.json` documents, chunk keys, the crash-safe metadata write, record names);
//! [`recorder`] the recorder itself (its documentation tells how a record travels);
//! [`arrays`] an array's state and the writer pool's jobs; `writer` the writer and ticker
//! threads, commits and chunk files; `flush` a recorder's flush, errors and close;
//! [`sinks`] the table that routes messages to recorders from the consumer thread;
//! [`storelock`] the lock on an open store; [`trace`] writes on a profiler's timeline.

pub(crate) mod arrays;
mod flush;
pub(crate) mod recorder;
pub(crate) mod sinks;
pub(crate) mod storelock;
#[cfg(test)]
mod tests;
pub(crate) mod trace;
mod writer;
pub(crate) mod zarr;
