//! berth's own device-memory policy, [`PagedBestFit`]: best fit in a per-stream virtual address
//! range, with physical pages mapped on demand and unmapped only when that keeps the peak down.
//!
//! # Note [Paged best fit]
//! PyTorch's caching allocator wastes memory in two ways: blocks are carved out of fixed
//! segments, so free space in one segment cannot serve a request that straddles two; and cached
//! free segments are never returned until `empty_cache`. Expandable segments fix the first for
//! growth at the end of one segment only. This policy separates address from memory entirely:
//!
//! 1. Each stream owns one large virtual reservation ([`crate::VirtualMemoryBackend::reserve`])
//!    managed as coalesced free extents, mapped or not. A request (rounded to 512 bytes, as
//!    PyTorch's `kMinBlockSize`) takes a good fit by size class (exact up to 1 MiB, within 1/64
//!    above: `Note [Size classes]`); among the first 16 candidates it prefers the placement
//!    (start or end of the extent) that needs the fewest unmapped pages. Every step costs the
//!    same however many blocks are live (`Note [Constant-time arena]`).
//! 2. The pages a block touches are mapped on demand, consecutive pages in one `map` call
//!    (runs longer than [`MAX_UNIT_BYTES`] in several: `Note [Mapping units]`). Freed blocks
//!    stay mapped (cached) so the next request usually needs no backend call.
//! 3. When mapping would raise mapped memory above both its high-water mark and a headroom of
//!    1/[`HEADROOM_DIV`] over the most bytes ever live, entirely free mapping units elsewhere
//!    (any stream, after synchronizing that stream) are unmapped first, biggest runs of them
//!    first, so the peak grows past the headroom only when live data needs it. Only whole
//!    units are unmapped, as the backend requires (`Note [Mapping units]`). The headroom absorbs the
//!    differences in layout between repetitions of a workload (training steps, replay passes):
//!    without it, each repetition unmapped pages the next one mapped again. On `gpt2_train`
//!    (measured when the headroom was 1/8) that was 182 map/unmap calls (8 GiB remapped) in the second pass and 104 in the third,
//!    4.6 µs per operation on an H200; with it, one call in the second pass and none after, for
//!    a first-pass peak of 1.063× the requested bytes instead of 1.011× (steady state: 1.064×
//!    instead of 1.068×; PyTorch's expandable segments: 1.065×).
//! 4. Step 3 costs backend calls, each tens of microseconds on a GPU. A budget can bound them
//!    ([`PagedTuning::calls_per_20mib`]): unmapping is then allowed only while the calls made
//!    so far stay below that many per 20 MiB of the peak, and out of budget mappings are made
//!    one extra page long instead. **Off by default** ("Time, not calls" below).
//! 5. Step 3 can unmap in every repetition when a repetition needs more pages than the
//!    headroom allows. With [`PagedTuning::churn_div`] set, an unmap of step 3 made while the
//!    live peak has not grown since the previous one is taken as such a repeat and the
//!    headroom grows by 1/`churn_div` of the bytes it unmapped, so the repeats die out (on
//!    `unet_diffusion_train` at a divisor of 4: 76 device calls in two warm passes down to 9,
//!    for a first-pass peak 2.7% higher). **Off by default**, for the same reason.
//!
//! On the fifteen committed traces this gives peak reserved 1.0001×–1.094× the peak requested
//! bytes (PyTorch: 1.001×–1.37× across its three modes); `BENCHMARKS.md` has the table.
//!
//! # Time, not calls (the constants since 2026-12-03)
//! The constants were first chosen under a count of backend calls (at most 4× the segments
//! PyTorch's default makes, and one call per 5000 operations in warm passes), a stand-in for
//! "mapping must not cost time". Counted in time instead, calls are cheap: on the H200 a map
//! cost about 45 µs in a first pass and a warm-pass call about 100 µs (an unmap waits for its
//! stream), a `cudaMalloc` about 62 µs (`berth replay --device cuda:0`, cold minus warm time
//! over the calls made), so the calls of the setting below cost under 1% of each recorded
//! program's time, and the memory the count forced is not cheap. And since
//! the CUDA backend keeps no unmapped handles (`Note [VMM handles]` in `berth-cuda`), every
//! byte this policy maps is a byte the driver sees, so the peak is what is judged.
//!
//! The constants ([`PagedTuning`]) are therefore: headroom 1/16 ([`HEADROOM_DIV`]), units of at
//! most 32 MiB ([`MAX_UNIT_BYTES`]) with no bound on units per run ([`MAX_RUN_UNITS`] = 0), no
//! call budget (step 4 off) and no churn rule (step 5 off). Chosen over all fifteen committed
//! traces (`tests/data/README.md`; grids over headroom 0–64, units 2–64 MiB, units per run
//! 0 / 2 / 4, budget 2 / none, churn 0 / 4; `examples/paged_sweep.rs`,
//! `scripts/traces/paged_loo.py`) by first: peak reserved at or under the smallest of PyTorch's
//! three modes on every trace, in the first pass and after three passes; second: device calls
//! costing at most 1% of the program's time (warm passes) and at most 1% more than PyTorch's
//! `cudaMalloc`s in the first pass, at the costs above; then the geometric-mean waste (peak
//! reserved ÷ peak requested − 1). These constants: **2.17%** in the first pass, 2.26% after
//! three (before: 2.50% and 2.54%, with `lstm_varlen_train` over expandable segments by
//! 4 MiB, and `unet_diffusion_train` over PyTorch's default, its smallest mode, by 0.83% after
//! three passes); no trace over PyTorch's
//! smallest mode; the calls within both time targets. The leave-one-out check picks them on 14
//! of the 15 folds (leaving out `lstm_varlen_train`, it picks a headroom of 1/64 with 16 MiB
//! units and 2 per run, which leaves that trace over expandable segments after three passes).
//! The choice leans on the call costs: at 50 µs a map and 78 µs a `cudaMalloc` (an earlier
//! host measurement) the same check picks 16 MiB units with 2 per run (2.31%, one trace over
//! after three passes), since 32 MiB units then cost just over 1% of `bert_varlen_train`'s and
//! `gpt2_train`'s first pass. `paged_loo.py` prints the table and the frontier.
//! - 1.5% waste is reached only with a headroom of 1/48 or less and units of at most 12 MiB
//!   (1.49% at 1/64 and 8 MiB): those remap pages in every warm pass, 8–15% of `gpt2_train`'s
//!   time at 100 µs a call (1,522 calls a pass of 1.0 s at 8 MiB), and small handles copy slower
//!   than large ones (`Note [VMM handles]`). Units of 16 MiB: 2.13% / 2.34%, warm calls 0.20%,
//!   first pass +1.94%: 32 MiB units waste less after three passes and halve the calls.
//! - Bounding units per run to 2 (the earlier rule, for large handles) costs 0.1–0.3 points: a
//!   small block pinning half of a freed long run is memory. The copy bandwidth of 32 MiB
//!   handles is measured by berth-cuda's GPU test `large_handles_copy_at_cumemalloc_bandwidth`
//!   (`BENCHMARKS.md`).
//!
//! The paragraphs below were measured at the earlier constants (headroom 1/8, 2 calls per
//! 20 MiB, 64 MiB units, at most 2 per run, churn divisor 4); what they say about where waste
//! comes from still holds.
//!
//! Where the waste is (`examples/paged_waste.rs`, 2026-12-01): at the moment each trace's peak
//! reserved was set, summed over the fifteen traces, the free mapped memory was 2,608 MiB of
//! whole pages inside mapping units that also hold a live block (no unmap can release them:
//! `Note [Mapping units]`), 1,100 MiB of wholly free units (left by step 3's headroom) and
//! 426 MiB on pages shared with a live block. The first kind is the largest on
//! `llm_ckpt_varlen_train` (768 MiB), `lstm_varlen_train` (532) and `gpt2_train` (242); on
//! `unet_diffusion_train` (118, with 128 MiB of wholly free units) the peak comes while
//! 128 MiB requests find no mapped hole that large and step 3 finds nothing to unmap
//! (typically a 64 MiB unit of a freed block holding one 32 MiB block). The same placement
//! with 2 MiB units, no headroom, no call budget and no step 5 wastes 0.68% (geometric mean;
//! `unet_diffusion_train` 1.13%), but makes about ten times the calls (2,216 first-pass calls
//! on `unet_diffusion_train`, target 236) and thousands in warm passes; 64 MiB units with the
//! same freedom still waste 2.15% (`unet_diffusion_train` 14.25%): the unit is what costs,
//! and the call targets are what fix its size.
//!
//! Tried at the earlier constants and not kept (geometric-mean waste over the fifteen, against
//! 2.498% then; every one missed more of the call-count targets of then, or wasted more):
//! - Pinning as a cost: a placement that would leave part of a wholly free unit free costs
//!   1/4 to 2 × the bytes it leaves, against unmapped bytes (so mapping fresh memory can win):
//!   6.4% to 15.7%; fresh mappings pile up under the headroom (`bert_varlen_train` +2.1 GB at
//!   1/2).
//! - Pinning as a tie-break among mapped placements: before the extent size 4.75%, after it
//!   4.44% (both also taking the extent's other end when it pins less; `bert_varlen_train`
//!   0.01% → 9.35%), between extents only 2.54–2.55% (`llm_ckpt_varlen_train` 10.63% →
//!   13.78% and over the warm-call target).
//! - A second arena per stream for blocks up to a size (PyTorch's small pool): 2.52% at
//!   256 KiB, 3.00% at 1 MiB, 4.79% at 4 MiB, 6.20% at 16 MiB: the arenas stop sharing free
//!   memory.
//! - Lifetime arenas with an oracle (blocks living longer than 1%, 5%, 20% or 50% of the
//!   trace's operations, read from the trace itself, in their own arena): 8.4%, 7.2%, 4.3%,
//!   4.4%. No predictor of lifetime can beat its oracle.
//! - Address order among the fitting extents of a class instead of the smallest: 2.40%, from
//!   two traces (`finetune_reload_weights` 2.32% → 0.59%, `llm_ckpt_varlen_train` 10.63% →
//!   10.12%); `gpt2_generate` goes from 5.92% to 7.44%, 6 MiB above expandable segments, and
//!   six more traces lose 0.05–0.65 points. Over 180 settings of the constants (headroom 4–16,
//!   1.5–3 calls, 32/64 MiB units, churn 2–8, 2/4 units per run) the check still picked the
//!   constants of then,
//!   with those two misses.
//! - Blocks up to 256 KiB … 32 MiB placed at the high end of their extent (two-ended
//!   placement): 3.7% to 4.6%.
//! - Long runs cut into units growing from 64 MiB (64, 64, 128, 256, … from the low end, or
//!   mirrored): 2.54% / 2.50% (`lstm_varlen_train` 9.41% → 12.09% from the low end).
//! - Re-cutting units: when a block would leave at least half of a wholly free unit free (and
//!   at least 8, 16, 32 or 128 MiB of it), the unit is unmapped and mapped again as the
//!   block's pages and the rest (a remap, 2–4 calls): 2.47–2.48%. Only `lstm_varlen_train`'s
//!   peak falls (9.41% → 7.97–8.14%, under expandable segments), but its calls go to 149–224
//!   (target 112) and its warm passes to 36–192; elsewhere the re-cuts spend the call budget
//!   (`bert_varlen_train` 1,540 calls at 8 MiB) for no lower peak.
//! - Unmapping smallest runs first, highest addresses first, or the smallest run that covers
//!   the need first: 2.51–2.52%. Scanning 4, 64 or 256 candidates instead of 16: 2.50%.
//!
//! # Note [Mapping units]
//! Each `map` call is one mapping, backed by one physical handle on CUDA, and the driver unmaps
//! whole mappings only (`cuMemMap` maps a handle from offset 0; `cuMemUnmap` cannot release
//! part of one): the contract of [`crate::VirtualMemoryBackend::unmap`]. Until 2026-12-01 the
//! CUDA backend gave every 2 MiB page its own handle so that any page could be unmapped alone,
//! and a 4 GiB device-to-device copy between `paged` buffers ran at 0.75× (in a later run
//! 0.72×) the bandwidth of
//! `cuMemAlloc` buffers on an H200 (PyTorch's expandable segments, 20 MiB handles: 0.95×).
//! Now each run of pages is mapped in *units*, one handle each, and only whole units go:
//!
//! 1. A run of unmapped pages (step 2 above) of up to [`MAX_UNIT_BYTES`] (32 MiB) is one unit,
//!    one `map` call; a longer run is cut into ⌈length / 32 MiB⌉ units of equal size (± one
//!    page). [`PagedTuning::max_run_units`] can also bound the units per run (2 until
//!    2026-12-03: long runs then became two halves, fewer calls and larger handles, but a small
//!    block could pin half of a freed long run; judged by time rather than by calls, the bound
//!    is off: `Note [Paged best fit]`, "Time, not calls"). [`PagedBestFit::with_max_unit`] and
//!    [`PagedTuning`] set other bounds.
//! 2. The policy remembers its units (`units.rs`). Step 3, `empty_cache` and the
//!    out-of-memory retry unmap runs of adjacent units that lie entirely inside one free
//!    extent (every byte of them free), each run in one `unmap` call. The simulator refuses
//!    an unmap that splits a mapping ([`crate::BackendError::SplitsMapping`]), as CUDA does,
//!    so every simulated test that unmaps checks this.
//! 3. Why bounded: a unit stays mapped while any byte of it is live, and placement prefers
//!    mapped memory, so after a big block is freed, small blocks placed on its memory pin the
//!    units under them. Unbounded, one 1 MiB block would pin a whole freed 4 GiB block; at
//!    32 MiB it pins at most 32 MiB (64 MiB straddling two units), as a live block pins a
//!    20 MiB page of PyTorch's expandable segments.
//! 4. The size, as first measured (64 MiB was the bound then): on the five traces (one pass, streams as recorded) peak reserved stays
//!    within 6 MiB (0.11%) of the page-granular policy's for every bound from 2 MiB to
//!    unbounded, because the headroom of step 3 makes unmapping rare and what it unmaps is
//!    mostly whole free runs anyway. The bound sets the number of calls; per trace
//!    (`bert_varlen_train` / `gpt2_generate` / `gpt2_train` / `resnet50_train` /
//!    `two_stream_pipeline`), page-granular before: 213 / 82 / 244 / 123 / 21; units of at
//!    most 2 MiB: 7731 / 350 / 4391 / 2846 / 139; 20 MiB: 910 / 87 / 564 / 346 / 23;
//!    32 MiB: 607 / 84 / 424 / 249 / 21; **64 MiB: 342 / 84 / 304 / 165 / 21**; 256 MiB:
//!    230 / 82 / 258 / 117 / 21; unbounded: 209 / 82 / 244 / 117 / 21. 64 MiB handles are
//!    3.2× PyTorch's 20 MiB ones, keep calls within 1.6× of before (`bert_varlen_train`) and
//!    bound what one live block pins. berth-cuda's GPU test
//!    `large_handles_copy_at_cumemalloc_bandwidth` measures the d2d bandwidth for units of
//!    2 MiB to 4 GiB (on the H200, 2026-12-03: 32 MiB 0.985× and 64 MiB 0.977× of
//!    `cuMemAlloc` memory).
//! 5. A run is never cut into more than [`UNITS_PER_RUN_CAP`] (65,536) units, whatever the
//!    bounds above say: a longer run gets longer units. Each unit is a `map` call and an entry
//!    here and in the backend, so without a cap one request's bookkeeping grew with its size:
//!    64 PiB on the simulator (`berth replay --capacity 64PiB`, or a `MetaPlan`) was 2^31
//!    units of 32 MiB and ran out of memory (newcomer defect 4, which expandable segments had
//!    too). The cap starts at runs of 2 TiB, so no run on a real device changes.
//! 5. Cut evenly, not at multiples of 64 MiB in address: aligned cutting made 25% more calls
//!    (`bert_varlen_train` 430, `gpt2_train` 375, `resnet50_train` 201) for the same peaks,
//!    since short runs crossing a boundary split in two and long ones get head and tail units
//!    of a few pages.
//!
//! The CUDA backend releases a unit's physical handle when the unit is unmapped and keeps
//! nothing back (`Note [VMM handles]` in `berth-cuda`), so the mapped units are exactly the
//! physical memory this policy holds: its `reserved_bytes`.
//!
//! # Note [Paged address space]
//! A stream's arena starts with one reservation of twice the device's memory (2^40 bytes when
//! the backend does not say), so one stream can place anything the device holds. Address space
//! is finite too: the simulator's is 2^62 bytes, so at its largest capacity (64 PiB) only 31
//! such reservations fit, and the 32nd stream failed with a backend error, while a GPU's
//! 47-bit or 57-bit range ends likewise after enough streams (newcomer defect 10: with
//! `--capacity` ≥ 32 PiB a 64-stream trace failed). When the backend has no range of that
//! size left, the arena reserves only the request's own pages, and a later request that does
//! not fit its arena reserves again the same way (a full-size try, then its pages: two calls).
//! Taking a half, a quarter, ... of the full size instead gave each new stream half of what
//! was left, which ran out after 30 more streams where pages alone serve millions. Only when
//! not even the request's pages can be reserved is it an [`AllocError::Backend`] error (the
//! reservation's `OutOfMemory` from the backend: address space, not device memory, so no
//! out-of-memory, as expandable segments report it). While
//! the address space lasts nothing changes: the first reservation of each stream is as
//! before, so every committed trace replays to the same figures.
//!
//! # Note [`record_stream` and deferred free]
//! A block used on other streams (`record_stream`) is not returned to its extent on free:
//! one event is recorded per such stream and the block waits in a pending list until every
//! event has completed, checked at the next allocation and in `empty_cache` (PyTorch's
//! `insert_events` / `process_events`). Pages are unmapped only after an event recorded on the
//! owning stream has been synchronized, so no queued kernel can touch an unmapped page.
//!
//! Private pools (CUDA graphs, `torch.cuda.MemPool`) get arenas of their own:
//! `Note [Private pools in paged]` in `pools.rs`.
//!
//! # Note [Lock discipline]
//! One mutex guards the state. Unlike PyTorch's segment `cudaMalloc`, `map`/`unmap` run under
//! it (as PyTorch's expandable segments do): placement and mapping must agree on the page map.

