//! The mutable state of [`super::PagedBestFit`]: placement, mapping (under a call budget when
//! one is set), deferred cross-stream frees, statistics and history (`Note [Paged best fit]`).

use super::arena::Arena;
use super::pages::{page_down, page_up, PageMap};
use super::tag_table::TagTable;
use super::units::{cut, Units};
use super::PagedTuning;
use crate::addr_map::AddrMap;
use crate::backend::{DevicePtr, MemoryBackend, StreamId, VirtualMemoryBackend};
use crate::caching::private_pools::PrivatePools;
use crate::error::{AllocError, BackendError};
use crate::snapshot::{TraceAction, TraceEntry, TraceRing};
use crate::stats::MemoryStats;

/// PyTorch's `kMinBlockSize`: every block is a multiple of 512 bytes.
const MIN_BLOCK: u64 = 512;
/// PyTorch's `kSmallSize`: blocks up to 1 MiB count in the small-pool statistics.
const SMALL_SIZE: u64 = 1 << 20;
/// Requests from 2^60 bytes up are refused outright (PyTorch's "more than 1EB").
const MAX_REQUEST: u64 = 1 << 60;
/// Address space reserved per stream when the device size is unknown, in bytes.
const DEFAULT_VA: u64 = 1 << 40;

/// A live block.
#[derive(Default)]
pub(super) struct Live {
    /// Rounded size in bytes.
    pub(super) size: u64,
    /// The size the caller asked for, in bytes.
    pub(super) requested: u64,
    /// Index of the arena (stream and pool) it came from.
    pub(super) arena: usize,
    /// Other streams it was used on (`record_stream`).
    pub(super) uses: Vec<StreamId>,
}

/// A freed block waiting for events on the streams it was used on.
pub(super) struct Pending<E> {
    events: Vec<E>,
    pub(super) addr: u64,
    pub(super) size: u64,
    /// The size the caller asked for, in bytes (for snapshots).
    pub(super) requested: u64,
    pub(super) arena: usize,
}

/// Everything behind the policy's mutex.
pub(crate) struct State<E> {
    pub(super) pages: PageMap,
    /// The mapping units: what each `map` call mapped (`Note [Mapping units]`).
    pub(super) units: Units,
    /// Longest mapping unit in bytes (a multiple of the page size), unless a run would take
    /// more than `max_run_units` units (0: no such bound) (`Note [Mapping units]`).
    max_unit: u64,
    max_run_units: u64,
    /// Step 3's headroom divisor (0: none), step 4's call budget and step 5's churn divisor
    /// (0: off) (`Note [Paged best fit]`).
    headroom_div: u64,
    calls_per_20mib: f64,
    churn_div: u64,
    /// Step 5: bytes the headroom has grown by, learned from reclaims that repeated.
    churn_extra: u64,
    /// Step 5: the live peak when step 3 last unmapped anything; `u64::MAX` before it first
    /// did, so the very first unmap counts as a repeat too (the figures pinned in
    /// `tests/recorded.rs` are with this rule).
    live_peak_at_reclaim: u64,
    pub(super) arenas: Vec<Arena>,
    /// The index in `arenas` of each (stream, pool pair, tag)'s arena: found in O(1), however
    /// many streams (a linear scan made 40,000 streams quadratic).
    pub(super) arena_of: std::collections::HashMap<(StreamId, u16, u32), usize>,
    /// Slots of `arenas` whose pool was forgotten ([`super::arena::RETIRED`]), reused by new
    /// arenas.
    pub(super) retired: Vec<usize>,
    pub(super) live: AddrMap<Live>,
    pub(super) pending: Vec<Pending<E>>,
    /// Blocks freed with cross-stream uses while a pool was being allocated to: their events
    /// are recorded once none is (`Note [Private pools in paged]`; PyTorch's
    /// `needs_events_deferred_until_no_capture`). `(address, block)`.
    pub(super) deferred: Vec<(u64, Live)>,
    /// The private pools (`Note [Private pools in paged]`).
    pub(crate) private: PrivatePools,
    /// The tags and which of them sleep (`Note [Sleep and wake]`).
    pub(super) tags: TagTable,
    /// PyTorch-named statistics.
    pub(crate) stats: MemoryStats,
    /// The most bytes ever mapped at once (not reset by `reset_peak_memory_stats`).
    high_water: u64,
    /// The most bytes allocated at once (blocks rounded to 512 B), never reset.
    live_peak: u64,
    maps: u64,
    unmaps: u64,
    /// Bytes of address space reserved per stream at a time.
    va_bytes: u64,
    /// Cap on mapped bytes (`set_memory_fraction`).
    pub(crate) cap: Option<u64>,
    /// The device's memory in bytes as the backend reported it at creation (0 = unknown).
    total: u64,
    pub(super) history: Option<TraceRing>,
    clock: i64,
    /// The device index in OOM messages, summaries and snapshots.
    pub(crate) device: i32,
    /// While set, an out-of-memory error is built but not counted or traced yet: a pool that
    /// lends on out-of-memory may still serve the request. Holds the bytes it needed.
    quiet_oom: Option<u64>,
}

