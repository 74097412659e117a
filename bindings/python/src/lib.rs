//! `hostfeed._receiver`: the Python extension module over `hostfeed-core`.
//!
//! The core (`crates/hostfeed-core`) has no Python; this crate turns its values into Python
//! objects and back, its modules mirroring the core's rooms. Its errors reach Python
//! through one conversion (`error::CoreError`). The module map is `ARCHITECTURE.md`
//! ("Where things live") at the repository root.
//!
//! Each module adds its own items to a Python submodule of the same name (`register`):
//! `hostfeed._receiver.host.start`, `hostfeed._receiver.record.Recorder`, ...; the top
//! module holds only the submodules, each also in `sys.modules` so that
//! `import hostfeed._receiver.host` works. The modules in layer order, ground floor first:
//! `error`, `interrupts`, `consumers` (which also makes the `messages` submodule: what a
//! consumer is handed), `host` (whose consumer also makes the
//! `batch` submodule: the state the receiver shares with the dispatcher), then `portable`,
//! `record`, `storage` and `gpu` (each imports only modules before it). `glibc` stands apart: a C
//! library function the wheel's glibc floor lacks. The stubs are
//! `python/hostfeed/_receiver/*.pyi`, one a submodule, checked by `mypy.stubtest`.

mod consumers;
mod error;
mod glibc;
mod gpu;
mod host;
mod interrupts;
mod portable;
mod record;
mod storage;

use pyo3::prelude::*;

/// The module's name, which every class's `module` names with its submodule's.
const MODULE: &str = "hostfeed._receiver";

#[pymodule]
fn _receiver(m: &Bound<'_, PyModule>) -> PyResult<()> {
    submodule(m, "error", error::register)?;
    submodule(m, "messages", consumers::register_messages)?;
    submodule(m, "consumers", consumers::register)?;
    submodule(m, "host", host::register)?;
    submodule(m, "batch", host::register_state)?;
    submodule(m, "portable", portable::register)?;
    submodule(m, "record", record::register)?;
    submodule(m, "storage", storage::register)?;
    submodule(m, "gpu", gpu::register)?;
    Ok(())
}

/// Adds submodule `name` of `m`, filled by `register`, as `m.name` and in `sys.modules`
/// (what `import hostfeed._receiver.name` looks up: an extension module is no package).
fn submodule(
    m: &Bound<'_, PyModule>,
    name: &str,
    register: fn(&Bound<'_, PyModule>) -> PyResult<()>,
) -> PyResult<()> {
    let py = m.py();
    let full = format!("{MODULE}.{name}");
    let sub = PyModule::new(py, &full)?;
    register(&sub)?;
    m.add_submodule(&sub)?;
    py.import("sys")?.getattr("modules")?.set_item(full, sub)?;
    Ok(())
}
