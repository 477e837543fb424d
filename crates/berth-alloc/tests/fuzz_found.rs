//! Inputs the fuzz targets of `fuzz/` found (`fuzz/README.md`), each replayed as the target
//! ran it.

use berth_alloc::backend::sim::SimBackend;
use berth_alloc::replay::CompiledTrace;
use berth_alloc::trace::parse_trace;
use berth_alloc::{DeviceAllocator, PagedBestFit, StreamId};

/// `trace_json` (artifact `oom-37c2c440`): one `alloc` of 92233720368547716 bytes (about
/// 2^56) replayed on `paged` over a 64 MiB device cut the request into 1.4e9 mapping units
/// before its first map call, a 22 GB list. A request larger than the device is now refused
/// before any map call, and the units are cut lazily.
#[test]
fn paged_refuses_a_request_larger_than_the_device_before_mapping() {
    let trace = parse_trace(br#"{"events":[["alloc",1,92233720368547716,0,1]]}"#).unwrap();
    for capacity in [64 << 20, 4 << 30] {
        let alloc = PagedBestFit::new(SimBackend::new(capacity)).unwrap();
        let err = CompiledTrace::new(&trace.events)
            .replay(&alloc)
            .unwrap_err();
        assert!(err.source.is_out_of_memory(), "{}", err.source);
        assert_eq!(
            alloc.backend().counts().map,
            0,
            "no map call for an impossible request"
        );
        // Still usable: a request that fits is served.
        let p = alloc.raw_alloc(1 << 20, StreamId::DEFAULT).unwrap();
        alloc.raw_delete(p).unwrap();
    }
}

/// `abi_paged` (artifact `crash-30fcc692`): `record_stream` of the pointer `0xffff_ffff_ffff_ffff`
/// succeeded on `paged`, and its `raw_delete` removed a free slot of the live-block table: the
/// table's empty-slot marker was found as a key. Both policies that keep blocks in that table
/// now answer `InvalidPointer` and change nothing.
#[test]
fn the_all_ones_pointer_is_unknown_to_every_policy() {
    use berth_alloc::caching::CachingAllocator;
    use berth_alloc::{AllocError, DevicePtr};
    let ones = DevicePtr(u64::MAX);
    let policies: [Box<dyn DeviceAllocator>; 2] = [
        Box::new(PagedBestFit::new(SimBackend::new(1 << 30)).unwrap()),
        Box::new(CachingAllocator::new(SimBackend::new(1 << 30))),
    ];
    for alloc in policies {
        let name = alloc.policy_name().to_owned();
        let p = alloc.raw_alloc(4096, StreamId::DEFAULT).unwrap();
        let before = alloc.stats();
        assert_eq!(
            alloc.raw_record_stream(ones, StreamId(0x10)),
            Err(AllocError::InvalidPointer { ptr: ones }),
            "{name}"
        );
        assert!(
            matches!(
                alloc.raw_delete(ones),
                Err(AllocError::InvalidPointer { .. } | AllocError::DoubleFree { .. })
            ),
            "{name}"
        );
        assert_eq!(alloc.stats(), before, "{name}: nothing changed");
        alloc.raw_delete(p).unwrap();
        assert_eq!(alloc.stats().memory_allocated(), 0, "{name}");
    }
}
