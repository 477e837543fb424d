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
//! - [`optim`]: SGD with momentum (`torch.optim.SGD`), fused into one kernel call per step.
//! - [`profiler`]: `torch.profiler` for berth: ops, copies, device time, allocator events and
//!   host waits, exported as a Chrome trace and a `key_averages()` table.
//!
//! # Where this crate sits
//! ```text
//! berth-alloc  <-  berth-cuda  <-  berth  <-  berth-data  <-  berth-cli (the `berth` binary)
//!                      ^          (this crate)
//!                      +-- berth-torch (PyTorch's pluggable CUDA allocator)
//! ```
//!
//! It depends on [`berth_alloc`] (re-exported as [`alloc`]: the allocator policies, stats and
//! snapshots) and [`berth_cuda`] (the CUDA layer, its CUDA part behind the default feature
//! `cuda`: every driver, NVRTC and cuBLAS call is made there, and berth does not depend on
//! cudarc; [`cuda`] re-exports by name the parts berth's users call). `berth-data`'s
//! `DataLoader` and the `berth` binary (crate `berth-cli`) are built on it; it re-exports
//! neither.
//!
//! # Design notes
//! - `Note [Meta storage]`: `src/meta_plan.rs` ([`meta_plan`])
//! - `Note [Kernel modules]`: `src/cuda/kernels/mod.rs`
//! - `Note [Profiler off costs one load]`: `src/profiler/mod.rs` ([`profiler`])
//! - `Note [Memory events are a leaf]`: `src/memory_events.rs` (how a storage reports to the
//!   profiler without importing it)
//! - `Note [Device clock]`: `src/profiler/device_time.rs`
//! - `Note [CUPTI device time]`: `src/profiler/device_time.rs`
//! - `Note [Small matmuls]`: `src/cpu/matmul.rs` (how a host product is sliced over threads)
//! - `Note [Fused updates are exact]`: `src/cuda/kernels/optim.rs` (why the fused SGD,
//!   `add_scaled_` and `relu_backward` kernels give the unfused ops' bits);
//!   `Note [Fused host SGD]`: `src/cpu/optim.rs`
//! - `Note [Exact integers]`: `src/cpu/mod.rs` (integer values never go through `f64`)
//! - `Note [Scalar promotion]`: `src/ops/infer.rs` (an integer tensor and a non-integral
//!   scalar give f32, as PyTorch)
//!
//! The allocator's notes are listed in [`berth_alloc`]'s docs, the driver layer's in
//! [`berth_cuda`]'s.

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
mod memory_events;
pub mod meta_plan;
pub mod nn;
pub mod ops;
pub mod optim;
pub mod profiler;
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

/// The API tour's snippets (`docs/tour.md`), compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/tour.md")]
struct TourDoctests;
