//! The driver library, `cuInit`, device queries and primary contexts.

use super::Attribute;
use crate::CudaError;
use cudarc::driver::{result, sys};

/// Maps a driver result into [`CudaError`] through [`CudaError::from_driver`].
pub(super) fn check<T>(
    op: &'static str,
    device: usize,
    r: Result<T, result::DriverError>,
) -> Result<T, CudaError> {
    r.map_err(|e| CudaError::from_driver(op, e, device, 0))
}

/// A failure of the probe calls, as [`CudaError::Driver`] without the out-of-memory mapping
/// (the probe reports the code's name).
fn plain(op: &'static str, e: result::DriverError) -> CudaError {
    CudaError::Driver {
        op,
        code: e.0 as u32,
        name: format!("{:?}", e.0),
    }
}

/// Whether the driver library (`libcuda.so`) can be loaded. Calls no driver function.
pub(crate) fn driver_library_present() -> bool {
    // SAFETY: `is_culib_present` only tries `dlopen` on the candidate names; it calls no
    // driver function.
    unsafe { sys::is_culib_present() }
}

/// `cuDriverGetVersion`: the newest CUDA version the driver supports, as
/// `1000 * major + 10 * minor` (12080 for CUDA 12.8). Needs no `cuInit`.
///
/// # Errors
/// [`CudaError::Driver`] with the code (never [`CudaError::OutOfMemory`]).
///
/// # Panics
/// cudarc's loader panics when the driver library is missing: call it after
/// [`driver_library_present`] (the symbol itself exists in every driver since CUDA 2.2).
pub(crate) fn driver_get_version() -> Result<i32, CudaError> {
    let mut version = 0;
    // SAFETY: the driver writes only the out-value, a live local.
    unsafe { sys::cuDriverGetVersion(&mut version) }
        .result()
        .map_err(|e| plain("cuDriverGetVersion", e))?;
    Ok(version)
}

