//! Primary contexts: one per device, retained lazily on first use of THAT device, never on
//! another (PyTorch's `empty_cache()` / `pin_memory()` created a context on cuda:0 for work
//! that ran on cuda:1: <https://github.com/pytorch/pytorch/issues/25752>,
//! <https://github.com/pytorch/pytorch/issues/21081>).
//!
//! [`contexts_created`] counts retains so tests can assert that an operation created none.

use crate::device::check_device;
use crate::driver::driver;
use crate::registry::PerDevice;
use crate::{ffi, CudaError};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Number of primary contexts berth has created in this process (COUNT).
static CREATED: AtomicUsize = AtomicUsize::new(0);

/// How many primary contexts berth has created in this process, over all devices.
///
/// A test of "this operation creates no context" compares this before and after (`is_pinned`,
/// <https://github.com/pytorch/pytorch/issues/128988>; `empty_cache`,
/// <https://github.com/pytorch/pytorch/pull/4936> and
/// <https://github.com/pytorch/pytorch/issues/25752>).
pub fn contexts_created() -> usize {
    CREATED.load(Ordering::SeqCst)
}

/// Whether berth has created `device`'s primary context (`torch.cuda.is_initialized()`, per
/// device). Never creates one.
pub fn is_initialized(device: usize) -> bool {
    initialized(device)
}

/// The devices whose primary context berth has created, ascending. Never creates one; this is
/// what `empty_cache()` without a device acts on
/// (<https://github.com/pytorch/pytorch/issues/25752>).
pub fn initialized_devices() -> Vec<usize> {
    let count = driver().unwrap_or(0);
    (0..count).filter(|&d| initialized(d)).collect()
}

/// Makes `device`'s primary context current on the calling thread, creating it on first use.
///
/// Every berth function that issues driver work on a device calls this first; kernels written
/// outside this module (`cuda::ops`) call it too.
///
/// # Errors
/// [`CudaError::InvalidDevice`], [`CudaError::Unavailable`], or [`CudaError::Driver`] when
/// `cuDevicePrimaryCtxRetain` / `cuCtxSetCurrent` fails.
pub fn bind_context(device: usize) -> Result<(), CudaError> {
    bind(device).map(|_| ())
}

/// Blocks the host until all work queued on `device` has run (`torch.cuda.synchronize(i)`,
/// `cuCtxSynchronize`). An explicit sync: counted in [`host_waits`](super::host_waits), never
/// reported by sync-debug mode.
///
/// # Errors
/// As [`bind_context`], or [`CudaError::Driver`] when the device reports an earlier
/// asynchronous failure.
pub fn synchronize(device: usize) -> Result<(), CudaError> {
    bind(device)?;
    crate::sync_debug::count_host_wait();
    ffi::ctx_synchronize(device)
}

/// A retained primary context (a `CUcontext` handle). Raw driver handles are plain values
/// usable from any thread.
#[derive(Clone, Copy)]
struct Primary {
    ctx: u64,
}

static PRIMARY: PerDevice<Primary> = PerDevice::new();

thread_local! {
    /// The device whose context is current on this thread, as far as berth set it.
    static BOUND: Cell<Option<usize>> = const { Cell::new(None) };
}

fn initialized(device: usize) -> bool {
    PRIMARY.get(device).is_some()
}

fn primary(device: usize) -> Result<Primary, CudaError> {
    check_device(device)?;
    PRIMARY
        .get_or_try_init(device, |device| {
            let dev = ffi::device_get(device)?;
            // The retain is never released: the primary context lives as long as the
            // process, like PyTorch's.
            let ctx = ffi::primary_ctx_retain(device, dev)?;
            CREATED.fetch_add(1, Ordering::SeqCst);
            Ok(Primary { ctx })
        })
        .copied()
}

/// Makes `device`'s primary context current on this thread; returns it (as a `CUcontext`
/// handle).
pub(crate) fn bind(device: usize) -> Result<u64, CudaError> {
    let p = primary(device)?;
    if BOUND.with(Cell::get) != Some(device) {
        // SAFETY: `p.ctx` is a retained primary context that is never released.
        unsafe { ffi::ctx_set_current(device, p.ctx)? };
        BOUND.with(|b| b.set(Some(device)));
    }
    Ok(p.ctx)
}

