//! Launch helpers of berth's kernels: grid sizing, kernel families, and [`run`] (bind, look
//! up, launch).
//!
//! NVRTC compilation, the per-device module cache and the launch itself are berth-cuda's
//! [`berth_cuda::kernel`] (the calls are made in its `ffi` module); this file re-exports
//! [`function`] and [`launch`] for the kernel files.

use super::{bind, module_source};
use crate::cuda::CudaError;
use crate::DType;
use berth_cuda::kernel::RawStream;
pub(crate) use berth_cuda::kernel::{function, launch};
use std::ffi::c_void;

/// Grid size for a grid-stride loop over `n` elements with `block` threads: enough blocks to
/// fill the device several times over, never more than needed.
pub(crate) fn grid_for(n: u64, block: u32) -> u32 {
    let needed = n.div_ceil(u64::from(block)).max(1);
    u32::try_from(needed.min(65_535 * 8)).unwrap_or(u32::MAX)
}

/// A family of kernels compiled together, one module per dtype: the module key's prefix
/// (`"unary"` gives modules `"unary.f32"`, `"unary.bf16"`, ...) and the family's CUDA source.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Family {
    /// Prefix of the module key.
    pub(crate) key: &'static str,
    /// The family's CUDA C source, without the prelude.
    pub(crate) src: &'static str,
}

/// Binds `device`'s context, looks up the kernel that the source declares as `KN(name)` (that
/// is `name`, `_` and `dtype`'s suffix: `"sum_rows"` in `f32` is `sum_rows_f32`) in `family`'s
/// module for `dtype` (compiling it on first use) and launches it with `grid` blocks of `block`
/// threads and no dynamic shared memory on `stream`.
///
/// # Errors
/// The errors of [`bind_context`](crate::cuda::bind_context), [`function`] and [`launch`].
///
/// # Safety
/// 1. `stream` belongs to `device`'s primary context (or is null).
/// 2. As [`launch`]: `params` match the kernel's signature and every pointer is valid.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn run(
    device: usize,
    stream: RawStream,
    family: Family,
    dtype: DType,
    name: &str,
    grid: u32,
    block: u32,
    params: &mut [*mut c_void],
) -> Result<(), CudaError> {
    bind(device)?;
    let key = format!("{}.{}", family.key, dtype.as_str());
    let full = format!("{name}_{}", dtype.as_str());
    // SAFETY: `bind` made `device`'s context current.
    let f = unsafe { function(device, &key, &full, || module_source(family.src, dtype)) }?;
    // SAFETY: `bind` made the context current; the rest is the caller's contract.
    unsafe { launch(device, f, grid, block, 0, stream, params) }?;
    Ok(())
}
