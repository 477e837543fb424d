//! [`CudaBackend`]: berth-alloc's [`MemoryBackend`] on `cuMemAlloc` / `cuMemFree`, with the
//! [`VirtualMemoryBackend`] capability on `cuMemAddressReserve` / `cuMemCreate` / `cuMemMap` /
//! `cuMemSetAccess` / `cuMemUnmap` / `cuMemRelease` for expandable segments; and
//! [`CudaFence`], the event type it shares with the pinned host backend.
//!
//! This is the backend layer between the FFI (`crate::ffi`) and the policies of berth-alloc: no
//! policy here. Driver failures become [`BackendError`] through one conversion
//! (`From<CudaError>`), so `CUDA_ERROR_OUT_OF_MEMORY` is recognised in one place only (the
//! crate-private driver-error mapping of [`CudaError`]) and reaches the policy as the retryable
//! [`BackendError::OutOfMemory`].

use crate::copy_queue::CopyQueue;
use crate::ffi::{self, Attribute};
use crate::CudaError;
use berth_alloc::{
    BackendError, CopyTicket, DevicePtr, MemInfo, MemoryBackend, StreamId, VirtualMemoryBackend,
};
use std::collections::{BTreeMap, HashMap};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// The minimum granularity of virtual memory on `device`, or `None` when the device has no
/// VMM support.
fn vmm_granularity(device: usize) -> Result<Option<usize>, CudaError> {
    let dev = ffi::device_get(device)?;
    let supported = ffi::device_attribute(device, dev, Attribute::VirtualMemoryManagementSupported)
        .unwrap_or(0);
    if supported == 0 {
        return Ok(None);
    }
    Ok(Some(ffi::mem_allocation_granularity(device)?))
}

impl From<CudaError> for BackendError {
    fn from(e: CudaError) -> Self {
        match e {
            CudaError::OutOfMemory {
                op,
                requested_bytes,
                ..
            } => BackendError::OutOfMemory {
                op,
                bytes: requested_bytes as u64,
            },
            CudaError::Driver { op, code, name } => BackendError::Driver { op, code, name },
            other => BackendError::Other {
                op: "cuda",
                message: other.to_string(),
            },
        }
    }
}

/// An allocator fence on CUDA (`Note [Fences and events]` in `berth_alloc::backend`): a recorded
/// `CUevent` (timing disabled), destroyed on drop. Not the user-facing [`crate::Event`].
///
/// Recorded on a stream with no pending work (`cuStreamQuery` says so), it is complete from the
/// start and no driver event is made: a policy that records an event only to wait for a stream
/// before unmapping (berth's `paged`) then pays one `cuStreamQuery` instead of
/// `cuEventCreate` + `cuEventRecord` + `cuEventSynchronize` + `cuEventDestroy`.
#[derive(Debug)]
pub struct CudaFence {
    device: usize,
    /// The `CUevent`, or 0 for an event complete when recorded.
    raw: u64,
}

impl CudaFence {
    /// Records a new event on `stream` of `device`: complete once the work queued on `stream`
    /// so far is.
    ///
    /// # Errors
    /// [`CudaError::Driver`] / [`CudaError::Unavailable`].
    pub fn record(device: usize, stream: StreamId) -> Result<CudaFence, CudaError> {
        // SAFETY: the `StreamId`s berth hands to its allocators name live streams of `device`
        // (`Stream::id`) or the default stream, 0.
        if unsafe { ffi::stream_query(device, stream.0)? } {
            return Ok(CudaFence { device, raw: 0 });
        }
        // From the pool (Note [Event pool]).
        let raw = crate::event_pool::take(device, false)?;
        let ev = CudaFence { device, raw };
        // SAFETY: `raw` was just created on `device`; `stream` as above.
        unsafe { ffi::event_record(device, raw, stream.0)? };
        Ok(ev)
    }

    /// Whether it completed.
    ///
    /// # Errors
    /// [`CudaError::Driver`].
    pub fn query(&self) -> Result<bool, CudaError> {
        if self.raw == 0 {
            return Ok(true);
        }
        // SAFETY: `self` owns the live driver event.
        unsafe { ffi::event_query(self.device, self.raw) }
    }

