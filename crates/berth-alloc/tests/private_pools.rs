//! Private pools (`Note [Private pools]`): the memory of CUDA graphs and `torch.cuda.MemPool`,
//! with PyTorch's semantics, for PyTorch's policy and its expandable segments; berth's paged
//! policy says it has none.

use std::collections::HashSet;
use std::sync::Arc;

use berth_alloc::backend::sim::SimBackend;
use berth_alloc::caching::CachingAllocator;
use berth_alloc::{
    AllocError, AllocatorConfig, BlockState, DeviceAllocator, DevicePtr, MempoolId, Policy,
    StreamFilter, StreamId,
};

use crate::util::MIB;

const S0: StreamId = StreamId::DEFAULT;
const CAPTURE: StreamId = StreamId(7);
const GRAPH: MempoolId = (1, 0);
const MEMPOOL: MempoolId = (0, 1);

fn with(conf: &str, capacity: u64) -> CachingAllocator<SimBackend> {
    CachingAllocator::with_config(
        SimBackend::new(capacity),
        AllocatorConfig::parse(conf).unwrap(),
    )
    .unwrap()
}

fn only(stream: StreamId) -> StreamFilter {
    Arc::new(move |s| s == stream)
}

fn both_policies() -> [CachingAllocator<SimBackend>; 2] {
    [with("", 1 << 34), with("expandable_segments:True", 1 << 34)]
}

/// The pool ids of the segments, in address order.
fn segment_pools(alloc: &dyn DeviceAllocator) -> Vec<MempoolId> {
    alloc
        .snapshot()
        .segments
        .iter()
        .map(|s| s.segment_pool_id)
        .collect()
}

#[test]
fn a_capture_allocates_from_its_own_segments_and_keeps_them() {
    for alloc in both_policies() {
        let name = alloc.policy_name().to_owned();
        // A cached general block that would fit.
        let cached = alloc.allocate(4 * MIB as usize, CAPTURE).unwrap();
        let general_addr = cached.ptr();
        drop(cached);
        let reserved_before = alloc.stats().memory_reserved();

        alloc.begin_allocate_to_pool(GRAPH, only(CAPTURE)).unwrap();
        let a = alloc.allocate(4 * MIB as usize, CAPTURE).unwrap();
        assert_ne!(
            a.ptr(),
            general_addr,
            "{name}: the general cache is not used"
        );
        assert!(alloc.stats().memory_reserved() > reserved_before, "{name}");
        // Another stream still allocates from the general pool, reusing its block.
        let other = alloc.allocate(4 * MIB as usize, S0).unwrap();
        drop(other);
        // Inside the pool a freed block is reused at the same address (graph replay).
        let addr = a.ptr();
        drop(a);
        let again = alloc.allocate(4 * MIB as usize, CAPTURE).unwrap();
        assert_eq!(again.ptr(), addr, "{name}");
        let kept = again.ptr();
        drop(again);
        alloc.end_allocate_to_pool(GRAPH).unwrap();

        // After the capture the pool's cached blocks serve nobody else.
        let after = alloc.allocate(4 * MIB as usize, CAPTURE).unwrap();
        assert_ne!(after.ptr(), kept, "{name}: a private pool's block left it");
        drop(after);
        assert!(segment_pools(&alloc).contains(&GRAPH), "{name}");
        alloc.validate().unwrap();

        // empty_cache keeps a pool in use, then frees it once released.
        alloc.empty_cache().unwrap();
        assert_eq!(segment_pools(&alloc), vec![GRAPH], "{name}");
        assert_eq!(alloc.pool_use_count(GRAPH), 1);
        alloc.release_pool(GRAPH).unwrap();
        assert_eq!(alloc.pool_use_count(GRAPH), 0);
        alloc.empty_cache().unwrap();
        assert_eq!(alloc.stats().memory_reserved(), 0, "{name}");
        assert!(segment_pools(&alloc).is_empty(), "{name}");
        // Forgotten: it no longer exists.
        assert!(matches!(
            alloc.check_pool_live_allocations(GRAPH, &HashSet::new()),
            Err(AllocError::NoSuchPool { .. })
        ));
        alloc.validate().unwrap();
    }
}

