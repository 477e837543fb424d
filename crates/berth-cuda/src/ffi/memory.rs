//! Device memory (`cuMemAlloc`), virtual memory (`cuMemAddressReserve`, `cuMemCreate`,
//! `cuMemMap`, ...), pinned host memory (`cuMemHostAlloc`, `cuMemHostRegister`) and copies.

use crate::context::bind;
use crate::CudaError;
use cudarc::driver::{result::DriverError, sys};
use std::ffi::c_void;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicBool, Ordering};

fn r(op: &'static str, device: usize, bytes: usize, code: sys::CUresult) -> Result<(), CudaError> {
    code.result()
        .map_err(|e: DriverError| CudaError::from_driver(op, e, device, bytes))
}

fn s(raw: u64) -> sys::CUstream {
    raw as usize as sys::CUstream
}

/// `cuMemAlloc`: `bytes` of device memory on `device`.
pub(crate) fn mem_alloc(device: usize, bytes: usize) -> Result<u64, CudaError> {
    bind(device)?;
    let mut p = MaybeUninit::uninit();
    // SAFETY: the device's context is current; `p` is a valid out-pointer.
    r("cuMemAlloc", device, bytes, unsafe {
        sys::cuMemAlloc_v2(p.as_mut_ptr(), bytes)
    })?;
    // SAFETY: initialised by the successful call.
    Ok(unsafe { p.assume_init() })
}

