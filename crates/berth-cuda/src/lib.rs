//! berth-cuda: the CUDA layer of berth, through cudarc with dynamic loading: discovery,
//! primary contexts, streams, events, device and pinned memory backends for berth-alloc's
//! caching allocators, the per-device allocator registry with the `torch.cuda` memory API,
//! byte-level copies, and the calls berth's kernels need (NVRTC compilation, module loading
//! and launches in [`kernel`], cuBLAS gemm in [`cublas`]). It knows no tensors: berth builds
//! storages, `.to()`, its kernels and matmul on top of it, and re-exports the parts its users
//! need as `berth::cuda`.
//!
//! Every entry point answers "not available" on a machine without the NVIDIA driver and never
//! panics there: nothing calls into cudarc before the driver library was found and `cuInit`
//! succeeded ([`unavailable_reason`] says why not); a missing `libnvrtc` or `libcublas` is a
//! [`KernelError::Unavailable`]. Built without the default feature `cuda` (no cudarc at all),
//! everything compiles and answers "not available". Only cudarc's `sys` / `result` layers are
//! used, and every driver, NVRTC and cuBLAS call is made in one module tree (`ffi`; CUPTI,
//! for [`activity`], is the exception); berth itself does not depend on cudarc. Memory is owned
//! by berth's allocators, never by cudarc's self-freeing `CudaSlice`.
//!
//! # Where this crate sits
//! ```text
//! berth-alloc  <-  berth-cuda  <-  berth  <-  berth-data  <-  berth-cli (the `berth` binary)
//!                  (this crate)
//!                      ^
//!                      +-- berth-torch (PyTorch's pluggable CUDA allocator)
//! ```
//!
//! It depends on [`berth_alloc`] (whose [`MemoryBackend`](berth_alloc::MemoryBackend) and
//! [`HostBackend`](berth_alloc::HostBackend) it implements, and whose policies it installs per
//! device) and on `cudarc` (feature `cuda` with its `driver`, `nvrtc`, `cublas` and `cupti`
//! parts, dynamic loading: no CUDA toolkit at build time). `berth` re-exports the parts its
//! users need as `berth::cuda` and builds tensors on it; `berth-torch` hands its backends to
//! PyTorch.
//!
//! Files:
//! - `ffi/` — every driver, NVRTC and cuBLAS call, each once, with the no-`cuda` twins
//!   (`ffi/twin.rs`) and the host mapping calls (`ffi/os.rs`);
//! - `driver.rs` — the gate (is the driver there, `cuInit`, device count);
//! - `device.rs` — discovery, the current device;
//! - `context.rs` — primary contexts, created lazily per named device;
//! - `peer.rs` — peer access between two devices: can, enable, disable, is it on;
//! - `stream.rs`, `event.rs` — [`Stream`] and [`Event`] with PyTorch's names;
//! - `backend.rs` — device memory ([`CudaBackend`]: `cuMemAlloc` and virtual memory);
//! - `pinned.rs` — pinned host memory ([`CudaHostBackend`]);
//! - `hostmem.rs` — huge-page host mappings for first pins and fresh copy destinations;
//! - `pin_probe.rs` — first-pin variants, timed (benchmarks);
//! - `registry.rs` — [`registry::PerDevice`], the one lazy per-device registry (contexts,
//!   allocators; berth's generators and cuBLAS handles);
//! - `memory.rs` — one allocator per device for the whole process (`Note [One allocator
//!   registry]`), the memory API;
//! - `sleep.rs` — sleep and wake of tagged device memory (`paged`), through the registry;
//! - `copy.rs` — byte copies: raw host↔device↔device, staged pageable pipelines,
//!   [`PinnedBuffer`];
//! - `sync_debug.rs` — sync points, host-wait counters;
//! - `activity.rs` — CUPTI activity tracing (device spans of kernels, copies and memsets, by
//!   the caller's correlation ids), for the profiler;
//! - `kernel.rs` — NVRTC compilation, the per-device module cache, launches (`cuda` only);
//! - `cublas.rs` — one cuBLAS handle per device, the strided batched gemm (`cuda` only);
//! - `nccl.rs` — NCCL communicators (one rank per process, or one per device of this
//!   process) and collectives on device memory, NCCL groups, NCCL loaded at run time (`cuda`
//!   only);
//! - `error.rs`, `kernel_error.rs` — [`CudaError`], [`KernelError`] (the error of `kernel`
//!   and `cublas`);
//! - `testing.rs` — the GPU gate for tests, a fake device count.
//!
//! # Design notes
//! - `Note [VMM handles]`: `src/backend.rs`
//! - `Note [Foreign contexts]`: `src/context.rs`
//! - `Note [Peer access]`: `src/peer.rs` (one-way grants, no query in the driver, which memory)
//! - `Note [One allocator registry]`: `src/memory.rs` (berth's tensors and `berth_torch` share it)
//! - `Note [Filled first pins]`: `src/pinned.rs`
//! - `Note [Streams are never destroyed]`: `src/stream.rs`
//! - `Note [Activity tracing]`: `src/activity.rs` (device time from CUPTI, and what it costs)
//! - `Note [Event pool]`: `src/event_pool.rs` (driver events reused, as PyTorch's `EventPool`)
//! - `Note [Loading NCCL]`: `src/ffi/nccl.rs` (`libnccl.so.2`, which cudarc's loader misses)
//! - `Note [One thread, several devices]`: `src/nccl.rs` (`ncclGroupStart` / `ncclGroupEnd`
//!   around one thread's collectives on several devices)
//!
//! [`CudaFence`] follows berth-alloc's `Note [Fences and events]` (in
//! [`berth_alloc::backend`]).

pub mod activity;
pub mod backend;
mod backup_memory;
mod context;
pub mod copy;
mod copy_queue;
#[cfg(feature = "cuda")]
pub mod cublas;
mod device;
mod driver;
mod error;
mod event;
mod event_pool;
mod ffi;
pub mod hostmem;
pub mod ipc;
#[cfg(feature = "cuda")]
pub mod kernel;
mod kernel_error;
mod mapped_range;
pub mod memory;
#[cfg(feature = "cuda")]
pub mod nccl;
pub mod peer;
#[doc(hidden)]
pub mod pin_probe;
pub mod pinned;
pub mod registry;
pub mod sleep;
mod stream;
mod sync_debug;
pub mod testing;

pub use backend::{CudaBackend, CudaFence};
pub use context::{
    bind_context, contexts_created, foreign_context_scope, initialized_devices, is_initialized,
    synchronize, ForeignContextScope,
};
pub use copy::PinnedBuffer;
pub use device::{
    check_device, current_device, device_count, device_scope, get_device_name,
    get_device_properties, is_available, mem_get_info, set_device, unavailable_reason, DeviceGuard,
    DeviceProperties,
};
pub use error::CudaError;
pub use event::Event;
pub use kernel_error::KernelError;
pub use memory::{
    allocator_policy, empty_cache, host_empty_cache, max_memory_allocated, max_memory_reserved,
    memory_allocated, memory_reserved, memory_snapshot, memory_stats, memory_summary,
    record_memory_history, reset_accumulated_memory_stats, reset_peak_memory_stats,
    set_per_process_memory_fraction, CudaDeviceArg,
};
pub use pinned::CudaHostBackend;
pub use stream::{current_stream, current_stream_of_current_device, Stream, StreamGuard};
pub use sync_debug::{
    get_sync_debug_mode, host_waits, set_host_wait_hook, set_sync_debug_mode, sync_point,
    take_sync_reports, thread_host_waits, HostWaitHook, SyncDebugMode,
};