mod arena;
mod bins;
mod checkpoint;
mod pages;
mod pools;
mod sleep;
mod snapshot;
mod state;
mod tag_table;
mod units;

use std::collections::{BTreeMap, HashSet};

use crate::allocator::OomObserver;
use crate::allocator::{Allocation, AllocationOwner, DeviceAllocator};
use crate::backend::{DevicePtr, MemoryBackend, StreamId};
use crate::error::AllocError;
use crate::host::BackupMemory;
use crate::ids::{MempoolId, StreamFilter};
use crate::plumbing::{self, OomObservers, StickyError};
use crate::snapshot::MemorySnapshot;
use crate::stats::MemoryStats;
use crate::sync::{Arc, SpinGuard, SpinMutex};
use crate::tags::{SleepReport, SleepStats, WakeReport};

use state::State;

/// Backend calls allowed per 20 MiB of peak mapped memory before unmapping stops (see
/// `Note [Paged best fit]`, step 4): no bound by default. Calls are judged by the time they
/// take, not counted (`Note [Paged best fit]`, "Time, not calls").
pub const CALLS_PER_20MIB: f64 = f64::INFINITY;

/// The longest mapping unit, in bytes: runs of pages longer than this are mapped in several
/// `map` calls of at most this size each (`Note [Mapping units]`).
pub const MAX_UNIT_BYTES: u64 = 32 << 20;

