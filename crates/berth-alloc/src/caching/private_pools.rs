//! Private pools: the memory of CUDA graphs and of `torch.cuda.MemPool`, kept apart from the
//! general pools (PyTorch's `PrivatePool`, `beginAllocateToPool`, `endAllocateToPool`,
//! `releasePool`, `createOrIncrefPool`, `getPoolUseCount`, `checkPoolLiveAllocations`:
//! <https://github.com/pytorch/pytorch/blob/main/c10/cuda/CUDACachingAllocator.cpp>, notes
//! "[Interaction with CUDA graph capture]"; the user's side:
//! <https://pytorch.org/docs/stable/notes/cuda.html#memory-management>).
//!
//! # Note [Private pools]
//! A private pool is a pair of block pools (large and small) in the allocator's list of pools:
//! the general pair is at indices 0 and 1, private pool `k` (from 1) at `2k` and `2k + 1`
//! (`pool_index`). A block remembers its pool, so a free returns it to the pool it came
//! from and merges stay inside it; a segment belongs to the pool that asked for it, whole.
//!
//! While a pool is being allocated to (`begin_allocate_to_pool`, with a filter of streams),
//! every request on a stream the filter accepts is served from that pool, searched and grown
//! like the general one; the first matching pool of the list wins, as in PyTorch. A pool lives
//! while its use count is above zero (each `create_or_incref_pool` and each
//! `begin_allocate_to_pool` counts one; `release_pool` gives one back). At zero it becomes
//! freeable: the next `empty_cache` (or the out-of-memory flush) returns its cached segments,
//! and the pool is forgotten once it holds none. Until then its cached blocks are never used
//! for requests outside it: that is what keeps a captured graph's addresses valid.
//!
//! While any pool is being allocated to, the out-of-memory fallback does not flush the caches
//! (PyTorch's `captures_underway` check: freeing memory is illegal during graph capture).
//!
//! Two settings of a pool, from `torch.cuda.MemPool(use_on_oom=..., no_split=...)`
//! (PyTorch's `setUseOnOOM`, `setNoSplit`): a *use-on-OOM* pool lends its cached free blocks to
//! a request of the general pool that would otherwise fail with out-of-memory, as the last
//! step before the error (the block stays the pool's: its free returns it there); a
//! *no-split* pool never cuts a block, so each allocation takes a whole free block of the pool
//! (a whole segment when it is new), as memory registered with NCCL or shared as symmetric
//! memory must be. `paged` has use-on-OOM pools and no no-split ones (it has no segments).
//!
//! A pool may also take its segments from an allocator of its own
//! (`torch.cuda.MemPool(allocator=...)`; `Note [Pools with their own allocator]` in
//! [`crate::backend`]).

use std::collections::HashSet;
use std::sync::Arc;

use crate::backend::SegmentSource;
use crate::error::AllocError;
use crate::ids::{DevicePtr, MempoolId, StreamFilter, StreamId};

/// The index in the allocator's pools of pool pair `pair` (0: general; `k`: private pool
/// `k`), small or large (`Note [Private pools]`).
#[inline]
pub(crate) fn pool_index(pair: u16, small: bool) -> u16 {
    pair * 2 + small as u16
}

/// One private pool's bookkeeping.
pub(crate) struct PrivatePool {
    pub id: MempoolId,
    /// Graphs, `MemPool`s and allocation windows using it.
    pub use_count: u32,
    /// Segments (and expandable segments) it holds (PyTorch's `cudaMalloc_count`). The
    /// `paged` policy leaves it 0 and asks its page map instead (`Note [Private pools in
    /// paged]` in `crate::paged`).
    pub segments: u32,
    /// Lends its free blocks to general requests that would fail (`setUseOnOOM`).
    pub use_on_oom: bool,
    /// Never cuts a block (`setNoSplit`).
    pub no_split: bool,
    /// Where its segments come from when not from the backend (`MemPool(allocator=...)`).
    pub source: Option<Arc<dyn SegmentSource>>,
}

impl std::fmt::Debug for PrivatePool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrivatePool")
            .field("id", &self.id)
            .field("use_count", &self.use_count)
            .field("segments", &self.segments)
            .field("use_on_oom", &self.use_on_oom)
            .field("no_split", &self.no_split)
            .field("own_allocator", &self.source.is_some())
            .finish()
    }
}

/// A pool being allocated to.
struct Capture {
    id: MempoolId,
    pair: u16,
    filter: StreamFilter,
}

