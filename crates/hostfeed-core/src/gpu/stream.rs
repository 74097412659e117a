//! What a GPU platform implements: a [`Stream`] (the device's work queue) and its
//! [`Completion`] markers; and the key Python gets for a GPU's messages.

use crate::error::Error;
use crate::host::buffer::HostBuffer;

/// A marker in a stream that completes when the work enqueued before it has.
pub(crate) trait Completion: Send {
    /// Waits until the marker completed.
    ///
    /// # Errors
    /// The device reported an error (the work before the marker may not have run).
    fn wait(&self) -> Result<(), Error>;
}

/// A device's queue of work, as the GPU handlers use it. Every operation is enqueued
/// after the work already in the stream and completes before the work enqueued later.
pub(crate) trait Stream {
    /// Enqueues a copy of `n` bytes from device address `src` to host memory `dst`.
    ///
    /// # Errors
    /// The copy could not be enqueued.
    ///
    /// # Safety
    /// `src` must be device memory readable for `n` bytes until the copy ran; `dst` must
    /// be pinned host memory writable for `n` bytes, untouched until the copy completed.
    unsafe fn copy_to_host(&self, dst: *mut u8, src: *const u8, n: usize) -> Result<(), Error>;

    /// Enqueues a copy of `n` bytes from host memory `src` to device address `dst`.
    ///
    /// # Errors
    /// The copy could not be enqueued.
    ///
    /// # Safety
    /// `src` must be pinned host memory readable for `n` bytes, unchanged and alive until
    /// the copy completed; `dst` must be device memory writable for `n` bytes.
    unsafe fn copy_to_device(&self, dst: *mut u8, src: *const u8, n: usize) -> Result<(), Error>;

    /// Records a marker that completes once the work enqueued so far has.
    ///
    /// # Errors
    /// The marker could not be recorded.
    fn record(&self) -> Result<Box<dyn Completion>, Error>;

    /// Waits until everything enqueued so far has completed.
    ///
    /// # Errors
    /// The device reported an error.
    fn synchronize(&self) -> Result<(), Error>;

    /// A buffer of pinned host memory of `len` bytes (from the pool).
    ///
    /// # Errors
    /// The memory cannot be had.
    fn host_buffer(&self, len: usize) -> Result<HostBuffer, Error>;
}

/// The key Python gets for a GPU's messages in place of its ordinal: `-2 - ordinal`, so
/// that it never equals a CPU device's ordinal (non-negative) nor the host's own messages'
/// -1 (eager taps, control messages); `receiver.device_for_ordinal` decodes it. In Rust,
/// `Message::device` keeps the ordinal and `FLAG_GPU` marks the message.
#[must_use]
pub fn device_key(ordinal: i32) -> i32 {
    -2 - ordinal
}
