//! The raw device-memory source under every allocator policy.
//!
//! A [`MemoryBackend`] hands out whole segments (`cudaMalloc` / `cudaFree` on a real GPU), reports
//! device memory, and records stream events. It is deliberately small (about seven required
//! methods): policies ([`crate::caching::CachingAllocator`], berth's own) add everything
//! else. Virtual-memory support for expandable segments is a separate, object-safe capability,
//! [`VirtualMemoryBackend`], reached through [`MemoryBackend::as_virtual`].
//!
//! Implementations: [`sim::SimBackend`] (a simulated device, first-class, used by every test and by
//! `berth replay`), the adaptors of [`crate::adaptor`] and, outside this crate, the CUDA backend.

mod segment_source;
pub mod sim;
mod sim_bytes;

use crate::error::BackendError;
pub use crate::ids::{DevicePtr, DeviceStream, MemInfo, StreamId};
pub use segment_source::SegmentSource;

// Note [Fences and events]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// An allocator needs one thing from a stream: a marker that says "the work queued on this stream
// so far has finished", so a block freed while other streams still use it is reused only after
// them (PyTorch's allocator keeps `cudaEvent_t`s for this:
// https://github.com/pytorch/pytorch/blob/main/c10/cuda/CUDACachingAllocator.cpp, `insert_events`).
// berth calls that marker a *fence* (`MemoryBackend::Fence`, `record_fence` / `query_fence` /
// `sync_fence`; `CudaFence` on CUDA, `SimFence` in the simulator) and keeps the word *event*
// for what users create and time, `torch.cuda.Event`'s counterpart `berth_cuda::Event`. A CUDA
// fence is a `CUevent` underneath (timing disabled, created and destroyed by the backend); the
// two never cross: users never see a fence, and policies never see an `Event`.

/// Raw device memory: segments, memory info and stream fences.
///
/// All methods take `&self`; implementations are `Send + Sync` and do their own locking.
/// Policies call [`MemoryBackend::malloc`] without holding their own state lock where they can
/// (after PyTorch's `Note [HostAllocator design]` in
/// <https://github.com/pytorch/pytorch/blob/main/aten/src/ATen/core/CachingHostAllocator.h>).
pub trait MemoryBackend: Send + Sync + 'static {
    /// A fence: a point recorded on a stream, complete once the work queued before it is (a
    /// `CUevent` on CUDA, the simulator's ticket). Dropping it releases it. See
    /// `Note [Fences and events]`.
    type Fence: Send + Sync + 'static;

    /// Allocates a segment of `bytes` bytes, ordered on `stream` (`cudaMalloc` ignores the
    /// stream; a stream-ordered backend may use it).
    ///
    /// # Errors
    /// 1. [`BackendError::OutOfMemory`] when the device cannot provide `bytes` now; callers free
    ///    cached memory and retry on this variant only.
    /// 2. [`BackendError::Other`] for every other failure (never retried).
    fn malloc(&self, bytes: usize, stream: StreamId) -> Result<DevicePtr, BackendError>;

    /// Frees a segment obtained from [`MemoryBackend::malloc`] (`cudaFree`, which synchronizes
    /// the device on CUDA).
    ///
    /// # Safety
    /// 1. `ptr` was returned by `malloc` on this backend with this `bytes`, and is not freed yet.
    /// 2. No work queued on any stream still reads or writes the segment, or the backend
    ///    synchronizes before releasing it (as `cudaFree` does).
    ///
    /// # Errors
    /// [`BackendError::InvalidPointer`] when the backend can tell `ptr` is not one of its live
    /// segments (the simulator can); [`BackendError::Other`] for driver failures.
    unsafe fn free(
        &self,
        ptr: DevicePtr,
        bytes: usize,
        stream: StreamId,
    ) -> Result<(), BackendError>;

    /// Free and total device memory in bytes (`cudaMemGetInfo`).
    ///
    /// # Errors
    /// [`BackendError::Other`] when the driver call fails.
    fn mem_info(&self) -> Result<MemInfo, BackendError>;

    /// Records a fence on `stream` that completes when the work queued so far completes
    /// (`cudaEventRecord` on an event with timing disabled).
    ///
    /// # Errors
    /// [`BackendError::Other`] when the driver call fails.
    fn record_fence(&self, stream: StreamId) -> Result<Self::Fence, BackendError>;

    /// Whether the fence `event` has completed (`cudaEventQuery`; "not ready" is `Ok(false)`).
    ///
    /// # Errors
    /// [`BackendError::Other`] when the query fails for another reason.
    fn query_fence(&self, event: &Self::Fence) -> Result<bool, BackendError>;

    /// Blocks until the fence `event` has completed (`cudaEventSynchronize`).
    ///
    /// # Errors
    /// [`BackendError::Other`] when the driver call fails.
    fn sync_fence(&self, event: &Self::Fence) -> Result<(), BackendError>;

    /// The alignment in bytes of every pointer [`MemoryBackend::malloc`] returns (`cudaMalloc`
    /// guarantees 256).
    fn alignment(&self) -> usize {
        256
    }

    /// The virtual-memory capability used by expandable segments, if this backend has it.
    /// Default: `None`.
    fn as_virtual(&self) -> Option<&dyn VirtualMemoryBackend> {
        None
    }
}

