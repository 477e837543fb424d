//! The gate in front of every driver call: is `libcuda` present, is it new enough, does it
//! export every entry point berth calls, did `cuInit` succeed, how many devices are there.
//!
//! cudarc's dynamic loader panics when the driver library is missing (`panic_no_lib_found`) and
//! when a symbol is missing at its first call ("Missing symbol"), so nothing in berth may call
//! into `cudarc::driver` before [`driver`] returned `Ok` (no panics: a missing driver is
//! [`CudaError::Unavailable`]). The gate reads
//! `cuDriverGetVersion` before `cuInit` (refusing drivers below [`MIN_DRIVER_VERSION`] with
//! [`CudaError::DriverTooOld`]) and looks up [`REQUIRED_DRIVER_SYMBOLS`] without calling them.
//! The answer is computed once per process and cached.

use crate::{ffi, CudaError};
use std::sync::OnceLock;

/// The lowest `cuDriverGetVersion` berth runs on: 12080, CUDA 12.8 (driver R570, Linux
/// 570.26+). berth builds cudarc's cuda-13000 bindings, whose `result::event::elapsed` calls
/// `cuEventElapsedTime_v2`, first exported by CUDA 12.8 drivers; every other entry point berth
/// calls is older.
pub(crate) const MIN_DRIVER_VERSION: i32 = 12080;

/// Every driver entry point berth calls (through cudarc's `result` and `sys`, in `ffi/` and
/// `berth::cuda::kernels`), by its exported, versioned name. The gate checks each is exported
/// before `cuInit`, so that a driver lacking one is reported, not a panic at its first call.
pub(crate) const REQUIRED_DRIVER_SYMBOLS: &[&str] = &[
    // Initialisation, errors, devices, primary contexts.
    "cuInit",
    "cuDriverGetVersion",
    "cuGetErrorName",
    "cuGetErrorString",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetName",
    "cuDeviceTotalMem_v2",
    "cuDeviceGetAttribute",
    "cuDevicePrimaryCtxRetain",
    "cuCtxSetCurrent",
    "cuCtxSynchronize",
    "cuCtxGetStreamPriorityRange",
    "cuMemGetInfo_v2",
    // Peer access between devices (`peer.rs`).
    "cuDeviceCanAccessPeer",
    "cuCtxEnablePeerAccess",
    "cuCtxDisablePeerAccess",
    // Streams and events.
    "cuStreamCreateWithPriority",
    "cuStreamSynchronize",
    "cuStreamQuery",
    "cuStreamWaitEvent",
    "cuLaunchHostFunc",
    "cuEventCreate",
    "cuEventRecord",
    "cuEventQuery",
    "cuEventSynchronize",
    "cuEventElapsedTime_v2",
    "cuEventDestroy_v2",
    // Device and pinned host memory, copies.
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemHostAlloc",
    "cuMemFreeHost",
    "cuMemHostRegister_v2",
    "cuMemHostUnregister",
    "cuMemcpyHtoDAsync_v2",
    "cuMemcpyDtoHAsync_v2",
    "cuMemcpyDtoDAsync_v2",
    "cuMemcpyPeerAsync",
    "cuPointerGetAttribute",
    // Virtual memory management (the expandable-segments backend).
    "cuMemAddressReserve",
    "cuMemAddressFree",
    "cuMemCreate",
    "cuMemRelease",
    "cuMemMap",
    "cuMemUnmap",
    "cuMemSetAccess",
    "cuMemGetAllocationGranularity",
    // Sharing mapped memory with another process (`ipc.rs`).
    "cuMemExportToShareableHandle",
    "cuMemImportFromShareableHandle",
    // Kernels (`berth::cuda::kernels`).
    "cuModuleLoadData",
    "cuModuleGetFunction",
    "cuModuleUnload",
    "cuLaunchKernel",
];

/// What the probe found: the number of devices, or why CUDA cannot be used.
static PROBE: OnceLock<Result<usize, CudaError>> = OnceLock::new();

/// Checks that the driver is loaded, new enough and initialised; returns the number of visible
/// devices (at least 1).
///
/// # Errors
/// [`CudaError::DriverTooOld`] when `cuDriverGetVersion` is below [`MIN_DRIVER_VERSION`];
/// otherwise [`CudaError::Unavailable`] with the reason: built without `cuda`, `libcuda` not
/// found, a required entry point missing, `cuInit` failed, or no device.
pub(crate) fn driver() -> Result<usize, CudaError> {
    PROBE.get_or_init(probe).clone()
}

/// Whether a driver reporting `found` from `cuDriverGetVersion` is new enough for berth.
///
/// # Errors
/// [`CudaError::DriverTooOld`] when `found` is below [`MIN_DRIVER_VERSION`].
pub(crate) fn check_driver_version(found: i32) -> Result<(), CudaError> {
    if found < MIN_DRIVER_VERSION {
        return Err(CudaError::DriverTooOld {
            found,
            required: MIN_DRIVER_VERSION,
        });
    }
    Ok(())
}

/// The reason for entry points missing from the driver library (`missing` is not empty).
fn missing_reason(missing: &[&str]) -> String {
    format!(
        "the NVIDIA driver library lacks entry points berth calls: {}; update the NVIDIA driver \
         (berth needs one for CUDA 12.8 or newer, R570+)",
        missing.join(", ")
    )
}

