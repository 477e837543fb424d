//! The copy queue of one device's [`crate::backend::CudaBackend`]: host↔device copies queued
//! on the legacy default stream, an event after each, so a caller can wait for a prefix of
//! them while the rest run. `paged`'s sleep unmaps each unit once the copies of its blocks
//! are done, and its wake queues each block's copy as soon as the units under it are mapped
//! (`Note [Sleep and wake]` in berth-alloc's `paged`).
//!
//! A copy to or from a backup buffer still being page-locked waits for the chunks under it
//! and is queued as one copy per chunk (`Note [Registered in chunks]` in
//! [`crate::backup_memory`]).
//!
//! The copies run on the legacy default stream, in queue order
//! (<https://docs.nvidia.com/cuda/cuda-runtime-api/stream-sync-behavior.html>); sleep and
//! wake synchronize every stream of the allocator before queueing, so nothing else touches
//! the ranges copied.

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard};

use berth_alloc::backend::CopyTicket;
use berth_alloc::BackendError;

use crate::backup_memory::registered_pieces;
use crate::event::Event;
use crate::ffi;
use crate::stream::Stream;

/// The legacy default stream, where the copies run.
const COPY_STREAM: u64 = 0;

/// The error of piece `k` of a copy; when earlier pieces were queued, waits for them first,
/// so that no copy still runs when the caller frees the buffers after the error.
fn settle(device: usize, k: usize, e: crate::CudaError) -> crate::CudaError {
    if k > 0 {
        if let Ok(s) = Stream::default_stream(device) {
            let _ = s.synchronize();
        }
    }
    e
}

/// Queued copies not yet known complete, each with the event recorded after it.
#[derive(Debug, Default)]
pub(crate) struct CopyQueue {
    inner: Mutex<Pending>,
}

#[derive(Debug, Default)]
struct Pending {
    /// The ticket of the last copy queued.
    last: u64,
    /// `(ticket, event after that copy)`, by ticket.
    events: VecDeque<(u64, Event)>,
}

impl CopyQueue {
    fn lock(&self) -> MutexGuard<'_, Pending> {
        // Each critical section leaves the queue consistent: a poisoned lock is still usable.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `copy` (one asynchronous copy on [`COPY_STREAM`]) and records its event.
    fn queue(
        &self,
        device: usize,
        copy: impl FnOnce() -> Result<(), crate::CudaError>,
    ) -> Result<CopyTicket, BackendError> {
        let mut p = self.lock();
        copy()?;
        let ev = Event::new(false);
        ev.record_on(&Stream::default_stream(device)?)?;
        p.last += 1;
        let t = p.last;
        p.events.push_back((t, ev));
        Ok(CopyTicket(t))
    }

    /// Queues a copy of `bytes` bytes from device address `src` to host `dst`.
    ///
    /// # Safety
    /// `VirtualMemoryBackend::queue_copy_to_host`'s contract.
    pub(crate) unsafe fn device_to_host(
        &self,
        device: usize,
        src: u64,
        dst: *mut u8,
        bytes: usize,
    ) -> Result<CopyTicket, BackendError> {
        let pieces = registered_pieces(dst as usize, bytes)?;
        self.queue(device, || {
            for (k, &(at, n)) in pieces.iter().enumerate() {
                let off = at - dst as usize;
                // SAFETY: the caller's contract: `dst` is writable host memory until the copy
                // is waited for, `src` is mapped device memory nothing writes meanwhile; each
                // piece lies inside both ranges.
                unsafe {
                    ffi::memcpy_dtoh_async(device, at as *mut u8, src + off as u64, n, COPY_STREAM)
                }
                .map_err(|e| settle(device, k, e))?;
            }
            Ok(())
        })
    }

    /// Queues a copy of `bytes` bytes from host `src` to device address `dst`.
    ///
    /// # Safety
    /// `VirtualMemoryBackend::queue_copy_from_host`'s contract.
    pub(crate) unsafe fn host_to_device(
        &self,
        device: usize,
        dst: u64,
        src: *const u8,
        bytes: usize,
    ) -> Result<CopyTicket, BackendError> {
        let pieces = registered_pieces(src as usize, bytes)?;
        self.queue(device, || {
            for (k, &(at, n)) in pieces.iter().enumerate() {
                let off = at - src as usize;
                // SAFETY: the caller's contract: `src` is readable host memory until the copy
                // is waited for, `dst` is mapped device memory nothing uses meanwhile; each
                // piece lies inside both ranges.
                unsafe {
                    ffi::memcpy_htod_async(
                        device,
                        dst + off as u64,
                        at as *const u8,
                        n,
                        COPY_STREAM,
                    )
                }
                .map_err(|e| settle(device, k, e))?;
            }
            Ok(())
        })
    }

    /// Waits for every copy up to ticket `upto` and forgets their events.
    pub(crate) fn wait(&self, upto: CopyTicket) -> Result<(), BackendError> {
        let mut p = self.lock();
        let n = p.events.partition_point(|&(t, _)| t <= upto.0);
        if n == 0 {
            return Ok(());
        }
        // Copies run in order on one stream: the last event up to `upto` covers the others.
        p.events[n - 1].1.synchronize()?;
        p.events.drain(..n);
        Ok(())
    }
}
