//! The C functions of berth's full PyTorch allocator, beyond the pluggable hooks of
//! [`crate::abi`]: statistics, snapshots and history, private pools, and the cache queries
//! PyTorch's `CUDAAllocator` interface asks for
//! (<https://github.com/pytorch/pytorch/blob/main/c10/cuda/CUDACachingAllocator.h>).
//!
//! Their caller is the C++ allocator of the Python package (`berth_torch/csrc/allocator.cpp`,
//! `Note [The full allocator]` there), which PyTorch installs in place of its own, so that
//! `torch.cuda.memory_stats()`, `torch.cuda.memory._snapshot()`, `torch.cuda.MemPool`, CUDA
//! graphs and `torch.compile(mode="reduce-overhead")` reach berth's policies.
//!
//! Conventions: a function returning `c_int` returns 0 (or a count / a boolean as 0 or 1) on
//! success and -1 on failure, with the reason in [`crate::abi::berth_torch_last_error`]; a
//! private pool is PyTorch's `MempoolId_t`, the pair `(id0, id1)`; a device is PyTorch's
//! device index. Nothing unwinds into C.

use crate::abi::guarded;
use crate::install::{self, HookError};
use berth_alloc::snapshot::SegmentType;
use berth_alloc::{
    AllocError, BlockState, DeviceAllocator, DevicePtr, MemorySnapshot, SegmentSource,
    StreamFilter, StreamId,
};
use berth_cuda::memory;
use std::collections::HashSet;
use std::ffi::{c_char, c_int, c_void, CString};
use std::sync::Arc;

/// Runs `f` on `device`'s allocator (built on first use) inside its context scope.
fn on_device<T>(
    device: c_int,
    f: impl FnOnce(&dyn DeviceAllocator) -> Result<T, AllocError>,
) -> Result<T, HookError> {
    let inst = install::installed()?;
    let _scope = inst.scope(device)?;
    let a = inst.allocator(device)?;
    f(a.as_ref()).map_err(|source| HookError::Alloc { device, source })
}

/// 0 for `Ok`, -1 for an error (kept for `berth_torch_last_error`).
fn status(r: Result<(), String>) -> c_int {
    if r.is_ok() {
        0
    } else {
        -1
    }
}

// ---- statistics ---------------------------------------------------------------------------

/// Called once per statistic: `key` is PyTorch's name (`"allocated_bytes.all.current"`), valid
/// only during the call.
pub type StatVisitor = unsafe extern "C" fn(ctx: *mut c_void, key: *const c_char, value: i64);

/// Calls `visit(ctx, key, value)` for every statistic of `device` (`torch.cuda.memory_stats`'s
/// keys and meanings); none for a device with no allocator yet, as PyTorch's zeroed statistics.
/// Returns 0, or -1 when nothing is installed or `visit` is null.
///
/// # Safety
/// `visit` is null or callable with `ctx` and a valid key for the duration of this call.
#[no_mangle]
pub unsafe extern "C" fn berth_torch_visit_stats(
    device: c_int,
    visit: Option<StatVisitor>,
    ctx: *mut c_void,
) -> c_int {
    let stats = guarded(|| {
        let inst = install::installed()?;
        Ok(inst.existing(device).map(|a| a.memory_stats()))
    });
    let (Some(visit), Ok(stats)) = (visit, stats) else {
        return -1;
    };
    for (key, value) in stats.into_iter().flatten() {
        if let Ok(key) = CString::new(key) {
            // SAFETY: the caller's contract; `key` lives until after the call.
            unsafe { visit(ctx, key.as_ptr(), value) };
        }
    }
    0
}

/// `torch.cuda.reset_peak_memory_stats(device)`: every peak set to its current value. A device
/// with no allocator has nothing to reset. Returns 0, or -1.
#[no_mangle]
pub extern "C" fn berth_torch_reset_peak_stats(device: c_int) -> c_int {
    status(guarded(|| {
        if let Some(a) = install::installed()?.existing(device) {
            a.reset_peak_memory_stats();
        }
        Ok(())
    }))
}

