//! A shard written piece by piece into an object store: held and put in one request, or
//! streamed as a multipart upload (see "Shards" in the parent module's documentation).

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use object_store::path::Path as Key;
use object_store::{ObjectStoreExt, PutMode, PutOptions, PutPayload};

use super::{Objects, PARTS_IN_FLIGHT, PART};
use crate::error::RecordError;
use crate::record::store::Streamed;

/// An object written piece by piece ([`Streamed`]; see "Shards" in the module
/// documentation): its pieces held while the store may hold them, and put in one request
/// at [`Streamed::finish`]; else a multipart upload, the pieces gathered into parts of at
/// least [`PART`] bytes (S3's least is 5 MiB, but for the last), each sent as soon as it is
/// complete, up to [`PARTS_IN_FLIGHT`] at a time (the writer waits for the oldest beyond
/// that).
pub(super) struct Upload {
    pub(super) objects: Arc<Objects>,
    pub(super) path: PathBuf,
    pub(super) key: Key,
    /// The pieces held (while `parts` is `None`), and their bytes, reserved in the store.
    pub(super) held: Vec<bytes::Bytes>,
    pub(super) held_bytes: usize,
    /// The multipart upload, once the object could not be held.
    pub(super) parts: Option<Box<dyn object_store::MultipartUpload>>,
    pub(super) buffer: Vec<u8>,
    pub(super) in_flight: std::collections::VecDeque<tokio::task::JoinHandle<Result<(), object_store::Error>>>,
}

impl Upload {
    fn send(&mut self, bytes: Vec<u8>) -> Result<(), RecordError> {
        while self.in_flight.len() >= PARTS_IN_FLIGHT {
            self.wait_oldest()?;
        }
        let Some(parts) = self.parts.as_mut() else {
            unreachable!("parts are sent once the multipart upload has started")
        };
        let part = parts.put_part(PutPayload::from(bytes));
        self.in_flight.push_back(self.objects.rt.spawn(part));
        Ok(())
    }

    /// Starts the multipart upload and sends the pieces held so far as its first parts
    /// (their reservation released: from now on at most [`PARTS_IN_FLIGHT`] parts wait).
    fn start_multipart(&mut self) -> Result<(), RecordError> {
        let upload = self.objects.run(self.objects.inner.put_multipart(&self.key));
        self.parts = Some(upload.map_err(|e| self.objects.fail("start", &self.path, &e))?);
        self.objects.release_held(std::mem::take(&mut self.held_bytes));
        for piece in std::mem::take(&mut self.held) {
            self.gather(Vec::from(piece))?;
        }
        Ok(())
    }

    /// Adds a piece to the part being gathered; sends the part once it is large enough.
    fn gather(&mut self, bytes: Vec<u8>) -> Result<(), RecordError> {
        if self.buffer.is_empty() {
            self.buffer = bytes; // no copy: a piece of a part's size or more goes as it is
        } else {
            self.buffer.extend_from_slice(&bytes);
        }
        if self.buffer.len() >= PART {
            let part = std::mem::take(&mut self.buffer);
            self.send(part)?;
        }
        Ok(())
    }

    fn wait_oldest(&mut self) -> Result<(), RecordError> {
        let Some(h) = self.in_flight.pop_front() else { return Ok(()) };
        match self.objects.run(h) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(self.objects.fail("upload a part of", &self.path, &e)),
            Err(e) => Err(RecordError::Io { errno: Some(libc::EIO), message: format!("cannot upload a part of {}: {e}", self.path.display()) }),
        }
    }

    /// Stops the parts in flight and aborts the multipart upload, if one was started (its
    /// parts are then freed on the server rather than left to a lifecycle rule).
    fn abort(&mut self) {
        for h in self.in_flight.drain(..) {
            h.abort();
        }
        if let Some(mut parts) = self.parts.take() {
            let _ = self.objects.run(parts.abort());
            self.objects.multipart_aborts.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl Drop for Upload {
    /// An upload dropped unfinished (its writer failed elsewhere) frees what it held and
    /// aborts its multipart upload: no object appears, and no parts stay on the server.
    fn drop(&mut self) {
        self.objects.release_held(std::mem::take(&mut self.held_bytes));
        self.abort();
    }
}

impl Streamed for Upload {
    fn push(&mut self, bytes: Vec<u8>) -> Result<(), RecordError> {
        if self.parts.is_none() {
            if self.objects.try_hold(self.held_bytes, bytes.len()) {
                self.held_bytes += bytes.len();
                self.held.push(bytes::Bytes::from(bytes));
                return Ok(());
            }
            if let Err(e) = self.start_multipart() {
                self.abort();
                return Err(e);
            }
        }
        if let Err(e) = self.gather(bytes) {
            self.abort();
            return Err(e);
        }
        Ok(())
    }

    fn finish(mut self: Box<Self>) -> Result<(), RecordError> {
        if self.parts.is_none() {
            // Held whole: one request (retried as a whole by the client).
            let payload: PutPayload = std::mem::take(&mut self.held).into_iter().collect();
            self.objects.pace(&self.key);
            let opts = PutOptions { mode: PutMode::Overwrite, ..PutOptions::default() };
            let done = self.objects.run(self.objects.inner.put_opts(&self.key, payload, opts));
            self.objects.single_puts.fetch_add(1, Ordering::Relaxed);
            return done.map(|_| ()).map_err(|e| self.objects.fail("put", &self.path, &e));
        }
        let last = std::mem::take(&mut self.buffer);
        let sent = (if last.is_empty() { Ok(()) } else { self.send(last) }).and_then(|()| {
            while !self.in_flight.is_empty() {
                self.wait_oldest()?;
            }
            Ok(())
        });
        if let Err(e) = sent {
            self.abort();
            return Err(e);
        }
        self.objects.pace(&self.key);
        let Some(mut parts) = self.parts.take() else { unreachable!("a multipart upload was started") };
        let done = self.objects.run(parts.complete());
        self.objects.multipart_puts.fetch_add(1, Ordering::Relaxed);
        done.map(|_| ()).map_err(|e| self.objects.fail("complete", &self.path, &e))
    }
}
