//! [`CudaBackend`]: berth-alloc's [`MemoryBackend`] on `cuMemAlloc` / `cuMemFree`, with the
//! [`VirtualMemoryBackend`] capability on `cuMemAddressReserve` / `cuMemCreate` / `cuMemMap` /
//! `cuMemSetAccess` / `cuMemUnmap` / `cuMemRelease` for expandable segments; and
//! [`CudaEvent`], the event type it shares with the pinned host backend.
//!
//! This is the FFI-to-backend layer of house style 1.1: no policy here. Driver failures become
//! [`BackendError`] through one conversion (`From<CudaError>`), so `CUDA_ERROR_OUT_OF_MEMORY`
//! is recognised only in [`CudaError::from_driver`] and reaches the policy as the retryable
//! [`BackendError::OutOfMemory`].

use crate::ffi::{self, Attribute};
use crate::CudaError;
use berth_alloc::{
    BackendError, DevicePtr, MemInfo, MemoryBackend, StreamId, VirtualMemoryBackend,
};
use std::collections::BTreeMap;
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

/// A recorded CUDA event (timing disabled); destroyed on drop.
///
/// Recorded on a stream with no pending work (`cuStreamQuery` says so), it is complete from the
/// start and no driver event is made: a policy that records an event only to wait for a stream
/// before unmapping (berth's `paged`) then pays one `cuStreamQuery` instead of
/// `cuEventCreate` + `cuEventRecord` + `cuEventSynchronize` + `cuEventDestroy`.
#[derive(Debug)]
pub struct CudaEvent {
    device: usize,
    /// The `CUevent`, or 0 for an event complete when recorded.
    raw: u64,
}

impl CudaEvent {
    /// Records a new event on `stream` of `device`: complete once the work queued on `stream`
    /// so far is.
    ///
    /// # Errors
    /// [`CudaError::Driver`] / [`CudaError::Unavailable`].
    pub fn record(device: usize, stream: StreamId) -> Result<CudaEvent, CudaError> {
        // SAFETY: the `StreamId`s berth hands to its allocators name live streams of `device`
        // (`Stream::id`) or the default stream, 0.
        if unsafe { ffi::stream_query(device, stream.0)? } {
            return Ok(CudaEvent { device, raw: 0 });
        }
        let raw = ffi::event_create(device, false)?;
        let ev = CudaEvent { device, raw };
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

impl Drop for CudaEvent {
    fn drop(&mut self) {
        if self.raw != 0 {
            // SAFETY: `self` owns the event and destroys it once, here.
            let _ = unsafe { ffi::event_destroy(self.device, self.raw) };
        }
    }
}

/// Device memory of one GPU from the driver: `cuMemAlloc` / `cuMemFree` segments, plus virtual
/// memory (when the device supports it) for expandable segments and berth's `paged` policy.
///
/// Cheap to clone: clones share the virtual-memory state (the mapped pages and the pool of
/// unmapped physical pages of `Note [VMM page pool]`).
///
/// # Note [VMM page pool]
/// Every mapped page of [`VirtualMemoryBackend::granularity`] bytes (2 MiB on current GPUs) has
/// its own physical handle, so that a policy may later unmap any page-aligned sub-range (the
/// driver unmaps only whole mappings). Policies map and unmap pages often (`paged` keeps its
/// mapped memory under its high-water mark by unmapping free pages before mapping new ones), and
/// each `cuMemCreate` / `cuMemRelease` costs tens of microseconds, so:
///
/// 1. `unmap` makes one `cuMemUnmap` per call (the range covers whole mappings; per page only
///    if the driver refuses the range) and keeps the physical handles in a pool instead of
///    releasing them;
/// 2. `map` takes handles from the pool (`cuMemCreate` only when it is empty), makes one
///    `cuMemMap` per page and one `cuMemSetAccess` for the whole range (PyTorch's
///    `ExpandableSegment::mapAndSetAccess` does the same);
/// 3. accounting: a policy counts a page in its reserved bytes only while it is mapped; pooled
///    pages are this backend's own cache, so `cuMemGetInfo`'s used bytes equal the policies'
///    reserved bytes plus [`CudaBackend::pooled_bytes`]. [`VirtualMemoryBackend::trim`] (which
///    `empty_cache` calls) releases the pool, after which reserved and `cuMemGetInfo` agree
///    again; so do an out-of-memory `cuMemAlloc` (then retried once), a failed `map`, and
///    dropping the last clone. `map` uses the pool before creating any page, so pooled pages
///    never make a `map` fail.
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
    state: Mutex<VmmState>,
}

#[derive(Debug, Default)]
struct VmmState {
    /// Mapped pages: address → `CUmemGenericAllocationHandle` of `granularity` bytes.
    mapped: BTreeMap<u64, u64>,
    /// Physical pages of `granularity` bytes mapped nowhere, reused by the next `map`.
    pool: Vec<u64>,
}

impl Vmm {
    fn lock(&self) -> MutexGuard<'_, VmmState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Releases every pooled handle (`cuMemRelease`); the first failure is returned after
    /// trying them all.
    fn release_pool(&self, st: &mut VmmState) -> Result<(), CudaError> {
        let mut first = Ok(());
        for h in st.pool.drain(..) {
            // SAFETY: pooled handles came from `mem_create`, are mapped nowhere (`unmap` pools
            // them only after unmapping) and leave the pool here, released once.
            if let Err(e) = unsafe { ffi::mem_release(self.device, h) } {
                first = first.and(Err(e));
            }
        }
        first
    }

