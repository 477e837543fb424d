//! The two settings of a private pool from `torch.cuda.MemPool(use_on_oom=..., no_split=...)`
//! (`Note [Private pools]`): a use-on-OOM pool lends its cached free blocks to a general
//! request that would otherwise fail; a no-split pool never cuts a block.

use berth_alloc::{AllocError, BlockState, DevicePtr, MempoolId};

use crate::private_pools::{cache_one_block, only, Under, MEMPOOL, S0};
use crate::util::MIB;

/// The pool of the segment holding `ptr`.
fn pool_of(u: &Under, ptr: DevicePtr) -> MempoolId {
    u.alloc
        .snapshot()
        .segments
        .iter()
        .find(|s| ptr.0 >= s.address && ptr.0 < s.address + s.total_size)
        .map(|s| s.segment_pool_id)
        .expect("a segment holds it")
}

#[test]
fn a_use_on_oom_pool_lends_its_free_blocks_before_out_of_memory() {
    for policy in ["pytorch", "expandable", "paged"] {
        let u = Under::new(policy, 64 * MIB);
        let a = &*u.alloc;
        // torch.cuda.MemPool(use_on_oom=True) on the current stream, used once and left with
        // 20 MiB cached.
        a.create_or_incref_pool(MEMPOOL).unwrap();
        a.set_use_on_oom(MEMPOOL, true).unwrap();
        cache_one_block(a, MEMPOOL, 20 * MIB);
        a.release_pool(MEMPOOL).unwrap();
        // The general pool takes most of the rest; the next request cannot get new memory.
        let big = a.raw_alloc(40 * MIB as usize, S0).unwrap();
        let lent = a
            .raw_alloc(16 * MIB as usize, S0)
            .unwrap_or_else(|e| panic!("{policy}: {e}"));
        assert_eq!(pool_of(&u, lent), MEMPOOL, "{policy}: served from the pool");
        assert_eq!(a.stats().num_ooms, 0, "{policy}: no out-of-memory counted");
        u.check_accounting();
        // Freed, the block goes back to the pool, not to the general pool.
        a.raw_delete(lent).unwrap();
        assert_eq!(pool_of(&u, lent), MEMPOOL, "{policy}");
        // Switched off (as ~MemPool does), the pool lends nothing: out-of-memory, counted.
        a.set_use_on_oom(MEMPOOL, false).unwrap();
        let e = a.raw_alloc(16 * MIB as usize, S0).unwrap_err();
        assert!(e.is_out_of_memory(), "{policy}: {e}");
        assert_eq!(a.stats().num_ooms, 1, "{policy}");
        a.raw_delete(big).unwrap();
        assert!(matches!(
            a.set_use_on_oom((5, 5), true).unwrap_err(),
            AllocError::NoSuchPool { .. }
        ));
    }
}

#[test]
fn a_pool_that_lends_on_oom_does_not_lend_to_another_pool() {
    for policy in ["pytorch", "expandable", "paged"] {
        let u = Under::new(policy, 64 * MIB);
        let a = &*u.alloc;
        let (lender, other): (MempoolId, MempoolId) = ((0, 3), (0, 4));
        a.create_or_incref_pool(lender).unwrap();
        a.set_use_on_oom(lender, true).unwrap();
        cache_one_block(a, lender, 20 * MIB);
        let big = a.raw_alloc(40 * MIB as usize, S0).unwrap();
        // A request of another private pool does not borrow (PyTorch: "if already trying to
        // use a mempool, then just oom").
        a.begin_allocate_to_pool(other, only(S0)).unwrap();
        let e = a.raw_alloc(16 * MIB as usize, S0).unwrap_err();
        a.end_allocate_to_pool(other).unwrap();
        assert!(e.is_out_of_memory(), "{policy}: {e}");
        a.raw_delete(big).unwrap();
    }
}

#[test]
fn a_no_split_pool_hands_out_whole_blocks() {
    for policy in ["pytorch", "expandable"] {
        let u = Under::new(policy, 1 << 32);
        let a = &*u.alloc;
        a.create_or_incref_pool(MEMPOOL).unwrap();
        a.set_no_split(MEMPOOL).unwrap();
        a.begin_allocate_to_pool(MEMPOOL, only(S0)).unwrap();
        let x = a.raw_alloc(3 * MIB as usize, S0).unwrap();
        let y = a.raw_alloc(3 * MIB as usize, S0).unwrap();
        a.end_allocate_to_pool(MEMPOOL).unwrap();
        let snap = a.snapshot();
        let block = |p: DevicePtr| {
            snap.segments
                .iter()
                .flat_map(|s| s.blocks.iter())
                .find(|b| b.address == p.0 && b.state == BlockState::ActiveAllocated)
                .map(|b| b.size)
                .unwrap()
        };
        // A 3 MiB request gets a 20 MiB segment (PyTorch's size for 1-10 MiB requests), whole.
        assert_eq!(block(x), 20 * MIB, "{policy}");
        assert_eq!(block(y), 20 * MIB, "{policy}");
        // Each has a segment of its own (with expandable segments, whole pages of one segment).
        if policy == "pytorch" {
            for s in snap
                .segments
                .iter()
                .filter(|s| s.segment_pool_id == MEMPOOL)
            {
                assert_eq!(s.blocks.len(), 1, "{policy}: no segment of the pool is cut");
            }
        }
        // The general pool still splits.
        let g = a.raw_alloc(3 * MIB as usize, S0).unwrap();
        let general = a.snapshot();
        let seg = general
            .segments
            .iter()
            .find(|s| g.0 >= s.address && g.0 < s.address + s.total_size)
            .unwrap();
        assert!(seg.blocks.len() > 1, "{policy}: the general pool splits");
        u.check_accounting();
        for p in [x, y, g] {
            a.raw_delete(p).unwrap();
        }
    }
    // paged has no segments to keep whole: it says so.
    let u = Under::new("paged", 1 << 32);
    u.alloc.create_or_incref_pool(MEMPOOL).unwrap();
    let e = u.alloc.set_no_split(MEMPOOL).unwrap_err();
    assert!(
        e.to_string().contains("\"pytorch\" or \"expandable\""),
        "{e}"
    );
}
