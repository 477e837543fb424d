//! The choice of [`DeviceKernels`] for a device: the CPU's (`crate::cpu`), CUDA's
//! (`crate::cuda::ops` with the `cuda` feature, "unavailable" errors without it), wrapped for
//! the profiler while one is active ([`crate::profiler::kernels`]); and the two helpers through
//! which the front-ends allocate and copy. It lives beside the trait's file (`interface.rs`),
//! not in it, so the trait imports none of its implementations (house style, "Interfaces are
//! leaves").

use crate::device_kernels::interface::{DeviceKernels, View};
use crate::{DType, Device, Error, Result, Storage, Tensor};

/// CUDA kernels when none are plugged in: every call is an "unavailable" error.
#[cfg_attr(feature = "cuda", allow(dead_code))]
struct NoCudaKernels;

impl DeviceKernels for NoCudaKernels {
    fn kind(&self) -> Device {
        Device::CudaCurrent
    }
}

/// The CUDA implementation of [`DeviceKernels`]: berth's NVRTC/cuBLAS kernels with the
/// `cuda` feature, "unavailable" errors without it.
#[cfg(feature = "cuda")]
fn cuda_kernels() -> &'static dyn DeviceKernels {
    &crate::cuda::ops::CudaKernels
}

/// Without the `cuda` feature every CUDA op is an "unavailable" error.
#[cfg(not(feature = "cuda"))]
fn cuda_kernels() -> &'static dyn DeviceKernels {
    &NoCudaKernels
}

/// The kernels of `device` (never called for meta: front-ends handle meta themselves).
///
/// # Errors
/// [`Error::NoMetaImpl`] for meta (a front-end without a meta rule), `DeviceNotAvailable` for
/// mps.
///
/// While a profiler is active the kernels come wrapped, recording each call
/// (`Note [Profiler off costs one load]` in [`crate::profiler`]).
pub fn kernels_for(device: Device, op: &'static str) -> Result<&'static dyn DeviceKernels> {
    let k: &'static dyn DeviceKernels = match device.kind() {
        crate::DeviceKind::Cpu => &crate::cpu::CpuKernels,
        crate::DeviceKind::Cuda => cuda_kernels(),
        crate::DeviceKind::Meta => return Err(Error::NoMetaImpl { op }),
        _ => {
            return Err(Error::DeviceNotAvailable {
                device,
                reason: "no kernels for this device kind on this platform".into(),
            })
        }
    };
    if crate::profiler::is_active() {
        return Ok(crate::profiler::kernels::wrap(k, op));
    }
    Ok(k)
}

/// Allocate an output tensor of `shape`/`dtype` on `device` (meta: no memory). Every tensor
/// creation goes through here or [`crate::layout::checked_nbytes`], so no device — meta
/// included — ever sees a shape whose element count or byte size overflows.
///
/// # Errors
/// [`Error::NumelOverflow`] / [`Error::StorageSizeOverflow`] naming `op` and `shape`; the
/// device's allocation error (out of memory).
pub(crate) fn alloc_tensor(
    device: Device,
    shape: &[usize],
    dtype: DType,
    op: &'static str,
) -> Result<Tensor> {
    let nbytes = crate::layout::checked_nbytes(shape, dtype, op)?;
    let storage = if device.is_meta() {
        Storage::meta(nbytes)
    } else {
        kernels_for(device, op)?.alloc(device, nbytes)?
    };
    Ok(Tensor::from_contiguous(storage, shape, dtype))
}

/// A dense copy of `t` on its device (meta: a meta storage of the dense size).
pub(crate) fn contiguous_copy(t: &Tensor) -> Result<Tensor> {
    let out = alloc_tensor(t.device(), t.shape(), t.dtype(), "clone")?;
    if !t.device().is_meta() {
        kernels_for(t.device(), "clone")?.copy(View::of(&out), View::of(t))?;
    }
    Ok(out)
}
