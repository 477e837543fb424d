//! [`CudaBackend`]: berth-alloc's [`MemoryBackend`] on `cuMemAlloc` / `cuMemFree`, with the
//! [`VirtualMemoryBackend`] capability on `cuMemAddressReserve` / `cuMemCreate` / `cuMemMap` /
//! `cuMemSetAccess` / `cuMemUnmap` / `cuMemRelease` for expandable segments; and
//! [`CudaEvent`], the event type it shares with the pinned host backend.
//!
//! This is the FFI-to-backend layer of house style 1.1: no policy here. Driver failures become
//! [`BackendError`] through one conversion (`From<CudaError>`), so `CUDA_ERROR_OUT_OF_MEMORY`
//! is recognised only in [`CudaError::from_driver`] and reaches the policy as the retryable
//! [`BackendError::OutOfMemory`].

use super::{raw, CudaError};
use crate::alloc::{
    BackendError, DevicePtr, MemInfo, MemoryBackend, StreamId, VirtualMemoryBackend,
};
use std::collections::BTreeMap;
use std::sync::Mutex;

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
            CudaError::Driver { op, .. } => BackendError::Other {
                op,
                message: e.to_string(),
            },
            other => BackendError::Other {
                op: "cuda",
                message: other.to_string(),
            },
        }
    }
}

/// A recorded CUDA event (timing disabled); destroyed on drop.
#[derive(Debug)]
pub struct CudaEvent {
    device: usize,
    raw: u64,
}

impl CudaEvent {
    /// Records a new event on `stream` of `device`.
    ///
    /// # Errors
    /// [`CudaError::Driver`] / [`CudaError::Unavailable`].
    pub fn record(device: usize, stream: StreamId) -> Result<CudaEvent, CudaError> {
        let raw = raw::event_create(device, false)?;
        let ev = CudaEvent { device, raw };
        raw::event_record(device, raw, stream.0)?;
        Ok(ev)
    }

    /// Whether it completed.
    ///
    /// # Errors
    /// [`CudaError::Driver`].
    pub fn query(&self) -> Result<bool, CudaError> {
        raw::event_query(self.device, self.raw)
    }

    /// Blocks until it completed.
    ///
    /// # Errors
    /// [`CudaError::Driver`].
    pub fn synchronize(&self) -> Result<(), CudaError> {
        raw::event_sync(self.device, self.raw)
    }
}

impl Drop for CudaEvent {
    fn drop(&mut self) {
        let _ = raw::event_destroy(self.device, self.raw);
    }
}

/// Device memory of one GPU from the driver: `cuMemAlloc` / `cuMemFree` segments, plus virtual
/// memory (when the device supports it) for expandable segments.
#[derive(Debug)]
pub struct CudaBackend {
    device: usize,
    vmm: Option<Vmm>,
}

/// Mapped physical chunks: address → (bytes, `CUmemGenericAllocationHandle`).
#[derive(Debug, Default)]
struct Vmm {
    granularity: usize,
    chunks: Mutex<BTreeMap<u64, (usize, u64)>>,
}

impl CudaBackend {
    /// The backend of `device`; creates the device's primary context (the named device).
    ///
    /// # Errors
    /// [`CudaError::InvalidDevice`], [`CudaError::Unavailable`], [`CudaError::Driver`].
    pub fn new(device: usize) -> Result<CudaBackend, CudaError> {
        super::check_device(device)?;
        super::bind_context(device)?;
        let vmm = ffi::granularity(device)
            .ok()
            .flatten()
            .map(|granularity| Vmm {
                granularity,
                chunks: Mutex::default(),
            });
        Ok(CudaBackend { device, vmm })
    }

    /// The device index.
    pub fn device(&self) -> usize {
        self.device
    }
}

