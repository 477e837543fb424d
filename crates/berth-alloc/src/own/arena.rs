//! Address-space bookkeeping of [`super::PagedBestFit`]: one [`Arena`] of free virtual-address
//! extents per stream, and the [`PageMap`] of which pages have physical memory behind them.
//!
//! Both are plain ordered maps; neither calls the backend. See `Note [Paged best fit]` in
//! [`super`] for the policy that uses them.

use std::collections::{BTreeMap, BTreeSet};

use crate::backend::StreamId;

/// How many best-fit candidates are inspected for one that needs no new pages mapped.
const SCAN: usize = 16;

/// [`SizeIndex`] turns into a B-tree above this many free extents...
const SORTED_MAX: usize = 256;
/// ...and back into a sorted vector below this many.
const SORTED_MIN: usize = 128;

/// Rounds `v` down to a multiple of `page` (a power of two), in bytes.
#[inline]
pub(crate) fn page_down(v: u64, page: u64) -> u64 {
    v & !(page - 1)
}

/// Rounds `v` up to a multiple of `page` (a power of two), in bytes.
#[inline]
pub(crate) fn page_up(v: u64, page: u64) -> u64 {
    (v + page - 1) & !(page - 1)
}

/// The free virtual-address extents of one stream, coalesced, whether mapped or not.
///
/// Indexed twice: by start address (for coalescing on free) and by `(size, start)` (for best
/// fit). Every byte of the stream's reservations is either in exactly one free extent or in a
/// live block.
#[derive(Debug)]
pub(crate) struct Arena {
    /// The stream whose blocks live here.
    pub(crate) stream: StreamId,
    /// Reserved address ranges `(base, bytes)`.
    pub(crate) reservations: Vec<(u64, u64)>,
    /// Free extents by start address.
    by_addr: AddrIndex,
    /// Free extents as `(size, start)`.
    by_size: SizeIndex,
}

impl Arena {
    /// An arena for `stream` with no address space yet.
    pub(crate) fn new(stream: StreamId) -> Self {
        Arena {
            stream,
            reservations: Vec::new(),
            by_addr: AddrIndex::Sorted(Vec::new()),
            by_size: SizeIndex::Sorted(Vec::new()),
        }
    }

    /// Adds a fresh reservation `[base, base + bytes)` as one free extent.
    pub(crate) fn add_reservation(&mut self, base: u64, bytes: u64) {
        self.reservations.push((base, bytes));
        self.insert_free(base, base + bytes);
    }

    /// Whether `addr` lies inside one of this arena's reservations.
    pub(crate) fn owns(&self, addr: u64) -> bool {
        self.reservations
            .iter()
            .any(|&(b, n)| addr >= b && addr < b + n)
    }

    /// Returns `[start, end)` to the free extents, merging with free neighbours.
    #[inline]
    pub(crate) fn insert_free(&mut self, start: u64, end: u64) {
        let (pred, succ) = self.by_addr.free(start, end);
        let (s, e) = (pred.unwrap_or(start), succ.unwrap_or(end));
        let merged = (e - s, s);
        match (pred, succ) {
            (None, None) => self.by_size.insert(merged),
            (Some(ps), None) => self.by_size.replace((start - ps, ps), merged, None),
            (None, Some(ne)) => self.by_size.replace((ne - end, end), merged, None),
            (Some(ps), Some(ne)) => {
                self.by_size.remove((start - ps, ps), None);
                self.by_size.replace((ne - end, end), merged, None);
            }
        }
    }

    /// Takes `[at, at + bytes)` out of the free extent `[start, end)` (in the size index's
    /// sorted vector at `hint` when given).
    #[inline]
    fn carve(&mut self, start: u64, end: u64, at: u64, bytes: u64, hint: Option<usize>) {
        self.by_addr.take(start, end, at, at + bytes);
        let old = (end - start, start);
        let head = (at > start).then_some((at - start, start));
        let tail = (at + bytes < end).then_some((end - at - bytes, at + bytes));
        match (head, tail) {
            (None, None) => self.by_size.remove(old, hint),
            (Some(k), None) | (None, Some(k)) => self.by_size.replace(old, k, hint),
            (Some(h), Some(t)) => {
                self.by_size.replace(old, h, hint);
                self.by_size.insert(t);
            }
        }
    }