/// A shared backend is a backend: a policy can own an `Arc<B>` while the caller keeps another
/// handle to the same device (a test that completes a simulated device's events, the PyTorch
/// bridge's test switch). Every call goes to the shared `B`.
impl<B: MemoryBackend> MemoryBackend for std::sync::Arc<B> {
    type Fence = B::Fence;

    fn malloc(&self, bytes: usize, stream: StreamId) -> Result<DevicePtr, BackendError> {
        (**self).malloc(bytes, stream)
    }

    unsafe fn free(
        &self,
        ptr: DevicePtr,
        bytes: usize,
        stream: StreamId,
    ) -> Result<(), BackendError> {
        // SAFETY: the caller's contract, passed on unchanged.
        unsafe { (**self).free(ptr, bytes, stream) }
    }

    fn mem_info(&self) -> Result<MemInfo, BackendError> {
        (**self).mem_info()
    }

    fn record_fence(&self, stream: StreamId) -> Result<Self::Fence, BackendError> {
        (**self).record_fence(stream)
    }

    fn query_fence(&self, event: &Self::Fence) -> Result<bool, BackendError> {
        (**self).query_fence(event)
    }

    fn sync_fence(&self, event: &Self::Fence) -> Result<(), BackendError> {
        (**self).sync_fence(event)
    }

    fn alignment(&self) -> usize {
        (**self).alignment()
    }

    fn as_virtual(&self) -> Option<&dyn VirtualMemoryBackend> {
        (**self).as_virtual()
    }
}

/// Virtual-memory capability for expandable segments (`cuMemAddressReserve`, `cuMemCreate` +
/// `cuMemMap` + `cuMemSetAccess`, `cuMemUnmap` + `cuMemRelease`, `cuMemAddressFree`).
///
/// A separate, object-safe trait (not a subtrait with an `Event` type) so that a policy generic
/// over any [`MemoryBackend`] can ask for it at run time through [`MemoryBackend::as_virtual`].
/// Physical memory is mapped in ranges chosen by the caller, each a multiple of the backend's
/// minimum [`VirtualMemoryBackend::granularity`] (PyTorch's expandable segments map one page of
/// 2 MiB for the small pool or 20 MiB for the large one per call; berth's `paged` policy maps
/// runs of pages, `Note [Mapping units]` in `crate::paged`).
///
/// # Mappings
/// Each successful [`VirtualMemoryBackend::map`] call makes one *mapping*, backed by one
/// physical allocation where the backend can (one `cuMemCreate` handle on CUDA, which is what
/// keeps large buffers as fast as `cuMemAlloc` memory). The driver unmaps whole mappings only
/// (`cuMemMap` maps a handle at offset 0, and `cuMemUnmap` cannot release part of one), so
/// [`VirtualMemoryBackend::unmap`] takes a union of whole mappings: a caller that wants to
/// unmap pages one at a time later must map them one at a time. [`sim::SimBackend`] refuses a
/// range that splits a mapping with [`BackendError::SplitsMapping`], as the CUDA backend does.
pub trait VirtualMemoryBackend: Send + Sync {
    /// The minimum mapping granularity in bytes (`cuMemGetAllocationGranularity`, 2 MiB on
    /// current GPUs). Every `bytes` and offset below is a multiple of it.
    fn granularity(&self) -> usize;

    /// Reserves `bytes` bytes of device address space, with nothing mapped.
    ///
    /// # Errors
    /// [`BackendError::OutOfMemory`] when no address range is left; [`BackendError::Other`] else.
    fn reserve(&self, bytes: usize) -> Result<DevicePtr, BackendError>;

