//! Discovery with PyTorch's names: `is_available`, `device_count`, `get_device_name`,
//! `get_device_properties`, `mem_get_info`, `current_device` / `set_device`.
//!
//! Every function answers "not available" (or 0 / `false`) on a machine without the NVIDIA
//! driver and never panics (see [`driver`](super::driver)).

use crate::driver::driver;
use crate::CudaError;
use std::cell::Cell;

thread_local! {
    /// The thread's current device (`torch.cuda.current_device()` is per thread too).
    static CURRENT: Cell<usize> = const { Cell::new(0) };
}

/// Whether at least one CUDA device can be used (`torch.cuda.is_available()`).
///
/// Never panics and never creates a context: it loads the driver library and calls `cuInit`
/// once per process.
pub fn is_available() -> bool {
    device_count() > 0
}

/// The number of visible CUDA devices, 0 when CUDA is not available
/// (`torch.cuda.device_count()`).
///
/// Honours [`testing::fake_device_count`](crate::testing::fake_device_count) on this thread.
pub fn device_count() -> usize {
    if let Some(n) = crate::testing::faked_count() {
        return n;
    }
    driver().unwrap_or(0)
}

/// Why CUDA is not available, or `None` when it is.
pub fn unavailable_reason() -> Option<String> {
    match driver() {
        Ok(_) => None,
        Err(CudaError::Unavailable { reason }) => Some(reason),
        Err(other) => Some(other.to_string()),
    }
}

/// Checks that `index` names a visible device.
///
/// # Errors
/// 1. [`CudaError::InvalidDevice`] when `index >= device_count()` and at least one device
///    exists (or a fake count is set): "device index 5 is out of range [0, 1)"
///    (<https://github.com/pytorch/pytorch/issues/136849>).
/// 2. [`CudaError::Unavailable`] when CUDA is not available at all.
pub fn check_device(index: usize) -> Result<(), CudaError> {
    let count = match crate::testing::faked_count() {
        Some(n) => n,
        None => driver()?,
    };
    if index < count {
        Ok(())
    } else {
        Err(CudaError::InvalidDevice { index, count })
    }
}

/// The thread's current device index (`torch.cuda.current_device()`); 0 until
/// [`set_device`] changes it.
///
/// # Errors
/// [`CudaError::Unavailable`] when CUDA is not available (PyTorch raises too).
pub fn current_device() -> Result<usize, CudaError> {
    if crate::testing::faked_count().is_none() {
        driver()?;
    }
    Ok(CURRENT.with(Cell::get))
}

/// Sets the thread's current device (`torch.cuda.set_device(i)`). Creates no context.
///
/// # Errors
/// [`CudaError::InvalidDevice`] / [`CudaError::Unavailable`] as [`check_device`].
pub fn set_device(index: usize) -> Result<(), CudaError> {
    check_device(index)?;
    CURRENT.with(|c| c.set(index));
    Ok(())
}

/// Sets the current device without checks; returns the previous one (stream guards).
pub(crate) fn replace_current(index: usize) -> usize {
    CURRENT.with(|c| c.replace(index))
}

/// Sets the current device and returns a guard restoring the previous one on drop
/// (`with torch.cuda.device(i):`).
///
/// # Errors
/// As [`set_device`].
pub fn device_scope(index: usize) -> Result<DeviceGuard, CudaError> {
    check_device(index)?;
    let previous = CURRENT.with(|c| c.replace(index));
    Ok(DeviceGuard { previous })
}

/// Restores the previous current device on drop; made by [`device_scope`].
#[derive(Debug)]
#[must_use = "the previous device is restored when the guard is dropped"]
pub struct DeviceGuard {
    previous: usize,
}

impl Drop for DeviceGuard {
    fn drop(&mut self) {
        CURRENT.with(|c| c.set(self.previous));
    }
}

/// What `torch.cuda.get_device_properties(i)` reports, the fields berth uses.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeviceProperties {
    /// The device's index.
    pub index: usize,
    /// The marketing name, e.g. `"NVIDIA H200"`.
    pub name: String,
    /// Total device memory, in bytes (`cuDeviceTotalMem`).
    pub total_memory: usize,
    /// Compute capability major version (9 for Hopper).
    pub major: u32,
    /// Compute capability minor version.
    pub minor: u32,
    /// Number of streaming multiprocessors.
    pub multi_processor_count: u32,
}

/// The device's name (`torch.cuda.get_device_name(i)`). Creates no context.
///
/// # Errors
/// [`CudaError::InvalidDevice`], [`CudaError::Unavailable`], or [`CudaError::Driver`].
pub fn get_device_name(index: usize) -> Result<String, CudaError> {
    Ok(get_device_properties(index)?.name)
}

/// The device's properties (`torch.cuda.get_device_properties(i)`). Creates no context.
///
/// # Errors
/// [`CudaError::InvalidDevice`], [`CudaError::Unavailable`], or [`CudaError::Driver`].
pub fn get_device_properties(index: usize) -> Result<DeviceProperties, CudaError> {
    driver()?;
    check_device(index)?;
    imp::properties(index)
}

/// Free and total device memory in bytes, device-wide (`torch.cuda.mem_get_info(i)`,
/// `cuMemGetInfo`). Needs the device's primary context: it creates it on `index` (the named
/// device) and on no other.
///
/// # Errors
/// [`CudaError::InvalidDevice`], [`CudaError::Unavailable`], or [`CudaError::Driver`].
pub fn mem_get_info(index: usize) -> Result<(usize, usize), CudaError> {
    driver()?;
    check_device(index)?;
    imp::mem_info(index)
}

mod imp {
    use super::{CudaError, DeviceProperties};
    use crate::ffi::{self, Attribute};

    pub(super) fn properties(index: usize) -> Result<DeviceProperties, CudaError> {
        let dev = ffi::device_get(index)?;
        let name = ffi::device_name(index, dev)?;
        let total = ffi::device_total_mem(index, dev)?;
        let attr = |a| ffi::device_attribute(index, dev, a).map(|v| u32::try_from(v).unwrap_or(0));
        Ok(DeviceProperties {
            index,
            name,
            total_memory: total,
            major: attr(Attribute::ComputeCapabilityMajor)?,
            minor: attr(Attribute::ComputeCapabilityMinor)?,
            multi_processor_count: attr(Attribute::MultiprocessorCount)?,
        })
    }

    pub(super) fn mem_info(index: usize) -> Result<(usize, usize), CudaError> {
        ffi::mem_get_info(index)
    }
}
