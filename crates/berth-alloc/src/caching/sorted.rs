//! [`SizeIndex`]: the ordered set of free blocks behind each block pool, ordered by
//! (stream, size, address) as PyTorch's `BlockPool` (`BlockComparatorSize`).
//!
//! The order, and so every policy decision, is that of a `BTreeSet<(stream, size, address,
//! slab index)>`; only the representation differs, for speed on the allocation fast path:
//!
//! - one sub-index per stream (a replay has one to three streams; they are kept in a short
//!   vector sorted by handle), so a key is the pair (size, address) packed into one `u128`
//!   (size in the high half), compared in one step, with the slab index as its value;
//! - a sub-index splits its blocks by the size classes of `Note [Size classes]`
//!   (`crate::size_class`: one class per size up to 1 MiB, 64 per power of two above). Classes
//!   are ordered as sizes are, so the set in order is the classes in order, each in order. A
//!   bitmap of the non-empty classes finds the next (or previous) one in two bit scans, so a
//!   best-fit query costs a search within one class plus that, whatever the number of blocks;
//! - a class is a sorted vector of (key, slab index): classes hold a handful of blocks on real
//!   traces, where a binary search over contiguous entries and a short `memmove` beat a
//!   B-tree's node walks. A class that grows past [`SPILL`] blocks (thousands of free blocks of
//!   one size in a fragmented cache) becomes a `BTreeMap`, whose cost grows only
//!   logarithmically, and comes back below [`UNSPILL`].
//!
//! Before classes, one sorted vector per stream held every block: its `memmove`s and binary
//! searches over up to 200 entries were a third of the policy's instructions on the real
//! traces of `tests/data`.

use std::collections::BTreeMap;
use std::ops::Bound;

use crate::size_class::{class_of, ClassSet, CLASSES};

/// Above this many blocks a class becomes a B-tree.
const SPILL: usize = 512;
/// Below this many blocks a B-tree class becomes a vector again (hysteresis).
const UNSPILL: usize = 128;

/// (size, address) as one ordered `u128`.
#[inline]
fn pack(size: u64, ptr: u64) -> u128 {
    (size as u128) << 64 | ptr as u128
}

/// The class of a packed key.
#[inline]
fn class_of_key(k: u128) -> usize {
    class_of((k >> 64) as u64)
}

/// Key of a free block: (stream, size, address, slab index).
pub(crate) type SizeKey = (u64, u64, u64, u32);

#[inline]
fn key_of(stream: u64, packed: u128, idx: u32) -> SizeKey {
    (stream, (packed >> 64) as u64, packed as u64, idx)
}

/// The free blocks of one size class of one stream, ordered by (size, address): a map from
/// the packed key to the slab index.
#[derive(Debug, Clone)]
enum Bin {
    /// Ascending by key, without duplicate keys.
    Vec(Vec<(u128, u32)>),
    Tree(BTreeMap<u128, u32>),
}

impl Default for Bin {
    fn default() -> Self {
        Bin::Vec(Vec::new())
    }
}

impl Bin {
    #[inline]
    fn is_empty(&self) -> bool {
        match self {
            Bin::Vec(v) => v.is_empty(),
            Bin::Tree(t) => t.is_empty(),
        }
    }

    #[inline]
    fn insert(&mut self, k: u128, v: u32) -> bool {
        match self {
            Bin::Vec(e) => {
                // Most classes hold zero or one block: append without a search or a move.
                if e.last().is_none_or(|x| x.0 < k) {
                    e.push((k, v));
                    return true;
                }
                let at = e.partition_point(|x| x.0 < k);
                if e[at].0 == k {
                    return false;
                }
                e.insert(at, (k, v));
                if e.len() > SPILL {
                    *self = Bin::Tree(e.drain(..).collect());
                }
                true
            }
            Bin::Tree(t) => match t.entry(k) {
                std::collections::btree_map::Entry::Occupied(_) => false,
                std::collections::btree_map::Entry::Vacant(slot) => {
                    slot.insert(v);
                    true
                }
            },
        }
    }