    /// Creates `bytes` bytes of physical memory and maps it at `addr` (inside a reservation)
    /// with read/write access for this device, as one mapping (see [Mappings](Self#mappings)):
    /// it can later be unmapped only whole, alone or together with adjacent mappings.
    ///
    /// # Errors
    /// [`BackendError::OutOfMemory`] when the physical memory is not available (nothing is left
    /// mapped then); [`BackendError::Other`] for a range outside a reservation or already mapped.
    fn map(&self, addr: DevicePtr, bytes: usize, stream: StreamId) -> Result<(), BackendError>;

    /// Maps `count` pages of `page_bytes` bytes each, starting at `addr`, each page its own
    /// mapping (so any run of whole pages can be unmapped later), as `count` calls of
    /// [`map`](Self::map) would.
    ///
    /// Provided: those `count` calls, the pages already mapped unmapped again when one fails.
    /// [`sim::SimBackend`] overrides it to record the run in one entry, so a simulated
    /// reservation of petabytes costs no more bookkeeping than one of megabytes (newcomer
    /// defect 4: 64 PiB in 20 MiB pages was 3.4·10⁹ entries).
    ///
    /// # Errors
    /// As [`map`](Self::map); nothing is left mapped then.
    fn map_pages(
        &self,
        addr: DevicePtr,
        page_bytes: usize,
        count: usize,
        stream: StreamId,
    ) -> Result<(), BackendError> {
        for k in 0..count {
            let at = addr.0 + (k * page_bytes) as u64;
            if let Err(e) = self.map(DevicePtr(at), page_bytes, stream) {
                if k > 0 {
                    // SAFETY: `[addr, at)` is the `k` whole page mappings made just above;
                    // nothing was handed out on them, so no work uses them.
                    unsafe { self.unmap(addr, k * page_bytes, stream) }?;
                }
                return Err(e);
            }
        }
        Ok(())
    }

    /// Unmaps `bytes` bytes at `addr` and releases their physical memory: a backend keeps
    /// nothing back, so the device memory it holds is always its live mappings (with its
    /// `malloc` segments), which policies count as reserved.
    ///
    /// The range must be a union of whole mappings, each made by one
    /// [`VirtualMemoryBackend::map`] call: it starts where a mapping starts, ends where one
    /// ends, and has no hole (see [Mappings](Self#mappings)).
    ///
    /// # Safety
    /// 1. The range was mapped by [`VirtualMemoryBackend::map`] (possibly in several calls).
    /// 2. No queued work still uses it (callers synchronize first; `cuMemUnmap` does not).
    ///
    /// # Errors
    /// 1. [`BackendError::SplitsMapping`] when the range would cut a mapping in two (nothing is
    ///    unmapped then).
    /// 2. [`BackendError::Other`] (simulator) or [`BackendError::InvalidPointer`] (CUDA) for a
    ///    range that is not entirely mapped; [`BackendError::Driver`] when the driver fails.
    unsafe fn unmap(
        &self,
        addr: DevicePtr,
        bytes: usize,
        stream: StreamId,
    ) -> Result<(), BackendError>;