pub(super) fn backend_err(stream: StreamId) -> impl FnOnce(BackendError) -> AllocError {
    move |source| AllocError::Backend { stream, source }
}

pub(super) fn vm<B: MemoryBackend>(backend: &B) -> &dyn VirtualMemoryBackend {
    backend
        .as_virtual()
        .expect("PagedBestFit::new checked the virtual-memory capability")
}

impl<E> State<E> {
    /// Fresh state for pages of `page` bytes on a device of `total` bytes (0 = unknown),
    /// with `tuning`'s constants (mapping units rounded up to whole pages).
    pub(crate) fn new(page: u64, total: u64, tuning: PagedTuning) -> Self {
        let max_unit = tuning.max_unit_bytes;
        let va_bytes = if total == 0 {
            DEFAULT_VA
        } else {
            page_up(2 * total, page)
        };
        State {
            pages: PageMap::new(page),
            units: Units::default(),
            max_unit: page_up(max_unit.clamp(page, 1 << 62), page),
            max_run_units: tuning.max_run_units,
            headroom_div: tuning.headroom_div,
            calls_per_20mib: tuning.calls_per_20mib,
            churn_div: tuning.churn_div,
            churn_extra: 0,
            live_peak_at_reclaim: u64::MAX,
            arenas: Vec::new(),
            arena_of: std::collections::HashMap::new(),
            retired: Vec::new(),
            live: AddrMap::default(),
            pending: Vec::new(),
            deferred: Vec::new(),
            private: PrivatePools::default(),
            tags: TagTable::default(),
            stats: MemoryStats::new(None),
            high_water: 0,
            live_peak: 0,
            maps: 0,
            unmaps: 0,
            va_bytes,
            cap: None,
            total,
            history: None,
            clock: 0,
            device: 0,
            quiet_oom: None,
        }
    }

    /// `map` + `unmap` calls made so far.
    pub(crate) fn device_calls(&self) -> u64 {
        self.maps + self.unmaps
    }

    /// Starts (`Some`) or stops (`None`) recording history.
    pub(crate) fn set_history(&mut self, max_entries: Option<usize>) {
        self.history = max_entries.map(TraceRing::new);
    }

    fn trace(&mut self, action: TraceAction, addr: u64, size: u64, stream: StreamId) {
        self.clock += 1;
        if let Some(ring) = &mut self.history {
            ring.push(TraceEntry {
                action,
                addr,
                size,
                stream,
                time_us: self.clock,
            });
        }
    }

