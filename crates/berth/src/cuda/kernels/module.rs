//! NVRTC compilation and the per-device module cache.
//!
//! Each (device, module key) is compiled once per process with NVRTC for the device's compute
//! capability, loaded with `cuModuleLoadData` and kept for the life of the process; kernel
//! handles (`CUfunction`) are looked up once and cached beside it. There is one cache per
//! device, in a [`PerDevice`] registry as the contexts and allocators are; it also holds the
//! device's `--gpu-architecture` option (its compute capability, read once). A cache's lock is
//! never held while NVRTC runs (compilation takes 100s of ms), so two threads may compile the
//! same module at once; the first to finish wins and the other's module is unloaded.

use super::KernelError;
use super::{bind, module_source};
use crate::cuda::registry::PerDevice;
use crate::cuda::CudaError;
use crate::DType;
use cudarc::driver::{result as drv, sys as dsys};
use cudarc::nvrtc::result as nvrtc;
use std::collections::HashMap;
use std::ffi::{c_void, CStr, CString};
use std::sync::{Arc, Mutex, OnceLock};

/// A loaded module and the kernel handles looked up in it so far.
struct LoadedModule {
    module: dsys::CUmodule,
    functions: Mutex<HashMap<String, Function>>,
}

// SAFETY: a `CUmodule` is a process-wide handle that the driver allows to be used from any
// thread (with its context current); berth never unloads a cached module.
unsafe impl Send for LoadedModule {}
// SAFETY: as for `Send`; the mutable part is behind a `Mutex`.
unsafe impl Sync for LoadedModule {}

/// A kernel handle (`CUfunction`), valid for the life of the process.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Function(dsys::CUfunction);

// SAFETY: a `CUfunction` of a never-unloaded module may be launched from any thread.
unsafe impl Send for Function {}
// SAFETY: as for `Send`; the handle is immutable.
unsafe impl Sync for Function {}

impl Function {
    /// The raw handle.
    pub(crate) fn raw(self) -> dsys::CUfunction {
        self.0
    }
}

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
        let props = crate::cuda::get_device_properties(d)?;
        Ok(DeviceModules {
            arch: format!("--gpu-architecture=compute_{}{}", props.major, props.minor),
            loaded: Mutex::new(HashMap::new()),
        })
    })
}

/// Checks that `libnvrtc` can be loaded (cudarc's loader panics otherwise).
fn nvrtc_present() -> Result<(), KernelError> {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: `is_culib_present` only tries `dlopen` on candidate names.
    let ok = *PRESENT.get_or_init(|| unsafe { cudarc::nvrtc::sys::is_culib_present() });
    if ok {
        Ok(())
    } else {
        Err(KernelError::Unavailable {
            reason: "the NVRTC library (libnvrtc.so) was not found; add the CUDA toolkit's lib64 \
                     directory to LD_LIBRARY_PATH"
                .into(),
        })
    }
}

/// Compiles `source` to PTX (NUL-terminated) with NVRTC.
fn compile(key: &str, source: &str, arch: &str) -> Result<Vec<std::ffi::c_char>, KernelError> {
    nvrtc_present()?;
    let src = CString::new(source).map_err(|_| KernelError::invalid("compile", "NUL in source"))?;
    let name = CString::new(format!("{key}.cu"))
        .map_err(|_| KernelError::invalid("compile", "NUL in key"))?;
    let fail = |error: String, log: String| KernelError::Compile {
        module: key.to_owned(),
        error,
        log,
    };
    let prog = nvrtc::create_program(&src, Some(&name))
        .map_err(|e| fail(format!("{e:?}"), String::new()))?;
    let options = [
        arch.to_owned(),
        "--std=c++17".to_owned(),
        "-default-device".to_owned(),
    ];
    // SAFETY: `prog` was just created and is destroyed exactly once below.
    let compiled = unsafe { nvrtc::compile_program(prog, &options) };
    let result = match compiled {
        Ok(()) => {
            // SAFETY: `prog` is live and compiled.
            unsafe { nvrtc::get_ptx(prog) }.map_err(|e| fail(format!("{e:?}"), String::new()))
        }
        Err(e) => {
            // SAFETY: `prog` is live.
            let log = unsafe { nvrtc::get_program_log(prog) }
                .map(|raw| {
                    // SAFETY: NVRTC's log is NUL-terminated.
                    unsafe { CStr::from_ptr(raw.as_ptr()) }
                        .to_string_lossy()
                        .into_owned()
                })
                .unwrap_or_default();
            Err(fail(format!("{e:?}"), log))
        }
    };
    // SAFETY: `prog` is live and not used after this call.
    let _ = unsafe { nvrtc::destroy_program(prog) };
    result
}

/// The kernel `name` of module `key` on `device`, compiling and loading the module on first use.
///
/// `source` is called only when the module is not cached yet.
///
/// # Errors
/// [`KernelError::Unavailable`] without NVRTC, [`KernelError::Compile`] on a source error,
/// [`KernelError::Driver`] when loading fails or the kernel does not exist;
/// [`get_device_properties`](crate::cuda::get_device_properties)'s errors on the first lookup
/// on `device`.
///
/// # Safety
/// 1. The primary context of `device` is current on this thread.
pub(crate) unsafe fn function(
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
            let ptx = compile(key, &source(), &modules.arch)?;
            // SAFETY: `ptx` is NUL-terminated PTX from NVRTC; precondition 1 gives the context.
            let raw = unsafe { drv::module::load_data(ptx.as_ptr().cast::<c_void>()) }
                .map_err(|e| KernelError::driver("cuModuleLoadData", device, e))?;
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
                // SAFETY: `raw` was loaded above and nobody else has seen it.
                let _ = unsafe { drv::module::unload(raw) };
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
    // SAFETY: the module is loaded and never unloaded.
    let f = unsafe { drv::module::get_function(module.module, cname) }
        .map_err(|e| KernelError::driver("cuModuleGetFunction", device, e))?;
    functions.insert(name.to_owned(), Function(f));
    Ok(Function(f))
}

/// Launches `f` on `stream` with a 1-D grid.
///
/// # Errors
/// [`KernelError::Driver`] when `cuLaunchKernel` fails.
///
/// # Safety
/// 1. `f`'s context is current on this thread and `stream` belongs to it (or is null).
/// 2. `params` point to values whose types and order match the kernel's parameters exactly,
///    and every device pointer among them is valid for the accesses the kernel makes until the
///    kernel has finished on `stream`.
pub(crate) unsafe fn launch(
    device: usize,
    f: Function,
    grid: u32,
    block: u32,
    shared_bytes: u32,
    stream: dsys::CUstream,
    params: &mut [*mut c_void],
) -> Result<(), KernelError> {
    // SAFETY: preconditions 1 and 2.
    unsafe {
        drv::launch_kernel(
            f.raw(),
            (grid.max(1), 1, 1),
            (block, 1, 1),
            shared_bytes,
            stream,
            params,
        )
    }
    .map_err(|e| KernelError::driver("cuLaunchKernel", device, e))
}

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
    stream: dsys::CUstream,
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