    /// Blocks until it completed.
    ///
    /// # Errors
    /// [`CudaError::Driver`].
    pub fn synchronize(&self) -> Result<(), CudaError> {
        if self.raw == 0 {
            return Ok(());
        }
        // SAFETY: `self` owns the live driver event.
        unsafe { ffi::event_sync(self.device, self.raw) }
    }
}

impl Drop for CudaFence {
    fn drop(&mut self) {
        if self.raw != 0 {
            // SAFETY: `self` took the event (timing off) from the pool for `self.device` and
            // gives it back once, here (Note [Event pool]).
            unsafe { crate::event_pool::give(self.device, false, self.raw) };
        }
    }
}

/// Device memory of one GPU from the driver: `cuMemAlloc` / `cuMemFree` segments, plus virtual
/// memory (when the device supports it) for expandable segments and berth's `paged` policy.
///
/// Cheap to clone: clones share the virtual-memory state (the live mappings).
///
/// # Note [VMM handles]
/// Each [`VirtualMemoryBackend::map`] call is one mapping backed by one physical handle of the
/// call's size (`cuMemCreate`), as the trait's contract says: the driver maps a handle at
/// offset 0 only and unmaps whole mappings only, so a policy that wants to unmap a range later
/// maps it in units it will unmap whole (PyTorch's expandable segments: one 2 MiB or 20 MiB
/// page per call; berth's `paged`: units of up to 32 MiB, `Note [Mapping units]` in
/// `berth_alloc::paged`). Large handles are what keep big buffers as fast as `cuMemAlloc`
/// memory: a 4 GiB copy between buffers mapped with one 2 MiB handle per page ran at 0.72× the
/// bandwidth of `cuMemAlloc` buffers on an H200, with 20 MiB handles at 0.98×, 32 MiB at
/// 0.985×, 64 MiB at 0.98× (berth-cuda's test `large_handles_copy_at_cumemalloc_bandwidth`).
///
/// 1. `map` creates one handle (`cuMemCreate`), maps it (`cuMemMap`) and sets access
///    (`cuMemSetAccess`), as PyTorch's `ExpandableSegment::mapAndSetAccess` does per handle;
///    on a failure the mapping is undone and the handle released.
/// 2. `unmap` makes one `cuMemUnmap` for the whole range (the range is whole mappings; one
///    call per mapping if the driver refuses a range of several) and then releases every
///    handle (`cuMemRelease`), as PyTorch's `ExpandableSegment::unmapHandles` does; a release
///    that fails is retried at the next unmap and on drop, its bytes still counted by
///    [`CudaBackend::mapped_bytes`].
/// 3. A range that would split a mapping is refused with [`BackendError::SplitsMapping`]
///    before any driver call, as the simulator refuses it.
/// 4. Accounting: nothing is kept after an unmap, so the physical memory this backend holds
///    is exactly its live mappings plus its `cuMemAlloc` segments, which are the policies'
///    reserved bytes: `cuMemGetInfo`'s used bytes are the policies' reserved bytes plus what
///    berth does not own (the context, other libraries) at every point.
///
/// Until 2026-12-03 unmapped handles were kept in a pool by size for reuse (saving a
/// `cuMemCreate` / `cuMemRelease` pair, tens of microseconds, per remap). The pool was counted
/// in no policy's reserved bytes, and under `paged` on a variable-length inference program the
/// process held about 650 MB more than berth reported; pooled handles of one size also could
/// not serve a mapping of another. `paged`'s headroom keeps its unmaps few (`Note [Paged best
/// fit]`), so the pool saved little time and cost memory the user could not see: it was
/// removed, and `reserved_bytes` is what the driver sees.
#[derive(Debug, Clone)]
pub struct CudaBackend {
    device: usize,
    vmm: Option<Arc<Vmm>>,
}

/// The virtual-memory state of one device's backend (shared by its clones).
#[derive(Debug)]
struct Vmm {
    device: usize,
    granularity: usize,
    /// Whether `cuMemUnmap` accepted a range of several mappings (cleared at its first refusal).
    range_unmap: AtomicBool,
    /// Live mappings by start address, one per successful `map`.
    mapped: Mutex<BTreeMap<u64, Mapping>>,
    /// Unmapped handles whose `cuMemRelease` failed: still held from the driver, retried at
    /// every unmap and on drop (locked after `mapped`, never before).
    unreleased: Mutex<Vec<Mapping>>,
    /// Host↔device copies of sleep and wake not yet waited for.
    copies: CopyQueue,
    /// Descriptors of mappings shared with other processes, by handle: open until the mapping
    /// is unmapped (`Note [Sharing mapped memory]` in `ipc.rs`; locked after `mapped`).
    exported: Mutex<HashMap<u64, OwnedFd>>,
}