/// A run of pages mapped at once is cut into at most this many units (`Note [Mapping units]`);
/// 0, the default, sets no such bound: every unit is at most [`MAX_UNIT_BYTES`].
pub const MAX_RUN_UNITS: u64 = 0;

/// Whatever [`PagedTuning::max_run_units`] says, a run of pages is never cut into more than
/// this many units: past `UNITS_PER_RUN_CAP` × [`MAX_UNIT_BYTES`] = 2 TiB (more than any GPU
/// holds) its units grow instead, so the units, `map` calls and bookkeeping of one request do
/// not grow with its size (`Note [Mapping units]`, item 5).
pub const UNITS_PER_RUN_CAP: u64 = 1 << 16;

/// Mapped memory may exceed the most bytes ever live by this fraction (1/16) before free pages
/// are unmapped to make room (`Note [Paged best fit]`, step 3).
pub const HEADROOM_DIV: u64 = 16;

/// A repeated unmap grows the headroom by 1/`CHURN_DIV` of the bytes it unmapped
/// (`Note [Paged best fit]`, step 5); 0, the default, turns step 5 off.
pub const CHURN_DIV: u64 = 0;

/// The constants of `Note [Paged best fit]`, settable for experiments: the leave-one-out check
/// of `scripts/traces/paged_loo.py` replays every trace under many of them
/// (`examples/paged_sweep.rs`). [`PagedTuning::default`] is what [`PagedBestFit::new`] uses.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PagedTuning {
    /// Longest mapping unit in bytes (`Note [Mapping units]`; default [`MAX_UNIT_BYTES`]).
    pub max_unit_bytes: u64,
    /// A run of pages mapped at once is cut into at most this many units, longer than
    /// `max_unit_bytes` when it must be (`Note [Mapping units]`; default [`MAX_RUN_UNITS`]).
    /// 0: no bound, only `max_unit_bytes`.
    pub max_run_units: u64,
    /// Mapped memory may exceed the most bytes ever live by 1/`headroom_div` before free units
    /// are unmapped (step 3; default [`HEADROOM_DIV`]). 0 means no headroom.
    pub headroom_div: u64,
    /// Backend calls allowed per 20 MiB of peak mapped memory before unmapping stops (step 4;
    /// default [`CALLS_PER_20MIB`]).
    pub calls_per_20mib: f64,
    /// A step-3 unmap that repeats with no new live peak grows the headroom by
    /// 1/`churn_div` of the bytes it unmapped (step 5; default [`CHURN_DIV`]). 0 turns step 5
    /// off.
    pub churn_div: u64,
}

