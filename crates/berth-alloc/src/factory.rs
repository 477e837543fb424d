//! The one factory of device allocators: the policy a configuration selects, over a backend
//! (`Note [Policy without virtual memory]` in [`crate::policy`] for devices that cannot run it).

use std::sync::Arc;

use crate::allocator::DeviceAllocator;
use crate::backend::MemoryBackend;
use crate::caching::CachingAllocator;
use crate::config::AllocatorConfig;
use crate::error::AllocError;
use crate::paged::PagedBestFit;
use crate::policy::Policy;

/// The device allocator `config` selects ([`AllocatorConfig::policy`]) over `backend`, as a
/// trait object, with `device` as its index in messages and snapshots. The default policy
/// falls back to [`Policy::Pytorch`] on a backend without virtual memory (`Note [Policy
/// without virtual memory]`).
///
/// # Errors
/// [`AllocError::Unsupported`] when a chosen policy needs virtual memory (expandable segments,
/// paged) and `backend` has none; [`AllocError::Config`] for a configuration the policy refuses.
pub fn device_allocator<B: MemoryBackend + 'static>(
    backend: B,
    mut config: AllocatorConfig,
    device: i32,
) -> Result<Arc<dyn DeviceAllocator>, AllocError> {
    let mut policy = config.policy();
    if policy.needs_virtual_memory() && !config.policy_chosen() && backend.as_virtual().is_none() {
        policy = Policy::Pytorch;
    }
    let alloc: Arc<dyn DeviceAllocator> = match policy {
        Policy::Pytorch | Policy::Expandable => {
            config.expandable_segments = policy == Policy::Expandable;
            Arc::new(CachingAllocator::with_config(backend, config)?)
        }
        Policy::Paged => Arc::new(PagedBestFit::new(backend)?),
    };
    alloc.set_device_index(device);
    Ok(alloc)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::sim::SimBackend;
    use crate::backend::{DevicePtr, MemInfo, StreamId};
    use crate::error::BackendError;

    /// A simulated device without virtual-memory management.
    struct NoVirtual(SimBackend);

    impl MemoryBackend for NoVirtual {
        type Fence = <SimBackend as MemoryBackend>::Fence;
        fn malloc(&self, bytes: usize, stream: StreamId) -> Result<DevicePtr, BackendError> {
            self.0.malloc(bytes, stream)
        }
        unsafe fn free(
            &self,
            ptr: DevicePtr,
            bytes: usize,
            stream: StreamId,
        ) -> Result<(), BackendError> {
            // SAFETY: the caller's contract, passed on.
            unsafe { self.0.free(ptr, bytes, stream) }
        }
        fn mem_info(&self) -> Result<MemInfo, BackendError> {
            self.0.mem_info()
        }
        fn record_fence(&self, stream: StreamId) -> Result<Self::Fence, BackendError> {
            self.0.record_fence(stream)
        }
        fn query_fence(&self, event: &Self::Fence) -> Result<bool, BackendError> {
            self.0.query_fence(event)
        }
        fn sync_fence(&self, event: &Self::Fence) -> Result<(), BackendError> {
            self.0.sync_fence(event)
        }
    }

    #[test]
    fn the_factory_builds_each_policy() {
        for p in Policy::ALL {
            let a = device_allocator(SimBackend::new(1 << 30), p.config("").unwrap(), 3).unwrap();
            assert_eq!(a.policy_name(), p.name());
        }
        let a = device_allocator(SimBackend::new(1 << 30), AllocatorConfig::default(), 0).unwrap();
        assert_eq!(a.policy_name(), Policy::DEFAULT.name());
    }

    /// `Note [Policy without virtual memory]`: chosen, an error; by default, PyTorch's policy.
    #[test]
    fn without_virtual_memory_a_chosen_policy_errs_and_the_default_falls_back() {
        let plain = || NoVirtual(SimBackend::new(1 << 30));
        for p in [Policy::Expandable, Policy::Paged] {
            let r = device_allocator(plain(), p.config("").unwrap(), 0);
            assert!(
                matches!(r, Err(AllocError::Unsupported { .. })),
                "{p}: {:?}",
                r.map(|a| a.policy_name().to_owned())
            );
        }
        let from_options = AllocatorConfig::parse("expandable_segments:True").unwrap();
        assert!(device_allocator(plain(), from_options, 0).is_err());
        let a = device_allocator(plain(), AllocatorConfig::default(), 0).unwrap();
        assert_eq!(a.policy_name(), "pytorch");
        let a = device_allocator(plain(), Policy::Pytorch.config("").unwrap(), 0).unwrap();
        assert_eq!(a.policy_name(), "pytorch");
    }
}
