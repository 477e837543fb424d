//! CUDA through cudarc with dynamic loading: discovery, contexts, streams, events, device and
//! pinned memory backends, transfers and kernels.
//!
//! Every entry point answers "not available" on a machine without the NVIDIA driver and never
//! panics there: nothing calls into cudarc before the driver library was found and `cuInit`
//! succeeded ([`unavailable_reason`] says why not). Only cudarc's `sys` / `result` layers are
//! used; memory is owned by berth's allocators, never by cudarc's self-freeing `CudaSlice`.
//!
//! Files: `driver.rs` (the gate), `device.rs` (discovery, current device), `context.rs`
//! (primary contexts, created lazily per named device), `stream.rs`, `event.rs`, `raw.rs` (the
//! driver calls behind them), `backend.rs` (device memory: `cuMemAlloc` and virtual memory),
//! `pinned.rs` (pinned host memory), `hostmem.rs` (huge-page host mappings for first pins and
//! fresh copy destinations), `pin_probe.rs` (first-pin variants, timed), `memory.rs` (one
//! allocator per device, the memory API),
//! `transfer.rs` (`.to()` copies, device and pinned storages), `pin.rs` (`pin_memory`),
//! `sync_debug.rs` (sync points),
//! `testing.rs` (the GPU gate for tests, a fake device count).

pub mod backend;
#[cfg(feature = "cuda")]
pub mod blas;
mod context;
mod device;
mod driver;
mod error;
mod event;
pub mod hostmem;
#[cfg(feature = "cuda")]
pub mod kernels;
pub mod memory;
#[cfg(feature = "cuda")]
pub mod ops;
mod pin;
#[doc(hidden)]
pub mod pin_probe;
pub mod pinned;
#[cfg(feature = "cuda")]
pub mod rand;
mod raw;
mod stream;
mod sync_debug;
pub mod testing;
pub mod transfer;

pub use backend::{CudaBackend, CudaEvent};
pub use context::{
    bind_context, contexts_created, initialized_devices, is_initialized, synchronize,
};
pub use device::{
    check_device, current_device, device_count, device_scope, get_device_name,
    get_device_properties, is_available, mem_get_info, set_device, unavailable_reason, DeviceGuard,
    DeviceProperties,
};
pub use error::CudaError;
pub use event::Event;
pub use memory::{
    empty_cache, host_empty_cache, max_memory_allocated, max_memory_reserved, memory_allocated,
    memory_reserved, memory_stats, memory_summary, reset_peak_memory_stats,
};
pub use pin::legacy_type_name;
pub use pinned::CudaHostBackend;
pub use stream::{current_stream, current_stream_of_current_device, Stream, StreamGuard};
pub use sync_debug::{
    get_sync_debug_mode, host_waits, set_sync_debug_mode, sync_point, take_sync_reports,
    thread_host_waits, SyncDebugMode,
};
