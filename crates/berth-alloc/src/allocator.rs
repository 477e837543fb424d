//! The policy-neutral allocator interface ([`DeviceAllocator`]) and the RAII [`Allocation`].
//!
//! The tensor layer and `berth replay` see only this trait; [`crate::caching::CachingAllocator`]
//! (PyTorch's policy) and berth's own policy implement it. It is object safe: use
//! `Arc<dyn DeviceAllocator>`.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::backend::SegmentSource;
use crate::error::AllocError;
use crate::host::BackupMemory;
use crate::ids::{DevicePtr, MempoolId, StreamFilter, StreamId};
use crate::snapshot::MemorySnapshot;
use crate::stats::MemoryStats;
use crate::tags::{SleepReport, SleepStats, WakeReport};

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

    /// Creates private pool `id` with one use, or counts one more use of it (PyTorch's
    /// `createOrIncrefPool`, called by `torch.cuda.MemPool()`). `Note [Private pools]` in
    /// [`crate::caching::private_pools`] says what a private pool is.
    ///
    /// # Errors
    /// [`AllocError::NoSuchPool`] for `(0, 0)`; [`AllocError::PolicyLacks`] from a policy
    /// without private pools.
    fn create_or_incref_pool(&self, id: MempoolId) -> Result<(), AllocError> {
        let _ = id;
        Err(lacks_private_pools(self.policy_name()))
    }

    /// Creates private pool `id`, with one use, whose segments come from `source` instead of
    /// the device's backend (PyTorch's `createOrIncrefPool` with an allocator, from
    /// `torch.cuda.MemPool(allocator=...)`; `Note [Pools with their own allocator]` in
    /// [`crate::backend`]). The pool is used, released and emptied like any other; each of its
    /// segments goes back to `source` when released, and `source` is dropped once the pool
    /// is forgotten.
    ///
    /// # Errors
    /// [`AllocError::NoSuchPool`] for `(0, 0)` or a pool that exists already;
    /// [`AllocError::PolicyLacks`] from a policy whose pools cannot take segments from an
    /// allocator (`expandable`, as PyTorch's expandable segments; `paged`) or that has no
    /// private pools.
    fn create_pool_with_source(
        &self,
        id: MempoolId,
        source: Arc<dyn SegmentSource>,
    ) -> Result<(), AllocError> {
        let _ = (id, source);
        Err(lacks_pool_sources(
            self.policy_name(),
            "use the \"pytorch\" policy, whose pools take their segments from the allocator \
             given, or create the MemPool without an allocator",
        ))
    }

    /// Serves every request on a stream `filter` accepts from private pool `id` (created if
    /// new, else one more use) until [`DeviceAllocator::end_allocate_to_pool`] (PyTorch's
    /// `beginAllocateToPool`: CUDA-graph capture, `torch.cuda.use_mem_pool`).
    ///
    /// # Errors
    /// [`AllocError::PoolInUse`] when `id` is already being allocated to; as
    /// [`DeviceAllocator::create_or_incref_pool`].
    fn begin_allocate_to_pool(
        &self,
        id: MempoolId,
        filter: StreamFilter,
    ) -> Result<(), AllocError> {
        let _ = (id, filter);
        Err(lacks_private_pools(self.policy_name()))
    }

    /// Stops serving requests from private pool `id` (PyTorch's `endAllocateToPool`); the use
    /// it took stays until [`DeviceAllocator::release_pool`].
    ///
    /// # Errors
    /// [`AllocError::NoSuchPool`] when `id` is not being allocated to;
    /// [`AllocError::PolicyLacks`] from a policy without private pools.
    fn end_allocate_to_pool(&self, id: MempoolId) -> Result<(), AllocError> {
        let _ = id;
        Err(lacks_private_pools(self.policy_name()))
    }

    /// Gives back one use of private pool `id` (PyTorch's `releasePool`); at zero uses its
    /// cached memory goes back to the device at the next [`DeviceAllocator::empty_cache`].
    ///
    /// # Errors
    /// [`AllocError::NoSuchPool`] for an unknown pool or one with no use left;
    /// [`AllocError::PolicyLacks`] from a policy without private pools.
    fn release_pool(&self, id: MempoolId) -> Result<(), AllocError> {
        let _ = id;
        Err(lacks_private_pools(self.policy_name()))
    }

    /// The use count of private pool `id`, 0 for an unknown pool (PyTorch's
    /// `getPoolUseCount`).
    fn pool_use_count(&self, id: MempoolId) -> u32 {
        let _ = id;
        0
    }

    /// Whether the allocations alive in private pool `id` are exactly `expected` (PyTorch's
    /// `checkPoolLiveAllocations`, used by CUDA-graph trees).
    ///
    /// # Errors
    /// [`AllocError::NoSuchPool`] for an unknown pool; [`AllocError::PolicyLacks`] from a
    /// policy without private pools.
    fn check_pool_live_allocations(
        &self,
        id: MempoolId,
        expected: &std::collections::HashSet<DevicePtr>,
    ) -> Result<bool, AllocError> {
        let _ = (id, expected);
        Err(lacks_private_pools(self.policy_name()))
    }

    /// Returns the unsplit cached blocks of private pool `id` to the device, whatever its use
    /// count (PyTorch's `emptyCache(mempool_id)`, run when a `torch.cuda.MemPool` is
    /// destroyed); the pool is forgotten when it has no use and no segment left.
    ///
    /// # Errors
    /// [`AllocError::NoSuchPool`] for an unknown pool; [`AllocError::PolicyLacks`] from a
    /// policy without private pools; [`AllocError::Backend`] when a free fails.
    fn empty_pool_cache(&self, id: MempoolId) -> Result<(), AllocError> {
        let _ = id;
        Err(lacks_private_pools(self.policy_name()))
    }

    /// Sets whether private pool `id` lends its cached free blocks to a request outside every
    /// private pool that would otherwise fail with out-of-memory, as the last step before the
    /// error (PyTorch's `setUseOnOOM`, from `torch.cuda.MemPool(use_on_oom=True)`). `Note
    /// [Private pools]` in [`crate::caching::private_pools`].
    ///
    /// # Errors
    /// [`AllocError::NoSuchPool`] when switching it on for an unknown pool (switching it off
    /// for a pool that is gone does nothing); [`AllocError::PolicyLacks`] from a policy without
    /// private pools.
    fn set_use_on_oom(&self, id: MempoolId, on: bool) -> Result<(), AllocError> {
        let _ = (id, on);
        Err(lacks_private_pools(self.policy_name()))
    }

    /// Makes private pool `id` never cut a block: each allocation in it takes a whole free
    /// block, a whole segment when new (PyTorch's `setNoSplit`, from
    /// `torch.cuda.MemPool(no_split=True)`, for memory registered whole with NCCL).
    ///
    /// # Errors
    /// [`AllocError::NoSuchPool`] for an unknown pool; [`AllocError::PolicyLacks`] from a
    /// policy without private pools or without segments (`paged`).
    fn set_no_split(&self, id: MempoolId) -> Result<(), AllocError> {
        let _ = id;
        Err(lacks_private_pools(self.policy_name()))
    }

    /// Sets private pool `id` back to a checkpoint of its allocations, as CUDA-graph trees
    /// (`torch.compile(mode="reduce-overhead")`) do before recording a new graph after
    /// replaying others (PyTorch's `setCheckpointPoolState`,
    /// <https://github.com/pytorch/pytorch/blob/main/c10/cuda/CUDACachingAllocator.cpp>).
    /// `live` is the pool's allocated blocks when the checkpoint was taken: `(address, size in
    /// bytes)`, sizes as the allocator's snapshot gives them. Every block allocated in the pool
    /// now is freed, then every block of `live` is allocated again at its address; a block in
    /// both keeps its memory and contents. Afterwards the pool's allocated blocks are exactly
    /// `live`; what else the pool holds is free for the next recording. Pending cross-stream
    /// frees are waited for first. Returns the addresses freed and allocated.
    ///
    /// # Errors
    /// [`AllocError::NoSuchPool`] for an unknown pool; [`AllocError::SleepDuringCapture`]
    /// while a pool is being allocated to; [`AllocError::BadCheckpoint`] when a block of `live`
    /// is not in the pool's memory, overlaps another, or lies on memory the pool no longer
    /// maps (nothing is changed then); [`AllocError::Backend`] or an out-of-memory error when
    /// memory under a block must be mapped again and cannot; [`AllocError::PolicyLacks`] from a
    /// policy without private pools.
    fn restore_pool(
        &self,
        id: MempoolId,
        live: &[(DevicePtr, u64)],
    ) -> Result<PoolRestore, AllocError> {
        let _ = (id, live);
        Err(lacks_private_pools(self.policy_name()))
    }

    /// Puts the tags `tags` to sleep: their device memory goes back to the device, their
    /// virtual addresses stay (pointers, tensors and CUDA graphs taken before keep them); the
    /// live blocks of the tags in `offload` are first copied to host memory from `host` and
    /// restored by [`DeviceAllocator::wake`], the other tags' contents are lost. Allocations
    /// carry the tag of their thread ([`crate::tags::TagGuard`]). `Note [Sleep and wake]` in
    /// [`crate::paged`]; after vLLM's `CuMemAllocator.sleep`
    /// (<https://github.com/vllm-project/vllm/blob/main/vllm/device_allocator/cumem.py>).
    ///
    /// # Errors
    /// Nothing changes on: [`AllocError::InvalidTag`], [`AllocError::UnknownTag`],
    /// [`AllocError::AlreadyAsleep`], [`AllocError::OffloadNotSlept`],
    /// [`AllocError::NoBackupMemory`], [`AllocError::SleepDuringCapture`],
    /// [`AllocError::OffloadFailed`] (host memory short), [`AllocError::Backend`] from a
    /// synchronization or a copy, and [`AllocError::PolicyLacks`] from a policy without sleep
    /// (only `paged` has it). [`AllocError::Backend`] from an unmap leaves the tag asleep with
    /// what was released.
    ///
    /// # Examples
    /// ```
    /// use std::sync::Arc;
    /// use berth_alloc::{backend::{sim::SimBackend, StreamId}, host::SimHostBackend, tags::TagGuard};
    /// use berth_alloc::{DeviceAllocator, PagedBestFit};
    /// let sim = Arc::new(SimBackend::new(1 << 30));
    /// let paged = PagedBestFit::new(Arc::clone(&sim))?;
    /// let weights = {
    ///     let _tag = TagGuard::new("weights")?;
    ///     paged.allocate(4 << 20, StreamId::DEFAULT)?
    /// };
    /// sim.write_bytes(weights.ptr(), b"w").unwrap();
    /// let host = Arc::new(SimHostBackend::new(1 << 30));
    /// let slept = paged.sleep(&["weights"], &["weights"], Some(host))?;
    /// assert_eq!((slept.released_bytes, paged.stats().memory_reserved()), (4 << 20, 0));
    /// paged.wake(&["weights"])?;
    /// assert_eq!(sim.read_bytes(weights.ptr(), 1).unwrap(), b"w");
    /// # Ok::<(), berth_alloc::AllocError>(())
    /// ```
    fn sleep(
        &self,
        tags: &[&str],
        offload: &[&str],
        host: Option<Arc<dyn BackupMemory>>,
    ) -> Result<SleepReport, AllocError> {
        let _ = (tags, offload, host);
        Err(lacks_sleep(self.policy_name()))
    }

    /// Wakes the sleeping tags `tags`: maps their memory back at the same addresses and copies
    /// their backups back (`Note [Sleep and wake]` in [`crate::paged`]). A failure to free a
    /// backup's host memory afterwards does not fail the wake; it is kept for
    /// [`DeviceAllocator::check_err`].
    ///
    /// # Errors
    /// Nothing changes on: [`AllocError::InvalidTag`], [`AllocError::UnknownTag`],
    /// [`AllocError::NotAsleep`], [`AllocError::SleepDuringCapture`],
    /// [`AllocError::PolicyLacks`]; [`AllocError::WakeFailed`] when the device memory cannot
    /// be had or a copy fails (every tag stays asleep with its backups);
    /// [`AllocError::Backend`] when undoing that fails.
    fn wake(&self, tags: &[&str]) -> Result<WakeReport, AllocError> {
        let _ = tags;
        Err(lacks_sleep(self.policy_name()))
    }

    /// The sleeping figures, apart from [`DeviceAllocator::stats`]: all zero for a policy
    /// without sleep.
    fn sleep_stats(&self) -> SleepStats {
        SleepStats::default()
    }
}

