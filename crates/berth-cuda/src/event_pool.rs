//! A pool of driver events per device, so that recording an event on the hot path costs one
//! `cuEventRecord` rather than a `cuEventCreate`, a record and a `cuEventDestroy`.
//!
//! # Note [Event pool]
//! berth records events in many places that run once per batch or per allocation: a stream
//! waiting for another ([`crate::Stream::wait_stream`]), the event after a prefetched batch's
//! copy, the fence that keeps a pinned block from reuse until its copy ran, the pending work of
//! a host tensor read by a queued copy. Each used to create its driver event and destroy it
//! when dropped. PyTorch's caching allocator keeps a per-device pool of events for the same
//! reason (`EventPool` in
//! <https://github.com/pytorch/pytorch/blob/main/c10/cuda/CUDACachingAllocator.cpp>). Here
//! every [`crate::Event`] and allocator fence takes its driver event from this pool when first
//! recorded and gives it back when dropped.
//!
//! Reuse is sound while the event may still be pending from its previous record: a record
//! overwrites the event's captured work, and `cuStreamWaitEvent` and `cuEventQuery` use the
//! work captured when *they* are called
//! (<https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__EVENT.html>), so a stream that
//! waited on the previous record still waits for exactly that work; and the event's previous
//! owner dropped it, so no one queries the old record again. Events with and without timing are
//! kept apart. The pool keeps at most [`MAX_POOLED`] of each kind per device and destroys the
//! rest, so a burst (thousands of fences of pinned blocks waiting at once) does not keep
//! thousands of driver events for the life of the process.

use std::sync::Mutex;

use crate::{ffi, CudaError};

/// The most events kept per device and kind (timing on or off).
pub(crate) const MAX_POOLED: usize = 1024;

/// Free driver events, by device and kind.
#[derive(Debug, Default)]
struct Free {
    /// `slots[2 * device + timing as usize]`: raw `CUevent` handles ready to record.
    slots: Vec<Vec<u64>>,
}

impl Free {
    fn slot(device: usize, timing: bool) -> usize {
        2 * device + usize::from(timing)
    }

    /// A free event of `device` and kind `timing`, if one is pooled.
    fn pop(&mut self, device: usize, timing: bool) -> Option<u64> {
        self.slots.get_mut(Self::slot(device, timing))?.pop()
    }

    /// Pools `ev`; hands it back when the pool of its device and kind is full (the caller
    /// destroys it).
    fn push(&mut self, device: usize, timing: bool, ev: u64) -> Option<u64> {
        let slot = Self::slot(device, timing);
        if self.slots.len() <= slot {
            self.slots.resize_with(slot + 1, Vec::new);
        }
        let free = &mut self.slots[slot];
        if free.len() >= MAX_POOLED {
            return Some(ev);
        }
        free.push(ev);
        None
    }
}

static FREE: Mutex<Free> = Mutex::new(Free { slots: Vec::new() });

fn free() -> std::sync::MutexGuard<'static, Free> {
    FREE.lock().unwrap_or_else(|p| p.into_inner())
}

/// A driver event of `device` (`timing`: made without `CU_EVENT_DISABLE_TIMING`), from the
/// pool or newly created.
///
/// # Errors
/// [`CudaError::Driver`] / [`CudaError::Unavailable`] from `cuEventCreate`.
pub(crate) fn take(device: usize, timing: bool) -> Result<u64, CudaError> {
    if let Some(ev) = free().pop(device, timing) {
        return Ok(ev);
    }
    ffi::event_create(device, timing)
}

/// Gives `ev` back to the pool; destroys it when the pool is full.
///
/// # Safety
/// 1. `ev` is a live driver event of `device`, of kind `timing`, from [`take`].
/// 2. The caller gives it back once and uses it no more.
pub(crate) unsafe fn give(device: usize, timing: bool, ev: u64) {
    if let Some(ev) = free().push(device, timing, ev) {
        // A failed destroy leaks one handle; this runs on drop paths, which never panic.
        // SAFETY: the caller's contract: `ev` is live, of `device`, and no longer used.
        let _ = unsafe { ffi::event_destroy(device, ev) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_come_back_by_device_and_kind() {
        let mut f = Free::default();
        assert_eq!(f.pop(0, false), None);
        assert_eq!(f.push(1, true, 11), None);
        assert_eq!(f.push(0, false, 7), None);
        assert_eq!(f.push(0, false, 8), None);
        assert_eq!(f.pop(0, true), None, "timing events are kept apart");
        assert_eq!(f.pop(2, false), None, "an unknown device has none");
        assert_eq!(f.pop(0, false), Some(8));
        assert_eq!(f.pop(0, false), Some(7));
        assert_eq!(f.pop(0, false), None);
        assert_eq!(f.pop(1, true), Some(11));
    }

    #[test]
    fn a_full_pool_hands_the_event_back_to_be_destroyed() {
        let mut f = Free::default();
        for ev in 0..MAX_POOLED as u64 {
            assert_eq!(f.push(3, false, ev), None);
        }
        assert_eq!(f.push(3, false, 99_999), Some(99_999));
        assert_eq!(f.push(3, true, 5), None, "the other kind has its own room");
        assert_eq!(f.pop(3, false), Some(MAX_POOLED as u64 - 1));
    }
}
