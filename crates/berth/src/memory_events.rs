//! Host memory events: where a storage reports that it allocated or freed host memory, for a
//! listener above it (the profiler) that the storage does not import.
//!
//! Note [Memory events are a leaf]: [`crate::storage`] sits below the profiler (the profiler
//! reads [`host_memory_allocated`](crate::storage::host_memory_allocated) when it starts), so
//! a storage cannot call the profiler without an import loop. It reports to this module
//! instead, which imports nothing of berth: one flag, clear unless someone listens, and one
//! listener slot. The profiler fills the slot when it starts with `profile_memory` and sets
//! the flag, and clears the flag when it stops. With the flag clear a report is one relaxed
//! load, as every other check of a profiler that is off (`Note [Profiler off costs one load]`
//! in [`crate::profiler`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

/// What hears of host memory: `alloc` (else a free) of `bytes` bytes, with
/// `allocated_bytes` the host bytes held by live storages right after.
pub(crate) type HostMemoryListener = fn(alloc: bool, bytes: usize, allocated_bytes: usize);

/// Whether reports go to the listener: the one load a report costs when nobody listens.
static LISTENING: AtomicBool = AtomicBool::new(false);

/// The listener, installed once per process (the profiler is its only one).
static LISTENER: OnceLock<HostMemoryListener> = OnceLock::new();

/// Sends the reports to `listener` from now on, until [`stop`]. The first listener installed
/// stays for the life of the process: later calls turn reports back on for it.
pub(crate) fn listen(listener: HostMemoryListener) {
    LISTENER.get_or_init(|| listener);
    LISTENING.store(true, Ordering::SeqCst);
}

/// Stops sending reports (the listener stays installed for the next [`listen`]).
pub(crate) fn stop() {
    LISTENING.store(false, Ordering::SeqCst);
}

/// A host storage of `bytes` bytes was allocated (`alloc`) or freed; `allocated_bytes` is
/// [`host_memory_allocated`](crate::storage::host_memory_allocated) right after. One relaxed
/// load when nobody listens.
#[inline(always)]
pub(crate) fn host_memory(alloc: bool, bytes: usize, allocated_bytes: usize) {
    if LISTENING.load(Ordering::Relaxed) {
        if let Some(listener) = LISTENER.get() {
            listener(alloc, bytes, allocated_bytes);
        }
    }
}
