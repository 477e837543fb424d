//! Pinned (page-locked) host memory: [`HostCachingAllocator`] with PyTorch's host policy over a
//! small [`HostBackend`] trait, the RAII [`HostAllocation`], and the object-safe
//! [`HostAllocator`] interface the tensor layer and the data loader use.
//!
//! The policy is PyTorch's `CachingHostAllocator` (`aten/src/ATen/core/CachingHostAllocator.h`,
//! <https://github.com/pytorch/pytorch/blob/main/aten/src/ATen/core/CachingHostAllocator.h>):
//! - sizes are rounded up to the next power of two and each power of two has its own free list
//!   (most recently freed first); a request only ever takes a block of exactly its rounded size,
//!   and blocks are never split;
//! - a block used on other streams ([`HostAllocation::record_stream`], which the copy kernels
//!   call for every non-blocking copy) is reused only after an event recorded on **every** such
//!   stream at free time has completed (Note [Host block reuse]);
//! - completed events are collected at the start of each allocation, oldest first, stopping at
//!   the first one still pending;
//! - [`HostCachingAllocator::empty_cache`] (`torch._C._host_emptyCache()`) frees every cached
//!   block; blocks in use or waiting on events stay;
//! - no backend call is made while a lock is held (PyTorch's `Note [HostAllocator design]`).
//!
//! Two choices differ from PyTorch and are documented where they are made: a backend
//! out-of-memory during allocation empties the cache and retries once, and statistics are exact
//! (one lock) instead of summed per bucket.
//!
//! Note [Host block reuse]: at free time the set of streams a block was used on is turned into
//! one event per stream and the block's `event_count` is raised by that number; the block goes
//! back on its free list when the count returns to zero. If recording an event fails the block
//! can never be proven idle, so it is kept out of circulation for good (and the error is kept
//! for [`HostAllocator::check_err`]) rather than risk handing out memory a copy still reads.

mod backend;
mod caching;
mod stats;

use std::collections::BTreeMap;
use std::ptr::NonNull;

pub use backend::{BackupMemory, HostBackend, SimHostBackend, SimHostCounts, SimHostFence};
pub use caching::HostCachingAllocator;
pub use stats::{DurationStat, HostStats};

use crate::backend::DeviceStream;
use crate::config::AllocatorConfig;
use crate::error::BackendError;
use crate::sync::Arc;

/// A failure of a pinned host allocator.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HostAllocError {
    /// The backend could not pin `rounded` more bytes, even after the cache was emptied.
    /// Transient: freeing pinned memory and retrying may succeed.
    #[error(
        "pinned host memory exhausted: tried to allocate {rounded} bytes (a request of {requested} \
         bytes rounded up to a power of two); the host allocator holds {allocated} bytes, of which \
         {in_use} are in use or waiting on stream events; free pinned tensors and retry"
    )]
    OutOfMemory {
        /// The request in bytes.
        requested: u64,
        /// The request rounded to the next power of two, in bytes: what was asked of the backend.
        rounded: u64,
        /// Bytes owned by the allocator (`allocated_bytes.current`).
        allocated: u64,
        /// Bytes of those not on a free list (checked out or waiting on events).
        in_use: u64,
    },
    /// A request whose power-of-two rounding does not fit in the address space.
    #[error("pinned host request of {requested} bytes is too large: requests must be at most 2^62 bytes")]
    TooLarge {
        /// The request in bytes.
        requested: u64,
    },
    /// A pointer that is not inside a live block of this allocator.
    #[error(
        "{addr:#x} is not inside a live pinned block of this host allocator; pass a pointer \
         into memory this allocator handed out and that is not freed"
    )]
    InvalidPointer {
        /// The address given.
        addr: usize,
    },
    /// A block freed twice (only reachable through a buggy [`HostAllocationOwner`] caller).
    #[error("double free of pinned block {addr:#x}; free each allocation exactly once")]
    DoubleFree {
        /// The block's address.
        addr: usize,
    },
    /// A backend call failed for a reason other than running out of memory.
    #[error("pinned host backend call {op} failed: {source}")]
    Backend {
        /// The allocator step that made the call (`"alloc_pinned"`, `"free_pinned"`,
        /// `"record_fence"`, `"query_fence"`, ...).
        op: &'static str,
        /// The backend's error.
        #[source]
        source: BackendError,
    },
}