    /// Removes `k` if its value is `v`.
    #[inline]
    fn remove(&mut self, k: u128, v: u32) -> bool {
        match self {
            Bin::Vec(e) => {
                if e.last() == Some(&(k, v)) {
                    e.pop();
                    return true;
                }
                let at = e.partition_point(|x| x.0 < k);
                if e.get(at) == Some(&(k, v)) {
                    e.remove(at);
                    true
                } else {
                    false
                }
            }
            Bin::Tree(t) => {
                if t.get(&k) != Some(&v) {
                    return false;
                }
                t.remove(&k);
                if t.len() < UNSPILL {
                    *self = Bin::Vec(std::mem::take(t).into_iter().collect());
                }
                true
            }
        }
    }

    /// Replaces `(ko, vo)` by `(kn, vn)`, moving only the entries between their positions.
    /// `None` when that is not possible here (not the vector form, `(ko, vo)` absent, or `kn`
    /// present): the caller then removes and inserts.
    #[inline]
    fn replace(&mut self, ko: u128, vo: u32, kn: u128, vn: u32) -> Option<()> {
        let Bin::Vec(e) = self else {
            return None;
        };
        let at = e.partition_point(|x| x.0 < ko);
        if e.get(at) != Some(&(ko, vo)) {
            return None;
        }
        let to = e.partition_point(|x| x.0 < kn);
        if e.get(to).is_some_and(|x| x.0 == kn) {
            return None;
        }
        if to <= at {
            e.copy_within(to..at, to + 1);
            e[to] = (kn, vn);
        } else {
            e.copy_within(at + 1..to, at);
            e[to - 1] = (kn, vn);
        }
        Some(())
    }

    fn get(&self, k: u128) -> Option<u32> {
        match self {
            Bin::Vec(e) => {
                let at = e.partition_point(|x| x.0 < k);
                e.get(at).filter(|x| x.0 == k).map(|x| x.1)
            }
            Bin::Tree(t) => t.get(&k).copied(),
        }
    }

    /// The first entry `≥ (k, v)` (`strict`: `> (k, v)`), as (key, value).
    #[inline]
    fn first_from(&self, k: u128, v: u32, strict: bool) -> Option<(u128, u32)> {
        let after =
            |key: u128, val: u32| key > k || (key == k && (val > v || (!strict && val == v)));
        match self {
            Bin::Vec(e) => {
                let mut at = e.partition_point(|x| x.0 < k);
                if at < e.len() && !after(e[at].0, e[at].1) {
                    at += 1;
                }
                e.get(at).copied()
            }
            Bin::Tree(t) => t
                .range(k..)
                .map(|(&key, &val)| (key, val))
                .find(|&(key, val)| after(key, val)),
        }
    }

    /// The last entry `< (k, v)`, as (key, value).
    fn last_before(&self, k: u128, v: u32) -> Option<(u128, u32)> {
        let below = |key: u128, val: u32| key < k || (key == k && val < v);
        match self {
            Bin::Vec(e) => {
                let at = e.partition_point(|x| x.0 <= k);
                e[..at]
                    .iter()
                    .rev()
                    .copied()
                    .find(|&(key, val)| below(key, val))
            }
            Bin::Tree(t) => t
                .range((Bound::Unbounded, Bound::Included(k)))
                .rev()
                .map(|(&key, &val)| (key, val))
                .find(|&(key, val)| below(key, val)),
        }
    }

    fn first(&self) -> Option<(u128, u32)> {
        match self {
            Bin::Vec(e) => e.first().copied(),
            Bin::Tree(t) => t.first_key_value().map(|(&k, &v)| (k, v)),
        }
    }

    fn last(&self) -> Option<(u128, u32)> {
        match self {
            Bin::Vec(e) => e.last().copied(),
            Bin::Tree(t) => t.last_key_value().map(|(&k, &v)| (k, v)),
        }
    }

    fn entries(&self) -> Box<dyn Iterator<Item = (u128, u32)> + '_> {
        match self {
            Bin::Vec(e) => Box::new(e.iter().copied()),
            Bin::Tree(t) => Box::new(t.iter().map(|(&k, &v)| (k, v))),
        }
    }
}

