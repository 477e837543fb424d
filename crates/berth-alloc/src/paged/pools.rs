//! Private pools of [`super::PagedBestFit`]: the memory of CUDA graphs, `torch.cuda.MemPool`
//! and `torch.compile(mode="reduce-overhead")`, kept apart from the general pool with
//! PyTorch's semantics (`beginAllocateToPool`, `endAllocateToPool`, `releasePool`,
//! `createOrIncrefPool`, `getPoolUseCount`, `checkPoolLiveAllocations`, `emptyCache(mempool)`:
//! <https://github.com/pytorch/pytorch/blob/main/c10/cuda/CUDACachingAllocator.cpp>).
//!
//! # Note [Private pools in paged]
//! The bookkeeping of pools (ids, use counts, which pool is being allocated to for which
//! streams) is the caching policy's, `Note [Private pools]` in
//! [`crate::caching::private_pools`]; what differs is where a pool's memory lives.
//!
//! 1. **Own address space.** An arena (free extents over reserved virtual ranges) belongs to
//!    one stream *and one pool*: general (pair 0) or private pool `k`. While a pool is being
//!    allocated to, a request on a stream its filter accepts is placed in that pool's arena
//!    for the stream, reserved on first use. Blocks, free extents and the pages under them
//!    therefore never cross pools: a pool's memory, mapped or cached, is never handed to a
//!    request of another pool or of the general pool, and a free returns a block to the arena
//!    it came from. Snapshots give each segment its arena's pool id, and a mapped range
//!    spanning two adjacent reservations is two segments.
//! 2. **Kept while used.** Free mapped pages of a private pool with a use count above zero
//!    are never unmapped: neither by step 3 of `Note [Paged best fit]`, nor by the
//!    out-of-memory retry, nor by `empty_cache`. That keeps a captured graph's addresses
//!    backed for its replays. [`crate::DeviceAllocator::empty_pool_cache`] unmaps a pool's
//!    free units whatever its use count, as PyTorch's `emptyCache(mempool_id)`.
//! 3. **Nothing unmapped during a capture.** While any pool is being allocated to, no unit is
//!    unmapped anywhere and no stream is synchronized: step 3 and the out-of-memory retry are
//!    skipped (a request the mapped memory cannot serve then fails with an out-of-memory
//!    error), the pages mapped for a request that failed stay mapped as free memory of its
//!    arena, and `empty_cache` and `empty_pool_cache` do nothing (PyTorch's
//!    `captures_underway` checks: freeing memory is illegal during graph capture). No event
//!    is recorded or queried either: a block freed with cross-stream uses waits in a deferred
//!    list and gets its events at the first allocation or `empty_cache` after the capture
//!    (PyTorch's `needs_events_deferred_until_no_capture`).
//! 4. **Released.** When [`crate::DeviceAllocator::release_pool`] brings a pool's use count to
//!    zero and no block of the pool is live or waiting for events, its free units are
//!    unmapped at once (unless a pool is being allocated to); a pool with live blocks keeps
//!    its memory until they are freed. A pool at zero uses is *freeable*: its units go with
//!    the general pool's in step 3, the out-of-memory retry and `empty_cache`. The next
//!    `empty_cache` or `empty_pool_cache` that leaves a freeable pool with nothing mapped
//!    forgets it: its reservations are released and its arena slots reused.

use std::collections::HashSet;

use super::arena::{Arena, RETIRED};
use super::state::{backend_err, vm, State};
use crate::backend::{DevicePtr, MemoryBackend, StreamId};
use crate::caching::private_pools::live_allocations_match;
use crate::error::AllocError;
use crate::ids::{MempoolId, StreamFilter};

impl<E> State<E> {
    /// The pair of pool `id`.
    ///
    /// # Errors
    /// [`AllocError::NoSuchPool`] for an unknown pool, saying that `what` cannot be done.
    pub(super) fn pool_pair(&self, id: MempoolId, what: &'static str) -> Result<u16, AllocError> {
        self.private
            .pair_of(id)
            .ok_or(AllocError::NoSuchPool { id, what })
    }

    /// The arena slots of pool pair `pair`.
    fn pool_arenas(&self, pair: u16) -> Vec<usize> {
        (0..self.arenas.len())
            .filter(|&i| self.arenas[i].pair == pair)
            .collect()
    }

    /// Whether a block of pool pair `pair` is live, waiting for events or deferred.
    fn pool_has_blocks(&self, pair: u16) -> bool {
        let of = |arena: usize| self.arenas[arena].pair == pair;
        self.live.iter().any(|(_, l)| of(l.arena))
            || self.pending.iter().any(|p| of(p.arena))
            || self.deferred.iter().any(|(_, l)| of(l.arena))
    }

    /// A block of `size` bytes on mapped free memory of a pool that lends on out-of-memory,
    /// in its arena for `stream` and `tag`; its address, or `None` when no such pool has one.
    pub(super) fn borrow_on_oom(
        &mut self,
        stream: StreamId,
        tag: u32,
        size: u64,
        bytes: u64,
    ) -> Option<u64> {
        for pair in self.private.use_on_oom_pairs() {
            let Some(&ai) = self.arena_of.get(&(stream, pair, tag)) else {
                continue;
            };
            if let Some((addr, unmapped)) = self.arenas[ai].place(size, &self.pages) {
                if unmapped == 0 {
                    self.note_allocated(addr, size, bytes, ai);
                    return Some(addr);
                }
                self.arenas[ai].insert_free(addr, addr + size);
            }
        }
        None
    }

    /// `createOrIncrefPool` (`Note [Private pools in paged]`).
    ///
    /// # Errors
    /// As [`crate::DeviceAllocator::create_or_incref_pool`].
    pub(crate) fn create_or_incref_pool(&mut self, id: MempoolId) -> Result<(), AllocError> {
        self.private.create_or_incref(id).map(|_| ())
    }

