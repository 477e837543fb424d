//! [`SizeBins`]: the free extents of one [`super::arena::Arena`], kept in segregated lists by
//! size class so that finding a fitting extent, adding and removing one cost the same whatever
//! the number of extents.
//!
//! Classes are those of `Note [Size classes]` (`crate::size_class`): exact up to 1 MiB, so a
//! list holds extents of one size only and its first entry is an exact best fit, log-linear
//! above. Lists are LIFO: the extent freed last is handed out first, while its metadata is
//! still in cache.
//!
//! Extents live in a slab (`Vec` of nodes, indices as links) and are named by their slot index,
//! which stays valid until the extent is removed.

/// No node: the end of a list.
pub(crate) const NIL: u32 = u32::MAX;

pub(crate) use crate::size_class::{class_of, is_exact};
use crate::size_class::{ClassSet, CLASSES};

/// One free extent `[start, end)` and its links in its class list.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Node {
    pub(crate) start: u64,
    pub(crate) end: u64,
    prev: u32,
    pub(crate) next: u32,
    class: u16,
}

/// Free extents in segregated size-class lists. See `Note [Size classes]`.
#[derive(Debug)]
pub(crate) struct SizeBins {
    nodes: Vec<Node>,
    /// Slots of removed nodes, reused first.
    vacant: Vec<u32>,
    /// First node of each class list, [`NIL`] when empty.
    heads: Box<[u32; CLASSES]>,
    /// The non-empty classes.
    nonempty: ClassSet,
    len: usize,
}

impl Default for SizeBins {
    fn default() -> Self {
        SizeBins {
            nodes: Vec::new(),
            vacant: Vec::new(),
            heads: Box::new([NIL; CLASSES]),
            nonempty: ClassSet::default(),
            len: 0,
        }
    }
}

impl SizeBins {
    /// The node in slot `i` (present).
    #[inline]
    pub(crate) fn node(&self, i: u32) -> &Node {
        &self.nodes[i as usize]
    }

    /// How many extents there are.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The first node of class `class`, or [`NIL`].
    #[inline]
    pub(crate) fn head(&self, class: usize) -> u32 {
        self.heads[class]
    }

    /// The first non-empty class at or above `class`.
    #[inline]
    pub(crate) fn next_class(&self, class: usize) -> Option<usize> {
        self.nonempty.next_at_or_above(class)
    }

    /// The lowest `(start, slot)` among the first `limit` (>= 1) extents of the non-empty class
    /// `class`.
    #[inline]
    pub(crate) fn min_start(&self, class: usize, limit: usize) -> (u64, u32) {
        let mut slot = self.heads[class];
        let mut best = (u64::MAX, NIL);
        for _ in 0..limit {
            if slot == NIL {
                break;
            }
            let n = &self.nodes[slot as usize];
            if n.start < best.0 {
                best = (n.start, slot);
            }
            slot = n.next;
        }
        best
    }

    /// Adds the free extent `[start, end)` (non-empty, a multiple of 512 bytes long) at the
    /// front of its class list; returns its slot.
    #[inline]
    pub(crate) fn insert(&mut self, start: u64, end: u64) -> u32 {
        let node = Node {
            start,
            end,
            prev: NIL,
            next: NIL,
            class: 0,
        };
        let i = match self.vacant.pop() {
            Some(i) => {
                self.nodes[i as usize] = node;
                i
            }
            None => {
                self.nodes.push(node);
                u32::try_from(self.nodes.len() - 1).expect("fewer than 2^32 free extents")
            }
        };
        self.link(i);
        self.len += 1;
        i
    }

    /// Removes the extent in slot `i` (present) and returns it.
    #[inline]
    pub(crate) fn remove(&mut self, i: u32) -> Node {
        self.unlink(i);
        self.vacant.push(i);
        self.len -= 1;
        self.nodes[i as usize]
    }

    /// Changes the extent in slot `i` (present) to `[start, end)` and moves it to the front of
    /// its (new) class list, as a remove and insert would, keeping its slot.
    #[inline]
    pub(crate) fn set(&mut self, i: u32, start: u64, end: u64) {
        self.unlink(i);
        let n = &mut self.nodes[i as usize];
        (n.start, n.end) = (start, end);
        self.link(i);
    }

    /// Puts the node in slot `i` at the front of the list of its size's class.
    #[inline]
    fn link(&mut self, i: u32) {
        let n = &mut self.nodes[i as usize];
        let class = class_of(n.end - n.start);
        let head = self.heads[class];
        (n.prev, n.next, n.class) = (NIL, head, class as u16);
        if head == NIL {
            self.nonempty.insert(class);
        } else {
            self.nodes[head as usize].prev = i;
        }
        self.heads[class] = i;
    }

    /// Takes the node in slot `i` out of its class list.
    #[inline]
    fn unlink(&mut self, i: u32) {
        let node = self.nodes[i as usize];
        let class = node.class as usize;
        if node.prev == NIL {
            self.heads[class] = node.next;
            if node.next == NIL {
                self.nonempty.remove(class);
            }
        } else {
            self.nodes[node.prev as usize].next = node.next;
        }
        if node.next != NIL {
            self.nodes[node.next as usize].prev = node.prev;
        }
    }

    /// Every extent `(start, end)`, in no particular order.
    pub(crate) fn extents(&self) -> Vec<(u64, u64)> {
        let mut out = Vec::with_capacity(self.len);
        let mut class = self.next_class(0);
        while let Some(c) = class {
            let mut i = self.heads[c];
            while i != NIL {
                let n = &self.nodes[i as usize];
                out.push((n.start, n.end));
                i = n.next;
            }
            class = self.next_class(c + 1);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_and_bitmap_follow_inserts_and_removes() {
        let mut b = SizeBins::default();
        assert_eq!(b.next_class(0), None);
        let a = b.insert(0, 1024);
        let c = b.insert(4096, 5120);
        let d = b.insert(1 << 40, (1 << 40) + (3 << 30));
        assert_eq!(b.len(), 3);
        assert_eq!(b.next_class(0), Some(2));
        assert_eq!(b.head(2), c, "LIFO: the extent added last comes first");
        assert_eq!(b.node(c).next, a);
        assert_eq!(b.next_class(3), Some(class_of(3 << 30)));
        assert_eq!(b.remove(c).start, 4096);
        assert_eq!(b.head(2), a);
        b.remove(a);
        assert_eq!(b.next_class(0), Some(class_of(3 << 30)));
        b.remove(d);
        assert_eq!((b.next_class(0), b.len()), (None, 0));
        // Slots are reused.
        assert_eq!(b.insert(0, 512), d);
        assert_eq!(b.extents(), vec![(0, 512)]);
    }
}