    fn arena_for<B: MemoryBackend<Fence = E>>(
        &mut self,
        backend: &B,
        stream: StreamId,
        tag: u32,
        size: u64,
    ) -> Result<usize, AllocError> {
        // The pool that serves `stream` now: the general one (0) unless a private pool is
        // being allocated to for it (`Note [Private pools in paged]`).
        let pair = self.private.pair_for(stream);
        // Most programs allocate on one stream: the last arena needs no hashing.
        if let Some(i) = self.arenas.len().checked_sub(1) {
            let a = &self.arenas[i];
            if a.stream == stream && a.pair == pair && a.tag == tag {
                return Ok(i);
            }
        }
        if let Some(&i) = self.arena_of.get(&(stream, pair, tag)) {
            return Ok(i);
        }
        let min = page_up(size, self.pages.page);
        let (base, len) = self.reserve_fitting(backend, self.va_bytes, min, stream)?;
        let mut arena = Arena::new(stream, pair, tag);
        arena.add_reservation(base, len);
        let i = match self.retired.pop() {
            Some(i) => {
                self.arenas[i] = arena;
                i
            }
            None => {
                self.arenas.push(arena);
                self.arenas.len() - 1
            }
        };
        self.arena_of.insert((stream, pair, tag), i);
        Ok(i)
    }

    /// Reserves `want` bytes of address space for `stream` or, when the backend has no range
    /// that large left, only `min` (the request's pages): `(base, bytes reserved)` (`Note
    /// [Paged address space]` in [`super`]). At most two backend calls.
    ///
    /// # Errors
    /// [`AllocError::Backend`] with the backend's error when not even `min` bytes can be
    /// reserved, or when the backend fails otherwise.
    fn reserve_fitting<B: MemoryBackend<Fence = E>>(
        &self,
        backend: &B,
        want: u64,
        min: u64,
        stream: StreamId,
    ) -> Result<(u64, u64), AllocError> {
        let want = want.max(min);
        match vm(backend).reserve(want as usize) {
            Ok(p) => Ok((p.0, want)),
            Err(BackendError::OutOfMemory { .. }) if want > min => vm(backend)
                .reserve(min as usize)
                .map(|p| (p.0, min))
                .map_err(backend_err(stream)),
            Err(e) => Err(backend_err(stream)(e)),
        }
    }

    /// Allocates `bytes` (> 0) on `stream`.
    pub(crate) fn malloc<B: MemoryBackend<Fence = E>>(
        &mut self,
        backend: &B,
        bytes: u64,
        stream: StreamId,
    ) -> Result<DevicePtr, AllocError> {
        if bytes >= MAX_REQUEST {
            return Err(AllocError::TooLarge { requested: bytes });
        }
        if !self.pending.is_empty() || !self.deferred.is_empty() {
            self.process_events(backend)?;
        }
        let size = bytes.div_ceil(MIN_BLOCK) * MIN_BLOCK;
        // This thread's tag; an error when it is asleep (`Note [Sleep and wake]`).
        let tag = self.tags.current()?;
        let ai = self.arena_for(backend, stream, tag, size)?;
        let (addr, unmapped) = loop {
            if let Some(placed) = self.arenas[ai].place(size, &self.pages) {
                break placed;
            }
            // The address space is fragmented: reserve another range for this stream.
            let min = page_up(size, self.pages.page);
            let (base, len) = self.reserve_fitting(backend, self.va_bytes.max(min), min, stream)?;
            self.arenas[ai].add_reservation(base, len);
        };
        // `place` measured the unmapped pages: most blocks land on mapped memory.
        if unmapped > 0 {
            // A general request may borrow from a pool that lends on out-of-memory
            // (`Note [Private pools]`): its error is counted only if none can serve it.
            let lend = self.arenas[ai].pair == 0 && self.private.lends_on_oom();
            if lend {
                self.quiet_oom = Some(0);
            }
            let mapped = self.ensure_mapped(backend, addr, size, ai, bytes);
            let need = self.quiet_oom.take();
            if let Err(e) = mapped {
                self.arenas[ai].insert_free(addr, addr + size);
                if lend && e.is_out_of_memory() {
                    if let Some(addr) = self.borrow_on_oom(stream, tag, size, bytes) {
                        return Ok(DevicePtr(addr));
                    }
                    self.stats.num_ooms += 1;
                    self.trace(TraceAction::Oom, 0, need.unwrap_or(0), StreamId::DEFAULT);
                }
                return Err(e);
            }
        }
        self.note_allocated(addr, size, bytes, ai);
        Ok(DevicePtr(addr))
    }