    /// Releases a reservation made by [`VirtualMemoryBackend::reserve`].
    ///
    /// # Safety
    /// 1. Nothing inside the range is mapped any more.
    ///
    /// # Errors
    /// [`BackendError::Other`] for an unknown reservation.
    unsafe fn release(&self, base: DevicePtr, bytes: usize) -> Result<(), BackendError>;
    /// Copies `bytes` bytes of device memory at `src` to host memory at `dst` and waits for the
    /// copy to finish (`cuMemcpyDtoH`): how `paged` backs up a sleeping tag
    /// (`Note [Sleep and wake]` in `crate::paged`). Default: not supported.
    ///
    /// # Safety
    /// 1. `dst` is valid for writes of `bytes` bytes.
    /// 2. No queued work still writes `[src, src + bytes)` (the caller synchronized).
    ///
    /// # Errors
    /// [`BackendError::Other`] when the backend cannot copy or the range is not mapped;
    /// [`BackendError::Driver`] when the driver fails.
    unsafe fn copy_to_host(
        &self,
        src: DevicePtr,
        dst: std::ptr::NonNull<u8>,
        bytes: usize,
    ) -> Result<(), BackendError> {
        let _ = (src, dst, bytes);
        Err(BackendError::Other {
            op: "copy_to_host",
            message: "this backend cannot copy device memory to the host".into(),
        })
    }
    /// Copies `bytes` bytes of host memory at `src` to device memory at `dst` and waits for the
    /// copy to finish (`cuMemcpyHtoD`): how `paged` restores a woken tag. Default: not
    /// supported.
    ///
    /// # Safety
    /// 1. `src` is valid for reads of `bytes` bytes.
    /// 2. No queued work uses `[dst, dst + bytes)`.
    ///
    /// # Errors
    /// As [`VirtualMemoryBackend::copy_to_host`].
    unsafe fn copy_from_host(
        &self,
        dst: DevicePtr,
        src: std::ptr::NonNull<u8>,
        bytes: usize,
    ) -> Result<(), BackendError> {
        let _ = (dst, src, bytes);
        Err(BackendError::Other {
            op: "copy_from_host",
            message: "this backend cannot copy host memory to the device".into(),
        })
    }
    /// Queues a copy of `bytes` bytes of device memory at `src` to host memory at `dst` and
    /// returns its ticket: the copy is complete once [`VirtualMemoryBackend::wait_copies`] of
    /// this ticket (or a later one) returns. Queued copies run in the order they were queued,
    /// one after another, on one copy queue (on CUDA: `cuMemcpyDtoHAsync` on the legacy
    /// default stream, an event after each). How `paged`'s sleep overlaps its copies with the
    /// unmapping of the units already copied (`Note [Sleep and wake]` in `crate::paged`).
    /// Default: [`VirtualMemoryBackend::copy_to_host`], complete on return.
    ///
    /// # Safety
    /// 1. `dst` is valid for writes of `bytes` bytes until the copy is complete.
    /// 2. No queued work still writes `[src, src + bytes)`, and nothing unmaps it before the
    ///    copy is complete.
    ///
    /// # Errors
    /// As [`VirtualMemoryBackend::copy_to_host`] (a failure found only when the copy runs is
    /// reported by [`VirtualMemoryBackend::wait_copies`]).
    unsafe fn queue_copy_to_host(
        &self,
        src: DevicePtr,
        dst: std::ptr::NonNull<u8>,
        bytes: usize,
    ) -> Result<CopyTicket, BackendError> {
        // SAFETY: the caller upholds `copy_to_host`'s contract, which is weaker than ours.
        unsafe { self.copy_to_host(src, dst, bytes) }?;
        Ok(CopyTicket::DONE)
    }
    /// Queues a copy of `bytes` bytes of host memory at `src` to device memory at `dst`, as
    /// [`VirtualMemoryBackend::queue_copy_to_host`] does the other way (on CUDA:
    /// `cuMemcpyHtoDAsync`): how `paged`'s wake overlaps its copies with mapping the next
    /// units. Default: [`VirtualMemoryBackend::copy_from_host`], complete on return.
    ///
    /// # Safety
    /// 1. `src` is valid for reads of `bytes` bytes until the copy is complete.
    /// 2. `[dst, dst + bytes)` is mapped, no queued work uses it, and nothing unmaps it
    ///    before the copy is complete.
    ///
    /// # Errors
    /// As [`VirtualMemoryBackend::queue_copy_to_host`].
    unsafe fn queue_copy_from_host(
        &self,
        dst: DevicePtr,
        src: std::ptr::NonNull<u8>,
        bytes: usize,
    ) -> Result<CopyTicket, BackendError> {
        // SAFETY: the caller upholds `copy_from_host`'s contract, which is weaker than ours.
        unsafe { self.copy_from_host(dst, src, bytes) }?;
        Ok(CopyTicket::DONE)
    }
    /// Waits until every copy queued up to and including `upto` is complete.
    /// Default: nothing to wait for (the default copies complete on return).
    ///
    /// # Errors
    /// [`BackendError::Driver`] when a copy failed (the copies after it may not have run).
    fn wait_copies(&self, upto: CopyTicket) -> Result<(), BackendError> {
        let _ = upto;
        Ok(())
    }
}

/// The place of a queued copy in a backend's copy queue
/// ([`VirtualMemoryBackend::queue_copy_to_host`]): waiting for a ticket waits for every copy
/// queued up to it. Tickets grow in queue order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CopyTicket(pub u64);

impl CopyTicket {
    /// The ticket of a copy that was complete when it was queued.
    pub const DONE: CopyTicket = CopyTicket(0);
}