/// `torch.cuda.reset_accumulated_memory_stats(device)`: the accumulated counters zeroed.
/// Returns 0, or -1.
#[no_mangle]
pub extern "C" fn berth_torch_reset_accumulated_stats(device: c_int) -> c_int {
    status(guarded(|| {
        if let Some(a) = install::installed()?.existing(device) {
            a.reset_accumulated_memory_stats();
        }
        Ok(())
    }))
}

// ---- snapshots and history -----------------------------------------------------------------

/// One segment of a snapshot (PyTorch's `SegmentInfo`); its blocks follow it.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct SnapshotSegment {
    /// The device index.
    pub device: i32,
    /// The segment's first byte.
    pub address: u64,
    /// Bytes held from the driver.
    pub total_size: u64,
    /// Bytes the live allocations asked for (unrounded).
    pub requested_size: u64,
    /// Bytes of the live allocations.
    pub allocated_size: u64,
    /// Bytes of allocations alive or waiting for their streams.
    pub active_size: u64,
    /// The stream the segment was allocated for (a `cudaStream_t`).
    pub stream: u64,
    /// Whether it belongs to the large pool.
    pub is_large: bool,
    /// Whether it is an expandable segment (or a `paged` page run).
    pub is_expandable: bool,
    /// Its private pool, `(0, 0)` for the general one.
    pub pool_id0: u64,
    /// Second half of the pool id.
    pub pool_id1: u64,
    /// How many block callbacks follow.
    pub blocks: usize,
}

/// One block of a segment (PyTorch's `BlockInfo`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct SnapshotBlock {
    /// The block's first byte.
    pub address: u64,
    /// Its size in bytes.
    pub size: u64,
    /// Bytes asked for (0 for a free block).
    pub requested_size: u64,
    /// Handed out and not freed.
    pub allocated: bool,
    /// Allocated, or freed and waiting for a stream's work (PyTorch's `active`).
    pub active: bool,
}

/// One recorded event (PyTorch's `TraceEntry`); `action` is PyTorch's name (`"alloc"`,
/// `"free_requested"`, `"segment_map"`, ...), valid only during the call.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct SnapshotTrace {
    /// PyTorch's action name, NUL-terminated.
    pub action: *const c_char,
    /// The device whose history it is.
    pub device: i32,
    /// The address (for `"oom"`, the free bytes the device reported).
    pub addr: u64,
    /// Bytes.
    pub size: u64,
    /// The stream (a `cudaStream_t`).
    pub stream: u64,
    /// Microseconds since the Unix epoch.
    pub time_us: i64,
}

/// The callbacks of [`berth_torch_visit_snapshot`]; any may be null (skipped).
#[repr(C)]
pub struct SnapshotVisitor {
    /// Passed to every callback.
    pub ctx: *mut c_void,
    /// Each segment, then its blocks.
    pub segment: Option<unsafe extern "C" fn(*mut c_void, *const SnapshotSegment)>,
    /// Each block of the segment visited last.
    pub block: Option<unsafe extern "C" fn(*mut c_void, *const SnapshotBlock)>,
    /// Each recorded event, device by device, oldest first.
    pub trace: Option<unsafe extern "C" fn(*mut c_void, *const SnapshotTrace)>,
}

/// Every built device's snapshot, in device order.
fn snapshots() -> Result<Vec<(usize, MemorySnapshot)>, HookError> {
    install::installed()?;
    Ok(memory::built_allocators()
        .into_iter()
        .map(|(d, a)| (d, a.snapshot()))
        .collect())
}