/// The private pools of one device.
#[derive(Default)]
pub(crate) struct PrivatePools {
    /// Pool pair `k` at index `k - 1`; `None` for a slot free for reuse.
    pools: Vec<Option<PrivatePool>>,
    captures: Vec<Capture>,
}

impl std::fmt::Debug for PrivatePools {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrivatePools")
            .field("pools", &self.pools)
            .field(
                "capturing",
                &self.captures.iter().map(|c| c.id).collect::<Vec<_>>(),
            )
            .finish()
    }
}

fn no_pool(id: MempoolId, what: &'static str) -> AllocError {
    AllocError::NoSuchPool { id, what }
}

impl PrivatePools {
    /// The pool pair that serves a request on `stream`: the first pool being allocated to
    /// whose filter accepts it, else 0 (general).
    #[inline]
    pub fn pair_for(&self, stream: StreamId) -> u16 {
        if self.captures.is_empty() {
            return 0;
        }
        self.captures
            .iter()
            .find(|c| (c.filter)(stream))
            .map_or(0, |c| c.pair)
    }

    /// Whether any pool is being allocated to now.
    pub fn capturing(&self) -> bool {
        !self.captures.is_empty()
    }

    /// The pair of pool `id`, if it exists.
    pub fn pair_of(&self, id: MempoolId) -> Option<u16> {
        self.pools
            .iter()
            .position(|p| p.as_ref().is_some_and(|p| p.id == id))
            .map(|k| k as u16 + 1)
    }

    /// Pool pair `pair`'s bookkeeping (`pair` ≥ 1 and live).
    pub fn get_mut(&mut self, pair: u16) -> Option<&mut PrivatePool> {
        self.pools
            .get_mut(usize::from(pair).checked_sub(1)?)?
            .as_mut()
    }

    /// The id of pool pair `pair`; `(0, 0)` for the general pair.
    pub fn id_of(&self, pair: u16) -> MempoolId {
        match usize::from(pair).checked_sub(1) {
            Some(k) => self.pools[k].as_ref().map_or((0, 0), |p| p.id),
            None => (0, 0),
        }
    }

    /// Creates pool `id` with a use count of 1, or counts one more use of it. Returns the
    /// pair and whether it is new (the caller then adds its two block pools).
    ///
    /// # Errors
    /// [`AllocError::NoSuchPool`] for `(0, 0)`; [`AllocError::TooManyPools`] past 32767
    /// pools.
    pub fn create_or_incref(&mut self, id: MempoolId) -> Result<(u16, bool), AllocError> {
        if let Some(pair) = self.pair_of(id) {
            let p = self.get_mut(pair).expect("live pool");
            p.use_count += 1;
            return Ok((pair, false));
        }
        self.insert(id, None).map(|pair| (pair, true))
    }

    /// Creates pool `id` with a use count of 1 whose segments come from `source`
    /// (`Note [Pools with their own allocator]`). Returns its pair (the caller adds its two
    /// block pools).
    ///
    /// # Errors
    /// [`AllocError::NoSuchPool`] for `(0, 0)` or a pool that exists already (a pool's
    /// allocator is given when it is created); [`AllocError::TooManyPools`] past 32767 pools.
    pub fn create_with_source(
        &mut self,
        id: MempoolId,
        source: &Arc<dyn SegmentSource>,
    ) -> Result<u16, AllocError> {
        if self.pair_of(id).is_some() {
            return Err(no_pool(
                id,
                "give it an allocator of its own: it exists already, and a pool's allocator \
                 is given when the pool is created (torch.cuda.MemPool(allocator=...))",
            ));
        }
        self.insert(id, Some(Arc::clone(source)))
    }

    /// Adds pool `id` with one use in a free slot; returns its pair.
    fn insert(
        &mut self,
        id: MempoolId,
        source: Option<Arc<dyn SegmentSource>>,
    ) -> Result<u16, AllocError> {
        if id == (0, 0) {
            return Err(no_pool(
                id,
                "create a private pool: (0, 0) is the general pool",
            ));
        }
        let pool = Some(PrivatePool {
            id,
            use_count: 1,
            segments: 0,
            use_on_oom: false,
            no_split: false,
            source,
        });
        let k = match self.pools.iter().position(Option::is_none) {
            Some(k) => {
                self.pools[k] = pool;
                k
            }
            None if self.pools.len() < usize::from(u16::MAX / 2) - 1 => {
                self.pools.push(pool);
                self.pools.len() - 1
            }
            None => return Err(AllocError::TooManyPools),
        };
        Ok(k as u16 + 1)
    }