#[test]
fn use_counts_follow_pytorch() {
    let alloc = with("", 1 << 34);
    assert_eq!(alloc.pool_use_count(MEMPOOL), 0, "unknown pools count 0");
    alloc.create_or_incref_pool(MEMPOOL).unwrap();
    alloc.create_or_incref_pool(MEMPOOL).unwrap();
    assert_eq!(alloc.pool_use_count(MEMPOOL), 2);
    // use_mem_pool: begin takes a use, release gives it back.
    alloc.begin_allocate_to_pool(MEMPOOL, only(S0)).unwrap();
    assert_eq!(alloc.pool_use_count(MEMPOOL), 3);
    let x = alloc.allocate(1000, S0).unwrap();
    alloc.end_allocate_to_pool(MEMPOOL).unwrap();
    alloc.release_pool(MEMPOOL).unwrap();
    assert_eq!(alloc.pool_use_count(MEMPOOL), 2);
    assert_eq!(segment_pools(&alloc), vec![MEMPOOL]);
    // The small pool of a private pool: a 2 MiB small segment.
    let s = &alloc.snapshot().segments[0];
    assert_eq!((s.total_size, s.allocated_size), (2 * MIB, 1024));
    drop(x);
    alloc.release_pool(MEMPOOL).unwrap();
    alloc.release_pool(MEMPOOL).unwrap();
    assert!(matches!(
        alloc.release_pool(MEMPOOL),
        Err(AllocError::NoSuchPool { .. })
    ));
    // A pool emptied explicitly (MemPool's destructor) with no use left is forgotten.
    alloc.empty_pool_cache(MEMPOOL).unwrap();
    assert_eq!(alloc.stats().memory_reserved(), 0);
    assert!(matches!(
        alloc.empty_pool_cache(MEMPOOL),
        Err(AllocError::NoSuchPool { .. })
    ));
    alloc.validate().unwrap();
}

#[test]
fn bad_pool_calls_are_typed_errors() {
    let alloc = with("", 1 << 34);
    for e in [
        alloc.create_or_incref_pool((0, 0)).unwrap_err(),
        alloc.end_allocate_to_pool(GRAPH).unwrap_err(),
        alloc.release_pool(GRAPH).unwrap_err(),
        alloc.empty_pool_cache(GRAPH).unwrap_err(),
    ] {
        assert!(matches!(e, AllocError::NoSuchPool { .. }), "{e:?}");
        assert!(e.to_string().starts_with("private pool ("), "{e}");
    }
    alloc.begin_allocate_to_pool(GRAPH, only(CAPTURE)).unwrap();
    let e = alloc
        .begin_allocate_to_pool(GRAPH, only(CAPTURE))
        .unwrap_err();
    assert_eq!(e, AllocError::PoolInUse { id: GRAPH });
    assert_eq!(
        alloc.pool_use_count(GRAPH),
        1,
        "a refused begin takes no use"
    );
}

#[test]
fn live_allocations_are_checked_against_the_expected_set() {
    let alloc = with("", 1 << 34);
    alloc.begin_allocate_to_pool(GRAPH, only(CAPTURE)).unwrap();
    let a = alloc.allocate(3 * MIB as usize, CAPTURE).unwrap();
    let b = alloc.allocate(100, CAPTURE).unwrap();
    alloc.end_allocate_to_pool(GRAPH).unwrap();
    // A general allocation is not the pool's.
    let general = alloc.allocate(100, S0).unwrap();
    let set = |ps: &[DevicePtr]| ps.iter().copied().collect::<HashSet<_>>();
    assert!(alloc
        .check_pool_live_allocations(GRAPH, &set(&[a.ptr(), b.ptr()]))
        .unwrap());
    assert!(!alloc
        .check_pool_live_allocations(GRAPH, &set(&[a.ptr()]))
        .unwrap());
    assert!(!alloc
        .check_pool_live_allocations(GRAPH, &set(&[a.ptr(), b.ptr(), general.ptr()]))
        .unwrap());
    drop(b);
    assert!(alloc
        .check_pool_live_allocations(GRAPH, &set(&[a.ptr()]))
        .unwrap());
}

