//! [`SizeIndex`]: the ordered set of free blocks behind each block pool, ordered by
//! (stream, size, address) as PyTorch's `BlockPool` (`BlockComparatorSize`).
//!
//! The order, and so every policy decision, is that of a `BTreeSet<(stream, size, address,
//! slab index)>`; only the representation differs, for speed on the allocation fast path:
//!
//! - one sub-index per stream (a replay has one to three streams; they are kept in a short
//!   vector sorted by handle), so a key is the pair (size, address) packed into one `u128`
//!   (size in the high half), compared in one step, with the slab index as its value;
//! - a sub-index is two parallel sorted vectors (keys, slab indices) while it holds at most
//!   [`SPILL`] blocks: on real traces a pool holds a few dozen free blocks (at most about 200 on
//!   the five traces of `shared/traces`), where a binary search over contiguous `u128`s and a
//!   short `memmove` cost a fraction of a B-tree's node walks; above that it becomes a
//!   `BTreeMap`, whose cost grows only logarithmically (fragmented caches with many thousands of
//!   free blocks), and comes back below [`UNSPILL`].

use std::collections::BTreeMap;
use std::ops::Bound;

use super::pool::SizeKey;

/// Above this many blocks a stream's sub-index becomes a B-tree.
const SPILL: usize = 512;
/// Below this many blocks a B-tree sub-index becomes vectors again (hysteresis).
const UNSPILL: usize = 128;

/// (size, address) as one ordered `u128`.
#[inline]
fn pack(size: u64, ptr: u64) -> u128 {
    (size as u128) << 64 | ptr as u128
}

#[inline]
fn key_of(stream: u64, packed: u128, idx: u32) -> SizeKey {
    (stream, (packed >> 64) as u64, packed as u64, idx)
}

/// The free blocks of one stream, ordered by (size, address).
#[derive(Debug, Clone)]
enum Sub {
    /// `keys` ascending without duplicates; `vals[i]` is the slab index of `keys[i]`.
    Vec {
        keys: Vec<u128>,
        vals: Vec<u32>,
    },
    Tree(BTreeMap<u128, u32>),
}

impl Sub {
    #[inline]
    fn insert(&mut self, k: u128, v: u32) -> bool {
        match self {
            Sub::Vec { keys, vals } => match keys.binary_search(&k) {
                Ok(_) => false,
                Err(at) => {
                    keys.insert(at, k);
                    vals.insert(at, v);
                    if keys.len() > SPILL {
                        let t = keys.drain(..).zip(vals.drain(..)).collect();
                        *self = Sub::Tree(t);
                    }
                    true
                }
            },
            Sub::Tree(t) => match t.entry(k) {
                std::collections::btree_map::Entry::Occupied(_) => false,
                std::collections::btree_map::Entry::Vacant(e) => {
                    e.insert(v);
                    true
                }
            },
        }
    }

