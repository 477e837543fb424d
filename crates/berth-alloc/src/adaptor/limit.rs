//! [`Limit`]: a byte cap over another backend (RMM's `limiting_resource_adaptor`).

use crate::sync::atomic::{AtomicU64, Ordering};

use crate::backend::{DevicePtr, MemInfo, MemoryBackend, StreamId, VirtualMemoryBackend};
use crate::error::BackendError;

/// Caps the bytes allocated (segments plus mapped pages) through it at `limit`; beyond it,
/// `malloc` and `map` fail with [`BackendError::OutOfMemory`]. `mem_info` reports the cap as the
/// total.
#[derive(Debug)]
pub struct Limit<B> {
    inner: B,
    limit: u64,
    used: AtomicU64,
}

impl<B: MemoryBackend> Limit<B> {
    /// Wraps `inner` with a cap of `limit` bytes.
    pub fn new(inner: B, limit: u64) -> Self {
        Limit {
            inner,
            limit,
            used: AtomicU64::new(0),
        }
    }

    /// The wrapped backend.
    pub fn inner(&self) -> &B {
        &self.inner
    }

    /// Bytes allocated through this adaptor now.
    pub fn used_bytes(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    fn charge(&self, bytes: u64, op: &'static str) -> Result<(), BackendError> {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                u.checked_add(bytes).filter(|&n| n <= self.limit)
            })
            .map(|_| ())
            .map_err(|_| BackendError::OutOfMemory { op, bytes })
    }

    fn refund(&self, bytes: u64) {
        self.used.fetch_sub(bytes, Ordering::AcqRel);
    }
}

impl<B: MemoryBackend> MemoryBackend for Limit<B> {
    type Fence = B::Fence;

    fn malloc(&self, bytes: usize, stream: StreamId) -> Result<DevicePtr, BackendError> {
        self.charge(bytes as u64, "malloc")?;
        self.inner
            .malloc(bytes, stream)
            .inspect_err(|_| self.refund(bytes as u64))
    }

    unsafe fn free(
        &self,
        ptr: DevicePtr,
        bytes: usize,
        stream: StreamId,
    ) -> Result<(), BackendError> {
        // SAFETY: forwarded unchanged; the caller upholds `MemoryBackend::free`'s contract.
        unsafe { self.inner.free(ptr, bytes, stream) }?;
        self.refund(bytes as u64);
        Ok(())
    }

    fn mem_info(&self) -> Result<MemInfo, BackendError> {
        let info = self.inner.mem_info()?;
        let total = info.total_bytes.min(self.limit);
        let free = info
            .free_bytes
            .min(self.limit.saturating_sub(self.used_bytes()));
        Ok(MemInfo {
            free_bytes: free,
            total_bytes: total,
        })
    }

    fn record_fence(&self, stream: StreamId) -> Result<Self::Fence, BackendError> {
        self.inner.record_fence(stream)
    }

    forward_events_to_inner!();
}

impl<B: MemoryBackend> VirtualMemoryBackend for Limit<B> {
    forward_vm_to_inner!();

    fn map(&self, addr: DevicePtr, bytes: usize, stream: StreamId) -> Result<(), BackendError> {
        let vm = self.inner.as_virtual().ok_or_else(super::no_vm)?;
        self.charge(bytes as u64, "map")?;
        vm.map(addr, bytes, stream)
            .inspect_err(|_| self.refund(bytes as u64))
    }

    fn map_pages(
        &self,
        addr: DevicePtr,
        page_bytes: usize,
        count: usize,
        stream: StreamId,
    ) -> Result<(), BackendError> {
        let vm = self.inner.as_virtual().ok_or_else(super::no_vm)?;
        let bytes = (page_bytes as u64).saturating_mul(count as u64);
        self.charge(bytes, "map")?;
        vm.map_pages(addr, page_bytes, count, stream)
            .inspect_err(|_| self.refund(bytes))
    }

    unsafe fn unmap(
        &self,
        addr: DevicePtr,
        bytes: usize,
        stream: StreamId,
    ) -> Result<(), BackendError> {
        let vm = self.inner.as_virtual().ok_or_else(super::no_vm)?;
        // SAFETY: forwarded unchanged; the caller upholds `unmap`'s contract.
        unsafe { vm.unmap(addr, bytes, stream) }?;
        self.refund(bytes as u64);
        Ok(())
    }
}