impl Default for PagedTuning {
    fn default() -> Self {
        PagedTuning {
            max_unit_bytes: MAX_UNIT_BYTES,
            max_run_units: MAX_RUN_UNITS,
            headroom_div: HEADROOM_DIV,
            calls_per_20mib: CALLS_PER_20MIB,
            churn_div: CHURN_DIV,
        }
    }
}

/// berth's own policy: best fit over per-stream virtual ranges, physical pages mapped on
/// demand and unmapped only when that keeps the peak down. See `Note [Paged best fit]` in this
/// module.
///
/// Needs a backend with [`crate::VirtualMemoryBackend`] ([`crate::backend::sim::SimBackend`]
/// has it; so does the CUDA backend through `cuMemCreate` / `cuMemMap`). Cheap to clone: clones
/// share the same state.
pub struct PagedBestFit<B: MemoryBackend> {
    shared: Arc<Shared<B>>,
}

impl<B: MemoryBackend> Clone for PagedBestFit<B> {
    fn clone(&self) -> Self {
        PagedBestFit {
            shared: Arc::clone(&self.shared),
        }
    }
}

/// The state behind a [`PagedBestFit`], shared with its [`Allocation`]s.
struct Shared<B: MemoryBackend> {
    backend: B,
    /// The policy's state (`Note [Spin lock]` in `crate::sync`).
    state: SpinMutex<State<B::Fence>>,
    sticky: StickyError<AllocError>,
    observers: OomObservers,
}

