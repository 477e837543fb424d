//! Backends that wrap a backend and are backends themselves (RMM's resource adaptors).
//!
//! Compose them: `Limit::new(FaultInject::new(SimBackend::new(cap)), 3 << 30)` is "a 3 GiB GPU
//! that fails on the Nth cudaMalloc". Each forwards the virtual-memory capability of the backend
//! it wraps, applying its own rule to `map` as to `malloc`.

mod counting;
mod fault;
mod limit;

pub use counting::{CallCounts, Counting};
pub use fault::FaultInject;
pub use limit::Limit;
