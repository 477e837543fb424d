//! The slow path of `malloc`: what happens when no cached block fits (PyTorch's `malloc` after
//! `get_free_block`, with `alloc_block`, `release_available_cached_blocks`,
//! `release_cached_blocks`, `garbage_collect_cached_blocks`), written out in one function.

use std::sync::Arc;

use crate::sync::SpinGuard;

use super::state::{backend_err, State};
use super::Shared;
use crate::backend::{MemoryBackend, StreamId};
use crate::error::AllocError;
use crate::error::BackendError;
use crate::snapshot::TraceAction;

/// One request on its way through the fallback.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Request {
    pub stream: StreamId,
    /// Rounded size in bytes.
    pub size: u64,
    /// Segment size asked of the backend.
    pub alloc_size: u64,
    /// The caller's size.
    pub requested: u64,
    /// The pool's index ([`super::pool::pool_index`]): general or a private pool's.
    pub pool: u16,
}

type Guard<'a, E> = SpinGuard<'a, State<E>>;

impl<B: MemoryBackend> Shared<B> {
    /// Steps after a failed pool search. Returns the block to hand out, or the OOM error.
    pub(crate) fn malloc_fallback<'a>(
        &'a self,
        mut st: Guard<'a, B::Fence>,
        r: Request,
    ) -> Result<(Guard<'a, B::Fence>, u32), AllocError> {
        // Step 1: garbage collection, only with a memory fraction and a threshold set.
        if st.gc_enabled() {
            st.garbage_collect(&self.backend)?;
        }
        // Step 2: a new segment (or newly mapped pages) from the backend.
        let (st2, found) = self.alloc_block(st, r, false)?;
        st = st2;
        if let Some(i) = found {
            return Ok((st, i));
        }
        // Step 3: with `max_split_size` set, release this stream's cached oversize blocks
        // (enough for the request) and ask again.
        if st.release_available_cached_blocks(&self.backend, r)? {
            let (st2, found) = self.alloc_block(st, r, false)?;
            st = st2;
            if let Some(i) = found {
                return Ok((st, i));
            }
        }
        // Step 4: wait for every pending cross-stream free, release every unsplit cached block
        // of every stream, and ask again (counts `num_alloc_retries`). As in PyTorch, the pool
        // is not searched again (issue #189504).
        // Not while a private pool is being allocated to (a graph capture may be under way,
        // and freeing memory is illegal during capture: `Note [Private pools]`).
        if !st.private.capturing() {
            st.release_cached_blocks(&self.backend)?;
            let (st2, found) = self.alloc_block(st, r, true)?;
            st = st2;
            if let Some(i) = found {
                return Ok((st, i));
            }
        }
        // Step 5: a request of the general pool borrows a cached free block of a pool that
        // lends on out-of-memory (`torch.cuda.MemPool(use_on_oom=True)`; PyTorch tries them
        // in turn with `get_free_block`). The block stays its pool's.
        if r.pool / 2 == 0 {
            let small = r.pool % 2 == 1;
            for pair in st.private.use_on_oom_pairs() {
                let pool = super::private_pools::pool_index(pair, small);
                if let Some(key) = st.get_free_block(r.stream, r.size, pool) {
                    st.pool_remove(key.3);
                    return Ok((st, key.3));
                }
            }
        }
        // Step 6: out of memory.
        let e = self.out_of_memory(&mut st, r);
        self.unlock(st);
        Err(e)
    }

    /// `alloc_block`: a new segment of `alloc_size` bytes (or mapped pages with expandable
    /// segments). The state lock is released around backend `malloc`; the bytes are counted as
    /// in flight meanwhile so the memory-fraction check stays exact.
    fn alloc_block<'a>(
        &'a self,
        mut st: Guard<'a, B::Fence>,
        r: Request,
        is_retry: bool,
    ) -> Result<(Guard<'a, B::Fence>, Option<u32>), AllocError> {
        if is_retry {
            st.stats.num_alloc_retries += 1;
        }
        // Segments released for this request go back to their pools' allocators first.
        if !st.source_calls.is_empty() {
            self.unlock(st);
            st = self.lock();
        }
        if let Some(allowed) = st.allowed {
            if st.total_reserved + st.inflight + r.alloc_size > allowed {
                return Ok((st, None));
            }
        }
        // A pool with an allocator of its own takes its segments from it, never expandable
        // (`Note [Pools with their own allocator]`).
        let source = st.private.source(r.pool / 2).cloned();
        if source.is_none() && st.cfg.expandable_segments {
            let found =
                st.try_allocate_expandable_block(&self.backend, r.stream, r.pool, r.size)?;
            return Ok((st, found));
        }
        st.inflight += r.alloc_size;
        drop(st);
        let result = match &source {
            Some(source) => source
                .alloc(r.alloc_size as usize)
                .ok_or(BackendError::OutOfMemory {
                    op: "MemPool allocator",
                    bytes: r.alloc_size,
                }),
            None => self.backend.malloc(r.alloc_size as usize, r.stream),
        };
        let mut st = self.lock();
        st.inflight -= r.alloc_size;
        // The pool may have been forgotten, and its slot reused, while the lock was dropped:
        // memory from its allocator goes back there, and the request finds no block.
        if let (Some(source), Ok(ptr)) = (&source, &result) {
            let now = st.private.source(r.pool / 2);
            if !now.is_some_and(|s| Arc::ptr_eq(s, source)) {
                st.source_calls.free_later(source, ptr.0, r.alloc_size);
                return Ok((st, None));
            }
        }
        match result {
            Ok(ptr) => {
                let i = st.new_segment(ptr.0, r.alloc_size, r.stream, r.pool);
                Ok((st, Some(i)))
            }
            Err(e) if e.is_out_of_memory() => Ok((st, None)),
            Err(e) => Err(backend_err(r.stream)(e)),
        }
    }

    /// Builds the OOM error (PyTorch's message content), counts it and traces it.
    fn out_of_memory(&self, st: &mut State<B::Fence>, r: Request) -> AllocError {
        let info = self.backend.mem_info().unwrap_or_default();
        st.stats.num_ooms += 1;
        st.trace(TraceAction::Oom, info.free_bytes, r.size, r.stream);
        let allocated = st.stats.allocated_bytes.all().current.max(0) as u64;
        let reserved = st.total_reserved;
        match st.allowed {
            Some(cap) if r.alloc_size > cap => AllocError::CapExceeded {
                requested: r.alloc_size,
                device: st.device,
                device_total: info.total_bytes,
                device_free: info.free_bytes,
                cap,
            },
            allowed => AllocError::OutOfMemory {
                requested: r.alloc_size,
                requested_by_caller: r.requested,
                device: st.device,
                device_total: info.total_bytes,
                device_free: info.free_bytes,
                allocated,
                reserved_unallocated: reserved.saturating_sub(allocated),
                allowed,
                hint: if st.cfg.expandable_segments {
                    crate::error::OomHint::MaxSplitSize
                } else {
                    crate::error::OomHint::ExpandableSegments
                },
            },
        }
    }
}

