//! The pool of pageable host buffers that collates write into when batches are not pinned.
//!
//! Note [Recycled collate buffers]: a collate without `pin_memory` used to write every batch
//! into a fresh `Tensor::empty`, which the system allocator zeroes (a 3 MB batch comes from
//! `mmap`: about 750 page faults, then the kernel's zeroing, then the gather's own write) and
//! returns on drop. That extra pass held the host-only loader to about two thirds of a
//! `memcpy` of the same bytes. Instead, a batch's buffer is taken from this pool and goes back
//! to it when the batch's storage is dropped (by the consumer, on any thread), so in the steady
//! state an epoch allocates nothing and each buffer is written exactly once per batch. The
//! pool is process-wide, keyed by exact byte size (a loader's batches are all one size but the
//! last), and bounded: at most [`POOL_MAX_BYTES`] bytes are kept, beyond that freed buffers go
//! back to the system. A recycled buffer holds the previous batch's bytes, never uninitialised
//! memory: the collate overwrites every byte of the part it hands out. The pinned path has the
//! same property through the pinned host caching allocator (Note [Collate into pinned memory]).

use std::alloc::{self, Layout as AllocLayout};
use std::collections::HashMap;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, PoisonError};

use berth::storage::{ExternalHostMemory, HOST_ALIGNMENT};
use berth::{DType, Layout, Storage, Tensor};

use crate::error::Result;

/// Bytes of free buffers the pool keeps at most (256 MiB: 85 batches of 256 × 3072 f32, more
/// than `prefetch_factor × num_workers` batches in flight with 16 workers and a prefetch of 2).
pub const POOL_MAX_BYTES: usize = 256 << 20;

/// Free buffers by exact size in bytes, and the sum of their sizes.
#[derive(Default)]
struct Free {
    by_size: HashMap<usize, Vec<Buf>>,
    bytes: usize,
}

/// The process-wide pool.
fn pool() -> &'static Arc<Mutex<Free>> {
    static POOL: std::sync::OnceLock<Arc<Mutex<Free>>> = std::sync::OnceLock::new();
    POOL.get_or_init(Arc::default)
}

/// An owned, [`HOST_ALIGNMENT`]-aligned, initialised (zeroed when new) host buffer of `len > 0`
/// bytes.
struct Buf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: plain memory owned by this value; the storage that wraps it synchronises access.
unsafe impl Send for Buf {}
// SAFETY: as above; shared access hands out only the raw pointer.
unsafe impl Sync for Buf {}

impl Buf {
    /// `len` (> 0) zeroed bytes, or `None` when the system allocator refuses them.
    fn zeroed(len: usize) -> Option<Buf> {
        let layout = AllocLayout::from_size_align(len, HOST_ALIGNMENT).ok()?;
        // SAFETY: `layout` has a non-zero size (callers pass `len > 0`).
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        Some(Buf {
            ptr: NonNull::new(raw)?,
            len,
        })
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        let layout = AllocLayout::from_size_align(self.len, HOST_ALIGNMENT)
            .expect("the layout was valid at allocation");
        // SAFETY: allocated in `Buf::zeroed` with this layout, freed once.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), layout) };
    }
}

/// A pooled buffer lent to one storage; returns to the pool on drop.
struct Pooled {
    buf: Option<Buf>,
    pool: Arc<Mutex<Free>>,
}

impl std::fmt::Debug for Pooled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pooled")
            .field("len", &self.len())
            .finish_non_exhaustive()
    }
}

// SAFETY: `as_ptr` is the start of a live buffer of `len` bytes, aligned to HOST_ALIGNMENT (64),
// owned by this value until drop and handed to no one else meanwhile (it leaves the free list
// when lent); both values are fixed at creation.
unsafe impl ExternalHostMemory for Pooled {
    fn as_ptr(&self) -> *mut u8 {
        self.buf
            .as_ref()
            .map_or(std::ptr::null_mut(), |b| b.ptr.as_ptr())
    }
    fn len(&self) -> usize {
        self.buf.as_ref().map_or(0, |b| b.len)
    }
    fn is_pinned(&self) -> bool {
        false
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        let Some(buf) = self.buf.take() else { return };
        let mut free = self.pool.lock().unwrap_or_else(PoisonError::into_inner);
        if free.bytes + buf.len <= POOL_MAX_BYTES {
            free.bytes += buf.len;
            free.by_size.entry(buf.len).or_default().push(buf);
        }
        // Else `buf` drops here, after the lock is released (it is declared before the guard).
    }
}

/// A contiguous host tensor of `shape` and `dtype` over a recycled buffer (Note [Recycled
/// collate buffers]). Its bytes are unspecified (a previous batch's, or zero): the caller
/// overwrites all of them.
///
/// # Errors
/// [`berth::Error::HostOutOfMemory`] when a new buffer is needed and the system refuses it;
/// the tensor constructor's shape errors.
pub(crate) fn empty_recycled(shape: &[usize], dtype: DType) -> Result<Tensor> {
    let nbytes = shape
        .iter()
        .try_fold(dtype.size_in_bytes(), |n, &d| n.checked_mul(d));
    let nbytes = match nbytes {
        Some(n) if n > 0 => n,
        // Zero bytes or an overflowing size: the plain constructor gives the right answer.
        _ => return Ok(Tensor::empty(shape, dtype, berth::Device::Cpu)?),
    };
    let pool = pool();
    let reused = {
        let mut free = pool.lock().unwrap_or_else(PoisonError::into_inner);
        let b = free.by_size.get_mut(&nbytes).and_then(Vec::pop);
        if b.is_some() {
            free.bytes -= nbytes;
        }
        b
    };
    let buf = match reused {
        Some(b) => b,
        None => Buf::zeroed(nbytes).ok_or(berth::Error::HostOutOfMemory {
            device: berth::Device::Cpu,
            requested_bytes: nbytes,
        })?,
    };
    let storage = Storage::host_external(Box::new(Pooled {
        buf: Some(buf),
        pool: Arc::clone(pool),
    }));
    Ok(Tensor::from_parts(
        Arc::new(storage),
        Layout::contiguous(shape),
        dtype,
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dropped_buffer_is_reused_for_the_same_size() {
        // A size no other test uses, so the process-wide pool holds none of it yet.
        let shape = [3, 1001];
        let a = empty_recycled(&shape, DType::F32).unwrap();
        assert_eq!(a.shape(), &shape);
        assert!(!a.is_pinned());
        let pa = a.data_ptr();
        a.fill_(2.5).unwrap();
        drop(a);
        let b = empty_recycled(&shape, DType::F32).unwrap();
        assert_eq!(b.data_ptr(), pa, "the freed buffer comes back");
        // It holds the previous batch's bytes, which the collate overwrites.
        assert_eq!(b.to_vec::<f32>().unwrap()[0], 2.5);
        // Two live at once are distinct buffers.
        let c = empty_recycled(&shape, DType::F32).unwrap();
        assert_ne!(c.data_ptr(), b.data_ptr());
        assert_eq!(
            c.to_vec::<f32>().unwrap(),
            vec![0.0; 3003],
            "a new buffer is zeroed"
        );
    }

    #[test]
    fn zero_sized_tensors_need_no_buffer() {
        let t = empty_recycled(&[0, 5], DType::F32).unwrap();
        assert_eq!(t.numel(), 0);
        assert_eq!(t.shape(), &[0, 5]);
    }
}
