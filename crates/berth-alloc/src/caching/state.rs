//! The per-device allocator state and its block operations (PyTorch's `DeviceCachingAllocator`
//! internals: `alloc_found_block`, `free`, `free_block`, `try_merge_blocks`, `release_block`).
//!
//! Everything here runs with the state lock held; nothing here calls backend `malloc`.

use std::collections::{BTreeMap, VecDeque};

use super::block::{Block, Slab, NIL};
use super::policy::{MIN_BLOCK_SIZE, SMALL_SIZE};
use super::pool::BlockPool;
use super::private_pools::{PrivatePools, SourceCalls};
use super::sorted::SizeKey;
use crate::addr_map::AddrMap;
use crate::backend::{DevicePtr, MemoryBackend, StreamId};
use crate::config::AllocatorConfig;
use crate::error::{AllocError, BackendError};
use crate::snapshot::{TraceAction, TraceEntry, TraceRing};
use crate::stats::MemoryStats;

/// A segment obtained with `malloc` (not expandable).
#[derive(Debug, Clone, Copy)]
pub(crate) struct SegmentMeta {
    pub size: u64,
    pub stream: StreamId,
    pub small: bool,
    /// The pool it belongs to ([`super::private_pools::pool_index`]).
    pub pool: u16,
}

/// An expandable segment: one reserved virtual range mapped page by page.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ExpandableSegment {
    pub base: u64,
    pub size: u64,
    pub page: u64,
    pub stream: StreamId,
    pub small: bool,
    /// The pool it belongs to ([`super::private_pools::pool_index`]).
    pub pool: u16,
}

pub(crate) struct State<E> {
    pub cfg: AllocatorConfig,
    /// `max_split_size` in bytes (`u64::MAX` = unlimited).
    pub max_split: u64,
    pub blocks: Slab,
    /// `[large, small]` of the general pool, then of each private pool (`Note [Private
    /// pools]`).
    pub pools: Vec<BlockPool>,
    /// The private pools' bookkeeping.
    pub private: PrivatePools,
    /// Allocated blocks by address (PyTorch's `allocated_blocks`).
    pub allocated: AddrMap<u32>,
    pub stats: MemoryStats,
    /// Bytes held from the backend (PyTorch's `total_allocated_memory`).
    pub total_reserved: u64,
    /// Bytes being asked of the backend right now with the lock released.
    pub inflight: u64,
    /// The memory-fraction cap in bytes (PyTorch's `allowed_memory_maximum` when `set_fraction`).
    pub allowed: Option<u64>,
    /// Pending cross-stream frees, per stream, oldest first.
    pub events: BTreeMap<StreamId, VecDeque<(E, u32)>>,
    /// Blocks freed with cross-stream uses while a pool was being allocated to: their events
    /// are recorded once none is (`Note [Private pools]`; PyTorch's
    /// `needs_events_deferred_until_no_capture`).
    pub events_deferred: Vec<u32>,
    pub segments: BTreeMap<u64, SegmentMeta>,
    pub expandable: Vec<Option<ExpandableSegment>>,
    pub history: Option<TraceRing>,
    pub device_total: Option<u64>,
    pub device: i32,
    /// Calls on pools' own allocators to make once the lock is dropped (`Shared::unlock`).
    pub source_calls: SourceCalls,
}

/// Wraps a backend error with the stream of the operation.
pub(crate) fn backend_err(stream: StreamId) -> impl FnOnce(BackendError) -> AllocError {
    move |source| AllocError::Backend { stream, source }
}