/// One live mapping: a physical handle mapped whole.
#[derive(Debug, Clone, Copy)]
struct Mapping {
    /// The `CUmemGenericAllocationHandle`.
    handle: u64,
    /// Its size in bytes (a multiple of the granularity).
    bytes: usize,
}

/// The mappings making up `[addr, addr + bytes)` in address order.
///
/// # Errors
/// [`BackendError::SplitsMapping`] when the range cuts a mapping;
/// [`BackendError::InvalidPointer`] when part of it is not mapped.
fn whole_mappings(
    mapped: &BTreeMap<u64, Mapping>,
    addr: u64,
    bytes: usize,
) -> Result<Vec<(u64, Mapping)>, BackendError> {
    let end = addr + bytes as u64;
    let splits = |a: u64, m: Mapping| BackendError::SplitsMapping {
        op: "unmap",
        addr: DevicePtr(addr),
        bytes: bytes as u64,
        mapping: DevicePtr(a),
        mapping_bytes: m.bytes as u64,
    };
    if let Some((&a, &m)) = mapped.range(..addr).next_back() {
        if a + m.bytes as u64 > addr {
            return Err(splits(a, m));
        }
    }
    let mut found = Vec::new();
    let mut at = addr;
    for (&a, &m) in mapped.range(addr..end) {
        if a != at {
            break;
        }
        if a + m.bytes as u64 > end {
            return Err(splits(a, m));
        }
        found.push((a, m));
        at = a + m.bytes as u64;
    }
    if at != end || bytes == 0 {
        return Err(BackendError::InvalidPointer {
            op: "unmap",
            ptr: DevicePtr(addr),
        });
    }
    Ok(found)
}

impl Vmm {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<u64, Mapping>> {
        self.mapped.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Creates a handle of `bytes` bytes, maps it at `addr` and sets access; on a failure
    /// nothing stays mapped and the handle is released (`Note [VMM handles]`, 1).
    ///
    /// # Safety
    /// `addr..addr + bytes` is unmapped (`map` checked the live mappings, which record every
    /// mapping of this backend, under their lock).
    unsafe fn create_and_map(&self, addr: u64, bytes: usize) -> Result<u64, CudaError> {
        let h = ffi::mem_create(self.device, bytes)?;
        // SAFETY: the caller's contract; the driver refuses an address outside a reservation.
        let mapped = unsafe { ffi::mem_map(self.device, addr, bytes, h) }.and_then(|()| {
            match ffi::mem_set_access(self.device, addr, bytes) {
                Ok(()) => Ok(()),
                Err(e) => {
                    // SAFETY: mapped just above, whole; nothing was handed out on it.
                    let _ = unsafe { ffi::mem_unmap(self.device, addr, bytes) };
                    Err(e)
                }
            }
        });
        if let Err(e) = mapped {
            // SAFETY: `h` is mapped nowhere now (the map failed or was undone) and is
            // released once, here.
            let _ = unsafe { ffi::mem_release(self.device, h) };
            return Err(e);
        }
        Ok(h)
    }

