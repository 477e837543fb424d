//! [`HostCachingAllocator`]: PyTorch's `CachingHostAllocatorImpl` policy over a [`HostBackend`].

use std::collections::{BTreeMap, VecDeque};
use std::ptr::NonNull;
use std::time::Instant;

use super::backend::HostBackend;
use super::stats::HostStats;
use super::{
    backend_err, host_block_size, HostAllocError, HostAllocation, HostAllocationOwner,
    HostAllocator, HostAllocatorConfig,
};
use crate::backend::DeviceStream;
use crate::sync::{Arc, Mutex, MutexGuard};

/// Number of free lists: one per power of two (PyTorch's `free_list_[64]`).
const NUM_BUCKETS: usize = 64;

/// Pages are pre-faulted one byte per this many bytes in register mode.
const PREFAULT_PAGE: usize = 4096;

/// One block of pinned memory (PyTorch's `HostBlock`).
#[derive(Debug)]
struct Block {
    /// Size in bytes, a power of two.
    size: usize,
    /// Checked out by a [`HostAllocation`].
    allocated: bool,
    /// Events still pending on it (see Note [Host block reuse] in `host/mod.rs`).
    event_count: usize,
    /// Streams it was used on since it was handed out.
    streams: Vec<DeviceStream>,
    /// Obtained through `register` (register mode) rather than `alloc_pinned`.
    registered: bool,
}

struct State {
    /// Every block, by start address.
    blocks: BTreeMap<usize, Block>,
    /// Free blocks by `log2(size)`; the most recently freed is last.
    free_lists: Vec<Vec<usize>>,
    stats: HostStats,
}

impl State {
    fn cached_bytes(&self) -> u64 {
        self.free_lists
            .iter()
            .flatten()
            .map(|a| self.blocks.get(a).map_or(0, |b| b.size as u64))
            .sum()
    }

    /// The block containing `addr`, if any.
    fn containing(&mut self, addr: usize) -> Option<(usize, &mut Block)> {
        self.blocks
            .range_mut(..=addr)
            .next_back()
            .filter(|(&start, b)| addr < start + b.size)
            .map(|(&start, b)| (start, b))
    }
}

/// The shared state: what [`HostAllocation`]s point back to.
struct Inner<B: HostBackend> {
    backend: B,
    config: HostAllocatorConfig,
    state: Mutex<State>,
    /// Pending (event, block address) pairs, oldest first.
    events: Mutex<VecDeque<(B::Fence, usize)>>,
    /// First error met in a drop-time free (cudarc's `record_err`).
    sticky: Mutex<Option<HostAllocError>>,
}

/// Locks `m`, recovering from poisoning: every critical section leaves the state consistent
/// before anything that could panic, and drop paths must not panic.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn bucket(size: usize) -> usize {
    size.trailing_zeros() as usize % NUM_BUCKETS
}

fn elapsed_us(t: Instant) -> i64 {
    i64::try_from(t.elapsed().as_micros()).unwrap_or(i64::MAX)
}

/// A caching allocator of pinned host memory with PyTorch's host policy (see [`super`]).
///
/// Cheap to share: clone the `Arc` you keep it in, or use it as `Arc<dyn HostAllocator>`.
///
/// ```
/// use berth_alloc::host::{HostAllocator, HostCachingAllocator, SimHostBackend};
/// use berth_alloc::{DeviceStream, StreamId};
/// let host = HostCachingAllocator::new(SimHostBackend::new(1 << 30));
/// let a = host.allocate(3 << 20)?; // rounded to 4 MiB
/// assert_eq!(a.capacity(), 4 << 20);
/// a.record_stream(DeviceStream::new(0, StreamId(7)))?; // a copy on cuda:0's stream 7 reads it
/// drop(a);
/// assert_eq!(host.allocate(4 << 20)?.capacity(), 4 << 20); // not reused yet: a new block
/// assert_eq!(host.stats().num_host_alloc, 2);
/// host.backend().complete_events_on(StreamId(7));
/// let b = host.allocate(4 << 20)?; // the first block again
/// assert_eq!(host.stats().num_host_alloc, 2);
/// # drop(b);
/// # Ok::<(), berth_alloc::host::HostAllocError>(())
/// ```
pub struct HostCachingAllocator<B: HostBackend> {
    inner: Arc<Inner<B>>,
}

impl<B: HostBackend> std::fmt::Debug for HostCachingAllocator<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostCachingAllocator")
            .field("stats", &self.stats())
            .finish()
    }
}

