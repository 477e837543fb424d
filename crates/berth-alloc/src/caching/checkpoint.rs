//! Restoring a private pool of the caching policies (`pytorch`, `expandable`) to a checkpoint
//! of its allocations: PyTorch's `setCheckpointPoolState`, as `Note [Restoring a pool
//! checkpoint]` in `crate::paged` describes. A block of the checkpoint not allocated now is
//! cut out of the free block holding it: the free memory before and after it stays free, in
//! its pool.

use std::collections::HashMap;

use super::block::{Block, NIL};
use super::state::State;
use crate::allocator::PoolRestore;
use crate::backend::{DevicePtr, MemoryBackend};
use crate::error::AllocError;
use crate::ids::MempoolId;

impl<E> State<E> {
    /// Restores pool `id` to the checkpoint `live`.
    ///
    /// # Errors
    /// As [`crate::DeviceAllocator::restore_pool`].
    pub(crate) fn restore_pool<B: MemoryBackend<Fence = E>>(
        &mut self,
        backend: &B,
        id: MempoolId,
        live: &[(DevicePtr, u64)],
    ) -> Result<PoolRestore, AllocError> {
        if self.private.capturing() {
            return Err(AllocError::SleepDuringCapture {
                op: "restore a pool checkpoint",
            });
        }
        let pair = self.private.pair_of(id).ok_or(AllocError::NoSuchPool {
            id,
            what: "restore a checkpoint: no such pool",
        })?;
        let bad = |what: String| AllocError::BadCheckpoint { id, what };
        let want = super::private_pools::checkpoint_blocks(id, live)?;
        for &(addr, size) in &want {
            let end = addr + size;
            let in_segment = self
                .segments
                .range(..=addr)
                .next_back()
                .is_some_and(|(&b, m)| end <= b + m.size && m.pool / 2 == pair);
            let in_expandable = self
                .expandable
                .iter()
                .flatten()
                .any(|e| addr >= e.base && end <= e.base + e.size && e.pool / 2 == pair);
            if !in_segment && !in_expandable {
                return Err(bad(format!(
                    "block {addr:#x} ({size} bytes) is not in the pool's memory"
                )));
            }
        }

        // Every byte of a block to restore must be mapped (expandable segments unmap free
        // pages): checked before anything is freed, so a refusal changes nothing.
        let wanted: HashMap<u64, u64> = want.iter().copied().collect();
        for &(addr, size) in &want {
            let end = addr + size;
            let unmapped = self.blocks.iter().any(|(_, b)| {
                b.pool / 2 == pair && !b.mapped && b.ptr < end && addr < b.ptr + b.size
            });
            if unmapped {
                return Err(bad(format!(
                    "block {addr:#x} ({size} bytes) lies on memory the pool no longer maps"
                )));
            }
        }
        // Frees deferred during a capture get their events first, then every event is waited
        // for: no block of the pool is left half freed.
        while let Some(i) = self.events_deferred.pop() {
            self.insert_events(backend, i)?;
        }
        self.synchronize_and_free_events(backend)?;
        let mut current: Vec<(u64, u64, u32)> = self
            .allocated
            .iter()
            .map(|(&a, &i)| (a, i))
            .filter(|&(_, i)| self.blocks[i].pool / 2 == pair)
            .map(|(a, i)| (a, self.blocks[i].size, i))
            .collect();
        current.sort_unstable();
        for &(addr, size, i) in &current {
            if wanted.get(&addr) != Some(&size) {
                self.allocated.remove(&addr);
                self.free_requested(backend, i)?;
            }
        }
        self.synchronize_and_free_events(backend)?;
        let kept: HashMap<u64, u64> = current.iter().map(|&(a, s, _)| (a, s)).collect();
        let mut made: Vec<u64> = Vec::new();
        for &(addr, size) in &want {
            if kept.get(&addr) == Some(&size) {
                continue;
            }
            if let Err(e) = self.take_at(addr, size, pair) {
                // Nothing half done: the blocks restored by this call are freed again.
                for a in made {
                    if let Some(i) = self.allocated.remove(&a) {
                        let _ = self.free_requested(backend, i);
                    }
                }
                return Err(bad(e));
            }
            made.push(addr);
        }
        Ok(PoolRestore {
            freed: current.iter().map(|&(a, _, _)| DevicePtr(a)).collect(),
            allocated: want.iter().map(|&(a, _)| DevicePtr(a)).collect(),
        })
    }

    /// Allocates `[addr, addr + size)` of pool pair `pair` out of the free block holding all
    /// of it, cutting off the free memory before and after; what is wrong otherwise.
    fn take_at(&mut self, addr: u64, size: u64, pair: u16) -> Result<(), String> {
        let end = addr + size;
        let found = self.blocks.iter().find_map(|(i, b)| {
            (!b.allocated && b.pool / 2 == pair && b.ptr <= addr && end <= b.ptr + b.size)
                .then_some(i)
        });
        let Some(mut i) = found else {
            return Err(format!(
                "block {addr:#x} ({size} bytes) lies on memory another block holds"
            ));
        };
        let b = &self.blocks[i];
        if !b.mapped || !b.is_reusable() {
            return Err(format!(
                "block {addr:#x} ({size} bytes) lies on memory the pool no longer maps"
            ));
        }
        self.pool_remove(i);
        if self.blocks[i].ptr < addr {
            let j = self.split_free(i, addr - self.blocks[i].ptr);
            self.pool_insert(i);
            i = j;
        }
        if self.blocks[i].size > size {
            let k = self.split_free(i, size);
            self.pool_insert(k);
        }
        self.alloc_found_block(i, size, size, None);
        Ok(())
    }

    /// Cuts free block `i` (out of its pool) in two at `at` bytes from its start; returns the
    /// second part, free and out of the pool, counted as a split block as a free would.
    fn split_free(&mut self, i: u32, at: u64) -> u32 {
        let (ptr, size, stream, pool, exp, next, was_split, small, mapped) = {
            let b = &self.blocks[i];
            let e = (b.ptr, b.size, b.stream, b.pool, b.expandable, b.next);
            (
                e.0,
                e.1,
                e.2,
                e.3,
                e.4,
                e.5,
                b.is_split(),
                b.small,
                b.mapped,
            )
        };
        let mut back = Block::new(ptr + at, size - at, stream, pool);
        back.expandable = exp;
        back.mapped = mapped;
        back.prev = i;
        back.next = next;
        let j = self.blocks.insert(back);
        if next != NIL {
            self.blocks[next].prev = j;
        }
        self.blocks[i].next = j;
        self.blocks[i].size = at;
        if exp == NIL {
            let s = &mut self.stats;
            if was_split {
                s.inactive_split.increase(small, 1);
            } else {
                s.inactive_split.increase(small, 2);
                s.inactive_split_bytes.increase(small, size as i64);
            }
        }
        j
    }
}
