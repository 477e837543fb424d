//! PyTorch's policy rules one by one: oversize blocks, power-of-two rounding, garbage
//! collection, expandable segments, memory summary layout.

use berth_alloc::backend::sim::SimBackend;
use berth_alloc::caching::CachingAllocator;
use berth_alloc::{AllocatorConfig, DeviceAllocator, StreamId};

use crate::util::MIB;

const S0: StreamId = StreamId::DEFAULT;

fn with(conf: &str, capacity: u64) -> CachingAllocator<SimBackend> {
    CachingAllocator::with_config(
        SimBackend::new(capacity),
        AllocatorConfig::parse(conf).unwrap(),
    )
    .unwrap()
}

#[test]
fn oversize_blocks_are_never_split_and_serve_only_near_sizes() {
    let alloc = with("max_split_size_mb:20", 1 << 34);
    let big = alloc.allocate(30 * MIB as usize, S0).unwrap();
    let s = alloc.stats();
    assert_eq!(
        (
            s.oversize_segments.current,
            s.oversize_allocations.current,
            s.max_split_size
        ),
        (1, 1, 20 * MIB as i64)
    );
    let addr = big.ptr();
    drop(big);
    // A normal request never cuts the cached 30 MiB oversize block: a new 20 MiB segment.
    let small = alloc.allocate(8 * MIB as usize, S0).unwrap();
    assert_ne!(small.ptr(), addr);
    assert_eq!(alloc.stats().memory_reserved(), 50 * MIB);
    // An oversize request within 20 MiB of it takes the whole block.
    let near = alloc.allocate(25 * MIB as usize, S0).unwrap();
    assert_eq!(near.ptr(), addr);
    assert_eq!(alloc.stats().memory_allocated(), 38 * MIB);
    alloc.validate().unwrap();
}

#[test]
fn oversize_release_frees_a_cached_oversize_block_before_a_full_flush() {
    let alloc = with("max_split_size_mb:20", 100 * MIB);
    let keep = alloc.allocate(MIB as usize / 2, S0).unwrap(); // a 2 MiB small segment
    drop(alloc.allocate(80 * MIB as usize, S0).unwrap()); // a cached 80 MiB oversize block
                                                          // 55 MiB: the 80 MiB block is too large to serve it (≥ 55 + 20), and 2 + 80 + 56 > 100.
    let b = alloc.allocate(55 * MIB as usize, S0).unwrap();
    let s = alloc.stats();
    // Step 3 released the oversize block; no full flush was needed.
    assert_eq!(
        (
            s.num_device_free,
            s.num_alloc_retries,
            s.num_sync_all_streams
        ),
        (1, 0, 0)
    );
    assert_eq!(s.memory_reserved(), 58 * MIB);
    drop((b, keep));
}

#[test]
fn oversize_release_falls_through_to_the_full_flush() {
    let alloc = with("max_split_size_mb:20", 100 * MIB);
    let keep = alloc.allocate(MIB as usize / 2, S0).unwrap();
    drop(alloc.allocate(60 * MIB as usize, S0).unwrap());
    // 90 MiB: step 3 frees the 60 MiB block but that is not enough by itself; step 4 retries.
    let b = alloc.allocate(90 * MIB as usize, S0).unwrap();
    let s = alloc.stats();
    assert_eq!(
        (s.num_device_free, s.num_alloc_retries, s.memory_reserved()),
        (1, 1, 92 * MIB)
    );
    let e = alloc.allocate(90 * MIB as usize, S0).unwrap_err();
    assert!(e.is_out_of_memory());
    assert_eq!(alloc.stats().num_ooms, 1);
    drop((b, keep));
}

#[test]
fn roundup_power2_divisions_round_large_requests() {
    let alloc = with("roundup_power2_divisions:4", 1 << 34);
    let a = alloc.allocate((3 * MIB + 1) as usize, S0).unwrap();
    assert_eq!(alloc.stats().memory_allocated(), 3584 * 1024);
    drop(a);
    let list = with("roundup_power2_divisions:[1:1,>:2]", 1 << 34);
    let b = list.allocate((5 * MIB) as usize, S0).unwrap(); // [4, 8) MiB in 2 steps: 6 MiB
    assert_eq!(list.stats().memory_allocated(), 6 * MIB);
    drop(b);
}

#[test]
fn garbage_collection_frees_old_cached_blocks_without_syncing() {
    let alloc = with("garbage_collection_threshold:0.5", 1000 * MIB);
    alloc.set_memory_fraction(0.5).unwrap(); // 500 MiB allowed, GC above 250 MiB
    let blocks: Vec<_> = (0..3)
        .map(|_| alloc.allocate(100 * MIB as usize, S0).unwrap())
        .collect();
    drop(blocks);
    assert_eq!(alloc.stats().memory_reserved(), 300 * MIB);
    let _big = alloc.allocate(150 * MIB as usize, S0).unwrap();
    let s = alloc.stats();
    assert_eq!(
        (
            s.num_device_free,
            s.num_sync_all_streams,
            s.num_alloc_retries
        ),
        (3, 0, 0)
    );
    assert_eq!(s.memory_reserved(), 150 * MIB);
}

