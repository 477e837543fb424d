//! What a replay does on one allocator, on the simulator or the GPU alike: the allocator of a
//! `--policy` row (built by berth's one factory), and [`PASSES`] passes of a compiled trace.

use std::sync::Arc;

use berth_alloc::replay::{CompiledTrace, ReplayError, ReplayReport};
use berth_alloc::{AllocatorConfig, DeviceAllocator, MemoryBackend, Policy};

/// `policy` over `backend`, built by berth's one factory. `conf` (`BERTH_ALLOC_CONF`'s) tunes
/// the PyTorch policy of the `pytorch` and `expandable` rows (`max_split_size_mb`,
/// `roundup_power2_divisions`, ...); which policy runs is the row's, whatever its `backend` and
/// `expandable_segments` say.
pub(crate) fn replay_allocator<B: MemoryBackend + 'static>(
    policy: Policy,
    backend: B,
    conf: &AllocatorConfig,
) -> anyhow::Result<Arc<dyn DeviceAllocator>> {
    let conf = AllocatorConfig {
        backend: Some(policy),
        expandable_segments: policy == Policy::Expandable,
        ..conf.clone()
    };
    Ok(berth_alloc::device_allocator(backend, conf, 0)?)
}

/// Passes over each trace on one allocator, as PyTorch's C++ replay makes: the first is cold,
/// the fastest of the others gives the warm `ns_per_op`.
pub(crate) const PASSES: usize = 3;

/// Runs [`PASSES`] passes of `trace` on `alloc`: returns the cold pass's report (memory and
/// device calls of a fresh allocator) and the warm passes'.
pub(crate) fn passes(
    trace: &CompiledTrace,
    alloc: &dyn DeviceAllocator,
) -> Result<(ReplayReport, Vec<ReplayReport>), ReplayError> {
    let cold = trace.replay(alloc)?;
    let warm = (1..PASSES)
        .map(|_| trace.replay(alloc))
        .collect::<Result<Vec<_>, _>>()?;
    Ok((cold, warm))
}

/// The warm figure: the fastest warm pass's ns per operation.
pub(crate) fn warm_ns(warm: &[ReplayReport]) -> f64 {
    warm.iter()
        .map(|r| r.ns_per_op)
        .fold(f64::INFINITY, f64::min)
}
