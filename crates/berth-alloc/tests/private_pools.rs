//! Private pools (`Note [Private pools]`, `Note [Private pools in paged]`): the memory of CUDA
//! graphs and `torch.cuda.MemPool`, with PyTorch's semantics, for every policy: PyTorch's, its
//! expandable segments and berth's paged policy. Cases only `paged` can show (its pools' own
//! address space, nothing unmapped during a capture) are in `private_pools_paged.rs`.

use std::collections::HashSet;
use std::sync::Arc;

use berth_alloc::backend::sim::SimBackend;
use berth_alloc::caching::CachingAllocator;
use berth_alloc::{
    AllocError, AllocatorConfig, BlockState, DeviceAllocator, DevicePtr, MempoolId, PagedBestFit,
    StreamFilter, StreamId,
};

use crate::util::MIB;

pub(crate) const S0: StreamId = StreamId::DEFAULT;
pub(crate) const CAPTURE: StreamId = StreamId(7);
pub(crate) const GRAPH: MempoolId = (1, 0);
pub(crate) const MEMPOOL: MempoolId = (0, 1);

/// One policy over a simulated device the test can still see.
pub(crate) struct Under {
    pub alloc: Box<dyn DeviceAllocator>,
    pub sim: Arc<SimBackend>,
    pub paged: bool,
}

impl Under {
    /// `policy` ("pytorch", "expandable" or "paged") over a device of `capacity` bytes.
    pub(crate) fn new(policy: &str, capacity: u64) -> Under {
        let sim = Arc::new(SimBackend::new(capacity));
        let alloc: Box<dyn DeviceAllocator> = match policy {
            "paged" => Box::new(PagedBestFit::new(Arc::clone(&sim)).unwrap()),
            conf => Box::new(
                CachingAllocator::with_config(
                    Arc::clone(&sim),
                    AllocatorConfig::parse(if conf == "expandable" {
                        "expandable_segments:True"
                    } else {
                        ""
                    })
                    .unwrap(),
                )
                .unwrap(),
            ),
        };
        Under {
            alloc,
            sim,
            paged: policy == "paged",
        }
    }

    /// Statistics, snapshot and device agree: allocated and reserved bytes equal the sums
    /// over the snapshot's segments, the device holds exactly the reserved bytes, and no two
    /// segments overlap.
    pub(crate) fn check_accounting(&self) {
        let stats = self.alloc.stats();
        let snap = self.alloc.snapshot();
        let name = self.alloc.policy_name();
        let allocated: u64 = snap.segments.iter().map(|s| s.allocated_size).sum();
        let reserved: u64 = snap.segments.iter().map(|s| s.total_size).sum();
        assert_eq!(stats.memory_allocated(), allocated, "{name}");
        assert_eq!(stats.memory_reserved(), reserved, "{name}");
        assert_eq!(self.sim.used_bytes(), reserved, "{name}");
        let mut spans: Vec<(u64, u64)> = snap
            .segments
            .iter()
            .map(|s| (s.address, s.address + s.total_size))
            .collect();
        spans.sort_unstable();
        assert!(
            spans.windows(2).all(|w| w[0].1 <= w[1].0),
            "{name}: {spans:?}"
        );
    }
}

pub(crate) fn all_policies(capacity: u64) -> [Under; 3] {
    [
        Under::new("pytorch", capacity),
        Under::new("expandable", capacity),
        Under::new("paged", capacity),
    ]
}

pub(crate) fn only(stream: StreamId) -> StreamFilter {
    Arc::new(move |s| s == stream)
}

/// Allocates `bytes` into `pool` on stream `S0` and frees it again, so the pool is left with
/// that block cached (as after one `with torch.cuda.use_mem_pool(pool)` block); returns where
/// the block was.
pub(crate) fn cache_one_block(
    alloc: &dyn DeviceAllocator,
    pool: MempoolId,
    bytes: u64,
) -> DevicePtr {
    alloc.begin_allocate_to_pool(pool, only(S0)).unwrap();
    let p = alloc.raw_alloc(bytes as usize, S0).unwrap();
    alloc.raw_delete(p).unwrap();
    alloc.end_allocate_to_pool(pool).unwrap();
    p
}

