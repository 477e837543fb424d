//! [`FaultInject`]: fails chosen `malloc` / `map` calls of another backend with OOM.

use crate::sync::atomic::{AtomicU64, Ordering};

use crate::backend::{DevicePtr, MemInfo, MemoryBackend, StreamId, VirtualMemoryBackend};
use crate::error::BackendError;

/// Fails the `n`-th allocating call (`malloc` or `map`, 1-based, counted through this adaptor)
/// with [`BackendError::OutOfMemory`], and optionally every later one too.
#[derive(Debug)]
pub struct FaultInject<B> {
    inner: B,
    calls: AtomicU64,
    fail_at: AtomicU64,
    sticky: bool,
}

impl<B: MemoryBackend> FaultInject<B> {
    /// Wraps `inner`; nothing fails until [`FaultInject::fail_at`] is called.
    pub fn new(inner: B) -> Self {
        FaultInject {
            inner,
            calls: AtomicU64::new(0),
            fail_at: AtomicU64::new(u64::MAX),
            sticky: false,
        }
    }

    /// Wraps `inner` and fails its `n`-th allocating call.
    pub fn failing_at(inner: B, n: u64) -> Self {
        let f = FaultInject::new(inner);
        f.fail_at(n);
        f
    }

    /// Keeps failing every allocating call from the `n`-th on (a full device).
    pub fn sticky(mut self) -> Self {
        self.sticky = true;
        self
    }

    /// Fails the `n`-th allocating call, counted from this adaptor's creation.
    pub fn fail_at(&self, n: u64) {
        self.fail_at.store(n, Ordering::Relaxed);
    }

    /// Allocating calls seen so far.
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    /// The wrapped backend.
    pub fn inner(&self) -> &B {
        &self.inner
    }

    fn check(&self, op: &'static str, bytes: usize) -> Result<(), BackendError> {
        let n = self.calls.fetch_add(1, Ordering::AcqRel) + 1;
        let at = self.fail_at.load(Ordering::Relaxed);
        if n == at || (self.sticky && n >= at) {
            return Err(BackendError::OutOfMemory {
                op,
                bytes: bytes as u64,
            });
        }
        Ok(())
    }
}

impl<B: MemoryBackend> MemoryBackend for FaultInject<B> {
    type Fence = B::Fence;

    fn malloc(&self, bytes: usize, stream: StreamId) -> Result<DevicePtr, BackendError> {
        self.check("malloc", bytes)?;
        self.inner.malloc(bytes, stream)
    }

    unsafe fn free(
        &self,
        ptr: DevicePtr,
        bytes: usize,
        stream: StreamId,
    ) -> Result<(), BackendError> {
        // SAFETY: forwarded unchanged; the caller upholds `MemoryBackend::free`'s contract.
        unsafe { self.inner.free(ptr, bytes, stream) }
    }

    fn mem_info(&self) -> Result<MemInfo, BackendError> {
        self.inner.mem_info()
    }

    fn record_fence(&self, stream: StreamId) -> Result<Self::Fence, BackendError> {
        self.inner.record_fence(stream)
    }

    forward_events_to_inner!();
}

impl<B: MemoryBackend> VirtualMemoryBackend for FaultInject<B> {
    forward_vm_to_inner!();

    fn map(&self, addr: DevicePtr, bytes: usize, stream: StreamId) -> Result<(), BackendError> {
        let vm = self.inner.as_virtual().ok_or_else(super::no_vm)?;
        self.check("map", bytes)?;
        vm.map(addr, bytes, stream)
    }

    unsafe fn unmap(
        &self,
        addr: DevicePtr,
        bytes: usize,
        stream: StreamId,
    ) -> Result<(), BackendError> {
        let vm = self.inner.as_virtual().ok_or_else(super::no_vm)?;
        // SAFETY: forwarded unchanged; the caller upholds `unmap`'s contract.
        unsafe { vm.unmap(addr, bytes, stream) }
    }
}
