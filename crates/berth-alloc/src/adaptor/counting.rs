//! [`Counting`]: counts the calls made to another backend (RMM's statistics adaptor, calls only).

use crate::sync::atomic::{AtomicU64, Ordering};

use crate::backend::{DevicePtr, MemInfo, MemoryBackend, StreamId, VirtualMemoryBackend};
use crate::error::BackendError;

/// Counts of calls through a [`Counting`] adaptor.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CallCounts {
    /// `malloc` calls.
    pub malloc: u64,
    /// `free` calls.
    pub free: u64,
    /// `map` calls.
    pub map: u64,
    /// `unmap` calls.
    pub unmap: u64,
    /// `record_fence` calls.
    pub record_fence: u64,
    /// Bytes currently allocated or mapped through the adaptor.
    pub live_bytes: u64,
}

impl CallCounts {
    /// Calls that create, map, unmap or free device memory.
    pub fn device_calls(&self) -> u64 {
        self.malloc + self.free + self.map + self.unmap
    }
}

#[derive(Debug, Default)]
struct Counters {
    malloc: AtomicU64,
    free: AtomicU64,
    map: AtomicU64,
    unmap: AtomicU64,
    record_fence: AtomicU64,
    live_bytes: AtomicU64,
}

/// Counts `malloc`, `free`, `map`, `unmap` and `record_fence` calls, and live bytes.
#[derive(Debug)]
pub struct Counting<B> {
    inner: B,
    c: Counters,
}

impl<B: MemoryBackend> Counting<B> {
    /// Wraps `inner`.
    pub fn new(inner: B) -> Self {
        Counting {
            inner,
            c: Counters::default(),
        }
    }

    /// The counts so far.
    pub fn counts(&self) -> CallCounts {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        CallCounts {
            malloc: l(&self.c.malloc),
            free: l(&self.c.free),
            map: l(&self.c.map),
            unmap: l(&self.c.unmap),
            record_fence: l(&self.c.record_fence),
            live_bytes: l(&self.c.live_bytes),
        }
    }

    /// The wrapped backend.
    pub fn inner(&self) -> &B {
        &self.inner
    }
}

impl<B: MemoryBackend> MemoryBackend for Counting<B> {
    type Fence = B::Fence;

    fn malloc(&self, bytes: usize, stream: StreamId) -> Result<DevicePtr, BackendError> {
        self.c.malloc.fetch_add(1, Ordering::Relaxed);
        let p = self.inner.malloc(bytes, stream)?;
        self.c.live_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
        Ok(p)
    }

    unsafe fn free(
        &self,
        ptr: DevicePtr,
        bytes: usize,
        stream: StreamId,
    ) -> Result<(), BackendError> {
        self.c.free.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded unchanged; the caller upholds `MemoryBackend::free`'s contract.
        unsafe { self.inner.free(ptr, bytes, stream) }?;
        self.c.live_bytes.fetch_sub(bytes as u64, Ordering::Relaxed);
        Ok(())
    }

    fn mem_info(&self) -> Result<MemInfo, BackendError> {
        self.inner.mem_info()
    }

    fn record_fence(&self, stream: StreamId) -> Result<Self::Fence, BackendError> {
        self.c.record_fence.fetch_add(1, Ordering::Relaxed);
        self.inner.record_fence(stream)
    }

    forward_events_to_inner!();
}

impl<B: MemoryBackend> VirtualMemoryBackend for Counting<B> {
    forward_vm_to_inner!();

    fn map(&self, addr: DevicePtr, bytes: usize, stream: StreamId) -> Result<(), BackendError> {
        let vm = self.inner.as_virtual().ok_or_else(super::no_vm)?;
        self.c.map.fetch_add(1, Ordering::Relaxed);
        vm.map(addr, bytes, stream)?;
        self.c.live_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
        Ok(())
    }

    fn map_pages(
        &self,
        addr: DevicePtr,
        page_bytes: usize,
        count: usize,
        stream: StreamId,
    ) -> Result<(), BackendError> {
        let vm = self.inner.as_virtual().ok_or_else(super::no_vm)?;
        self.c.map.fetch_add(count as u64, Ordering::Relaxed);
        vm.map_pages(addr, page_bytes, count, stream)?;
        let bytes = (page_bytes as u64).saturating_mul(count as u64);
        self.c.live_bytes.fetch_add(bytes, Ordering::Relaxed);
        Ok(())
    }

    unsafe fn unmap(
        &self,
        addr: DevicePtr,
        bytes: usize,
        stream: StreamId,
    ) -> Result<(), BackendError> {
        let vm = self.inner.as_virtual().ok_or_else(super::no_vm)?;
        self.c.unmap.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded unchanged; the caller upholds `unmap`'s contract.
        unsafe { vm.unmap(addr, bytes, stream) }?;
        self.c.live_bytes.fetch_sub(bytes as u64, Ordering::Relaxed);
        Ok(())
    }
}