    /// Unmaps the whole mappings `found` (adjacent, in address order, covering
    /// `[addr, addr + bytes)`) and releases their handles: one unmap call for the range, or one
    /// per mapping when the driver refuses ranges of several mappings (`Note [VMM handles]`, 2).
    /// A mapping leaves `mapped` once it is unmapped. A handle whose release fails is kept in
    /// `unreleased` and released again at the next unmap and on drop, so the unmap itself
    /// succeeds and the policy's state stays that of the driver (the range is unmapped); the
    /// bytes still count in [`CudaBackend::mapped_bytes`] until released. When an unmap fails
    /// (one call per mapping), the mappings before the failing one are already unmapped (their
    /// handles are released at the next unmap or on drop), the error is returned and the rest
    /// stay mapped.
    ///
    /// # Safety
    /// `found` came from [`whole_mappings`] on `mapped` for this range, and no queued work uses
    /// the range.
    unsafe fn unmap_and_release(
        &self,
        mapped: &mut BTreeMap<u64, Mapping>,
        addr: u64,
        bytes: usize,
        found: &[(u64, Mapping)],
    ) -> Result<(), CudaError> {
        let mut unmapped_whole = false;
        if found.len() > 1 && self.range_unmap.load(Ordering::Relaxed) {
            // SAFETY: the caller's contract: the range is whole mappings nothing uses.
            match unsafe { ffi::mem_unmap(self.device, addr, bytes) } {
                Ok(()) => unmapped_whole = true,
                Err(_) => self.range_unmap.store(false, Ordering::Relaxed),
            }
        }
        let mut unreleased = self.unreleased.lock().unwrap_or_else(|p| p.into_inner());
        let mut exported = self.exported.lock().unwrap_or_else(|p| p.into_inner());
        // SAFETY: `unreleased` holds unmapped handles from `mem_create` not yet released.
        unsafe { self.release_all(&mut unreleased) };
        for &(a, m) in found {
            if !unmapped_whole {
                // SAFETY: the caller's contract: `a..a + m.bytes` is one whole mapping nothing
                // uses.
                unsafe { ffi::mem_unmap(self.device, a, m.bytes) }?;
            }
            mapped.remove(&a);
            exported.remove(&m.handle);
            unreleased.push(m);
        }
        // SAFETY: as above; the handles just unmapped left `mapped` and are released once.
        unsafe { self.release_all(&mut unreleased) };
        Ok(())
    }

    /// Releases every handle of `handles` (`cuMemRelease`), keeping those whose release fails.
    ///
    /// # Safety
    /// Every handle in `handles` came from `mem_create`, is mapped nowhere and was not released.
    unsafe fn release_all(&self, handles: &mut Vec<Mapping>) {
        // SAFETY: the caller's contract; a handle leaves the list once released.
        handles.retain(|m| unsafe { ffi::mem_release(self.device, m.handle) }.is_err());
    }
}

impl Drop for Vmm {
    fn drop(&mut self) {
        let mut unreleased =
            std::mem::take(self.unreleased.get_mut().unwrap_or_else(|p| p.into_inner()));
        // SAFETY: `unreleased` holds unmapped, unreleased handles of this backend, and this is
        // the last use of them.
        unsafe { self.release_all(&mut unreleased) };
    }
}

impl CudaBackend {
    /// The copy queue lives with the virtual-memory state: without it, `op` is refused.
    fn copy_queue_of(&self, op: &'static str) -> Result<&Vmm, BackendError> {
        self.vmm.as_deref().ok_or(BackendError::Other {
            op,
            message: "this device has no virtual memory management".into(),
        })
    }

    /// The backend of `device`; creates the device's primary context (the named device).
    ///
    /// # Errors
    /// [`CudaError::InvalidDevice`], [`CudaError::Unavailable`], [`CudaError::Driver`].
    pub fn new(device: usize) -> Result<CudaBackend, CudaError> {
        crate::check_device(device)?;
        crate::bind_context(device)?;
        let vmm = vmm_granularity(device).ok().flatten().map(|granularity| {
            Arc::new(Vmm {
                device,
                granularity,
                range_unmap: AtomicBool::new(true),
                mapped: Mutex::default(),
                unreleased: Mutex::default(),
                copies: CopyQueue::default(),
                exported: Mutex::default(),
            })
        });
        Ok(CudaBackend { device, vmm })
    }

    /// The device index.
    pub fn device(&self) -> usize {
        self.device
    }

    /// Number of live mappings (one physical handle each) made by `map` and not unmapped.
    pub fn live_mappings(&self) -> usize {
        self.vmm.as_ref().map_or(0, |v| v.lock().len())
    }

