//! The C functions PyTorch's `CUDAPluggableAllocator` calls, and the few the Python package and
//! the tests call around them.
//!
//! PyTorch's side (<https://github.com/pytorch/pytorch/blob/main/torch/csrc/cuda/CUDAPluggableAllocator.cpp>):
//! `void* alloc(size_t size, int device, cudaStream_t stream)` and
//! `void free(void* ptr, size_t size, int device, cudaStream_t stream)` by name, then raw
//! pointers to `void record_stream(void* ptr, cudaStream_t stream)`, `void reset(void)`
//! (`empty_cache`), `void memory_fraction(double fraction, int device)` and
//! `void init(int device_count)`. PyTorch treats a NULL from `alloc` as success (the tensor
//! gets a null pointer), so the exported `berth_torch_alloc` (in `oom.cpp`) never returns NULL
//! for a non-zero size once Python registered its exception class: it throws PyTorch's
//! `python_error` carrying `torch.OutOfMemoryError` instead (`Note [Raising from the alloc
//! hook]` there). [`berth_torch_try_alloc`] is the Rust half: NULL plus a message for
//! [`berth_torch_last_error`].
//!
//! Hooks that return `void` cannot report a failure (a double free, a bad fraction): the
//! first such error is kept for [`berth_torch_take_deferred_error`] (Python:
//! `berth_torch.check_errors()`). Nothing here unwinds into C: a panic becomes an error.

use crate::install::{self, HookError};
use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Mutex;

thread_local! {
    /// The last error of a call on this thread, and whether it was out-of-memory.
    static LAST: RefCell<Option<(String, bool)>> = const { RefCell::new(None) };
}

/// The first error of a `void` hook, kept until taken.
static DEFERRED: Mutex<Option<String>> = Mutex::new(None);

fn set_last(e: &HookError) {
    LAST.with(|l| *l.borrow_mut() = Some((e.to_string(), e.is_out_of_memory())));
}

/// Keeps `msg` unless an earlier deferred error is still untaken.
fn defer(msg: String) {
    DEFERRED
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get_or_insert(msg);
}

/// Runs `f`, turning a panic into an error message instead of unwinding into C.
pub(crate) fn guarded<T>(f: impl FnOnce() -> Result<T, HookError>) -> Result<T, String> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => {
            set_last(&e);
            Err(e.to_string())
        }
        Err(_) => {
            let msg = "berth: internal error (a panic in the allocator hook)".to_owned();
            LAST.with(|l| *l.borrow_mut() = Some((msg.clone(), false)));
            Err(msg)
        }
    }
}

/// Copies `s` into `buf` (at most `len` bytes, NUL-terminated, cut on a UTF-8 boundary) and
/// returns `s`'s full length in bytes.
///
/// # Safety
/// `buf` is null or valid for writes of `len` bytes.
unsafe fn copy_out(s: &str, buf: *mut c_char, len: usize) -> usize {
    if !buf.is_null() && len > 0 {
        let mut n = s.len().min(len - 1);
        while !s.is_char_boundary(n) {
            n -= 1;
        }
        // SAFETY: `buf` is valid for `len > n` bytes (the caller's contract); `s` has `n`
        // readable bytes; the regions cannot overlap (`s` is Rust-owned).
        unsafe {
            std::ptr::copy_nonoverlapping(s.as_ptr(), buf.cast::<u8>(), n);
            *buf.add(n) = 0;
        }
    }
    s.len()
}

