//! The XLA FFI boundary: [`c_api`], a hand-written mirror of the parts of XLA's C API that
//! hostfeed uses; [`frame`], the one unsafe boundary, where a raw call frame is decoded
//! once into a safe view; and [`handlers`], the CPU handlers (`hostfeed_tap` and its
//! siblings) with the parts every platform shares (the reply wait, the panic guard, the
//! macro that defines the `extern "C"` symbols).

pub(crate) mod c_api;
pub(crate) mod frame;
pub(crate) mod handlers;
