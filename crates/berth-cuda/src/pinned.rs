//! [`CudaHostBackend`]: berth-alloc's [`HostBackend`] on `cuMemHostAlloc` / `cuMemFreeHost`,
//! and `cuMemHostRegister` / `cuMemHostUnregister` for `pinned_use_cuda_host_register` (the
//! host caching allocator pre-faults pages from `pinned_num_register_threads` threads, then
//! calls [`HostBackend::register`]).
//!
//! Pinned memory is allocated `PORTABLE` in the context of the device current on the calling
//! thread when the backend is built: never a device the program did not name
//! (<https://github.com/pytorch/pytorch/issues/21081>).
//!
//! # Note [Filled first pins]
//! A `pin_memory()` of [`FILLED_PIN_MIN_BYTES`] or more that the cache cannot serve does not
//! take `cuMemHostAlloc` + copy: [`with_fill_source`] tells the backend, for the allocation
//! the caching allocator makes on this thread, what the block will hold; the backend then
//! maps the block anonymously with transparent huge pages ([`super::hostmem`]), copies the
//! source in from several threads (the first touch faults the pages), and page-locks it with
//! one `cuMemHostRegister`. Freeing it unregisters and unmaps. The block is cached and reused
//! like any other.

use crate::backend::CudaFence;
use crate::hostmem::{Mapping, Pages};
use crate::{ffi, CudaError};
use berth_alloc::{BackendError, DeviceStream, HostBackend};
use std::cell::Cell;
use std::collections::BTreeMap;
use std::ptr::NonNull;
use std::sync::Mutex;

/// Smallest block, in bytes, that a first `pin_memory()` maps, fills and registers instead of
/// taking from `cuMemHostAlloc` (see Note [Filled first pins]).
pub const FILLED_PIN_MIN_BYTES: usize = 4 << 20;

thread_local! {
    /// The source of the block being allocated on this thread (Note [Filled first pins]),
    /// and whether the backend consumed it.
    static FILL: Cell<Option<(*const u8, usize)>> = const { Cell::new(None) };
    static FILLED: Cell<bool> = const { Cell::new(false) };
}

/// Runs `alloc` (an allocation through the pinned caching allocator on this thread) so that a
/// block of at least [`FILLED_PIN_MIN_BYTES`] that the backend has to create is filled from
/// `src` as it is made; returns `alloc`'s result and whether the block already holds `src`
/// (else the caller copies). berth's `pin_memory()` allocates through this.
pub fn with_fill_source<R>(src: &[u8], alloc: impl FnOnce() -> R) -> (R, bool) {
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            FILL.with(|f| f.set(None));
            FILLED.with(|f| f.set(false));
        }
    }
    let _reset = Reset;
    FILLED.with(|f| f.set(false));
    FILL.with(|f| f.set(Some((src.as_ptr(), src.len()))));
    let r = alloc();
    (r, FILLED.with(Cell::get))
}

/// Page-locked host memory from the CUDA driver.
#[derive(Debug)]
pub struct CudaHostBackend {
    device: usize,
    /// Blocks mapped and registered by berth (Note [Filled first pins]), by address.
    mapped: Mutex<BTreeMap<usize, Mapping>>,
}

impl CudaHostBackend {
    /// A backend allocating in the context of the thread's current device (created if needed).
    ///
    /// # Errors
    /// [`CudaError::Unavailable`], [`CudaError::Driver`].
    pub fn new() -> Result<CudaHostBackend, CudaError> {
        let device = crate::current_device()?;
        crate::bind_context(device)?;
        Ok(CudaHostBackend {
            device,
            mapped: Mutex::new(BTreeMap::new()),
        })
    }

    /// A block of `bytes` bytes mapped with huge pages, filled from `src`, and page-locked.
    fn alloc_filled(&self, bytes: usize, src: &[u8]) -> Result<NonNull<u8>, CudaError> {
        let mut m = Mapping::new(bytes, Pages::Huge)?;
        m.fill_from(src);
        // Only the block's `bytes` are registered (the mapping may be longer).
        // `m` stays mapped until `free_pinned` unregisters it (it is kept in `mapped` until then).
        ffi::host_register(self.device, m.as_ptr(), bytes)?;
        let p = NonNull::new(m.as_ptr()).ok_or_else(|| CudaError::HostAlloc {
            message: "mapping at a null address".into(),
        })?;
        self.mapped_lock().insert(p.as_ptr() as usize, m);
        Ok(p)
    }

