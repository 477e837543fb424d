//! Where the rest of berth tells the profiler what happened: storages allocated and freed
//! (host in [`crate::storage`], through [`crate::memory_events`]; CUDA in
//! [`crate::cuda::transfer`]), copies of tensor memory (the transfer code), and host waits
//! (berth-cuda's [`HostWaitHook`](crate::cuda::HostWaitHook)). Every function here is called
//! only after [`is_active`](super::is_active) said yes, or (`host_memory`) while the profiler
//! listens to [`crate::memory_events`].

use super::device_time::{self, Target};
use super::record::{self, CopyKind, CopyRecord, MemoryAction, MemoryRecord, SyncRecord};
use crate::cuda::Stream;
use crate::Device;
use std::sync::atomic::Ordering;

fn memory_on() -> bool {
    record::PROFILE_MEMORY.load(Ordering::Relaxed)
}

/// A host storage of `bytes` bytes was allocated (`alloc`) or freed; `allocated_bytes` is
/// [`host_memory_allocated`](crate::storage::host_memory_allocated) right after. The
/// [`HostMemoryListener`](crate::memory_events::HostMemoryListener) the profiler installs.
pub(crate) fn host_memory(alloc: bool, bytes: usize, allocated_bytes: usize) {
    if !memory_on() {
        return;
    }
    let b = allocated_bytes as u64;
    record::push_memory([MemoryRecord {
        device: Device::Cpu,
        action: if alloc {
            MemoryAction::Alloc
        } else {
            MemoryAction::Free
        },
        bytes: bytes as u64,
        allocated_bytes: b,
        reserved_bytes: b,
        thread: record::thread_id(),
        ts_ns: record::now_ns(),
    }]);
}

/// `(allocated, reserved)` bytes of CUDA device `device`'s allocator now, if it has one.
pub(crate) fn cuda_stats(device: usize) -> Option<(u64, u64)> {
    Some(crate::cuda::memory::existing_allocator(device)?.allocated_and_reserved())
}

/// A CUDA storage of `bytes` bytes on `device` was allocated or freed; `reserved_before` is
/// the allocator's reserved bytes before it (a change is a segment event).
pub(crate) fn cuda_memory(alloc: bool, device: usize, bytes: usize, reserved_before: u64) {
    if !memory_on() {
        return;
    }
    let Some((allocated, reserved)) = cuda_stats(device) else {
        return;
    };
    let thread = record::thread_id();
    let ts_ns = record::now_ns();
    let dev = Device::Cuda(device as u16);
    let mk = |action, bytes| MemoryRecord {
        device: dev,
        action,
        bytes,
        allocated_bytes: allocated,
        reserved_bytes: reserved,
        thread,
        ts_ns,
    };
    let segment = match reserved.cmp(&reserved_before) {
        std::cmp::Ordering::Greater => {
            Some(mk(MemoryAction::SegmentMap, reserved - reserved_before))
        }
        std::cmp::Ordering::Less => {
            Some(mk(MemoryAction::SegmentUnmap, reserved_before - reserved))
        }
        std::cmp::Ordering::Equal => None,
    };
    let action = if alloc {
        MemoryAction::Alloc
    } else {
        MemoryAction::Free
    };
    // A segment is mapped before the block in it is handed out, and unmapped after the block
    // returned.
    let event = mk(action, bytes as u64);
    match (alloc, segment) {
        (true, Some(s)) => record::push_memory([s, event]),
        (false, Some(s)) => record::push_memory([event, s]),
        (_, None) => record::push_memory([event]),
    }
}

/// A copy about to be queued on `stream`: its host start and start event.
pub(crate) struct CopyStart {
    start_ns: u64,
    event: Option<device_time::Started>,
    _span: tracing::span::EnteredSpan,
}

/// Starts timing a copy on `stream`.
pub(crate) fn copy_start(kind: CopyKind, bytes: usize, stream: &Stream) -> CopyStart {
    let event = if record::PROFILE_CUDA.load(Ordering::Relaxed) {
        device_time::start(stream)
    } else {
        None
    };
    let span = tracing::trace_span!(target: "berth::profiler", "copy", kind = kind.name(),
        bytes, stream = stream.as_raw());
    CopyStart {
        start_ns: record::now_ns(),
        event,
        _span: span.entered(),
    }
}

/// Records a copy started with [`copy_start`] once it was queued (or, `blocking`, landed).
pub(crate) fn copy_end(
    start: CopyStart,
    kind: CopyKind,
    bytes: usize,
    pinned: bool,
    blocking: bool,
    stream: &Stream,
) {
    let i = record::push_copy(CopyRecord {
        kind,
        bytes: bytes as u64,
        pinned,
        device: stream.device(),
        stream: stream.as_raw(),
        blocking,
        thread: record::thread_id(),
        start_ns: start.start_ns,
        end_ns: record::now_ns(),
        device_span: None,
    });
    if let Some(e) = start.event {
        device_time::finish(Target::Copy(i), stream, e);
    }
}

/// Ends a copy started with [`copy_start`] that failed: nothing is recorded, and its CUPTI
/// external id is popped so later work is not tagged with it.
pub(crate) fn copy_abort(start: CopyStart) {
    if let Some(e) = start.event {
        device_time::abandon(e);
    }
}

/// The [`HostWaitHook`](crate::cuda::HostWaitHook) the profiler installs.
pub(crate) fn host_wait(point: Option<&'static str>) {
    if !super::is_active() || record::in_internal() {
        return;
    }
    let stack = record::open_stack();
    record::push_sync(SyncRecord {
        point,
        cause: stack.last().cloned(),
        stack,
        thread: record::thread_id(),
        ts_ns: record::now_ns(),
    });
}