/// PyTorch does not flush the caches while a pool is being allocated to (freeing memory is
/// illegal during graph capture): a request that a flush would satisfy runs out of memory.
#[test]
fn no_flush_while_a_pool_is_being_allocated_to() {
    let alloc = with("", 64 * MIB);
    let big = alloc.allocate(40 * MIB as usize, S0).unwrap();
    drop(big); // 40 MiB cached in the general pool; 24 MiB left on the device.
    alloc.begin_allocate_to_pool(GRAPH, only(CAPTURE)).unwrap();
    let e = alloc.allocate(30 * MIB as usize, CAPTURE).unwrap_err();
    assert!(e.is_out_of_memory(), "{e:?}");
    assert_eq!(
        alloc.stats().memory_reserved(),
        40 * MIB,
        "nothing was freed"
    );
    alloc.end_allocate_to_pool(GRAPH).unwrap();
    // Outside the capture the flush frees the cached block and the request fits.
    let ok = alloc.allocate(30 * MIB as usize, CAPTURE).unwrap();
    assert_eq!(ok.size(), 30 * MIB as usize);
    assert_eq!(alloc.stats().num_alloc_retries, 1);
}

#[test]
fn no_event_is_recorded_or_queried_while_a_pool_is_being_allocated_to() {
    let alloc = with("", 1 << 34);
    let side = StreamId(9);
    alloc.begin_allocate_to_pool(GRAPH, only(CAPTURE)).unwrap();
    let x = alloc.allocate(MIB as usize, CAPTURE).unwrap();
    x.record_stream(side).unwrap();
    drop(x);
    // An event call on a capturing stream would break the capture: none yet.
    assert_eq!(alloc.backend().pending_events(side), 0);
    let y = alloc.allocate(MIB as usize, CAPTURE).unwrap();
    assert_eq!(alloc.backend().pending_events(side), 0);
    alloc.end_allocate_to_pool(GRAPH).unwrap();
    // The first request after the capture records the deferred event; the block stays
    // unusable until the side stream passes it.
    let z = alloc.allocate(MIB as usize, S0).unwrap();
    assert_eq!(alloc.backend().pending_events(side), 1);
    let pool_blocks = |a: &CachingAllocator<SimBackend>| -> Vec<BlockState> {
        a.snapshot()
            .segments
            .iter()
            .filter(|s| s.segment_pool_id == GRAPH)
            .flat_map(|s| s.blocks.iter().map(|b| b.state))
            .collect()
    };
    assert!(pool_blocks(&alloc).contains(&BlockState::ActivePendingFree));
    alloc.backend().complete_events_on(side);
    drop(alloc.allocate(512, S0).unwrap()); // processes events
    assert!(!pool_blocks(&alloc).contains(&BlockState::ActivePendingFree));
    drop((y, z));
}

#[test]
fn pool_slots_are_reused_after_a_pool_is_forgotten() {
    let alloc = with("", 1 << 34);
    for round in 1..=3u64 {
        let id = (round, 0);
        alloc.begin_allocate_to_pool(id, only(CAPTURE)).unwrap();
        let x = alloc.allocate(5 * MIB as usize, CAPTURE).unwrap();
        alloc.end_allocate_to_pool(id).unwrap();
        assert_eq!(segment_pools(&alloc), vec![id]);
        let blocks = &alloc.snapshot().segments[0].blocks;
        assert_eq!(blocks[0].state, BlockState::ActiveAllocated);
        drop(x);
        alloc.release_pool(id).unwrap();
        alloc.empty_cache().unwrap();
        assert_eq!(alloc.stats().memory_reserved(), 0, "round {round}");
        alloc.validate().unwrap();
    }
}

#[test]
fn the_paged_policy_says_it_has_no_private_pools() {
    let paged = berth_alloc::device_allocator(
        SimBackend::new(1 << 34),
        Policy::Paged.config("").unwrap(),
        0,
    )
    .unwrap();
    let e = paged
        .begin_allocate_to_pool(GRAPH, only(CAPTURE))
        .unwrap_err();
    assert!(matches!(e, AllocError::PolicyLacks { .. }), "{e:?}");
    assert_eq!(
        e.to_string(),
        "the paged policy does not support private pools (CUDA graphs, torch.cuda.MemPool, \
         torch.compile's reduce-overhead mode); use policy \"pytorch\" or \"expandable\", which \
         have them"
    );
    assert_eq!(paged.pool_use_count(GRAPH), 0);
}
