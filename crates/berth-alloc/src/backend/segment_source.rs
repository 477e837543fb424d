//! A private pool's own memory: PyTorch's `torch.cuda.MemPool(allocator=...)`.
//!
//! # Note [Pools with their own allocator]
//! A `torch.cuda.MemPool` may be given an allocator of its own (a
//! `torch.cuda.memory.CUDAPluggableAllocator`: vLLM's sleep mode, NCCL's registered and
//! symmetric memory). The caching policy then takes every new segment of that pool from it
//! and gives the segment back to it when the segment is released; the blocks inside are cut,
//! cached, merged and counted in the statistics like any other pool's (PyTorch's
//! `allocPrimitive` and `release_block`,
//! <https://github.com/pytorch/pytorch/blob/main/c10/cuda/CUDACachingAllocator.cpp>). A
//! request the source cannot serve goes through the usual out-of-memory fallback: the cached
//! free segments of freeable pools are returned and the request is tried again, then
//! out-of-memory. The memory-fraction cap counts these segments too, also while they are being
//! given back. The pool's allocator is never called with the policy's lock held (frees wait
//! until it is dropped), and berth lets go of it once the pool is forgotten, also outside the
//! lock.
//!
//! Where it cannot apply: with expandable segments PyTorch refuses such a pool (`"MemPool
//! doesn't currently support expandable_segments"`), and so does berth's `expandable`, at the
//! pool's creation rather than at its first allocation; `paged` maps its own physical pages
//! into one reserved range and has no segments to take from an allocator, so it refuses too
//! and names its own sleep mode (`crate::tags`), which is what vLLM's allocator is for.

use crate::ids::DevicePtr;

/// Where a private pool with an allocator of its own gets its segments
/// (`Note [Pools with their own allocator]`): PyTorch's `raw_alloc` / `raw_delete` of the
/// `CUDAAllocator` given to `torch.cuda.MemPool`.
///
/// Calls come from any thread, never with the policy's lock held: a source may run Python or
/// free tensors of the same allocator (PyTorch calls `raw_delete` under its lock, a recursive
/// one; berth's is not). A segment released under the lock is given back once the lock is
/// dropped, by the same call, or by the next one when that call failed midway.
pub trait SegmentSource: Send + Sync {
    /// `bytes` bytes of device memory (a multiple of 512, at least 512) for a new segment of
    /// the pool, 512-byte aligned, or `None` when the source has no memory for it.
    fn alloc(&self, bytes: usize) -> Option<DevicePtr>;

    /// Gives back a segment that [`SegmentSource::alloc`] returned.
    ///
    /// # Safety
    /// `ptr` came from this source's `alloc`, is given back once, and no queued GPU work
    /// uses it any more.
    unsafe fn free(&self, ptr: DevicePtr);
}
