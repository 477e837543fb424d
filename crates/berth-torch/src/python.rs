//! The extension module `berth_torch._native` (pyo3, stable ABI): what the Python package
//! `berth_torch` builds its API on. Errors become Python exceptions: `ValueError` for a bad
//! policy, options or argument, `RuntimeError` for the rest.

use crate::abi;
use crate::install::{self as inst_mod, HookError};
use berth_alloc::pickle::dump_snapshot;
use berth_alloc::MemorySnapshot;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::collections::BTreeMap;
use std::sync::OnceLock;

/// Keeps the registered out-of-memory exception class alive for the life of the process.
static OOM_CLASS: OnceLock<Py<PyAny>> = OnceLock::new();

fn to_py(e: HookError) -> PyErr {
    match e {
        HookError::Cuda { source, .. } => cuda_to_py(source),
        HookError::Policy(_) => PyValueError::new_err(e.to_string()),
        HookError::Alloc {
            source: berth_alloc::AllocError::InvalidFraction { .. },
            ..
        } => PyValueError::new_err(e.to_string()),
        _ => PyRuntimeError::new_err(e.to_string()),
    }
}

/// A driver-layer error as Python's: a bad device index or argument is a `ValueError`.
fn cuda_to_py(e: berth_cuda::CudaError) -> PyErr {
    match e {
        berth_cuda::CudaError::InvalidDevice { .. }
        | berth_cuda::CudaError::InvalidArgument { .. } => PyValueError::new_err(e.to_string()),
        _ => PyRuntimeError::new_err(e.to_string()),
    }
}

/// Installs `policy` with `options` (PyTorch's `PYTORCH_CUDA_ALLOC_CONF` syntax).
#[pyfunction]
#[pyo3(signature = (policy, options = ""))]
fn install(policy: &str, options: &str) -> PyResult<()> {
    inst_mod::install(policy, options)
        .map(|_| ())
        .map_err(to_py)
}

/// The installed policy's name, or None.
#[pyfunction]
fn installed_policy() -> Option<&'static str> {
    inst_mod::installed().ok().map(|i| i.policy().name())
}

/// Registers the class the alloc hook raises for out-of-memory (`torch.OutOfMemoryError`).
#[pyfunction]
fn set_oom_exception(cls: Bound<'_, PyAny>) -> PyResult<()> {
    let cls = OOM_CLASS.get_or_init(|| cls.unbind());
    // SAFETY: `cls` is a live class kept alive by `OOM_CLASS` for the process; the GIL is
    // held (this is a Python call).
    if unsafe { crate::set_python_exception(cls.as_ptr().cast()) } {
        Ok(())
    } else {
        Err(PyRuntimeError::new_err(
            "berth: the Python C API was not found in this process",
        ))
    }
}

/// The hook functions' addresses, by PyTorch's setter names (`set_record_stream_fn`, ...),
/// for `CUDAPluggableAllocator._allocator`.
#[pyfunction]
fn hook_addresses() -> BTreeMap<&'static str, usize> {
    BTreeMap::from([
        (
            "set_record_stream_fn",
            abi::berth_torch_record_stream as *const () as usize,
        ),
        ("set_reset_fn", abi::berth_torch_reset as *const () as usize),
        (
            "set_memory_fraction_fn",
            abi::berth_torch_set_memory_fraction as *const () as usize,
        ),
        ("set_init_fn", abi::berth_torch_init as *const () as usize),
    ])
}

fn installed() -> PyResult<&'static inst_mod::Installed> {
    inst_mod::installed().map_err(to_py)
}

/// `torch.cuda.memory_stats(device)`: empty before the device's first allocation.
#[pyfunction]
fn memory_stats(device: i32) -> PyResult<BTreeMap<String, i64>> {
    installed()?;
    berth_cuda::memory::memory_stats(device).map_err(cuda_to_py)
}

/// `torch.cuda.memory_summary(device, abbreviated)`.
#[pyfunction]
fn memory_summary(device: i32, abbreviated: bool) -> PyResult<String> {
    installed()?;
    berth_cuda::memory::memory_summary(device, abbreviated).map_err(cuda_to_py)
}

/// `reset_peak_memory_stats(device)`.
#[pyfunction]
fn reset_peak_memory_stats(device: i32) -> PyResult<()> {
    installed()?;
    berth_cuda::memory::reset_peak_memory_stats(device).map_err(cuda_to_py)
}

/// `reset_accumulated_memory_stats(device)`.
#[pyfunction]
fn reset_accumulated_memory_stats(device: i32) -> PyResult<()> {
    installed()?;
    berth_cuda::memory::reset_accumulated_memory_stats(device).map_err(cuda_to_py)
}