/// Visits the snapshot of every device with an allocator (`torch.cuda.memory._snapshot()`):
/// segments in address order with their blocks, then each device's recorded history. Returns
/// the number of devices visited, or -1.
///
/// # Safety
/// `visitor` is null (-1) or points to callbacks callable with its `ctx` for the duration of
/// this call.
#[no_mangle]
pub unsafe extern "C" fn berth_torch_visit_snapshot(visitor: *const SnapshotVisitor) -> c_int {
    // SAFETY: the caller's contract.
    let Some(v) = (unsafe { visitor.as_ref() }) else {
        return -1;
    };
    let Ok(all) = guarded(snapshots) else {
        return -1;
    };
    for (_, s) in &all {
        for seg in &s.segments {
            let c = SnapshotSegment {
                device: seg.device,
                address: seg.address,
                total_size: seg.total_size,
                requested_size: seg.requested_size,
                allocated_size: seg.allocated_size,
                active_size: seg.active_size,
                stream: seg.stream.0,
                is_large: seg.segment_type == SegmentType::Large,
                is_expandable: seg.is_expandable,
                pool_id0: seg.segment_pool_id.0,
                pool_id1: seg.segment_pool_id.1,
                blocks: seg.blocks.len(),
            };
            if let Some(f) = v.segment {
                // SAFETY: the caller's contract; `c` outlives the call.
                unsafe { f(v.ctx, &c) };
            }
            for b in &seg.blocks {
                let c = SnapshotBlock {
                    address: b.address,
                    size: b.size,
                    requested_size: b.requested_size,
                    allocated: b.state == BlockState::ActiveAllocated,
                    active: b.state != BlockState::Inactive,
                };
                if let Some(f) = v.block {
                    // SAFETY: as above.
                    unsafe { f(v.ctx, &c) };
                }
            }
        }
    }
    if let Some(f) = v.trace {
        for (device, s) in &all {
            for e in s.device_traces.iter().flatten() {
                let action = CString::new(e.action.as_str()).unwrap_or_default();
                let c = SnapshotTrace {
                    action: action.as_ptr(),
                    device: *device as i32,
                    addr: e.addr,
                    size: e.size,
                    stream: e.stream.0,
                    time_us: e.time_us,
                };
                // SAFETY: as above; `action` outlives the call.
                unsafe { f(v.ctx, &c) };
            }
        }
    }
    all.len() as c_int
}

/// `torch.cuda.memory._record_memory_history`: starts recording (keeping the newest
/// `max_entries` events; `max_entries < 0` stops and clears) on `device` (its allocator is
/// built: PyTorch records from the next allocation on) and on every other device that has an
/// allocator. Returns 0, or -1.
#[no_mangle]
pub extern "C" fn berth_torch_record_history(device: c_int, max_entries: i64) -> c_int {
    let max = usize::try_from(max_entries).ok();
    status(guarded(|| {
        on_device(device, |a| {
            a.record_memory_history(max);
            Ok(())
        })?;
        for (d, a) in memory::built_allocators() {
            if d as c_int != device {
                a.record_memory_history(max);
            }
        }
        Ok(())
    }))
}

// ---- cache queries -------------------------------------------------------------------------

/// The largest free cached block of `device`'s general pools in bytes (PyTorch's `cacheInfo`,
/// which cuDNN's benchmark mode asks to size its workspace); 0 for a device with no allocator,
/// -1 when nothing is installed.
#[no_mangle]
pub extern "C" fn berth_torch_largest_cached_block(device: c_int) -> i64 {
    guarded(|| {
        let inst = install::installed()?;
        Ok(inst.existing(device).map_or(0, |a| {
            a.snapshot()
                .segments
                .iter()
                .filter(|s| s.segment_pool_id == (0, 0))
                .flat_map(|s| &s.blocks)
                .filter(|b| b.state == BlockState::Inactive)
                .map(|b| b.size)
                .max()
                .unwrap_or(0)
        }))
    })
    .map_or(-1, |n| i64::try_from(n).unwrap_or(i64::MAX))
}

/// The start of the allocation PyTorch shares for `ptr` (PyTorch's `getBaseAllocation`, which
/// `torch.multiprocessing` calls before `shareIpcHandle`), writing its size to `size` when not
/// null: the segment holding `ptr` for `cuMemAlloc` segments (what `cudaIpcGetMemHandle`
/// shares), the block holding it in segments mapped through virtual memory (`expandable`,
/// `paged`: only the block's own mappings are shared, as PyTorch's expandable segments do);
/// null when no device's allocator holds `ptr`.
///
/// # Safety
/// `size` is null or valid for one write.
#[no_mangle]
pub unsafe extern "C" fn berth_torch_base_allocation(ptr: *mut c_void, size: *mut u64) -> u64 {
    let p = ptr as u64;
    let Ok(all) = guarded(snapshots) else {
        return 0;
    };
    let Some(seg) = all
        .iter()
        .flat_map(|(_, s)| &s.segments)
        .find(|s| s.address <= p && p < s.address + s.total_size)
    else {
        return 0;
    };
    let (start, bytes) = if seg.is_expandable {
        match seg
            .blocks
            .iter()
            .find(|b| b.address <= p && p < b.address + b.size)
        {
            Some(b) => (b.address, b.size),
            None => return 0,
        }
    } else {
        (seg.address, seg.total_size)
    };
    if !size.is_null() {
        // SAFETY: the caller's contract.
        unsafe { *size = bytes };
    }
    start
}

