//! berth: PyTorch's device and memory management, in Rust.
//!
//! Devices (`cpu`, `cuda:i`, `mps`, `meta`), tensors with storage on a device, the `.to()`
//! contract, meta shape inference, caching allocators (re-exported from [`berth_alloc`] as
//! [`alloc`]), streams and events, and `nn`.
//!
//! # Layers
//! - [`Device`], [`DType`], [`Layout`]: small values.
//! - [`Storage`]: the memory (host, device, or meta with no memory), shared by views.
//! - [`Tensor`]: storage + layout + dtype; views, the `.to()` contract, math front-ends.
//! - [`ops`]: op enums and the shape/dtype inference every device shares (so meta and CPU
//!   agree); [`device_kernels::DeviceKernels`]: what a device implements (CPU here, CUDA in
//!   [`cuda`]).
//! - [`nn`]: `Module`, `Linear`, state dicts in safetensors files.

pub use berth_alloc as alloc;
/// The `half` crate, whose `f16` and `bf16` are the elements of [`DType::F16`] and [`DType::BF16`]
/// tensors (`tensor.to_vec::<berth::half::f16>()`), re-exported so that reading them needs no
/// dependency of your own.
pub use half;

mod cpu;
pub mod cuda;
pub mod device;
pub mod device_kernels;
pub mod dtype;
mod error;
pub mod layout;
pub mod meta_plan;
pub mod nn;
pub mod ops;
pub mod random;
pub mod storage;
mod tensor;

pub use device::{Device, DeviceKind, ParseDeviceError};
pub use dtype::{DType, Element};
pub use error::{Error, Result};
pub use layout::Layout;
pub use random::{manual_seed, Generator};
pub use storage::Storage;
pub use tensor::{Tensor, ToOptions};

/// The README's snippets, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct ReadmeDoctests;
