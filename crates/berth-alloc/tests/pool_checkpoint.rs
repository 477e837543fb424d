//! Restoring a private pool to a checkpoint of its allocations (`Note [Restoring a pool
//! checkpoint]`, PyTorch's `setCheckpointPoolState`, which CUDA-graph trees call before
//! recording a new graph after replaying others), for every policy over the simulated device.

use std::collections::HashSet;

use berth_alloc::{AllocError, BlockState, DevicePtr, MempoolId};

use crate::private_pools::{only, Under, CAPTURE, GRAPH, S0};
use crate::util::MIB;

const POLICIES: [&str; 3] = ["pytorch", "expandable", "paged"];

/// The allocated blocks of pool `pool` in the snapshot, `(address, size)`: what the full
/// allocator's `getCheckpointState` keeps.
fn checkpoint(u: &Under, pool: MempoolId) -> Vec<(DevicePtr, u64)> {
    let mut out = Vec::new();
    for s in u.alloc.snapshot().segments {
        if s.segment_pool_id != pool {
            continue;
        }
        for b in s.blocks {
            if b.state == BlockState::ActiveAllocated {
                out.push((DevicePtr(b.address), b.size));
            }
        }
    }
    out.sort_unstable();
    out
}

fn in_pool(u: &Under, bytes: usize) -> DevicePtr {
    u.alloc.raw_alloc(bytes, CAPTURE).unwrap()
}

#[test]
fn a_pool_goes_back_to_its_checkpoint_and_kept_blocks_keep_their_bytes() {
    for policy in POLICIES {
        let u = Under::new(policy, 1 << 32);
        let a = &*u.alloc;
        a.begin_allocate_to_pool(GRAPH, only(CAPTURE)).unwrap();
        // Large and small blocks, as a recorded graph leaves them.
        let big = in_pool(&u, 3 * MIB as usize);
        let small = in_pool(&u, 4096);
        let mid = in_pool(&u, 1536 * 1024);
        let tiny = in_pool(&u, 8192);
        let saved = checkpoint(&u, GRAPH);
        assert_eq!(saved.len(), 4, "{policy}");
        // The simulator keeps the bytes of mapped memory (not of `cuMemAlloc`'d segments).
        let bytes_kept = policy != "pytorch";
        if bytes_kept {
            u.sim.write_bytes(mid, &[0x5A; 4096]).unwrap();
        }
        // Another path: two of them freed, new blocks made where they were and elsewhere.
        a.raw_delete(big).unwrap();
        a.raw_delete(tiny).unwrap();
        let other = in_pool(&u, 2 * MIB as usize);
        let more = in_pool(&u, 100_000);
        a.end_allocate_to_pool(GRAPH).unwrap();

        let r = a.restore_pool(GRAPH, &saved).unwrap();
        let freed: HashSet<DevicePtr> = r.freed.iter().copied().collect();
        let want: HashSet<DevicePtr> = [small, mid, other, more].into();
        assert_eq!(
            freed, want,
            "{policy}: every block allocated before is reported freed"
        );
        let back: Vec<DevicePtr> = saved.iter().map(|&(p, _)| p).collect();
        let mut allocated = r.allocated.clone();
        allocated.sort_unstable();
        assert_eq!(allocated, back, "{policy}");
        let live: HashSet<DevicePtr> = back.iter().copied().collect();
        assert!(
            a.check_pool_live_allocations(GRAPH, &live).unwrap(),
            "{policy}"
        );
        assert_eq!(
            checkpoint(&u, GRAPH),
            saved,
            "{policy}: the same blocks, same sizes"
        );
        if bytes_kept {
            assert_eq!(
                u.sim.read_bytes(mid, 4096).unwrap(),
                vec![0x5A; 4096],
                "{policy}: a block in both keeps its bytes"
            );
        }
        u.check_accounting();

        // The pool works on: allocations go into free memory, the restored blocks free.
        a.begin_allocate_to_pool(GRAPH, only(CAPTURE)).unwrap();
        let next = in_pool(&u, 5 * MIB as usize);
        assert!(!live.contains(&next), "{policy}");
        a.end_allocate_to_pool(GRAPH).unwrap();
        for p in back.into_iter().chain([next]) {
            a.raw_delete(p).unwrap();
        }
        // Each begin_allocate_to_pool took a use.
        a.release_pool(GRAPH).unwrap();
        a.release_pool(GRAPH).unwrap();
        a.empty_cache().unwrap();
        u.check_accounting();
        assert_eq!(u.sim.used_bytes(), 0, "{policy}: nothing leaks");
        assert_eq!(a.stats().memory_allocated(), 0, "{policy}");
    }
}