    /// The allocator of pool pair `pair`'s own, if it has one (none for the general pair).
    #[inline]
    pub fn source(&self, pair: u16) -> Option<&Arc<dyn SegmentSource>> {
        let k = usize::from(pair).checked_sub(1)?;
        self.pools.get(k)?.as_ref()?.source.as_ref()
    }

    /// Starts serving requests on the streams `filter` accepts from pool `id` (created if
    /// new, one more use otherwise). Returns the pair and whether the pool is new.
    ///
    /// # Errors
    /// [`AllocError::PoolInUse`] when `id` is already being allocated to; as
    /// [`PrivatePools::create_or_incref`].
    pub fn begin(
        &mut self,
        id: MempoolId,
        filter: StreamFilter,
    ) -> Result<(u16, bool), AllocError> {
        if self.captures.iter().any(|c| c.id == id) {
            return Err(AllocError::PoolInUse { id });
        }
        let (pair, new) = self.create_or_incref(id)?;
        self.captures.push(Capture { id, pair, filter });
        Ok((pair, new))
    }

    /// Stops serving requests from pool `id`.
    ///
    /// # Errors
    /// [`AllocError::NoSuchPool`] when `id` is not being allocated to.
    pub fn end(&mut self, id: MempoolId) -> Result<(), AllocError> {
        match self.captures.iter().position(|c| c.id == id) {
            Some(k) => {
                self.captures.remove(k);
                Ok(())
            }
            None => Err(no_pool(
                id,
                "end allocating to it: it is not being allocated to",
            )),
        }
    }

    /// Gives back one use of pool `id`; returns its use count after.
    ///
    /// # Errors
    /// [`AllocError::NoSuchPool`] for an unknown pool or one whose uses are all given back.
    pub fn release(&mut self, id: MempoolId) -> Result<u32, AllocError> {
        let pair = self
            .pair_of(id)
            .ok_or_else(|| no_pool(id, "release it: no such pool"))?;
        let p = self.get_mut(pair).expect("live pool");
        if p.use_count == 0 {
            return Err(no_pool(id, "release it: every use was already released"));
        }
        p.use_count -= 1;
        Ok(p.use_count)
    }

    /// The use count of pool `id`; 0 for an unknown one (PyTorch's `getPoolUseCount`).
    pub fn use_count(&self, id: MempoolId) -> u32 {
        self.pair_of(id)
            .and_then(|pair| self.pools[usize::from(pair) - 1].as_ref())
            .map_or(0, |p| p.use_count)
    }

    /// Sets whether pool `id` lends its free blocks to general requests that would fail with
    /// out-of-memory (PyTorch's `setUseOnOOM`). Switching it off for a pool that is gone
    /// already does nothing (`~MemPool` does that after the pool may have been freed).
    ///
    /// # Errors
    /// [`AllocError::NoSuchPool`] when switching it on for an unknown pool.
    pub fn set_use_on_oom(&mut self, id: MempoolId, on: bool) -> Result<(), AllocError> {
        match self.pair_of(id) {
            Some(pair) => self.get_mut(pair).expect("live pool").use_on_oom = on,
            None if on => return Err(no_pool(id, "set use_on_oom: no such pool")),
            None => {}
        }
        Ok(())
    }

    /// Makes pool `id` never cut a block (PyTorch's `setNoSplit`).
    ///
    /// # Errors
    /// [`AllocError::NoSuchPool`] for an unknown pool.
    pub fn set_no_split(&mut self, id: MempoolId) -> Result<(), AllocError> {
        let pair = self
            .pair_of(id)
            .ok_or_else(|| no_pool(id, "set no_split: no such pool"))?;
        self.get_mut(pair).expect("live pool").no_split = true;
        Ok(())
    }

    /// Whether pool pair `pair` never cuts a block (false for the general pair).
    #[inline]
    pub fn no_split(&self, pair: u16) -> bool {
        pair != 0
            && self.pools[usize::from(pair) - 1]
                .as_ref()
                .is_some_and(|p| p.no_split)
    }

    /// Whether any pool lends its free blocks on out-of-memory.
    pub fn lends_on_oom(&self) -> bool {
        self.pools.iter().flatten().any(|p| p.use_on_oom)
    }

    /// The pairs of the pools that lend their free blocks on out-of-memory, in creation
    /// order of their slots.
    pub fn use_on_oom_pairs(&self) -> Vec<u16> {
        self.pools
            .iter()
            .enumerate()
            .filter_map(|(k, p)| p.as_ref().filter(|p| p.use_on_oom).map(|_| k as u16 + 1))
            .collect()
    }