impl<B: MemoryBackend> PagedBestFit<B> {
    /// A policy over `backend`. Reserves nothing until the first allocation on each stream.
    /// Mapping units are at most [`MAX_UNIT_BYTES`] long.
    ///
    /// # Errors
    /// [`AllocError::Unsupported`] when the backend has no virtual-memory capability.
    pub fn new(backend: B) -> Result<Self, AllocError> {
        Self::with_max_unit(backend, MAX_UNIT_BYTES)
    }

    /// As [`PagedBestFit::new`], with mapping units of at most `max_unit_bytes` bytes (rounded
    /// up to whole pages of the backend's granularity; `Note [Mapping units]`): one physical
    /// handle each on CUDA. Smaller units keep more memory unmappable and cost more backend
    /// calls; larger ones copy faster on a GPU.
    ///
    /// # Errors
    /// [`AllocError::Unsupported`] when the backend has no virtual-memory capability.
    pub fn with_max_unit(backend: B, max_unit_bytes: u64) -> Result<Self, AllocError> {
        Self::with_tuning(
            backend,
            PagedTuning {
                max_unit_bytes,
                ..PagedTuning::default()
            },
        )
    }

    /// As [`PagedBestFit::new`], with the policy's constants set by `tuning`.
    ///
    /// # Errors
    /// [`AllocError::Unsupported`] when the backend has no virtual-memory capability.
    pub fn with_tuning(backend: B, tuning: PagedTuning) -> Result<Self, AllocError> {
        let Some(vm) = backend.as_virtual() else {
            return Err(AllocError::Unsupported {
                feature: "the paged best-fit policy",
                needs: "virtual memory (reserve/map/unmap)",
            });
        };
        let page = vm.granularity() as u64;
        let total = backend.mem_info().map(|m| m.total_bytes).unwrap_or(0);
        let shared = Shared {
            backend,
            state: SpinMutex::new(State::new(page, total, tuning)),
            sticky: StickyError::new(),
            observers: OomObservers::new(),
        };
        Ok(PagedBestFit {
            shared: Arc::new(shared),
        })
    }

