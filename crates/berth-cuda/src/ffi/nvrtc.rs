//! NVRTC: run-time compilation of CUDA C to PTX, for berth's kernels.
//!
//! Every NVRTC call berth makes, each in one thin wrapper over cudarc's `nvrtc::result`.
//! Failures become [`KernelError::Compile`] for the module being compiled (its key names it);
//! [`compile_program`]'s error carries no log yet: the caller fetches it with
//! [`get_program_log`]. Nothing here may be called before [`nvrtc_present`] said yes: cudarc's
//! loader panics when `libnvrtc` is missing.
//!
//! See the [NVRTC docs](https://docs.nvidia.com/cuda/nvrtc/index.html#group__compilation).

use crate::KernelError;
use cudarc::nvrtc::{result, sys};
use std::ffi::{c_char, CStr};
use std::sync::OnceLock;

/// An NVRTC program handle (`nvrtcProgram`).
pub(crate) type Program = sys::nvrtcProgram;

/// A compile failure of module `module` with NVRTC's status `e` and no log.
fn failed(module: &str, e: result::NvrtcError) -> KernelError {
    KernelError::Compile {
        module: module.to_owned(),
        error: format!("{e:?}"),
        log: String::new(),
    }
}

/// Whether the NVRTC library (`libnvrtc.so`) can be loaded; asked once per process. Calls no
/// NVRTC function.
pub(crate) fn nvrtc_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: `is_culib_present` only tries `dlopen` on candidate names; it calls no NVRTC
    // function.
    *PRESENT.get_or_init(|| unsafe { sys::is_culib_present() })
}

/// `nvrtcCreateProgram` with no headers: a program for `src`, named `name` in diagnostics.
///
/// See [`nvrtcCreateProgram`](https://docs.nvidia.com/cuda/nvrtc/index.html#_CPPv418nvrtcCreateProgramP12nvrtcProgramPKcPKciPPCKcPPCKc).
///
/// # Errors
/// [`KernelError::Compile`] for `module` with NVRTC's status.
///
/// # Panics
/// cudarc's loader panics when `libnvrtc` is missing: call it after [`nvrtc_present`].
pub(crate) fn create_program(
    module: &str,
    src: &CStr,
    name: &CStr,
) -> Result<Program, KernelError> {
    result::create_program(src, Some(name)).map_err(|e| failed(module, e))
}

/// `nvrtcCompileProgram` with `options`.
///
/// See [`nvrtcCompileProgram`](https://docs.nvidia.com/cuda/nvrtc/index.html#_CPPv419nvrtcCompileProgram12nvrtcProgramiPPCKc).
///
/// # Errors
/// [`KernelError::Compile`] for `module` with NVRTC's status and an empty log.
///
/// # Safety
/// 1. `prog` was created by [`create_program`] and not destroyed.
pub(crate) unsafe fn compile_program(
    module: &str,
    prog: Program,
    options: &[String],
) -> Result<(), KernelError> {
    // SAFETY: precondition 1.
    unsafe { result::compile_program(prog, options) }.map_err(|e| failed(module, e))
}

/// `nvrtcGetPTX`: the compiled PTX, NUL-terminated.
///
/// See [`nvrtcGetPTX`](https://docs.nvidia.com/cuda/nvrtc/index.html#_CPPv411nvrtcGetPTX12nvrtcProgramPc).
///
/// # Errors
/// [`KernelError::Compile`] for `module` with NVRTC's status.
///
/// # Safety
/// 1. `prog` was created by [`create_program`], not destroyed, and compiled successfully.
pub(crate) unsafe fn get_ptx(module: &str, prog: Program) -> Result<Vec<c_char>, KernelError> {
    // SAFETY: precondition 1.
    unsafe { result::get_ptx(prog) }.map_err(|e| failed(module, e))
}

/// `nvrtcGetProgramLog`: the compiler's log, lossily decoded.
///
/// See [`nvrtcGetProgramLog`](https://docs.nvidia.com/cuda/nvrtc/index.html#_CPPv418nvrtcGetProgramLog12nvrtcProgramPc).
///
/// # Errors
/// [`KernelError::Compile`] for `module` with NVRTC's status.
///
/// # Safety
/// 1. `prog` was created by [`create_program`] and not destroyed.
pub(crate) unsafe fn get_program_log(module: &str, prog: Program) -> Result<String, KernelError> {
    // SAFETY: precondition 1.
    let raw = unsafe { result::get_program_log(prog) }.map_err(|e| failed(module, e))?;
    // SAFETY: NVRTC's log is NUL-terminated.
    Ok(unsafe { CStr::from_ptr(raw.as_ptr()) }
        .to_string_lossy()
        .into_owned())
}

/// `nvrtcDestroyProgram`.
///
/// See [`nvrtcDestroyProgram`](https://docs.nvidia.com/cuda/nvrtc/index.html#_CPPv419nvrtcDestroyProgramP12nvrtcProgram).
///
/// # Errors
/// [`KernelError::Compile`] for `module` with NVRTC's status.
///
/// # Safety
/// 1. `prog` was created by [`create_program`] and not destroyed; it is not used afterwards.
pub(crate) unsafe fn destroy_program(module: &str, prog: Program) -> Result<(), KernelError> {
    // SAFETY: precondition 1.
    unsafe { result::destroy_program(prog) }.map_err(|e| failed(module, e))
}