#[test]
fn memory_fraction_caps_reserved_not_allocated() {
    let alloc = CachingAllocator::new(SimBackend::new(1000 * MIB));
    alloc.set_memory_fraction(0.1).unwrap();
    let fits = alloc.allocate(50 * MIB as usize, S0).unwrap(); // a 50 MiB segment under a 100 MiB cap
    let a = alloc.allocate(60 * MIB as usize, S0);
    assert!(a.is_err(), "50 + 60 MiB exceed the 100 MiB cap");
    let msg = a.unwrap_err().to_string();
    assert!(msg.contains("100.00 MiB allowed;"), "{msg}");
    drop(fits);
}

#[test]
fn expandable_segments_map_pages_and_unmap_on_empty_cache() {
    let alloc = with("expandable_segments:True", 1 << 34);
    let a = alloc.allocate(30 * MIB as usize, S0).unwrap();
    let s = alloc.stats();
    assert_eq!(
        (
            s.memory_reserved(),
            s.segment.all().current,
            s.num_device_alloc
        ),
        (40 * MIB, 0, 1)
    );
    let b = alloc.allocate(5 * MIB as usize, S0).unwrap(); // fits in the 10 MiB left: no new page
    assert_eq!(b.ptr().0, a.ptr().0 + 30 * MIB, "tiles the segment");
    assert_eq!(alloc.stats().num_device_alloc, 1);
    let c = alloc.allocate(10 * MIB as usize, S0).unwrap(); // needs one more 20 MiB page
    assert_eq!(c.ptr().0, b.ptr().0 + 5 * MIB);
    assert_eq!(
        (
            alloc.stats().memory_reserved(),
            alloc.stats().num_device_alloc
        ),
        (60 * MIB, 2)
    );
    let snap = alloc.snapshot();
    assert_eq!(snap.segments.len(), 1);
    assert!(snap.segments[0].is_expandable);
    assert_eq!(snap.segments[0].total_size, 60 * MIB);
    drop(a);
    alloc.empty_cache().unwrap(); // the first page lies inside the freed 30 MiB block
    assert_eq!(alloc.stats().memory_reserved(), 40 * MIB);
    drop((b, c));
    alloc.empty_cache().unwrap();
    let counts = alloc.backend().counts();
    assert_eq!(
        (
            alloc.stats().memory_reserved(),
            counts.reserve,
            counts.release
        ),
        (0, 1, 1)
    );
    alloc.validate().unwrap();
}

#[test]
fn memory_summary_matches_pytorchs_layout() {
    let alloc = CachingAllocator::new(SimBackend::new(1 << 34));
    let tiny = alloc.allocate(4100, S0).unwrap(); // a 4608-byte small block
    let big = alloc.allocate(300 * MIB as usize, S0).unwrap();
    let _five = alloc.allocate(5 * MIB as usize, S0).unwrap();
    let _three = alloc.allocate(3 * MIB as usize, S0).unwrap();
    drop(tiny);
    big.record_stream(StreamId(7)).unwrap();
    drop(big); // pending free on the side stream
    let text = alloc.memory_summary(false);
    for line in [
        "|                  PyTorch CUDA memory summary, device ID 0                 |",
        "|                         allocator policy: pytorch                         |",
        "|            CUDA OOMs: 0            |        cudaMalloc retries: 0         |",
        "|        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  |",
        "| Allocated memory      |   8192 KiB | 315396 KiB | 315396 KiB | 307204 KiB |",
        "|       from large pool |   8192 KiB | 315392 KiB | 315392 KiB | 307200 KiB |",
        "|       from small pool |      0 KiB |      4 KiB |      4 KiB |      4 KiB |",
        "| Active memory         | 315392 KiB | 315396 KiB | 315396 KiB |   4608 B   |",
        "| Oversize GPU segments |       0    |       0    |       0    |       0    |",
    ] {
        assert!(text.contains(line), "missing {line:?} in\n{text}");
    }
    assert!(text.lines().all(|l| l.chars().count() == 77));
    // PyTorch's 47 lines, the policy's line, then the driver's four lines and a rule: the
    // simulated device of 16 GiB with 322 MiB reserved (a 2 MiB small segment and the large ones), and the waste of the peaks above.
    assert_eq!(text.lines().count(), 53);
    for line in [
        "| Driver (cuMemGetInfo): 322.00 MiB used of 16.00 GiB",
        "|   reserved by berth 322.00 MiB, outside berth 0 bytes",
        "| Waste: 4.54% (peak reserved over peak allocated)",
        "|   peak reserved 322.00 MiB, peak allocated 308.00 MiB",
    ] {
        assert!(text.contains(line), "missing {line:?} in\n{text}");
    }
    assert_eq!(alloc.memory_summary(true).lines().count(), 35);
}