fn probe() -> Result<usize, CudaError> {
    if !cfg!(feature = "cuda") {
        return Err(CudaError::unavailable(
            "berth was built without the `cuda` feature",
        ));
    }
    if std::env::var_os("BERTH_DISABLE_CUDA").is_some_and(|v| !v.is_empty() && v != "0") {
        return Err(CudaError::unavailable(
            "disabled by the BERTH_DISABLE_CUDA environment variable",
        ));
    }
    if !ffi::driver_library_present() {
        return Err(CudaError::unavailable(
            "the NVIDIA driver library (libcuda.so) was not found",
        ));
    }
    // The version and symbol checks keep cudarc's loader from panicking on an old driver; the
    // `catch_unwind` stays as the backstop for anything they miss.
    let outcome = std::panic::catch_unwind(|| -> Result<usize, CudaError> {
        let version = ffi::driver_get_version()
            .map_err(|e| CudaError::unavailable(failed("cuDriverGetVersion", e)))?;
        check_driver_version(version)?;
        let missing = ffi::missing_driver_symbols(REQUIRED_DRIVER_SYMBOLS);
        if !missing.is_empty() {
            return Err(CudaError::unavailable(missing_reason(&missing)));
        }
        ffi::init().map_err(|e| CudaError::unavailable(failed("cuInit", e)))?;
        let count = ffi::device_get_count()
            .map_err(|e| CudaError::unavailable(failed("cuDeviceGetCount", e)))?;
        Ok(usize::try_from(count).unwrap_or(0))
    });
    match outcome {
        Ok(Ok(0)) => Err(CudaError::unavailable(
            "the NVIDIA driver reports no CUDA device",
        )),
        Ok(other) => other,
        Err(_) => Err(CudaError::unavailable(
            "the NVIDIA driver library lacks a required entry point",
        )),
    }
}

/// `"cuInit failed: CUDA_ERROR_NO_DEVICE"`: the probe's reason for a failed call.
fn failed(op: &str, e: CudaError) -> String {
    match e {
        CudaError::Driver { name, .. } => format!("{op} failed: {name}"),
        other => format!("{op} failed: {other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drivers_below_cuda_12_8_are_refused() {
        for (found, ok) in [(11080, false), (12040, false), (12080, true), (13000, true)] {
            let r = check_driver_version(found);
            assert_eq!(r.is_ok(), ok, "cuDriverGetVersion {found}");
            if !ok {
                assert_eq!(
                    r,
                    Err(CudaError::DriverTooOld {
                        found,
                        required: 12080
                    })
                );
            }
        }
    }

    #[test]
    fn too_old_message_names_both_versions_and_the_fix() {
        let e = check_driver_version(12040).unwrap_err();
        assert_eq!(
            e.to_string(),
            "the NVIDIA driver supports CUDA 12.4 (cuDriverGetVersion 12040); berth needs a \
             driver for CUDA 12.8 or newer (R570+, Linux 570.26+): update the NVIDIA driver"
        );
        let e = check_driver_version(11080).unwrap_err();
        assert!(e.to_string().starts_with(
            "the NVIDIA driver supports CUDA 11.8 (cuDriverGetVersion 11080); berth needs"
        ));
    }

    #[test]
    fn the_symbol_floor_is_in_the_list() {
        for name in [
            "cuEventElapsedTime_v2",
            "cuMemCreate",
            "cuMemMap",
            "cuMemSetAccess",
        ] {
            assert!(REQUIRED_DRIVER_SYMBOLS.contains(&name), "{name}");
        }
        assert_eq!(
            missing_reason(&["cuEventElapsedTime_v2"]),
            "the NVIDIA driver library lacks entry points berth calls: cuEventElapsedTime_v2; \
             update the NVIDIA driver (berth needs one for CUDA 12.8 or newer, R570+)"
        );
    }

    /// Where a driver is installed, it exports every listed symbol and passes the version floor
    /// (on the GPU machine: driver 580, CUDA 13.0). Ignored by default, like the GPU tests;
    /// with `--include-ignored` it skips where no driver is, and fails there when
    /// `BERTH_REQUIRE_GPU=1`.
    #[cfg(feature = "cuda")]
    #[test]
    #[ignore = "needs the NVIDIA driver library: run with --include-ignored (BERTH_REQUIRE_GPU=1 fails without one)"]
    fn an_installed_driver_exports_every_required_symbol() {
        if !ffi::driver_library_present() {
            // `testing::gpu_required`'s rule, read here so the driver's file imports nothing
            // above it (the test hooks read the driver).
            assert!(
                std::env::var("BERTH_REQUIRE_GPU").map_or(true, |v| v != "1"),
                "BERTH_REQUIRE_GPU=1 but no NVIDIA driver library"
            );
            println!("skipping an_installed_driver_exports_every_required_symbol: no NVIDIA driver library");
            return;
        }
        assert_eq!(
            ffi::missing_driver_symbols(&["cuInit", "cuBerthNoSuchEntryPoint"]),
            ["cuBerthNoSuchEntryPoint"]
        );
        let version = ffi::driver_get_version().expect("cuDriverGetVersion");
        println!("cuDriverGetVersion {version}");
        if check_driver_version(version).is_ok() {
            assert_eq!(
                ffi::missing_driver_symbols(REQUIRED_DRIVER_SYMBOLS),
                Vec::<&str>::new()
            );
        }
    }
}
