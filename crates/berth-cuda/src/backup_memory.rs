//! Page-locked host memory for the backups of sleeping tags (`Note [Sleep and wake]` in
//! berth-alloc's `paged`), fast to get and optionally kept between sleeps.
//!
//! # Note [Backup host memory]
//! A sleep offloads a tag into one host buffer (one per tag, not per block). `cuMemHostAlloc`
//! of 256 MiB costs ~100 ms on the H200 host (the driver zeroes and locks 65,536 small pages
//! one by one), ten times the copy itself. A buffer of [`FAST_MIN_BYTES`] or more is instead
//! an anonymous mapping with transparent huge pages, faulted from several threads at once and
//! page-locked with one `cuMemHostRegister` (the route of `Note [Filled first pins]` in
//! [`crate::pinned`], without a source to fill from); freeing unregisters and unmaps it.
//!
//! Reinforcement-learning loops sleep and wake every iteration. With
//! [`crate::sleep::keep_host_memory`]`(true)` the buffers freed at wake are kept page-locked
//! and the next sleep takes the smallest kept buffer that fits, so only the first sleep pays
//! for locking pages. Off by default: PyTorch users of vLLM's sleep mode report the host
//! memory still held after wake (it stays in PyTorch's pinned cache there, unseen); berth
//! frees it unless asked, and [`crate::sleep::release_host_memory`] gives kept buffers back.

use std::collections::BTreeMap;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};

use berth_alloc::host::BackupMemory;
use berth_alloc::BackendError;

use crate::hostmem::{Mapping, Pages};
use crate::{ffi, CudaError};

/// Smallest buffer, in bytes, mapped and registered instead of taken from `cuMemHostAlloc`.
pub const FAST_MIN_BYTES: usize = 4 << 20;

/// Threads that fault a buffer's pages (the host's cores, at most 16).
fn fault_threads() -> usize {
    std::thread::available_parallelism().map_or(4, |n| n.get().min(16))
}

/// One buffer: its real size and how it was made.
#[derive(Debug)]
struct Buffer {
    bytes: usize,
    /// `Some` for a mapped and registered buffer, `None` for `cuMemHostAlloc`.
    mapping: Option<Mapping>,
}

#[derive(Debug, Default)]
struct Buffers {
    /// Buffers handed out, by address.
    out: BTreeMap<usize, Buffer>,
    /// Buffers kept for reuse, by address.
    kept: BTreeMap<usize, Buffer>,
}

/// The backup memory of every sleep in this process (`Note [Backup host memory]`).
#[derive(Debug)]
pub(crate) struct CudaBackupMemory {
    /// The device whose context registers the memory (`PORTABLE`: usable by every device).
    device: usize,
    keep: AtomicBool,
    buffers: Mutex<Buffers>,
}