#[test]
fn a_checkpoint_that_does_not_fit_is_refused_and_changes_nothing() {
    for policy in POLICIES {
        let u = Under::new(policy, 1 << 32);
        let a = &*u.alloc;
        a.begin_allocate_to_pool(GRAPH, only(CAPTURE)).unwrap();
        let x = in_pool(&u, 2 * MIB as usize);
        let y = in_pool(&u, 4096);
        let general = a.raw_alloc(MIB as usize, S0).unwrap();
        let saved = checkpoint(&u, GRAPH);
        let bad = |live: &[(DevicePtr, u64)]| a.restore_pool(GRAPH, live).unwrap_err();
        // While the pool is being allocated to.
        assert!(
            matches!(bad(&saved), AllocError::SleepDuringCapture { .. }),
            "{policy}"
        );
        a.end_allocate_to_pool(GRAPH).unwrap();
        // A block of the general pool, two overlapping blocks, a size that is no block size.
        let outside = bad(&[(general, MIB)]);
        assert!(
            outside.to_string().contains("not in the pool's memory"),
            "{policy}: {outside}"
        );
        let overlap = bad(&[(x, 2 * MIB), (DevicePtr(x.0 + 512), 512)]);
        assert!(
            overlap.to_string().contains("overlap"),
            "{policy}: {overlap}"
        );
        let odd = bad(&[(x, 1000)]);
        assert!(
            odd.to_string().contains("multiples of 512"),
            "{policy}: {odd}"
        );
        assert!(matches!(
            a.restore_pool((9, 9), &saved).unwrap_err(),
            AllocError::NoSuchPool { .. }
        ));
        let live: HashSet<DevicePtr> = [x, y].into();
        assert!(
            a.check_pool_live_allocations(GRAPH, &live).unwrap(),
            "{policy}: nothing changed"
        );
        // The checkpoint it came from restores to itself.
        let r = a.restore_pool(GRAPH, &saved).unwrap();
        assert_eq!(r.freed.len(), 2, "{policy}");
        assert!(
            a.check_pool_live_allocations(GRAPH, &live).unwrap(),
            "{policy}"
        );
        u.check_accounting();
        for p in [x, y, general] {
            a.raw_delete(p).unwrap();
        }
    }
}

#[test]
fn restoring_an_empty_checkpoint_frees_the_whole_pool() {
    for policy in POLICIES {
        let u = Under::new(policy, 1 << 32);
        let a = &*u.alloc;
        a.begin_allocate_to_pool(GRAPH, only(CAPTURE)).unwrap();
        let blocks: Vec<DevicePtr> = (1..6).map(|k| in_pool(&u, k * 300_000)).collect();
        a.end_allocate_to_pool(GRAPH).unwrap();
        let r = a.restore_pool(GRAPH, &[]).unwrap();
        assert_eq!(r.freed.len(), blocks.len(), "{policy}");
        assert!(r.allocated.is_empty());
        assert_eq!(a.stats().memory_allocated(), 0, "{policy}");
        // Freeing one of them again is a double free, not a corruption.
        assert!(a.raw_delete(blocks[0]).is_err(), "{policy}");
        u.check_accounting();
    }
}

#[test]
fn the_caching_policies_keep_every_invariant_through_restores() {
    use berth_alloc::backend::sim::SimBackend;
    use berth_alloc::caching::CachingAllocator;
    use berth_alloc::{AllocatorConfig, DeviceAllocator};
    use std::sync::Arc;
    for conf in ["", "expandable_segments:True"] {
        let sim = Arc::new(SimBackend::new(1 << 32));
        let a = CachingAllocator::with_config(sim, AllocatorConfig::parse(conf).unwrap()).unwrap();
        a.begin_allocate_to_pool(GRAPH, only(CAPTURE)).unwrap();
        // Blocks that split segments front, middle and back, small and large.
        let sizes = [700_000, 3 << 20, 5000, 12 << 20, 40_000, 2 << 20, 512];
        let ptrs: Vec<DevicePtr> = sizes
            .iter()
            .map(|&n| a.raw_alloc(n, CAPTURE).unwrap())
            .collect();
        a.validate().unwrap();
        let mut saved = Vec::new();
        for s in a.snapshot().segments {
            for b in s.blocks {
                if b.state == BlockState::ActiveAllocated && b.address != ptrs[0].0 {
                    saved.push((DevicePtr(b.address), b.size));
                }
            }
        }
        // Free every other block, allocate new ones over them, then restore twice.
        for (k, &p) in ptrs.iter().enumerate() {
            if k % 2 == 1 {
                a.raw_delete(p).unwrap();
            }
        }
        for n in [9000, 1 << 20, 6 << 20] {
            a.raw_alloc(n, CAPTURE).unwrap();
        }
        a.end_allocate_to_pool(GRAPH).unwrap();
        a.validate().unwrap();
        a.restore_pool(GRAPH, &saved).unwrap();
        a.validate().unwrap_or_else(|e| panic!("{conf:?}: {e}"));
        a.restore_pool(GRAPH, &saved).unwrap();
        a.validate().unwrap_or_else(|e| panic!("{conf:?}: {e}"));
        let live: HashSet<DevicePtr> = saved.iter().map(|&(p, _)| p).collect();
        assert!(a.check_pool_live_allocations(GRAPH, &live).unwrap());
        let bytes: u64 = saved.iter().map(|&(_, n)| n).sum();
        assert_eq!(a.stats().memory_allocated(), bytes, "{conf:?}");
    }
}