    /// The whole mappings under `[addr, addr + bytes)` (start, size, descriptor), adjacent and
    /// in address order, each exported as a POSIX file descriptor once and kept open until it
    /// is unmapped (`Note [Sharing mapped memory]` in `ipc.rs`); `None` when some byte of the
    /// range is not in a live mapping of this backend.
    ///
    /// # Errors
    /// [`CudaError::Ipc`] when the driver will not export a handle (handles created without
    /// the descriptor type, where the driver refused it).
    pub(crate) fn export_covering(
        &self,
        addr: u64,
        bytes: usize,
    ) -> Result<Option<Vec<crate::mapped_range::Exported>>, CudaError> {
        let Some(vmm) = self.vmm.as_ref() else {
            return Ok(None);
        };
        let mapped = vmm.lock();
        let Some(found) = crate::mapped_range::covering(&mapped, |m| m.bytes, addr, bytes) else {
            return Ok(None);
        };
        let mut exported = vmm.exported.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = Vec::with_capacity(found.len());
        for (a, m) in found {
            let fd = match exported.get(&m.handle) {
                Some(fd) => fd.as_raw_fd(),
                None => {
                    let raw = ffi::mem_export_fd(self.device, m.handle).map_err(|e| CudaError::Ipc {
                        reason: format!(
                            "cuda:{} cannot export the memory at {a:#x} ({e}); the driver may not support sharing virtual memory as file descriptors here: use the 'pytorch' policy to share CUDA tensors between processes",
                            self.device
                        ),
                    })?;
                    // SAFETY: a descriptor the driver just opened for this process, owned here.
                    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
                    exported.entry(m.handle).or_insert(fd).as_raw_fd()
                }
            };
            out.push(crate::mapped_range::Exported {
                addr: a,
                bytes: m.bytes,
                fd,
            });
        }
        Ok(Some(out))
    }

    /// Bytes of physical memory in live mappings (`map`ped and not unmapped), plus any
    /// unmapped handle whose release failed and waits to be retried: with the `cuMemAlloc`
    /// segments of the same policies, exactly what this backend holds from the driver
    /// (`Note [VMM handles]`, 4).
    pub fn mapped_bytes(&self) -> u64 {
        self.vmm.as_ref().map_or(0, |v| {
            let mapped: u64 = v.lock().values().map(|m| m.bytes as u64).sum();
            let unreleased = v.unreleased.lock().unwrap_or_else(|p| p.into_inner());
            mapped + unreleased.iter().map(|m| m.bytes as u64).sum::<u64>()
        })
    }
}

impl MemoryBackend for CudaBackend {
    type Fence = CudaFence;

    fn malloc(&self, bytes: usize, _stream: StreamId) -> Result<DevicePtr, BackendError> {
        Ok(DevicePtr(ffi::mem_alloc(self.device, bytes)?))
    }

    unsafe fn free(
        &self,
        ptr: DevicePtr,
        _bytes: usize,
        _stream: StreamId,
    ) -> Result<(), BackendError> {
        // `cuMemFree` synchronises the device, which covers precondition 2 of the trait.
        // SAFETY: the trait's contract: `ptr` came from `malloc` (`cuMemAlloc`) here, freed once.
        unsafe { ffi::mem_free(self.device, ptr.0) }.map_err(BackendError::from)
    }

    fn mem_info(&self) -> Result<MemInfo, BackendError> {
        let (free, total) = crate::mem_get_info(self.device)?;
        Ok(MemInfo {
            free_bytes: free as u64,
            total_bytes: total as u64,
        })
    }

    fn record_fence(&self, stream: StreamId) -> Result<CudaFence, BackendError> {
        Ok(CudaFence::record(self.device, stream)?)
    }

    fn query_fence(&self, event: &CudaFence) -> Result<bool, BackendError> {
        Ok(event.query()?)
    }

    fn sync_fence(&self, event: &CudaFence) -> Result<(), BackendError> {
        Ok(event.synchronize()?)
    }

    fn as_virtual(&self) -> Option<&dyn VirtualMemoryBackend> {
        self.vmm.as_ref().map(|_| self as &dyn VirtualMemoryBackend)
    }
}

impl VirtualMemoryBackend for CudaBackend {
    fn granularity(&self) -> usize {
        self.vmm.as_ref().map_or(2 << 20, |v| v.granularity)
    }

    fn reserve(&self, bytes: usize) -> Result<DevicePtr, BackendError> {
        Ok(DevicePtr(ffi::address_reserve(self.device, bytes)?))
    }

