//! Rows given whole by Python, as bytes: values that reach the host through it
//! (global-view records joined from their shards, inline mode) and the recorded outputs
//! of a step (`Recorder.step`), whose pipeline waits for room under the byte bound.

use crate::error::RecordError;
use crate::host::buffer::HostBuffer;
use crate::record::arrays::Row;
use crate::record::common::ArrayId;
use crate::record::recorder::Recorder;

impl Recorder {
    /// Records one row of array `id` from `buf` without copying it (bytes a caller lends:
    /// the host copy of a recorded step's output), after waiting for room under the byte
    /// bound; the buffer is dropped (its keeper with it) once the row is written.
    ///
    /// # Errors
    /// As [`Recorder::append`].
    pub fn append_lent(
        &self,
        id: ArrayId,
        buf: HostBuffer,
        len: usize,
        step: i64,
        device: i32,
        transforms: i16,
    ) -> Result<(), RecordError> {
        let a = self.array(id).ok_or_else(|| RecordError::Invalid(format!("no array with id {id}")))?;
        if len != a.spec.row_bytes() || len > buf.capacity() {
            return Err(RecordError::Invalid(format!(
                "{}: a row has {} bytes, got {len}",
                a.context(),
                a.spec.row_bytes()
            )));
        }
        if self.is_closed() {
            if !self.forked_away() {
                self.note_late(&a);
            }
            return Err(self.closed_error());
        }
        self.budget.wait_for_room(len);
        self.budget.charge(len);
        let payload = self.hold(buf, len);
        let meta = self.meta(step, device, transforms);
        self.route_row(&a, Row { payload, offset: 0, len, meta });
        Ok(())
    }

    /// [`Recorder::append`] after waiting for room under the byte bound (a producer that
    /// is not the consumer thread: rows of a recorded step's outputs).
    ///
    /// # Errors
    /// As [`Recorder::append`].
    pub fn append_waiting(
        &self,
        id: ArrayId,
        data: &[u8],
        step: i64,
        device: i32,
        transforms: i16,
    ) -> Result<(), RecordError> {
        self.budget.wait_for_room(data.len());
        self.append(id, data, step, device, transforms)
    }

    /// Records one row of array `id` copied from `data` (the path of values that reach
    /// the host through Python: global-view records joined from shards, inline mode).
    ///
    /// # Errors
    /// A size that does not match the array's rows, an unknown array, a closed recorder.
    pub fn append(
        &self,
        id: ArrayId,
        data: &[u8],
        step: i64,
        device: i32,
        transforms: i16,
    ) -> Result<(), RecordError> {
        let a = self.array(id).ok_or_else(|| RecordError::Invalid(format!("no array with id {id}")))?;
        if data.len() != a.spec.row_bytes() {
            return Err(RecordError::Invalid(format!(
                "{}: a row has {} bytes, got {}",
                a.context(),
                a.spec.row_bytes(),
                data.len()
            )));
        }
        if self.is_closed() {
            if !self.forked_away() {
                self.note_late(&a);
            }
            return Err(self.closed_error());
        }
        let mut buf = HostBuffer::with_capacity(data.len())
            .map_err(|e| RecordError::Io { errno: Some(libc::ENOMEM), message: e.to_string() })?;
        if !data.is_empty() {
            // SAFETY: the buffer was allocated with room for `data.len()` bytes; a fresh
            // allocation cannot overlap `data`.
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), buf.as_mut_ptr(), data.len()) };
        }
        let charged = buf.capacity();
        self.budget.charge(charged);
        let payload = self.hold(buf, charged);
        let meta = self.meta(step, device, transforms);
        self.route_row(&a, Row { payload, offset: 0, len: data.len(), meta });
        Ok(())
    }
}