    fn mapped_lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<usize, Mapping>> {
        // Each critical section is one map operation: a poisoned lock is still consistent.
        self.mapped.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Number of blocks currently mapped and registered by berth (Note [Filled first pins]).
    pub fn mapped_blocks(&self) -> usize {
        self.mapped_lock().len()
    }

    /// Whether `ptr` is the start of a block mapped and registered by berth (Note [Filled
    /// first pins]) and not yet freed.
    pub fn is_mapped_block(&self, ptr: *const u8) -> bool {
        self.mapped_lock().contains_key(&(ptr as usize))
    }

    /// The device whose context pins the memory.
    pub fn device(&self) -> usize {
        self.device
    }
}

impl HostBackend for CudaHostBackend {
    type Fence = CudaFence;

    fn alloc_pinned(&self, bytes: usize) -> Result<NonNull<u8>, BackendError> {
        if bytes >= FILLED_PIN_MIN_BYTES {
            if let Some((ptr, len)) = FILL.with(Cell::get).filter(|&(_, len)| len <= bytes) {
                // SAFETY: `with_fill_source` set this from a live `&[u8]` that outlives the
                // allocation call we are inside (same thread, same scope).
                let src = unsafe { std::slice::from_raw_parts(ptr, len) };
                // On failure the source stays set: the caching allocator may retry after
                // emptying its cache.
                let p = self.alloc_filled(bytes, src)?;
                FILL.with(|f| f.set(None));
                FILLED.with(|f| f.set(true));
                return Ok(p);
            }
        }
        let p = ffi::host_alloc(self.device, bytes)?;
        NonNull::new(p).ok_or(BackendError::Other {
            op: "cuMemHostAlloc",
            message: "returned a null pointer".into(),
        })
    }

    unsafe fn free_pinned(&self, ptr: NonNull<u8>, _bytes: usize) -> Result<(), BackendError> {
        let addr = ptr.as_ptr() as usize;
        let mapping = self.mapped_lock().remove(&addr);
        match mapping {
            // SAFETY: `ptr` starts a block registered by `alloc_filled`; the trait's contract
            // says no queued work uses it.
            Some(m) => match unsafe { ffi::host_unregister(self.device, ptr.as_ptr()) } {
                // Dropping the mapping unmaps it.
                Ok(()) => Ok(()),
                Err(e) => {
                    // Still registered as far as we know: keep it mapped (a later free retries).
                    self.mapped_lock().insert(addr, m);
                    Err(e.into())
                }
            },
            None => {
                // SAFETY: the trait's contract: `ptr` came from `alloc_pinned`, here from
                // `cuMemHostAlloc` (not a mapped block), freed once, unused by queued work.
                unsafe { ffi::host_free(self.device, ptr.as_ptr()) }.map_err(BackendError::from)
            }
        }
    }

    fn register(&self, ptr: NonNull<u8>, bytes: usize) -> Result<(), BackendError> {
        Ok(ffi::host_register(self.device, ptr.as_ptr(), bytes)?)
    }

    unsafe fn unregister(&self, ptr: NonNull<u8>, _bytes: usize) -> Result<(), BackendError> {
        // SAFETY: the trait's contract: `ptr` was registered by `register`, unused by queued
        // work.
        unsafe { ffi::host_unregister(self.device, ptr.as_ptr()) }.map_err(BackendError::from)
    }

    fn record_fence(&self, stream: DeviceStream) -> Result<CudaFence, BackendError> {
        // On the stream's own device: every device's default stream is handle 0, so the
        // thread's current device would be the wrong one for a copy queued on another device.
        Ok(CudaFence::record(stream.device as usize, stream.stream)?)
    }

    fn query_fence(&self, event: &CudaFence) -> Result<bool, BackendError> {
        Ok(event.query()?)
    }

    fn sync_fence(&self, event: &CudaFence) -> Result<(), BackendError> {
        Ok(event.synchronize()?)
    }

    fn is_pinned(&self, ptr: *const u8) -> bool {
        // `cuPointerGetAttribute` is asked only when the context exists: `is_pinned` never
        // creates one (https://github.com/pytorch/pytorch/issues/128988).
        crate::is_initialized(self.device) && ffi::pointer_is_host(self.device, ptr)
    }
}
