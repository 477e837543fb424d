//! A simulated pinned host (berth-alloc's `HostCachingAllocator` over `SimHostBackend`) that
//! counts the pinned buffers it hands out.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use berth::alloc::host::{HostCachingAllocator, SimHostBackend};
use berth::{DType, Tensor};
use berth_data::{AllocatorPinnedHost, PinTarget, PinnedHost};

#[derive(Debug)]
pub struct SimPinned {
    inner: AllocatorPinnedHost,
    pub buffers: AtomicUsize,
}

impl PinnedHost for SimPinned {
    fn name(&self) -> &str {
        "sim-pinned"
    }
    fn empty_pinned(&self, shape: &[usize], dtype: DType) -> berth_data::Result<Tensor> {
        self.buffers.fetch_add(1, Ordering::SeqCst);
        self.inner.empty_pinned(shape, dtype)
    }
}

/// A simulated pinned target with 256 MiB of pinnable memory.
pub fn sim_pinned() -> (PinTarget, Arc<SimPinned>) {
    let alloc = Arc::new(HostCachingAllocator::new(SimHostBackend::new(256 << 20)));
    let host = Arc::new(SimPinned {
        inner: AllocatorPinnedHost::new("sim-pinned", alloc),
        buffers: AtomicUsize::new(0),
    });
    (PinTarget::new(host.clone()), host)
}
