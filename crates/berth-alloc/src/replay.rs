//! Replaying a trace through any [`DeviceAllocator`] (the library half of `berth replay`).
//!
//! Rules: walk the rows in order; on `alloc` allocate `size` bytes on
//! `stream` and remember the pointer under the row's `addr`; on `free_completed` free the block
//! remembered under `addr`; ignore every other row. Freeing at `free_completed` honours the
//! trace's streams: the recording already delayed it until the other streams' events
//! completed. An `alloc` at an address still live cannot happen in a real recording (an
//! allocator hands out an address once until it is freed): [`CompiledTrace::try_new`] and
//! [`TraceCompiler`] refuse it with [`LiveAlloc`]; when skipping unknown frees (below) it frees
//! the older block right after the new allocation, uncounted, as PyTorch's replay script
//! overwrites its pointer.
//!
//! A `free_completed` of an address that is not live (never allocated, or already freed) is
//! refused with [`UnknownFree`] by [`CompiledTrace::try_new`] and [`TraceCompiler`]: PyTorch's
//! allocator refuses such a free too (`TORCH_CHECK(false, "invalid device pointer: ", ptr)` in
//! `NativeCachingAllocator::free`,
//! <https://github.com/pytorch/pytorch/blob/main/c10/cuda/CUDACachingAllocator.cpp>), and none
//! of the recorded traces has one, so it means a damaged or cut-off trace. PyTorch's C++ replay
//! script (`torch_replay.py`) skips them instead; [`CompiledTrace::new`] and
//! [`TraceCompiler::skip_unknown_frees`] do the same, for traces whose history was cut off at
//! the start (a ring buffer that wrapped: `_record_memory_history(max_entries=...)`).
//!
//! # Note [Compiled replay]
//! Timing follows PyTorch's own allocator replayed from C++ (a loop of `raw_alloc` /
//! `raw_delete` of `c10::cuda::CUDACachingAllocator`, as `BENCHMARKS.md` says): the rows are first
//! compiled, outside the timing, into a flat list of operations that name their pointer by a
//! dense slot index (no hash map in the timed loop, no rows that do nothing), and only the loop
//! of allocator calls is timed. [`CompiledTrace::replay`] runs one pass; callers that want
//! PyTorch's warm figure run several passes on one allocator and take the minimum of the passes
//! after the first.

use std::collections::HashMap;
use std::time::Instant;

use crate::allocator::DeviceAllocator;
use crate::backend::{DevicePtr, StreamId};
use crate::error::AllocError;
use crate::snapshot::TraceAction;
use crate::trace::TraceEvent;

/// What a replay measured.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ReplayReport {
    /// Allocations plus frees performed.
    pub ops: u64,
    /// Most bytes live at once, as requested (the floor for any allocator).
    pub peak_requested: u64,
    /// Peak reserved bytes (`max_memory_reserved`) during the replay.
    pub peak_reserved: u64,
    /// Device allocations: `num_device_alloc` (segments created, or page maps).
    pub device_allocs: u64,
    /// Backend calls that create, map, unmap or free device memory
    /// (`num_device_alloc + num_device_free`).
    pub device_calls: u64,
    /// Wall time of the allocator calls per operation, in nanoseconds (the compiled loop of
    /// `Note [Compiled replay]`; compiling and the final frees are not timed).
    pub ns_per_op: f64,
}

impl ReplayReport {
    /// `peak_reserved / peak_requested` (1.0 is perfect); `None` when the trace requested no
    /// bytes at all (an empty trace, or one without `alloc` rows): there is no peak to compare
    /// with, and 0/0 is not a ratio.
    pub fn ratio(&self) -> Option<f64> {
        (self.peak_requested != 0).then(|| self.peak_reserved as f64 / self.peak_requested as f64)
    }
}

/// A `free_completed` row whose address is not live: never allocated in the trace, or already
/// freed (the replay rules of this module).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("free_completed of address {addr:#x}, which is not live (no earlier alloc at that address, or it was already freed); PyTorch's allocator refuses such a free (\"invalid device pointer\"), so the trace is damaged or its start was cut off; expected every free_completed to follow an alloc of its address")]
pub struct UnknownFree {
    /// 0-based index of the row in the trace.
    pub index: usize,
    /// The address it frees.
    pub addr: u64,
}

