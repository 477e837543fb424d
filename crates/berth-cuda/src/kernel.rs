//! Run-time compiled kernels: NVRTC compilation, the per-device module cache, and launches.
//!
//! berth writes its kernels in CUDA C (`berth::cuda::kernels`); this module turns a source
//! into a launchable [`Function`] and launches it, with the NVRTC and driver calls made in
//! `ffi/nvrtc.rs` and `ffi/module.rs`. Only with the `cuda` feature.
//!
//! Each (device, module key) is compiled once per process with NVRTC for the device's compute
//! capability, loaded with `cuModuleLoadData` and kept for the life of the process; kernel
//! handles (`CUfunction`) are looked up once and cached beside it. There is one cache per
//! device, in a [`PerDevice`] registry as the contexts and allocators are; it also holds the
//! device's `--gpu-architecture` option (its compute capability, read once). A cache's lock is
//! never held while NVRTC runs (compilation takes 100s of ms), so two threads may compile the
//! same module at once; the first to finish wins and the other's module is unloaded.
//!
//! A missing `libnvrtc` is [`KernelError::Unavailable`], never a panic.

use crate::ffi;
use crate::registry::PerDevice;
use crate::{CudaError, KernelError};
use std::collections::HashMap;
use std::ffi::{c_char, c_void, CString};
use std::sync::{Arc, Mutex};

/// A CUDA stream handle as the driver knows it (`CUstream`; null = the legacy default stream).
pub type RawStream = ffi::RawStream;

/// A loaded module and the kernel handles looked up in it so far.
struct LoadedModule {
    module: ffi::Module,
    functions: Mutex<HashMap<String, Function>>,
}

// SAFETY: a `CUmodule` is a process-wide handle that the driver allows to be used from any
// thread (with its context current); berth never unloads a cached module.
unsafe impl Send for LoadedModule {}
// SAFETY: as for `Send`; the mutable part is behind a `Mutex`.
unsafe impl Sync for LoadedModule {}

/// A kernel handle (`CUfunction`) of a cached module, valid for the life of the process.
#[derive(Clone, Copy, Debug)]
pub struct Function(ffi::Function);

// SAFETY: a `CUfunction` of a never-unloaded module may be launched from any thread.
unsafe impl Send for Function {}
// SAFETY: as for `Send`; the handle is immutable.
unsafe impl Sync for Function {}

/// One device's compiled modules, by key, and the NVRTC architecture option they are built for.
struct DeviceModules {
    /// `--gpu-architecture=compute_XY` for the device's compute capability.
    arch: String,
    loaded: Mutex<HashMap<String, Arc<LoadedModule>>>,
}

