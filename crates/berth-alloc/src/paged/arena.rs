//! Address-space bookkeeping of [`super::PagedBestFit`]: one [`Arena`] of free virtual-address
//! extents per stream. It never calls the backend; see `Note [Paged best fit]` in [`super`] for
//! the policy that uses it and [`super::pages::PageMap`] for what is mapped.
//!
//! # Note [Constant-time arena]
//! Every operation costs the same however many blocks are live or free: extents are found by
//! size through segregated class lists ([`SizeBins`], `Note [Size classes]`) and their address
//! neighbours through two hash maps, start → extent and end → extent, as PyTorch finds a
//! block's neighbours through its `prev` / `next` pointers. Nothing is ordered by address, so
//! nothing costs `log n`; the price is that listing the extents in address order
//! ([`Arena::free_extents`], used only when unmapping and for snapshots) sorts them.

use super::bins::{class_of, is_exact, Node, SizeBins, NIL};
use super::pages::PageMap;
use crate::addr_map::AddrMap;
use crate::backend::StreamId;

/// At most this many fitting extents are inspected for one that needs fewer new pages mapped,
/// and at most this many too-small ones in the request's own (inexact) class.
const SCAN: usize = 16;

/// In a class of one size, the lowest-addressed of this many extents at the head of its list is
/// tried first. Lower addresses keep live blocks packed, so whole pages higher up fall free for
/// unmapping (on `gpt2_generate`, taking the head alone costs 6 MiB of peak); looking further
/// than 4 changes peaks by under 0.05% on the five traces and costs a cache miss per extent
/// looked at when there are many (`Note [Constant-time arena]`).
const EXACT_SCAN: usize = 4;

/// The `pair` of an arena slot whose pool was forgotten: no pool pair is this large
/// (`crate::caching::private_pools` allows fewer than `u16::MAX / 2`).
pub(crate) const RETIRED: u16 = u16::MAX;

/// The free virtual-address extents of one stream in one pool and tag, coalesced, whether mapped or not. Every byte
/// of the stream's reservations is either in exactly one free extent or in a live block.
/// See `Note [Constant-time arena]`.
#[derive(Debug)]
pub(crate) struct Arena {
    /// The stream whose blocks live here.
    pub(crate) stream: StreamId,
    /// The pool pair it belongs to: 0 for the general pool, `k` for private pool `k`
    /// (`Note [Private pools in paged]` in [`super::pools`]); [`RETIRED`] for a slot whose
    /// pool was forgotten, kept for reuse.
    pub(crate) pair: u16,
    /// The tag of the allocations it serves: 0 for untagged, else an index of the policy's
    /// tag table (`Note [Sleep and wake]` in [`super::sleep`]).
    pub(crate) tag: u32,
    /// Reserved address ranges `(base, bytes)`.
    pub(crate) reservations: Vec<(u64, u64)>,
    /// The free extents by size class.
    bins: SizeBins,
    /// Slot in `bins` of the free extent starting at each address.
    by_start: AddrMap<u32>,
    /// Slot in `bins` of the free extent ending at each address.
    by_end: AddrMap<u32>,
}