impl<B: HostBackend> HostCachingAllocator<B> {
    /// An empty allocator over `backend` with the default settings.
    pub fn new(backend: B) -> Self {
        Self::with_config(backend, HostAllocatorConfig::default())
    }

    /// An empty allocator over `backend` with `config`.
    pub fn with_config(backend: B, config: HostAllocatorConfig) -> Self {
        HostCachingAllocator {
            inner: Arc::new(Inner {
                backend,
                config,
                state: Mutex::new(State {
                    blocks: BTreeMap::new(),
                    free_lists: (0..NUM_BUCKETS).map(|_| Vec::new()).collect(),
                    stats: HostStats::default(),
                }),
                events: Mutex::new(VecDeque::new()),
                sticky: Mutex::new(None),
            }),
        }
    }

    /// The backend.
    pub fn backend(&self) -> &B {
        &self.inner.backend
    }

    /// The settings.
    pub fn config(&self) -> HostAllocatorConfig {
        self.inner.config
    }

    /// Bytes of blocks on the free lists (cached, reusable now), in bytes.
    pub fn cached_bytes(&self) -> u64 {
        lock(&self.inner.state).cached_bytes()
    }

    /// Number of (event, block) pairs still waiting for their event.
    pub fn pending_events(&self) -> usize {
        lock(&self.inner.events).len()
    }

    /// Allocates `bytes` bytes of pinned memory (see [`HostAllocator::allocate`]).
    ///
    /// Steps, after PyTorch's `allocate`: collect completed events; round up to a power of two;
    /// pop the most recently freed block of exactly that size; else ask the backend (outside
    /// every lock); on a backend out-of-memory, empty the cache and ask once more (berth's
    /// addition: PyTorch fails at once).
    ///
    /// # Errors
    /// As [`HostAllocator::allocate`].
    pub fn allocate(&self, bytes: usize) -> Result<HostAllocation, HostAllocError> {
        if bytes == 0 {
            return Ok(HostAllocation::empty());
        }
        let size = host_block_size(bytes).ok_or(HostAllocError::TooLarge {
            requested: bytes as u64,
        })?;
        // 1. Collect completed events, oldest first.
        self.inner.process_events()?;
        // 2. Cached block of exactly this size, most recently freed first.
        if let Some(addr) = self.inner.pop_free(size) {
            return Ok(self.wrap(addr, bytes, size));
        }
        // 3. New memory from the backend, outside the lock.
        let (ptr, registered) = match self.inner.backend_alloc(size) {
            Ok(p) => p,
            // 4. Out of memory: release cached blocks and try once more.
            Err(e) if e.is_out_of_memory() => {
                self.inner.empty_cache()?;
                self.inner.backend_alloc(size).map_err(|e| {
                    if e.is_out_of_memory() {
                        let st = lock(&self.inner.state);
                        let allocated = st.stats.allocated_bytes.current.max(0) as u64;
                        HostAllocError::OutOfMemory {
                            requested: bytes as u64,
                            rounded: size as u64,
                            allocated,
                            in_use: allocated.saturating_sub(st.cached_bytes()),
                        }
                    } else {
                        backend_err("alloc_pinned", e)
                    }
                })?
            }
            Err(e) => return Err(backend_err("alloc_pinned", e)),
        };
        let addr = ptr.as_ptr() as usize;
        let mut st = lock(&self.inner.state);
        st.blocks.insert(
            addr,
            Block {
                size,
                allocated: true,
                event_count: 0,
                streams: Vec::new(),
                registered,
            },
        );
        st.stats.allocations.increase(1);
        st.stats.allocated_bytes.increase(size as i64);
        st.stats.active_requests.increase(1);
        st.stats.active_bytes.increase(size as i64);
        drop(st);
        Ok(self.wrap(addr, bytes, size))
    }

    fn wrap(&self, addr: usize, bytes: usize, size: usize) -> HostAllocation {
        let owner: Arc<dyn HostAllocationOwner> = self.inner.clone();
        match NonNull::new(addr as *mut u8) {
            Some(p) => HostAllocation::new(p, bytes, size, owner),
            // Backends return non-null pointers (`NonNull`), so this is unreachable.
            None => HostAllocation::empty(),
        }
    }

    /// Frees every cached block (see [`HostAllocator::empty_cache`]).
    ///
    /// # Errors
    /// As [`HostAllocator::empty_cache`].
    pub fn empty_cache(&self) -> Result<(), HostAllocError> {
        self.inner.empty_cache()
    }