impl DeviceModules {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<LoadedModule>>> {
        self.loaded
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Each device's module cache, created on the first kernel lookup on that device.
static MODULES: PerDevice<DeviceModules> = PerDevice::new();

fn modules(device: usize) -> Result<&'static DeviceModules, CudaError> {
    MODULES.get_or_try_init(device, |d| {
        let props = crate::get_device_properties(d)?;
        Ok(DeviceModules {
            arch: format!("--gpu-architecture=compute_{}{}", props.major, props.minor),
            loaded: Mutex::new(HashMap::new()),
        })
    })
}

/// Compiles `source` to PTX (NUL-terminated) with NVRTC for `arch`; `key` names the module
/// in errors and diagnostics.
fn compile_ptx(key: &str, source: &str, arch: &str) -> Result<Vec<c_char>, KernelError> {
    if !ffi::nvrtc_present() {
        return Err(KernelError::Unavailable {
            reason: "the NVRTC library (libnvrtc.so) was not found; add the CUDA toolkit's lib64 \
                     directory to LD_LIBRARY_PATH"
                .into(),
        });
    }
    let src = CString::new(source).map_err(|_| KernelError::invalid("compile", "NUL in source"))?;
    let name = CString::new(format!("{key}.cu"))
        .map_err(|_| KernelError::invalid("compile", "NUL in key"))?;
    let prog = ffi::create_program(key, &src, &name)?;
    let options = [
        arch.to_owned(),
        "--std=c++17".to_owned(),
        "-default-device".to_owned(),
    ];
    // SAFETY: `prog` was just created and is destroyed exactly once below.
    let compiled = unsafe { ffi::compile_program(key, prog, &options) };
    let result = match compiled {
        // SAFETY: `prog` is live and compiled.
        Ok(()) => unsafe { ffi::get_ptx(key, prog) },
        Err(KernelError::Compile { module, error, .. }) => {
            // SAFETY: `prog` is live.
            let log = unsafe { ffi::get_program_log(key, prog) }.unwrap_or_default();
            Err(KernelError::Compile { module, error, log })
        }
        Err(e) => Err(e),
    };
    // SAFETY: `prog` is live and not used after this call.
    let _ = unsafe { ffi::destroy_program(key, prog) };
    result
}

/// The kernel `name` of module `key` on `device`, compiling and loading the module on first use.
///
/// `source` is called only when the module is not cached yet; the module is compiled for the
/// device's compute capability with `--std=c++17 -default-device`.
///
/// # Errors
/// [`KernelError::Unavailable`] without NVRTC, [`KernelError::Compile`] on a source error,
/// [`KernelError::Driver`] when loading fails or the kernel does not exist;
/// [`get_device_properties`](crate::get_device_properties)'s errors on the first lookup on
/// `device`.
///
/// # Safety
/// 1. The primary context of `device` is current on this thread
///    ([`bind_context`](crate::bind_context)).
pub unsafe fn function(
    device: usize,
    key: &str,
    name: &str,
    source: impl FnOnce() -> String,
) -> Result<Function, CudaError> {
    let modules = modules(device)?;
    let cached = modules.lock().get(key).cloned();
    let module = match cached {
        Some(m) => m,
        None => {
            let ptx = compile_ptx(key, &source(), &modules.arch)?;
            // SAFETY: `ptx` is NUL-terminated PTX from NVRTC; precondition 1 gives the context.
            let raw = unsafe { ffi::load_data(device, &ptx) }?;
            let loaded = Arc::new(LoadedModule {
                module: raw,
                functions: Mutex::new(HashMap::new()),
            });
            let winner = modules
                .lock()
                .entry(key.to_owned())
                .or_insert_with(|| loaded.clone())
                .clone();
            if !Arc::ptr_eq(&winner, &loaded) {
                // SAFETY: `raw` was loaded above on this context and nobody else has seen it.
                let _ = unsafe { ffi::unload(device, raw) };
            }
            winner
        }
    };
    let mut functions = module
        .functions
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(f) = functions.get(name) {
        return Ok(*f);
    }
    let cname =
        CString::new(name).map_err(|_| KernelError::invalid("launch", "NUL in kernel name"))?;
    // SAFETY: the module is loaded (on `device`, whose context is current) and never unloaded.
    let f = unsafe { ffi::get_function(device, module.module, &cname) }?;
    functions.insert(name.to_owned(), Function(f));
    Ok(Function(f))
}

/// Launches `f` on `stream` with a 1-D grid of `grid` blocks (at least 1) of `block` threads
/// and `shared_bytes` of dynamic shared memory.
///
/// # Errors
/// [`KernelError::Driver`] when `cuLaunchKernel` fails.
///
/// # Safety
/// 1. `f`'s context (that of `device`) is current on this thread and `stream` belongs to it
///    (or is null).
/// 2. `params` point to values whose types and order match the kernel's parameters exactly,
///    and every device pointer among them is valid for the accesses the kernel makes until the
///    kernel has finished on `stream`.
pub unsafe fn launch(
    device: usize,
    f: Function,
    grid: u32,
    block: u32,
    shared_bytes: u32,
    stream: RawStream,
    params: &mut [*mut c_void],
) -> Result<(), KernelError> {
    // SAFETY: preconditions 1 and 2; `f` comes from a cached module, never unloaded.
    unsafe {
        ffi::launch_kernel(
            device,
            f.0,
            grid.max(1),
            block,
            shared_bytes,
            stream,
            params,
        )
    }
}