impl CudaBackupMemory {
    pub(crate) fn new(device: usize) -> CudaBackupMemory {
        CudaBackupMemory {
            device,
            keep: AtomicBool::new(false),
            buffers: Mutex::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Buffers> {
        // Each critical section is one map operation: a poisoned lock is still consistent.
        self.buffers.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn set_keep(&self, keep: bool) {
        self.keep.store(keep, Ordering::Relaxed);
    }

    /// Bytes of buffers kept for reuse.
    pub(crate) fn kept_bytes(&self) -> u64 {
        self.lock().kept.values().map(|b| b.bytes as u64).sum()
    }

    /// Frees every kept buffer; the bytes freed.
    ///
    /// # Errors
    /// The first driver error (the buffers that failed stay kept).
    pub(crate) fn release_kept(&self) -> Result<u64, CudaError> {
        let kept = std::mem::take(&mut self.lock().kept);
        let mut freed = 0;
        let mut first = None;
        for (addr, b) in kept {
            let bytes = b.bytes as u64;
            // SAFETY: a kept buffer is owned by the pool alone: no backup uses it.
            match unsafe { self.free_now(addr, b) } {
                Ok(()) => freed += bytes,
                Err((e, b)) => {
                    self.lock().kept.insert(addr, b);
                    first.get_or_insert(e);
                }
            }
        }
        first.map_or(Ok(freed), Err)
    }

    /// A new buffer of `bytes` bytes.
    fn make(&self, bytes: usize) -> Result<(usize, Buffer), CudaError> {
        if bytes >= FAST_MIN_BYTES {
            if let Ok(mut m) = Mapping::new(bytes, Pages::Huge) {
                m.prefault(fault_threads());
                ffi::host_register(self.device, m.as_ptr(), bytes)?;
                let addr = m.as_ptr() as usize;
                let buf = Buffer {
                    bytes,
                    mapping: Some(m),
                };
                return Ok((addr, buf));
            }
        }
        let p = ffi::host_alloc(self.device, bytes)?;
        if p.is_null() {
            return Err(CudaError::HostAlloc {
                message: "cuMemHostAlloc returned a null pointer".into(),
            });
        }
        Ok((
            p as usize,
            Buffer {
                bytes,
                mapping: None,
            },
        ))
    }

    /// Frees `b` at `addr`; on failure gives it back with the error.
    ///
    /// # Safety
    /// No copy still uses the buffer.
    #[allow(clippy::result_large_err)] // the buffer goes back to its list on failure
    unsafe fn free_now(&self, addr: usize, b: Buffer) -> Result<(), (CudaError, Buffer)> {
        let p = addr as *mut u8;
        let r = match &b.mapping {
            // SAFETY: registered by `make`; the caller's contract. Dropping `b` unmaps it.
            Some(_) => unsafe { ffi::host_unregister(self.device, p) },
            // SAFETY: from `cuMemHostAlloc` in `make`; the caller's contract.
            None => unsafe { ffi::host_free(self.device, p) },
        };
        r.map_err(|e| (e, b))
    }
}

impl BackupMemory for CudaBackupMemory {
    fn alloc_backup(&self, bytes: usize) -> Result<NonNull<u8>, BackendError> {
        let mut bufs = self.lock();
        // The smallest kept buffer that fits, unless it would waste more than half of itself.
        let reuse = bufs
            .kept
            .iter()
            .filter(|(_, b)| b.bytes >= bytes && b.bytes / 2 <= bytes)
            .min_by_key(|(_, b)| b.bytes)
            .map(|(&a, _)| a);
        let (addr, buf) = match reuse.and_then(|a| bufs.kept.remove_entry(&a)) {
            Some(found) => found,
            None => {
                drop(bufs);
                let made = self.make(bytes)?;
                bufs = self.lock();
                made
            }
        };
        bufs.out.insert(addr, buf);
        NonNull::new(addr as *mut u8).ok_or(BackendError::Other {
            op: "alloc_backup",
            message: "a buffer at a null address".into(),
        })
    }

    unsafe fn free_backup(&self, ptr: NonNull<u8>, _bytes: usize) -> Result<(), BackendError> {
        let addr = ptr.as_ptr() as usize;
        let Some(buf) = self.lock().out.remove(&addr) else {
            return Err(BackendError::InvalidPointer {
                op: "free_backup",
                ptr: berth_alloc::DevicePtr(addr as u64),
            });
        };
        if self.keep.load(Ordering::Relaxed) {
            self.lock().kept.insert(addr, buf);
            return Ok(());
        }
        // SAFETY: the trait's contract: no copy still uses it.
        unsafe { self.free_now(addr, buf) }.map_err(|(e, b)| {
            self.lock().out.insert(addr, b);
            e.into()
        })
    }
}

impl Drop for CudaBackupMemory {
    fn drop(&mut self) {
        let bufs = std::mem::take(&mut *self.lock());
        for (addr, b) in bufs.kept.into_iter().chain(bufs.out) {
            // SAFETY: the last owner is going away: nothing uses its buffers.
            drop(unsafe { self.free_now(addr, b) });
        }
    }
}
