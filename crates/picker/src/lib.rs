//! Endpoint picking: which replica of a pool should serve a request.
//!
//! Pure and synchronous: no I/O, no clock reads (time comes in as an
//! argument), so the same code runs in the gateway and in the virtual-time
//! benchmark.

pub mod endpoint;

pub use endpoint::{Endpoint, EngineState, Load, LoadGuard, Observation};
