//! [`PageMap`]: which pages of [`super::PagedBestFit`]'s address space have physical memory
//! behind them. Never calls the backend; see `Note [Paged best fit]` in [`super`].

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

    /// The first unmapped page at or after `from` up to `limit`: the end of the mapped run that
    /// would follow a mapping ending at `from`.
    pub(crate) fn next_mapped(&self, from: u64, limit: u64) -> u64 {
        let i = self.intervals.partition_point(|&(s, _)| s < from);
        match self.intervals.get(i) {
            Some(&(s, _)) if s < limit => s,
            _ => limit,
        }
    }

    /// The lowest address `a` in `[start, end)` where `[a, a + bytes)` lies inside one mapped
    /// interval and inside `[start, end)`: a place for a block in a free extent that needs no
    /// new page although the extent's two ends would (`Note [Paged best fit]`, step 1).
    pub(crate) fn mapped_fit(&self, start: u64, end: u64, bytes: u64) -> Option<u64> {
        self.touching(page_down(start, self.page), end)
            .map(|(s, e)| (s.max(start), e.min(end)))
            .find(|&(a, e)| e >= a && e - a >= bytes)
            .map(|(a, _)| a)
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
        assert_eq!(m.unmapped_bytes(2 * P + 5, 5 * P), 0);
        assert_eq!(m.unmapped_bytes(2 * P, 5 * P + 1), P);
        m.remove(3 * P, 4 * P);
        assert_eq!(
            m.intervals().collect::<Vec<_>>(),
            vec![(2 * P, 3 * P), (4 * P, 5 * P), (8 * P, 9 * P)]
        );
        assert_eq!(m.mapped, 3 * P);
    }
}
