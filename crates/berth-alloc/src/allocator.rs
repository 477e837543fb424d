//! The policy-neutral allocator interface ([`DeviceAllocator`]) and the RAII [`Allocation`].
//!
//! The tensor layer and `berth replay` see only this trait; [`crate::caching::CachingAllocator`]
//! (PyTorch's policy) and berth's own policy implement it. It is object safe: use
//! `Arc<dyn DeviceAllocator>`.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::error::AllocError;
use crate::ids::{DevicePtr, StreamId};
use crate::snapshot::MemorySnapshot;
use crate::stats::MemoryStats;

/// A callback run on every out-of-memory error, with the allocator's lock released (so it may
/// call [`DeviceAllocator::snapshot`], as PyTorch users do to dump a snapshot on OOM;
/// `torch._C._cuda_attach_out_of_memory_observer`).
pub type OomObserver = crate::sync::Arc<dyn Fn(&AllocError) + Send + Sync>;

/// What an [`Allocation`] calls back into when it is dropped or used on another stream.
///
/// Implemented by each policy's shared state; policies build allocations with
/// [`Allocation::new`].
pub trait AllocationOwner: Send + Sync {
    /// Frees the allocation at `ptr` (PyTorch's `free`). Must not panic; failures are recorded
    /// in the owner's sticky error slot and returned by [`DeviceAllocator::check_err`].
    fn release(&self, ptr: DevicePtr);

    /// Marks the allocation at `ptr` as used on `stream` (PyTorch's `recordStream`).
    ///
    /// # Errors
    /// [`AllocError::InvalidPointer`] if `ptr` is not live in this allocator.
    fn record_stream(&self, ptr: DevicePtr, stream: StreamId) -> Result<(), AllocError>;
}

/// A live block of device memory; frees itself on `Drop` (PyTorch's `DataPtr`).
///
/// Holds the device pointer, the size the caller asked for (bytes) and the allocation stream.
/// A zero-byte allocation has a null pointer and no owner, as in PyTorch.
pub struct Allocation {
    ptr: DevicePtr,
    size: usize,
    stream: StreamId,
    owner: Option<Arc<dyn AllocationOwner>>,
}

impl Allocation {
    /// Wraps a pointer handed out by a policy; `owner.release(ptr)` runs on drop.
    pub fn new(
        ptr: DevicePtr,
        size: usize,
        stream: StreamId,
        owner: Arc<dyn AllocationOwner>,
    ) -> Self {
        Allocation {
            ptr,
            size,
            stream,
            owner: Some(owner),
        }
    }

    /// A zero-byte allocation: null pointer, nothing to free.
    pub fn empty(stream: StreamId) -> Self {
        Allocation {
            ptr: DevicePtr::NULL,
            size: 0,
            stream,
            owner: None,
        }
    }

    /// The device address (null for zero bytes).
    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }

    /// The requested size in bytes (not rounded).
    pub fn size(&self) -> usize {
        self.size
    }

    /// The stream the allocation was made on.
    pub fn stream(&self) -> StreamId {
        self.stream
    }

    /// Marks this allocation as used on `stream`, so that its memory is reused only after the
    /// work queued there at free time has completed (`Tensor.record_stream`). A no-op for
    /// zero-byte allocations and for the allocation's own stream.
    ///
    /// # Errors
    /// [`AllocError::InvalidPointer`] if the owner no longer knows the pointer.
    pub fn record_stream(&self, stream: StreamId) -> Result<(), AllocError> {
        match &self.owner {
            Some(owner) if stream != self.stream => owner.record_stream(self.ptr, stream),
            _ => Ok(()),
        }
    }

    /// Gives up ownership without freeing: the caller must later pass the pointer to
    /// [`DeviceAllocator::raw_delete`] of the same allocator.
    pub fn into_raw(mut self) -> DevicePtr {
        self.owner = None;
        self.ptr
    }
}

impl std::fmt::Debug for Allocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Allocation")
            .field("ptr", &self.ptr)
            .field("size", &self.size)
            .field("stream", &self.stream)
            .finish()
    }
}

impl Drop for Allocation {
    fn drop(&mut self) {
        if let Some(owner) = self.owner.take() {
            owner.release(self.ptr);
        }
    }
}

/// A device memory allocator, independent of policy and backend.
///
/// Method names are the `snake_case` versions of `torch.cuda`'s. All sizes are bytes.
pub trait DeviceAllocator: Send + Sync {
    /// A short name of the policy (`"pytorch"`, `"expandable"`, ...), for reports.
    fn policy_name(&self) -> &str;

    /// Allocates `bytes` bytes on `stream`; zero bytes gives a null [`Allocation`] and touches
    /// no statistic (PyTorch).
    ///
    /// # Errors
    /// [`AllocError::OutOfMemory`] / [`AllocError::CapExceeded`] / [`AllocError::TooLarge`] when
    /// the memory is not available (the allocator stays usable); [`AllocError::Backend`] for
    /// other backend failures.
    fn allocate(&self, bytes: usize, stream: StreamId) -> Result<Allocation, AllocError>;