impl MemoryBackend for CudaBackend {
    type Event = CudaEvent;

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
        Ok(ffi::mem_free(self.device, ptr.0)?)
    }

    fn mem_info(&self) -> Result<MemInfo, BackendError> {
        let (free, total) = super::mem_get_info(self.device)?;
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
        // One physical handle per granularity page, so that a policy may later unmap any
        // page-aligned sub-range of this mapping (berth's `paged` policy does): the driver only
        // unmaps whole mappings (`cuMemUnmap` of a handle's full range).
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
        let mut done: Vec<(u64, u64)> = Vec::with_capacity(bytes / page);
        for a in (addr.0..addr.0 + bytes as u64).step_by(page) {
            match ffi::create_and_map(self.device, a, page) {
                Ok(h) => done.push((a, h)),
                Err(e) => {
                    for &(a, h) in &done {
                        let _ = ffi::unmap_and_release(self.device, a, page, h);
                    }
                    return Err(e.into());
                }
            }
        }
        let mut chunks = vmm.chunks.lock().unwrap_or_else(|p| p.into_inner());
        for (a, h) in done {
            chunks.insert(a, (page, h));
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
        let end = addr.0 + bytes as u64;
        let mut chunks = vmm.chunks.lock().unwrap_or_else(|p| p.into_inner());
        let inside: Vec<(u64, usize, u64)> = chunks
            .range(addr.0..end)
            .map(|(&a, &(b, h))| (a, b, h))
            .collect();
        let covered: usize = inside.iter().map(|c| c.1).sum();
        if covered != bytes || inside.iter().any(|&(a, b, _)| a + b as u64 > end) {
            return Err(BackendError::InvalidPointer {
                op: "unmap",
                ptr: addr,
            });
        }
        for (a, b, h) in inside {
            chunks.remove(&a);
            ffi::unmap_and_release(self.device, a, b, h)?;
        }
        Ok(())
    }

    unsafe fn release(&self, base: DevicePtr, bytes: usize) -> Result<(), BackendError> {
        Ok(ffi::address_free(self.device, base.0, bytes)?)
    }
}

#[cfg(feature = "cuda")]
mod ffi {
    use super::super::context::bind;
    use super::super::CudaError;
    use cudarc::driver::{result::DriverError, sys};
    use std::mem::MaybeUninit;

    fn r(
        op: &'static str,
        device: usize,
        bytes: usize,
        code: sys::CUresult,
    ) -> Result<(), CudaError> {
        code.result()
            .map_err(|e: DriverError| CudaError::from_driver(op, e, device, bytes))
    }

    pub(super) fn mem_alloc(device: usize, bytes: usize) -> Result<u64, CudaError> {
        bind(device)?;
        let mut p = MaybeUninit::uninit();
        // SAFETY: the device's context is current; `p` is a valid out-pointer.
        r("cuMemAlloc", device, bytes, unsafe {
            sys::cuMemAlloc_v2(p.as_mut_ptr(), bytes)
        })?;
        // SAFETY: initialised by the successful call.
        Ok(unsafe { p.assume_init() })
    }

    pub(super) fn mem_free(device: usize, ptr: u64) -> Result<(), CudaError> {
        bind(device)?;
        // SAFETY: `ptr` came from `cuMemAlloc` on this device (the caller's contract).
        r("cuMemFree", device, 0, unsafe { sys::cuMemFree_v2(ptr) })
    }

    fn prop(device: usize) -> sys::CUmemAllocationProp {
        // SAFETY: a plain C struct; all-zero is a valid value of every field (enums' 0 members,
        // null pointer).
        let mut p: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
        p.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        p.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        p.location.id = device as i32;
        p
    }

    /// The minimum granularity, or `None` when the device has no VMM support.
    pub(super) fn granularity(device: usize) -> Result<Option<usize>, CudaError> {
        bind(device)?;
        let dev = super::super::driver::check(
            "cuDeviceGet",
            device,
            cudarc::driver::result::device::get(device as i32),
        )?;
        // SAFETY: `dev` came from `cuDeviceGet`.
        let supported = unsafe {
            cudarc::driver::result::device::get_attribute(
                dev,
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
            )
        }
        .unwrap_or(0);
        if supported == 0 {
            return Ok(None);
        }
        let p = prop(device);
        let mut g = 0usize;
        // SAFETY: valid out-pointer and property struct.
        r("cuMemGetAllocationGranularity", device, 0, unsafe {
            sys::cuMemGetAllocationGranularity(
                &mut g,
                &p,
                sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
            )
        })?;
        Ok(Some(g))
    }

