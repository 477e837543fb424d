//! Expandable segments over [`crate::backend::VirtualMemoryBackend`] (PyTorch's
//! `Note [Expandable Segments]`: `find_expandable_block`, `try_allocate_expandable_block`,
//! `map_block`, `unmap_block`, `release_expandable_segment`).
//!
//! Each (stream, pool) gets a virtual range of 9/8 × device memory, mapped in pages of 2 MiB
//! (small pool) or 20 MiB (large pool) at the lowest free addresses. Mapping runs with the state
//! lock held, as in PyTorch; it is the slow path.
//!
//! Each page is its own mapping (one [`VirtualMemoryBackend::map`] call through
//! [`VirtualMemoryBackend::map_pages`], so one physical handle of the page's size on CUDA, as
//! PyTorch's `ExpandableSegment::map` creates one handle per segment page): `unmap_block` later unmaps any run of whole pages, which the backend accepts
//! only as a union of whole mappings.

use super::block::{Block, NIL};
use super::policy::{LARGE_BUFFER, SMALL_BUFFER};
use super::state::{backend_err, ExpandableSegment, State};
use crate::backend::{DevicePtr, MemoryBackend, StreamId, VirtualMemoryBackend};
use crate::error::AllocError;
use crate::snapshot::TraceAction;

fn vm_of<B: MemoryBackend>(backend: &B) -> Result<&dyn VirtualMemoryBackend, AllocError> {
    backend.as_virtual().ok_or(AllocError::Unsupported {
        feature: "expandable_segments",
        needs: "a backend with virtual-memory support (VirtualMemoryBackend)",
    })
}

impl<E> State<E> {
    /// `allocatable` of PyTorch: a free block with nothing pending.
    fn allocatable(&self, i: u32) -> bool {
        i != NIL && self.blocks[i].is_reusable()
    }

    fn has_address_space(&self, mut i: u32, size: u64) -> bool {
        let mut bytes = 0;
        while bytes < size && self.allocatable(i) {
            bytes += self.blocks[i].size;
            i = self.blocks[i].next;
        }
        bytes >= size
    }

    /// `find_expandable_block`: the lowest unmapped range of this stream with room for `size`
    /// bytes (starting at a free mapped block just before it when there is one), or a new
    /// segment.
    fn find_expandable_block<B: MemoryBackend>(
        &mut self,
        backend: &B,
        stream: StreamId,
        pool: u16,
        size: u64,
    ) -> Result<Option<u32>, AllocError> {
        let small = pool & 1 == 1;
        let candidates: Vec<u32> = self.pools[pool as usize]
            .unmapped
            .range((stream.0, 0, 0)..)
            .take_while(|k| k.0 == stream.0)
            .map(|k| k.2)
            .collect();
        for mut c in candidates {
            let prev = self.blocks[c].prev;
            if self.allocatable(prev) {
                c = prev;
            }
            if self.has_address_space(c, size) {
                return Ok(Some(c));
            }
        }
        let vm = vm_of(backend)?;
        let total = match self.device_total {
            Some(t) => t,
            None => {
                let t = backend.mem_info().map_err(backend_err(stream))?.total_bytes;
                self.device_total = Some(t);
                t
            }
        };
        let page = if small { SMALL_BUFFER } else { LARGE_BUFFER };
        let reserve = (total + total / 8).div_ceil(page).max(1) * page;
        // No address range left for this stream's reservation is not device memory (which may
        // be all free), so it is no out-of-memory: it was reported as one, "64 PiB free"
        // (newcomer defect 10). It is the backend's error, as `paged` reports it, and as
        // PyTorch's `cuMemAddressReserve` failure is a hard error.
        let base = vm.reserve(reserve as usize).map_err(backend_err(stream))?.0;
        let id = self.expandable.len() as u32;
        self.expandable.push(Some(ExpandableSegment {
            base,
            size: reserve,
            page,
            stream,
            small,
            pool,
        }));
        self.count_segment(pool, true);
        let mut b = Block::new(base, reserve, stream, pool);
        b.mapped = false;
        b.expandable = id;
        let i = self.blocks.insert(b);
        self.pool_insert(i);
        Ok(Some(i))
    }

    /// `try_allocate_expandable_block`: maps pages until a free mapped block of at least `size`
    /// bytes exists; returns it out of its pool.
    pub fn try_allocate_expandable_block<B: MemoryBackend>(
        &mut self,
        backend: &B,
        stream: StreamId,
        pool: u16,
        size: u64,
    ) -> Result<Option<u32>, AllocError> {
        let Some(mut c) = self.find_expandable_block(backend, stream, pool, size)? else {
            return Ok(None);
        };
        if !self.blocks[c].mapped {
            let n = self.blocks[c].size.min(size);
            if !self.map_block(backend, c, n)? {
                return Ok(None);
            }
        }
        while self.blocks[c].size < size {
            let remaining = size - self.blocks[c].size;
            let next = self.blocks[c].next;
            let n = remaining.min(self.blocks[next].size);
            if !self.map_block(backend, next, n)? {
                return Ok(None);
            }
            // `next` absorbed `c` when it merged with its free neighbour.
            c = next;
        }
        self.pool_remove(c);
        Ok(Some(c))
    }

