//! [`SizeBins`]: the free extents of one [`super::arena::Arena`], kept in segregated lists by
//! size class so that finding a fitting extent, adding and removing one cost the same whatever
//! the number of extents.
//!
//! # Note [Size classes]
//! Every extent is a multiple of 512 bytes (PyTorch's `kMinBlockSize`; reservations are whole
//! pages). Let `u = size / 512`. Up to 1 MiB (`u <= 2048`) every size has its own class, so a
//! list holds extents of one size only and its first entry is an exact best fit. Above, classes
//! are log-linear as in TLSF (Masmano et al., "TLSF: a new dynamic memory allocator for real-time
//! systems", 2004): 64 classes per power of two, so a class spans sizes within 1/64 of each
//! other. A bitmap of non-empty classes, with a summary word over it, finds the first non-empty
//! class at or above any class with two `trailing_zeros`. Lists are LIFO: the extent freed last
//! is handed out first, while its metadata is still in cache.
//!
//! Extents live in a slab (`Vec` of nodes, indices as links) and are named by their slot index,
//! which stays valid until the extent is removed.

/// No node: the end of a list.
pub(crate) const NIL: u32 = u32::MAX;

/// The largest `size / 512` with a class of its own (1 MiB).
const EXACT_UNITS: u64 = 2048;
/// Classes per power of two above [`EXACT_UNITS`].
const SUB: u64 = 64;
/// `log2(SUB)`.
const SUB_BITS: u32 = 6;
/// Number of classes: exact ones (0 unused) plus 64 per power of two from 2^11 to 2^54 units
/// (every `u64` size in bytes).
const CLASSES: usize = EXACT_UNITS as usize + 1 + 44 * SUB as usize;
/// Words of the non-empty bitmap.
const WORDS: usize = CLASSES.div_ceil(64);

/// The class of an extent of `size` bytes (a multiple of 512, > 0). Non-decreasing in `size`.
#[inline]
pub(crate) fn class_of(size: u64) -> usize {
    let u = size >> 9;
    if u <= EXACT_UNITS {
        return u as usize;
    }
    let e = 63 - u.leading_zeros(); // >= 11
    let m = (u >> (e - SUB_BITS)) & (SUB - 1);
    (EXACT_UNITS + 1 + u64::from(e - 11) * SUB + m) as usize
}

/// Whether every extent of class `class` has the same size.
#[inline]
pub(crate) fn is_exact(class: usize) -> bool {
    class as u64 <= EXACT_UNITS
}

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
    /// Bit `c` set when class `c` is non-empty.
    bits: [u64; WORDS],
    /// Bit `w` set when `bits[w] != 0`.
    summary: u128,
    len: usize,
}

impl Default for SizeBins {
    fn default() -> Self {
        SizeBins {
            nodes: Vec::new(),
            vacant: Vec::new(),
            heads: Box::new([NIL; CLASSES]),
            bits: [0; WORDS],
            summary: 0,
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
        if class >= CLASSES {
            return None;
        }
        let w = class / 64;
        let here = self.bits[w] & (!0u64 << (class % 64));
        if here != 0 {
            return Some(w * 64 + here.trailing_zeros() as usize);
        }
        let above = if w + 1 >= 128 {
            0
        } else {
            self.summary & (!0u128 << (w + 1))
        };
        if above == 0 {
            return None;
        }
        let w = above.trailing_zeros() as usize;
        Some(w * 64 + self.bits[w].trailing_zeros() as usize)
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
            self.bits[class / 64] |= 1 << (class % 64);
            self.summary |= 1 << (class / 64);
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
                let w = class / 64;
                self.bits[w] &= !(1 << (class % 64));
                if self.bits[w] == 0 {
                    self.summary &= !(1 << w);
                }
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
    fn classes_are_exact_to_1_mib_then_log_linear() {
        assert_eq!(class_of(512), 1);
        assert_eq!(class_of(1 << 20), 2048);
        assert!(is_exact(2048) && !is_exact(2049));
        // 1 MiB + 512 .. 1 MiB + 16 KiB share the first log-linear class (width 32 units).
        assert_eq!(class_of((1 << 20) + 512), 2049);
        assert_eq!(class_of((1 << 20) + 16 * 1024 - 512), 2049);
        assert_eq!(class_of((1 << 20) + 16 * 1024), 2050);
        assert_eq!(class_of(2 << 20), 2049 + 64);
        assert_eq!(class_of(!511), CLASSES - 1);
        // Non-decreasing, and within a class sizes differ by less than 1/64.
        let mut last = 0;
        let mut first_of_class = 512u64;
        for u in 1..200_000u64 {
            let c = class_of(u * 512);
            assert!(c >= last, "class_of is monotonic at {u}");
            if c != last {
                first_of_class = u * 512;
            }
            assert!(u * 512 - first_of_class < first_of_class / 64 + 512);
            last = c;
        }
    }

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
