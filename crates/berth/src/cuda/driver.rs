//! The gate in front of every driver call: is `libcuda` present, did `cuInit` succeed, how many
//! devices are there.
//!
//! cudarc's dynamic loader panics when the driver library is missing (`panic_no_lib_found`), so
//! nothing in berth may call into `cudarc::driver` before [`driver`] returned `Ok` (house style
//! 1.4). The answer is computed once per process and cached.

use super::CudaError;
use std::sync::OnceLock;

/// What the probe found: the number of devices, or why CUDA cannot be used.
static PROBE: OnceLock<Result<usize, String>> = OnceLock::new();

/// Checks that the driver is loaded and initialised; returns the number of visible devices
/// (at least 1).
///
/// # Errors
/// [`CudaError::Unavailable`] with the reason: built without `cuda`, `libcuda` not found,
/// `cuInit` failed, or no device.
pub(crate) fn driver() -> Result<usize, CudaError> {
    PROBE
        .get_or_init(probe)
        .clone()
        .map_err(CudaError::unavailable)
}

#[cfg(not(feature = "cuda"))]
fn probe() -> Result<usize, String> {
    Err("berth was built without the `cuda` feature".into())
}

#[cfg(feature = "cuda")]
fn probe() -> Result<usize, String> {
    use cudarc::driver::{result, sys};
    if std::env::var_os("BERTH_DISABLE_CUDA").is_some_and(|v| !v.is_empty() && v != "0") {
        return Err("disabled by the BERTH_DISABLE_CUDA environment variable".into());
    }
    // SAFETY: `is_culib_present` only tries `dlopen` on the candidate names; it calls no
    // driver function.
    if !unsafe { sys::is_culib_present() } {
        return Err("the NVIDIA driver library (libcuda.so) was not found".into());
    }
    // A driver too old for one of the symbols cudarc resolves makes the loader panic: turn that
    // into a reason instead of aborting the caller.
    let outcome = std::panic::catch_unwind(|| -> Result<usize, String> {
        result::init().map_err(|e| format!("cuInit failed: {:?}", e.0))?;
        let count = result::device::get_count()
            .map_err(|e| format!("cuDeviceGetCount failed: {:?}", e.0))?;
        Ok(usize::try_from(count).unwrap_or(0))
    });
    match outcome {
        Ok(Ok(0)) => Err("the NVIDIA driver reports no CUDA device".into()),
        Ok(other) => other,
        Err(_) => Err("the NVIDIA driver library lacks a required entry point".into()),
    }
}

/// Maps a driver result into [`CudaError`] through [`CudaError::from_driver`].
#[cfg(feature = "cuda")]
pub(crate) fn check<T>(
    op: &'static str,
    device: usize,
    r: Result<T, cudarc::driver::DriverError>,
) -> Result<T, CudaError> {
    r.map_err(|e| CudaError::from_driver(op, e, device, 0))
}
