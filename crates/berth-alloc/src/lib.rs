//! berth-alloc: device memory allocators over a small backend trait, with PyTorch's caching
//! policy reproduced exactly, its statistics, snapshots and history, and a simulated device.
//!
//! # Layers
//! 1. [`backend::MemoryBackend`]: raw segments, memory info and stream events (plus the
//!    [`backend::VirtualMemoryBackend`] capability for expandable segments). Implemented by
//!    [`backend::sim::SimBackend`], the [`adaptor`]s and, in crate `berth`, the CUDA backend.
//! 2. Policies implementing [`DeviceAllocator`]: [`caching::CachingAllocator`] (PyTorch's
//!    `CUDACachingAllocator` policy, byte-exact on real traces).
//! 3. Users (tensor storage, `berth replay`) see only [`DeviceAllocator`] and [`Allocation`].
//!
//! # Quick start
//! ```
//! use berth_alloc::{backend::{sim::SimBackend, StreamId}, caching::CachingAllocator, DeviceAllocator};
//! let alloc = CachingAllocator::new(SimBackend::new(1 << 30));
//! let a = alloc.allocate(4, StreamId::DEFAULT).unwrap();
//! assert_eq!(alloc.stats().memory_allocated(), 512);
//! assert_eq!(alloc.stats().memory_reserved(), 2 << 20);
//! drop(a);
//! alloc.empty_cache().unwrap();
//! assert_eq!(alloc.stats().memory_reserved(), 0);
//! ```

pub mod adaptor;
mod addr_map;
mod allocator;
pub mod backend;
pub mod caching;
pub mod config;
pub mod error;
pub mod host;
pub mod paged;
pub mod pickle;
mod plumbing;
#[cfg(feature = "trace")]
pub mod replay;
mod size_class;
pub mod snapshot;
pub mod stats;
pub mod summary;
mod sync;
#[cfg(feature = "testing")]
pub mod testing;
#[cfg(feature = "trace")]
pub mod trace;

pub use allocator::{device_allocator, Allocation, AllocationOwner, DeviceAllocator};
pub use backend::{
    DevicePtr, DeviceStream, MemInfo, MemoryBackend, StreamId, VirtualMemoryBackend,
};
pub use config::{AllocatorConfig, AllocatorPolicy};
pub use error::{AllocError, BackendError, ConfigError, OomHint};
pub use host::{HostAllocation, HostAllocator, HostBackend, HostCachingAllocator};
pub use paged::{PagedBestFit, PagedTuning};
pub use plumbing::OomObserver;
pub use snapshot::{BlockInfo, BlockState, MemorySnapshot, SegmentInfo, TraceAction, TraceEntry};
pub use stats::{MemoryStats, Stat, StatKind};