/// The free blocks of one stream, ordered by (size, address): its classes' bins.
///
/// Bins are kept densely, in order of first use, and found through a small table of `u16`s by
/// class: a replay touches a few hundred classes, whose bins then share a few cache lines
/// instead of being spread over a 4865-entry array (as they first were: sampling showed the
/// misses on it).
#[derive(Debug, Clone, Default)]
struct Sub {
    /// 1 + the index in `bins` of each class's bin, 0 when the class has none yet; grown up to
    /// the largest class used so far.
    slot: Vec<u16>,
    /// The bins, in order of first use (never removed).
    bins: Vec<Bin>,
    /// The classes whose bins are non-empty.
    nonempty: ClassSet,
}

impl Sub {
    /// The bin of class `c`, if it has one.
    #[inline]
    fn bin(&self, c: usize) -> Option<&Bin> {
        match self.slot.get(c) {
            Some(&s) if s > 0 => Some(&self.bins[s as usize - 1]),
            _ => None,
        }
    }

    /// The bin of class `c`, if it has one.
    #[inline]
    fn bin_mut(&mut self, c: usize) -> Option<&mut Bin> {
        match self.slot.get(c) {
            Some(&s) if s > 0 => Some(&mut self.bins[s as usize - 1]),
            _ => None,
        }
    }

    /// The bin of the non-empty class `c`.
    #[inline]
    fn nonempty_bin(&self, c: usize) -> &Bin {
        &self.bins[self.slot[c] as usize - 1]
    }

    #[inline]
    fn insert(&mut self, k: u128, v: u32) -> bool {
        let c = class_of_key(k);
        if c >= self.slot.len() {
            self.slot.resize(c + 1, 0);
        }
        if self.slot[c] == 0 {
            self.bins.push(Bin::default());
            // At most `CLASSES` (4865) bins: a `u16` holds their indices.
            self.slot[c] = self.bins.len() as u16;
        }
        let bin = &mut self.bins[self.slot[c] as usize - 1];
        let was_empty = bin.is_empty();
        let fresh = bin.insert(k, v);
        if was_empty && fresh {
            self.nonempty.insert(c);
        }
        fresh
    }

    /// Removes `k` if its value is `v`.
    #[inline]
    fn remove(&mut self, k: u128, v: u32) -> bool {
        let c = class_of_key(k);
        let Some(bin) = self.bin_mut(c) else {
            return false;
        };
        let found = bin.remove(k, v);
        if found && bin.is_empty() {
            self.nonempty.remove(c);
        }
        found
    }

    /// [`Bin::replace`] when both keys are of one class; `None` otherwise (and when the bin
    /// cannot), for the caller to remove and insert.
    #[inline]
    fn replace(&mut self, ko: u128, vo: u32, kn: u128, vn: u32) -> Option<()> {
        let c = class_of_key(ko);
        if class_of_key(kn) != c {
            return None;
        }
        self.bin_mut(c)?.replace(ko, vo, kn, vn)
    }

    fn get(&self, k: u128) -> Option<u32> {
        self.bin(class_of_key(k))?.get(k)
    }

    /// The first entry `≥ (k, v)` (`strict`: `> (k, v)`).
    #[inline]
    fn first_from(&self, k: u128, v: u32, strict: bool) -> Option<(u128, u32)> {
        let c = class_of_key(k);
        if let Some(found) = self.bin(c).and_then(|b| b.first_from(k, v, strict)) {
            return Some(found);
        }
        let next = self.nonempty.next_at_or_above(c + 1)?;
        self.nonempty_bin(next).first()
    }

    /// The last entry `< (k, v)`.
    fn last_before(&self, k: u128, v: u32) -> Option<(u128, u32)> {
        let c = class_of_key(k);
        if let Some(found) = self.bin(c).and_then(|b| b.last_before(k, v)) {
            return Some(found);
        }
        let prev = self.nonempty.last_at_or_below(c.checked_sub(1)?)?;
        self.nonempty_bin(prev).last()
    }

    fn first(&self) -> Option<(u128, u32)> {
        self.nonempty_bin(self.nonempty.next_at_or_above(0)?)
            .first()
    }

    fn last(&self) -> Option<(u128, u32)> {
        self.nonempty_bin(self.nonempty.last_at_or_below(CLASSES)?)
            .last()
    }