/// The error of a sleep or wake call to a policy that has none.
fn lacks_sleep(policy: &str) -> AllocError {
    AllocError::PolicyLacks {
        feature: "sleep and wake of tagged memory",
        policy: policy.to_owned(),
        instead: "use policy \"paged\", which maps memory in units it can release and map again",
    }
}

/// What [`DeviceAllocator::restore_pool`] did: the blocks it freed and the blocks it
/// allocated, by address (a block in both kept its memory).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolRestore {
    /// Every block that was allocated in the pool before the call.
    pub freed: Vec<DevicePtr>,
    /// Every block of the checkpoint, allocated after the call.
    pub allocated: Vec<DevicePtr>,
}

/// The error of a private-pool call to a policy that has none.
fn lacks_private_pools(policy: &str) -> AllocError {
    AllocError::PolicyLacks {
        feature:
            "private pools (CUDA graphs, torch.cuda.MemPool, torch.compile's reduce-overhead mode)",
        policy: policy.to_owned(),
        instead: "use one of berth's policies (\"pytorch\", \"expandable\", \"paged\"), which \
                  have them",
    }
}

/// The error of a policy whose pools cannot take their segments from an allocator of their
/// own; `instead` says what to do.
pub(crate) fn lacks_pool_sources(policy: &str, instead: &'static str) -> AllocError {
    AllocError::PolicyLacks {
        feature: "a torch.cuda.MemPool with an allocator of its own (MemPool(allocator=...))",
        policy: policy.to_owned(),
        instead,
    }
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
