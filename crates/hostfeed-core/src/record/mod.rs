//! Recording: values recorded inside jitted code written as rows of Zarr v3 arrays by Rust
//! threads, with no Python per row. [`zarr`] holds just enough Zarr v3 (data types,
//! `zarr.json` documents, chunk keys, the crash-safe metadata write, record names);
//! [`recorder`] the recorder itself: its arrays, the writer threads and commits, and the
//! sinks that route messages to it from the consumer thread.

pub(crate) mod recorder;
pub(crate) mod storelock;
pub(crate) mod zarr;
