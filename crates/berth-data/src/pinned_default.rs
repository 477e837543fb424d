//! The default pinned host memory source: berth's pinned host caching allocator, when CUDA is
//! available.

use std::sync::Arc;

use crate::pin::PinnedHost;

/// berth's pinned host allocator when a CUDA device is present; `None` otherwise (then
/// `pin_memory = true` warns once and loads into ordinary memory).
pub(crate) fn default_pinned_host() -> Option<Arc<dyn PinnedHost>> {
    None
}
