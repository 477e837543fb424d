//! Where pinned batches live: [`PinnedHost`], a source of page-locked host tensors, and
//! [`PinTarget`], the shared handle a loader pins into.
//!
//! This file declares the interface only. Whether and where a loader pins is decided in one
//! place, `src/pinning.rs` (Note [Where pinning is decided]); the pinned sources are in
//! `src/pinned_default.rs` ([`AllocatorPinnedHost`](crate::AllocatorPinnedHost) and the CUDA
//! default).

use std::sync::Arc;

use crate::error::Result;

/// A source of page-locked host buffers: berth's pinned host caching allocator on a CUDA machine,
/// or a simulated pinned backend in tests.
pub trait PinnedHost: Send + Sync + std::fmt::Debug {
    /// A short name for messages, e.g. `"cuda-host"` or `"sim-pinned"`.
    fn name(&self) -> &str;

    /// A contiguous CPU tensor of `shape` and `dtype` whose storage is page-locked; its contents
    /// are unspecified (every collate overwrites them).
    ///
    /// # Errors
    /// The allocator's out-of-memory or backend error.
    fn empty_pinned(&self, shape: &[usize], dtype: berth::DType) -> Result<berth::Tensor>;

    /// Whether `tensor`'s storage is page-locked memory this source knows (the default asks
    /// the storage: [`berth::Tensor::is_pinned`]).
    fn is_pinned(&self, tensor: &berth::Tensor) -> bool {
        tensor.is_pinned()
    }
}

/// Where `pin_memory` puts batches: a shared handle to a [`PinnedHost`].
#[derive(Debug, Clone)]
pub struct PinTarget {
    host: Arc<dyn PinnedHost>,
}

impl PinTarget {
    /// A target over `host`.
    pub fn new(host: Arc<dyn PinnedHost>) -> Self {
        PinTarget { host }
    }

    /// The pinned memory source.
    pub fn host(&self) -> &Arc<dyn PinnedHost> {
        &self.host
    }
}