/// `torch.cuda.memory._record_memory_history`: starts (`max_entries`) or stops (None)
/// recording `device`'s allocation history; builds the device's allocator.
#[pyfunction]
#[pyo3(signature = (device, max_entries))]
fn record_memory_history(device: i32, max_entries: Option<usize>) -> PyResult<()> {
    let inst = installed()?;
    let _scope = inst.scope(device).map_err(to_py)?;
    berth_cuda::memory::record_memory_history(device, max_entries).map_err(cuda_to_py)
}

/// Every device's snapshot merged (`torch.cuda.memory._snapshot()`: all segments, one trace
/// list per device), as the bytes `_dump_snapshot` writes.
#[pyfunction]
fn snapshot_pickle(py: Python<'_>) -> PyResult<Py<PyBytes>> {
    installed()?;
    let mut all = MemorySnapshot::default();
    for (device, a) in berth_cuda::memory::built_allocators() {
        let s = a.snapshot();
        if all.segments.is_empty() && all.device_traces.is_empty() {
            all.allocator_settings = s.allocator_settings.clone();
        }
        all.segments.extend(s.segments);
        let d = device;
        if all.device_traces.len() <= d {
            all.device_traces.resize_with(d + 1, Vec::new);
        }
        all.device_traces[d] = s.device_traces.into_iter().flatten().collect();
    }
    if all.device_traces.is_empty() {
        all.device_traces.push(Vec::new());
    }
    all.segments.sort_by_key(|s| (s.device, s.address));
    Ok(PyBytes::new(py, &dump_snapshot(&all)).unbind())
}

/// `set_per_process_memory_fraction(fraction, device)`, raising for a bad fraction.
#[pyfunction]
fn set_memory_fraction(fraction: f64, device: i32) -> PyResult<()> {
    installed()?
        .set_memory_fraction(fraction, device)
        .map_err(to_py)
}

/// `torch.cuda.empty_cache()` for berth's devices.
#[pyfunction]
fn empty_cache() -> PyResult<()> {
    installed()?.empty_cache().map_err(to_py)
}

/// The first error a `void` hook could not report (a double free, ...), taken; or None.
#[pyfunction]
fn take_deferred_error() -> Option<String> {
    abi::take_deferred_error()
}

/// Every warning berth said in this process, as `(key, message)`, oldest first; from now on
/// warnings go only here (the package shows them with Python's `warnings.warn`), not to
/// standard error.
#[pyfunction]
fn warnings_said() -> Vec<(&'static str, String)> {
    berth_alloc::warnings::set_stderr(false);
    berth_alloc::warnings::said()
        .into_iter()
        .map(|w| (w.key, w.message))
        .collect()
}