    /// Places a block of `bytes` bytes: best fit by size, preferring among the first
    /// [`SCAN`] candidates the placement (start or end of an extent) that needs the fewest
    /// unmapped bytes. Returns the block's address and its unmapped bytes, or `None` when no
    /// extent is large enough.
    pub(crate) fn place(&mut self, bytes: u64, pages: &PageMap) -> Option<(u64, u64)> {
        let mut best: Option<(u64, u64, u64, u64, Option<usize>)> = None;
        for ((size, start), hint) in self.by_size.at_least(bytes).take(SCAN) {
            let end = start + size;
            let head = pages.unmapped_bytes(start, start + bytes);
            if head == 0 {
                best = Some((0, start, end, start, hint));
                break;
            }
            let tail = pages.unmapped_bytes(end - bytes, end);
            let (cost, at) = if tail < head {
                (tail, end - bytes)
            } else {
                (head, start)
            };
            if best.is_none_or(|b| cost < b.0) {
                best = Some((cost, start, end, at, hint));
            }
            if cost == 0 {
                break;
            }
        }
        let (cost, start, end, at, hint) = best?;
        self.carve(start, end, at, bytes, hint);
        Some((at, cost))
    }

    /// The free extents `(start, end)` in address order.
    pub(crate) fn free_extents(&self) -> Vec<(u64, u64)> {
        match &self.by_addr {
            AddrIndex::Sorted(v) => v.clone(),
            AddrIndex::Tree(t) => t.iter().map(|(&s, &e)| (s, e)).collect(),
        }
    }

    /// Total free bytes (mapped or not).
    #[cfg(test)]
    pub(crate) fn free_bytes(&self) -> u64 {
        self.free_extents().iter().map(|(s, e)| e - s).sum()
    }
}

/// Free extents `(start, end)` ordered by address: a sorted vector while there are few, a
/// B-tree map start → end while there are many (as [`SizeIndex`]).
#[derive(Debug)]
enum AddrIndex {
    Sorted(Vec<(u64, u64)>),
    Tree(BTreeMap<u64, u64>),
}

impl AddrIndex {
    /// Adds the free range `[start, end)`, merged with the free extents that end at `start` or
    /// begin at `end` (free extents never touch). Returns the merged neighbours: the start of
    /// the one before and the end of the one after.
    #[inline]
    fn free(&mut self, start: u64, end: u64) -> (Option<u64>, Option<u64>) {
        match self {
            AddrIndex::Sorted(v) => {
                let i = v.partition_point(|&(s, _)| s < start);
                let pred = (i > 0 && v[i - 1].1 == start).then(|| v[i - 1].0);
                let succ = v.get(i).filter(|x| x.0 == end).map(|x| x.1);
                match (pred, succ) {
                    (Some(_), Some(ne)) => {
                        v[i - 1].1 = ne;
                        v.remove(i);
                    }
                    (Some(_), None) => v[i - 1].1 = end,
                    (None, Some(_)) => v[i].0 = start,
                    (None, None) => {
                        v.insert(i, (start, end));
                        if v.len() > SORTED_MAX {
                            let tree = v.drain(..).collect();
                            *self = AddrIndex::Tree(tree);
                        }
                    }
                }
                (pred, succ)
            }
            AddrIndex::Tree(t) => {
                let pred = t
                    .range(..start)
                    .next_back()
                    .filter(|x| *x.1 == start)
                    .map(|x| *x.0);
                let succ = t.remove(&end);
                t.insert(pred.unwrap_or(start), succ.unwrap_or(end));
                if t.len() < SORTED_MIN {
                    let sorted = std::mem::take(t).into_iter().collect();
                    *self = AddrIndex::Sorted(sorted);
                }
                (pred, succ)
            }
        }
    }

