//! [`AllocatorPinnedHost`]: a [`PinnedHost`] over any pinned host allocator (berth's
//! `HostCachingAllocator` over CUDA, or over `SimHostBackend` in tests), and the default target.

use std::sync::Arc;

use berth::alloc::host::HostAllocator;
use berth::{DType, Layout, Storage, Tensor};

use crate::error::{DataError, Result};
use crate::pin::PinnedHost;

/// Pinned tensors from a [`HostAllocator`] (a `HostCachingAllocator<B>` for any backend).
pub struct AllocatorPinnedHost {
    name: String,
    alloc: Arc<dyn HostAllocator>,
}

impl std::fmt::Debug for AllocatorPinnedHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AllocatorPinnedHost")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl AllocatorPinnedHost {
    /// Pinned tensors from `alloc`, called `name` in messages.
    pub fn new(name: impl Into<String>, alloc: Arc<dyn HostAllocator>) -> Self {
        AllocatorPinnedHost {
            name: name.into(),
            alloc,
        }
    }

    /// The allocator.
    pub fn allocator(&self) -> &Arc<dyn HostAllocator> {
        &self.alloc
    }
}

impl PinnedHost for AllocatorPinnedHost {
    fn name(&self) -> &str {
        &self.name
    }

    fn empty_pinned(&self, shape: &[usize], dtype: DType) -> Result<Tensor> {
        let nbytes = shape.iter().product::<usize>() * dtype.size_in_bytes();
        let block = self
            .alloc
            .allocate(nbytes)
            .map_err(|source| DataError::Pin {
                host: self.name.clone(),
                source,
            })?;
        let storage = Storage::host_pinned(block);
        Ok(Tensor::from_parts(
            Arc::new(storage),
            Layout::contiguous(shape),
            dtype,
        )?)
    }

    fn is_pinned(&self, tensor: &Tensor) -> bool {
        // A block of this allocator is answered by its storage (`Storage::host_pinned`); the
        // lookup by address is for memory the storage cannot know about: pages registered
        // with the allocator's backend outside any block.
        tensor.is_pinned()
            || (tensor.device().is_cpu() && self.alloc.is_pinned(tensor.data_ptr() as *const u8))
    }
}

/// The CUDA pinned host allocator as a [`PinnedHost`].
#[derive(Debug)]
struct CudaPinnedHost;

impl PinnedHost for CudaPinnedHost {
    fn name(&self) -> &str {
        "cuda-host"
    }
    fn empty_pinned(&self, shape: &[usize], dtype: DType) -> Result<Tensor> {
        Ok(Tensor::empty_pinned(shape, dtype)?)
    }
}

/// berth's pinned host allocator when a CUDA device is present; `None` otherwise (then
/// `pin_memory = true` warns once and loads into ordinary memory).
pub(crate) fn default_pinned_host() -> Option<Arc<dyn PinnedHost>> {
    if berth::cuda::is_available() {
        Some(Arc::new(CudaPinnedHost))
    } else {
        None
    }
}
