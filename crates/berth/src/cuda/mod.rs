//! CUDA: berth's tensor level on top of [`berth_cuda`] (device and pinned storages and
//! `.to()` transfers, `Tensor::pin_memory`, kernels, matmul, the device generator), plus the
//! parts of berth-cuda that berth's users call, re-exported by name below.
//!
//! Every entry point answers "not available" on a machine without the NVIDIA driver and never
//! panics there (see [`berth_cuda`]); built without the `cuda` feature, everything compiles and
//! answers "not available".
//!
//! # Where the CUDA calls are made
//! Not here: every driver, NVRTC and cuBLAS call is made in berth-cuda's `ffi` module, and
//! this crate does not depend on cudarc. The kernels reach NVRTC, module loading and launches
//! through [`berth_cuda::kernel`], the matmul reaches cuBLAS through [`berth_cuda::cublas`],
//! and storages and transfers use berth-cuda's allocators, streams, events and byte copies.
//!
//! Files here (the tensor level): `transfer.rs` (`.to()` copies, device and pinned storages,
//! built on berth-cuda's `copy`), `pin.rs` (`pin_memory`), `record_stream.rs`
//! (`Tensor::record_stream`), `kernels/` (berth's CUDA C kernels), `blas.rs` (matmul),
//! `rand.rs` (the device generator), `ops.rs` (the CUDA `DeviceKernels`). The driver layer's
//! files are listed in [`berth_cuda`]'s docs.
//!
//! # Re-exported from berth-cuda
//! - availability and devices: [`is_available`], [`unavailable_reason`], [`device_count`],
//!   [`current_device`], [`set_device`], [`device_scope`], [`DeviceGuard`],
//!   [`check_device`], [`get_device_name`], [`get_device_properties`],
//!   [`DeviceProperties`], [`mem_get_info`];
//! - contexts: [`bind_context`], [`synchronize`], [`is_initialized`],
//!   [`initialized_devices`], [`contexts_created`];
//! - streams and events: [`Stream`], [`StreamGuard`], [`current_stream`], [`Event`];
//! - the memory API (`torch.cuda`'s names): [`memory_allocated`],
//!   [`max_memory_allocated`], [`memory_reserved`], [`max_memory_reserved`],
//!   [`memory_stats`], [`memory_summary`], [`memory_snapshot`], [`record_memory_history`],
//!   [`reset_peak_memory_stats`], [`reset_accumulated_memory_stats`], [`empty_cache`],
//!   [`host_empty_cache`], [`set_per_process_memory_fraction`], [`allocator_policy`],
//!   [`CudaDeviceArg`], and the module [`memory`];
//! - sync debugging and host waits: [`SyncDebugMode`], [`set_sync_debug_mode`],
//!   [`get_sync_debug_mode`], [`take_sync_reports`], [`host_waits`], [`thread_host_waits`],
//!   [`HostWaitHook`], [`set_host_wait_hook`];
//! - backends for benchmarks and replays: [`CudaBackend`] (and its module [`backend`]),
//!   [`CudaHostBackend`];
//! - errors: [`CudaError`], [`KernelError`];
//! - sleep and wake of tagged memory under `paged` ([`sleep`]: `TagGuard`, `sleep`, `wake`,
//!   `sleep_stats`), for berth's own tensors as for `berth_torch`;
//! - the GPU gate for tests: [`testing`].
//!
//! Everything else of berth-cuda (its byte copies, host mappings, registries, CUPTI tracing,
//! the kernel and cuBLAS calls) is reached as `berth_cuda::...`.

#[doc(hidden)]
pub use berth_cuda::pin_probe;
pub use berth_cuda::{
    allocator_policy, bind_context, check_device, contexts_created, current_device, current_stream,
    device_count, device_scope, empty_cache, get_device_name, get_device_properties,
    get_sync_debug_mode, host_empty_cache, host_waits, initialized_devices, is_available,
    is_initialized, max_memory_allocated, max_memory_reserved, mem_get_info, memory_allocated,
    memory_reserved, memory_snapshot, memory_stats, memory_summary, record_memory_history,
    reset_accumulated_memory_stats, reset_peak_memory_stats, set_device, set_host_wait_hook,
    set_per_process_memory_fraction, set_sync_debug_mode, synchronize, take_sync_reports,
    thread_host_waits, unavailable_reason, CudaBackend, CudaDeviceArg, CudaError, CudaHostBackend,
    DeviceGuard, DeviceProperties, Event, HostWaitHook, KernelError, Stream, StreamGuard,
    SyncDebugMode,
};
pub use berth_cuda::{backend, memory, sleep, testing};
// The transfer and pinning code reaches these as `super::...`.
pub(crate) use berth_cuda::{copy, hostmem, pinned, sync_point};

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