    /// Takes `[lo, hi)` out of the free extent `[start, end)`.
    #[inline]
    fn take(&mut self, start: u64, end: u64, lo: u64, hi: u64) {
        match self {
            AddrIndex::Sorted(v) => {
                let i = v.partition_point(|&(s, _)| s < start);
                debug_assert_eq!(v.get(i), Some(&(start, end)), "take: extent is free");
                match (lo > start, hi < end) {
                    (false, false) => {
                        v.remove(i);
                    }
                    (true, false) => v[i].1 = lo,
                    (false, true) => v[i].0 = hi,
                    (true, true) => {
                        v[i].1 = lo;
                        v.insert(i + 1, (hi, end));
                        if v.len() > SORTED_MAX {
                            let tree = v.drain(..).collect();
                            *self = AddrIndex::Tree(tree);
                        }
                    }
                }
            }
            AddrIndex::Tree(t) => {
                t.remove(&start);
                if lo > start {
                    t.insert(start, lo);
                }
                if hi < end {
                    t.insert(hi, end);
                }
                if t.len() < SORTED_MIN {
                    let sorted = std::mem::take(t).into_iter().collect();
                    *self = AddrIndex::Sorted(sorted);
                }
            }
        }
    }
}

/// Free extents ordered by `(size, start)`: a sorted vector while there are few (a few dozen
/// on the real traces, where it beats a B-tree several times over), a B-tree while there are
/// many (so that one change never moves thousands of entries). Keys are packed into one `u128`
/// (size high, start low: the same order) so that comparisons do not branch.
#[derive(Debug)]
enum SizeIndex {
    Sorted(Vec<u128>),
    Tree(BTreeSet<u128>),
}

/// `(size, start)` as a [`SizeIndex`] key.
#[inline]
fn pack((size, start): (u64, u64)) -> u128 {
    (u128::from(size) << 64) | u128::from(start)
}

/// The `(size, start)` of a [`SizeIndex`] key.
#[inline]
fn unpack(key: u128) -> (u64, u64) {
    ((key >> 64) as u64, key as u64)
}

impl SizeIndex {
    /// The extents of at least `bytes` bytes in `(size, start)` order, each with its position
    /// in the sorted vector (for [`SizeIndex::replace`]'s hint).
    #[inline]
    fn at_least(&self, bytes: u64) -> SizeIter<'_> {
        match self {
            SizeIndex::Sorted(v) => {
                let from = v.partition_point(|&k| k < pack((bytes, 0)));
                SizeIter::Sorted(v[from..].iter().enumerate(), from)
            }
            SizeIndex::Tree(t) => SizeIter::Tree(t.range(pack((bytes, 0))..)),
        }
    }

    /// Position of `key` (present) in the sorted vector `v`; `hint` when given.
    #[inline]
    fn position(v: &[u128], key: u128, hint: Option<usize>) -> usize {
        let i = hint.unwrap_or_else(|| v.partition_point(|&k| k < key));
        debug_assert_eq!(v.get(i), Some(&key), "SizeIndex: key is present");
        i
    }

    /// Adds `key` (not present).
    #[inline]
    fn insert(&mut self, key: (u64, u64)) {
        let key = pack(key);
        match self {
            SizeIndex::Sorted(v) => {
                let i = v.partition_point(|&k| k < key);
                v.insert(i, key);
                if v.len() > SORTED_MAX {
                    let tree = v.drain(..).collect();
                    *self = SizeIndex::Tree(tree);
                }
            }
            SizeIndex::Tree(t) => {
                t.insert(key);
            }
        }
    }

    /// Removes `key` (present; in the sorted vector at `hint` when given).
    #[inline]
    fn remove(&mut self, key: (u64, u64), hint: Option<usize>) {
        let key = pack(key);
        match self {
            SizeIndex::Sorted(v) => {
                let i = Self::position(v, key, hint);
                v.remove(i);
            }
            SizeIndex::Tree(t) => {
                t.remove(&key);
                if t.len() < SORTED_MIN {
                    let sorted = std::mem::take(t).into_iter().collect();
                    *self = SizeIndex::Sorted(sorted);
                }
            }
        }
    }

    /// Replaces `old` (present; in the sorted vector at `hint` when given) by `new` (not
    /// present): one shift of the entries between them.
    #[inline]
    fn replace(&mut self, old: (u64, u64), new: (u64, u64), hint: Option<usize>) {
        let (old, new) = (pack(old), pack(new));
        match self {
            SizeIndex::Sorted(v) => {
                let i = Self::position(v, old, hint);
                if new < old {
                    let j = v[..i].partition_point(|&k| k < new);
                    v.copy_within(j..i, j + 1);
                    v[j] = new;
                } else {
                    let j = i + v[i + 1..].partition_point(|&k| k < new);
                    v.copy_within(i + 1..=j, i);
                    v[j] = new;
                }
            }
            SizeIndex::Tree(t) => {
                t.remove(&old);
                t.insert(new);
            }
        }
    }

    /// Every key in order (tests).
    #[cfg(test)]
    fn to_vec(&self) -> Vec<(u64, u64)> {
        match self {
            SizeIndex::Sorted(v) => v.iter().map(|&k| unpack(k)).collect(),
            SizeIndex::Tree(t) => t.iter().map(|&k| unpack(k)).collect(),
        }
    }
}

