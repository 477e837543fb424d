//! [`Units`]: the mapping units of [`super::PagedBestFit`], one per backend `map` call and the
//! only ranges it ever unmaps, and [`cut`], which splits a run of pages into units
//! (`Note [Mapping units]` in [`super`]). Never calls the backend.

use std::collections::BTreeMap;

use super::UNITS_PER_RUN_CAP;

/// Splits the page-aligned run `[a, b)` into mapping units of at most `max` bytes (a multiple
/// of `page`), and into at most `count` units when `count` > 0 (`Note [Mapping units]`): runs
/// up to `max` stay whole, longer ones are cut into `⌈len / max⌉` units (at most `count`) of
/// equal size in pages (the first ones one page longer when the pages do not divide evenly).
/// Never more than [`UNITS_PER_RUN_CAP`] units, whatever `count` is (item 5 of the note).
/// Returns `(start, end)` pairs in address order, in bytes.
pub(crate) fn cut(
    a: u64,
    b: u64,
    page: u64,
    max: u64,
    count: u64,
) -> impl Iterator<Item = (u64, u64)> {
    let pages = (b - a) / page;
    let count = match count {
        0 => UNITS_PER_RUN_CAP,
        n => n.min(UNITS_PER_RUN_CAP),
    };
    let per = (max / page).max(1).max(pages.div_ceil(count));
    let n = pages.div_ceil(per).max(1);
    let (q, r) = (pages / n, pages % n);
    (0..n).scan(a, move |at, i| {
        let len = (q + u64::from(i < r)) * page;
        let unit = (*at, *at + len);
        *at += len;
        Some(unit)
    })
}

/// The live mapping units: `start → end`, in bytes, disjoint, each made by one `map` call.
/// Coalesced mapped memory is [`super::pages::PageMap`]'s business; this only remembers where
/// one mapping ends and the next begins, because the backend unmaps whole mappings only.
#[derive(Debug, Default)]
pub(crate) struct Units {
    units: BTreeMap<u64, u64>,
}

impl Units {
    /// Records the unit `[start, end)` (not overlapping any live unit).
    pub(crate) fn insert(&mut self, start: u64, end: u64) {
        debug_assert!(
            self.units
                .range(..end)
                .next_back()
                .is_none_or(|(_, &e)| e <= start),
            "unit {start:#x}..{end:#x} overlaps a live unit"
        );
        self.units.insert(start, end);
    }

    /// Forgets the units making up `[start, end)`, which must be a union of whole units.
    pub(crate) fn remove(&mut self, start: u64, end: u64) {
        let mut at = start;
        while at < end {
            let e = self
                .units
                .remove(&at)
                .expect("unmapped range starts at a unit");
            debug_assert!(e <= end, "unmapped range splits the unit at {at:#x}");
            at = e;
        }
    }

    /// Whether `[start, end)` is a union of whole live units.
    #[cfg(test)]
    pub(crate) fn is_whole(&self, start: u64, end: u64) -> bool {
        let mut at = start;
        while at < end {
            match self.units.get(&at) {
                Some(&e) if e <= end => at = e,
                _ => return false,
            }
        }
        at == end
    }

    /// The units lying entirely inside `[lo, hi)`, in address order.
    pub(crate) fn within(&self, lo: u64, hi: u64) -> Vec<(u64, u64)> {
        self.units
            .range(lo..hi)
            .map(|(&a, &b)| (a, b))
            .take_while(|&(_, b)| b <= hi)
            .collect()
    }