/// Settings of a [`HostCachingAllocator`] (the `pinned_*` keys of `PYTORCH_CUDA_ALLOC_CONF`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostAllocatorConfig {
    /// `pinned_use_cuda_host_register`: allocate with the global allocator, pre-fault one byte
    /// per 4 KiB page and page-lock with [`HostBackend::register`] instead of
    /// [`HostBackend::alloc_pinned`].
    pub use_host_register: bool,
    /// `pinned_num_register_threads`: threads that pre-fault pages in register mode (1 = the
    /// calling thread only).
    pub num_register_threads: usize,
}

impl Default for HostAllocatorConfig {
    fn default() -> Self {
        HostAllocatorConfig {
            use_host_register: false,
            num_register_threads: 1,
        }
    }
}

impl From<&AllocatorConfig> for HostAllocatorConfig {
    fn from(c: &AllocatorConfig) -> Self {
        HostAllocatorConfig {
            use_host_register: c.pinned_use_cuda_host_register,
            num_register_threads: usize::try_from(c.pinned_num_register_threads)
                .unwrap_or(1)
                .max(1),
        }
    }
}

/// What a [`HostAllocation`] calls back into on drop and on [`HostAllocation::record_stream`].
/// Implemented by each host policy's shared state.
pub trait HostAllocationOwner: Send + Sync {
    /// Returns the block starting at `ptr` to the allocator. Must not panic; failures are kept
    /// for [`HostAllocator::check_err`].
    fn release(&self, ptr: NonNull<u8>);

    /// Marks the live block containing `ptr` as used on `stream`.
    ///
    /// # Errors
    /// [`HostAllocError::InvalidPointer`] if `ptr` is not inside a live block.
    fn record_stream(&self, ptr: *const u8, stream: DeviceStream) -> Result<(), HostAllocError>;
}

/// A block of pinned host memory; returns itself to its allocator's cache on drop.
///
/// Exposes the raw pointer, the requested length and the block's capacity (the power of two
/// it was rounded to), so the tensor layer can wrap it as CPU storage. A zero-byte allocation has
/// a null pointer, no owner and is not pinned.
pub struct HostAllocation {
    ptr: Option<NonNull<u8>>,
    len: usize,
    capacity: usize,
    owner: Option<Arc<dyn HostAllocationOwner>>,
}

// SAFETY: a `HostAllocation` uniquely owns its block, like a `Box<[u8]>`: the pointer is never
// shared with another `HostAllocation`, shared access only hands out a raw pointer (dereferencing
// it is the caller's `unsafe` responsibility) or a `&[u8]` through an `unsafe fn`, and the owner
// is `Send + Sync`.
unsafe impl Send for HostAllocation {}
// SAFETY: see `Send`: `&HostAllocation` allows no unsynchronised mutation of the block.
unsafe impl Sync for HostAllocation {}

impl HostAllocation {
    /// Wraps a block handed out by a host policy; `owner.release(ptr)` runs on drop.
    /// `len` is the requested size and `capacity` the block size, both in bytes.
    pub fn new(
        ptr: NonNull<u8>,
        len: usize,
        capacity: usize,
        owner: Arc<dyn HostAllocationOwner>,
    ) -> Self {
        HostAllocation {
            ptr: Some(ptr),
            len,
            capacity,
            owner: Some(owner),
        }
    }

    /// A zero-byte allocation: null pointer, nothing to free.
    pub fn empty() -> Self {
        HostAllocation {
            ptr: None,
            len: 0,
            capacity: 0,
            owner: None,
        }
    }