    /// Allocates like [`DeviceAllocator::allocate`] but returns the bare pointer
    /// (`raw_alloc_with_stream`); free it with [`DeviceAllocator::raw_delete`].
    ///
    /// # Errors
    /// As [`DeviceAllocator::allocate`].
    fn raw_alloc(&self, bytes: usize, stream: StreamId) -> Result<DevicePtr, AllocError>;

    /// Frees a pointer from [`DeviceAllocator::raw_alloc`] or [`Allocation::into_raw`]
    /// (`raw_delete`). The null pointer is accepted and ignored.
    ///
    /// # Errors
    /// [`AllocError::DoubleFree`] for a pointer already freed, [`AllocError::InvalidPointer`] for
    /// one never handed out; the allocator state is unchanged in both cases.
    fn raw_delete(&self, ptr: DevicePtr) -> Result<(), AllocError>;

    /// Marks the live allocation at `ptr` as used on `stream` (`recordStream`).
    ///
    /// # Errors
    /// [`AllocError::InvalidPointer`] if `ptr` is not live.
    fn raw_record_stream(&self, ptr: DevicePtr, stream: StreamId) -> Result<(), AllocError>;

    /// [`DeviceAllocator::raw_record_stream`] for an [`Allocation`]; no-op on its own stream.
    ///
    /// # Errors
    /// As [`DeviceAllocator::raw_record_stream`].
    fn record_stream(&self, allocation: &Allocation, stream: StreamId) -> Result<(), AllocError> {
        if allocation.ptr().is_null() || allocation.stream() == stream {
            return Ok(());
        }
        self.raw_record_stream(allocation.ptr(), stream)
    }

    /// Returns every entirely free cached segment to the backend (`torch.cuda.empty_cache`),
    /// after waiting for pending cross-stream frees.
    ///
    /// # Errors
    /// [`AllocError::Backend`] if a backend call fails.
    fn empty_cache(&self) -> Result<(), AllocError>;

    /// The statistics (`DeviceStats`).
    fn stats(&self) -> MemoryStats;

    /// `(memory_allocated(), memory_reserved())` in bytes: the two figures a profiler reads
    /// after every allocation and free, without copying the whole of [`DeviceAllocator::stats`].
    fn allocated_and_reserved(&self) -> (u64, u64) {
        let s = self.stats();
        (s.memory_allocated(), s.memory_reserved())
    }

    /// `torch.cuda.memory_stats()`: PyTorch's flat, sorted key → value map (122 keys).
    fn memory_stats(&self) -> BTreeMap<String, i64> {
        self.stats().to_map()
    }

    /// `torch.cuda.memory_summary()` in PyTorch's table layout.
    fn memory_summary(&self, abbreviated: bool) -> String {
        crate::summary::memory_summary(&self.stats(), 0, self.policy_name(), abbreviated, None)
    }

    /// Sets every peak to its current value (`reset_peak_memory_stats`).
    fn reset_peak_memory_stats(&self);

    /// Zeroes every accumulated counter and the event counters
    /// (`reset_accumulated_memory_stats`).
    fn reset_accumulated_memory_stats(&self);

    /// Segments and blocks with their states, plus the recorded history (`torch.cuda.memory._snapshot`).
    fn snapshot(&self) -> MemorySnapshot;

    /// Starts (`Some(max_entries)`) or stops and clears (`None`) recording trace entries into a
    /// ring of `max_entries` (`_record_memory_history`).
    fn record_memory_history(&self, max_entries: Option<usize>);

    /// Caps reserved memory at `fraction × total` device memory
    /// (`set_per_process_memory_fraction`).
    ///
    /// # Errors
    /// [`AllocError::InvalidFraction`] unless `0 ≤ fraction ≤ 1`; [`AllocError::Backend`] if
    /// the backend cannot report total memory.
    fn set_memory_fraction(&self, fraction: f64) -> Result<(), AllocError>;

    /// Registers `observer`, called on every out-of-memory error with the allocator's lock
    /// released (`torch._C._cuda_attach_out_of_memory_observer`).
    fn attach_oom_observer(&self, observer: OomObserver);

    /// Sets the device index shown in OOM messages, summaries and snapshots (default 0).
    fn set_device_index(&self, device: i32);

    /// Returns and clears the first error recorded while freeing in `Drop` (cudarc's sticky
    /// `check_err`).
    ///
    /// # Errors
    /// The recorded error, once.
    fn check_err(&self) -> Result<(), AllocError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocation_is_send_and_sync_and_the_trait_object_safe() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Allocation>();
        assert_send_sync::<Arc<dyn DeviceAllocator>>();
        let empty = Allocation::empty(StreamId(3));
        assert!(empty.ptr().is_null());
        assert_eq!((empty.size(), empty.stream()), (0, StreamId(3)));
        assert_eq!(empty.record_stream(StreamId(4)), Ok(()));
    }
}