    /// The pairs of the pools whose use count is 0 (freeable at the next flush).
    pub fn freeable(&self) -> Vec<u16> {
        self.pools
            .iter()
            .enumerate()
            .filter_map(|(k, p)| {
                p.as_ref()
                    .filter(|p| p.use_count == 0)
                    .map(|_| k as u16 + 1)
            })
            .collect()
    }

    /// Forgets pool pair `pair` (freeable and holding no segment). Returns its own allocator,
    /// if it had one, for the caller to let go of once the state lock is dropped.
    #[must_use]
    pub fn forget(&mut self, pair: u16) -> Option<Arc<dyn SegmentSource>> {
        debug_assert!(self
            .get_mut(pair)
            .is_some_and(|p| p.use_count == 0 && p.segments == 0));
        self.pools[usize::from(pair) - 1]
            .take()
            .and_then(|p| p.source)
    }
}

/// Calls on pools' own allocators that wait until the state lock is dropped
/// (`Note [Pools with their own allocator]`): segments to give back, and the allocators of
/// forgotten pools to let go of. A pool's allocator may run Python (vLLM's does) or free CUDA
/// tensors, which would come back into this allocator: it is never called with the lock held.
#[derive(Default)]
pub(crate) struct SourceCalls {
    frees: Vec<(Arc<dyn SegmentSource>, u64)>,
    drops: Vec<Arc<dyn SegmentSource>>,
    /// Bytes of the segments in `frees`, still held from their allocators.
    pub bytes: u64,
}

impl SourceCalls {
    /// Queues giving segment `ptr` of `bytes` back to `source`.
    pub fn free_later(&mut self, source: &Arc<dyn SegmentSource>, ptr: u64, bytes: u64) {
        self.frees.push((Arc::clone(source), ptr));
        self.bytes += bytes;
    }

    /// Queues letting go of `source`.
    pub fn drop_later(&mut self, source: Arc<dyn SegmentSource>) {
        self.drops.push(source);
    }

    /// Whether nothing is queued.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.frees.is_empty() && self.drops.is_empty()
    }

    /// Makes the queued calls (after the lock is dropped); returns the bytes given back.
    ///
    /// # Safety
    /// Every queued segment came from its source's `alloc`, is queued once, and no queued GPU
    /// work uses it.
    pub unsafe fn run(self) -> u64 {
        for (source, ptr) in self.frees {
            // SAFETY: the caller's contract.
            unsafe { source.free(DevicePtr(ptr)) };
        }
        drop(self.drops);
        self.bytes
    }
}

/// The blocks of a checkpoint of pool `id` (`Note [Restoring a pool checkpoint]` in
/// `crate::paged`) as `(address, size)`, sorted by address, once each size is a positive
/// multiple of 512 and no two overlap: the checks every policy makes before its own.
///
/// # Errors
/// [`AllocError::BadCheckpoint`] naming the first block that fails.
pub(crate) fn checkpoint_blocks(
    id: MempoolId,
    live: &[(DevicePtr, u64)],
) -> Result<Vec<(u64, u64)>, AllocError> {
    let bad = |what: String| AllocError::BadCheckpoint { id, what };
    let mut want = Vec::with_capacity(live.len());
    for &(DevicePtr(addr), size) in live {
        if size == 0 || size % 512 != 0 || addr.checked_add(size).is_none() {
            return Err(bad(format!(
                "block {addr:#x} has size {size}: sizes are positive multiples of 512"
            )));
        }
        want.push((addr, size));
    }
    want.sort_unstable();
    if let Some(w) = want.windows(2).find(|w| w[0].0 + w[0].1 > w[1].0) {
        return Err(bad(format!(
            "blocks {:#x} ({} bytes) and {:#x} overlap",
            w[0].0, w[0].1, w[1].0
        )));
    }
    Ok(want)
}

/// Whether the allocated blocks of a pool are exactly `expected` (PyTorch's
/// `checkPoolLiveAllocations`, which CUDA-graph trees call to check that only the outputs
/// they know of are alive).
pub(crate) fn live_allocations_match(
    live: impl Iterator<Item = u64>,
    expected: &HashSet<DevicePtr>,
) -> bool {
    let mut n = 0usize;
    for ptr in live {
        if !expected.contains(&DevicePtr(ptr)) {
            return false;
        }
        n += 1;
    }
    n == expected.len()
}