    /// Records the block `[addr, addr + size)` of arena `ai`, asked for as `requested` bytes,
    /// as live: the live map, the statistics, the history.
    pub(super) fn note_allocated(&mut self, addr: u64, size: u64, requested: u64, ai: usize) {
        self.live.insert(
            addr,
            Live {
                size,
                requested,
                arena: ai,
                uses: Vec::new(),
            },
        );
        let small = size <= SMALL_SIZE;
        let s = &mut self.stats;
        s.allocation.increase(small, 1);
        s.active.increase(small, 1);
        s.allocated_bytes.increase(small, size as i64);
        self.live_peak = self
            .live_peak
            .max(s.allocated_bytes.all().current.max(0) as u64);
        s.active_bytes.increase(small, size as i64);
        s.requested_bytes.increase(small, requested as i64);
        let stream = self.arenas[ai].stream;
        self.trace(TraceAction::Alloc, addr, size, stream);
    }

    /// Maps every page of `[addr, addr + size)` not mapped yet, unmapping free pages first when
    /// the high-water mark would rise and the call budget, if set, allows (`Note [Paged best
    /// fit]`).
    pub(super) fn ensure_mapped<B: MemoryBackend<Fence = E>>(
        &mut self,
        backend: &B,
        addr: u64,
        size: u64,
        ai: usize,
        requested: u64,
    ) -> Result<(), AllocError> {
        if self.pages.unmapped_bytes(addr, addr + size) == 0 {
            return Ok(());
        }
        let page = self.pages.page;
        let (lo, mut hi) = (page_down(addr, page), page_up(addr + size, page));
        let mut runs = self.pages.unmapped_runs(lo, hi);
        let mut need: u64 = runs.iter().map(|(a, b)| b - a).sum();
        // A request the whole device cannot hold fails now: cutting it into mapping units
        // first would make billions of them (a 2^59-byte request took 2.1 GB of host memory
        // and aborted).
        if self.total > 0 && self.pages.mapped.saturating_add(need) > self.total {
            let live: u64 = self.stats.allocated_bytes.all().current.max(0) as u64;
            if live.saturating_add(need) > self.total {
                return Err(self.oom(backend, need, requested, self.cap));
            }
        }
        let target = self.pages.mapped + need;
        let budget =
            self.calls_per_20mib * self.high_water.max(target) as f64 / (20u64 << 20) as f64;
        let in_budget = budget - self.device_calls() as f64 >= 2.0;
        if !in_budget {
            // Out of budget: map one page beyond the block when it is free address space, so
            // that the next growth needs no call.
            let last = runs.last_mut().expect("some page is unmapped");
            let in_reservation = self.arenas[ai]
                .reservations
                .iter()
                .any(|&(b, n)| hi >= b && hi + page <= b + n);
            if last.1 == hi && in_reservation && self.pages.next_mapped(hi, hi + page) == hi + page
            {
                last.1 += page;
                hi += page;
                need += page;
            }
        }
        // `Note [Paged best fit]`, step 3: unmap elsewhere only beyond the high-water mark
        // and the headroom over the live peak (grown by step 5's learned churn).
        let extra = self.live_peak.checked_div(self.headroom_div).unwrap_or(0);
        let headroom = page_up(
            self.live_peak
                .saturating_add(extra)
                .saturating_add(self.churn_extra),
            page,
        );
        let mut limit = self.high_water.max(headroom);
        if let Some(cap) = self.cap {
            limit = limit.min(cap);
        }
        if self.pages.mapped + need > limit
            && (in_budget || self.cap.is_some_and(|c| self.pages.mapped + need > c))
        {
            let freed = self.reclaim(backend, self.pages.mapped + need - limit, (lo, hi))?;
            // Step 5: a reclaim with no new live peak since the last one is the workload
            // repeating, not growing: what it unmapped is likely mapped again next time.
            if freed > 0 {
                if self.live_peak <= self.live_peak_at_reclaim {
                    self.churn_extra = self
                        .churn_extra
                        .saturating_add(freed.checked_div(self.churn_div).unwrap_or(0));
                }
                self.live_peak_at_reclaim = self.live_peak;
            }
        }
        let stream = self.arenas[ai].stream;
        if let Some(cap) = self.cap {
            if self.pages.mapped + need > cap {
                return Err(self.oom(backend, need, requested, Some(cap)));
            }
        }
        // More than the whole device can never be mapped: refuse it before any map call (found
        // by fuzzing: 2^56 bytes on a 64 MiB device were cut into 1.4e9 units, a 22 GB list,
        // and on a GPU the device would be mapped full before the refusal).
        if self.total > 0 && need > self.total {
            return Err(self.oom(backend, need, requested, None));
        }
        // During a capture a failed request cannot give back the units it mapped (nothing is
        // unmapped then: `Note [Private pools in paged]`), so it maps nothing the device
        // cannot hold in full.
        if self.private.capturing() {
            if let Ok(info) = backend.mem_info() {
                if need > info.free_bytes {
                    return Err(self.oom(backend, need, requested, self.cap));
                }
            }
        }
        // Cut lazily: the list of units is never held, whatever the size of the runs.
        let (max_unit, count) = (self.max_unit, self.max_run_units);
        let units = runs
            .iter()
            .flat_map(|&(a, b)| cut(a, b, page, max_unit, count));
        let mut done: Vec<(u64, u64)> = Vec::new();
        for (a, b) in units {
            let mut result = vm(backend).map(DevicePtr(a), (b - a) as usize, stream);
            // Retry once with every free page returned (PyTorch's release-and-retry step), but
            // never while a pool is being allocated to: nothing may be unmapped then (PyTorch's
            // `captures_underway` check; `Note [Private pools in paged]`).
            if matches!(result, Err(BackendError::OutOfMemory { .. })) && !self.private.capturing()
            {
                self.stats.num_alloc_retries += 1;
                self.reclaim(backend, u64::MAX, (lo, hi))?;
                result = vm(backend).map(DevicePtr(a), (b - a) as usize, stream);
            }
            match result {
                Ok(()) => {
                    self.note_mapped(a, b, stream);
                    done.push((a, b));
                }
                Err(e) => {
                    // Undo this request's own mappings: nothing was handed out on them. While a
                    // pool is being allocated to they stay mapped (free, in the pool's arena):
                    // nothing is unmapped during a capture.
                    if !self.private.capturing() {
                        for (x, y) in done {
                            self.unmap_run(backend, x, y, stream)?;
                        }
                    }
                    return Err(match e {
                        BackendError::OutOfMemory { .. } => {
                            self.oom(backend, need, requested, self.cap)
                        }
                        e => backend_err(stream)(e),
                    });
                }
            }
        }
        Ok(())
    }

