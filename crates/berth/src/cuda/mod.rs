//! CUDA: the driver layer of [`berth_cuda`] (re-exported here whole: discovery, contexts,
//! streams, events, memory backends, the allocator registry and memory API, byte copies) plus
//! berth's tensor level on top of it: device and pinned storages and `.to()` transfers,
//! `Tensor::pin_memory`, and kernels.
//!
//! Every entry point answers "not available" on a machine without the NVIDIA driver and never
//! panics there (see [`berth_cuda`]); built without the `cuda` feature, everything compiles and
//! answers "not available".
//!
//! Files here (the tensor level): `transfer.rs` (`.to()` copies, device and pinned storages,
//! built on [`copy`]), `pin.rs` (`pin_memory`), `kernels/` (NVRTC kernels), `blas.rs`
//! (cuBLAS), `rand.rs` (the device generator), `ops.rs` (the CUDA `DeviceKernels`). The
//! driver layer's files are listed in [`berth_cuda`]'s docs.

pub use berth_cuda::*;

#[cfg(feature = "cuda")]
pub mod blas;
#[cfg(feature = "cuda")]
pub mod kernels;
#[cfg(feature = "cuda")]
pub mod ops;
mod pin;
#[cfg(feature = "cuda")]
pub mod rand;
mod record_stream;
pub mod transfer;

pub use pin::legacy_type_name;
