//! Expandable segments' bookkeeping does not grow with one request's size (newcomer defect 4:
//! a two-row trace allocating 64 PiB under `--capacity 64PiB` was killed by the OOM killer, the
//! simulator recording each of 3.4·10⁹ pages of 20 MiB), and the simulator unmaps any run of
//! whole pages of such a mapping, as the CUDA driver unmaps any union of page handles.

use std::sync::Arc;

use berth_alloc::backend::sim::{SimBackend, MAX_SIM_CAPACITY};
use berth_alloc::backend::{DevicePtr, StreamId, VirtualMemoryBackend};
use berth_alloc::caching::CachingAllocator;
use berth_alloc::error::BackendError;
use berth_alloc::{AllocatorConfig, DeviceAllocator};

#[test]
fn a_request_of_petabytes_maps_its_pages_in_one_entry() {
    let sim = Arc::new(SimBackend::new(MAX_SIM_CAPACITY).with_events_completing_immediately());
    let cfg = AllocatorConfig::parse("expandable_segments:True").unwrap();
    let alloc = CachingAllocator::with_config(Arc::clone(&sim), cfg).unwrap();
    let t0 = std::time::Instant::now();
    // The reproducer's request: 64 PiB less a page (the context takes some of the device).
    let bytes = (MAX_SIM_CAPACITY - (1 << 30)) as usize;
    let a = alloc.allocate(bytes, StreamId::DEFAULT).unwrap();
    let page = 20u64 << 20;
    let pages = (bytes as u64).div_ceil(page);
    assert_eq!(
        sim.live_mappings() as u64,
        pages,
        "each page its own mapping"
    );
    assert_eq!(sim.mapping_entries(), 1, "recorded as one run");
    assert_eq!(sim.counts().map, pages);
    assert_eq!(
        alloc.stats().reserved_bytes.all().current as u64,
        pages * page
    );
    drop(a);
    alloc.empty_cache().unwrap();
    assert_eq!(sim.used_bytes(), 0);
    assert_eq!(sim.mapping_entries(), 0);
    assert!(
        t0.elapsed() < std::time::Duration::from_secs(5),
        "{:?}",
        t0.elapsed()
    );
}

#[test]
fn a_run_of_pages_unmaps_at_page_boundaries_only() {
    const P: u64 = 2 << 20;
    let sim = SimBackend::new(1 << 30);
    let base = sim.reserve((16 * P) as usize).unwrap();
    let at = |k: u64| DevicePtr(base.0 + k * P);
    sim.map_pages(at(0), P as usize, 8, StreamId::DEFAULT)
        .unwrap();
    assert_eq!((sim.live_mappings(), sim.mapping_entries()), (8, 1));
    // SAFETY: whole pages mapped above; nothing uses them.
    unsafe { sim.unmap(at(2), (3 * P) as usize, StreamId::DEFAULT) }.unwrap();
    assert_eq!(
        sim.mappings(),
        vec![(at(0), P), (at(1), P), (at(5), P), (at(6), P), (at(7), P)]
    );
    assert_eq!((sim.live_mappings(), sim.mapping_entries()), (5, 2));
    assert_eq!(sim.used_bytes(), 5 * P);
    // A mapping made by one `map` call is still unmapped only whole.
    sim.map(at(10), (2 * P) as usize, StreamId::DEFAULT)
        .unwrap();
    // SAFETY: whole pages mapped above; nothing uses them.
    let e = unsafe { sim.unmap(at(10), P as usize, StreamId::DEFAULT) }.unwrap_err();
    assert!(matches!(e, BackendError::SplitsMapping { .. }), "{e:?}");
    assert_eq!(sim.used_bytes(), 7 * P);
    // SAFETY: whole pages mapped above; nothing uses them.
    unsafe { sim.unmap(at(10), (2 * P) as usize, StreamId::DEFAULT) }.unwrap();
    // The tail of one run and the head of nothing else: fine.
    // SAFETY: whole pages mapped above; nothing uses them.
    unsafe { sim.unmap(at(6), (2 * P) as usize, StreamId::DEFAULT) }.unwrap();
    // SAFETY: whole pages mapped above; nothing uses them.
    unsafe { sim.unmap(at(0), (2 * P) as usize, StreamId::DEFAULT) }.unwrap();
    // SAFETY: whole pages mapped above; nothing uses them.
    unsafe { sim.unmap(at(5), P as usize, StreamId::DEFAULT) }.unwrap();
    assert_eq!((sim.used_bytes(), sim.mapping_entries()), (0, 0));
}

#[test]
fn running_out_of_address_space_is_a_backend_error_not_out_of_memory() {
    // Newcomer defect 10: at 64 PiB, the 57th stream's reservation found no address range
    // left, and expandable segments said "CUDA out of memory ... of which 67108863.89 GiB is
    // free" while paged said "backend failure". Both say the reservation failed now.
    let sim = Arc::new(SimBackend::new(MAX_SIM_CAPACITY).with_events_completing_immediately());
    let cfg = AllocatorConfig::parse("expandable_segments:True").unwrap();
    let alloc = CachingAllocator::with_config(Arc::clone(&sim), cfg).unwrap();
    let mut live = Vec::new();
    let err = (0..64u64)
        .find_map(|s| match alloc.allocate(512, StreamId(s)) {
            Ok(a) => {
                live.push(a);
                None
            }
            Err(e) => Some((s, e)),
        })
        .expect("64 reservations of 72 PiB do not fit in 2^62 bytes");
    // 2^62 − 2^40 bytes hold 56 reservations of 9/8 × 64 PiB (plus gaps).
    assert_eq!(err.0, 56);
    assert!(!err.1.is_out_of_memory(), "{}", err.1);
    assert!(
        matches!(
            &err.1,
            berth_alloc::AllocError::Backend {
                stream: StreamId(56),
                source: BackendError::OutOfMemory { op: "reserve", .. }
            }
        ),
        "{:?}",
        err.1
    );
    assert!(err.1.to_string().contains("reserve of"), "{}", err.1);
}
