//! Modules and kernel launches: `cuModuleLoadData`, `cuModuleGetFunction`, `cuModuleUnload`,
//! `cuLaunchKernel`, for berth's NVRTC kernels.
//!
//! Unlike the other driver wrappers these do not bind a context: the caller has made the
//! device's primary context current (precondition 1 of each), as the kernel layer does once
//! per launch. Failures become [`KernelError::Driver`] with the entry point and the device.

use crate::KernelError;
use cudarc::driver::{result, sys};
use std::ffi::{c_char, c_void, CStr};

/// A loaded module (`CUmodule`).
pub(crate) type Module = sys::CUmodule;

/// A kernel handle (`CUfunction`).
pub(crate) type Function = sys::CUfunction;

/// A stream handle as the driver takes it (`CUstream`; null is the legacy default stream).
pub(crate) type RawStream = sys::CUstream;

/// `cuModuleLoadData`: loads the PTX image `ptx` into the current context.
///
/// See [`cuModuleLoadData`](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MODULE.html#group__CUDA__MODULE_1g04ce266ce03720f479eab76136b90c0b).
///
/// # Errors
/// [`KernelError::Driver`] with the driver's code.
///
/// # Safety
/// 1. `device`'s primary context is current on this thread.
/// 2. `ptx` is a NUL-terminated PTX image (as NVRTC's `get_ptx` returns it).
pub(crate) unsafe fn load_data(device: usize, ptx: &[c_char]) -> Result<Module, KernelError> {
    // SAFETY: preconditions 1 and 2; `ptx` lives across the call.
    unsafe { result::module::load_data(ptx.as_ptr().cast::<c_void>()) }
        .map_err(|e| KernelError::driver("cuModuleLoadData", device, e))
}

/// `cuModuleUnload`.
///
/// See [`cuModuleUnload`](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MODULE.html#group__CUDA__MODULE_1g8ea3d716524369de3763104ced4ea57b).
///
/// # Errors
/// [`KernelError::Driver`] with the driver's code.
///
/// # Safety
/// 1. `device`'s primary context is current on this thread.
/// 2. `module` was loaded by [`load_data`] on `device`, is not unloaded yet, and neither it
///    nor a function looked up in it is used afterwards.
pub(crate) unsafe fn unload(device: usize, module: Module) -> Result<(), KernelError> {
    // SAFETY: preconditions 1 and 2.
    unsafe { result::module::unload(module) }
        .map_err(|e| KernelError::driver("cuModuleUnload", device, e))
}

/// `cuModuleGetFunction`: the kernel `name` of `module`.
///
/// See [`cuModuleGetFunction`](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MODULE.html#group__CUDA__MODULE_1ga52be009b0d4045811b30c965e1cb2cf).
///
/// # Errors
/// [`KernelError::Driver`] with the driver's code (`CUDA_ERROR_NOT_FOUND` when the module has
/// no such kernel).
///
/// # Safety
/// 1. `device`'s primary context is current on this thread.
/// 2. `module` was loaded by [`load_data`] on `device` and is not unloaded.
pub(crate) unsafe fn get_function(
    device: usize,
    module: Module,
    name: &CStr,
) -> Result<Function, KernelError> {
    // SAFETY: preconditions 1 and 2.
    unsafe { result::module::get_function(module, name.to_owned()) }
        .map_err(|e| KernelError::driver("cuModuleGetFunction", device, e))
}

/// `cuLaunchKernel` with a 1-D grid of `grid` blocks of `block` threads and `shared_bytes`
/// of dynamic shared memory, on `stream`.
///
/// See [`cuLaunchKernel`](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__EXEC.html#group__CUDA__EXEC_1gb8f3dc3031b40da29d5f9a7139e52e15).
///
/// # Errors
/// [`KernelError::Driver`] with the driver's code.
///
/// # Safety
/// 1. `f`'s context (that of `device`) is current on this thread and `stream` belongs to it
///    (or is null).
/// 2. `f` belongs to a module that is loaded until the kernel has finished.
/// 3. `params` point to values whose types and order match the kernel's parameters exactly,
///    and every device pointer among them is valid for the accesses the kernel makes until the
///    kernel has finished on `stream`.
pub(crate) unsafe fn launch_kernel(
    device: usize,
    f: Function,
    grid: u32,
    block: u32,
    shared_bytes: u32,
    stream: RawStream,
    params: &mut [*mut c_void],
) -> Result<(), KernelError> {
    // SAFETY: preconditions 1 to 3.
    unsafe { result::launch_kernel(f, (grid, 1, 1), (block, 1, 1), shared_bytes, stream, params) }
        .map_err(|e| KernelError::driver("cuLaunchKernel", device, e))
}