/// Reads a C string argument.
///
/// # Safety
/// `p` is null or a NUL-terminated string.
unsafe fn arg(p: *const c_char) -> Result<String, HookError> {
    if p.is_null() {
        return Ok(String::new());
    }
    // SAFETY: the caller's contract.
    Ok(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

/// Installs policy `policy` (`"pytorch"`, `"expandable"`, `"paged"`) with `options` (PyTorch's
/// `PYTORCH_CUDA_ALLOC_CONF` syntax; null or empty for none). Returns 0, or -1 with the reason
/// in [`berth_torch_last_error`].
///
/// # Safety
/// `policy` and `options` are null or NUL-terminated strings.
#[no_mangle]
pub unsafe extern "C" fn berth_torch_install(
    policy: *const c_char,
    options: *const c_char,
) -> c_int {
    // SAFETY: the caller's contract.
    let r = guarded(|| install::install(&unsafe { arg(policy) }?, &unsafe { arg(options) }?));
    if r.is_ok() {
        0
    } else {
        -1
    }
}

/// The Rust half of the `alloc` hook: `size` bytes on `device` ordered on `stream`; NULL for
/// zero bytes, and NULL with the reason in [`berth_torch_last_error`] (and
/// [`berth_torch_last_error_is_oom`] = 1 for out-of-memory) when the policy cannot serve it
/// after freeing its cached blocks and retrying.
#[no_mangle]
pub extern "C" fn berth_torch_try_alloc(
    size: usize,
    device: c_int,
    stream: *mut c_void,
) -> *mut c_void {
    match guarded(|| install::installed()?.alloc(size, device, stream as u64)) {
        Ok(p) => p as usize as *mut c_void,
        Err(_) => std::ptr::null_mut(),
    }
}

/// The `free` hook: gives `ptr` (from `alloc` on `device`) back. `size` and `stream` are what
/// PyTorch recorded at `alloc`; berth's policies know both already.
#[no_mangle]
pub extern "C" fn berth_torch_free(
    ptr: *mut c_void,
    size: usize,
    device: c_int,
    stream: *mut c_void,
) {
    let _ = (size, stream);
    if let Err(e) = guarded(|| install::installed()?.free(ptr as u64, device)) {
        defer(e);
    }
}

/// The `record_stream` hook: `ptr` is used on `stream`, so its memory is reused only after the
/// work queued there when it is freed has run.
#[no_mangle]
pub extern "C" fn berth_torch_record_stream(ptr: *mut c_void, stream: *mut c_void) {
    if let Err(e) = guarded(|| install::installed()?.record_stream(ptr as u64, stream as u64)) {
        defer(e);
    }
}

/// The `reset` hook (`torch.cuda.empty_cache()`): returns every free cached segment (or page)
/// of every device to the driver.
#[no_mangle]
pub extern "C" fn berth_torch_reset() {
    if let Err(e) = guarded(|| match install::installed() {
        Ok(inst) => inst.empty_cache(),
        Err(_) => Ok(()),
    }) {
        defer(e);
    }
}

/// The `memory_fraction` hook (`torch.cuda.set_per_process_memory_fraction(fraction, device)`):
/// caps what `device`'s allocator reserves at `fraction` of the device's memory.
#[no_mangle]
pub extern "C" fn berth_torch_set_memory_fraction(fraction: f64, device: c_int) {
    if let Err(e) = guarded(|| install::installed()?.set_memory_fraction(fraction, device)) {
        defer(e);
    }
}

/// The `init` hook, called by PyTorch with the device count when CUDA starts. Allocators are
/// built lazily on each device's first allocation, so there is nothing to do.
#[no_mangle]
pub extern "C" fn berth_torch_init(device_count: c_int) {
    let _ = device_count;
}

/// Copies the last error of this thread into `buf` (NUL-terminated, at most `len` bytes) and
/// returns its full length; 0 when there was none.
///
/// # Safety
/// `buf` is null or valid for writes of `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn berth_torch_last_error(buf: *mut c_char, len: usize) -> usize {
    LAST.with(|l| match &*l.borrow() {
        // SAFETY: the caller's contract.
        Some((msg, _)) => unsafe { copy_out(msg, buf, len) },
        None => 0,
    })
}

/// 1 when the last error of this thread was out-of-memory, else 0.
#[no_mangle]
pub extern "C" fn berth_torch_last_error_is_oom() -> c_int {
    LAST.with(|l| c_int::from(l.borrow().as_ref().is_some_and(|(_, oom)| *oom)))
}

/// Takes the first error a `void` hook (`free`, `record_stream`, `reset`, `memory_fraction`)
/// could not report: copies it like [`berth_torch_last_error`] and clears it; 0 when none.
///
/// # Safety
/// `buf` is null or valid for writes of `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn berth_torch_take_deferred_error(buf: *mut c_char, len: usize) -> usize {
    match take_deferred_error() {
        // SAFETY: the caller's contract.
        Some(msg) => unsafe { copy_out(&msg, buf, len) },
        None => 0,
    }
}

/// Takes the first error a `void` hook could not report (the Rust side of
/// [`berth_torch_take_deferred_error`]).
pub fn take_deferred_error() -> Option<String> {
    DEFERRED.lock().unwrap_or_else(|p| p.into_inner()).take()
}

/// The value of statistic `key` of `device` (`torch.cuda.memory_stats()`'s names, e.g.
/// `"allocated_bytes.all.current"`), or -1 when there is no such key or nothing is installed
/// (0 for a device with no allocator yet, as PyTorch's statistics before first use).
///
/// # Safety
/// `key` is a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn berth_torch_stat(device: c_int, key: *const c_char) -> i64 {
    // SAFETY: the caller's contract.
    let Ok(key) = (unsafe { arg(key) }) else {
        return -1;
    };
    guarded(|| {
        let inst = install::installed()?;
        Ok(match inst.existing(device) {
            Some(a) => a.memory_stats().get(&key).copied().unwrap_or(-1),
            None => 0,
        })
    })
    .unwrap_or(-1)
}

/// Test switch: the next [`berth_torch_install`] uses simulated devices of `capacity_bytes`
/// each instead of CUDA (no GPU needed). Returns 0, or -1 after an install.
#[doc(hidden)]
#[no_mangle]
pub extern "C" fn berth_torch_simulate(capacity_bytes: u64) -> c_int {
    match guarded(|| install::simulate(capacity_bytes)) {
        Ok(()) => 0,
        Err(_) => -1,
    }
}

/// Test switch: completes the simulated events recorded so far on `stream` of `device`.
/// Returns 0, or -1 when `device` is not simulated or has no allocator yet.
#[doc(hidden)]
#[no_mangle]
pub extern "C" fn berth_torch_sim_complete_events(device: c_int, stream: *mut c_void) -> c_int {
    match install::installed() {
        Ok(inst) if inst.sim_complete_events(device, stream as u64) => 0,
        _ => -1,
    }
}