thread_local! {
    /// This thread's `berth_torch.region(tag)` guards, innermost last.
    static REGIONS: std::cell::RefCell<Vec<berth_cuda::sleep::TagGuard>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// Enters `berth_torch.region(tag)`: this thread's allocations carry `tag` until the matching
/// `pop_tag`. `ValueError` for an empty tag.
#[pyfunction]
fn push_tag(tag: &str) -> PyResult<()> {
    let guard =
        berth_cuda::sleep::TagGuard::new(tag).map_err(|e| PyValueError::new_err(e.to_string()))?;
    REGIONS.with(|r| r.borrow_mut().push(guard));
    Ok(())
}

/// Leaves this thread's innermost region. `RuntimeError` when none is open.
#[pyfunction]
fn pop_tag() -> PyResult<()> {
    REGIONS
        .with(|r| r.borrow_mut().pop())
        .map(drop)
        .ok_or_else(|| PyRuntimeError::new_err("berth_torch: no region is open on this thread"))
}

/// The tag this thread's allocations carry now, or None.
#[pyfunction]
fn current_tag() -> Option<String> {
    berth_cuda::sleep::current_tag().map(|t| t.to_string())
}

/// Sleeps `tags` of `device`, offloading `offload`: `(released_bytes, offloaded_bytes,
/// synchronize_s, host_memory_s, copy_and_release_s)`.
#[pyfunction]
fn sleep(
    device: i32,
    tags: Vec<String>,
    offload: Vec<String>,
) -> PyResult<(u64, u64, f64, f64, f64)> {
    installed()?;
    let tags: Vec<&str> = tags.iter().map(String::as_str).collect();
    let offload: Vec<&str> = offload.iter().map(String::as_str).collect();
    berth_cuda::sleep::sleep(device, &tags, &offload)
        .map(|r| {
            (
                r.released_bytes,
                r.offloaded_bytes,
                r.synchronize_time.as_secs_f64(),
                r.host_memory_time.as_secs_f64(),
                r.copy_and_release_time.as_secs_f64(),
            )
        })
        .map_err(sleep_to_py)
}

/// Wakes `tags` of `device`: `(mapped_bytes, restored_bytes, map_and_copy_s,
/// free_host_memory_s)`.
#[pyfunction]
fn wake(device: i32, tags: Vec<String>) -> PyResult<(u64, u64, f64, f64)> {
    installed()?;
    let tags: Vec<&str> = tags.iter().map(String::as_str).collect();
    berth_cuda::sleep::wake(device, &tags)
        .map(|r| {
            (
                r.mapped_bytes,
                r.restored_bytes,
                r.map_and_copy_time.as_secs_f64(),
                r.free_host_memory_time.as_secs_f64(),
            )
        })
        .map_err(sleep_to_py)
}

/// Keeps the backups' pinned host memory between sleeps (`true`) or frees it at wake.
#[pyfunction]
fn keep_host_memory(keep: bool) {
    berth_cuda::sleep::keep_host_memory(keep);
}

/// Pinned host memory kept for the next sleep, in bytes.
#[pyfunction]
fn kept_host_bytes() -> u64 {
    berth_cuda::sleep::kept_host_bytes()
}

/// Frees the kept pinned host memory; the bytes freed.
#[pyfunction]
fn release_host_memory() -> PyResult<u64> {
    berth_cuda::sleep::release_host_memory().map_err(cuda_to_py)
}

/// `device`'s sleeping figures: `(sleeping_bytes, sleeping_allocated_bytes, offloaded_bytes,
/// sleeping_tags)`.
#[pyfunction]
fn sleep_stats(device: i32) -> PyResult<(u64, u64, u64, Vec<String>)> {
    installed()?;
    let s = berth_cuda::sleep::sleep_stats(device).map_err(cuda_to_py)?;
    Ok((
        s.sleeping_bytes,
        s.sleeping_allocated_bytes,
        s.offloaded_bytes,
        s.sleeping_tags,
    ))
}

/// A sleep or wake error as Python's: a bad tag name or list is a `ValueError`.
fn sleep_to_py(e: berth_cuda::CudaError) -> PyErr {
    use berth_alloc::AllocError as A;
    match &e {
        berth_cuda::CudaError::Alloc {
            source: A::InvalidTag { .. } | A::UnknownTag { .. } | A::OffloadNotSlept { .. },
            ..
        } => PyValueError::new_err(e.to_string()),
        _ => cuda_to_py(e),
    }
}

/// Test switch: simulated devices of `capacity_bytes` for the next install.
#[pyfunction]
fn simulate(capacity_bytes: u64) -> PyResult<()> {
    inst_mod::simulate(capacity_bytes).map_err(to_py)
}

#[pymodule]
#[pyo3(name = "_native")]
fn native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(install, m)?)?;
    m.add_function(wrap_pyfunction!(installed_policy, m)?)?;
    m.add_function(wrap_pyfunction!(set_oom_exception, m)?)?;
    m.add_function(wrap_pyfunction!(hook_addresses, m)?)?;
    m.add_function(wrap_pyfunction!(memory_stats, m)?)?;
    m.add_function(wrap_pyfunction!(memory_summary, m)?)?;
    m.add_function(wrap_pyfunction!(reset_peak_memory_stats, m)?)?;
    m.add_function(wrap_pyfunction!(reset_accumulated_memory_stats, m)?)?;
    m.add_function(wrap_pyfunction!(record_memory_history, m)?)?;
    m.add_function(wrap_pyfunction!(snapshot_pickle, m)?)?;
    m.add_function(wrap_pyfunction!(set_memory_fraction, m)?)?;
    m.add_function(wrap_pyfunction!(empty_cache, m)?)?;
    m.add_function(wrap_pyfunction!(take_deferred_error, m)?)?;
    m.add_function(wrap_pyfunction!(simulate, m)?)?;
    m.add_function(wrap_pyfunction!(warnings_said, m)?)?;
    m.add_function(wrap_pyfunction!(push_tag, m)?)?;
    m.add_function(wrap_pyfunction!(pop_tag, m)?)?;
    m.add_function(wrap_pyfunction!(current_tag, m)?)?;
    m.add_function(wrap_pyfunction!(sleep, m)?)?;
    m.add_function(wrap_pyfunction!(wake, m)?)?;
    m.add_function(wrap_pyfunction!(sleep_stats, m)?)?;
    m.add_function(wrap_pyfunction!(keep_host_memory, m)?)?;
    m.add_function(wrap_pyfunction!(kept_host_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(release_host_memory, m)?)?;
    m.add(
        "POLICY_NAMES",
        berth_alloc::Policy::ALL
            .map(berth_alloc::Policy::name)
            .to_vec(),
    )?;
    Ok(())
}