/// A scope in which `device`'s primary context is current on this thread, entered from code
/// that shares the thread with another CUDA user (PyTorch calling berth's allocator hooks):
/// on drop the thread's previous context is current again.
///
/// # Note [Foreign contexts]
/// berth caches, per thread, which device's context it made current, and skips
/// `cuCtxSetCurrent` when it is already that device's. Inside another runtime (PyTorch's
/// `cudaSetDevice` changes the current context behind berth's back) that cache can be stale,
/// and the runtime's idea of the current device would change if berth left its own context
/// current. So entering the scope reads the current context (`cuCtxGetCurrent`), makes
/// `device`'s primary context current only when it is not already (the common case in a
/// one-device program costs one `cuCtxGetCurrent`), and sets the cache to what is true; leaving
/// it restores the previous context and forgets the cache. The primary context is the one the
/// CUDA runtime uses too (<https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__PRIMARY__CTX.html>),
/// so memory and streams are shared with PyTorch.
#[must_use = "the context is restored when the scope is dropped"]
pub struct ForeignContextScope {
    device: usize,
    /// The context to restore on drop, when this scope changed it.
    restore: Option<u64>,
}

/// Enters a [`ForeignContextScope`] for `device`.
///
/// # Errors
/// [`CudaError::InvalidDevice`], [`CudaError::Unavailable`], or [`CudaError::Driver`] when
/// retaining the primary context or `cuCtxGetCurrent` / `cuCtxSetCurrent` fails.
pub fn foreign_context_scope(device: usize) -> Result<ForeignContextScope, CudaError> {
    let p = primary(device)?;
    let prev = ffi::ctx_get_current(device)?;
    if prev == p.ctx {
        BOUND.with(|b| b.set(Some(device)));
        return Ok(ForeignContextScope {
            device,
            restore: None,
        });
    }
    // SAFETY: `p.ctx` is a retained primary context that is never released.
    unsafe { ffi::ctx_set_current(device, p.ctx)? };
    BOUND.with(|b| b.set(Some(device)));
    Ok(ForeignContextScope {
        device,
        restore: Some(prev),
    })
}

impl Drop for ForeignContextScope {
    fn drop(&mut self) {
        if let Some(prev) = self.restore {
            // SAFETY: `prev` was current on this thread when the scope was entered, and the
            // scope's body (berth's own calls) destroys no context.
            let _ = unsafe { ffi::ctx_restore(self.device, prev) };
            BOUND.with(|b| b.set(None));
        }
    }
}

/// A scope around a library call that changes the current device behind berth's back (NCCL's
/// `ncclCommInitAll` and `ncclGroupEnd` call `cudaSetDevice` for each device they touch;
/// Note [Foreign contexts]): on drop the context current at entry is current again, and
/// berth's per-thread cache is forgotten, so the next [`bind`] sets the context it needs.
#[cfg(feature = "cuda")]
pub(crate) struct RestoreContext {
    device: usize,
    ctx: u64,
}

/// Enters a [`RestoreContext`]; `device` names the call in a driver error.
///
/// # Errors
/// [`CudaError::Unavailable`] or [`CudaError::Driver`] when `cuCtxGetCurrent` fails.
#[cfg(feature = "cuda")]
pub(crate) fn restore_context_after(device: usize) -> Result<RestoreContext, CudaError> {
    let ctx = ffi::ctx_get_current(device)?;
    Ok(RestoreContext { device, ctx })
}

#[cfg(feature = "cuda")]
impl Drop for RestoreContext {
    fn drop(&mut self) {
        BOUND.with(|b| b.set(None));
        match ffi::ctx_get_current(self.device) {
            Ok(now) if now == self.ctx => {}
            _ => {
                // SAFETY: `self.ctx` was current on this thread at entry (or 0), and the scope's
                // body (NCCL) destroys no context.
                if let Err(e) = unsafe { ffi::ctx_restore(self.device, self.ctx) } {
                    berth_alloc::warnings::warn_once("restore-context", || {
                        format!("restoring the current CUDA context after an NCCL call failed: {e}")
                    });
                }
            }
        }
    }
}