/// The pool ids of the segments, in address order.
pub(crate) fn segment_pools(alloc: &dyn DeviceAllocator) -> Vec<MempoolId> {
    alloc
        .snapshot()
        .segments
        .iter()
        .map(|s| s.segment_pool_id)
        .collect()
}

#[test]
fn a_capture_allocates_from_its_own_segments_and_keeps_them() {
    for u in all_policies(1 << 34) {
        let alloc = &*u.alloc;
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
        assert!(segment_pools(alloc).contains(&GRAPH), "{name}");
        u.check_accounting();

        // empty_cache keeps a pool in use, then frees it once released.
        alloc.empty_cache().unwrap();
        assert_eq!(segment_pools(alloc), vec![GRAPH], "{name}");
        if u.paged {
            // paged maps the block's pages only; PyTorch's policies keep a 20 MiB segment.
            assert_eq!(alloc.stats().memory_reserved(), 4 * MIB, "{name}");
        }
        assert_eq!(alloc.pool_use_count(GRAPH), 1);
        alloc.release_pool(GRAPH).unwrap();
        assert_eq!(alloc.pool_use_count(GRAPH), 0);
        alloc.empty_cache().unwrap();
        assert_eq!(alloc.stats().memory_reserved(), 0, "{name}");
        assert_eq!(u.sim.used_bytes(), 0, "{name}");
        assert!(segment_pools(alloc).is_empty(), "{name}");
        // Forgotten: it no longer exists.
        assert!(matches!(
            alloc.check_pool_live_allocations(GRAPH, &HashSet::new()),
            Err(AllocError::NoSuchPool { .. })
        ));
        u.check_accounting();
    }
}

#[test]
fn use_counts_follow_pytorch() {
    for u in all_policies(1 << 34) {
        let alloc = &*u.alloc;
        let name = alloc.policy_name().to_owned();
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
        assert_eq!(segment_pools(alloc), vec![MEMPOOL], "{name}");
        // PyTorch's policies: a 2 MiB small segment of the private pool; paged: one 2 MiB
        // page of the pool's own address range. Either way 1024 bytes (512-rounded) in it.
        let s = &alloc.snapshot().segments[0];
        assert_eq!((s.total_size, s.allocated_size), (2 * MIB, 1024), "{name}");
        u.check_accounting();
        drop(x);
        alloc.release_pool(MEMPOOL).unwrap();
        alloc.release_pool(MEMPOOL).unwrap();
        assert!(matches!(
            alloc.release_pool(MEMPOOL),
            Err(AllocError::NoSuchPool { .. })
        ));
        // A pool emptied explicitly (MemPool's destructor) with no use left is forgotten.
        alloc.empty_pool_cache(MEMPOOL).unwrap();
        assert_eq!(alloc.stats().memory_reserved(), 0, "{name}");
        assert!(matches!(
            alloc.empty_pool_cache(MEMPOOL),
            Err(AllocError::NoSuchPool { .. })
        ));
        u.check_accounting();
    }
}