/// `cuMemFree`.
///
/// # Safety
/// `ptr` came from [`mem_alloc`] on `device`, is freed once, and no queued work uses it.
pub(crate) unsafe fn mem_free(device: usize, ptr: u64) -> Result<(), CudaError> {
    bind(device)?;
    // SAFETY: the caller's contract.
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

/// `cuMemGetAllocationGranularity` (minimum) of pinned device memory on `device`, in bytes.
pub(crate) fn mem_allocation_granularity(device: usize) -> Result<usize, CudaError> {
    bind(device)?;
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
    Ok(g)
}

/// `cuMemAddressReserve`: `bytes` of virtual address space, nothing mapped.
pub(crate) fn address_reserve(device: usize, bytes: usize) -> Result<u64, CudaError> {
    bind(device)?;
    let mut p = 0u64;
    // SAFETY: valid out-pointer; no fixed address, default alignment.
    r("cuMemAddressReserve", device, bytes, unsafe {
        sys::cuMemAddressReserve(&mut p, bytes, 0, 0, 0)
    })?;
    Ok(p)
}

/// `cuMemAddressFree` of a whole reservation.
///
/// # Safety
/// `base..base+bytes` is a reservation from [`address_reserve`] with nothing mapped in it,
/// freed once.
pub(crate) unsafe fn address_free(device: usize, base: u64, bytes: usize) -> Result<(), CudaError> {
    bind(device)?;
    // SAFETY: the caller's contract.
    r("cuMemAddressFree", device, 0, unsafe {
        sys::cuMemAddressFree(base, bytes)
    })
}

/// Whether [`mem_create`] asks for handles exportable as POSIX file descriptors (cleared at
/// the driver's first refusal, after which handles are created plain and cannot be shared with
/// another process: `Note [Sharing mapped memory]` in `ipc.rs`).
static EXPORTABLE: AtomicBool = AtomicBool::new(true);

/// `cuMemCreate`: a handle to `bytes` of physical memory on `device`, exportable as a POSIX file
/// descriptor where the driver allows it (as PyTorch's expandable segments create theirs).
pub(crate) fn mem_create(device: usize, bytes: usize) -> Result<u64, CudaError> {
    bind(device)?;
    let mut p = prop(device);
    let mut h = 0u64;
    if EXPORTABLE.load(Ordering::Relaxed) {
        p.requestedHandleTypes =
            sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        // SAFETY: valid out-pointer and property struct.
        let code = unsafe { sys::cuMemCreate(&mut h, bytes, &p, 0) };
        match code {
            sys::CUresult::CUDA_SUCCESS => return Ok(h),
            // The driver cannot export on this system: create plain handles from now on.
            sys::CUresult::CUDA_ERROR_NOT_SUPPORTED
            | sys::CUresult::CUDA_ERROR_NOT_PERMITTED
            | sys::CUresult::CUDA_ERROR_INVALID_VALUE => EXPORTABLE.store(false, Ordering::Relaxed),
            other => return r("cuMemCreate", device, bytes, other).map(|()| h),
        }
        p.requestedHandleTypes = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE;
    }
    // SAFETY: valid out-pointer and property struct.
    r("cuMemCreate", device, bytes, unsafe {
        sys::cuMemCreate(&mut h, bytes, &p, 0)
    })?;
    Ok(h)
}

/// `cuMemExportToShareableHandle` as a POSIX file descriptor, owned by the caller (closing it
/// does not release the memory).
pub(crate) fn mem_export_fd(device: usize, h: u64) -> Result<i32, CudaError> {
    bind(device)?;
    let mut fd: std::ffi::c_int = -1;
    // SAFETY: a valid out-pointer of the size the POSIX descriptor type writes; the driver
    // checks the handle.
    r("cuMemExportToShareableHandle", device, 0, unsafe {
        sys::cuMemExportToShareableHandle(
            (&mut fd as *mut std::ffi::c_int).cast(),
            h,
            sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            0,
        )
    })?;
    Ok(fd)
}

/// `cuMemImportFromShareableHandle` of a POSIX file descriptor: a new handle to the memory
/// behind it, released with [`mem_release`] (the descriptor stays the caller's to close).
pub(crate) fn mem_import_fd(device: usize, fd: i32) -> Result<u64, CudaError> {
    bind(device)?;
    let mut h = 0u64;
    // SAFETY: a valid out-pointer; a POSIX descriptor is passed by value in the pointer
    // argument, as the driver's documentation says.
    r("cuMemImportFromShareableHandle", device, 0, unsafe {
        sys::cuMemImportFromShareableHandle(
            &mut h,
            fd as isize as *mut c_void,
            sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
        )
    })?;
    Ok(h)
}

/// `cuMemMap` of all of handle `h` (`bytes` long) at `addr`.
///
/// # Safety
/// `addr..addr+bytes` is inside a reservation and unmapped; `h` is a live handle of `bytes`
/// bytes from [`mem_create`].
pub(crate) unsafe fn mem_map(
    device: usize,
    addr: u64,
    bytes: usize,
    h: u64,
) -> Result<(), CudaError> {
    bind(device)?;
    // SAFETY: the caller's contract.
    r("cuMemMap", device, bytes, unsafe {
        sys::cuMemMap(addr, bytes, 0, h, 0)
    })
}

/// `cuMemSetAccess`: read/write for `device` on a fully mapped range (any number of
/// mappings). The driver refuses a range that is not mapped.
pub(crate) fn mem_set_access(device: usize, addr: u64, bytes: usize) -> Result<(), CudaError> {
    bind(device)?;
    let desc = sys::CUmemAccessDesc {
        location: prop(device).location,
        flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    };
    // SAFETY: `desc` is one valid entry; the driver checks the range.
    r("cuMemSetAccess", device, bytes, unsafe {
        sys::cuMemSetAccess(addr, bytes, &desc, 1)
    })
}

/// `cuMemUnmap` of a range made of whole mappings.
///
/// # Safety
/// The range consists of whole mappings made by [`mem_map`], and no queued work or live
/// reference uses it.
pub(crate) unsafe fn mem_unmap(device: usize, addr: u64, bytes: usize) -> Result<(), CudaError> {
    bind(device)?;
    // SAFETY: the caller's contract.
    r("cuMemUnmap", device, 0, unsafe {
        sys::cuMemUnmap(addr, bytes)
    })
}

/// `cuMemRelease` of a physical-memory handle.
///
/// # Safety
/// `h` came from [`mem_create`], is mapped nowhere, and is released once.
pub(crate) unsafe fn mem_release(device: usize, h: u64) -> Result<(), CudaError> {
    bind(device)?;
    // SAFETY: the caller's contract.
    r("cuMemRelease", device, 0, unsafe { sys::cuMemRelease(h) })
}

/// `cuMemHostAlloc(PORTABLE)`: `bytes` of pinned host memory in `device`'s context.
pub(crate) fn host_alloc(device: usize, bytes: usize) -> Result<*mut u8, CudaError> {
    bind(device)?;
    let mut p: *mut c_void = std::ptr::null_mut();
    // SAFETY: a valid out-pointer; a context is current.
    r("cuMemHostAlloc", device, bytes, unsafe {
        sys::cuMemHostAlloc(&mut p, bytes, sys::CU_MEMHOSTALLOC_PORTABLE)
    })?;
    Ok(p.cast())
}

/// `cuMemFreeHost`.
///
/// # Safety
/// `p` came from [`host_alloc`], is freed once, and no queued copy or live reference uses it.
pub(crate) unsafe fn host_free(device: usize, p: *mut u8) -> Result<(), CudaError> {
    bind(device)?;
    // SAFETY: the caller's contract.
    r("cuMemFreeHost", device, 0, unsafe {
        sys::cuMemFreeHost(p.cast())
    })
}

/// `cuMemHostRegister(PORTABLE)`: page-locks `p..p+bytes` (reads and writes nothing; the
/// driver refuses a range that is not mapped). Undo with [`host_unregister`] before the
/// memory is unmapped.
pub(crate) fn host_register(device: usize, p: *mut u8, bytes: usize) -> Result<(), CudaError> {
    bind(device)?;
    // SAFETY: the driver only looks the range up and locks its pages.
    r("cuMemHostRegister", device, bytes, unsafe {
        sys::cuMemHostRegister_v2(p.cast(), bytes, sys::CU_MEMHOSTREGISTER_PORTABLE)
    })
}

/// `cuMemHostUnregister`.
///
/// # Safety
/// `p` is the start of a range registered by [`host_register`] that no queued copy uses.
pub(crate) unsafe fn host_unregister(device: usize, p: *mut u8) -> Result<(), CudaError> {
    bind(device)?;
    // SAFETY: the caller's contract.
    r("cuMemHostUnregister", device, 0, unsafe {
        sys::cuMemHostUnregister(p.cast())
    })
}

/// `cuPointerGetAttribute(MEMORY_TYPE) == HOST` in `device`'s context: whether `p` is pinned
/// host memory known to the driver; `false` on any failure. Binding creates the context if
/// needed: callers that must not create one check [`is_initialized`](crate::is_initialized)
/// first.
pub(crate) fn pointer_is_host(device: usize, p: *const u8) -> bool {
    if bind(device).is_err() {
        return false;
    }
    let mut t: u32 = 0;
    // SAFETY: a valid out-pointer of the attribute's type (`CUmemorytype`, 32 bits); the
    // pointer is only looked up, never dereferenced.
    let code = unsafe {
        sys::cuPointerGetAttribute(
            (&mut t as *mut u32).cast(),
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
            p as u64,
        )
    };
    code == sys::CUresult::CUDA_SUCCESS && t == sys::CUmemorytype::CU_MEMORYTYPE_HOST as u32
}

/// `cuMemcpyHtoDAsync` of `n` bytes on stream `stream` of `dev`.
///
/// # Safety
/// `src..src+n` is live host memory, not written and kept alive until the copy ran (for
/// pageable memory: the call returns after reading it); `dst..dst+n` is device memory of
/// `dev` that nothing else uses until the copy ran; `stream` is a live stream of `dev` or 0.
pub(crate) unsafe fn memcpy_htod_async(
    dev: usize,
    dst: u64,
    src: *const u8,
    n: usize,
    stream: u64,
) -> Result<(), CudaError> {
    bind(dev)?;
    // SAFETY: the caller's contract.
    r("cuMemcpyHtoDAsync", dev, n, unsafe {
        sys::cuMemcpyHtoDAsync_v2(dst, src.cast(), n, s(stream))
    })
}

/// `cuMemcpyDtoHAsync` of `n` bytes on stream `stream` of `dev`.
///
/// # Safety
/// `dst..dst+n` is host memory that outlives the copy and is neither read nor written until
/// it ran; `src..src+n` is live device memory of `dev`; `stream` is a live stream of `dev`
/// or 0.
pub(crate) unsafe fn memcpy_dtoh_async(
    dev: usize,
    dst: *mut u8,
    src: u64,
    n: usize,
    stream: u64,
) -> Result<(), CudaError> {
    bind(dev)?;
    // SAFETY: the caller's contract.
    r("cuMemcpyDtoHAsync", dev, n, unsafe {
        sys::cuMemcpyDtoHAsync_v2(dst.cast(), src, n, s(stream))
    })
}

/// `cuMemcpyDtoDAsync` of `n` bytes on stream `stream` of `dev`.
///
/// # Safety
/// Both ranges are live device memory of `dev` until the copy ran, and nothing else writes
/// `dst..dst+n` meanwhile; `stream` is a live stream of `dev` or 0.
pub(crate) unsafe fn memcpy_dtod_async(
    dev: usize,
    dst: u64,
    src: u64,
    n: usize,
    stream: u64,
) -> Result<(), CudaError> {
    bind(dev)?;
    // SAFETY: the caller's contract.
    r("cuMemcpyDtoDAsync", dev, n, unsafe {
        sys::cuMemcpyDtoDAsync_v2(dst, src, n, s(stream))
    })
}

/// `cuMemcpyPeerAsync` of `n` bytes from `src` on device `from` to `dst` on device `to`, on
/// stream `stream` of `to`.
///
/// # Safety
/// Both ranges are live device memory of their devices until the copy ran, and nothing else
/// writes `dst..dst+n` meanwhile; `stream` is a live stream of `to` or 0.
pub(crate) unsafe fn memcpy_peer_async(
    to: usize,
    dst: u64,
    from: usize,
    src: u64,
    n: usize,
    stream: u64,
) -> Result<(), CudaError> {
    let src_ctx = bind(from)? as usize as sys::CUcontext;
    let dst_ctx = bind(to)? as usize as sys::CUcontext;
    // SAFETY: the caller's contract; both contexts are retained for the process's lifetime.
    r("cuMemcpyPeerAsync", to, n, unsafe {
        sys::cuMemcpyPeerAsync(dst, dst_ctx, src, src_ctx, n, s(stream))
    })
}
