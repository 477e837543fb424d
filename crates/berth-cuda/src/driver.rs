//! The gate in front of every driver call: is `libcuda` present, did `cuInit` succeed, how many
//! devices are there.
//!
//! cudarc's dynamic loader panics when the driver library is missing (`panic_no_lib_found`), so
//! nothing in berth may call into `cudarc::driver` before [`driver`] returned `Ok` (house style
//! 1.4). The answer is computed once per process and cached.

use crate::{ffi, CudaError};
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

fn probe() -> Result<usize, String> {
    if !cfg!(feature = "cuda") {
        return Err("berth was built without the `cuda` feature".into());
    }
    if std::env::var_os("BERTH_DISABLE_CUDA").is_some_and(|v| !v.is_empty() && v != "0") {
        return Err("disabled by the BERTH_DISABLE_CUDA environment variable".into());
    }
    if !ffi::driver_library_present() {
        return Err("the NVIDIA driver library (libcuda.so) was not found".into());
    }
    // A driver too old for one of the symbols cudarc resolves makes the loader panic: turn that
    // into a reason instead of aborting the caller.
    let outcome = std::panic::catch_unwind(|| -> Result<usize, String> {
        ffi::init().map_err(|e| failed("cuInit", e))?;
        let count = ffi::device_get_count().map_err(|e| failed("cuDeviceGetCount", e))?;
        Ok(usize::try_from(count).unwrap_or(0))
    });
    match outcome {
        Ok(Ok(0)) => Err("the NVIDIA driver reports no CUDA device".into()),
        Ok(other) => other,
        Err(_) => Err("the NVIDIA driver library lacks a required entry point".into()),
    }
}

/// `"cuInit failed: CUDA_ERROR_NO_DEVICE"`: the probe's reason for a failed call.
fn failed(op: &str, e: CudaError) -> String {
    match e {
        CudaError::Driver { name, .. } => format!("{op} failed: {name}"),
        other => format!("{op} failed: {other}"),
    }
}