/// The entries of `names` that the driver library does not export: looked up with `dlsym`
/// (cudarc's `culib().get`), so a missing one is reported instead of making cudarc's lazy loader
/// panic at the first call. Calls no driver function.
///
/// # Panics
/// cudarc panics when the driver library is missing: call it after [`driver_library_present`].
pub(crate) fn missing_driver_symbols(names: &[&'static str]) -> Vec<&'static str> {
    // SAFETY: `culib` only opens the library; `get` only looks a name up (the pointer type is
    // never called or dereferenced).
    let lib = unsafe { sys::culib() };
    names
        .iter()
        .copied()
        // SAFETY: as above; the looked-up pointer is dropped unused.
        .filter(|name| unsafe { lib.get::<*const std::ffi::c_void>(name.as_bytes()) }.is_err())
        .collect()
}

/// `cuInit(0)`.
///
/// # Errors
/// [`CudaError::Driver`] with the code (never [`CudaError::OutOfMemory`]).
///
/// # Panics
/// cudarc's loader panics when the driver lacks an entry point it resolves: call it inside
/// `catch_unwind`, after [`driver_library_present`].
pub(crate) fn init() -> Result<(), CudaError> {
    result::init().map_err(|e| plain("cuInit", e))
}

/// `cuDeviceGetCount`.
///
/// # Errors
/// [`CudaError::Driver`] with the code (never [`CudaError::OutOfMemory`]).
pub(crate) fn device_get_count() -> Result<i32, CudaError> {
    result::device::get_count().map_err(|e| plain("cuDeviceGetCount", e))
}

/// `cuDeviceGet`: the `CUdevice` of ordinal `device`.
pub(crate) fn device_get(device: usize) -> Result<i32, CudaError> {
    check("cuDeviceGet", device, result::device::get(device as i32))
}

/// `cuDeviceGetName` of `dev` (from [`device_get`] for ordinal `device`).
pub(crate) fn device_name(device: usize, dev: i32) -> Result<String, CudaError> {
    check("cuDeviceGetName", device, result::device::get_name(dev))
}

/// `cuDeviceTotalMem` of `dev` (from [`device_get`] for ordinal `device`), in bytes.
pub(crate) fn device_total_mem(device: usize, dev: i32) -> Result<usize, CudaError> {
    // SAFETY: the driver validates the ordinal `dev` and writes only its out-value.
    check("cuDeviceTotalMem", device, unsafe {
        result::device::total_mem(dev)
    })
}

/// `cuDeviceGetAttribute` of `dev` (from [`device_get`] for ordinal `device`).
pub(crate) fn device_attribute(device: usize, dev: i32, a: Attribute) -> Result<i32, CudaError> {
    use sys::CUdevice_attribute as A;
    let attr = match a {
        Attribute::ComputeCapabilityMajor => A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
        Attribute::ComputeCapabilityMinor => A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
        Attribute::MultiprocessorCount => A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
        Attribute::VirtualMemoryManagementSupported => {
            A::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
        }
    };
    // SAFETY: the driver validates the ordinal `dev` and writes only its out-value.
    check("cuDeviceGetAttribute", device, unsafe {
        result::device::get_attribute(dev, attr)
    })
}

/// `cuDevicePrimaryCtxRetain` of `dev` (from [`device_get`] for ordinal `device`): the
/// context as a `u64` handle. berth never releases it (it lives as long as the process).
pub(crate) fn primary_ctx_retain(device: usize, dev: i32) -> Result<u64, CudaError> {
    // SAFETY: the driver validates the ordinal `dev` and writes only its out-value.
    let ctx = check("cuDevicePrimaryCtxRetain", device, unsafe {
        result::primary_ctx::retain(dev)
    })?;
    Ok(ctx as usize as u64)
}

/// `cuCtxSetCurrent` on the calling thread.
///
/// # Safety
/// `ctx` is a context from [`primary_ctx_retain`] that was not released.
pub(crate) unsafe fn ctx_set_current(device: usize, ctx: u64) -> Result<(), CudaError> {
    // SAFETY: the caller's contract.
    check("cuCtxSetCurrent", device, unsafe {
        result::ctx::set_current(ctx as usize as sys::CUcontext)
    })
}

/// `cuCtxGetCurrent` on the calling thread: the current context as a `u64` handle, 0 for none.
pub(crate) fn ctx_get_current(device: usize) -> Result<u64, CudaError> {
    let ctx = check("cuCtxGetCurrent", device, result::ctx::get_current())?;
    Ok(ctx.map_or(0, |c| c as usize as u64))
}

/// `cuCtxSetCurrent` to a context handle read by [`ctx_get_current`] (0: no context).
///
/// # Safety
/// `ctx` is 0 or a context that is still alive (one the calling thread had current and that
/// its owner has not destroyed since).
pub(crate) unsafe fn ctx_restore(device: usize, ctx: u64) -> Result<(), CudaError> {
    // SAFETY: the caller's contract.
    check("cuCtxSetCurrent", device, unsafe {
        result::ctx::set_current(ctx as usize as sys::CUcontext)
    })
}

/// `cuCtxSynchronize` in `device`'s primary context: blocks until its queued work ran.
pub(crate) fn ctx_synchronize(device: usize) -> Result<(), CudaError> {
    crate::context::bind(device)?;
    check("cuCtxSynchronize", device, result::ctx::synchronize())
}

/// `cuMemGetInfo` in `device`'s primary context: `(free, total)` bytes.
pub(crate) fn mem_get_info(device: usize) -> Result<(usize, usize), CudaError> {
    crate::context::bind(device)?;
    check("cuMemGetInfo", device, result::mem_get_info())
}

/// `cuDeviceCanAccessPeer`: whether `dev` (ordinal `device`) can access memory of `peer_dev`
/// (ordinal `peer`) directly
/// (<https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__PEER__ACCESS.html>). Creates no
/// context.
pub(crate) fn device_can_access_peer(
    device: usize,
    dev: i32,
    peer_dev: i32,
) -> Result<bool, CudaError> {
    let mut can = 0;
    // SAFETY: the driver validates both ordinals and writes only the out-value, a live local.
    let r = unsafe { sys::cuDeviceCanAccessPeer(&mut can, dev, peer_dev) }.result();
    check("cuDeviceCanAccessPeer", device, r)?;
    Ok(can != 0)
}

/// `cuCtxEnablePeerAccess(peer's primary context, 0)` with `device`'s primary context current:
/// `device` may then access `peer`'s `cuMemAlloc` memory directly. Returns whether it already
/// could (`CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED`, the idempotent answer: nothing changed).
///
/// # Errors
/// [`CudaError::PeerAccessUnsupported`] for `CUDA_ERROR_PEER_ACCESS_UNSUPPORTED`;
/// [`CudaError::Driver`] otherwise (`CUDA_ERROR_TOO_MANY_PEERS`, ...).
pub(crate) fn ctx_enable_peer_access(device: usize, peer: usize) -> Result<bool, CudaError> {
    use sys::CUresult as R;
    let peer_ctx = crate::context::bind(peer)? as usize as sys::CUcontext;
    crate::context::bind(device)?;
    // SAFETY: `peer_ctx` is a retained primary context, never released; flags must be 0.
    match unsafe { sys::cuCtxEnablePeerAccess(peer_ctx, 0) }.result() {
        Ok(()) => Ok(false),
        Err(e) if e.0 == R::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => Ok(true),
        Err(e) if e.0 == R::CUDA_ERROR_PEER_ACCESS_UNSUPPORTED => {
            Err(CudaError::PeerAccessUnsupported { device, peer })
        }
        Err(e) => Err(CudaError::from_driver(
            "cuCtxEnablePeerAccess",
            e,
            device,
            0,
        )),
    }
}

/// `cuCtxDisablePeerAccess(peer's primary context)` with `device`'s primary context current.
/// Returns whether access was enabled before (`CUDA_ERROR_PEER_ACCESS_NOT_ENABLED`, the
/// idempotent answer, gives `false`: nothing changed).
///
/// # Errors
/// [`CudaError::Driver`].
pub(crate) fn ctx_disable_peer_access(device: usize, peer: usize) -> Result<bool, CudaError> {
    use sys::CUresult as R;
    let peer_ctx = crate::context::bind(peer)? as usize as sys::CUcontext;
    crate::context::bind(device)?;
    // SAFETY: `peer_ctx` is a retained primary context, never released.
    match unsafe { sys::cuCtxDisablePeerAccess(peer_ctx) }.result() {
        Ok(()) => Ok(true),
        Err(e) if e.0 == R::CUDA_ERROR_PEER_ACCESS_NOT_ENABLED => Ok(false),
        Err(e) => Err(CudaError::from_driver(
            "cuCtxDisablePeerAccess",
            e,
            device,
            0,
        )),
    }
}
