//! berth: PyTorch's device and memory management, in Rust.
//!
//! Devices (`cpu`, `cuda:i`, `mps`, `meta`), tensors with storage on a device, the `.to()`
//! contract, meta shape inference, caching allocators (re-exported from [`berth_alloc`] as
//! [`alloc`]), streams and events, and `nn`.

pub use berth_alloc as alloc;

pub mod cuda;
mod error;

pub use error::{Error, Result};