    /// Marks the live block containing `ptr` as used on `stream` (see
    /// [`HostAllocator::record_stream`]).
    ///
    /// # Errors
    /// [`HostAllocError::InvalidPointer`] if `ptr` is not inside a live block.
    pub fn record_stream(
        &self,
        ptr: *const u8,
        stream: DeviceStream,
    ) -> Result<(), HostAllocError> {
        self.inner.record_stream(ptr, stream)
    }

    /// Whether `ptr` is inside one of this allocator's blocks or memory the backend reports as
    /// pinned.
    pub fn is_pinned(&self, ptr: *const u8) -> bool {
        let ours = lock(&self.inner.state).containing(ptr as usize).is_some();
        ours || self.inner.backend.is_pinned(ptr)
    }

    /// A copy of the statistics.
    pub fn stats(&self) -> HostStats {
        lock(&self.inner.state).stats
    }
}

impl<B: HostBackend> Inner<B> {
    fn record_err(&self, e: HostAllocError) {
        lock(&self.sticky).get_or_insert(e);
    }

    fn pop_free(&self, size: usize) -> Option<usize> {
        let mut st = lock(&self.state);
        let addr = st.free_lists[bucket(size)].pop()?;
        if let Some(b) = st.blocks.get_mut(&addr) {
            b.allocated = true;
        }
        st.stats.active_requests.increase(1);
        st.stats.active_bytes.increase(size as i64);
        Some(addr)
    }

    /// Gets `size` bytes from the backend, timed into `host_alloc_time`. Called with no lock.
    fn backend_alloc(
        &self,
        size: usize,
    ) -> Result<(NonNull<u8>, bool), crate::error::BackendError> {
        let start = Instant::now();
        let result = if self.config.use_host_register {
            self.alloc_registered(size).map(|p| (p, true))
        } else {
            self.backend.alloc_pinned(size).map(|p| (p, false))
        };
        if result.is_ok() {
            let mut st = lock(&self.state);
            st.stats.num_host_alloc += 1;
            st.stats.host_alloc_time.record(elapsed_us(start));
        }
        result
    }

    /// Register mode: memory from the global allocator, pre-faulted from several threads, then
    /// page-locked. Not `alloc_zeroed`: for an alignment above 16 bytes that zero-fills the
    /// whole block on this thread (256 MiB took 150 ms on the H200 host, three times PyTorch's
    /// register mode); the contents of a pinned block are unspecified, as `cudaHostAlloc`'s are.
    fn alloc_registered(&self, size: usize) -> Result<NonNull<u8>, crate::error::BackendError> {
        let oom = || crate::error::BackendError::OutOfMemory {
            op: "register",
            bytes: size as u64,
        };
        let layout = std::alloc::Layout::from_size_align(size, PREFAULT_PAGE).map_err(|_| oom())?;
        // SAFETY: `size` is a power of two >= 1, so the layout has a non-zero size.
        let ptr = NonNull::new(unsafe { std::alloc::alloc(layout) }).ok_or_else(oom)?;
        prefault(ptr, size, self.config.num_register_threads);
        if let Err(e) = self.backend.register(ptr, size) {
            // SAFETY: `ptr` was allocated just above with `layout` and is not shared.
            unsafe { std::alloc::dealloc(ptr.as_ptr(), layout) };
            return Err(e);
        }
        Ok(ptr)
    }

    /// Returns a block to the backend, timed into `host_free_time`. Called with no lock.
    ///
    /// # Safety
    /// 1. `addr` is a block of this allocator of `size` bytes, removed from the state, with no
    ///    pending event and not checked out.
    unsafe fn backend_free(
        &self,
        addr: usize,
        size: usize,
        registered: bool,
    ) -> Result<(), HostAllocError> {
        let Some(ptr) = NonNull::new(addr as *mut u8) else {
            return Ok(());
        };
        let start = Instant::now();
        if registered {
            // SAFETY: register mode registered `ptr` with `size`; precondition 1 says no copy uses it.
            unsafe { self.backend.unregister(ptr, size) }
                .map_err(|e| backend_err("unregister", e))?;
            let layout =
                std::alloc::Layout::from_size_align(size, PREFAULT_PAGE).map_err(|_| {
                    backend_err(
                        "unregister",
                        crate::error::BackendError::Other {
                            op: "dealloc",
                            message: "bad layout".into(),
                        },
                    )
                })?;
            // SAFETY: allocated by `alloc_registered` with this layout, now unregistered and unused.
            unsafe { std::alloc::dealloc(ptr.as_ptr(), layout) };
        } else {
            // SAFETY: `ptr` came from `alloc_pinned(size)`; precondition 1 says it is idle and
            // no longer reachable from the state, so it is freed once.
            unsafe { self.backend.free_pinned(ptr, size) }
                .map_err(|e| backend_err("free_pinned", e))?;
        }
        let mut st = lock(&self.state);
        st.stats.num_host_free += 1;
        st.stats.host_free_time.record(elapsed_us(start));
        Ok(())
    }

