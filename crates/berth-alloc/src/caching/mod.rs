//! [`CachingAllocator`]: PyTorch's CUDA caching allocator policy, exactly, over any
//! [`MemoryBackend`] (`c10/cuda/CUDACachingAllocator.cpp`,
//! <https://github.com/pytorch/pytorch/blob/main/c10/cuda/CUDACachingAllocator.cpp>; its user
//! documentation: <https://pytorch.org/docs/stable/notes/cuda.html#memory-management>).
//!
//! Requests are rounded to 512 bytes; blocks of at most 1 MiB come from 2 MiB segments of the
//! small pool, larger ones from 20 MiB segments (below 10 MiB) or 2 MiB-rounded segments of the
//! large pool; the free block chosen is the best fit ordered by (stream, size, address); blocks
//! are split and merged by PyTorch's rules; `max_split_size_mb`, `roundup_power2_divisions`,
//! `garbage_collection_threshold`, the memory fraction and `expandable_segments` behave as in
//! PyTorch. Cached memory returns to the backend only through [`DeviceAllocator::empty_cache`],
//! the out-of-memory fallback and GC.
//!
//! Concurrency: one mutex-guarded state per device; backend `malloc` runs with it released.

mod block;
mod checkpoint;
mod expandable;
mod fallback;
mod inspect;
pub mod policy;
mod pool;
pub mod private_pools;
mod sorted;
mod state;
mod stream_uses;

use crate::plumbing::{self, OomObservers, StickyError};
use crate::sync::{Arc, SpinGuard, SpinMutex};

use self::fallback::Request;
use self::state::State;
use crate::allocator::{Allocation, AllocationOwner, DeviceAllocator};
use crate::backend::{DevicePtr, MemoryBackend, SegmentSource, StreamId};
use crate::config::AllocatorConfig;
use crate::error::AllocError;
use crate::ids::{MempoolId, StreamFilter};
use crate::snapshot::{MemorySnapshot, TraceRing};
use crate::stats::MemoryStats;

/// The state shared by a [`CachingAllocator`] and its [`Allocation`]s.
pub(crate) struct Shared<B: MemoryBackend> {
    backend: B,
    /// The policy's state (`Note [Spin lock]` in `crate::sync`).
    state: SpinMutex<State<B::Fence>>,
    name: &'static str,
    /// Called after an OOM with the state lock released (`attach_out_of_memory_observer`).
    observers: OomObservers,
    /// The first error of a drop-time free.
    sticky: StickyError<AllocError>,
}

pub use crate::allocator::OomObserver;

impl<B: MemoryBackend> Shared<B> {
    #[inline]
    fn lock(&self) -> SpinGuard<'_, State<B::Fence>> {
        // The state is updated so that a panic mid-operation cannot occur on user input; if one
        // did (a bug), the lock does not poison: later calls keep being served.
        self.state.lock()
    }

    /// Drops the state lock, then makes the calls on pools' own allocators queued under it
    /// (`private_pools::SourceCalls`). Their bytes count as in flight meanwhile, so the
    /// memory-fraction check stays exact.
    fn unlock(&self, mut st: SpinGuard<'_, State<B::Fence>>) {
        if st.source_calls.is_empty() {
            return;
        }
        let calls = std::mem::take(&mut st.source_calls);
        st.inflight += calls.bytes;
        drop(st);
        // SAFETY: `release_block` queued each segment once, entirely free and with no pending
        // events, and it left the allocator's bookkeeping then.
        let bytes = unsafe { calls.run() };
        if bytes > 0 {
            self.lock().inflight -= bytes;
        }
    }

    fn malloc(&self, bytes: usize, stream: StreamId) -> Result<DevicePtr, AllocError> {
        if bytes == 0 {
            return Ok(DevicePtr::NULL);
        }
        let requested = bytes as u64;
        if requested >= policy::MAX_REQUEST {
            return Err(AllocError::TooLarge { requested });
        }
        let mut st = self.lock();
        st.process_events(&self.backend)?;
        let size = policy::round_size(requested, &st.cfg);
        let small = policy::is_small(size);
        let pool = private_pools::pool_index(st.private.pair_for(stream), small);
        if let Some(key) = st.get_free_block(stream, size, pool) {
            return Ok(DevicePtr(st.alloc_found_block(
                key.3,
                size,
                requested,
                Some(key),
            )));
        }
        let r = Request {
            stream,
            size,
            alloc_size: policy::allocation_size(size),
            requested,
            pool,
        };
        match self.malloc_fallback(st, r) {
            Ok((mut st, i)) => {
                let ptr = DevicePtr(st.alloc_found_block(i, size, requested, None));
                self.unlock(st);
                Ok(ptr)
            }
            Err(e) => {
                // The state guard is gone: observers may use the allocator.
                self.observers.notify(&e);
                Err(e)
            }
        }
    }

    fn free(&self, ptr: DevicePtr) -> Result<(), AllocError> {
        if ptr.is_null() {
            return Ok(());
        }
        let mut st = self.lock();
        match st.allocated.remove(&ptr.0) {
            Some(i) => st.free_requested(&self.backend, i),
            None => Err(st.classify_bad_pointer(ptr.0)),
        }
    }
}