    /// The backend (for its call counters in tests and `berth replay`).
    pub fn backend(&self) -> &B {
        &self.shared.backend
    }

    /// Backend calls this policy made that map or unmap device memory.
    pub fn device_calls(&self) -> u64 {
        self.shared.lock().device_calls()
    }

    /// Makes every pending cross-stream free whose events have completed reusable now
    /// (PyTorch's `process_events`); also runs at each allocation.
    ///
    /// # Errors
    /// [`AllocError::Backend`] if an event query fails.
    pub fn process_events(&self) -> Result<(), AllocError> {
        self.shared.lock().process_events(&self.shared.backend)
    }
}

impl<B: MemoryBackend> Shared<B> {
    fn lock(&self) -> SpinGuard<'_, State<B::Fence>> {
        // The state is consistent between calls; a panic elsewhere does not corrupt it.
        self.state.lock()
    }
}

impl<B: MemoryBackend> AllocationOwner for Shared<B> {
    fn release(&self, ptr: DevicePtr) {
        if let Err(e) = self.lock().free(&self.backend, ptr) {
            self.sticky.record(e);
        }
    }

    fn record_stream(&self, ptr: DevicePtr, stream: StreamId) -> Result<(), AllocError> {
        self.lock().record_stream(ptr, stream)
    }
}