// ---- private pools -------------------------------------------------------------------------

/// A context pointer from C++ and the function that releases it: `drop(ctx)` runs once, when
/// this is dropped (the callbacks that take `ctx` are the owner's).
struct ForeignContext {
    ctx: *mut c_void,
    drop: Option<unsafe extern "C" fn(*mut c_void)>,
}

// SAFETY: the callers of the functions that take a context promise that its callbacks may run
// on any thread and `drop` once on any thread (PyTorch's filters are plain std::functions over
// a capture id; its allocators do their own locking).
unsafe impl Send for ForeignContext {}
// SAFETY: as above; berth only passes `ctx` on.
unsafe impl Sync for ForeignContext {}

impl Drop for ForeignContext {
    fn drop(&mut self) {
        if let Some(d) = self.drop {
            // SAFETY: the caller's contract: `drop` releases `ctx` once.
            unsafe { d(self.ctx) };
        }
    }
}

/// A stream filter from C++: `call(ctx, stream)` says whether requests on `stream` go to the
/// pool.
struct ForeignFilter {
    ctx: ForeignContext,
    call: unsafe extern "C" fn(*mut c_void, u64) -> bool,
}

impl ForeignFilter {
    fn accepts(&self, stream: StreamId) -> bool {
        // SAFETY: the caller of `berth_torch_begin_allocate_to_pool` promised `call` is
        // callable with `ctx` until `drop` runs, which is after the last call (this is `&self`).
        unsafe { (self.call)(self.ctx.ctx, stream.0) }
    }
}

/// `createOrIncrefPool`: creates private pool `(id0, id1)` on `device` with one use, or counts
/// one more (`torch.cuda.MemPool()`). Returns 0, or -1 (a policy without private pools says
/// so and what to use instead).
#[no_mangle]
pub extern "C" fn berth_torch_create_or_incref_pool(device: c_int, id0: u64, id1: u64) -> c_int {
    status(guarded(|| {
        on_device(device, |a| a.create_or_incref_pool((id0, id1)))
    }))
}

/// A pool's own allocator from C++ (`torch.cuda.MemPool(allocator=...)`): `alloc(ctx, bytes)`
/// returns a device address or 0 for no memory, `free(ctx, address)` gives one back.
struct ForeignSource {
    ctx: ForeignContext,
    alloc: unsafe extern "C" fn(*mut c_void, u64) -> u64,
    free: unsafe extern "C" fn(*mut c_void, u64),
}

impl SegmentSource for ForeignSource {
    fn alloc(&self, bytes: usize) -> Option<DevicePtr> {
        // SAFETY: the caller of `berth_torch_create_pool_with_allocator` promised `alloc` is
        // callable with `ctx` from any thread until `drop` runs, which is after the last call
        // (this is `&self`).
        let ptr = unsafe { (self.alloc)(self.ctx.ctx, bytes as u64) };
        (ptr != 0).then_some(DevicePtr(ptr))
    }

    unsafe fn free(&self, ptr: DevicePtr) {
        // SAFETY: as for `alloc`; `ptr` came from it (the trait's contract).
        unsafe { (self.free)(self.ctx.ctx, ptr.0) }
    }
}

