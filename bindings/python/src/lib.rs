//! `hostfeed._receiver`: the Python extension module over `hostfeed-core`.
//!
//! The core (`crates/hostfeed-core`) has no Python; this crate turns its values into Python
//! objects and back, its modules mirroring the core's rooms. Its errors reach Python
//! through one conversion (`error::CoreError`). The module map is `ARCHITECTURE.md`
//! ("Where things live") at the repository root.
//!
//! Each module adds its own items to the one Python module (`register`); there are no
//! Python submodules. The modules in layer order, ground floor first: `error`, `interrupts`,
//! `messages`, `consumers`, `batch`, `host`, then `portable`, `record`, `storage` and `gpu` (each
//! imports only modules before it). `glibc` stands apart: a C library function the wheel's
//! glibc floor lacks.

mod batch;
mod consumers;
mod error;
mod glibc;
mod gpu;
mod host;
mod interrupts;
mod messages;
mod portable;
mod record;
mod storage;

use pyo3::prelude::*;

#[pymodule]
fn _receiver(m: &Bound<'_, PyModule>) -> PyResult<()> {
    error::register(m)?;
    messages::register(m)?;
    consumers::register(m)?;
    batch::register(m)?;
    host::register(m)?;
    portable::register(m)?;
    record::register(m)?;
    storage::register(m)?;
    gpu::register(m)?;
    Ok(())
}