impl<B: MemoryBackend> AllocationOwner for Shared<B> {
    fn release(&self, ptr: DevicePtr) {
        if let Err(e) = self.free(ptr) {
            self.sticky.record(e);
        }
    }

    fn record_stream(&self, ptr: DevicePtr, stream: StreamId) -> Result<(), AllocError> {
        self.lock().record_stream(ptr.0, stream)
    }
}

/// PyTorch's caching allocator policy over backend `B`. Cheap to clone (a handle).
///
/// ```
/// use berth_alloc::{backend::{sim::SimBackend, StreamId}, caching::CachingAllocator, DeviceAllocator};
/// let alloc = CachingAllocator::new(SimBackend::new(1 << 30));
/// let a = alloc.allocate(5 << 20, StreamId::DEFAULT).unwrap();
/// assert_eq!(alloc.stats().memory_reserved(), 20 << 20); // a 20 MiB segment
/// ```
pub struct CachingAllocator<B: MemoryBackend> {
    shared: Arc<Shared<B>>,
}

impl<B: MemoryBackend> Clone for CachingAllocator<B> {
    fn clone(&self) -> Self {
        CachingAllocator {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<B: MemoryBackend> std::fmt::Debug for CachingAllocator<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CachingAllocator")
            .field("policy", &self.shared.name)
            .finish_non_exhaustive()
    }
}

impl<B: MemoryBackend> CachingAllocator<B> {
    /// PyTorch's default configuration over `backend`.
    pub fn new(backend: B) -> Self {
        Self::build(backend, AllocatorConfig::default())
    }

    /// A configured allocator (see [`AllocatorConfig::parse`]).
    ///
    /// # Errors
    /// [`AllocError::Unsupported`] when `expandable_segments` is on and the backend has no
    /// [`crate::backend::VirtualMemoryBackend`].
    pub fn with_config(backend: B, config: AllocatorConfig) -> Result<Self, AllocError> {
        if config.expandable_segments && backend.as_virtual().is_none() {
            return Err(AllocError::Unsupported {
                feature: "expandable_segments",
                needs: "a backend with virtual-memory support (VirtualMemoryBackend)",
            });
        }
        Ok(Self::build(backend, config))
    }

    fn build(backend: B, config: AllocatorConfig) -> Self {
        let name = if config.expandable_segments {
            "expandable"
        } else {
            "pytorch"
        };
        CachingAllocator {
            shared: Arc::new(Shared {
                backend,
                state: SpinMutex::new(State::new(config)),
                name,
                observers: OomObservers::new(),
                sticky: StickyError::new(),
            }),
        }
    }

    /// The backend.
    pub fn backend(&self) -> &B {
        &self.shared.backend
    }

    /// The configuration.
    pub fn config(&self) -> AllocatorConfig {
        self.shared.lock().cfg.clone()
    }

    /// Completes the cross-stream frees whose events have completed, without allocating (PyTorch
    /// does this only at the next allocation).
    ///
    /// # Errors
    /// [`AllocError::Backend`] if an event query fails.
    pub fn process_events(&self) -> Result<(), AllocError> {
        self.shared.lock().process_events(&self.shared.backend)
    }

    /// Checks every internal invariant (blocks tile their segments without overlap, pools hold
    /// exactly the free blocks, every current statistic equals its recomputation from the
    /// blocks). For tests; O(blocks).
    ///
    /// # Errors
    /// A description of the first violated invariant.
    pub fn validate(&self) -> Result<(), String> {
        self.shared.lock().validate()
    }
}

impl<B: MemoryBackend> DeviceAllocator for CachingAllocator<B> {
    fn policy_name(&self) -> &str {
        self.shared.name
    }

    fn allocate(&self, bytes: usize, stream: StreamId) -> Result<Allocation, AllocError> {
        let ptr = self.shared.malloc(bytes, stream)?;
        Ok(plumbing::wrap(ptr, bytes, stream, &self.shared))
    }

    fn raw_alloc(&self, bytes: usize, stream: StreamId) -> Result<DevicePtr, AllocError> {
        self.shared.malloc(bytes, stream)
    }

    fn raw_delete(&self, ptr: DevicePtr) -> Result<(), AllocError> {
        self.shared.free(ptr)
    }

    fn raw_record_stream(&self, ptr: DevicePtr, stream: StreamId) -> Result<(), AllocError> {
        self.shared.lock().record_stream(ptr.0, stream)
    }

    fn empty_cache(&self) -> Result<(), AllocError> {
        let mut st = self.shared.lock();
        let released = st.release_cached_blocks(&self.shared.backend);
        self.shared.unlock(st);
        released
    }