impl<E> State<E> {
    pub fn new(cfg: AllocatorConfig) -> Self {
        crate::inert_settings::warn_inert_settings(&cfg);
        // Inside expandable segments the oversize rule does not apply (`inert_settings.rs`).
        let max_split = match cfg.max_split_size {
            Some(m) if !cfg.expandable_segments => m,
            _ => u64::MAX,
        };
        State {
            stats: MemoryStats::new(cfg.max_split_size),
            cfg,
            max_split,
            blocks: Slab::default(),
            pools: vec![BlockPool::default(), BlockPool::default()],
            private: PrivatePools::default(),
            allocated: AddrMap::default(),
            total_reserved: 0,
            inflight: 0,
            allowed: None,
            events: BTreeMap::new(),
            events_deferred: Vec::new(),
            segments: BTreeMap::new(),
            expandable: Vec::new(),
            history: None,
            device_total: None,
            device: 0,
            source_calls: SourceCalls::default(),
        }
    }

    /// GC is active only with a memory fraction and a threshold (PyTorch).
    pub fn gc_enabled(&self) -> bool {
        self.allowed.is_some() && self.cfg.garbage_collection_threshold > 0.0
    }

    #[inline]
    pub fn trace(&mut self, action: TraceAction, addr: u64, size: u64, stream: StreamId) {
        if let Some(ring) = &mut self.history {
            let time_us = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_micros() as i64);
            ring.push(TraceEntry {
                action,
                addr,
                size,
                stream,
                time_us,
            });
        }
    }

    /// Takes a block out of its pool, if it is there.
    #[inline]
    pub fn pool_remove(&mut self, i: u32) -> bool {
        let b = &self.blocks[i];
        self.pools[b.pool as usize].remove(b, i)
    }

    #[inline]
    pub fn pool_insert(&mut self, i: u32) {
        let b = &mut self.blocks[i];
        self.pools[b.pool as usize].insert(b, i);
    }

    /// `get_free_block`: best fit by (stream, size, address) with the oversize rules. The
    /// block stays in its pool: [`State::alloc_found_block`] takes it out, given its key.
    pub fn get_free_block(&mut self, stream: StreamId, size: u64, pool: u16) -> Option<SizeKey> {
        let gc = self.gc_enabled();
        let pool = &mut self.pools[pool as usize];
        if gc {
            pool.free_calls += 1;
        }
        let mut key = pool.lower_bound(stream, size)?;
        if self.blocks[key.3].is_expandable() {
            // Rank expandable blocks by the size they could grow to (their size plus an
            // unmapped range right after them), as PyTorch does.
            let reach = |blocks: &Slab, i: u32| {
                let b = &blocks[i];
                b.size
                    + if b.next != NIL && !blocks[b.next].mapped {
                        blocks[b.next].size
                    } else {
                        0
                    }
            };
            let mut at = key;
            while self.blocks[key.3].is_expandable() {
                match pool.blocks.first_after(&at) {
                    Some(next)
                        if next.0 == stream.0
                            && reach(&self.blocks, next.3) < reach(&self.blocks, key.3) =>
                    {
                        key = next;
                        at = next;
                    }
                    _ => break,
                }
            }
        }
        let found = key.1;
        // An oversize block is never cut for a normal request...
        if size < self.max_split && found >= self.max_split {
            return None;
        }
        // ...and serves only requests within `max_non_split_rounding_size` of its size.
        if size >= self.max_split
            && found >= size.saturating_add(self.cfg.max_non_split_rounding_size)
        {
            return None;
        }
        Some(key)
    }

    fn should_split(&self, i: u32, size: u64) -> bool {
        let b = &self.blocks[i];
        if self.private.no_split(b.pool / 2) {
            return false;
        }
        let remaining = b.size - size;
        if b.small || self.cfg.expandable_segments {
            remaining >= MIN_BLOCK_SIZE
        } else {
            size < self.max_split && remaining > SMALL_SIZE
        }
    }

    /// `alloc_found_block`: hands out block `i` for a rounded `size`, splitting off the
    /// remainder when PyTorch would. `pooled` is the block's pool key when it is still in its
    /// pool (found by [`State::get_free_block`]); the remainder then takes its place there.
    pub fn alloc_found_block(
        &mut self,
        mut i: u32,
        size: u64,
        requested: u64,
        pooled: Option<SizeKey>,
    ) -> u64 {
        let (small, pool, already_split, exp) = {
            let b = &self.blocks[i];
            (b.small, b.pool, b.is_split(), b.is_expandable())
        };
        if self.should_split(i, size) {
            let rem = i;
            let (ptr, stream, prev) = {
                let r = &self.blocks[rem];
                (r.ptr, r.stream, r.prev)
            };
            let mut front = Block::new(ptr, size, stream, pool);
            front.expandable = self.blocks[rem].expandable;
            front.prev = prev;
            front.next = rem;
            let f = self.blocks.insert(front);
            if prev != NIL {
                self.blocks[prev].next = f;
            }
            {
                let r = &mut self.blocks[rem];
                r.prev = f;
                r.ptr += size;
                r.size -= size;
            }
            match pooled {
                Some(old) => {
                    let r = &mut self.blocks[rem];
                    self.pools[pool as usize].insert_replacing(&old, r, rem);
                }
                None => self.pool_insert(rem),
            }
            if !exp {
                if already_split {
                    self.stats.inactive_split_bytes.decrease(small, size as i64);
                } else {
                    let rsize = self.blocks[rem].size as i64;
                    self.stats.inactive_split_bytes.increase(small, rsize);
                    self.stats.inactive_split.increase(small, 1);
                }
            }
            i = f;
        } else {
            if let Some(old) = pooled {
                self.pools[pool as usize].blocks.remove(&old);
            }
            if already_split && !exp {
                let bsize = self.blocks[i].size as i64;
                self.stats.inactive_split_bytes.decrease(small, bsize);
                self.stats.inactive_split.decrease(small, 1);
            }
        }
        let b = &mut self.blocks[i];
        b.allocated = true;
        b.requested = requested;
        let (ptr, bsize, stream) = (b.ptr, b.size, b.stream);
        self.allocated.insert(ptr, i);
        let s = &mut self.stats;
        s.allocation.increase(small, 1);
        s.allocated_bytes.increase(small, bsize as i64);
        s.active.increase(small, 1);
        s.active_bytes.increase(small, bsize as i64);
        s.requested_bytes.increase(small, requested as i64);
        if bsize >= self.max_split {
            s.oversize_allocations.increase(1);
        }
        self.trace(TraceAction::Alloc, ptr, requested, stream);
        ptr
    }

    /// `try_merge_blocks`: merges free neighbour `src` into `dst`; returns the bytes subsumed.
    pub fn try_merge(&mut self, dst: u32, src: u32) -> u64 {
        let (subsumed, pooled) = self.try_merge_deferred(dst, src);
        if let Some(key) = pooled {
            self.pools[self.blocks[dst].pool as usize]
                .blocks
                .remove(&key);
        }
        subsumed
    }

    /// [`State::try_merge`], except that a merged mapped `src` is left in its pool: its key is
    /// returned for the caller to remove (or to replace with `dst`'s).
    #[inline]
    fn try_merge_deferred(&mut self, dst: u32, src: u32) -> (u64, Option<SizeKey>) {
        if src == NIL {
            return (0, None);
        }
        let pooled = {
            let s = &self.blocks[src];
            if !s.is_reusable() || s.mapped != self.blocks[dst].mapped {
                return (0, None);
            }
            if s.mapped {
                Some(BlockPool::size_key(s, src))
            } else {
                self.pool_remove(src);
                None
            }
        };
        let s = self.blocks.remove(src);
        if self.blocks[dst].prev == src {
            let d = &mut self.blocks[dst];
            d.ptr = s.ptr;
            d.prev = s.prev;
            if s.prev != NIL {
                self.blocks[s.prev].next = dst;
            }
        } else {
            self.blocks[dst].next = s.next;
            if s.next != NIL {
                self.blocks[s.next].prev = dst;
            }
        }
        self.blocks[dst].size += s.size;
        (s.size, pooled)
    }

    /// `free_block`: the block becomes reusable; merge with free neighbours and return it to its
    /// pool.
    pub fn free_block(&mut self, i: u32) {
        let (ptr, size, requested, stream, small, pool, exp, prev, next) = {
            let b = &self.blocks[i];
            debug_assert!(b.is_reusable());
            (
                b.ptr,
                b.size,
                b.requested,
                b.stream,
                b.small,
                b.pool,
                b.is_expandable(),
                b.prev,
                b.next,
            )
        };
        self.trace(TraceAction::FreeCompleted, ptr, requested, stream);
        let mut net_blocks = 0i64;
        let mut net_bytes = 0i64;
        let mut replaced = None;
        for candidate in [prev, next] {
            let (subsumed, pooled) = self.try_merge_deferred(i, candidate);
            if subsumed > 0 {
                net_blocks -= 1;
                net_bytes -= subsumed as i64;
            }
            // The merged block takes the first merged neighbour's place in the pool.
            if let Some(key) = pooled {
                if replaced.is_none() {
                    replaced = Some(key);
                } else {
                    self.pools[pool as usize].blocks.remove(&key);
                }
            }
        }
        match replaced {
            Some(old) => {
                let b = &mut self.blocks[i];
                self.pools[pool as usize].insert_replacing(&old, b, i);
            }
            None => self.pool_insert(i),
        }
        if self.blocks[i].is_split() {
            net_blocks += 1;
            net_bytes += self.blocks[i].size as i64;
        }
        let s = &mut self.stats;
        if !exp {
            if net_blocks > 0 {
                s.inactive_split.increase(small, net_blocks);
            } else if net_blocks < 0 {
                s.inactive_split.decrease(small, -net_blocks);
            }
            if net_bytes > 0 {
                s.inactive_split_bytes.increase(small, net_bytes);
            } else if net_bytes < 0 {
                s.inactive_split_bytes.decrease(small, -net_bytes);
            }
        }
        s.active.decrease(small, 1);
        s.active_bytes.decrease(small, size as i64);
        s.requested_bytes.decrease(small, requested as i64);
    }

    /// Registers a new `malloc`'d segment and returns its single (unpooled) block.
    pub fn new_segment(&mut self, ptr: u64, size: u64, stream: StreamId, pool: u16) -> u32 {
        let i = self.blocks.insert(Block::new(ptr, size, stream, pool));
        let small = self.blocks[i].small;
        self.total_reserved += size;
        self.stats.segment.increase(small, 1);
        self.stats.reserved_bytes.increase(small, size as i64);
        if size >= self.max_split {
            self.stats.oversize_segments.increase(1);
        }
        self.stats.num_device_alloc += 1;
        self.segments.insert(
            ptr,
            SegmentMeta {
                size,
                stream,
                small,
                pool,
            },
        );
        self.count_segment(pool, true);
        self.trace(TraceAction::SegmentAlloc, ptr, size, stream);
        i
    }

    /// `release_block`: returns an unsplit cached segment (in its pool) to the backend.
    pub fn release_block<B: MemoryBackend>(
        &mut self,
        backend: &B,
        i: u32,
    ) -> Result<(), AllocError> {
        let (ptr, size, stream, small, pool) = {
            let b = &self.blocks[i];
            debug_assert!(!b.is_split() && !b.is_expandable() && b.is_reusable());
            (b.ptr, b.size, b.stream, b.small, b.pool)
        };
        match self.private.source(pool / 2) {
            // Given back once the lock is dropped (`SourceCalls`).
            Some(source) => self.source_calls.free_later(source, ptr, size),
            // SAFETY: the segment came from `backend.malloc` with this size, is entirely free,
            // and has no pending events, so no queued work uses it.
            None => unsafe { backend.free(DevicePtr(ptr), size as usize, stream) }
                .map_err(backend_err(stream))?,
        }
        self.pool_remove(i);
        self.blocks.remove(i);
        self.stats.num_device_free += 1;
        self.trace(TraceAction::SegmentFree, ptr, size, stream);
        self.total_reserved -= size;
        self.stats.segment.decrease(small, 1);
        self.stats.reserved_bytes.decrease(small, size as i64);
        if size >= self.max_split {
            self.stats.oversize_segments.decrease(1);
        }
        self.segments.remove(&ptr);
        self.count_segment(pool, false);
        Ok(())
    }

    /// Counts a segment more (`added`) or less in the private pool owning pool index `pool`
    /// (nothing for the general pool).
    pub fn count_segment(&mut self, pool: u16, added: bool) {
        if let Some(p) = self.private.get_mut(pool / 2) {
            if added {
                p.segments += 1;
            } else {
                p.segments -= 1;
            }
        }
    }

    /// Makes room for the two block pools of private pool pair `pair` (new, or reusing a
    /// forgotten pair's empty slots).
    pub fn add_pool_pair(&mut self, pair: u16) {
        let need = usize::from(pair) * 2 + 2;
        if self.pools.len() < need {
            self.pools.resize_with(need, BlockPool::default);
        }
        debug_assert!(self.pools[need - 2].blocks.len() + self.pools[need - 1].blocks.len() == 0);
    }

    /// `release_blocks`: frees every unsplit cached segment of a pool and unmaps the free pages
    /// of its expandable segments.
    pub fn release_blocks<B: MemoryBackend>(
        &mut self,
        backend: &B,
        pool: u16,
    ) -> Result<(), AllocError> {
        let keys: Vec<_> = self.pools[pool as usize].blocks.iter().collect();
        let mut to_unmap = Vec::new();
        for k in keys {
            let b = &self.blocks[k.3];
            if b.is_expandable() {
                to_unmap.push(k);
            } else if !b.is_split() {
                self.release_block(backend, k.3)?;
            }
        }
        for k in to_unmap {
            // Unmapping only creates blocks next to allocated or unmapped ones, so every
            // gathered block is still free and pooled; check anyway.
            if !self.pools[pool as usize].blocks.contains(&k) {
                continue;
            }
            self.unmap_block(backend, k.3)?;
            let b = &self.blocks[k.3];
            if !b.is_split() {
                self.release_expandable_segment(backend, k.3)?;
            }
        }
        Ok(())
    }

    /// Frees the request of an allocated block: PyTorch's `free` (stats, then either
    /// free-complete now or wait for the events of the streams it was used on).
    pub fn free_requested<B: MemoryBackend<Fence = E>>(
        &mut self,
        backend: &B,
        i: u32,
    ) -> Result<(), AllocError> {
        let (ptr, size, requested, stream, small, uses) = {
            let b = &mut self.blocks[i];
            b.allocated = false;
            (
                b.ptr,
                b.size,
                b.requested,
                b.stream,
                b.small,
                !b.stream_uses.is_empty(),
            )
        };
        self.stats.allocation.decrease(small, 1);
        self.stats.allocated_bytes.decrease(small, size as i64);
        self.trace(TraceAction::FreeRequested, ptr, requested, stream);
        if size >= self.max_split {
            self.stats.oversize_allocations.decrease(1);
        }
        if uses && self.private.capturing() {
            self.events_deferred.push(i);
            Ok(())
        } else if uses {
            self.insert_events(backend, i)
        } else {
            self.free_block(i);
            Ok(())
        }
    }

    /// Classifies a pointer that is not allocated: a freed block start (double free) or foreign.
    pub fn classify_bad_pointer(&self, ptr: u64) -> AllocError {
        let in_segment = self
            .segments
            .range(..=ptr)
            .next_back()
            .is_some_and(|(&a, m)| ptr < a + m.size)
            || self
                .expandable
                .iter()
                .flatten()
                .any(|e| ptr >= e.base && ptr < e.base + e.size);
        if in_segment
            && self
                .blocks
                .iter()
                .any(|(_, b)| b.ptr == ptr && !b.allocated && b.mapped)
        {
            AllocError::DoubleFree {
                ptr: DevicePtr(ptr),
            }
        } else {
            AllocError::InvalidPointer {
                ptr: DevicePtr(ptr),
            }
        }
    }
}