    /// Collects completed events, oldest first, stopping at the first pending one (PyTorch's
    /// `process_events`). Events are queried and destroyed outside every lock.
    fn process_events(&self) -> Result<(), HostAllocError> {
        loop {
            let Some((event, addr)) = lock(&self.events).pop_front() else {
                return Ok(());
            };
            match self.backend.query_fence(&event) {
                Ok(true) => {}
                Ok(false) => {
                    lock(&self.events).push_front((event, addr));
                    return Ok(());
                }
                Err(e) => {
                    lock(&self.events).push_front((event, addr));
                    return Err(backend_err("query_fence", e));
                }
            }
            self.event_completed(addr);
            drop(event);
        }
    }

    fn event_completed(&self, addr: usize) {
        let mut st = lock(&self.state);
        let Some(b) = st.blocks.get_mut(&addr) else {
            return;
        };
        b.event_count = b.event_count.saturating_sub(1);
        if b.event_count == 0 && !b.allocated {
            let i = bucket(b.size);
            st.free_lists[i].push(addr);
        }
    }

    fn empty_cache(&self) -> Result<(), HostAllocError> {
        self.process_events()?;
        let mut taken = Vec::new();
        {
            let mut st = lock(&self.state);
            let lists: Vec<usize> = std::mem::take(&mut st.free_lists)
                .into_iter()
                .flatten()
                .collect();
            st.free_lists = (0..NUM_BUCKETS).map(|_| Vec::new()).collect();
            for addr in lists {
                if let Some(b) = st.blocks.remove(&addr) {
                    st.stats.allocations.decrease(1);
                    st.stats.allocated_bytes.decrease(b.size as i64);
                    taken.push((addr, b));
                }
            }
        }
        let mut first_err = None;
        for (addr, b) in taken {
            // SAFETY: the block was on a free list (idle, no pending event, not checked out) and
            // has just been removed from the state.
            if let Err(e) = unsafe { self.backend_free(addr, b.size, b.registered) } {
                // Keep it cached (and counted) so a later empty_cache can try again.
                let mut st = lock(&self.state);
                st.stats.allocations.increase(1);
                st.stats.allocated_bytes.increase(b.size as i64);
                let i = bucket(b.size);
                st.free_lists[i].push(addr);
                st.blocks.insert(addr, b);
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    fn record_stream(&self, ptr: *const u8, stream: DeviceStream) -> Result<(), HostAllocError> {
        let mut st = lock(&self.state);
        match st.containing(ptr as usize) {
            Some((_, b)) if b.allocated => {
                if !b.streams.contains(&stream) {
                    b.streams.push(stream);
                }
                Ok(())
            }
            _ => Err(HostAllocError::InvalidPointer { addr: ptr as usize }),
        }
    }
}

impl<B: HostBackend> HostAllocationOwner for Inner<B> {
    fn release(&self, ptr: NonNull<u8>) {
        let addr = ptr.as_ptr() as usize;
        let streams = {
            let mut st = lock(&self.state);
            let Some(b) = st.blocks.get_mut(&addr) else {
                drop(st);
                self.record_err(HostAllocError::InvalidPointer { addr });
                return;
            };
            if !b.allocated {
                drop(st);
                self.record_err(HostAllocError::DoubleFree { addr });
                return;
            }
            b.allocated = false;
            let size = b.size;
            let streams = std::mem::take(&mut b.streams);
            b.event_count += streams.len();
            if streams.is_empty() && b.event_count == 0 {
                st.free_lists[bucket(size)].push(addr);
            }
            st.stats.active_requests.decrease(1);
            st.stats.active_bytes.decrease(size as i64);
            streams
        };
        // One event per stream, recorded outside the lock (Note [Host block reuse]).
        for stream in streams {
            match self.backend.record_fence(stream) {
                Ok(event) => lock(&self.events).push_back((event, addr)),
                // The count stays raised: the block is never reused.
                Err(e) => self.record_err(backend_err("record_fence", e)),
            }
        }
    }

    fn record_stream(&self, ptr: *const u8, stream: DeviceStream) -> Result<(), HostAllocError> {
        Inner::record_stream(self, ptr, stream)
    }
}

impl<B: HostBackend> Drop for Inner<B> {
    /// Runs when the allocator and every allocation are gone: waits for pending events and
    /// frees every block that can be proven idle. Errors are ignored (nothing can report them);
    /// blocks stranded by a failed `record_fence` are leaked on purpose.
    fn drop(&mut self) {
        let events: Vec<_> = lock(&self.events).drain(..).collect();
        for (event, addr) in events {
            if self.backend.sync_fence(&event).is_ok() {
                self.event_completed(addr);
            }
        }
        let _ = self.empty_cache();
    }
}

impl<B: HostBackend> HostAllocator for HostCachingAllocator<B> {
    fn allocate(&self, bytes: usize) -> Result<HostAllocation, HostAllocError> {
        HostCachingAllocator::allocate(self, bytes)
    }

    fn record_stream(&self, ptr: *const u8, stream: DeviceStream) -> Result<(), HostAllocError> {
        HostCachingAllocator::record_stream(self, ptr, stream)
    }

    fn is_pinned(&self, ptr: *const u8) -> bool {
        HostCachingAllocator::is_pinned(self, ptr)
    }

    fn empty_cache(&self) -> Result<(), HostAllocError> {
        HostCachingAllocator::empty_cache(self)
    }

    fn stats(&self) -> HostStats {
        HostCachingAllocator::stats(self)
    }

    fn reset_peak_stats(&self) {
        lock(&self.inner.state).stats.reset_peak();
    }

    fn reset_accumulated_stats(&self) {
        lock(&self.inner.state).stats.reset_accumulated();
    }

    fn check_err(&self) -> Result<(), HostAllocError> {
        lock(&self.inner.sticky).take().map_or(Ok(()), Err)
    }
}

/// Touches one byte per 4 KiB page of a fresh block so the kernel backs it before
/// `cudaHostRegister` (PyTorch pre-faults over `pinned_num_register_threads` threads).
fn prefault(ptr: NonNull<u8>, size: usize, threads: usize) {
    let pages = size.div_ceil(PREFAULT_PAGE);
    let touch = |base: usize, first: usize, last: usize| {
        for page in first..last {
            let p = (base + page * PREFAULT_PAGE) as *mut u8;
            // SAFETY: `page < pages`, so `p` is inside the `size`-byte block allocated by the
            // caller, which no one else references yet; a volatile write cannot be optimised
            // away, so the page is faulted in here, on this thread.
            unsafe { p.write_volatile(0) };
        }
    };
    let base = ptr.as_ptr() as usize;
    let threads = threads.clamp(1, 128).min(pages.max(1));
    if threads == 1 {
        touch(base, 0, pages);
        return;
    }
    let per = pages.div_ceil(threads);
    std::thread::scope(|s| {
        for t in 0..threads {
            let (first, last) = (t * per, ((t + 1) * per).min(pages));
            s.spawn(move || touch(base, first, last));
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::SimHostBackend;

    /// Register mode on a small block, small enough for miri (`.ci/miri`): the pre-fault
    /// threads write inside the block only, and the block comes back zeroed and writable.
    #[test]
    fn register_mode_prefaults_a_small_block_from_several_threads() {
        let sim = Arc::new(SimHostBackend::new(1 << 20));
        let config = HostAllocatorConfig {
            use_host_register: true,
            num_register_threads: 4,
        };
        let host = HostCachingAllocator::with_config(sim.clone(), config);
        let mut a = host.allocate(5 * PREFAULT_PAGE).unwrap(); // 32 KiB: 8 pages, 4 threads
        assert_eq!(a.capacity(), 8 * PREFAULT_PAGE);
        assert_eq!((sim.counts().register, sim.counts().alloc_pinned), (1, 0));
        // SAFETY: this test owns the block; no stream uses it.
        let bytes = unsafe { a.as_mut_slice() };
        bytes.fill(7);
        assert!(bytes.iter().all(|&b| b == 7));
        drop(a);
        host.empty_cache().unwrap();
        assert_eq!((sim.counts().unregister, sim.used_bytes()), (1, 0));
    }
}