/// `createOrIncrefPool` with an allocator of the pool's own (`torch.cuda.MemPool(allocator=...)`):
/// creates pool `(id0, id1)` on `device` with one use, its segments taken from
/// `alloc(ctx, bytes)` (a device address, or 0 for no memory) and given back through
/// `free(ctx, address)`. `drop_ctx(ctx)` (if not null) runs once when berth lets go of the
/// allocator: when the pool is forgotten, or at once when this call fails. Returns 0, or -1:
/// the pool exists already, or the policy cannot take segments from an allocator
/// (`expandable`, `paged`; the error says what to do instead).
///
/// # Safety
/// `alloc` and `free` are callable with `ctx` from any thread, and `drop_ctx` null or callable
/// once, until `drop_ctx` runs.
#[no_mangle]
pub unsafe extern "C" fn berth_torch_create_pool_with_allocator(
    device: c_int,
    id0: u64,
    id1: u64,
    alloc: unsafe extern "C" fn(*mut c_void, u64) -> u64,
    free: unsafe extern "C" fn(*mut c_void, u64),
    ctx: *mut c_void,
    drop_ctx: Option<unsafe extern "C" fn(*mut c_void)>,
) -> c_int {
    let source = Arc::new(ForeignSource {
        ctx: ForeignContext {
            ctx,
            drop: drop_ctx,
        },
        alloc,
        free,
    });
    status(guarded(move || {
        on_device(device, |a| a.create_pool_with_source((id0, id1), source))
    }))
}

/// `beginAllocateToPool`: until [`berth_torch_end_allocate_to_pool`], requests on `device` on
/// a stream that `filter(ctx, stream)` accepts are served from pool `(id0, id1)` (CUDA-graph
/// capture, `torch.cuda.use_mem_pool`). A null `filter` accepts every stream. `drop_ctx(ctx)`
/// (if not null) runs once when berth lets go of the filter, also when this call fails.
/// Returns 0, or -1.
///
/// # Safety
/// `filter` and `drop_ctx` are null or callable with `ctx` from any thread until `drop_ctx`
/// runs.
#[no_mangle]
pub unsafe extern "C" fn berth_torch_begin_allocate_to_pool(
    device: c_int,
    id0: u64,
    id1: u64,
    filter: Option<unsafe extern "C" fn(*mut c_void, u64) -> bool>,
    ctx: *mut c_void,
    drop_ctx: Option<unsafe extern "C" fn(*mut c_void)>,
) -> c_int {
    let filter: StreamFilter = match filter {
        Some(call) => {
            let f = ForeignFilter {
                ctx: ForeignContext {
                    ctx,
                    drop: drop_ctx,
                },
                call,
            };
            Arc::new(move |s: StreamId| f.accepts(s))
        }
        None => {
            // Released at once: no filter will use it.
            drop(ForeignContext {
                ctx,
                drop: drop_ctx,
            });
            Arc::new(|_| true)
        }
    };
    status(guarded(|| {
        on_device(device, |a| a.begin_allocate_to_pool((id0, id1), filter))
    }))
}

/// `endAllocateToPool`: stops serving `device`'s requests from pool `(id0, id1)`. Returns 0,
/// or -1.
#[no_mangle]
pub extern "C" fn berth_torch_end_allocate_to_pool(device: c_int, id0: u64, id1: u64) -> c_int {
    status(guarded(|| {
        on_device(device, |a| a.end_allocate_to_pool((id0, id1)))
    }))
}

/// `releasePool`: gives back one use of pool `(id0, id1)`; at none its cached memory returns
/// to the driver at the next `empty_cache`. Returns 0, or -1.
#[no_mangle]
pub extern "C" fn berth_torch_release_pool(device: c_int, id0: u64, id1: u64) -> c_int {
    status(guarded(|| {
        on_device(device, |a| a.release_pool((id0, id1)))
    }))
}

/// `getPoolUseCount`: the uses of pool `(id0, id1)` (0 for an unknown pool or a device with no
/// allocator), or -1 when nothing is installed.
#[no_mangle]
pub extern "C" fn berth_torch_pool_use_count(device: c_int, id0: u64, id1: u64) -> c_int {
    guarded(|| {
        let inst = install::installed()?;
        Ok(inst
            .existing(device)
            .map_or(0, |a| a.pool_use_count((id0, id1))))
    })
    .map_or(-1, |n| c_int::try_from(n).unwrap_or(c_int::MAX))
}

