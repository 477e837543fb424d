//! Every driver, NVRTC and cuBLAS call berth makes, each in exactly one thin wrapper (in the
//! style of cudarc's `driver/result.rs`), plus the host-OS mapping calls of
//! [`hostmem`](crate::hostmem). berth's kernels and matmul reach NVRTC, modules, launches and
//! cuBLAS only through [`kernel`](crate::kernel) and [`cublas`](crate::cublas), built on
//! `nvrtc.rs`, `module.rs` and `cublas.rs` here. (CUPTI, for the profiler's activity tracing,
//! is still called from [`activity`](crate::activity).)
//!
//! Conventions:
//! - Handles are plain integers: streams, events and contexts as `u64` (`CUstream`,
//!   `CUevent`, `CUcontext` cast through `usize`; stream 0 is the legacy default stream),
//!   device memory and virtual-memory handles as `u64`, a `CUdevice` as `i32`.
//! - A wrapper that takes a `device` index first makes that device's primary context current
//!   ([`bind`](crate::context::bind), which creates it on first use); the device-query wrappers
//!   of [`device`] (and the context wrappers `bind` itself uses) do not.
//! - Failures become [`CudaError`](crate::CudaError) through
//!   [`CudaError::from_driver`](crate::CudaError), the one place that recognises
//!   `CUDA_ERROR_OUT_OF_MEMORY`; `device` and the byte count feed it.
//! - A wrapper is an `unsafe fn` when a wrong argument can break memory safety: copies to or
//!   from raw addresses, frees, unmaps, releases, registrations, and calls on raw stream,
//!   event or context handles (which must be live). Its `# Safety` section says what the
//!   caller guarantees; callers say why in a `// SAFETY:` comment.
//! - The kernel-layer wrappers (`nvrtc.rs`, `module.rs`, `cublas.rs`) fail with
//!   [`KernelError`](crate::KernelError) instead, do not bind a context (the caller made it
//!   current), and their `# Safety` sections are numbered lists. cudarc's loaders panic when a
//!   library is missing, so each library has a presence check (`nvrtc_present`,
//!   `cublas_present`) that its callers ask first.
//! - Built without the `cuda` feature, [`twin`] replaces the driver wrappers with ones of
//!   identical signatures that answer [`CudaError::Unavailable`](crate::CudaError) (or
//!   `false`), so no other file needs a `cfg` for the driver. The callers reach them only after
//!   [`driver`](crate::driver) succeeded, which it never does without `cuda`.
//!
//! Files: `device.rs` (the driver library, its version and symbols, `cuInit`, device queries, primary contexts,
//! `cuCtxSynchronize`, `cuMemGetInfo`, peer access), `stream.rs` (streams and events), `memory.rs` (device
//! memory, virtual memory, pinned host memory, copies), `twin.rs` (all of the above without
//! `cuda`), `nvrtc.rs` (NVRTC: compile CUDA C to PTX), `module.rs` (`cuModuleLoadData`,
//! `cuModuleGetFunction`, `cuModuleUnload`, `cuLaunchKernel`), `cublas.rs` (cuBLAS handles and
//! `cublasGemmStridedBatchedEx`), `os.rs` (anonymous host mappings: `mmap`, `munmap`,
//! `madvise`), `nccl.rs` (NCCL, loaded by berth: Note [Loading NCCL]). `nvrtc.rs`, `module.rs`,
//! `cublas.rs` and `nccl.rs` have no twins: their callers
//! ([`kernel`](crate::kernel), [`cublas`](crate::cublas)) exist only with `cuda`.

#[cfg(feature = "cuda")]
mod cublas;
#[cfg(feature = "cuda")]
mod device;
#[cfg(feature = "cuda")]
mod memory;
#[cfg(feature = "cuda")]
mod module;
#[cfg(feature = "cuda")]
pub(crate) mod nccl;
#[cfg(feature = "cuda")]
mod nvrtc;
#[cfg(feature = "cuda")]
mod stream;
#[cfg(not(feature = "cuda"))]
mod twin;

pub(crate) mod os;

#[cfg(not(feature = "cuda"))]
pub(crate) use twin::*;
#[cfg(feature = "cuda")]
pub(crate) use {cublas::*, device::*, memory::*, module::*, nvrtc::*, stream::*};

/// The device attributes berth reads (`CUdevice_attribute`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Attribute {
    /// `CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR`.
    ComputeCapabilityMajor,
    /// `CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR`.
    ComputeCapabilityMinor,
    /// `CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT`.
    MultiprocessorCount,
    /// `CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED`.
    VirtualMemoryManagementSupported,
}