    /// Moves the `segment` statistic (a COUNT of separate mapped ranges) by the change from
    /// `before` ranges.
    fn note_segments(&mut self, before: usize) {
        let after = self.pages.interval_count();
        if after > before {
            self.stats.segment.increase(false, (after - before) as i64);
        } else if before > after {
            self.stats.segment.decrease(false, (before - after) as i64);
        }
    }

    /// Records the unit `[a, b)` that one `map` call just mapped.
    pub(super) fn note_mapped(&mut self, a: u64, b: u64, stream: StreamId) {
        let before = self.pages.interval_count();
        self.pages.insert(a, b);
        self.units.insert(a, b);
        self.note_segments(before);
        self.maps += 1;
        self.high_water = self.high_water.max(self.pages.mapped);
        self.stats.reserved_bytes.increase(false, (b - a) as i64);
        self.stats.num_device_alloc += 1;
        self.trace(TraceAction::SegmentMap, a, b - a, stream);
    }

    /// Unmaps `[a, b)`, a union of whole mapping units (`Note [Mapping units]`), in one call.
    pub(super) fn unmap_run<B: MemoryBackend<Fence = E>>(
        &mut self,
        backend: &B,
        a: u64,
        b: u64,
        stream: StreamId,
    ) -> Result<(), AllocError> {
        // SAFETY: 1. [a, b) is mapped: it is made of whole units, each recorded when its `map`
        // call succeeded. 2. No block is live on it and the owning stream was synchronized by
        // the caller (`reclaim`), or the units were mapped for a request that failed and never
        // handed out, or every stream was synchronized and the tag is being put to sleep, or
        // the units were mapped by a wake that failed (`Note [Sleep and wake]`).
        unsafe { vm(backend).unmap(DevicePtr(a), (b - a) as usize, stream) }
            .map_err(backend_err(stream))?;
        let before = self.pages.interval_count();
        self.pages.remove(a, b);
        self.units.remove(a, b);
        self.note_segments(before);
        self.unmaps += 1;
        self.stats.reserved_bytes.decrease(false, (b - a) as i64);
        self.stats.num_device_free += 1;
        self.trace(TraceAction::SegmentUnmap, a, b - a, stream);
        Ok(())
    }

