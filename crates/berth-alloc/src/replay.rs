//! Replaying a trace through any [`DeviceAllocator`] (the library half of `berth replay`).
//!
//! Rules (`shared/traces/README.md`): walk the rows in order; on `alloc` allocate `size` bytes on
//! `stream` and remember the pointer under the row's `addr`; on `free_completed` free the block
//! remembered under `addr` (skip an unknown `addr`); ignore every other row. Freeing at
//! `free_completed` honours the trace's streams: the recording already delayed it until the
//! other streams' events completed.

use std::time::Instant;

use crate::allocator::DeviceAllocator;
use crate::backend::DevicePtr;
use crate::caching::PtrMap;
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
    /// Mean wall time per operation in nanoseconds (bookkeeping of the replay included).
    pub ns_per_op: f64,
}

impl ReplayReport {
    /// `peak_reserved / peak_requested` (1.0 is perfect).
    pub fn ratio(&self) -> f64 {
        if self.peak_requested == 0 {
            1.0
        } else {
            self.peak_reserved as f64 / self.peak_requested as f64
        }
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

/// Replays `events` through `alloc`, which should be fresh (peaks and counters are read from
/// its statistics, relative to their values at the start). Blocks still live at the end are
/// freed, outside the timing.
///
/// # Errors
/// [`ReplayError`] naming the row at which the allocator failed (out of memory, typically).
pub fn replay(
    events: &[TraceEvent],
    alloc: &dyn DeviceAllocator,
) -> Result<ReplayReport, ReplayError> {
    let before = alloc.stats();
    let mut live: PtrMap<(DevicePtr, u64)> =
        PtrMap::with_capacity_and_hasher(1024, Default::default());
    let (mut ops, mut requested, mut peak_requested) = (0u64, 0u64, 0u64);
    let start = Instant::now();
    let mut failure = None;
    for (index, e) in events.iter().enumerate() {
        match e.action {
            TraceAction::Alloc => match alloc.raw_alloc(e.size as usize, e.stream) {
                Ok(ptr) => {
                    ops += 1;
                    requested += e.size;
                    peak_requested = peak_requested.max(requested);
                    if let Some((old, size)) = live.insert(e.addr, (ptr, e.size)) {
                        requested -= size;
                        let _ = alloc.raw_delete(old);
                    }
                }
                Err(source) => {
                    failure = Some(ReplayError {
                        index,
                        action: e.action,
                        size: e.size,
                        source,
                    });
                    break;
                }
            },
            TraceAction::FreeCompleted => {
                if let Some((ptr, size)) = live.remove(&e.addr) {
                    ops += 1;
                    requested -= size;
                    if let Err(source) = alloc.raw_delete(ptr) {
                        failure = Some(ReplayError {
                            index,
                            action: e.action,
                            size: e.size,
                            source,
                        });
                        break;
                    }
                }
            }
            _ => {}
        }
    }
    let elapsed = start.elapsed();
    for (_, (ptr, _)) in live.drain() {
        let _ = alloc.raw_delete(ptr);
    }
    if let Some(f) = failure {
        return Err(f);
    }
    let after = alloc.stats();
    let device_allocs = (after.num_device_alloc - before.num_device_alloc).max(0) as u64;
    let device_frees = (after.num_device_free - before.num_device_free).max(0) as u64;
    Ok(ReplayReport {
        ops,
        peak_requested,
        peak_reserved: after.max_memory_reserved(),
        device_allocs,
        device_calls: device_allocs + device_frees,
        ns_per_op: if ops == 0 {
            0.0
        } else {
            elapsed.as_nanos() as f64 / ops as f64
        },
    })
}