    /// `map_block`: maps the pages covering the first `size` bytes of unmapped range `i`.
    /// Returns `false` when the backend is out of memory.
    fn map_block<B: MemoryBackend>(
        &mut self,
        backend: &B,
        i: u32,
        size: u64,
    ) -> Result<bool, AllocError> {
        let (ptr, bsize, stream, small, pool, es_id) = {
            let b = &self.blocks[i];
            debug_assert!(!b.mapped && size <= b.size);
            (b.ptr, b.size, b.stream, b.small, b.pool, b.expandable)
        };
        let es = self.expandable[es_id as usize].expect("live expandable segment");
        let begin = (ptr - es.base) / es.page;
        let end = (ptr + size - es.base).div_ceil(es.page);
        if begin >= end {
            return Ok(false);
        }
        let map_ptr = es.base + begin * es.page;
        let map_bytes = (end - begin) * es.page;
        debug_assert_eq!(map_ptr, ptr);
        let vm = vm_of(backend)?;
        // One call for the run of pages, each still its own mapping (the simulator records the
        // run in one entry: newcomer defect 4).
        if let Err(e) = vm.map_pages(
            DevicePtr(map_ptr),
            es.page as usize,
            (end - begin) as usize,
            stream,
        ) {
            return match e {
                e if e.is_out_of_memory() => Ok(false),
                e => Err(backend_err(stream)(e)),
            };
        }
        self.pool_remove(i);
        self.blocks[i].mapped = true;
        if map_bytes < bsize {
            let mut rest = Block::new(ptr + map_bytes, bsize - map_bytes, stream, pool);
            rest.mapped = false;
            rest.expandable = es_id;
            rest.prev = i;
            rest.next = self.blocks[i].next;
            let r = self.blocks.insert(rest);
            let after = self.blocks[i].next;
            if after != NIL {
                self.blocks[after].prev = r;
            }
            self.blocks[i].next = r;
            self.blocks[i].size = map_bytes;
            self.pool_insert(r);
        }
        let (prev, next) = (self.blocks[i].prev, self.blocks[i].next);
        self.try_merge(i, prev);
        self.try_merge(i, next);
        self.pool_insert(i);
        self.total_reserved += map_bytes;
        self.stats.reserved_bytes.increase(small, map_bytes as i64);
        self.stats.num_device_alloc += 1;
        self.trace(TraceAction::SegmentMap, map_ptr, map_bytes, stream);
        Ok(true)
    }

    /// `unmap_block`: unmaps every page lying entirely inside free mapped block `i` (in its
    /// pool), after waiting for the segment's stream.
    pub fn unmap_block<B: MemoryBackend>(&mut self, backend: &B, i: u32) -> Result<(), AllocError> {
        let (ptr, size, stream, small, pool, es_id) = {
            let b = &self.blocks[i];
            (b.ptr, b.size, b.stream, b.small, b.pool, b.expandable)
        };
        let es = self.expandable[es_id as usize].expect("live expandable segment");
        let begin = (ptr - es.base).div_ceil(es.page);
        let end = (ptr + size - es.base) / es.page;
        if begin >= end {
            return Ok(());
        }
        let un_ptr = es.base + begin * es.page;
        let un_bytes = (end - begin) * es.page;
        // `cuMemUnmap` does not synchronize: wait for the segment's stream first.
        let event = backend.record_fence(stream).map_err(backend_err(stream))?;
        backend.sync_fence(&event).map_err(backend_err(stream))?;
        // SAFETY: the pages lie inside a free block with no pending events, were mapped by
        // `map_block`, and the stream's work has completed.
        unsafe { vm_of(backend)?.unmap(DevicePtr(un_ptr), un_bytes as usize, stream) }
            .map_err(backend_err(stream))?;
        self.pool_remove(i);
        let before = un_ptr - ptr;
        if before > 0 {
            let mut b = Block::new(ptr, before, stream, pool);
            b.expandable = es_id;
            b.prev = self.blocks[i].prev;
            b.next = i;
            let n = self.blocks.insert(b);
            let p = self.blocks[i].prev;
            if p != NIL {
                self.blocks[p].next = n;
            }
            self.blocks[i].prev = n;
            self.pool_insert(n);
        }
        let after = size - before - un_bytes;
        if after > 0 {
            let mut b = Block::new(un_ptr + un_bytes, after, stream, pool);
            b.expandable = es_id;
            b.prev = i;
            b.next = self.blocks[i].next;
            let n = self.blocks.insert(b);
            let nx = self.blocks[i].next;
            if nx != NIL {
                self.blocks[nx].prev = n;
            }
            self.blocks[i].next = n;
            self.pool_insert(n);
        }
        {
            let b = &mut self.blocks[i];
            b.ptr = un_ptr;
            b.size = un_bytes;
            b.mapped = false;
        }
        let (prev, next) = (self.blocks[i].prev, self.blocks[i].next);
        self.try_merge(i, prev);
        self.try_merge(i, next);
        self.pool_insert(i);
        self.total_reserved -= un_bytes;
        self.stats.reserved_bytes.decrease(small, un_bytes as i64);
        self.stats.num_device_free += 1;
        self.trace(TraceAction::SegmentUnmap, un_ptr, un_bytes, stream);
        Ok(())
    }

    /// Releases an expandable segment whose single block `i` is entirely unmapped.
    pub fn release_expandable_segment<B: MemoryBackend>(
        &mut self,
        backend: &B,
        i: u32,
    ) -> Result<(), AllocError> {
        let (es_id, stream) = (self.blocks[i].expandable, self.blocks[i].stream);
        let es = self.expandable[es_id as usize].expect("live expandable segment");
        // SAFETY: the block spans the whole reservation and is unmapped, so nothing is mapped.
        unsafe { vm_of(backend)?.release(DevicePtr(es.base), es.size as usize) }
            .map_err(backend_err(stream))?;
        self.pool_remove(i);
        self.blocks.remove(i);
        self.expandable[es_id as usize] = None;
        self.count_segment(es.pool, false);
        Ok(())
    }
}
