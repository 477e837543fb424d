//! Backends that wrap a backend and are backends themselves (RMM's resource adaptors).
//!
//! Compose them: `Limit::new(FaultInject::new(SimBackend::new(cap)), 3 << 30)` is "a 3 GiB GPU
//! that fails on the Nth cudaMalloc". Each forwards the virtual-memory capability of the backend
//! it wraps, applying its own rule to `map` as to `malloc`.

/// The `MemoryBackend` methods every adaptor passes straight to its `inner` backend
/// (`query_fence`, `sync_fence`, `alignment`), and `as_virtual`, which exposes the adaptor
/// itself as the virtual-memory backend when `inner` has one.
macro_rules! forward_events_to_inner {
    () => {
        fn query_fence(&self, event: &Self::Fence) -> Result<bool, BackendError> {
            self.inner.query_fence(event)
        }

        fn sync_fence(&self, event: &Self::Fence) -> Result<(), BackendError> {
            self.inner.sync_fence(event)
        }

        fn alignment(&self) -> usize {
            self.inner.alignment()
        }

        fn as_virtual(&self) -> Option<&dyn VirtualMemoryBackend> {
            self.inner
                .as_virtual()
                .map(|_| self as &dyn VirtualMemoryBackend)
        }
    };
}

/// The `VirtualMemoryBackend` methods every adaptor passes unchanged to its `inner` backend's
/// virtual memory (`granularity`, `reserve`, `release`); each adaptor writes its own
/// `map` and `unmap`, where its rule applies.
macro_rules! forward_vm_to_inner {
    () => {
        fn granularity(&self) -> usize {
            self.inner.as_virtual().map_or(1, |v| v.granularity())
        }

        fn reserve(&self, bytes: usize) -> Result<DevicePtr, BackendError> {
            self.inner
                .as_virtual()
                .ok_or_else(super::no_vm)?
                .reserve(bytes)
        }

        unsafe fn release(&self, base: DevicePtr, bytes: usize) -> Result<(), BackendError> {
            let vm = self.inner.as_virtual().ok_or_else(super::no_vm)?;
            // SAFETY: forwarded unchanged; the caller upholds `release`'s contract.
            unsafe { vm.release(base, bytes) }
        }

        unsafe fn copy_to_host(
            &self,
            src: DevicePtr,
            dst: std::ptr::NonNull<u8>,
            bytes: usize,
        ) -> Result<(), BackendError> {
            let vm = self.inner.as_virtual().ok_or_else(super::no_vm)?;
            // SAFETY: forwarded unchanged; the caller upholds `copy_to_host`'s contract.
            unsafe { vm.copy_to_host(src, dst, bytes) }
        }

        unsafe fn copy_from_host(
            &self,
            dst: DevicePtr,
            src: std::ptr::NonNull<u8>,
            bytes: usize,
        ) -> Result<(), BackendError> {
            let vm = self.inner.as_virtual().ok_or_else(super::no_vm)?;
            // SAFETY: forwarded unchanged; the caller upholds `copy_from_host`'s contract.
            unsafe { vm.copy_from_host(dst, src, bytes) }
        }

        unsafe fn queue_copy_to_host(
            &self,
            src: DevicePtr,
            dst: std::ptr::NonNull<u8>,
            bytes: usize,
        ) -> Result<crate::backend::CopyTicket, BackendError> {
            let vm = self.inner.as_virtual().ok_or_else(super::no_vm)?;
            // SAFETY: forwarded unchanged; the caller upholds the contract.
            unsafe { vm.queue_copy_to_host(src, dst, bytes) }
        }

        unsafe fn queue_copy_from_host(
            &self,
            dst: DevicePtr,
            src: std::ptr::NonNull<u8>,
            bytes: usize,
        ) -> Result<crate::backend::CopyTicket, BackendError> {
            let vm = self.inner.as_virtual().ok_or_else(super::no_vm)?;
            // SAFETY: forwarded unchanged; the caller upholds the contract.
            unsafe { vm.queue_copy_from_host(dst, src, bytes) }
        }

        fn wait_copies(&self, upto: crate::backend::CopyTicket) -> Result<(), BackendError> {
            self.inner
                .as_virtual()
                .ok_or_else(super::no_vm)?
                .wait_copies(upto)
        }
    };
}

/// The error of a virtual-memory call on an adaptor whose inner backend has none.
fn no_vm() -> crate::error::BackendError {
    crate::error::BackendError::Other {
        op: "virtual memory",
        message: "the wrapped backend has no virtual-memory support".into(),
    }
}

mod counting;
mod fault;
mod limit;

pub use counting::{CallCounts, Counting};
pub use fault::FaultInject;
pub use limit::Limit;
