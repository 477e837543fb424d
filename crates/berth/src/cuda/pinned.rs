//! [`CudaHostBackend`]: berth-alloc's [`HostBackend`] on `cuMemHostAlloc` / `cuMemFreeHost`,
//! and `cuMemHostRegister` / `cuMemHostUnregister` for `pinned_use_cuda_host_register` (the
//! host caching allocator pre-faults pages from `pinned_num_register_threads` threads, then
//! calls [`HostBackend::register`]).
//!
//! Pinned memory is allocated `PORTABLE` in the context of the device current on the calling
//! thread when the backend is built (BUG-22: never a device the program did not name).

use super::backend::CudaEvent;
use super::CudaError;
use crate::alloc::{BackendError, HostBackend, StreamId};
use std::ptr::NonNull;

/// Page-locked host memory from the CUDA driver.
#[derive(Debug)]
pub struct CudaHostBackend {
    device: usize,
}

impl CudaHostBackend {
    /// A backend allocating in the context of the thread's current device (created if needed).
    ///
    /// # Errors
    /// [`CudaError::Unavailable`], [`CudaError::Driver`].
    pub fn new() -> Result<CudaHostBackend, CudaError> {
        let device = super::current_device()?;
        super::bind_context(device)?;
        Ok(CudaHostBackend { device })
    }

    /// The device whose context pins the memory.
    pub fn device(&self) -> usize {
        self.device
    }
}

impl HostBackend for CudaHostBackend {
    type Event = CudaEvent;

    fn alloc_pinned(&self, bytes: usize) -> Result<NonNull<u8>, BackendError> {
        let p = ffi::host_alloc(self.device, bytes)?;
        NonNull::new(p).ok_or(BackendError::Other {
            op: "cuMemHostAlloc",
            message: "returned a null pointer".into(),
        })
    }

    unsafe fn free_pinned(&self, ptr: NonNull<u8>, _bytes: usize) -> Result<(), BackendError> {
        Ok(ffi::host_free(self.device, ptr.as_ptr())?)
    }

    fn register(&self, ptr: NonNull<u8>, bytes: usize) -> Result<(), BackendError> {
        Ok(ffi::host_register(self.device, ptr.as_ptr(), bytes)?)
    }

    unsafe fn unregister(&self, ptr: NonNull<u8>, _bytes: usize) -> Result<(), BackendError> {
        Ok(ffi::host_unregister(self.device, ptr.as_ptr())?)
    }

    fn record_event(&self, stream: StreamId) -> Result<CudaEvent, BackendError> {
        Ok(CudaEvent::record(super::stream::device_of(stream), stream)?)
    }

    fn query_event(&self, event: &CudaEvent) -> Result<bool, BackendError> {
        Ok(event.query()?)
    }

    fn sync_event(&self, event: &CudaEvent) -> Result<(), BackendError> {
        Ok(event.synchronize()?)
    }

    fn is_pinned(&self, ptr: *const u8) -> bool {
        ffi::is_host_pinned(self.device, ptr)
    }
}

#[cfg(feature = "cuda")]
mod ffi {
    use super::super::context::bind;
    use super::super::CudaError;
    use cudarc::driver::sys;
    use std::ffi::c_void;

    fn r(
        op: &'static str,
        device: usize,
        bytes: usize,
        code: sys::CUresult,
    ) -> Result<(), CudaError> {
        code.result()
            .map_err(|e| CudaError::from_driver(op, e, device, bytes))
    }

    pub(super) fn host_alloc(device: usize, bytes: usize) -> Result<*mut u8, CudaError> {
        bind(device)?;
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; a context is current.
        r("cuMemHostAlloc", device, bytes, unsafe {
            sys::cuMemHostAlloc(&mut p, bytes, sys::CU_MEMHOSTALLOC_PORTABLE)
        })?;
        Ok(p.cast())
    }

    pub(super) fn host_free(device: usize, p: *mut u8) -> Result<(), CudaError> {
        bind(device)?;
        // SAFETY: `p` came from `cuMemHostAlloc` (the caller's contract).
        r("cuMemFreeHost", device, 0, unsafe {
            sys::cuMemFreeHost(p.cast())
        })
    }

    pub(super) fn host_register(device: usize, p: *mut u8, bytes: usize) -> Result<(), CudaError> {
        bind(device)?;
        // SAFETY: `p..p+bytes` is live host memory owned by the caller.
        r("cuMemHostRegister", device, bytes, unsafe {
            sys::cuMemHostRegister_v2(p.cast(), bytes, sys::CU_MEMHOSTREGISTER_PORTABLE)
        })
    }

    pub(super) fn host_unregister(device: usize, p: *mut u8) -> Result<(), CudaError> {
        bind(device)?;
        // SAFETY: `p` was registered (the caller's contract).
        r("cuMemHostUnregister", device, 0, unsafe {
            sys::cuMemHostUnregister(p.cast())
        })
    }

    /// `cuPointerGetAttribute(MEMORY_TYPE) == HOST`, asked only when the context exists
    /// (BUG-06: `is_pinned` never creates one).
    pub(super) fn is_host_pinned(device: usize, p: *const u8) -> bool {
        if !super::super::is_initialized(device) || bind(device).is_err() {
            return false;
        }
        let mut t: u32 = 0;
        // SAFETY: a valid out-pointer of the attribute's type (`CUmemorytype`, 32 bits).
        let code = unsafe {
            sys::cuPointerGetAttribute(
                (&mut t as *mut u32).cast(),
                sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                p as u64,
            )
        };
        code == sys::CUresult::CUDA_SUCCESS && t == sys::CUmemorytype::CU_MEMORYTYPE_HOST as u32
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
    pub(super) fn host_alloc(_: usize, _: usize) -> Result<*mut u8, CudaError> {
        no()
    }
    pub(super) fn host_free(_: usize, _: *mut u8) -> Result<(), CudaError> {
        no()
    }
    pub(super) fn host_register(_: usize, _: *mut u8, _: usize) -> Result<(), CudaError> {
        no()
    }
    pub(super) fn host_unregister(_: usize, _: *mut u8) -> Result<(), CudaError> {
        no()
    }
    pub(super) fn is_host_pinned(_: usize, _: *const u8) -> bool {
        false
    }
}