    fn entries(&self) -> impl Iterator<Item = (u128, u32)> + '_ {
        std::iter::successors(self.nonempty.next_at_or_above(0), |&c| {
            self.nonempty.next_at_or_above(c + 1)
        })
        .flat_map(|c| self.nonempty_bin(c).entries())
    }

    /// Whether any class is in the B-tree form (for tests).
    #[cfg(test)]
    fn has_tree(&self) -> bool {
        self.bins.iter().any(|b| matches!(b, Bin::Tree(_)))
    }
}

/// Free blocks ordered by (stream, size, address, slab index): a `BTreeSet<SizeKey>` in
/// behaviour, faster in representation (see the module docs).
#[derive(Debug, Clone, Default)]
pub(crate) struct SizeIndex {
    /// (stream handle, its blocks), ascending by handle; a stream stays once seen.
    streams: Vec<(u64, Sub)>,
    len: usize,
}

impl SizeIndex {
    /// Number of blocks.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Position of `stream` in `streams`, or where it would go.
    #[inline]
    fn find(&self, stream: u64) -> Result<usize, usize> {
        // Almost always one or two streams: a linear scan beats a binary search there. Past a
        // few, binary search, so that thousands of streams do not make every lookup linear
        // (found by fuzzing: 40,000 streams took 292 µs per operation).
        if self.streams.len() > 8 {
            return self.streams.binary_search_by_key(&stream, |&(s, _)| s);
        }
        for (i, &(s, _)) in self.streams.iter().enumerate() {
            if s >= stream {
                return if s == stream { Ok(i) } else { Err(i) };
            }
        }
        Err(self.streams.len())
    }

    /// Inserts `k`; returns whether it was absent.
    #[inline]
    pub fn insert(&mut self, k: SizeKey) -> bool {
        let i = match self.find(k.0) {
            Ok(i) => i,
            Err(i) => {
                self.streams.insert(i, (k.0, Sub::default()));
                i
            }
        };
        let fresh = self.streams[i].1.insert(pack(k.1, k.2), k.3);
        self.len += usize::from(fresh);
        fresh
    }

    /// Removes `k`; returns whether it was present.
    #[inline]
    pub fn remove(&mut self, k: &SizeKey) -> bool {
        let Ok(i) = self.find(k.0) else {
            return false;
        };
        let found = self.streams[i].1.remove(pack(k.1, k.2), k.3);
        self.len -= usize::from(found);
        found
    }

    /// Removes `old` and inserts `new`; returns whether `old` was present and `new` absent.
    /// Same result as [`SizeIndex::remove`] then [`SizeIndex::insert`], cheaper when both are
    /// of one stream: only the entries between the two positions move.
    #[inline]
    pub fn replace(&mut self, old: &SizeKey, new: SizeKey) -> bool {
        if old.0 == new.0 {
            if let Ok(i) = self.find(old.0) {
                let sub = &mut self.streams[i].1;
                if sub
                    .replace(pack(old.1, old.2), old.3, pack(new.1, new.2), new.3)
                    .is_some()
                {
                    return true;
                }
            }
        }
        let removed = self.remove(old);
        let inserted = self.insert(new);
        removed && inserted
    }

    /// Whether `k` is in the set.
    pub fn contains(&self, k: &SizeKey) -> bool {
        self.find(k.0)
            .is_ok_and(|i| self.streams[i].1.get(pack(k.1, k.2)) == Some(k.3))
    }

    /// The smallest key `≥ k`.
    #[inline]
    pub fn first_from(&self, k: &SizeKey) -> Option<SizeKey> {
        self.first(k, false)
    }

    /// The smallest key `> k`.
    #[inline]
    pub fn first_after(&self, k: &SizeKey) -> Option<SizeKey> {
        self.first(k, true)
    }

    #[inline]
    fn first(&self, k: &SizeKey, strict: bool) -> Option<SizeKey> {
        let next = match self.find(k.0) {
            Ok(i) => {
                let (s, sub) = &self.streams[i];
                if let Some((p, v)) = sub.first_from(pack(k.1, k.2), k.3, strict) {
                    return Some(key_of(*s, p, v));
                }
                i + 1
            }
            Err(i) => i,
        };
        self.streams[next..]
            .iter()
            .find_map(|(s, sub)| sub.first().map(|(p, v)| key_of(*s, p, v)))
    }