impl<B: MemoryBackend> DeviceAllocator for PagedBestFit<B> {
    fn policy_name(&self) -> &str {
        "paged"
    }

    fn allocate(&self, bytes: usize, stream: StreamId) -> Result<Allocation, AllocError> {
        let ptr = self.raw_alloc(bytes, stream)?;
        Ok(plumbing::wrap(ptr, bytes, stream, &self.shared))
    }

    fn raw_alloc(&self, bytes: usize, stream: StreamId) -> Result<DevicePtr, AllocError> {
        if bytes == 0 {
            return Ok(DevicePtr::NULL);
        }
        let r = self
            .shared
            .lock()
            .malloc(&self.shared.backend, bytes as u64, stream);
        // The state guard is gone: observers may use the allocator.
        if let Err(e) = &r {
            self.shared.observers.notify(e);
        }
        r
    }

    fn raw_delete(&self, ptr: DevicePtr) -> Result<(), AllocError> {
        if ptr.is_null() {
            return Ok(());
        }
        self.shared.lock().free(&self.shared.backend, ptr)
    }

    fn raw_record_stream(&self, ptr: DevicePtr, stream: StreamId) -> Result<(), AllocError> {
        self.shared.lock().record_stream(ptr, stream)
    }

    fn empty_cache(&self) -> Result<(), AllocError> {
        self.shared.lock().empty_cache(&self.shared.backend)
    }

    fn stats(&self) -> MemoryStats {
        self.shared.lock().stats
    }

    fn allocated_and_reserved(&self) -> (u64, u64) {
        let lock = self.shared.lock();
        (lock.stats.memory_allocated(), lock.stats.memory_reserved())
    }

    fn reset_peak_memory_stats(&self) {
        self.shared.lock().stats.reset_peak();
    }

    fn reset_accumulated_memory_stats(&self) {
        self.shared.lock().stats.reset_accumulated();
    }

    fn snapshot(&self) -> MemorySnapshot {
        self.shared.lock().snapshot()
    }

    fn record_memory_history(&self, max_entries: Option<usize>) {
        self.shared.lock().set_history(max_entries);
    }

