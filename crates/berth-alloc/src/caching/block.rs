//! Blocks: contiguous pieces of a segment, kept in a slab and linked in address order.

use crate::backend::StreamId;

/// "No block" in a `prev`/`next` link or an expandable-segment id.
pub(crate) const NIL: u32 = u32::MAX;

/// A block (PyTorch's `Block`). Sizes in bytes.
#[derive(Debug, Clone)]
pub(crate) struct Block {
    pub ptr: u64,
    /// Rounded size.
    pub size: u64,
    /// The caller's size of the last allocation (kept after free, as in PyTorch).
    pub requested: u64,
    pub stream: StreamId,
    pub prev: u32,
    pub next: u32,
    /// Its pool's index in the allocator's pools ([`super::pool::pool_index`]).
    pub pool: u16,
    /// In a small pool (`pool` is odd).
    pub small: bool,
    pub allocated: bool,
    /// Mapped (always true outside expandable segments).
    pub mapped: bool,
    /// Index of the expandable segment, or [`NIL`].
    pub expandable: u32,
    /// Outstanding cross-stream events.
    pub event_count: u32,
    /// Other streams the block was used on (empty → no heap allocation).
    pub stream_uses: Vec<StreamId>,
    /// Pool search counter when the block entered the pool (GC age base).
    pub gc_base: u64,
}

impl Block {
    pub fn new(ptr: u64, size: u64, stream: StreamId, pool: u16) -> Self {
        Block {
            ptr,
            size,
            requested: 0,
            stream,
            prev: NIL,
            next: NIL,
            pool,
            small: pool & 1 == 1,
            allocated: false,
            mapped: true,
            expandable: NIL,
            event_count: 0,
            stream_uses: Vec::new(),
            gc_base: 0,
        }
    }

    /// Whether it has a neighbour in its segment (PyTorch's `is_split`).
    pub fn is_split(&self) -> bool {
        self.prev != NIL || self.next != NIL
    }

    pub fn is_expandable(&self) -> bool {
        self.expandable != NIL
    }

    /// Free, no pending events, no recorded stream uses.
    pub fn is_reusable(&self) -> bool {
        !self.allocated && self.event_count == 0 && self.stream_uses.is_empty()
    }
}

/// Blocks addressed by `u32` index, with a free list of slots.
#[derive(Debug, Default)]
pub(crate) struct Slab {
    slots: Vec<Option<Block>>,
    free: Vec<u32>,
}

impl Slab {
    pub fn insert(&mut self, block: Block) -> u32 {
        if let Some(i) = self.free.pop() {
            self.slots[i as usize] = Some(block);
            i
        } else {
            self.slots.push(Some(block));
            (self.slots.len() - 1) as u32
        }
    }

    pub fn remove(&mut self, i: u32) -> Block {
        let b = self.slots[i as usize].take().expect("slab slot is live");
        self.free.push(i);
        b
    }

    /// Iterates over the live blocks with their indices.
    pub fn iter(&self) -> impl Iterator<Item = (u32, &Block)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, b)| b.as_ref().map(|b| (i as u32, b)))
    }

    pub fn len(&self) -> usize {
        self.slots.len() - self.free.len()
    }
}

impl std::ops::Index<u32> for Slab {
    type Output = Block;

    #[inline]
    fn index(&self, i: u32) -> &Block {
        self.slots[i as usize].as_ref().expect("slab slot is live")
    }
}

impl std::ops::IndexMut<u32> for Slab {
    #[inline]
    fn index_mut(&mut self, i: u32) -> &mut Block {
        self.slots[i as usize].as_mut().expect("slab slot is live")
    }
}
