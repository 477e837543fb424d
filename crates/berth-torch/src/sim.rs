//! The test-only switch: simulated devices instead of CUDA, so that the exported C functions
//! can be exercised on a machine without a GPU (CI) exactly as PyTorch calls them.
//!
//! [`SharedSim`] is a [`SimBackend`] behind an `Arc`, so that the installed allocator and the
//! test that drives its events (`berth_torch_sim_complete_events`) see the same device.

use berth_alloc::backend::sim::SimBackend;
use berth_alloc::{
    BackendError, DevicePtr, MemInfo, MemoryBackend, StreamId, VirtualMemoryBackend,
};
use std::sync::Arc;

/// A simulated device shared between the allocator that owns it and the test driving it.
#[derive(Clone, Debug)]
pub struct SharedSim(pub Arc<SimBackend>);

impl MemoryBackend for SharedSim {
    type Event = <SimBackend as MemoryBackend>::Event;

    fn malloc(&self, bytes: usize, stream: StreamId) -> Result<DevicePtr, BackendError> {
        self.0.malloc(bytes, stream)
    }

    unsafe fn free(
        &self,
        ptr: DevicePtr,
        bytes: usize,
        stream: StreamId,
    ) -> Result<(), BackendError> {
        // SAFETY: the caller's contract, passed on unchanged.
        unsafe { self.0.free(ptr, bytes, stream) }
    }

    fn mem_info(&self) -> Result<MemInfo, BackendError> {
        self.0.mem_info()
    }

    fn record_event(&self, stream: StreamId) -> Result<Self::Event, BackendError> {
        self.0.record_event(stream)
    }

    fn query_event(&self, event: &Self::Event) -> Result<bool, BackendError> {
        self.0.query_event(event)
    }

    fn sync_event(&self, event: &Self::Event) -> Result<(), BackendError> {
        self.0.sync_event(event)
    }

    fn alignment(&self) -> usize {
        self.0.alignment()
    }

    fn as_virtual(&self) -> Option<&dyn VirtualMemoryBackend> {
        self.0.as_virtual()
    }
}