/// An `alloc` row at an address that is still live: two live blocks cannot share an address, so
/// an earlier `free_completed` of it is missing (the replay rules of this module).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("alloc at address {addr:#x}, which is already live (allocated by row #{earlier} and not freed since); an allocator hands out an address once until it is freed, so the trace is damaged; expected a free_completed of it before this alloc")]
pub struct LiveAlloc {
    /// 0-based index of the row in the trace.
    pub index: usize,
    /// The address it allocates.
    pub addr: u64,
    /// 0-based index of the `alloc` row that made the address live.
    pub earlier: usize,
}

/// A `free_completed` row whose size or stream is not its `alloc`'s: PyTorch records a block's
/// free with the bytes and the stream it was allocated with
/// (<https://github.com/pytorch/pytorch/blob/main/c10/cuda/CUDACachingAllocator.cpp>,
/// `TraceEntry` of `FREE_COMPLETED`), so the trace is damaged (newcomer defect 11).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("free_completed of address {addr:#x} says {free_size} bytes on stream {free_stream}, but its alloc (row #{alloc_index}) was {alloc_size} bytes on stream {alloc_stream}; a free_completed names the size and stream of the block it frees, so the trace is damaged; expected {alloc_size} bytes on stream {alloc_stream}")]
pub struct FreeMismatch {
    /// 0-based index of the row in the trace.
    pub index: usize,
    /// The address it frees.
    pub addr: u64,
    /// 0-based index of the `alloc` row of the address.
    pub alloc_index: usize,
    /// Bytes the `alloc` row requested.
    pub alloc_size: u64,
    /// Bytes the `free_completed` row says.
    pub free_size: u64,
    /// The `alloc` row's stream.
    pub alloc_stream: u64,
    /// The `free_completed` row's stream.
    pub free_stream: u64,
}

