//! berth-alloc: device memory allocators over a small backend trait, with PyTorch's caching
//! policy reproduced exactly, its statistics, snapshots and history, and a simulated device.
//!
//! # Where this crate sits
//! The bottom of the workspace; it depends on no other berth crate and never on CUDA (only
//! `thiserror` and `tracing`, the latter for the [`warnings`] channel, plus `serde` /
//! `serde_json` / `flate2` behind the `serde` and `trace` features):
//!
//! ```text
//! berth-alloc  <-  berth-cuda  <-  berth  <-  berth-data  <-  berth-cli (the `berth` binary)
//!  (this crate)        ^
//!                      +-- berth-torch (PyTorch's pluggable CUDA allocator)
//! ```
//!
//! `berth-cuda` implements [`MemoryBackend`] and [`HostBackend`] on the CUDA driver, `berth`
//! re-exports this crate as `berth::alloc` for tensor storage, `berth-torch` puts its policies
//! under PyTorch, and `berth-cli` replays traces through them (`berth replay`).
//!
//! # Layers
//! 1. [`backend::MemoryBackend`]: raw segments, memory info and stream fences (plus the
//!    [`backend::VirtualMemoryBackend`] capability for expandable segments). Implemented by
//!    [`backend::sim::SimBackend`], the [`adaptor`]s and, in crate `berth-cuda`, the CUDA
//!    backend.
//! 2. Policies implementing [`DeviceAllocator`]: [`caching::CachingAllocator`] (PyTorch's
//!    `CUDACachingAllocator` policy, byte-exact on real traces) and [`PagedBestFit`] (berth's
//!    own, over virtual memory); [`HostCachingAllocator`] for pinned host memory.
//! 3. Users (tensor storage, `berth replay`, `berth_torch`) see only [`DeviceAllocator`] and
//!    [`Allocation`], built by one factory, [`device_allocator`], from a [`Policy`] and its
//!    [`AllocatorConfig`].
//!
//! # Design notes
//! Rationale lives in named notes (PyTorch's `Note [..]` convention), each defined once:
//! - `Note [Fences and events]`: `src/backend/mod.rs`
//! - `Note [Policy without virtual memory]`: `src/policy.rs`
//! - `Note [Size classes]`: `src/size_class.rs`
//! - `Note [Spin lock]`: `src/sync.rs`
//! - `Note [Host block reuse]`: `src/host/mod.rs`
//! - `Note [Paged best fit]`, `Note [Mapping units]`, `Note [Paged address space]`,
//!   `Note [Lock discipline]`, ``Note [`record_stream` and deferred free]``: `src/paged/mod.rs`
//! - `Note [Constant-time arena]`: `src/paged/arena.rs`
//! - `Note [Pickle reader arena]`, `Note [Pickle memory budget]`: `src/pickle/reader.rs`
//! - `Note [Bounded reads]`: `src/input.rs`
//! - `Note [Snapshot history flag]`: `src/pickle/snapshot.rs`
//! - `Note [Compiled replay]`: `src/replay.rs`
//! - `Note [Streaming trace reader]`: `src/trace/mod.rs`
//! - `Note [Bounded trace excerpts]`: `src/trace/excerpt.rs`
//! - `Note [Private pools]`: `src/caching/private_pools.rs`
//! - `Note [Private pools in paged]`: `src/paged/pools.rs`
//! - `Note [Sleep and wake]`: `src/paged/sleep.rs`
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
mod factory;
pub mod host;
mod ids;
pub mod inert_settings;
pub mod input;
pub mod paged;
pub mod pickle;
mod plumbing;
pub mod policy;
#[cfg(feature = "trace")]
pub mod replay;
mod size_class;
pub mod snapshot;
pub mod stats;
pub mod summary;
mod sync;
pub mod tags;
#[cfg(feature = "testing")]
pub mod testing;
#[cfg(feature = "trace")]
pub mod trace;
pub mod warnings;

pub use allocator::{Allocation, AllocationOwner, DeviceAllocator, OomObserver, PoolRestore};
pub use backend::{
    CopyTicket, DevicePtr, DeviceStream, MemInfo, MemoryBackend, SegmentSource, StreamId,
    VirtualMemoryBackend,
};
pub use config::AllocatorConfig;
pub use error::{AllocError, BackendError, ConfigError, OomHint, PolicyError};
pub use factory::device_allocator;
pub use host::{HostAllocation, HostAllocator, HostBackend, HostCachingAllocator};
pub use ids::{MempoolId, StreamFilter};
pub use paged::{PagedBestFit, PagedTuning};
pub use policy::Policy;
pub use snapshot::{
    BlockInfo, BlockState, MemorySnapshot, SegmentInfo, SleepingTag, TraceAction, TraceEntry,
};
pub use stats::{MemoryStats, Stat, StatKind};
pub use tags::{SleepReport, SleepStats, WakeReport};