    /// The maximal runs of adjacent units lying entirely inside `[lo, hi)`, skipping every
    /// unit that overlaps `[exclude.0, exclude.1)`, in address order. Each run is a union of
    /// whole units, so one `unmap` call can take it.
    pub(crate) fn runs_within(&self, lo: u64, hi: u64, exclude: (u64, u64)) -> Vec<(u64, u64)> {
        let mut runs: Vec<(u64, u64)> = Vec::new();
        let mut last_end = None;
        for (&a, &b) in self.units.range(lo..hi) {
            if b > hi {
                break;
            }
            if a < exclude.1 && b > exclude.0 {
                last_end = None;
                continue;
            }
            match runs.last_mut() {
                Some(run) if last_end == Some(a) => run.1 = b,
                _ => runs.push((a, b)),
            }
            last_end = Some(b);
        }
        runs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: u64 = 2 << 20;

    #[test]
    fn short_runs_stay_whole_long_ones_are_cut_evenly() {
        let all = |a, b, max| cut(a, b, P, max, 0).collect::<Vec<_>>();
        assert_eq!(all(0, 3 * P, 32 * P), vec![(0, 3 * P)]);
        assert_eq!(all(0, 32 * P, 32 * P), vec![(0, 32 * P)]);
        // 33 pages, at most 32 per unit: 17 + 16.
        assert_eq!(all(0, 33 * P, 32 * P), vec![(0, 17 * P), (17 * P, 33 * P)]);
        // 2048 pages (4 GiB) at most 32 per unit: 64 units of 32 pages.
        let units = all(10 * P, 2058 * P, 32 * P);
        assert_eq!(units.len(), 64);
        assert!(units.iter().all(|&(a, b)| b - a == 32 * P));
        assert_eq!((units[0].0, units[63].1), (10 * P, 2058 * P));
        assert!(units.windows(2).all(|w| w[0].1 == w[1].0));
    }

    #[test]
    fn long_runs_are_cut_into_at_most_count_units() {
        let all = |a, b, count| cut(a, b, P, 32 * P, count).collect::<Vec<_>>();
        // 2048 pages at most 32 per unit but at most 4 units: 4 units of 512 pages.
        let units = all(0, 2048 * P, 4);
        assert_eq!(units.len(), 4);
        assert!(units.iter().all(|&(a, b)| b - a == 512 * P));
        // 130 pages, at most 4 units: 33 + 33 + 32 + 32 (⌈130 / 4⌉ = 33 pages per unit).
        let units = all(0, 130 * P, 4);
        assert_eq!(
            units.iter().map(|(a, b)| (b - a) / P).collect::<Vec<_>>(),
            vec![33, 33, 32, 32]
        );
        // Under 4 × 32 pages the 32-page bound decides: 100 pages are 4 units of 25.
        assert_eq!(all(0, 100 * P, 4).len(), 4);
        assert_eq!(all(0, 40 * P, 4), vec![(0, 20 * P), (20 * P, 40 * P)]);
    }

    #[test]
    fn no_run_is_cut_into_more_than_the_cap() {
        // 2^35 pages of 2 MiB (64 PiB): 65,536 units of 2^19 pages, whatever the count says.
        let pages = 1u64 << 35;
        for count in [0, 1 << 20] {
            let units: Vec<_> = cut(0, pages * P, P, 16 * P, count).collect();
            assert_eq!(units.len() as u64, UNITS_PER_RUN_CAP);
            assert!(units
                .iter()
                .all(|&(a, b)| b - a == (pages / UNITS_PER_RUN_CAP) * P));
            assert_eq!(units.last().unwrap().1, pages * P);
        }
        // A smaller count still decides.
        assert_eq!(cut(0, pages * P, P, 16 * P, 4).count(), 4);
    }

    #[test]
    fn runs_within_are_unions_of_whole_units() {
        let mut u = Units::default();
        for (a, b) in [(0, 2), (2, 3), (3, 7), (9, 10), (10, 12)] {
            u.insert(a * P, b * P);
        }
        // [1, 11) holds (2,3), (3,7) whole and (9,10) whole; (0,2) and (10,12) stick out.
        assert_eq!(
            u.runs_within(P, 11 * P, (0, 0)),
            vec![(2 * P, 7 * P), (9 * P, 10 * P)]
        );
        // Excluding page 4 drops the unit (3,7) and breaks the run.
        assert_eq!(
            u.runs_within(0, 12 * P, (4 * P, 5 * P)),
            vec![(0, 3 * P), (9 * P, 12 * P)]
        );
        assert!(u.is_whole(2 * P, 7 * P));
        assert!(!u.is_whole(2 * P, 5 * P));
        u.remove(2 * P, 7 * P);
        assert_eq!(u.units.len(), 3);
        assert!(!u.is_whole(2 * P, 3 * P));
    }
}
