//! What every device policy shares around its placement logic: the sticky error slot of
//! drop-time frees, the out-of-memory observers, the memory-fraction cap, and the wrapping of
//! pointers into [`Allocation`]s. [`crate::caching::CachingAllocator`] (PyTorch's policy) and
//! [`crate::PagedBestFit`] (berth's) both use these, so a rule such as "a fraction outside
//! `[0, 1]` is refused" or "the first drop-time error is kept" has one implementation.

use crate::allocator::{Allocation, AllocationOwner, OomObserver};
use crate::backend::{DevicePtr, MemoryBackend, StreamId};
use crate::error::AllocError;
use crate::sync::{Arc, Mutex};

/// The first error recorded where it cannot be returned (a free in `Drop`), kept until
/// [`crate::DeviceAllocator::check_err`] takes it (cudarc's `record_err` / `check_err`).
pub(crate) struct StickyError<E> {
    slot: Mutex<Option<E>>,
}

impl<E> StickyError<E> {
    pub(crate) fn new() -> Self {
        StickyError {
            slot: Mutex::new(None),
        }
    }

    /// Keeps `err` unless an earlier error is still waiting.
    pub(crate) fn record(&self, err: E) {
        // One statement per critical section: a poisoned lock is still consistent.
        let mut slot = self.slot.lock().unwrap_or_else(|e| e.into_inner());
        slot.get_or_insert(err);
    }

    /// Returns and clears the kept error.
    pub(crate) fn take(&self) -> Result<(), E> {
        let taken = self.slot.lock().unwrap_or_else(|e| e.into_inner()).take();
        taken.map_or(Ok(()), Err)
    }
}

/// The registered [`OomObserver`]s of one allocator.
pub(crate) struct OomObservers {
    list: Mutex<Vec<OomObserver>>,
}

impl OomObservers {
    pub(crate) fn new() -> Self {
        OomObservers {
            list: Mutex::new(Vec::new()),
        }
    }

    pub(crate) fn push(&self, observer: OomObserver) {
        self.list
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(observer);
    }

    /// Runs every observer on `err` if it is an out-of-memory error. Call with the policy's
    /// lock released.
    pub(crate) fn notify(&self, err: &AllocError) {
        if !err.is_out_of_memory() {
            return;
        }
        let observers = self.list.lock().unwrap_or_else(|p| p.into_inner()).clone();
        for observer in observers {
            observer(err);
        }
    }
}

/// The byte cap of `set_per_process_memory_fraction(fraction)` on `backend`'s device:
/// `(floor(fraction × total), total)`.
///
/// # Errors
/// [`AllocError::InvalidFraction`] unless `0 ≤ fraction ≤ 1` (NaN included), as PyTorch's
/// `TORCH_CHECK(0 <= fraction && fraction <= 1)`; [`AllocError::Backend`] when the backend
/// cannot report its total memory.
pub(crate) fn fraction_cap<B: MemoryBackend>(
    backend: &B,
    fraction: f64,
) -> Result<(u64, u64), AllocError> {
    if !(0.0..=1.0).contains(&fraction) {
        return Err(AllocError::InvalidFraction { fraction });
    }
    let total = backend
        .mem_info()
        .map_err(|source| AllocError::Backend {
            stream: StreamId::DEFAULT,
            source,
        })?
        .total_bytes;
    Ok(((fraction * total as f64) as u64, total))
}

/// `ptr` of `bytes` requested bytes on `stream` as an [`Allocation`] that `owner` frees; the
/// null pointer (zero bytes) gives an empty allocation with no owner.
pub(crate) fn wrap<O: AllocationOwner + 'static>(
    ptr: DevicePtr,
    bytes: usize,
    stream: StreamId,
    owner: &Arc<O>,
) -> Allocation {
    if ptr.is_null() {
        return Allocation::empty(stream);
    }
    let owner: Arc<dyn AllocationOwner> = owner.clone();
    Allocation::new(ptr, bytes, stream, owner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::sim::SimBackend;

    #[test]
    fn sticky_keeps_the_first_error_once() {
        let s = StickyError::new();
        s.record(1);
        s.record(2);
        assert_eq!(s.take(), Err(1));
        assert_eq!(s.take(), Ok(()));
    }

    #[test]
    fn fraction_cap_checks_the_range_and_floors() {
        let sim = SimBackend::new(1000);
        assert_eq!(fraction_cap(&sim, 0.5).unwrap(), (500, 1000));
        assert_eq!(fraction_cap(&sim, 0.3337).unwrap(), (333, 1000));
        for bad in [-0.1, 1.5, f64::NAN] {
            assert!(matches!(
                fraction_cap(&sim, bad),
                Err(AllocError::InvalidFraction { .. })
            ));
        }
    }
}