/// A caching allocator over a simulated device of 4 GiB with the options `conf`.
fn caching(
    conf: &str,
) -> berth_alloc::caching::CachingAllocator<std::sync::Arc<berth_alloc::backend::sim::SimBackend>> {
    let sim = std::sync::Arc::new(berth_alloc::backend::sim::SimBackend::new(1 << 32));
    berth_alloc::caching::CachingAllocator::with_config(
        sim,
        berth_alloc::AllocatorConfig::parse(conf).unwrap(),
    )
    .unwrap()
}

/// The allocated blocks of pool `pool` in `a`'s snapshot.
fn saved_of(a: &dyn berth_alloc::DeviceAllocator, pool: MempoolId) -> Vec<(DevicePtr, u64)> {
    let mut out: Vec<(DevicePtr, u64)> = a
        .snapshot()
        .segments
        .into_iter()
        .filter(|s| s.segment_pool_id == pool)
        .flat_map(|s| s.blocks)
        .filter(|b| b.state == BlockState::ActiveAllocated)
        .map(|b| (DevicePtr(b.address), b.size))
        .collect();
    out.sort_unstable();
    out
}

#[test]
fn a_checkpoint_on_unmapped_expandable_memory_is_refused_before_anything_is_freed() {
    use berth_alloc::DeviceAllocator;
    let a = caching("expandable_segments:True");
    a.begin_allocate_to_pool(GRAPH, only(CAPTURE)).unwrap();
    let x = a.raw_alloc(20 << 20, CAPTURE).unwrap();
    let y = a.raw_alloc(20 << 20, CAPTURE).unwrap();
    let z = a.raw_alloc(20 << 20, CAPTURE).unwrap();
    let saved = saved_of(&a, GRAPH);
    a.raw_delete(z).unwrap();
    a.end_allocate_to_pool(GRAPH).unwrap();
    a.empty_pool_cache(GRAPH).unwrap(); // unmaps z's page
    let err = a.restore_pool(GRAPH, &[saved[0], saved[2]]).unwrap_err();
    assert!(matches!(err, AllocError::BadCheckpoint { .. }), "{err}");
    let live: HashSet<DevicePtr> = [x, y].into();
    assert!(
        a.check_pool_live_allocations(GRAPH, &live).unwrap(),
        "nothing changed"
    );
    a.validate().unwrap();
}

#[test]
fn a_free_deferred_during_a_capture_is_completed_before_a_restore() {
    use berth_alloc::{DeviceAllocator, StreamId};
    for conf in ["", "expandable_segments:True"] {
        let a = caching(conf);
        a.begin_allocate_to_pool(GRAPH, only(CAPTURE)).unwrap();
        let x = a.raw_alloc(1 << 20, CAPTURE).unwrap();
        let y = a.raw_alloc(1 << 20, CAPTURE).unwrap();
        let saved = saved_of(&a, GRAPH);
        a.raw_record_stream(x, StreamId(3)).unwrap();
        a.raw_delete(x).unwrap(); // deferred: a capture is under way
        a.end_allocate_to_pool(GRAPH).unwrap();
        a.restore_pool(GRAPH, &saved).unwrap();
        a.validate().unwrap_or_else(|e| panic!("{conf:?}: {e}"));
        a.process_events().unwrap();
        a.validate().unwrap_or_else(|e| panic!("{conf:?}: {e}"));
        let live: HashSet<DevicePtr> = [x, y].into();
        assert!(
            a.check_pool_live_allocations(GRAPH, &live).unwrap(),
            "{conf:?}"
        );
    }
}