    fn map(&self, addr: DevicePtr, bytes: usize, _stream: StreamId) -> Result<(), BackendError> {
        let vmm = self.vmm.as_ref().ok_or(BackendError::Other {
            op: "map",
            message: "this device has no virtual memory management".into(),
        })?;
        let page = vmm.granularity;
        if bytes == 0 || !bytes.is_multiple_of(page) || !addr.0.is_multiple_of(page as u64) {
            return Err(BackendError::Other {
                op: "map",
                message: format!(
                    "map of {bytes} bytes at {:#x}: address and size must be non-zero multiples of the {page}-byte granularity",
                    addr.0
                ),
            });
        }
        let end = addr.0 + bytes as u64;
        let mut mapped = vmm.lock();
        if let Some((&a, m)) = mapped.range(..end).next_back() {
            if a + m.bytes as u64 > addr.0 {
                return Err(BackendError::Other {
                    op: "map",
                    message: format!(
                        "map of {bytes} bytes at {:#x}: the mapping at {a:#x} overlaps it",
                        addr.0
                    ),
                });
            }
        }
        // One handle for the whole range (`Note [VMM handles]`, 1).
        // SAFETY: the range is unmapped (checked above against `mapped`, under its lock).
        let handle = unsafe { vmm.create_and_map(addr.0, bytes) }?;
        mapped.insert(addr.0, Mapping { handle, bytes });
        Ok(())
    }

    unsafe fn unmap(
        &self,
        addr: DevicePtr,
        bytes: usize,
        _stream: StreamId,
    ) -> Result<(), BackendError> {
        let Some(vmm) = self.vmm.as_ref() else {
            return Err(BackendError::InvalidPointer {
                op: "unmap",
                ptr: addr,
            });
        };
        let mut mapped = vmm.lock();
        let found = whole_mappings(&mapped, addr.0, bytes)?;
        // SAFETY: `found` was computed just above under the same lock; the caller's contract
        // (2.) says no queued work uses the range.
        unsafe { vmm.unmap_and_release(&mut mapped, addr.0, bytes, &found)? };
        Ok(())
    }

    unsafe fn release(&self, base: DevicePtr, bytes: usize) -> Result<(), BackendError> {
        // SAFETY: the trait's contract: a reservation from `reserve` with nothing mapped.
        unsafe { ffi::address_free(self.device, base.0, bytes) }.map_err(BackendError::from)
    }

    /// One `cuMemcpyDtoHAsync` on the legacy default stream, then `cuCtxSynchronize`
    /// (<https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html>):
    /// the backup copy of `paged`'s sleep (`Note [Sleep and wake]` in berth-alloc).
    unsafe fn copy_to_host(
        &self,
        src: DevicePtr,
        dst: std::ptr::NonNull<u8>,
        bytes: usize,
    ) -> Result<(), BackendError> {
        // SAFETY: the trait's contract: `dst` is valid for writes of `bytes` bytes and no
        // queued work writes `src..src + bytes`; `dst` is not read before the context is
        // synchronized below.
        unsafe { ffi::memcpy_dtoh_async(self.device, dst.as_ptr(), src.0, bytes, 0) }?;
        Ok(ffi::ctx_synchronize(self.device)?)
    }

    /// One `cuMemcpyHtoDAsync` on the legacy default stream, then `cuCtxSynchronize`
    /// (<https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html>):
    /// the restore of `paged`'s wake.
    unsafe fn copy_from_host(
        &self,
        dst: DevicePtr,
        src: std::ptr::NonNull<u8>,
        bytes: usize,
    ) -> Result<(), BackendError> {
        // SAFETY: the trait's contract: `src` is valid for reads of `bytes` bytes until the
        // context is synchronized below, and no queued work uses `dst..dst + bytes`.
        unsafe { ffi::memcpy_htod_async(self.device, dst.0, src.as_ptr(), bytes, 0) }?;
        Ok(ffi::ctx_synchronize(self.device)?)
    }

    /// `cuMemcpyDtoHAsync` on the legacy default stream and an event after it
    /// (`crate::copy_queue`): sleep's copies, waited for a unit at a time.
    unsafe fn queue_copy_to_host(
        &self,
        src: DevicePtr,
        dst: std::ptr::NonNull<u8>,
        bytes: usize,
    ) -> Result<CopyTicket, BackendError> {
        let vmm = self.copy_queue_of("queue_copy_to_host")?;
        // SAFETY: the trait's contract, forwarded.
        unsafe {
            vmm.copies
                .device_to_host(self.device, src.0, dst.as_ptr(), bytes)
        }
    }