    /// Unmaps `[addr, addr + pages × granularity)`, every page of which is mapped: one call for
    /// the range, or one per page when the driver refuses ranges of several mappings.
    ///
    /// # Safety
    /// Every page of the range was mapped by [`Vmm::map_pages`] (one mapping per page) and no
    /// queued work uses it.
    unsafe fn unmap_range(&self, addr: u64, pages: usize) -> Result<(), CudaError> {
        let page = self.granularity;
        if pages > 1 && self.range_unmap.load(Ordering::Relaxed) {
            // SAFETY: the caller's contract: the range is whole page mappings.
            match unsafe { ffi::mem_unmap(self.device, addr, pages * page) } {
                Ok(()) => return Ok(()),
                Err(_) => self.range_unmap.store(false, Ordering::Relaxed),
            }
        }
        (0..pages).try_for_each(|k| {
            // SAFETY: the caller's contract: page `k` is one whole mapping.
            unsafe { ffi::mem_unmap(self.device, addr + (k * page) as u64, page) }
        })
    }

    /// Maps `pages` pages at `addr` (unmapped, inside a reservation) with handles from the
    /// pool or new ones, pushing each mapped handle on `done`, then sets access once.
    fn map_pages(
        &self,
        st: &mut VmmState,
        addr: u64,
        pages: usize,
        done: &mut Vec<u64>,
    ) -> Result<(), CudaError> {
        let page = self.granularity;
        for k in 0..pages {
            let h = match st.pool.pop() {
                Some(h) => h,
                None => ffi::mem_create(self.device, page)?,
            };
            // SAFETY: the page is unmapped (`map` checked `st.mapped`, which records every
            // mapping of this backend) and `h` is a live one-page handle mapped nowhere (pooled
            // or new); the driver refuses an address outside a reservation.
            if let Err(e) = unsafe { ffi::mem_map(self.device, addr + (k * page) as u64, page, h) }
            {
                st.pool.push(h);
                return Err(e);
            }
            done.push(h);
        }
        ffi::mem_set_access(self.device, addr, pages * page)
    }
}

impl Drop for Vmm {
    fn drop(&mut self) {
        let mut st = std::mem::take(&mut *self.lock());
        let _ = self.release_pool(&mut st);
    }
}

impl CudaBackend {
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
                state: Mutex::default(),
            })
        });
        Ok(CudaBackend { device, vmm })
    }

    /// The device index.
    pub fn device(&self) -> usize {
        self.device
    }

    /// Bytes of physical memory held in the pool of unmapped pages (`Note [VMM page pool]`):
    /// counted by `cuMemGetInfo`, not in any policy's reserved bytes.
    pub fn pooled_bytes(&self) -> u64 {
        self.vmm
            .as_ref()
            .map_or(0, |v| (v.lock().pool.len() * v.granularity) as u64)
    }

    /// Releases the pooled physical pages (`cuMemRelease`), as
    /// [`VirtualMemoryBackend::trim`] does.
    ///
    /// # Errors
    /// [`CudaError::Driver`] from the first `cuMemRelease` that failed (the others are still
    /// released).
    pub fn release_pool(&self) -> Result<(), CudaError> {
        match &self.vmm {
            Some(v) => v.release_pool(&mut v.lock()),
            None => Ok(()),
        }
    }
}

impl MemoryBackend for CudaBackend {
    type Event = CudaEvent;