impl<E> State<E> {
    /// `release_available_cached_blocks`: with `max_split_size` set, frees the smallest cached
    /// oversize block of this stream that covers `max(request, max_split_size)`, or else oversize
    /// blocks from the largest down until that much is freed. Returns whether enough was freed.
    fn release_available_cached_blocks<B: MemoryBackend>(
        &mut self,
        backend: &B,
        r: Request,
    ) -> Result<bool, AllocError> {
        if self.max_split == u64::MAX {
            return Ok(false);
        }
        let target = r.size.max(self.max_split);
        let key = (r.stream.0, target, 0u64, 0u32);
        let pool = r.pool as usize;
        let found = self.pools[pool].blocks.first_from(&key);
        match found {
            Some(k)
                if k.0 == r.stream.0
                    && !self.blocks[k.3].is_expandable()
                    && !self.blocks[k.3].is_split() =>
            {
                self.release_block(backend, k.3)?;
                Ok(true)
            }
            _ => {
                let mut released = 0u64;
                let mut upper = key;
                while released < target {
                    let Some(k) = self.pools[pool].blocks.last_before(&upper) else {
                        break;
                    };
                    if k.1 < self.max_split || k.0 != r.stream.0 {
                        break;
                    }
                    upper = k;
                    let b = &self.blocks[k.3];
                    if !b.is_expandable() && !b.is_split() {
                        self.release_block(backend, k.3)?;
                        released += k.1;
                    }
                }
                Ok(released >= target)
            }
        }
    }

    /// `garbage_collect_cached_blocks`: when reserved exceeds `threshold × allowed`, frees
    /// unsplit cached large-pool blocks whose age is at least the mean age, repeatedly, until
    /// the excess is reclaimed. Waits on no event.
    fn garbage_collect<B: MemoryBackend>(&mut self, backend: &B) -> Result<(), AllocError> {
        let Some(allowed) = self.allowed else {
            return Ok(());
        };
        let threshold = (self.cfg.garbage_collection_threshold * allowed as f64) as u64;
        if self.total_reserved <= threshold {
            return Ok(());
        }
        let target = self.total_reserved - threshold;
        let calls = self.pools[0].free_calls;
        let age = |b: &super::block::Block| calls - b.gc_base;
        let mut total_age = 0u64;
        let mut count = 0u64;
        for k in self.pools[0].blocks.iter() {
            let b = &self.blocks[k.3];
            if !b.is_split() {
                total_age += age(b);
                count += 1;
            }
        }
        let mut reclaimed = 0u64;
        let mut freed_one = true;
        while reclaimed < target && freed_one && count > 0 {
            let threshold_age = total_age as f64 / count as f64;
            freed_one = false;
            let keys: Vec<_> = self.pools[0].blocks.iter().collect();
            for k in keys {
                let b = &self.blocks[k.3];
                if !b.is_split() && !b.is_expandable() && age(b) as f64 >= threshold_age {
                    let a = age(b);
                    self.release_block(backend, k.3)?;
                    freed_one = true;
                    reclaimed += k.1;
                    total_age -= a;
                    count -= 1;
                }
            }
        }
        Ok(())
    }
}