    /// Unmaps entirely free mapping units (`Note [Mapping units]`), biggest runs of adjacent
    /// ones first, until `need` bytes are unmapped (or all of them), never touching a unit that
    /// overlaps `[exclude.0, exclude.1)`. Each stream whose units go is synchronized first (see
    /// the note on `record_stream` and deferred free in [`super`]). Only the general pool's
    /// units and those of freeable private pools go, and nothing at all while a pool is being
    /// allocated to (`Note [Private pools in paged]`).
    pub(super) fn reclaim<B: MemoryBackend<Fence = E>>(
        &mut self,
        backend: &B,
        need: u64,
        exclude: (u64, u64),
    ) -> Result<u64, AllocError> {
        if self.private.capturing() {
            return Ok(0);
        }
        let freeable = self.private.freeable();
        let arenas: Vec<usize> = (0..self.arenas.len())
            .filter(|&i| {
                let pair = self.arenas[i].pair;
                pair == 0 || freeable.contains(&pair)
            })
            .collect();
        self.reclaim_in(backend, need, exclude, &arenas)
    }

    /// [`State::reclaim`] over the arenas `arenas` only, whatever their pool (the caller
    /// checked that they may be unmapped).
    pub(super) fn reclaim_in<B: MemoryBackend<Fence = E>>(
        &mut self,
        backend: &B,
        need: u64,
        exclude: (u64, u64),
        arenas: &[usize],
    ) -> Result<u64, AllocError> {
        let page = self.pages.page;
        let mut cands: Vec<(u64, u64, u64, usize)> = Vec::new();
        for &i in arenas {
            let arena = &self.arenas[i];
            for (s, e) in arena.free_extents() {
                let (lo, hi) = (page_up(s, page), page_down(e, page));
                if lo >= hi {
                    continue;
                }
                // A unit is unmappable when every byte of it is free: inside one free extent.
                for (p, q) in self.units.runs_within(lo, hi, exclude) {
                    cands.push((q - p, p, q, i));
                }
            }
        }
        cands.sort_unstable_by(|x, y| y.0.cmp(&x.0).then(x.1.cmp(&y.1)));
        let mut freed = 0u64;
        let mut synced = vec![false; self.arenas.len()];
        for (len, a, b, i) in cands {
            if freed >= need {
                break;
            }
            let stream = self.arenas[i].stream;
            if !synced[i] {
                let ev = backend.record_fence(stream).map_err(backend_err(stream))?;
                backend.sync_fence(&ev).map_err(backend_err(stream))?;
                synced[i] = true;
            }
            self.unmap_run(backend, a, b, stream)?;
            freed += len;
        }
        Ok(freed)
    }