    /// The start of the block (null for zero bytes).
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.map_or(std::ptr::null_mut(), NonNull::as_ptr)
    }

    /// The requested size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the requested size is zero.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The block's size in bytes: `len` rounded up to a power of two.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Whether the memory is page-locked: true for every non-empty allocation of a host
    /// allocator (PyTorch's `is_pinned()` on a null pointer is false).
    pub fn is_pinned(&self) -> bool {
        self.ptr.is_some() && self.owner.is_some()
    }

    /// Marks the block as used on `stream`, so it is reused only after the work queued there at
    /// drop time has completed (PyTorch's `CachingHostAllocator_recordEvent`). A no-op for
    /// zero-byte allocations.
    ///
    /// # Errors
    /// [`HostAllocError::InvalidPointer`] if the owner no longer knows the block.
    pub fn record_stream(&self, stream: DeviceStream) -> Result<(), HostAllocError> {
        match (&self.owner, self.ptr) {
            (Some(owner), Some(ptr)) => owner.record_stream(ptr.as_ptr(), stream),
            _ => Ok(()),
        }
    }

    /// The first `len` bytes as a slice.
    ///
    /// # Safety
    /// 1. The bytes were initialised: written by the caller or a completed copy, or zeroed by a
    ///    backend that documents it ([`SimHostBackend`] and the register mode zero memory;
    ///    `cudaHostAlloc` does not promise to).
    /// 2. No copy queued on any stream writes these bytes while the slice lives.
    pub unsafe fn as_slice(&self) -> &[u8] {
        match self.ptr {
            // SAFETY: the block holds `capacity >= len` bytes owned by `self`; initialisation and
            // the absence of concurrent writers are preconditions 1 and 2.
            Some(p) => unsafe { std::slice::from_raw_parts(p.as_ptr(), self.len) },
            None => &[],
        }
    }

    /// The first `len` bytes as a mutable slice.
    ///
    /// # Safety
    /// 1. The bytes were initialised (see [`HostAllocation::as_slice`]).
    /// 2. No copy queued on any stream reads or writes these bytes while the slice lives.
    pub unsafe fn as_mut_slice(&mut self) -> &mut [u8] {
        match self.ptr {
            // SAFETY: `&mut self` gives exclusive access among Rust references; the block holds
            // `capacity >= len` bytes; preconditions 1 and 2 cover initialisation and devices.
            Some(p) => unsafe { std::slice::from_raw_parts_mut(p.as_ptr(), self.len) },
            None => &mut [],
        }
    }
}

impl std::fmt::Debug for HostAllocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostAllocation")
            .field("ptr", &self.as_ptr())
            .field("len", &self.len)
            .field("capacity", &self.capacity)
            .finish()
    }
}

impl Drop for HostAllocation {
    fn drop(&mut self) {
        if let (Some(owner), Some(ptr)) = (self.owner.take(), self.ptr) {
            owner.release(ptr);
        }
    }
}

/// A pinned host allocator, independent of policy and backend; object safe
/// (`Arc<dyn HostAllocator>`), so the tensor layer and the data loader need no generics.
pub trait HostAllocator: Send + Sync {
    /// Allocates `bytes` bytes of pinned memory; zero bytes gives an empty allocation and
    /// touches no statistic.
    ///
    /// # Errors
    /// [`HostAllocError::OutOfMemory`], [`HostAllocError::TooLarge`], or
    /// [`HostAllocError::Backend`] for other backend failures (including event queries).
    fn allocate(&self, bytes: usize) -> Result<HostAllocation, HostAllocError>;

    /// Marks the live block containing `ptr` (views allowed) as used on `stream`
    /// (`CachingHostAllocator_recordEvent`).
    ///
    /// # Errors
    /// [`HostAllocError::InvalidPointer`] if `ptr` is not inside a live block.
    fn record_stream(&self, ptr: *const u8, stream: DeviceStream) -> Result<(), HostAllocError>;

    /// Whether `ptr` points into pinned memory: a block of this allocator, or memory the
    /// backend reports as page-locked.
    fn is_pinned(&self, ptr: *const u8) -> bool;

    /// Frees every cached block to the backend (`torch._C._host_emptyCache()`).
    ///
    /// # Errors
    /// [`HostAllocError::Backend`] for the first failed backend call (the other blocks are still
    /// freed; a block whose free failed stays cached).
    fn empty_cache(&self) -> Result<(), HostAllocError>;

    /// The statistics.
    fn stats(&self) -> HostStats;

    /// `torch.cuda.host_memory_stats()`: PyTorch's flat, sorted key → value map (28 keys).
    fn host_memory_stats(&self) -> BTreeMap<String, i64> {
        self.stats().to_map()
    }

    /// Sets every peak to its current value (`reset_peak_host_memory_stats`).
    fn reset_peak_stats(&self);

    /// Zeroes the accumulated counters (`reset_accumulated_host_memory_stats`).
    fn reset_accumulated_stats(&self);

    /// Returns and clears the first error recorded while freeing in `Drop`.
    ///
    /// # Errors
    /// The recorded error, once.
    fn check_err(&self) -> Result<(), HostAllocError>;
}

/// Rounds a host request up to its block size, a power of two (PyTorch's
/// `c10::llvm::PowerOf2Ceil`): 3 MiB → 4 MiB, 64 MiB + 1 → 128 MiB. `None` above 2^62 bytes.
pub fn host_block_size(bytes: usize) -> Option<usize> {
    if bytes as u64 > 1 << 62 {
        return None;
    }
    bytes.max(1).checked_next_power_of_two()
}

/// Maps a backend failure of step `op` to a host allocator error.
fn backend_err(op: &'static str, source: BackendError) -> HostAllocError {
    HostAllocError::Backend { op, source }
}