/// A trace row the replay rules refuse: [`UnknownFree`], [`LiveAlloc`] or [`FreeMismatch`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BadRow {
    /// A `free_completed` of an address that is not live.
    #[error(transparent)]
    UnknownFree(#[from] UnknownFree),
    /// An `alloc` at an address that is still live.
    #[error(transparent)]
    LiveAlloc(#[from] LiveAlloc),
    /// A `free_completed` whose size or stream contradicts its `alloc`.
    #[error(transparent)]
    FreeMismatch(#[from] FreeMismatch),
}

impl BadRow {
    /// 0-based index of the refused row in the trace.
    pub fn index(&self) -> usize {
        match self {
            BadRow::UnknownFree(e) => e.index,
            BadRow::LiveAlloc(e) => e.index,
            BadRow::FreeMismatch(e) => e.index,
        }
    }
}

/// Compiles trace rows one at a time into a [`CompiledTrace`] (so a trace can be compiled as
/// it is read, `Note [Streaming trace reader]` in [`crate::trace`]), checking each `free_completed`
/// against the live addresses.
///
/// ```
/// use berth_alloc::replay::{BadRow, LiveAlloc, TraceCompiler, UnknownFree};
/// use berth_alloc::trace::TraceEvent;
/// use berth_alloc::{StreamId, TraceAction};
/// let row = |action, addr| TraceEvent { action, addr, size: 512, stream: StreamId::DEFAULT, time_us: 0 };
/// let mut c = TraceCompiler::new();
/// c.push(0, &row(TraceAction::Alloc, 0x100)).unwrap();
/// c.push(1, &row(TraceAction::FreeCompleted, 0x100)).unwrap();
/// assert_eq!(c.push(2, &row(TraceAction::FreeCompleted, 0x100)), Err(BadRow::from(UnknownFree { index: 2, addr: 0x100 })));
/// c.push(3, &row(TraceAction::Alloc, 0x200)).unwrap();
/// assert_eq!(c.push(4, &row(TraceAction::Alloc, 0x200)), Err(BadRow::from(LiveAlloc { index: 4, addr: 0x200, earlier: 3 })));
/// assert_eq!(c.finish().ops(), 3);
/// ```
#[derive(Debug, Default)]
pub struct TraceCompiler {
    trace: CompiledTrace,
    /// Live address → its block.
    live: HashMap<u64, LiveBlock>,
    free_slots: Vec<u32>,
    /// Bytes live now; u128 because a crafted trace can have more than 2^64 bytes live (fuzzing
    /// found two allocations of 2^63 overflowing a u64); the peak saturates at `u64::MAX`.
    requested: u128,
    skip_unknown_frees: bool,
    /// Streams seen in `alloc` rows.
    streams: std::collections::HashSet<StreamId>,
}

/// A live block of a [`TraceCompiler`].
#[derive(Clone, Copy, Debug)]
struct LiveBlock {
    slot: u32,
    /// Requested bytes.
    size: u64,
    stream: StreamId,
    /// Index of its `alloc` row.
    index: usize,
}

impl TraceCompiler {
    /// A compiler that refuses frees of addresses that are not live ([`UnknownFree`]).
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether a free of an address that is not live is skipped (as PyTorch's C++ replay script
    /// does) instead of refused.
    pub fn skip_unknown_frees(mut self, skip: bool) -> Self {
        self.skip_unknown_frees = skip;
        self
    }

    /// Compiles row `index` (its position in the trace, for error messages); rows other than
    /// `alloc` and `free_completed` compile to nothing.
    ///
    /// # Errors
    /// [`BadRow::UnknownFree`] for a `free_completed` of an address that is not live, and
    /// [`BadRow::LiveAlloc`] for an `alloc` at an address that is still live, both unless
    /// skipping unknown frees ([`TraceCompiler::skip_unknown_frees`]); likewise
    /// [`BadRow::FreeMismatch`] for a `free_completed` whose size or stream is not its
    /// `alloc`'s (skipping, the free is taken by its address, as PyTorch's replay script does).
    /// The row is then not compiled, and the compiler can go on.
    ///
    /// # Panics
    /// Only with 2^32 blocks live at once (slot indices are `u32`), which would take 128 GiB of
    /// compiled operations first.
    pub fn push(&mut self, index: usize, e: &TraceEvent) -> Result<(), BadRow> {
        let row = index as u64;
        let t = &mut self.trace;
        match e.action {
            TraceAction::Alloc => {
                if !self.skip_unknown_frees {
                    if let Some(&LiveBlock { index: earlier, .. }) = self.live.get(&e.addr) {
                        return Err(LiveAlloc {
                            index,
                            addr: e.addr,
                            earlier,
                        }
                        .into());
                    }
                }
                let slot = self.free_slots.pop().unwrap_or_else(|| {
                    t.slots += 1;
                    u32::try_from(t.slots - 1).expect("fewer than 2^32 blocks live at once")
                });
                t.ops.push(Op {
                    size: e.size,
                    stream: e.stream,
                    slot,
                    row,
                    kind: Kind::Alloc,
                });
                t.counted += 1;
                if self.streams.insert(e.stream) {
                    t.streams = self.streams.len();
                }
                self.requested += u128::from(e.size);
                let live_now = u64::try_from(self.requested).unwrap_or(u64::MAX);
                t.peak_requested = t.peak_requested.max(live_now);
                let block = LiveBlock {
                    slot,
                    size: e.size,
                    stream: e.stream,
                    index,
                };
                if let Some(LiveBlock {
                    slot: old, size, ..
                }) = self.live.insert(e.addr, block)
                {
                    self.requested -= u128::from(size);
                    t.ops.push(Op {
                        size,
                        stream: e.stream,
                        slot: old,
                        row,
                        kind: Kind::Replace,
                    });
                    self.free_slots.push(old);
                }
            }
            TraceAction::FreeCompleted => match self.live.get(&e.addr).copied() {
                Some(b)
                    if !self.skip_unknown_frees && (b.size != e.size || b.stream != e.stream) =>
                {
                    return Err(FreeMismatch {
                        index,
                        addr: e.addr,
                        alloc_index: b.index,
                        alloc_size: b.size,
                        free_size: e.size,
                        alloc_stream: b.stream.0,
                        free_stream: e.stream.0,
                    }
                    .into())
                }
                Some(LiveBlock { slot, size, .. }) => {
                    self.live.remove(&e.addr);
                    self.requested -= u128::from(size);
                    t.ops.push(Op {
                        size,
                        stream: e.stream,
                        slot,
                        row,
                        kind: Kind::Free,
                    });
                    t.counted += 1;
                    self.free_slots.push(slot);
                }
                None if self.skip_unknown_frees => {}
                None => {
                    return Err(UnknownFree {
                        index,
                        addr: e.addr,
                    }
                    .into())
                }
            },
            _ => {}
        }
        Ok(())
    }

    /// The compiled trace.
    pub fn finish(self) -> CompiledTrace {
        self.trace
    }
}

/// A replay stopped by an allocator error.
#[derive(Debug, thiserror::Error)]
#[error("replay stopped at trace event #{index} ({action} of {size} bytes): {source}")]
pub struct ReplayError {
    /// 0-based index of the row.
    pub index: usize,
    /// Its action.
    pub action: TraceAction,
    /// Its size in bytes.
    pub size: u64,
    /// The allocator's error.
    #[source]
    pub source: AllocError,
}

/// What one compiled operation does with its slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// Allocate `size` bytes on `stream` into the slot.
    Alloc,
    /// Free the slot's block (a `free_completed` row): counted, and an error stops the replay.
    Free,
    /// Free the block an `alloc` at a live address replaced: uncounted, errors ignored.
    Replace,
}

/// One operation of a [`CompiledTrace`].
#[derive(Clone, Copy, Debug)]
struct Op {
    /// Bytes requested (`Alloc`), or the freed block's requested bytes.
    size: u64,
    stream: StreamId,
    /// Index into the pointer table.
    slot: u32,
    /// The trace row it came from (for [`ReplayError::index`]).
    row: u64,
    kind: Kind,
}

/// A trace compiled for replay: its `alloc` and `free_completed` rows as operations on dense
/// pointer slots (`Note [Compiled replay]`).
///
/// ```
/// use berth_alloc::{backend::{sim::SimBackend, StreamId}, caching::CachingAllocator};
/// use berth_alloc::replay::CompiledTrace;
/// use berth_alloc::trace::TraceEvent;
/// use berth_alloc::TraceAction;
/// let row = |action, addr, size| TraceEvent { action, addr, size, stream: StreamId::DEFAULT, time_us: 0 };
/// let events = [row(TraceAction::Alloc, 0x100, 4096), row(TraceAction::FreeCompleted, 0x100, 4096)];
/// let trace = CompiledTrace::new(&events);
/// assert_eq!((trace.ops(), trace.peak_requested()), (2, 4096));
/// let report = trace.replay(&CachingAllocator::new(SimBackend::new(1 << 30))).unwrap();
/// assert_eq!(report.peak_reserved, 2 << 20); // one small-pool segment
/// ```
#[derive(Clone, Debug, Default)]
pub struct CompiledTrace {
    ops: Vec<Op>,
    slots: usize,
    counted: u64,
    peak_requested: u64,
    /// Distinct streams of the `alloc` rows.
    streams: usize,
}

impl CompiledTrace {
    /// Compiles `events` by the replay rules of this module, skipping frees of addresses that
    /// are not live (as PyTorch's C++ replay script does; [`CompiledTrace::try_new`] refuses
    /// them). Slots freed by an operation are reused by later allocations, so the pointer table
    /// stays as small as the most blocks live at once.
    ///
    /// # Panics
    /// As [`TraceCompiler::push`].
    pub fn new(events: &[TraceEvent]) -> Self {
        let mut c = TraceCompiler::new().skip_unknown_frees(true);
        for (index, e) in events.iter().enumerate() {
            // Skipping: no row is refused.
            let _ = c.push(index, e);
        }
        c.finish()
    }

    /// Compiles `events` as [`CompiledTrace::new`] does, but refuses a free of an address that
    /// is not live, as PyTorch's allocator does, an alloc at an address that is still live
    /// (this module's docs), and a free whose size or stream is not its alloc's.
    ///
    /// # Errors
    /// [`BadRow`] naming the first such row and its address.
    ///
    /// # Panics
    /// As [`CompiledTrace::new`].
    pub fn try_new(events: &[TraceEvent]) -> Result<Self, BadRow> {
        let mut c = TraceCompiler::new();
        for (index, e) in events.iter().enumerate() {
            c.push(index, e)?;
        }
        Ok(c.finish())
    }

    /// The same operations with every allocation on `stream` (PyTorch's C++ replay puts every
    /// event on the current stream; `berth replay --device cuda:N` does the same).
    pub fn on_stream(mut self, stream: StreamId) -> Self {
        for op in &mut self.ops {
            op.stream = stream;
        }
        self
    }

    /// Allocations plus counted frees of one pass.
    pub fn ops(&self) -> u64 {
        self.counted
    }

    /// Most requested bytes live at once.
    pub fn peak_requested(&self) -> u64 {
        self.peak_requested
    }

    /// Number of distinct streams the trace allocates on (each gets its own address
    /// reservations under expandable segments and `paged`).
    pub fn streams(&self) -> usize {
        self.streams
    }

    /// Replays one pass through `alloc`. Peaks and counters are read from its statistics,
    /// relative to their values at the start, so `alloc` may be warm from an earlier pass
    /// (`peak_reserved` is its `max_memory_reserved`, which includes earlier passes unless the
    /// peaks were reset). Blocks still live at the end are freed, outside the timing.
    ///
    /// # Errors
    /// [`ReplayError`] naming the row at which the allocator failed (out of memory, typically).
    pub fn replay<A: DeviceAllocator + ?Sized>(
        &self,
        alloc: &A,
    ) -> Result<ReplayReport, ReplayError> {
        let before = alloc.stats();
        let mut ptrs = vec![DevicePtr::NULL; self.slots];
        let (elapsed, failure) = self.run(alloc, &mut ptrs);
        for p in ptrs.into_iter().filter(|p| !p.is_null()) {
            let _ = alloc.raw_delete(p);
        }
        if let Some((op, source)) = failure {
            return Err(ReplayError {
                index: op.row as usize,
                action: match op.kind {
                    Kind::Alloc => TraceAction::Alloc,
                    Kind::Free | Kind::Replace => TraceAction::FreeCompleted,
                },
                size: op.size,
                source,
            });
        }
        let after = alloc.stats();
        let device_allocs = (after.num_device_alloc - before.num_device_alloc).max(0) as u64;
        let device_frees = (after.num_device_free - before.num_device_free).max(0) as u64;
        Ok(ReplayReport {
            ops: self.counted,
            peak_requested: self.peak_requested,
            peak_reserved: after.max_memory_reserved(),
            device_allocs,
            device_calls: device_allocs + device_frees,
            ns_per_op: if self.counted == 0 {
                0.0
            } else {
                elapsed.as_nanos() as f64 / self.counted as f64
            },
        })
    }

    /// The timed loop: allocator calls and pointer-table stores only.
    #[inline(never)]
    fn run<A: DeviceAllocator + ?Sized>(
        &self,
        alloc: &A,
        ptrs: &mut [DevicePtr],
    ) -> (std::time::Duration, Option<(Op, AllocError)>) {
        let start = Instant::now();
        let mut failure = None;
        for op in &self.ops {
            let slot = &mut ptrs[op.slot as usize];
            match op.kind {
                Kind::Alloc => match alloc.raw_alloc(op.size as usize, op.stream) {
                    Ok(p) => *slot = p,
                    Err(e) => {
                        failure = Some((*op, e));
                        break;
                    }
                },
                Kind::Free => {
                    if let Err(e) = alloc.raw_delete(std::mem::take(slot)) {
                        failure = Some((*op, e));
                        break;
                    }
                }
                Kind::Replace => {
                    let _ = alloc.raw_delete(std::mem::take(slot));
                }
            }
        }
        (start.elapsed(), failure)
    }
}

/// Replays `events` through `alloc`, which should be fresh (peaks and counters are read from
/// its statistics, relative to their values at the start): [`CompiledTrace::new`] then one
/// [`CompiledTrace::replay`] pass. Blocks still live at the end are freed, outside the timing.
///
/// # Errors
/// [`ReplayError`] naming the row at which the allocator failed (out of memory, typically).
pub fn replay(
    events: &[TraceEvent],
    alloc: &dyn DeviceAllocator,
) -> Result<ReplayReport, ReplayError> {
    CompiledTrace::new(events).replay(alloc)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::sim::SimBackend;
    use crate::caching::CachingAllocator;

    fn row(action: TraceAction, addr: u64, size: u64, stream: u64) -> TraceEvent {
        TraceEvent {
            action,
            addr,
            size,
            stream: StreamId(stream),
            time_us: 0,
        }
    }

    #[test]
    fn compiles_allocs_and_known_frees_into_reused_slots() {
        use TraceAction::*;
        let events = [
            row(Alloc, 0xa00, 1000, 0),
            row(FreeRequested, 0xa00, 1000, 0),
            row(SegmentAlloc, 0xa00, 2 << 20, 0),
            row(Alloc, 0xb00, 3000, 7),
            row(FreeCompleted, 0xa00, 1000, 0),
            row(FreeCompleted, 0xdead, 5, 0), // unknown: skipped by `new`
            row(Alloc, 0xc00, 500, 0),
            row(Alloc, 0xb00, 200, 7), // replaces the live 0xb00
        ];
        let t = CompiledTrace::new(&events);
        let got: Vec<(Kind, u32, u64, u64)> = t
            .ops
            .iter()
            .map(|o| (o.kind, o.slot, o.row, o.size))
            .collect();
        assert_eq!(
            got,
            [
                (Kind::Alloc, 0, 0, 1000),
                (Kind::Alloc, 1, 3, 3000),
                (Kind::Free, 0, 4, 1000),
                (Kind::Alloc, 0, 6, 500),
                (Kind::Alloc, 2, 7, 200),
                (Kind::Replace, 1, 7, 3000),
            ]
        );
        assert_eq!(t.slots, 3);
        assert_eq!(t.ops(), 5);
        // 1000 + 3000 live, then 3000 + 500 + 200 (the replaced block still live a moment).
        assert_eq!(t.peak_requested(), 4000);
        assert_eq!(t.ops[1].stream, StreamId(7));
        let one = t.clone().on_stream(StreamId::DEFAULT);
        assert!(one.ops.iter().all(|o| o.stream == StreamId::DEFAULT));
        // Row 7 allocates 0x20 while row 3's block there is live: refused when not skipping.
        assert_eq!(
            CompiledTrace::try_new(&events).unwrap_err(),
            BadRow::UnknownFree(UnknownFree {
                index: 5,
                addr: 0xdead
            })
        );
        let mut c = TraceCompiler::new();
        let refused: Vec<usize> = events
            .iter()
            .enumerate()
            .filter_map(|(i, e)| c.push(i, e).err().map(|e| e.index()))
            .collect();
        assert_eq!(refused, [5, 7]);
    }

    /// Found by fuzzing: two live allocations of 2^63 bytes overflowed the requested-bytes sum.
    /// The peak saturates, the replay runs (and the policy refuses the requests, typed).
    #[test]
    fn requested_bytes_beyond_u64_saturate() {
        let events = [
            row(TraceAction::Alloc, 0x1000, 1 << 63, 0),
            row(TraceAction::Alloc, 0x2000, 1 << 63, 0),
            row(TraceAction::FreeCompleted, 0x1000, 1 << 63, 0),
            row(TraceAction::FreeCompleted, 0x2000, 1 << 63, 0),
        ];
        let t = CompiledTrace::new(&events);
        assert_eq!(t.peak_requested(), u64::MAX);
        let alloc =
            crate::caching::CachingAllocator::new(crate::backend::sim::SimBackend::new(1 << 30));
        assert!(t.replay(&alloc).is_err(), "the policy refuses 2^63 bytes");
    }

    #[test]
    fn an_empty_trace_has_no_ratio() {
        let alloc = CachingAllocator::new(SimBackend::new(1 << 30));
        let r = replay(&[], &alloc).unwrap();
        assert_eq!((r.ops, r.peak_requested, r.ratio()), (0, 0, None));
        let r = replay(&[row(TraceAction::Alloc, 0x1, 512, 0)], &alloc).unwrap();
        assert_eq!(r.ratio(), Some((2 << 20) as f64 / 512.0));
    }

    #[test]
    fn warm_passes_reuse_the_cache_and_report_their_own_device_calls() {
        let events = [
            row(TraceAction::Alloc, 0x1, 5 << 20, 0),
            row(TraceAction::Alloc, 0x2, 700, 0),
            row(TraceAction::FreeCompleted, 0x1, 5 << 20, 0),
        ];
        let t = CompiledTrace::new(&events);
        let alloc = CachingAllocator::new(SimBackend::new(1 << 30));
        let cold = t.replay(&alloc).unwrap();
        assert_eq!((cold.device_allocs, cold.peak_reserved), (2, 22 << 20));
        let warm = t.replay(&alloc).unwrap();
        assert_eq!((warm.device_allocs, warm.device_calls), (0, 0));
        assert_eq!(warm.ops, 3);
        assert_eq!(alloc.stats().memory_allocated(), 0, "live blocks freed");
    }

    #[test]
    fn an_allocator_error_names_the_row() {
        let events = [
            row(TraceAction::Alloc, 0x1, 1 << 20, 0),
            row(TraceAction::Alloc, 0x2, 2 << 30, 0),
        ];
        let alloc = CachingAllocator::new(SimBackend::new(1 << 30));
        let err = replay(&events, &alloc).unwrap_err();
        assert_eq!(
            (err.index, err.action, err.size),
            (1, TraceAction::Alloc, 2 << 30)
        );
        assert!(err.source.is_out_of_memory(), "{}", err.source);
        assert_eq!(
            alloc.stats().memory_allocated(),
            0,
            "the first block was freed"
        );
    }
}