/// `checkPoolLiveAllocations`: 1 when the allocations alive in pool `(id0, id1)` are exactly
/// the `n` pointers at `ptrs`, 0 when not, -1 on error (CUDA-graph trees' check).
///
/// # Safety
/// `ptrs` is valid for `n` reads (may be null when `n` is 0).
#[no_mangle]
pub unsafe extern "C" fn berth_torch_check_pool_live_allocations(
    device: c_int,
    id0: u64,
    id1: u64,
    ptrs: *const u64,
    n: usize,
) -> c_int {
    let expected: HashSet<DevicePtr> = if n == 0 || ptrs.is_null() {
        HashSet::new()
    } else {
        // SAFETY: the caller's contract.
        unsafe { std::slice::from_raw_parts(ptrs, n) }
            .iter()
            .map(|&p| DevicePtr(p))
            .collect()
    };
    match guarded(|| {
        on_device(device, |a| {
            a.check_pool_live_allocations((id0, id1), &expected)
        })
    }) {
        Ok(true) => 1,
        Ok(false) => 0,
        Err(_) => -1,
    }
}

/// `emptyCache(mempool_id)`: returns the free cached segments of pool `(id0, id1)` to the
/// driver (run when a `torch.cuda.MemPool` is destroyed). A negative `device` means every
/// device that has the pool, as PyTorch's `emptyCache(mempool_id)` walks every device's
/// allocator (a `MemPool` may be destroyed while another device is current). Returns 0, or -1.
#[no_mangle]
pub extern "C" fn berth_torch_empty_pool_cache(device: c_int, id0: u64, id1: u64) -> c_int {
    if device >= 0 {
        return status(guarded(|| {
            on_device(device, |a| a.empty_pool_cache((id0, id1)))
        }));
    }
    status(guarded(|| {
        install::installed()?;
        for (d, _) in memory::built_allocators() {
            let d = d as c_int;
            match on_device(d, |a| a.empty_pool_cache((id0, id1))) {
                Err(HookError::Alloc {
                    source: AllocError::NoSuchPool { .. },
                    ..
                }) => {}
                other => other?,
            }
        }
        Ok(())
    }))
}

/// `setCheckpointPoolState`: restores pool `(id0, id1)` to a checkpoint of its allocations,
/// the `n` pairs `(address, size in bytes)` at `live` (CUDA-graph trees, before recording a
/// new graph after replaying others; `Note [Restoring a pool checkpoint]` in berth-alloc).
/// Every block allocated in the pool is freed, every block of the checkpoint allocated at its
/// address. Returns 0, or -1 (the reason in `berth_torch_last_error`; a checkpoint whose
/// blocks are not in the pool's memory changes nothing; running out of device memory while
/// mapping a block again under `paged` may leave the pool's other blocks freed).
///
/// # Safety
/// `live` is valid for `2 * n` reads (may be null when `n` is 0).
#[no_mangle]
pub unsafe extern "C" fn berth_torch_restore_pool(
    device: c_int,
    id0: u64,
    id1: u64,
    live: *const u64,
    n: usize,
) -> c_int {
    let pairs: Vec<(DevicePtr, u64)> = if n == 0 || live.is_null() {
        Vec::new()
    } else {
        // SAFETY: the caller's contract.
        unsafe { std::slice::from_raw_parts(live, 2 * n) }
            .chunks_exact(2)
            .map(|p| (DevicePtr(p[0]), p[1]))
            .collect()
    };
    status(guarded(|| {
        on_device(device, |a| a.restore_pool((id0, id1), &pairs).map(|_| ()))
    }))
}

/// `setUseOnOOM`: whether pool `(id0, id1)` lends its cached free blocks to a request outside
/// every private pool that would otherwise fail with out-of-memory (`MemPool(use_on_oom=True)`;
/// `on` nonzero). Returns 0, or -1.
#[no_mangle]
pub extern "C" fn berth_torch_set_use_on_oom(
    device: c_int,
    id0: u64,
    id1: u64,
    on: c_int,
) -> c_int {
    status(guarded(|| {
        on_device(device, |a| a.set_use_on_oom((id0, id1), on != 0))
    }))
}

/// `setNoSplit`: pool `(id0, id1)` never cuts a block (`MemPool(no_split=True)`). Returns 0, or
/// -1 (the `paged` policy has no segments to keep whole and says so).
#[no_mangle]
pub extern "C" fn berth_torch_set_no_split(device: c_int, id0: u64, id1: u64) -> c_int {
    status(guarded(|| {
        on_device(device, |a| a.set_no_split((id0, id1)))
    }))
}
