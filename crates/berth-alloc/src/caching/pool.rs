//! Block pools: the free (cached) blocks of one kind, ordered by (stream, size, address) as
//! PyTorch's `BlockPool`, plus the unmapped ranges of expandable segments by (stream, address).

use std::collections::BTreeSet;

use super::block::Block;
use super::sorted::{SizeIndex, SizeKey};
use crate::backend::StreamId;

/// Key of an unmapped range: (stream, address, slab index).
pub(crate) type AddrKey = (u64, u64, u32);

#[derive(Debug, Default)]
pub(crate) struct BlockPool {
    pub blocks: SizeIndex,
    pub unmapped: BTreeSet<AddrKey>,
    /// Pool searches so far while GC is on (PyTorch's `get_free_blocks_call_count`).
    pub free_calls: u64,
}

impl BlockPool {
    #[inline]
    pub fn size_key(b: &Block, i: u32) -> SizeKey {
        (b.stream.0, b.size, b.ptr, i)
    }

    pub fn addr_key(b: &Block, i: u32) -> AddrKey {
        (b.stream.0, b.ptr, i)
    }

    /// Inserts a free block into the set it belongs to (mapped or unmapped).
    #[inline]
    pub fn insert(&mut self, b: &mut Block, i: u32) {
        if b.mapped {
            b.gc_base = self.free_calls;
            let fresh = self.blocks.insert(Self::size_key(b, i));
            debug_assert!(fresh, "block already in pool");
        } else {
            let fresh = self.unmapped.insert(Self::addr_key(b, i));
            debug_assert!(fresh, "range already in pool");
        }
    }

    /// [`BlockPool::insert`] of block `i` in place of the mapped free block keyed `old` (still
    /// in the pool): the same final state as removing `old` first, with less data moved.
    #[inline]
    pub fn insert_replacing(&mut self, old: &SizeKey, b: &mut Block, i: u32) {
        if b.mapped {
            b.gc_base = self.free_calls;
            let fresh = self.blocks.replace(old, Self::size_key(b, i));
            debug_assert!(fresh, "replaced block was pooled, new one was not");
        } else {
            self.blocks.remove(old);
            self.insert(b, i);
        }
    }

    /// Removes a free block from its set; returns whether it was there.
    #[inline]
    pub fn remove(&mut self, b: &Block, i: u32) -> bool {
        if b.mapped {
            self.blocks.remove(&Self::size_key(b, i))
        } else {
            self.unmapped.remove(&Self::addr_key(b, i))
        }
    }

    /// The first mapped free block with key ≥ (stream, size), if it belongs to `stream`.
    #[inline]
    pub fn lower_bound(&self, stream: StreamId, size: u64) -> Option<SizeKey> {
        self.blocks
            .first_from(&(stream.0, size, 0, 0))
            .filter(|k| k.0 == stream.0)
    }
}
