//! Recording: values recorded inside jitted code written as rows of Zarr v3 arrays by Rust
//! threads, with no Python per row. The files, ground floor first (each imports only
//! files before it):
//!
//! - [`store`]: where the bytes go, the seam for storage back-ends (the
//!   [`Store`](store::Store) trait) and the file system's implementation, which the
//!   recorder uses;
//! - [`trace`]: writes on a profiler's timeline;
//! - [`zarr`]: just enough Zarr v3 (data types, `zarr.json` documents, chunk keys, the
//!   crash-safe metadata write, record names);
//! - [`shard`]: Zarr shards (inner chunks and their index), written whole, in place or
//!   streamed to an object store ([`ShardUpload`](shard::ShardUpload));
//! - [`storelock`]: the lock on an open store (an `flock`, file systems only);
//! - [`objects`]: object stores (S3, GCS, Azure) as a [`Store`](store::Store), and their
//!   lock (a conditionally created object with a lease);
//! - [`common`]: what every file shares (an array's id, the byte budget, the options);
//! - [`backend`]: the storage back-ends, each owning its store, its lock and its URL
//!   schemes (the file system, the in-memory store, object stores), and their registry;
//! - [`arrays`]: an array's state, its metadata arrays' layout and the writers' jobs;
//! - [`catalogue`]: the arrays a recorder knows (names, handles, parted arrays, the
//!   transforms table, summaries);
//! - [`failures`]: the errors a recorder's next flush reports;
//! - [`commit`]: announcing written rows in `zarr.json`;
//! - [`window`]: the flight recorder's window (rows of the last steps kept in memory) and
//!   its triggers (which write them, listed in the store's root attributes);
//! - `writer`: the writer and ticker threads, the encoding of chunks;
//! - [`recorder`]: the recorder itself, composing those parts (its documentation tells how a
//!   record travels; its own files: declaring arrays, routing rows, flush and close, parted
//!   arrays, appending to a store);
//! - [`sinks`]: the table that routes messages to recorders from the consumer thread.

pub(crate) mod arrays;
pub(crate) mod backend;
pub(crate) mod catalogue;
pub(crate) mod commit;
pub(crate) mod common;
pub(crate) mod failures;
pub(crate) mod objects;
pub(crate) mod recorder;
pub(crate) mod shard;
pub(crate) mod sinks;
pub(crate) mod store;
pub(crate) mod storelock;
#[cfg(test)]
mod tests;
pub(crate) mod trace;
pub(crate) mod window;
mod writer;
pub(crate) mod zarr;