    pub(super) fn address_reserve(device: usize, bytes: usize) -> Result<u64, CudaError> {
        bind(device)?;
        let mut p = 0u64;
        // SAFETY: valid out-pointer; no fixed address, default alignment.
        r("cuMemAddressReserve", device, bytes, unsafe {
            sys::cuMemAddressReserve(&mut p, bytes, 0, 0, 0)
        })?;
        Ok(p)
    }

    pub(super) fn address_free(device: usize, base: u64, bytes: usize) -> Result<(), CudaError> {
        bind(device)?;
        // SAFETY: the caller's contract: a reservation with nothing mapped.
        r("cuMemAddressFree", device, 0, unsafe {
            sys::cuMemAddressFree(base, bytes)
        })
    }

    /// `cuMemCreate` + `cuMemMap` + `cuMemSetAccess`; on failure nothing stays mapped.
    pub(super) fn create_and_map(device: usize, addr: u64, bytes: usize) -> Result<u64, CudaError> {
        bind(device)?;
        let p = prop(device);
        let mut h = 0u64;
        // SAFETY: valid out-pointer and property struct.
        r("cuMemCreate", device, bytes, unsafe {
            sys::cuMemCreate(&mut h, bytes, &p, 0)
        })?;
        // SAFETY: `addr` is inside a reservation (the caller's contract), `h` is fresh.
        if let Err(e) = r("cuMemMap", device, bytes, unsafe {
            sys::cuMemMap(addr, bytes, 0, h, 0)
        }) {
            // SAFETY: `h` is unmapped and released once.
            unsafe { sys::cuMemRelease(h) };
            return Err(e);
        }
        let desc = sys::CUmemAccessDesc {
            location: p.location,
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: the range was just mapped.
        if let Err(e) = r("cuMemSetAccess", device, bytes, unsafe {
            sys::cuMemSetAccess(addr, bytes, &desc, 1)
        }) {
            // SAFETY: undo the mapping made above, once.
            unsafe {
                sys::cuMemUnmap(addr, bytes);
                sys::cuMemRelease(h);
            }
            return Err(e);
        }
        Ok(h)
    }

    pub(super) fn unmap_and_release(
        device: usize,
        addr: u64,
        bytes: usize,
        h: u64,
    ) -> Result<(), CudaError> {
        bind(device)?;
        // SAFETY: `addr..addr+bytes` was mapped to `h` by `create_and_map`; no work uses it
        // (the caller's contract).
        r("cuMemUnmap", device, 0, unsafe {
            sys::cuMemUnmap(addr, bytes)
        })?;
        // SAFETY: `h` is now unmapped and released once.
        r("cuMemRelease", device, 0, unsafe { sys::cuMemRelease(h) })
    }
}

#[cfg(not(feature = "cuda"))]
mod ffi {
    use super::super::CudaError;

    fn no<T>() -> Result<T, CudaError> {
        Err(CudaError::unavailable(
            "berth was built without the `cuda` feature",
        ))
    }
    pub(super) fn mem_alloc(_: usize, _: usize) -> Result<u64, CudaError> {
        no()
    }
    pub(super) fn mem_free(_: usize, _: u64) -> Result<(), CudaError> {
        no()
    }
    pub(super) fn granularity(_: usize) -> Result<Option<usize>, CudaError> {
        no()
    }
    pub(super) fn address_reserve(_: usize, _: usize) -> Result<u64, CudaError> {
        no()
    }
    pub(super) fn address_free(_: usize, _: u64, _: usize) -> Result<(), CudaError> {
        no()
    }
    pub(super) fn create_and_map(_: usize, _: u64, _: usize) -> Result<u64, CudaError> {
        no()
    }
    pub(super) fn unmap_and_release(_: usize, _: u64, _: usize, _: u64) -> Result<(), CudaError> {
        no()
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

    #[test]
    fn backend_without_a_gpu_is_unavailable_not_a_panic() {
        if crate::cuda::is_available() {
            return;
        }
        assert!(matches!(
            CudaBackend::new(0),
            Err(CudaError::Unavailable { .. })
        ));
    }
}
