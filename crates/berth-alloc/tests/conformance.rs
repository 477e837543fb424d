//! The conformance suite on `SimBackend` and on adaptor stacks.

use std::sync::Arc;

use berth_alloc::adaptor::{Counting, FaultInject, Limit};
use berth_alloc::backend::sim::SimBackend;
use berth_alloc::caching::CachingAllocator;
use berth_alloc::{testing, AllocatorConfig, DeviceAllocator};

#[test]
fn caching_on_sim() {
    testing::conformance(&|cap| {
        Arc::new(CachingAllocator::new(SimBackend::new(cap))) as Arc<dyn DeviceAllocator>
    });
}

/// berth's own policy passes the same suite (including `allocated_and_reserved` against
/// `stats`).
#[test]
fn paged_on_sim() {
    testing::conformance(&|cap| {
        Arc::new(berth_alloc::PagedBestFit::new(SimBackend::new(cap)).unwrap())
            as Arc<dyn DeviceAllocator>
    });
}

#[test]
fn caching_expandable_on_sim() {
    testing::conformance(&|cap| {
        let cfg = AllocatorConfig::parse("expandable_segments:True").unwrap();
        Arc::new(CachingAllocator::with_config(SimBackend::new(cap), cfg).unwrap())
            as Arc<dyn DeviceAllocator>
    });
}

#[test]
fn caching_max_split_on_sim() {
    testing::conformance(&|cap| {
        let cfg =
            AllocatorConfig::parse("max_split_size_mb:20,roundup_power2_divisions:4").unwrap();
        Arc::new(CachingAllocator::with_config(SimBackend::new(cap), cfg).unwrap())
            as Arc<dyn DeviceAllocator>
    });
}

#[test]
fn caching_on_adaptor_stack() {
    // A device twice as large, capped by `Limit` to the capacity asked for, with counting and
    // a fault injector that never fires.
    testing::conformance(&|cap| {
        let backend = Counting::new(Limit::new(FaultInject::new(SimBackend::new(2 * cap)), cap));
        Arc::new(CachingAllocator::new(backend)) as Arc<dyn DeviceAllocator>
    });
}

#[test]
fn caching_expandable_on_adaptor_stack() {
    testing::conformance(&|cap| {
        let backend = Limit::new(Counting::new(SimBackend::new(2 * cap)), cap);
        let cfg = AllocatorConfig::parse("expandable_segments:True").unwrap();
        Arc::new(CachingAllocator::with_config(backend, cfg).unwrap()) as Arc<dyn DeviceAllocator>
    });
}

#[test]
fn counting_sees_every_segment_call() {
    let alloc = CachingAllocator::new(Counting::new(SimBackend::new(1 << 30)));
    let a = alloc
        .allocate(5 << 20, berth_alloc::StreamId::DEFAULT)
        .unwrap();
    let b = alloc.allocate(100, berth_alloc::StreamId::DEFAULT).unwrap();
    drop((a, b));
    alloc.empty_cache().unwrap();
    let c = alloc.backend().counts();
    assert_eq!((c.malloc, c.free, c.live_bytes), (2, 2, 0));
    assert_eq!(
        c.device_calls() as i64,
        alloc.stats().num_device_alloc + alloc.stats().num_device_free
    );
}
