//! Restoring a private pool of [`super::PagedBestFit`] to a checkpoint of its allocations
//! (PyTorch's `setCheckpointPoolState`, used by CUDA-graph trees:
//! <https://github.com/pytorch/pytorch/blob/main/torch/_inductor/cudagraph_trees.py>).
//!
//! # Note [Restoring a pool checkpoint]
//! CUDA-graph trees (`torch.compile(mode="reduce-overhead")`) record graphs into one private
//! pool. Before recording a new graph after replaying others (a new input shape, a branch of
//! the tree not seen yet), they take the pool back to what it held when the replayed path was
//! recorded: the checkpoint lists the blocks allocated then, `(address, size)`. Restoring
//! frees every block allocated in the pool now and allocates every block of the checkpoint at
//! its address again; a block in both is left as it is (its memory and contents untouched).
//! The other memory of the pool is then free for the new recording. PyTorch rebuilds each
//! segment's split blocks exactly; berth needs only the allocated blocks at their addresses,
//! as free memory is free however it is cut, so a policy takes each block out of the free
//! extent holding it.
//!
//! Before anything changes, every block of the checkpoint must lie inside one reservation of
//! the pool, with no two overlapping ([`AllocError::BadCheckpoint`] otherwise). Frees waiting
//! for cross-stream events are waited for first, as PyTorch's restore requires of them. In
//! `paged` the pages under a restored block are mapped again if the pool's cache was emptied
//! since (`empty_pool_cache`); if that fails, the blocks restored by the call are freed again
//! and the error returned (the blocks freed before stay freed). Blocks a use-on-OOM pool lent
//! to general requests count as the pool's, as in PyTorch: restore only graph pools.

use std::collections::HashMap;

use super::state::State;
use crate::allocator::PoolRestore;
use crate::backend::{DevicePtr, MemoryBackend};
use crate::caching::private_pools::checkpoint_blocks;
use crate::error::AllocError;
use crate::ids::MempoolId;

impl<E> State<E> {
    /// Restores pool `id` to the checkpoint `live` (`Note [Restoring a pool checkpoint]`).
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
        let pair = self.pool_pair(id, "restore a checkpoint: no such pool")?;
        let bad = |what: String| AllocError::BadCheckpoint { id, what };
        // Each block of the checkpoint, with the arena whose reservation holds it.
        let mut want: Vec<(u64, u64, usize)> = Vec::with_capacity(live.len());
        for (addr, size) in checkpoint_blocks(id, live)? {
            let end = addr + size;
            let arena = (0..self.arenas.len()).find(|&i| {
                let a = &self.arenas[i];
                a.pair == pair
                    && a.reservations
                        .iter()
                        .any(|&(b, n)| addr >= b && end <= b + n)
            });
            let Some(ai) = arena else {
                return Err(bad(format!(
                    "block {addr:#x} ({size} bytes) is not in the pool's memory"
                )));
            };
            if self.tags.is_asleep(self.arenas[ai].tag) {
                return Err(bad(format!(
                    "block {addr:#x} is in tag {:?}, which is asleep",
                    self.tags.name(self.arenas[ai].tag)
                )));
            }
            want.push((addr, size, ai));
        }

        self.sync_pending(backend)?;
        let mut current: Vec<(u64, u64)> = self
            .live
            .iter()
            .filter(|(_, l)| self.arenas[l.arena].pair == pair)
            .map(|(&a, l)| (a, l.size))
            .collect();
        current.sort_unstable();
        let wanted: HashMap<u64, u64> = want.iter().map(|&(a, s, _)| (a, s)).collect();
        for &(addr, size) in &current {
            if wanted.get(&addr) != Some(&size) {
                self.free(backend, DevicePtr(addr))?;
            }
        }
        self.sync_pending(backend)?;
        let kept: HashMap<u64, u64> = current.iter().copied().collect();
        let mut made: Vec<(u64, u64, usize)> = Vec::new();
        for &(addr, size, ai) in &want {
            if kept.get(&addr) == Some(&size) {
                continue;
            }
            let placed = if self.arenas[ai].take_at(addr, size) {
                self.ensure_mapped(backend, addr, size, ai, size)
                    .inspect_err(|_| self.arenas[ai].insert_free(addr, addr + size))
            } else {
                Err(bad(format!(
                    "block {addr:#x} ({size} bytes) lies on memory another block holds"
                )))
            };
            if let Err(e) = placed {
                // Nothing half done: the blocks restored by this call are freed again.
                for (a, _, _) in made {
                    // A block made just now has no stream uses: it is freed at once.
                    let _ = self.free(backend, DevicePtr(a));
                }
                return Err(e);
            }
            self.note_allocated(addr, size, size, ai);
            made.push((addr, size, ai));
        }
        Ok(PoolRestore {
            freed: current.iter().map(|&(a, _)| DevicePtr(a)).collect(),
            allocated: want.iter().map(|&(a, _, _)| DevicePtr(a)).collect(),
        })
    }
}