    /// Removes `k` if its value is `v`.
    #[inline]
    fn remove(&mut self, k: u128, v: u32) -> bool {
        match self {
            Sub::Vec { keys, vals } => match keys.binary_search(&k) {
                Ok(at) if vals[at] == v => {
                    keys.remove(at);
                    vals.remove(at);
                    true
                }
                _ => false,
            },
            Sub::Tree(t) => {
                if t.get(&k) != Some(&v) {
                    return false;
                }
                t.remove(&k);
                if t.len() < UNSPILL {
                    let (keys, vals) = std::mem::take(t).into_iter().unzip();
                    *self = Sub::Vec { keys, vals };
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
        let Sub::Vec { keys, vals } = self else {
            return None;
        };
        let at = keys.binary_search(&ko).ok().filter(|&at| vals[at] == vo)?;
        let to = keys.partition_point(|&x| x < kn);
        if keys.get(to) == Some(&kn) {
            return None;
        }
        if to <= at {
            keys.copy_within(to..at, to + 1);
            vals.copy_within(to..at, to + 1);
            keys[to] = kn;
            vals[to] = vn;
        } else {
            keys.copy_within(at + 1..to, at);
            vals.copy_within(at + 1..to, at);
            keys[to - 1] = kn;
            vals[to - 1] = vn;
        }
        Some(())
    }

    fn get(&self, k: u128) -> Option<u32> {
        match self {
            Sub::Vec { keys, vals } => keys.binary_search(&k).ok().map(|at| vals[at]),
            Sub::Tree(t) => t.get(&k).copied(),
        }
    }

    /// The first entry `≥ (k, v)` (`strict`: `> (k, v)`), as (key, value).
    #[inline]
    fn first_from(&self, k: u128, v: u32, strict: bool) -> Option<(u128, u32)> {
        let after =
            |key: u128, val: u32| key > k || (key == k && (val > v || (!strict && val == v)));
        match self {
            Sub::Vec { keys, vals } => {
                let mut at = keys.partition_point(|&x| x < k);
                if at < keys.len() && !after(keys[at], vals[at]) {
                    at += 1;
                }
                keys.get(at).map(|&key| (key, vals[at]))
            }
            Sub::Tree(t) => t
                .range(k..)
                .map(|(&key, &val)| (key, val))
                .find(|&(key, val)| after(key, val)),
        }
    }

    /// The last entry `< (k, v)`, as (key, value).
    fn last_before(&self, k: u128, v: u32) -> Option<(u128, u32)> {
        let below = |key: u128, val: u32| key < k || (key == k && val < v);
        match self {
            Sub::Vec { keys, vals } => {
                let at = keys.partition_point(|&x| x <= k);
                (0..at)
                    .rev()
                    .map(|i| (keys[i], vals[i]))
                    .find(|&(key, val)| below(key, val))
            }
            Sub::Tree(t) => t
                .range((Bound::Unbounded, Bound::Included(k)))
                .rev()
                .map(|(&key, &val)| (key, val))
                .find(|&(key, val)| below(key, val)),
        }
    }

    fn first(&self) -> Option<(u128, u32)> {
        match self {
            Sub::Vec { keys, vals } => keys.first().map(|&k| (k, vals[0])),
            Sub::Tree(t) => t.first_key_value().map(|(&k, &v)| (k, v)),
        }
    }

    fn last(&self) -> Option<(u128, u32)> {
        match self {
            Sub::Vec { keys, vals } => keys.last().map(|&k| (k, vals[keys.len() - 1])),
            Sub::Tree(t) => t.last_key_value().map(|(&k, &v)| (k, v)),
        }
    }

    fn entries(&self) -> Box<dyn Iterator<Item = (u128, u32)> + '_> {
        match self {
            Sub::Vec { keys, vals } => Box::new(keys.iter().copied().zip(vals.iter().copied())),
            Sub::Tree(t) => Box::new(t.iter().map(|(&k, &v)| (k, v))),
        }
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
        // Almost always one or two streams: a linear scan beats a binary search.
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
                let sub = Sub::Vec {
                    keys: Vec::new(),
                    vals: Vec::new(),
                };
                self.streams.insert(i, (k.0, sub));
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

    /// Every operation agrees with `BTreeSet<SizeKey>` through both forms, the switches between
    /// them, and several streams.
    #[test]
    fn behaves_as_a_btree_set_across_streams_spill_and_unspill() {
        let mut s = SizeIndex::default();
        let mut want: BTreeSet<SizeKey> = BTreeSet::new();
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut rand = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut spilled = false;
        for step in 0..30_000u32 {
            let r = rand();
            // Streams 0, 7 and u64::MAX; sizes and addresses from small ranges so that keys
            // collide; the slab index is a function of the address, as in a pool.
            let stream = [0, 7, u64::MAX][(r % 3) as usize];
            let size = 512 * ((r >> 8) % 40);
            let ptr = (r >> 20) % 3000 * 512 + u64::from(step % 2) * (u64::MAX - (1 << 30));
            let k = (stream, size, ptr, (ptr % 1_000_003) as u32);
            if step < 15_000 && r % 8 == 0 {
                // Replace a present key (or an absent one) by `k`.
                let old = want.range(..k).next_back().copied().unwrap_or(k);
                let old = if r % 16 == 0 {
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
            spilled |= s.streams.iter().any(|(_, sub)| matches!(sub, Sub::Tree(_)));
            assert_eq!(s.len(), want.len());
            let r = rand();
            let probe = (
                [0, 3, 7, u64::MAX][(r % 4) as usize],
                512 * ((r >> 8) % 40),
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
            s.streams
                .iter()
                .all(|(_, sub)| matches!(sub, Sub::Vec { .. })),
            "and came back"
        );
        assert!(s.iter().eq(want.iter().copied()));
    }
}