/// [`SizeIndex::at_least`]: `((size, start), position in the sorted vector)`.
enum SizeIter<'a> {
    Sorted(std::iter::Enumerate<std::slice::Iter<'a, u128>>, usize),
    Tree(std::collections::btree_set::Range<'a, u128>),
}

impl Iterator for SizeIter<'_> {
    type Item = ((u64, u64), Option<usize>);

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        match self {
            SizeIter::Sorted(it, from) => it.next().map(|(i, &k)| (unpack(k), Some(*from + i))),
            SizeIter::Tree(it) => it.next().map(|&k| (unpack(k), None)),
        }
    }
}

/// Which address ranges have physical memory mapped: coalesced intervals `(start, end)`, in
/// bytes, all multiples of the page size, sorted by address.
///
/// A sorted vector: there are few intervals (one per mapped segment), lookups happen on every
/// allocation and changes only with a backend `map` / `unmap` call.
#[derive(Debug)]
pub(crate) struct PageMap {
    /// Page size in bytes (a power of two).
    pub(crate) page: u64,
    intervals: Vec<(u64, u64)>,
    /// Mapped bytes in total.
    pub(crate) mapped: u64,
}

impl PageMap {
    /// An empty map with pages of `page` bytes.
    pub(crate) fn new(page: u64) -> Self {
        PageMap {
            page,
            intervals: Vec::new(),
            mapped: 0,
        }
    }

    /// Index of the first interval that may touch `[lo, ..)`: the last one starting at or
    /// before `lo`, or else the first one after it.
    #[inline]
    fn first_touching(&self, lo: u64) -> usize {
        self.intervals
            .partition_point(|&(s, _)| s <= lo)
            .saturating_sub(1)
    }