    fn stats(&self) -> MemoryStats {
        self.shared.lock().stats
    }

    fn allocated_and_reserved(&self) -> (u64, u64) {
        let lock = self.shared.lock();
        (lock.stats.memory_allocated(), lock.stats.memory_reserved())
    }

    fn memory_summary(&self, abbreviated: bool) -> String {
        let driver = self.shared.backend.mem_info().ok();
        let st = self.shared.lock();
        crate::summary::memory_summary(&st.stats, st.device, self.shared.name, abbreviated, driver)
    }

    fn reset_peak_memory_stats(&self) {
        self.shared.lock().stats.reset_peak();
    }

    fn reset_accumulated_memory_stats(&self) {
        self.shared.lock().stats.reset_accumulated();
    }

    fn snapshot(&self) -> MemorySnapshot {
        self.shared.lock().snapshot()
    }

    fn record_memory_history(&self, max_entries: Option<usize>) {
        self.shared.lock().history = max_entries.map(TraceRing::new);
    }

    fn set_memory_fraction(&self, fraction: f64) -> Result<(), AllocError> {
        let (cap, total) = plumbing::fraction_cap(&self.shared.backend, fraction)?;
        let mut st = self.shared.lock();
        st.device_total = Some(total);
        st.allowed = Some(cap);
        Ok(())
    }

    fn attach_oom_observer(&self, observer: OomObserver) {
        self.shared.observers.push(observer);
    }

    fn set_device_index(&self, device: i32) {
        self.shared.lock().device = device;
    }

    fn check_err(&self) -> Result<(), AllocError> {
        self.shared.sticky.take()
    }

    fn create_or_incref_pool(&self, id: MempoolId) -> Result<(), AllocError> {
        let mut st = self.shared.lock();
        let (pair, new) = st.private.create_or_incref(id)?;
        if new {
            st.add_pool_pair(pair);
        }
        Ok(())
    }

    fn create_pool_with_source(
        &self,
        id: MempoolId,
        source: Arc<dyn SegmentSource>,
    ) -> Result<(), AllocError> {
        let mut st = self.shared.lock();
        if st.cfg.expandable_segments {
            return Err(crate::allocator::lacks_pool_sources(
                self.policy_name(),
                "PyTorch's expandable segments refuse it too (\"MemPool doesn't currently \
                 support expandable_segments\"); use the \"pytorch\" policy for a program with \
                 such a pool",
            ));
        }
        let pair = st.private.create_with_source(id, &source)?;
        st.add_pool_pair(pair);
        Ok(())
    }

    fn begin_allocate_to_pool(
        &self,
        id: MempoolId,
        filter: StreamFilter,
    ) -> Result<(), AllocError> {
        let mut st = self.shared.lock();
        let (pair, new) = st.private.begin(id, filter)?;
        if new {
            st.add_pool_pair(pair);
        }
        Ok(())
    }

    fn end_allocate_to_pool(&self, id: MempoolId) -> Result<(), AllocError> {
        self.shared.lock().private.end(id)
    }

    fn release_pool(&self, id: MempoolId) -> Result<(), AllocError> {
        self.shared.lock().private.release(id).map(|_| ())
    }

    fn pool_use_count(&self, id: MempoolId) -> u32 {
        self.shared.lock().private.use_count(id)
    }

    fn check_pool_live_allocations(
        &self,
        id: MempoolId,
        expected: &std::collections::HashSet<DevicePtr>,
    ) -> Result<bool, AllocError> {
        let st = self.shared.lock();
        let pair = st.private.pair_of(id).ok_or(AllocError::NoSuchPool {
            id,
            what: "check its live allocations: no such pool",
        })?;
        let live = st
            .allocated
            .iter()
            .map(|(_, &i)| &st.blocks[i])
            .filter(|b| b.pool / 2 == pair)
            .map(|b| b.ptr);
        Ok(private_pools::live_allocations_match(live, expected))
    }

    fn empty_pool_cache(&self, id: MempoolId) -> Result<(), AllocError> {
        let mut st = self.shared.lock();
        let pair = st.private.pair_of(id).ok_or(AllocError::NoSuchPool {
            id,
            what: "empty its cache: no such pool",
        })?;
        st.synchronize_and_free_events(&self.shared.backend)?;
        let released = st.release_pool_pair(&self.shared.backend, pair);
        self.shared.unlock(st);
        released
    }

    fn set_use_on_oom(&self, id: MempoolId, on: bool) -> Result<(), AllocError> {
        self.shared.lock().private.set_use_on_oom(id, on)
    }

    fn set_no_split(&self, id: MempoolId) -> Result<(), AllocError> {
        self.shared.lock().private.set_no_split(id)
    }

    fn restore_pool(
        &self,
        id: MempoolId,
        live: &[(DevicePtr, u64)],
    ) -> Result<crate::PoolRestore, AllocError> {
        self.shared
            .lock()
            .restore_pool(&self.shared.backend, id, live)
    }
}