    /// `beginAllocateToPool` (`Note [Private pools in paged]`).
    ///
    /// # Errors
    /// As [`crate::DeviceAllocator::begin_allocate_to_pool`].
    pub(crate) fn begin_allocate_to_pool(
        &mut self,
        id: MempoolId,
        filter: StreamFilter,
    ) -> Result<(), AllocError> {
        self.private.begin(id, filter).map(|_| ())
    }

    /// `endAllocateToPool`.
    ///
    /// # Errors
    /// As [`crate::DeviceAllocator::end_allocate_to_pool`].
    pub(crate) fn end_allocate_to_pool(&mut self, id: MempoolId) -> Result<(), AllocError> {
        self.private.end(id)
    }

    /// `releasePool`: one use less; at none, with no block of the pool left and no pool being
    /// allocated to, its free units are unmapped now (`Note [Private pools in paged]`, 4).
    ///
    /// # Errors
    /// As [`crate::DeviceAllocator::release_pool`]; [`AllocError::Backend`] when an unmap or
    /// a stream synchronization fails.
    pub(crate) fn release_pool<B: MemoryBackend<Fence = E>>(
        &mut self,
        backend: &B,
        id: MempoolId,
    ) -> Result<(), AllocError> {
        let left = self.private.release(id)?;
        let pair = self.pool_pair(id, "release it: no such pool")?;
        if left == 0 && !self.private.capturing() && !self.pool_has_blocks(pair) {
            let arenas = self.pool_arenas(pair);
            self.reclaim_in(backend, u64::MAX, (0, 0), &arenas)?;
        }
        Ok(())
    }

    /// `getPoolUseCount`: 0 for an unknown pool.
    pub(crate) fn pool_use_count(&self, id: MempoolId) -> u32 {
        self.private.use_count(id)
    }

    /// `checkPoolLiveAllocations`: whether the live blocks of pool `id` are exactly
    /// `expected`.
    ///
    /// # Errors
    /// [`AllocError::NoSuchPool`] for an unknown pool.
    pub(crate) fn check_pool_live_allocations(
        &self,
        id: MempoolId,
        expected: &HashSet<DevicePtr>,
    ) -> Result<bool, AllocError> {
        let pair = self.pool_pair(id, "check its live allocations: no such pool")?;
        let live = self
            .live
            .iter()
            .filter(|(_, l)| self.arenas[l.arena].pair == pair)
            .map(|(&a, _)| a);
        Ok(live_allocations_match(live, expected))
    }

    /// `emptyCache(mempool_id)`: unmaps the free units of pool `id` whatever its use count,
    /// and forgets it when it is freeable and left with nothing mapped. Does nothing while a
    /// pool is being allocated to (`Note [Private pools in paged]`, 3).
    ///
    /// # Errors
    /// [`AllocError::NoSuchPool`] for an unknown pool; [`AllocError::Backend`] when a backend
    /// call fails.
    pub(crate) fn empty_pool_cache<B: MemoryBackend<Fence = E>>(
        &mut self,
        backend: &B,
        id: MempoolId,
    ) -> Result<(), AllocError> {
        let pair = self.pool_pair(id, "empty its cache: no such pool")?;
        if self.private.capturing() {
            return Ok(());
        }
        self.sync_pending(backend)?;
        let arenas = self.pool_arenas(pair);
        self.reclaim_in(backend, u64::MAX, (0, 0), &arenas)?;
        self.forget_if_empty(backend, pair)
    }

    /// Forgets pool pair `pair` when its use count is zero and nothing of it is mapped: its
    /// reservations are released and its arena slots retired for reuse.
    ///
    /// # Errors
    /// [`AllocError::Backend`] when releasing a reservation fails (the pool is forgotten
    /// anyway; only that address range stays reserved).
    pub(super) fn forget_if_empty<B: MemoryBackend<Fence = E>>(
        &mut self,
        backend: &B,
        pair: u16,
    ) -> Result<(), AllocError> {
        if self.private.get_mut(pair).is_none_or(|p| p.use_count != 0) || self.pool_has_blocks(pair)
        {
            // In use, or holding blocks (of a sleeping tag, whose pages are unmapped).
            return Ok(());
        }
        let arenas = self.pool_arenas(pair);
        if arenas
            .iter()
            .any(|&i| self.tags.is_asleep(self.arenas[i].tag))
        {
            return Ok(()); // its units are to be mapped back at wake
        }
        let mapped = arenas.iter().any(|&i| {
            self.arenas[i]
                .reservations
                .iter()
                .any(|&(b, n)| self.pages.unmapped_bytes(b, b + n) < n)
        });
        if mapped {
            return Ok(());
        }
        // A release that fails leaks address space only: the arenas are retired anyway, so
        // nothing is placed in a range that may be gone; the first failure is reported.
        let mut failed = None;
        for i in arenas {
            let stream = self.arenas[i].stream;
            for &(base, bytes) in &self.arenas[i].reservations {
                // SAFETY: 1. nothing inside the reservation is mapped: checked above from the
                // page map, which every map and unmap call updates.
                if let Err(e) = unsafe { vm(backend).release(DevicePtr(base), bytes as usize) } {
                    failed.get_or_insert(backend_err(stream)(e));
                }
            }
            let tag = self.arenas[i].tag;
            self.arena_of.remove(&(stream, pair, tag));
            self.arenas[i] = Arena::new(StreamId::DEFAULT, RETIRED, 0);
            self.retired.push(i);
        }
        // None: paged refuses pools with an allocator of their own.
        drop(self.private.forget(pair));
        failed.map_or(Ok(()), Err)
    }
}