    fn oom<B: MemoryBackend<Fence = E>>(
        &mut self,
        backend: &B,
        need: u64,
        requested: u64,
        allowed: Option<u64>,
    ) -> AllocError {
        match &mut self.quiet_oom {
            // Counted by `malloc` if no pool lends the memory.
            Some(quiet) => *quiet = need,
            None => {
                self.stats.num_ooms += 1;
                self.trace(TraceAction::Oom, 0, need, StreamId::DEFAULT);
            }
        }
        let info = backend.mem_info().unwrap_or_default();
        if let Some(cap) = allowed.filter(|&cap| need > cap) {
            // The pages this request needs exceed the memory-fraction cap by themselves:
            // nothing freed could help (the other policies' `CapExceeded`).
            return AllocError::CapExceeded {
                requested: need,
                device: self.device,
                device_total: info.total_bytes,
                device_free: info.free_bytes,
                cap,
            };
        }
        let allocated = self.stats.allocated_bytes.all().current.max(0) as u64;
        AllocError::OutOfMemory {
            requested: need,
            requested_by_caller: requested,
            device: self.device,
            device_total: info.total_bytes,
            device_free: info.free_bytes,
            allocated,
            reserved_unallocated: self.pages.mapped.saturating_sub(allocated),
            allowed,
            hint: crate::error::OomHint::Paged,
        }
    }

    /// Frees the block at `ptr`: now, or once its other streams' events complete.
    pub(crate) fn free<B: MemoryBackend<Fence = E>>(
        &mut self,
        backend: &B,
        ptr: DevicePtr,
    ) -> Result<(), AllocError> {
        let Some(block) = self.live.remove(&ptr.0) else {
            // An error path, so a scan is fine: a pointer inside a live block is not the start
            // of an allocation (`InvalidPointer`, as the other policies say), one in free space
            // of this allocator's ranges was most likely freed already.
            let interior = self
                .live
                .iter()
                .any(|(&a, b)| ptr.0 > a && ptr.0 < a + b.size);
            return Err(if !interior && self.arenas.iter().any(|a| a.owns(ptr.0)) {
                AllocError::DoubleFree { ptr }
            } else {
                AllocError::InvalidPointer { ptr }
            });
        };
        let small = block.size <= SMALL_SIZE;
        let s = &mut self.stats;
        s.allocation.decrease(small, 1);
        s.allocated_bytes.decrease(small, block.size as i64);
        s.requested_bytes.decrease(small, block.requested as i64);
        let stream = self.arenas[block.arena].stream;
        self.trace(TraceAction::FreeRequested, ptr.0, block.size, stream);
        if !block.uses.is_empty() && self.private.capturing() {
            // No event may be recorded while a pool is being allocated to (an event call on a
            // capturing stream breaks the capture): `process_events` records them afterwards.
            self.deferred.push((ptr.0, block));
            return Ok(());
        }
        if !block.uses.is_empty() {
            self.insert_events(backend, ptr.0, block)?;
            return Ok(());
        }
        self.complete_free(ptr.0, block.size, block.arena);
        Ok(())
    }

    /// Records one event per stream `block` (freed, at `addr`) was used on and queues it
    /// until all of them complete (PyTorch's `insert_events`).
    fn insert_events<B: MemoryBackend<Fence = E>>(
        &mut self,
        backend: &B,
        addr: u64,
        block: Live,
    ) -> Result<(), AllocError> {
        let mut events = Vec::with_capacity(block.uses.len());
        let mut failed = None;
        for &s in &block.uses {
            match backend.record_fence(s) {
                Ok(ev) => events.push(ev),
                Err(e) => {
                    // Without an event the block cannot be reused safely: keep it pending
                    // behind the events recorded so far and report the failure.
                    failed = Some(backend_err(s)(e));
                    break;
                }
            }
        }
        self.pending.push(Pending {
            events,
            addr,
            size: block.size,
            requested: block.requested,
            arena: block.arena,
        });
        failed.map_or(Ok(()), Err)
    }