    /// `cuMemcpyHtoDAsync` on the legacy default stream and an event after it
    /// (`crate::copy_queue`): wake's copies, queued as the units are mapped.
    unsafe fn queue_copy_from_host(
        &self,
        dst: DevicePtr,
        src: std::ptr::NonNull<u8>,
        bytes: usize,
    ) -> Result<CopyTicket, BackendError> {
        let vmm = self.copy_queue_of("queue_copy_from_host")?;
        // SAFETY: the trait's contract, forwarded.
        unsafe {
            vmm.copies
                .host_to_device(self.device, dst.0, src.as_ptr(), bytes)
        }
    }

    fn wait_copies(&self, upto: CopyTicket) -> Result<(), BackendError> {
        match &self.vmm {
            Some(vmm) => vmm.copies.wait(upto),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_memory_reaches_the_policy_as_the_retryable_backend_error() {
        let e: BackendError = CudaError::OutOfMemory {
            device: 0,
            op: "cuMemAlloc",
            requested_bytes: 4096,
        }
        .into();
        assert_eq!(
            e,
            BackendError::OutOfMemory {
                op: "cuMemAlloc",
                bytes: 4096
            }
        );
        assert!(e.is_out_of_memory());
        let other: BackendError = CudaError::unavailable("no driver").into();
        assert!(!other.is_out_of_memory());
    }

    /// `Note [VMM handles]` on a real GPU: each `map` is one handle of its size, an unmap
    /// that would split one is refused and changes nothing, an unmap gives the handles back at
    /// once, and `cuMemGetInfo`'s used bytes follow the mapped bytes exactly at every step.
    #[test]
    #[ignore = "needs a CUDA GPU: run with --include-ignored (BERTH_REQUIRE_GPU=1 fails without one)"]
    fn mappings_are_whole_handles_released_on_unmap() {
        if !crate::testing::require_gpu("vmm_handles") {
            return;
        }
        let s = StreamId::DEFAULT;
        let b = CudaBackend::new(0).unwrap();
        let v = b.as_virtual().expect("VMM supported");
        let g = v.granularity();
        let used = || {
            let (free, total) = crate::mem_get_info(0).unwrap();
            (total - free) as i64
        };
        let base = v.reserve(16 * g).unwrap();
        let at = |k: usize| DevicePtr(base.0 + (k * g) as u64);
        let used0 = used();
        let held = |b: &CudaBackend| (used() - used0, b.mapped_bytes() as i64);
        v.map(at(0), 3 * g, s).unwrap();
        v.map(at(3), g, s).unwrap();
        assert_eq!(held(&b), (4 * g as i64, 4 * g as i64), "four pages mapped");
        assert_eq!(b.live_mappings(), 2, "one handle per map call");
        // SAFETY: every range below lies in memory mapped above (or is refused); no work uses
        // any of it.
        unsafe {
            assert_eq!(
                v.unmap(at(1), 3 * g, s),
                Err(BackendError::SplitsMapping {
                    op: "unmap",
                    addr: at(1),
                    bytes: 3 * g as u64,
                    mapping: at(0),
                    mapping_bytes: 3 * g as u64,
                })
            );
            assert!(matches!(
                v.unmap(at(0), 2 * g, s),
                Err(BackendError::SplitsMapping { .. })
            ));
            assert_eq!(b.live_mappings(), 2, "refusals change nothing");
            assert_eq!(held(&b), (4 * g as i64, 4 * g as i64));
            v.unmap(at(0), 4 * g, s).unwrap();
        }
        assert_eq!(b.live_mappings(), 0);
        assert_eq!(held(&b), (0, 0), "an unmap gives the handles back at once");
        v.map(at(5), 3 * g, s).unwrap();
        v.map(at(8), 2 * g, s).unwrap();
        assert_eq!(held(&b), (5 * g as i64, 5 * g as i64));
        assert!(
            v.map(at(9), g, s).is_err(),
            "a mapped page cannot be mapped again"
        );
        assert_eq!(
            held(&b),
            (5 * g as i64, 5 * g as i64),
            "a refused map holds nothing"
        );
        // SAFETY: mapped above, no work uses them; then nothing is mapped in the reservation.
        unsafe {
            assert!(v.unmap(at(4), g, s).is_err(), "page 4 is not mapped");
            v.unmap(at(5), 3 * g, s).unwrap();
            assert_eq!(held(&b), (2 * g as i64, 2 * g as i64));
            v.unmap(at(8), 2 * g, s).unwrap();
            assert_eq!(held(&b), (0, 0));
            v.release(base, 16 * g).unwrap();
        }
    }

    /// Device-to-device bandwidth of 4 GiB buffers mapped in units of several sizes (one
    /// handle each), beside `cuMemAlloc` buffers: the measurement behind `Note [VMM handles]`
    /// and `Note [Mapping units]`. Prints one line per size; asserts only that units of
    /// `paged`'s default size reach 0.9× of `cuMemAlloc` (the figures are read by hand).
    #[test]
    #[ignore = "needs a CUDA GPU: run with --include-ignored (BERTH_REQUIRE_GPU=1 fails without one)"]
    fn large_handles_copy_at_cumemalloc_bandwidth() {
        if !crate::testing::require_gpu("vmm_handle_bandwidth") {
            return;
        }
        const BIG: usize = 4 << 30;
        let s = StreamId::DEFAULT;
        let b = CudaBackend::new(0).unwrap();
        let v = b.as_virtual().expect("VMM supported");
        let copy_gbps = |dst: u64, src: u64| {
            let once = || {
                // SAFETY: both ranges are live device memory of device 0 (mapped or allocated
                // by the caller) of `BIG` bytes, used by nothing else; stream 0 is the default.
                unsafe { ffi::memcpy_dtod_async(0, dst, src, BIG, 0) }.unwrap();
                ffi::ctx_synchronize(0).unwrap();
            };
            once();
            let t = std::time::Instant::now();
            for _ in 0..10 {
                once();
            }
            // Bytes read plus written, as `berth bench transfers` reports them.
            (20 * BIG) as f64 / t.elapsed().as_secs_f64() / 1e9
        };
        let src = ffi::mem_alloc(0, BIG).unwrap();
        let dst = ffi::mem_alloc(0, BIG).unwrap();
        let native = copy_gbps(dst, src);
        // SAFETY: allocated above, nothing queued uses them after the synchronize.
        unsafe {
            ffi::mem_free(0, src).unwrap();
            ffi::mem_free(0, dst).unwrap();
        }
        println!("cuMemAlloc: {native:.0} GB/s");
        let default_unit = berth_alloc::paged::MAX_UNIT_BYTES as usize;
        let mut at_default = 0.0;
        for unit in [
            2usize << 20,
            20 << 20,
            32 << 20,
            64 << 20,
            256 << 20,
            1 << 30,
            BIG,
        ] {
            let unit = unit.max(v.granularity());
            // Whole units covering both buffers (20 MiB does not divide 8 GiB).
            let total = (2 * BIG).div_ceil(unit) * unit;
            let base = v.reserve(total).unwrap();
            for k in 0..total / unit {
                v.map(DevicePtr(base.0 + (k * unit) as u64), unit, s)
                    .unwrap();
            }
            let gbps = copy_gbps(base.0 + BIG as u64, base.0);
            println!(
                "units of {} MiB: {gbps:.0} GB/s ({:.3}x cuMemAlloc)",
                unit >> 20,
                gbps / native
            );
            if unit == default_unit {
                at_default = gbps / native;
            }
            // SAFETY: the range is the whole mappings made above; the copies completed.
            unsafe {
                v.unmap(base, total, s).unwrap();
                v.release(base, total).unwrap();
            }
        }
        assert!(
            at_default >= 0.9,
            "{} MiB units (paged's default) copy at {at_default:.3}x cuMemAlloc",
            default_unit >> 20
        );
    }

    #[test]
    fn backend_without_a_gpu_is_unavailable_not_a_panic() {
        if crate::is_available() {
            return;
        }
        assert!(matches!(
            CudaBackend::new(0),
            Err(CudaError::Unavailable { .. })
        ));
    }
}