    fn set_memory_fraction(&self, fraction: f64) -> Result<(), AllocError> {
        let (cap, _) = plumbing::fraction_cap(&self.shared.backend, fraction)?;
        self.shared.lock().cap = Some(cap);
        Ok(())
    }

    fn attach_oom_observer(&self, observer: OomObserver) {
        self.shared.observers.push(observer);
    }

    fn set_device_index(&self, device: i32) {
        self.shared.lock().device = device;
    }

    fn memory_summary(&self, abbreviated: bool) -> String {
        let driver = self.shared.backend.mem_info().ok();
        let st = self.shared.lock();
        crate::summary::memory_summary(&st.stats, st.device, "paged", abbreviated, driver)
    }

    fn check_err(&self) -> Result<(), AllocError> {
        self.shared.sticky.take()
    }

    fn memory_stats(&self) -> BTreeMap<String, i64> {
        self.stats().to_map()
    }

    fn create_or_incref_pool(&self, id: MempoolId) -> Result<(), AllocError> {
        self.shared.lock().create_or_incref_pool(id)
    }

    fn create_pool_with_source(
        &self,
        id: MempoolId,
        source: std::sync::Arc<dyn crate::backend::SegmentSource>,
    ) -> Result<(), AllocError> {
        let _ = (id, source);
        Err(crate::allocator::lacks_pool_sources(
            "paged",
            "paged maps its own pages into one reserved range and has no segments to take \
             from an allocator; for sleep and wake (what vLLM's MemPool allocator is for) use \
             paged's own (berth_torch.region, sleep, wake), else use the \"pytorch\" policy",
        ))
    }

    fn begin_allocate_to_pool(
        &self,
        id: MempoolId,
        filter: StreamFilter,
    ) -> Result<(), AllocError> {
        self.shared.lock().begin_allocate_to_pool(id, filter)
    }

    fn end_allocate_to_pool(&self, id: MempoolId) -> Result<(), AllocError> {
        self.shared.lock().end_allocate_to_pool(id)
    }

    fn release_pool(&self, id: MempoolId) -> Result<(), AllocError> {
        self.shared.lock().release_pool(&self.shared.backend, id)
    }

    fn pool_use_count(&self, id: MempoolId) -> u32 {
        self.shared.lock().pool_use_count(id)
    }

    fn check_pool_live_allocations(
        &self,
        id: MempoolId,
        expected: &HashSet<DevicePtr>,
    ) -> Result<bool, AllocError> {
        self.shared.lock().check_pool_live_allocations(id, expected)
    }

    fn empty_pool_cache(&self, id: MempoolId) -> Result<(), AllocError> {
        self.shared
            .lock()
            .empty_pool_cache(&self.shared.backend, id)
    }

    fn set_use_on_oom(&self, id: MempoolId, on: bool) -> Result<(), AllocError> {
        self.shared.lock().private.set_use_on_oom(id, on)
    }

    fn set_no_split(&self, id: MempoolId) -> Result<(), AllocError> {
        let _ = id;
        Err(AllocError::PolicyLacks {
            feature: "no-split private pools (torch.cuda.MemPool(no_split=True))",
            policy: "paged".into(),
            instead: "use policy \"pytorch\" or \"expandable\", whose segments a no-split pool \
                      keeps whole; paged maps memory in units, not segments",
        })
    }

    fn restore_pool(
        &self,
        id: MempoolId,
        live: &[(DevicePtr, u64)],
    ) -> Result<crate::PoolRestore, AllocError> {
        self.shared
            .lock()
            .restore_pool(&self.shared.backend, id, live)
    }

    fn sleep(
        &self,
        tags: &[&str],
        offload: &[&str],
        host: Option<std::sync::Arc<dyn BackupMemory>>,
    ) -> Result<SleepReport, AllocError> {
        self.shared
            .lock()
            .sleep(&self.shared.backend, tags, offload, host)
    }

    fn wake(&self, tags: &[&str]) -> Result<WakeReport, AllocError> {
        let (report, errors) = self.shared.lock().wake(&self.shared.backend, tags)?;
        // A backup's host memory that could not be freed does not fail the wake.
        for e in errors {
            self.shared.sticky.record(e);
        }
        Ok(report)
    }

    fn sleep_stats(&self) -> SleepStats {
        self.shared.lock().sleep_stats()
    }
}