    fn malloc(&self, bytes: usize, _stream: StreamId) -> Result<DevicePtr, BackendError> {
        let ptr = match ffi::mem_alloc(self.device, bytes) {
            Err(CudaError::OutOfMemory { .. }) if self.pooled_bytes() > 0 => {
                // Pooled pages are a cache (`Note [VMM page pool]`): give them back, retry once.
                self.release_pool()?;
                ffi::mem_alloc(self.device, bytes)?
            }
            r => r?,
        };
        Ok(DevicePtr(ptr))
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

    fn record_event(&self, stream: StreamId) -> Result<CudaEvent, BackendError> {
        Ok(CudaEvent::record(self.device, stream)?)
    }

    fn query_event(&self, event: &CudaEvent) -> Result<bool, BackendError> {
        Ok(event.query()?)
    }

    fn sync_event(&self, event: &CudaEvent) -> Result<(), BackendError> {
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
        if !bytes.is_multiple_of(page) || !addr.0.is_multiple_of(page as u64) {
            return Err(BackendError::Other {
                op: "map",
                message: format!(
                    "map of {bytes} bytes at {:#x}: address and size must be multiples of the {page}-byte granularity",
                    addr.0
                ),
            });
        }
        let end = addr.0 + bytes as u64;
        let mut st = vmm.lock();
        if let Some((&a, _)) = st.mapped.range(addr.0..end).next() {
            return Err(BackendError::Other {
                op: "map",
                message: format!(
                    "map of {bytes} bytes at {:#x}: {a:#x} is already mapped",
                    addr.0
                ),
            });
        }
        let pages = bytes / page;
        let mut done = Vec::with_capacity(pages);
        if let Err(e) = vmm.map_pages(&mut st, addr.0, pages, &mut done) {
            // Nothing stays mapped after a failure: undo this call's mappings and give every
            // pooled page back to the driver. `map_pages` creates pages only once the pool is
            // empty, so an out-of-memory failure cannot be cured by releasing the pool.
            if !done.is_empty() {
                // SAFETY: this call just mapped these pages, one mapping each; no work was
                // queued on them.
                unsafe { vmm.unmap_range(addr.0, done.len())? };
            }
            st.pool.append(&mut done);
            vmm.release_pool(&mut st)?;
            return Err(e.into());
        }
        for (k, h) in done.into_iter().enumerate() {
            st.mapped.insert(addr.0 + (k * page) as u64, h);
        }
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
        let page = vmm.granularity;
        let end = addr.0 + bytes as u64;
        let mut st = vmm.lock();
        let pages = st.mapped.range(addr.0..end).count();
        if !addr.0.is_multiple_of(page as u64) || pages * page != bytes {
            return Err(BackendError::InvalidPointer {
                op: "unmap",
                ptr: addr,
            });
        }
        // SAFETY: the caller's contract (1. mapped by `map`, one mapping per page, checked
        // above; 2. no queued work uses it).
        unsafe { vmm.unmap_range(addr.0, pages)? };
        let handles: Vec<u64> = st.mapped.range(addr.0..end).map(|(_, &h)| h).collect();
        for k in 0..pages {
            st.mapped.remove(&(addr.0 + (k * page) as u64));
        }
        st.pool.extend(handles);
        Ok(())
    }

    unsafe fn release(&self, base: DevicePtr, bytes: usize) -> Result<(), BackendError> {
        // SAFETY: the trait's contract: a reservation from `reserve` with nothing mapped.
        unsafe { ffi::address_free(self.device, base.0, bytes) }.map_err(BackendError::from)
    }

    fn trim(&self) -> Result<(), BackendError> {
        Ok(self.release_pool()?)
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

    /// `Note [VMM page pool]` on a real GPU: unmapped pages wait in the pool, the next map
    /// reuses them, `cuMemGetInfo` counts mapped plus pooled pages, and `trim` gives the pool
    /// back.
    #[test]
    fn unmapped_pages_are_pooled_reused_and_trimmed() {
        if !crate::testing::require_gpu("vmm_page_pool") {
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
        let base = v.reserve(8 * g).unwrap();
        let at = |k: usize| DevicePtr(base.0 + (k * g) as u64);
        let used0 = used();
        v.map(at(0), 3 * g, s).unwrap();
        v.map(at(3), g, s).unwrap();
        assert_eq!(used() - used0, 4 * g as i64, "four pages mapped");
        // SAFETY: mapped above (in two calls), no work uses them.
        unsafe { v.unmap(at(0), 4 * g, s).unwrap() };
        assert_eq!(b.pooled_bytes(), 4 * g as u64);
        assert_eq!(used() - used0, 4 * g as i64, "pooled pages stay allocated");
        v.map(at(5), 2 * g, s).unwrap();
        assert_eq!(b.pooled_bytes(), 2 * g as u64, "two pooled pages reused");
        assert_eq!(used() - used0, 4 * g as i64, "no new physical memory");
        assert!(
            v.map(at(6), g, s).is_err(),
            "a mapped page cannot be mapped again"
        );
        assert_eq!(
            b.pooled_bytes(),
            2 * g as u64,
            "a refused map touches nothing"
        );
        // SAFETY: mapped above, no work uses them; then nothing is mapped in the reservation.
        unsafe {
            assert!(v.unmap(at(4), 2 * g, s).is_err(), "page 4 is not mapped");
            v.unmap(at(5), 2 * g, s).unwrap();
            v.trim().unwrap();
            assert_eq!(used() - used0, 0, "trim gave every page back");
            v.release(base, 8 * g).unwrap();
        }
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