impl Arena {
    /// An arena for `stream` in pool pair `pair` and tag `tag`, with no address space yet.
    pub(crate) fn new(stream: StreamId, pair: u16, tag: u32) -> Self {
        Arena {
            stream,
            pair,
            tag,
            reservations: Vec::new(),
            bins: SizeBins::default(),
            by_start: AddrMap::default(),
            by_end: AddrMap::default(),
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

    /// Records `[start, end)` as one free extent (its neighbours are not free).
    #[inline]
    fn add(&mut self, start: u64, end: u64) {
        let slot = self.bins.insert(start, end);
        self.by_start.insert(start, slot);
        self.by_end.insert(end, slot);
    }

    /// Returns `[start, end)` to the free extents, merging with free neighbours. A merged
    /// extent keeps a neighbour's slot, so the neighbour's outer boundary stays in its map.
    #[inline]
    pub(crate) fn insert_free(&mut self, start: u64, end: u64) {
        let pred = self.by_end.remove(&start);
        let succ = self.by_start.remove(&end);
        match (pred, succ) {
            (None, None) => self.add(start, end),
            (Some(p), None) => {
                let s = self.bins.node(p).start;
                self.bins.set(p, s, end);
                self.by_end.insert(end, p);
            }
            (None, Some(q)) => {
                let e = self.bins.node(q).end;
                self.bins.set(q, start, e);
                self.by_start.insert(start, q);
            }
            (Some(p), Some(q)) => {
                let s = self.bins.node(p).start;
                let e = self.bins.remove(q).end;
                self.bins.set(p, s, e);
                self.by_end.insert(e, p);
            }
        }
    }

    /// Takes `[at, at + bytes)` out of the free extent in `slot`; what is left on either side
    /// stays free (the part before it keeps the slot).
    #[inline]
    fn carve(&mut self, slot: u32, at: u64, bytes: u64) {
        let Node { start, end, .. } = *self.bins.node(slot);
        let hi = at + bytes;
        match (at > start, hi < end) {
            (false, false) => {
                self.bins.remove(slot);
                self.by_start.remove(&start);
                self.by_end.remove(&end);
            }
            (true, false) => {
                self.bins.set(slot, start, at);
                self.by_end.remove(&end);
                self.by_end.insert(at, slot);
            }
            (false, true) => {
                self.bins.set(slot, hi, end);
                self.by_start.remove(&start);
                self.by_start.insert(hi, slot);
            }
            (true, true) => {
                self.bins.set(slot, start, at);
                self.by_end.insert(at, slot);
                let tail = self.bins.insert(hi, end);
                self.by_start.insert(hi, tail);
                self.by_end.insert(end, tail);
            }
        }
    }

    /// Takes `[at, at + bytes)` out of the free extent holding all of it; `false` (nothing
    /// changed) when no free extent does. Looks at every free extent: for restoring a pool
    /// checkpoint, not for the hot path.
    pub(crate) fn take_at(&mut self, at: u64, bytes: u64) -> bool {
        let Some(end) = at.checked_add(bytes) else {
            return false;
        };
        let found = self.by_start.iter().find_map(|(&start, &slot)| {
            (start <= at && end <= self.bins.node(slot).end).then_some(slot)
        });
        match found {
            Some(slot) => {
                self.carve(slot, at, bytes);
                true
            }
            None => false,
        }
    }

    /// Places a block of `bytes` bytes (a multiple of 512) and returns its address and its
    /// unmapped bytes, or `None` when no free extent is large enough.
    ///
    /// Good fit by size class (`Note [Size classes]`): candidates are the extents of the
    /// request's class that fit, then those of the classes above it, in list order; among the
    /// first [`SCAN`] the one needing the fewest unmapped bytes wins (placed at the start or
    /// the end of its extent, whichever needs fewer, or where a mapped run inside the extent
    /// holds it when neither end is mapped), ties going to the smaller extent, then to
    /// the lower address. Up to 1 MiB a class holds one size only: there the lowest-addressed of
    /// its first [`EXACT_SCAN`] extents, when mapped, ends the search at once.
    pub(crate) fn place(&mut self, bytes: u64, pages: &PageMap) -> Option<(u64, u64)> {
        // (unmapped bytes, extent size, slot, address)
        let mut best: Option<(u64, u64, u32, u64, u64)> = None;
        let mut fitting = 0;
        let mut class = self.bins.next_class(class_of(bytes));
        'classes: while let Some(c) = class {
            if is_exact(c) {
                // Every extent here fits and has the same size: the lowest-addressed of the
                // first few wins if it needs no new page, and then no other needs computing.
                let (start, slot) = self.bins.min_start(c, EXACT_SCAN.min(SCAN - fitting));
                if pages.unmapped_bytes(start, start + bytes) == 0 {
                    self.carve(slot, start, bytes);
                    return Some((start, 0));
                }
            }
            let (mut slot, mut too_small) = (self.bins.head(c), 0);
            while slot != NIL {
                let n = *self.bins.node(slot);
                let size = n.end - n.start;
                if size >= bytes {
                    fitting += 1;
                    let head = pages.unmapped_bytes(n.start, n.start + bytes);
                    let (cost, at) = if head == 0 {
                        (0, n.start)
                    } else {
                        let tail = pages.unmapped_bytes(n.end - bytes, n.end);
                        if tail == 0 {
                            (0, n.end - bytes)
                        } else if let Some(a) = pages.mapped_fit(n.start, n.end, bytes) {
                            // Mapped memory inside the extent, where neither end is mapped
                            // enough: placing there maps nothing (an extent coalesces mapped
                            // and unmapped free space, so its ends say little about its middle).
                            (0, a)
                        } else if tail < head {
                            (tail, n.end - bytes)
                        } else {
                            (head, n.start)
                        }
                    };
                    if best.is_none_or(|b| (cost, size, n.start) < (b.0, b.1, b.4)) {
                        best = Some((cost, size, slot, at, n.start));
                    }
                    if fitting == SCAN {
                        break 'classes;
                    }
                } else {
                    // Only the request's own class can hold extents too small for it.
                    too_small += 1;
                    if too_small == SCAN {
                        break;
                    }
                }
                slot = n.next;
            }
            if best.is_some_and(|b| b.0 == 0) {
                break; // every later class holds larger extents only
            }
            class = self.bins.next_class(c + 1);
        }
        let (cost, _, slot, at, _) = best?;
        self.carve(slot, at, bytes);
        Some((at, cost))
    }

    /// The free extents `(start, end)` in address order (sorts them: not for hot paths).
    pub(crate) fn free_extents(&self) -> Vec<(u64, u64)> {
        let mut v = self.bins.extents();
        v.sort_unstable();
        v
    }

    /// Total free bytes (mapped or not).
    #[cfg(test)]
    pub(crate) fn free_bytes(&self) -> u64 {
        self.free_extents().iter().map(|(s, e)| e - s).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: u64 = 2 << 20;

    #[test]
    fn arena_coalesces_both_sides() {
        let mut a = Arena::new(StreamId(0), 0, 0);
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
        let mut a = Arena::new(StreamId(0), 0, 0);
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

    /// A free extent whose two ends are unmapped but whose middle is mapped (an extent coalesces
    /// mapped and unmapped free space): the block goes to the mapped middle and maps nothing.
    /// Found on a diffusion `UNet` trace, where a 64 MiB request mapped new pages beside a fully
    /// mapped free gigabyte.
    #[test]
    fn place_uses_mapped_memory_inside_an_extent() {
        let mut a = Arena::new(StreamId(0), 0, 0);
        a.add_reservation(0, 100 * P);
        let mut pages = PageMap::new(P);
        pages.insert(40 * P, 50 * P);
        assert_eq!(a.place(4 * P, &pages), Some((40 * P, 0)));
        // The rest of the mapped run still holds 6 pages; 7 do not fit in it.
        assert_eq!(a.place(6 * P, &pages), Some((44 * P, 0)));
        assert_eq!(
            a.place(7 * P, &pages).map(|(_, unmapped)| unmapped),
            Some(7 * P)
        );
    }

    /// Free extents as a brute-force model: a sorted list, coalesced by hand.
    fn model_free(free: &mut Vec<(u64, u64)>, start: u64, end: u64) {
        free.push((start, end));
        free.sort_unstable();
        let mut out: Vec<(u64, u64)> = Vec::new();
        for &(s, e) in free.iter() {
            match out.last_mut() {
                Some(last) if last.1 == s => last.1 = e,
                _ => out.push((s, e)),
            }
        }
        *free = out;
    }

    #[test]
    fn arena_matches_a_brute_force_model_with_many_extents() {
        let mut a = Arena::new(StreamId(0), 0, 0);
        let base = 1u64 << 30;
        a.add_reservation(base, 1 << 30);
        let mut free = vec![(base, base + (1 << 30))];
        // Everything mapped: placement is then by size alone, so exact fits are checkable.
        let mut pages = PageMap::new(P);
        pages.insert(base, base + (1 << 30));
        let mut next = crate::testing::xorshift(0x2545_f491_4f6c_dd1d);
        let mut rand = move |n: u64| next() % n;
        let mut live: Vec<(u64, u64)> = Vec::new();
        let mut max_extents = 0;
        for step in 0..30_000u64 {
            // Phases of mostly allocating (thousands of holes) and mostly freeing.
            let alloc_bias = if (step / 7_500) % 2 == 0 { 3 } else { 1 };
            if live.is_empty() || rand(4) < alloc_bias {
                let classes = if rand(8) == 0 { 8192 } else { 64 };
                let bytes = 512 * (1 + rand(classes));
                let got = a.place(bytes, &pages);
                let fits: Vec<(u64, u64)> = free
                    .iter()
                    .copied()
                    .filter(|&(s, e)| e - s >= bytes)
                    .collect();
                let Some((at, cost)) = got else {
                    assert!(fits.is_empty(), "step {step}: None although an extent fits");
                    continue;
                };
                assert_eq!(cost, 0, "everything is mapped");
                let i = free
                    .iter()
                    .position(|&(s, e)| s <= at && at + bytes <= e)
                    .unwrap_or_else(|| panic!("step {step}: block at {at:#x} is not free"));
                let (s, e) = free[i];
                assert!(
                    at == s || at + bytes == e,
                    "step {step}: at an end of its extent"
                );
                if bytes <= 1 << 20 && fits.iter().any(|&(s, e)| e - s == bytes) {
                    assert_eq!(
                        e - s,
                        bytes,
                        "step {step}: an exact fit exists and is taken"
                    );
                }
                // Good fit: never a larger class than the smallest fitting extent's, unless
                // that class's list was cut short (more than SCAN entries).
                let smallest = fits.iter().map(|&(s, e)| e - s).min().unwrap();
                let crowded = fits
                    .iter()
                    .filter(|&&(s, e)| class_of(e - s) == class_of(smallest))
                    .count()
                    + free
                        .iter()
                        .filter(|&&(s, e)| class_of(e - s) == class_of(bytes) && e - s < bytes)
                        .count()
                    > SCAN;
                assert!(
                    crowded || class_of(e - s) == class_of(smallest),
                    "step {step}: extent of {} bytes taken, {smallest} would fit",
                    e - s
                );
                free.remove(i);
                if at > s {
                    free.insert(i, (s, at));
                }
                if at + bytes < e {
                    let j = if at > s { i + 1 } else { i };
                    free.insert(j, (at + bytes, e));
                }
                live.push((at, bytes));
            } else {
                let (at, bytes) = live.swap_remove(rand(live.len() as u64) as usize);
                a.insert_free(at, at + bytes);
                model_free(&mut free, at, at + bytes);
            }
            max_extents = max_extents.max(free.len());
            if step % 97 == 0 || free.len() < 64 {
                assert_eq!(a.free_extents(), free, "step {step}");
            }
        }
        assert!(max_extents > 500, "many extents at once: {max_extents}");
        for (at, bytes) in live.drain(..) {
            a.insert_free(at, at + bytes);
        }
        assert_eq!(a.free_extents(), vec![(base, base + (1 << 30))]);
    }
}