#[test]
fn history_records_pytorchs_actions_in_a_bounded_ring() {
    let alloc = CachingAllocator::new(SimBackend::new(100 * MIB));
    alloc.record_memory_history(Some(1000));
    let a = alloc.allocate(1000, S0).unwrap();
    a.record_stream(StreamId(3)).unwrap();
    drop(a);
    alloc.empty_cache().unwrap();
    let _ = alloc.allocate(200 * MIB as usize, S0).unwrap_err();
    let snap = alloc.snapshot();
    let actions: Vec<&str> = snap.device_traces[0]
        .iter()
        .map(|e| e.action.as_str())
        .collect();
    assert_eq!(
        actions,
        [
            "segment_alloc",
            "alloc",
            "free_requested",
            "free_completed",
            "segment_free",
            "oom",
        ],
        "a snapshot's trace ends before the snapshot (PyTorch's order)"
    );
    let again: Vec<&str> = alloc.snapshot().device_traces[0]
        .iter()
        .map(|e| e.action.as_str())
        .collect();
    assert_eq!(
        again[5..],
        ["oom", "snapshot"],
        "the next snapshot shows the first"
    );
    let alloc_entry = snap.device_traces[0][1];
    assert_eq!(
        (alloc_entry.size, alloc_entry.stream),
        (1000, S0),
        "alloc entries carry the requested size"
    );
    assert_eq!(
        snap.device_traces[0][5].size,
        200 * MIB,
        "oom entries carry the rounded request"
    );
    // The ring keeps the newest entries only.
    alloc.record_memory_history(Some(2));
    drop(alloc.allocate(10, S0).unwrap());
    let actions: Vec<_> = alloc.snapshot().device_traces[0]
        .iter()
        .map(|e| e.action.as_str())
        .collect();
    assert_eq!(actions, ["free_requested", "free_completed"]);
    alloc.record_memory_history(None);
    assert!(alloc.snapshot().device_traces[0].is_empty());
}

#[test]
fn snapshot_lists_segments_blocks_and_states() {
    let alloc = CachingAllocator::new(SimBackend::new(1 << 34));
    let a = alloc.allocate(1000, S0).unwrap();
    let b = alloc.allocate(3 * MIB as usize, StreamId(5)).unwrap();
    let snap = alloc.snapshot();
    assert_eq!(snap.segments.len(), 2);
    let small = &snap.segments[0];
    assert_eq!(
        (small.total_size, small.allocated_size, small.requested_size),
        (2 * MIB, 1024, 1000)
    );
    assert_eq!(small.segment_type.as_str(), "small");
    assert_eq!(
        small
            .blocks
            .iter()
            .map(|b| b.state.as_str())
            .collect::<Vec<_>>(),
        ["active_allocated", "inactive"]
    );
    let large = &snap.segments[1];
    assert_eq!(
        (large.stream, large.total_size, large.address),
        (StreamId(5), 20 * MIB, b.ptr().0)
    );
    assert_eq!(snap.total_reserved(), alloc.stats().memory_reserved());
    drop(a);
    let snap = alloc.snapshot();
    assert_eq!(snap.segments[0].blocks.len(), 1, "freed neighbours merge");
    assert_eq!(
        snap.segments[0].blocks[0].requested_size, 1000,
        "a free block keeps its last request"
    );
}

#[test]
fn oom_observer_runs_with_the_lock_released_under_both_policies() {
    for conf in ["backend:native", "backend:paged"] {
        let cfg = berth_alloc::AllocatorConfig::parse(conf).unwrap();
        let alloc = berth_alloc::device_allocator(SimBackend::new(100 * MIB), cfg, 3).unwrap();
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (inner, sink) = (alloc.clone(), seen.clone());
        alloc.attach_oom_observer(std::sync::Arc::new(move |e: &berth_alloc::AllocError| {
            // Taking a snapshot inside the observer would deadlock if the lock were held.
            let segments = inner.snapshot().segments.len();
            sink.lock()
                .unwrap()
                .push((e.is_out_of_memory(), segments, e.to_string()));
        }));
        let _keep = alloc.allocate(MIB as usize, S0).unwrap();
        assert!(alloc.allocate(200 * MIB as usize, S0).is_err());
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 1, "{conf}");
        assert_eq!((seen[0].0, seen[0].1), (true, 1), "{conf}");
        // The device index set at construction is the one the message names.
        assert!(
            seen[0].2.contains("GPU 3 has a total capacity"),
            "{conf}: {}",
            seen[0].2
        );
    }
}