#[test]
fn bad_pool_calls_are_typed_errors() {
    for u in all_policies(1 << 34) {
        let alloc = &*u.alloc;
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
}

#[test]
fn live_allocations_are_checked_against_the_expected_set() {
    for u in all_policies(1 << 34) {
        let alloc = &*u.alloc;
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
}

/// PyTorch does not flush the caches while a pool is being allocated to (freeing memory is
/// illegal during graph capture): a request that a flush would satisfy runs out of memory.
#[test]
fn no_flush_while_a_pool_is_being_allocated_to() {
    for u in all_policies(64 * MIB) {
        let alloc = &*u.alloc;
        let name = alloc.policy_name().to_owned();
        let big = alloc.allocate(40 * MIB as usize, S0).unwrap();
        drop(big); // 40 MiB cached in the general pool; 24 MiB left on the device.
        alloc.begin_allocate_to_pool(GRAPH, only(CAPTURE)).unwrap();
        let e = alloc.allocate(30 * MIB as usize, CAPTURE).unwrap_err();
        assert!(e.is_out_of_memory(), "{name}: {e:?}");
        assert_eq!(
            alloc.stats().memory_reserved(),
            40 * MIB,
            "{name}: nothing was freed"
        );
        if u.paged {
            // Not a page unmapped, even for the failed request (`Note [Private pools in paged]`).
            assert_eq!(u.sim.counts().unmap, 0);
        }
        alloc.end_allocate_to_pool(GRAPH).unwrap();
        // Outside the capture the cached block goes back and the request fits: PyTorch's
        // policies free it in their flush-and-retry step, paged unmaps it before mapping
        // (step 3 of `Note [Paged best fit]`), with no retry.
        let ok = alloc.allocate(30 * MIB as usize, CAPTURE).unwrap();
        assert_eq!(ok.size(), 30 * MIB as usize);
        let retries = if u.paged { 0 } else { 1 };
        assert_eq!(alloc.stats().num_alloc_retries, retries, "{name}");
        u.check_accounting();
    }
}

#[test]
fn no_event_is_recorded_or_queried_while_a_pool_is_being_allocated_to() {
    for u in all_policies(1 << 34) {
        let alloc = &*u.alloc;
        let name = alloc.policy_name().to_owned();
        let side = StreamId(9);
        alloc.begin_allocate_to_pool(GRAPH, only(CAPTURE)).unwrap();
        let x = alloc.allocate(MIB as usize, CAPTURE).unwrap();
        x.record_stream(side).unwrap();
        drop(x);
        // An event call on a capturing stream would break the capture: none yet.
        let calls = u.sim.counts();
        assert_eq!(u.sim.pending_events(side), 0, "{name}");
        let y = alloc.allocate(MIB as usize, CAPTURE).unwrap();
        assert_eq!(u.sim.pending_events(side), 0, "{name}");
        let after = u.sim.counts();
        assert_eq!(
            (after.record_fence, after.query_fence, after.sync_fence),
            (calls.record_fence, calls.query_fence, calls.sync_fence),
            "{name}"
        );
        // The freed block is still shown as waiting, in the pool's segment.
        let pool_blocks = |a: &dyn DeviceAllocator| -> Vec<BlockState> {
            a.snapshot()
                .segments
                .iter()
                .filter(|s| s.segment_pool_id == GRAPH)
                .flat_map(|s| s.blocks.iter().map(|b| b.state))
                .collect()
        };
        assert!(
            pool_blocks(alloc).contains(&BlockState::ActivePendingFree),
            "{name}"
        );
        alloc.end_allocate_to_pool(GRAPH).unwrap();
        // The first request after the capture records the deferred event; the block stays
        // unusable until the side stream passes it.
        let z = alloc.allocate(MIB as usize, S0).unwrap();
        assert_eq!(u.sim.pending_events(side), 1, "{name}");
        assert!(
            pool_blocks(alloc).contains(&BlockState::ActivePendingFree),
            "{name}"
        );
        u.sim.complete_events_on(side);
        drop(alloc.allocate(512, S0).unwrap()); // processes events
        assert!(
            !pool_blocks(alloc).contains(&BlockState::ActivePendingFree),
            "{name}"
        );
        drop((y, z));
        u.check_accounting();
    }
}

#[test]
fn pool_slots_are_reused_after_a_pool_is_forgotten() {
    for u in all_policies(1 << 34) {
        let alloc = &*u.alloc;
        let name = alloc.policy_name().to_owned();
        for round in 1..=3u64 {
            let id = (round, 0);
            alloc.begin_allocate_to_pool(id, only(CAPTURE)).unwrap();
            let x = alloc.allocate(5 * MIB as usize, CAPTURE).unwrap();
            alloc.end_allocate_to_pool(id).unwrap();
            assert_eq!(segment_pools(alloc), vec![id], "{name}");
            let blocks = &alloc.snapshot().segments[0].blocks;
            assert_eq!(blocks[0].state, BlockState::ActiveAllocated);
            assert_eq!(blocks[0].address, x.ptr().0);
            drop(x);
            alloc.release_pool(id).unwrap();
            alloc.empty_cache().unwrap();
            assert_eq!(alloc.stats().memory_reserved(), 0, "{name} round {round}");
            assert_eq!(u.sim.used_bytes(), 0, "{name} round {round}");
            u.check_accounting();
        }
        if u.paged {
            // Each forgotten pool gave its address range back.
            let c = u.sim.counts();
            assert_eq!(c.release, 3, "{name}");
            assert_eq!(c.reserve, 3, "{name}");
        }
    }
}