    /// The largest key `< k`.
    pub fn last_before(&self, k: &SizeKey) -> Option<SizeKey> {
        let prev = match self.find(k.0) {
            Ok(i) => {
                let (s, sub) = &self.streams[i];
                if let Some((p, v)) = sub.last_before(pack(k.1, k.2), k.3) {
                    return Some(key_of(*s, p, v));
                }
                i
            }
            Err(i) => i,
        };
        self.streams[..prev]
            .iter()
            .rev()
            .find_map(|(s, sub)| sub.last().map(|(p, v)| key_of(*s, p, v)))
    }

    /// The keys in ascending order.
    pub fn iter(&self) -> impl Iterator<Item = SizeKey> + '_ {
        self.streams
            .iter()
            .flat_map(|(s, sub)| sub.entries().map(move |(p, v)| key_of(*s, p, v)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// A size drawn from `r`: one of 40 exact classes, one crowded exact class (to reach the
    /// B-tree form), 40 sizes within one log-linear class, or 40 sizes in separate log-linear
    /// classes.
    fn size_from(r: u64) -> u64 {
        let k = 512 * ((r >> 8) % 40);
        match (r >> 40) % 4 {
            0 => 4096,
            1 => k,
            2 => (1 << 30) + k,
            _ => k << 12,
        }
    }

    /// Every operation agrees with `BTreeSet<SizeKey>` through both forms, the switches between
    /// them, classes of one size and of many, and several streams.
    #[test]
    fn behaves_as_a_btree_set_across_streams_classes_spill_and_unspill() {
        let mut s = SizeIndex::default();
        let mut want: BTreeSet<SizeKey> = BTreeSet::new();
        let mut rand = crate::testing::xorshift(0x2545_f491_4f6c_dd1d);
        let mut spilled = false;
        for step in 0..30_000u32 {
            let r = rand();
            // Streams 0, 7 and u64::MAX; sizes and addresses from small ranges so that keys
            // collide; the slab index is a function of the address, as in a pool.
            let stream = [0, 7, u64::MAX][(r % 3) as usize];
            let size = size_from(r);
            let ptr = (r >> 20) % 3000 * 512 + u64::from(step % 2) * (u64::MAX - (1 << 30));
            let k = (stream, size, ptr, (ptr % 1_000_003) as u32);
            if step < 15_000 && r.is_multiple_of(8) {
                // Replace a present key (or an absent one) by `k`.
                let old = want.range(..k).next_back().copied().unwrap_or(k);
                let old = if r.is_multiple_of(16) {
                    (old.0, old.1 + 512, old.2, old.3)
                } else {
                    old
                };
                let expect = want.remove(&old);
                let expect = want.insert(k) && expect;
                assert_eq!(s.replace(&old, k), expect, "replace {old:?} by {k:?}");
            } else if step < 15_000 && r % 4 < 3 {
                assert_eq!(s.insert(k), want.insert(k));
            } else if step < 15_000 {
                assert_eq!(s.remove(&k), want.remove(&k));
            } else if let Some(present) = want.range(k..).next().copied() {
                assert!(s.remove(&present) && want.remove(&present));
            }
            spilled |= s.streams.iter().any(|(_, sub)| sub.has_tree());
            assert_eq!(s.len(), want.len());
            let r = rand();
            let probe = (
                [0, 3, 7, u64::MAX][(r % 4) as usize],
                size_from(r),
                (r >> 20) % 3000 * 512,
                (r >> 50) as u32 % 3,
            );
            assert_eq!(s.contains(&probe), want.contains(&probe));
            assert_eq!(s.first_from(&probe), want.range(probe..).next().copied());
            assert_eq!(
                s.first_after(&probe),
                want.range((Bound::Excluded(probe), Bound::Unbounded))
                    .next()
                    .copied()
            );
            assert_eq!(
                s.last_before(&probe),
                want.range(..probe).next_back().copied()
            );
        }
        assert!(spilled, "the test reached the B-tree form");
        assert!(
            s.streams.iter().all(|(_, sub)| !sub.has_tree()),
            "and came back"
        );
        assert!(s.iter().eq(want.iter().copied()));
    }
}