    pub(super) fn complete_free(&mut self, addr: u64, size: u64, arena: usize) {
        let small = size <= SMALL_SIZE;
        self.stats.active.decrease(small, 1);
        self.stats.active_bytes.decrease(small, size as i64);
        self.arenas[arena].insert_free(addr, addr + size);
        let stream = self.arenas[arena].stream;
        self.trace(TraceAction::FreeCompleted, addr, size, stream);
    }

    /// Marks the live block at `ptr` as used on `stream`.
    pub(crate) fn record_stream(
        &mut self,
        ptr: DevicePtr,
        stream: StreamId,
    ) -> Result<(), AllocError> {
        let Some(block) = self.live.get_mut(&ptr.0) else {
            return Err(AllocError::InvalidPointer { ptr });
        };
        if self.arenas[block.arena].stream != stream && !block.uses.contains(&stream) {
            block.uses.push(stream);
        }
        Ok(())
    }

    /// Completes every pending free whose events have all completed. While a pool is being
    /// allocated to, does nothing (no event is recorded or queried during a capture); after,
    /// first records the events of the frees deferred meanwhile (PyTorch's
    /// `insert_events_deferred_until_no_capture`).
    pub(crate) fn process_events<B: MemoryBackend<Fence = E>>(
        &mut self,
        backend: &B,
    ) -> Result<(), AllocError> {
        if self.private.capturing() {
            return Ok(());
        }
        while let Some((addr, block)) = self.deferred.pop() {
            self.insert_events(backend, addr, block)?;
        }
        let mut i = 0;
        while i < self.pending.len() {
            let p = &self.pending[i];
            let mut done = true;
            for ev in &p.events {
                let stream = self.arenas[p.arena].stream;
                if !backend.query_fence(ev).map_err(backend_err(stream))? {
                    done = false;
                    break;
                }
            }
            if done {
                let p = self.pending.swap_remove(i);
                self.complete_free(p.addr, p.size, p.arena);
            } else {
                i += 1;
            }
        }
        Ok(())
    }

    /// Waits for every pending free, then unmaps every entirely free page of the general pool
    /// and of the freeable private pools, forgetting those left empty. While a pool is being
    /// allocated to, does nothing: no memory may be unmapped and no stream synchronized during
    /// a capture (`Note [Private pools in paged]`).
    pub(crate) fn empty_cache<B: MemoryBackend<Fence = E>>(
        &mut self,
        backend: &B,
    ) -> Result<(), AllocError> {
        if self.private.capturing() {
            return Ok(());
        }
        self.sync_pending(backend)?;
        self.reclaim(backend, u64::MAX, (0, 0))?;
        for pair in self.private.freeable() {
            self.forget_if_empty(backend, pair)?;
        }
        Ok(())
    }

    /// Records the events of deferred frees, then waits for every pending free and completes
    /// it (not while a pool is being allocated to: the caller checks).
    pub(super) fn sync_pending<B: MemoryBackend<Fence = E>>(
        &mut self,
        backend: &B,
    ) -> Result<(), AllocError> {
        while let Some((addr, block)) = self.deferred.pop() {
            self.insert_events(backend, addr, block)?;
        }
        for p in std::mem::take(&mut self.pending) {
            let stream = self.arenas[p.arena].stream;
            for ev in &p.events {
                backend.sync_fence(ev).map_err(backend_err(stream))?;
            }
            self.complete_free(p.addr, p.size, p.arena);
        }
        Ok(())
    }
}