    /// The intervals that may overlap the page-aligned `[lo, hi)`, in address order.
    #[inline]
    fn touching(&self, lo: u64, hi: u64) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.intervals[self.first_touching(lo)..]
            .iter()
            .copied()
            .take_while(move |&(s, _)| s < hi)
    }

    /// Bytes of whole pages touching `[start, end)` that are not mapped.
    #[inline]
    pub(crate) fn unmapped_bytes(&self, start: u64, end: u64) -> u64 {
        let (lo, hi) = (page_down(start, self.page), page_up(end, self.page));
        let i = self.first_touching(lo);
        if let Some(&(s, e)) = self.intervals.get(i) {
            if s <= lo && e >= hi {
                return 0;
            }
        }
        let mut unmapped = 0;
        let mut x = lo;
        for (s, e) in self.touching(lo, hi) {
            if e <= x {
                continue;
            }
            if s > x {
                unmapped += s.min(hi) - x;
            }
            x = x.max(e);
            if x >= hi {
                break;
            }
        }
        if x < hi {
            unmapped += hi - x;
        }
        unmapped
    }

    /// The unmapped page runs inside the page-aligned range `[lo, hi)`.
    pub(crate) fn unmapped_runs(&self, lo: u64, hi: u64) -> Vec<(u64, u64)> {
        let mut runs = Vec::new();
        let mut x = lo;
        for (s, e) in self.touching(lo, hi) {
            if e <= x {
                continue;
            }
            if s > x {
                runs.push((x, s.min(hi)));
            }
            x = x.max(e);
            if x >= hi {
                break;
            }
        }
        if x < hi {
            runs.push((x, hi));
        }
        runs
    }

    /// The mapped runs inside the page-aligned range `[lo, hi)`.
    pub(crate) fn mapped_runs(&self, lo: u64, hi: u64) -> Vec<(u64, u64)> {
        self.touching(lo, hi)
            .filter_map(|(s, e)| {
                let (a, b) = (s.max(lo), e.min(hi));
                (a < b).then_some((a, b))
            })
            .collect()
    }

    /// The first unmapped page at or after `from` up to `limit`: the end of the mapped run that
    /// would follow a mapping ending at `from`.
    pub(crate) fn next_mapped(&self, from: u64, limit: u64) -> u64 {
        let i = self.intervals.partition_point(|&(s, _)| s < from);
        match self.intervals.get(i) {
            Some(&(s, _)) if s < limit => s,
            _ => limit,
        }
    }

    /// Records `[start, end)` (entirely unmapped) as mapped.
    pub(crate) fn insert(&mut self, start: u64, end: u64) {
        self.mapped += end - start;
        let i = self.intervals.partition_point(|&(s, _)| s < start);
        let pred = i > 0 && self.intervals[i - 1].1 == start;
        let succ = i < self.intervals.len() && self.intervals[i].0 == end;
        match (pred, succ) {
            (true, true) => {
                self.intervals[i - 1].1 = self.intervals[i].1;
                self.intervals.remove(i);
            }
            (true, false) => self.intervals[i - 1].1 = end,
            (false, true) => self.intervals[i].0 = start,
            (false, false) => self.intervals.insert(i, (start, end)),
        }
    }

    /// Records `[start, end)` (entirely mapped) as unmapped.
    pub(crate) fn remove(&mut self, start: u64, end: u64) {
        self.mapped -= end - start;
        let i = self
            .intervals
            .partition_point(|&(s, _)| s <= start)
            .checked_sub(1)
            .expect("remove: range is mapped");
        let (s, e) = self.intervals[i];
        debug_assert!(s <= start && end <= e, "remove: range is mapped");
        match (s < start, end < e) {
            (true, true) => {
                self.intervals[i].1 = start;
                self.intervals.insert(i + 1, (end, e));
            }
            (true, false) => self.intervals[i].1 = start,
            (false, true) => self.intervals[i].0 = end,
            (false, false) => {
                self.intervals.remove(i);
            }
        }
    }

    /// How many separate mapped intervals there are (PyTorch's segment count for this policy).
    pub(crate) fn interval_count(&self) -> usize {
        self.intervals.len()
    }

    /// The mapped intervals `(start, end)` in address order.
    pub(crate) fn intervals(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.intervals.iter().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: u64 = 2 << 20;

    #[test]
    fn arena_coalesces_both_sides() {
        let mut a = Arena::new(StreamId(0));
        a.add_reservation(0, 10 * P);
        let pages = PageMap::new(P);
        let x = a.place(P, &pages).unwrap().0;
        let y = a.place(P, &pages).unwrap().0;
        let z = a.place(P, &pages).unwrap().0;
        assert_eq!((x, y, z), (0, P, 2 * P));
        a.insert_free(x, x + P);
        a.insert_free(z, z + P);
        a.insert_free(y, y + P);
        assert_eq!(a.free_extents(), vec![(0, 10 * P)]);
        assert_eq!(a.free_bytes(), 10 * P);
    }

    #[test]
    fn place_prefers_mapped_extent() {
        let mut a = Arena::new(StreamId(0));
        a.add_reservation(0, 100 * P);
        let mut pages = PageMap::new(P);
        // Two free holes of 3 pages: [10P, 13P) unmapped, [20P, 23P) mapped.
        let _ = a.place(100 * P, &pages).unwrap();
        a.insert_free(10 * P, 13 * P);
        a.insert_free(20 * P, 23 * P);
        pages.insert(20 * P, 23 * P);
        assert_eq!(a.place(3 * P, &pages), Some((20 * P, 0)));
        assert_eq!(a.place(3 * P, &pages), Some((10 * P, 3 * P)));
        assert_eq!(a.place(P, &pages), None);
    }

    #[test]
    fn page_map_runs_and_removal() {
        let mut m = PageMap::new(P);
        m.insert(2 * P, 4 * P);
        m.insert(4 * P, 5 * P);
        m.insert(8 * P, 9 * P);
        assert_eq!(m.mapped, 4 * P);
        assert_eq!(
            m.unmapped_runs(0, 10 * P),
            vec![(0, 2 * P), (5 * P, 8 * P), (9 * P, 10 * P)]
        );
        assert_eq!(
            m.mapped_runs(3 * P, 9 * P),
            vec![(3 * P, 5 * P), (8 * P, 9 * P)]
        );
        assert_eq!(m.unmapped_bytes(2 * P + 5, 5 * P), 0);
        assert_eq!(m.unmapped_bytes(2 * P, 5 * P + 1), P);
        m.remove(3 * P, 4 * P);
        assert_eq!(
            m.intervals().collect::<Vec<_>>(),
            vec![(2 * P, 3 * P), (4 * P, 5 * P), (8 * P, 9 * P)]
        );
        assert_eq!(m.mapped, 3 * P);
    }

    #[test]
    fn size_index_matches_a_btree_across_both_forms() {
        let mut idx = SizeIndex::Sorted(Vec::new());
        let mut model = BTreeSet::new();
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut rand = move |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        let (mut went_tree, mut came_back) = (false, false);
        for step in 0..20_000u64 {
            // Grow to ~600 entries, then shrink to ~0, twice.
            let grow = (step / 5_000) % 2 == 0;
            let present: Vec<(u64, u64)> = model.iter().copied().collect();
            let pick = |r: u64| present[(r % present.len() as u64) as usize];
            match rand(4) {
                0 | 1 if grow || present.is_empty() => {
                    let k = (512 * (1 + rand(64)), step * 4096);
                    idx.insert(k);
                    model.insert(k);
                }
                0 | 1 => {
                    let k = pick(rand(1 << 30));
                    idx.remove(k, None);
                    model.remove(&k);
                }
                _ if present.is_empty() => {}
                _ => {
                    let old = pick(rand(1 << 30));
                    let new = (512 * (1 + rand(64)), old.1 + 1);
                    idx.replace(old, new, None);
                    model.remove(&old);
                    model.insert(new);
                }
            }
            match &idx {
                SizeIndex::Sorted(_) => came_back |= went_tree,
                SizeIndex::Tree(_) => went_tree = true,
            }
            let got = idx.to_vec();
            assert_eq!(
                got,
                model.iter().copied().collect::<Vec<_>>(),
                "step {step}"
            );
        }
        assert!(went_tree && came_back, "both forms exercised");
    }

    /// The arena as first written (two B-trees), as a model for the faster indexes.
    struct ModelArena {
        by_addr: BTreeMap<u64, u64>,
        by_size: BTreeSet<(u64, u64)>,
    }

    impl ModelArena {
        fn insert_free(&mut self, mut start: u64, mut end: u64) {
            if let Some((&ps, &pe)) = self.by_addr.range(..start).next_back() {
                if pe == start {
                    self.by_addr.remove(&ps);
                    self.by_size.remove(&(pe - ps, ps));
                    start = ps;
                }
            }
            if let Some(ne) = self.by_addr.remove(&end) {
                self.by_size.remove(&(ne - end, end));
                end = ne;
            }
            self.by_addr.insert(start, end);
            self.by_size.insert((end - start, start));
        }

        fn place(&mut self, bytes: u64, pages: &PageMap) -> Option<(u64, u64)> {
            let mut best: Option<(u64, u64, u64)> = None; // (cost, extent start, placement)
            for &(_, start) in self.by_size.range((bytes, 0)..).take(SCAN) {
                let end = self.by_addr[&start];
                let head = pages.unmapped_bytes(start, start + bytes);
                if head == 0 {
                    best = Some((0, start, start));
                    break;
                }
                let tail = pages.unmapped_bytes(end - bytes, end);
                let (cost, at) = if tail < head {
                    (tail, end - bytes)
                } else {
                    (head, start)
                };
                if best.is_none_or(|b| cost < b.0) {
                    best = Some((cost, start, at));
                }
                if cost == 0 {
                    break;
                }
            }
            let (cost, start, at) = best?;
            let end = self.by_addr[&start];
            self.by_addr.remove(&start);
            self.by_size.remove(&(end - start, start));
            if at > start {
                self.by_addr.insert(start, at);
                self.by_size.insert((at - start, start));
            }
            if at + bytes < end {
                self.by_addr.insert(at + bytes, end);
                self.by_size.insert((end - at - bytes, at + bytes));
            }
            Some((at, cost))
        }
    }

    #[test]
    fn arena_matches_the_b_tree_model_across_both_forms() {
        let mut a = Arena::new(StreamId(0));
        let mut m = ModelArena {
            by_addr: BTreeMap::new(),
            by_size: BTreeSet::new(),
        };
        a.add_reservation(1 << 30, 1 << 30);
        m.insert_free(1 << 30, 2 << 30);
        let mut pages = PageMap::new(P);
        pages.insert((1 << 30) + 4 * P, (1 << 30) + 40 * P);
        pages.insert((1 << 30) + 64 * P, (1 << 30) + 65 * P);
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut rand = move |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        let mut live: Vec<(u64, u64)> = Vec::new();
        let (mut went_tree, mut came_back) = (false, false);
        for step in 0..40_000u64 {
            // Phases of mostly allocating (many holes: B-tree form) and mostly freeing.
            let alloc_bias = if (step / 10_000) % 2 == 0 { 3 } else { 1 };
            if live.is_empty() || rand(4) < alloc_bias {
                let classes = if rand(8) == 0 { 8192 } else { 64 };
                let bytes = 512 * (1 + rand(classes));
                let got = a.place(bytes, &pages);
                assert_eq!(got, m.place(bytes, &pages), "step {step}");
                if let Some((at, _)) = got {
                    live.push((at, bytes));
                }
            } else {
                let (at, bytes) = live.swap_remove(rand(live.len() as u64) as usize);
                a.insert_free(at, at + bytes);
                m.insert_free(at, at + bytes);
            }
            let model: Vec<(u64, u64)> = m.by_addr.iter().map(|(&s, &e)| (s, e)).collect();
            assert_eq!(a.free_extents(), model, "step {step}");
            let model: Vec<(u64, u64)> = m.by_size.iter().copied().collect();
            assert_eq!(a.by_size.to_vec(), model, "step {step}");
            match (&a.by_addr, &a.by_size) {
                (AddrIndex::Tree(_), SizeIndex::Tree(_)) => went_tree = true,
                (AddrIndex::Sorted(_), SizeIndex::Sorted(_)) => came_back |= went_tree,
                _ => panic!("step {step}: both indexes switch form together"),
            }
        }
        assert!(went_tree && came_back, "both forms exercised");
    }
}
