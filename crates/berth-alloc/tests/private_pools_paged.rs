//! Private pools of the paged policy (`Note [Private pools in paged]`): what only it can show.
//! Its pools have address space of their own, so a pool's pages never back another pool's
//! blocks; a pool in use keeps its pages through every unmapping step; nothing is unmapped
//! while a pool is being allocated to.

use std::collections::HashMap;

use berth_alloc::{DevicePtr, MempoolId, StreamId};

use crate::private_pools::{only, segment_pools, Under, CAPTURE, GRAPH, MEMPOOL, S0};
use crate::util::MIB;

const PAGE: u64 = 2 * MIB;

/// The 2 MiB pages `[addr, addr + bytes)` touches.
fn pages(addr: u64, bytes: u64) -> std::ops::Range<u64> {
    addr / PAGE..(addr + bytes).div_ceil(PAGE)
}

#[test]
fn paged_pool_pages_never_back_another_pools_blocks() {
    let u = Under::new("paged", 1 << 32);
    let alloc = &*u.alloc;
    let general = StreamId(3);
    // Every page any allocation ever touched, with the pool it was made in.
    let mut owner: HashMap<u64, MempoolId> = HashMap::new();
    let mut kept = Vec::new();
    let mut note = |pool: MempoolId, a: &berth_alloc::Allocation| {
        for p in pages(a.ptr().0, a.size() as u64) {
            let o = *owner.entry(p).or_insert(pool);
            assert_eq!(
                o, pool,
                "page {p:#x} of pool {o:?} backs a block of {pool:?}"
            );
        }
    };
    alloc.create_or_incref_pool(MEMPOOL).unwrap();
    for round in 0..12u64 {
        // Sizes from 512 bytes to 40 MiB, so blocks share pages and span units.
        let size = |k: u64| ((round * 7 + k * 13) % 11 + 1) * (1 << (2 * k)) * 150;
        alloc.begin_allocate_to_pool(GRAPH, only(CAPTURE)).unwrap();
        alloc.begin_allocate_to_pool(MEMPOOL, only(S0)).unwrap();
        for k in 0..9 {
            let g = alloc.allocate(size(k) as usize, CAPTURE).unwrap();
            note(GRAPH, &g);
            let m = alloc.allocate(size(8 - k) as usize, S0).unwrap();
            note(MEMPOOL, &m);
            // A stream no filter accepts allocates from the general pool meanwhile.
            let x = alloc.allocate(size(k) as usize, general).unwrap();
            note((0, 0), &x);
            if k % 3 == 0 {
                kept.push((GRAPH, g));
                kept.push((MEMPOOL, m));
            } else {
                drop((g, m));
            }
            drop(x);
        }
        alloc.end_allocate_to_pool(MEMPOOL).unwrap();
        alloc.release_pool(MEMPOOL).unwrap(); // use_mem_pool gives its use back
        alloc.end_allocate_to_pool(GRAPH).unwrap();
        // Outside the windows the same streams allocate from the general pool.
        for k in 0..9 {
            let a = alloc.allocate(size(k) as usize, CAPTURE).unwrap();
            note((0, 0), &a);
            let b = alloc.allocate(size(k) as usize, S0).unwrap();
            note((0, 0), &b);
        }
        // Each live block sits in a segment of its own pool.
        let snap = alloc.snapshot();
        for (pool, a) in &kept {
            let seg = snap
                .segments
                .iter()
                .find(|s| s.address <= a.ptr().0 && a.ptr().0 < s.address + s.total_size)
                .expect("a live block is in a segment");
            assert_eq!(seg.segment_pool_id, *pool, "round {round}");
        }
        if round % 4 == 3 {
            // Old graph outputs die; reclaims and flushes run between rounds.
            kept.clear();
            alloc.empty_cache().unwrap();
        }
        u.check_accounting();
        // Each graph replaces the last: one use given back, one taken by the next begin.
        alloc.release_pool(GRAPH).unwrap();
    }
    assert!(owner.values().any(|&p| p == GRAPH));
    assert!(owner.values().any(|&p| p == MEMPOOL));
    assert_eq!(alloc.pool_use_count(MEMPOOL), 1);
    assert_eq!(alloc.pool_use_count(GRAPH), 0);
    drop(kept);
    alloc.release_pool(MEMPOOL).unwrap();
    alloc.empty_cache().unwrap();
    assert_eq!(alloc.stats().memory_reserved(), 0);
    assert!(segment_pools(alloc).is_empty());
}

#[test]
fn paged_never_unmaps_while_a_pool_is_being_allocated_to() {
    let u = Under::new("paged", 1 << 30);
    let alloc = &*u.alloc;
    // 256 MiB cached in the general pool.
    let blocks: Vec<_> = (0..8)
        .map(|_| alloc.allocate(32 * MIB as usize, S0).unwrap())
        .collect();
    drop(blocks);
    // A freeable pool (no use left) whose block dies during the capture.
    alloc.create_or_incref_pool(MEMPOOL).unwrap();
    alloc
        .begin_allocate_to_pool(MEMPOOL, only(StreamId(5)))
        .unwrap();
    let old = alloc.allocate(16 * MIB as usize, StreamId(5)).unwrap();
    alloc.end_allocate_to_pool(MEMPOOL).unwrap();
    alloc.release_pool(MEMPOOL).unwrap();
    alloc.release_pool(MEMPOOL).unwrap();
    assert_eq!(alloc.pool_use_count(MEMPOOL), 0);
    assert_eq!(alloc.stats().memory_reserved(), 272 * MIB);
    let before = u.sim.counts();

    alloc.begin_allocate_to_pool(GRAPH, only(CAPTURE)).unwrap();
    drop(old);
    // Beyond the headroom: outside a capture step 3 would unmap the general cache first.
    let big = alloc.allocate(300 * MIB as usize, CAPTURE).unwrap();
    alloc.empty_cache().unwrap();
    alloc.empty_pool_cache(MEMPOOL).unwrap();
    // More than the device has left: out of memory, with nothing mapped or unmapped for it.
    let e = alloc.allocate(600 * MIB as usize, CAPTURE).unwrap_err();
    assert!(e.is_out_of_memory(), "{e:?}");
    let during = u.sim.counts();
    assert_eq!(
        during.unmap, before.unmap,
        "nothing unmapped during the capture"
    );
    assert_eq!(during.release, before.release);
    assert_eq!(
        during.sync_fence, before.sync_fence,
        "no stream synchronized"
    );
    assert_eq!(alloc.stats().memory_reserved(), 572 * MIB);
    assert_eq!(alloc.stats().num_alloc_retries, 0);
    u.check_accounting();
    alloc.end_allocate_to_pool(GRAPH).unwrap();

    // After the capture: the general cache and the freeable pool go, the graph's pool stays.
    alloc.empty_cache().unwrap();
    assert_eq!(alloc.stats().memory_reserved(), 300 * MIB);
    assert_eq!(segment_pools(alloc), vec![GRAPH]);
    assert_eq!(alloc.pool_use_count(MEMPOOL), 0);
    assert!(alloc
        .check_pool_live_allocations(MEMPOOL, &Default::default())
        .is_err());
    let ptr: DevicePtr = big.ptr();
    assert!(alloc
        .check_pool_live_allocations(GRAPH, &[ptr].into_iter().collect())
        .unwrap());
    u.check_accounting();
}

#[test]
fn paged_pool_in_use_keeps_its_pages_through_reclaims_and_flushes() {
    let u = Under::new("paged", 1 << 30);
    let alloc = &*u.alloc;
    alloc.begin_allocate_to_pool(GRAPH, only(CAPTURE)).unwrap();
    let a = alloc.allocate(64 * MIB as usize, CAPTURE).unwrap();
    let addr = a.ptr();
    drop(a);
    alloc.end_allocate_to_pool(GRAPH).unwrap();
    let pool_mapped = |u: &Under| {
        u.sim
            .mappings()
            .iter()
            .filter(|(p, _)| p.0 >= addr.0 && p.0 < addr.0 + 64 * MIB)
            .map(|(_, n)| n)
            .sum::<u64>()
    };
    assert_eq!(pool_mapped(&u), 64 * MIB);
    // Step 3 would unmap free units to keep the peak down: not the pool's.
    let g = alloc.allocate(200 * MIB as usize, S0).unwrap();
    assert_eq!(pool_mapped(&u), 64 * MIB);
    assert_eq!(alloc.stats().memory_reserved(), 264 * MIB);
    drop(g);
    // A request the device cannot hold: the out-of-memory retry leaves the pool's pages.
    let e = alloc.allocate(1000 * MIB as usize, S0).unwrap_err();
    assert!(e.is_out_of_memory(), "{e:?}");
    assert_eq!(alloc.stats().num_alloc_retries, 1);
    assert_eq!(pool_mapped(&u), 64 * MIB);
    alloc.empty_cache().unwrap();
    assert_eq!(alloc.stats().memory_reserved(), 64 * MIB);
    assert_eq!(segment_pools(alloc), vec![GRAPH]);
    u.check_accounting();
    // A replay of the graph finds its pages where they were.
    alloc.begin_allocate_to_pool(GRAPH, only(CAPTURE)).unwrap();
    let again = alloc.allocate(64 * MIB as usize, CAPTURE).unwrap();
    assert_eq!(again.ptr(), addr);
    alloc.end_allocate_to_pool(GRAPH).unwrap();
    // Released with a block alive: the memory stays until the block is freed.
    alloc.release_pool(GRAPH).unwrap();
    alloc.release_pool(GRAPH).unwrap();
    assert_eq!(alloc.stats().memory_reserved(), 64 * MIB);
    drop(again);
    alloc.empty_cache().unwrap();
    assert_eq!(alloc.stats().memory_reserved(), 0);
    assert!(segment_pools(alloc).is_empty());
    u.check_accounting();
}

/// Random allocations, frees, pool windows, releases, flushes, sleeps and wakes: a page only
/// ever backs blocks of one (pool, tag); statistics, snapshot and device agree; every awake
/// block lies in a segment of its own pool.
#[test]
fn paged_random_pool_and_tag_ops_keep_invariants() {
    use berth_alloc::tags::TagGuard;
    use berth_alloc::AllocError;

    let u = Under::new("paged", 4 << 30);
    let alloc = &*u.alloc;
    let pools: [MempoolId; 2] = [GRAPH, MEMPOOL];
    let tags = [None, Some("a"), Some("b")];
    let mut rnd = berth_alloc::testing::xorshift(0x9e37_79b9_7f4a_7c15);
    // (pool, stream) of the windows open, in the order they were opened.
    let mut open: Vec<(MempoolId, StreamId)> = Vec::new();
    let mut uses = [0u32; 2];
    let mut asleep = [false; 3];
    // (ptr, rounded bytes, pool, tag index)
    let mut live: Vec<(DevicePtr, u64, MempoolId, usize)> = Vec::new();
    let mut owner: HashMap<u64, (MempoolId, usize)> = HashMap::new();
    // (allocations in a private pool, refused in a sleeping tag, sleeps)
    let mut seen = (0, 0, 0);
    for step in 0..6000u32 {
        let r = rnd() % 100;
        let stream = StreamId(rnd() % 3);
        if r < 45 {
            let t = (rnd() % 3) as usize;
            let size = 1 + rnd()
                % if r.is_multiple_of(9) {
                    48 << 20
                } else {
                    1 << 20
                };
            let _g = tags[t].map(|name| TagGuard::new(name).unwrap());
            let got = alloc.raw_alloc(size as usize, stream);
            if asleep[t] {
                assert!(matches!(got, Err(AllocError::TagAsleep { .. })), "{got:?}");
                seen.1 += 1;
                continue;
            }
            let p = got.unwrap();
            let pool = open
                .iter()
                .find(|&&(_, s)| s == stream)
                .map_or((0, 0), |&(id, _)| id);
            let bytes = size.div_ceil(512) * 512;
            seen.0 += (pool != (0, 0)) as u32;
            for page in pages(p.0, bytes) {
                let o = *owner.entry(page).or_insert((pool, t));
                assert_eq!(o, (pool, t), "step {step}: page {page:#x}");
            }
            live.push((p, bytes, pool, t));
        } else if r < 80 && !live.is_empty() {
            let (p, ..) = live.swap_remove((rnd() % live.len() as u64) as usize);
            alloc.raw_delete(p).unwrap();
        } else if r < 86 {
            let k = (rnd() % 2) as usize;
            match open.iter().position(|&(id, _)| id == pools[k]) {
                Some(i) => {
                    open.remove(i);
                    alloc.end_allocate_to_pool(pools[k]).unwrap();
                }
                None => {
                    alloc
                        .begin_allocate_to_pool(pools[k], only(stream))
                        .unwrap();
                    open.push((pools[k], stream));
                    uses[k] += 1;
                }
            }
        } else if r < 90 {
            let k = (rnd() % 2) as usize;
            if uses[k] > 0 && !open.iter().any(|&(id, _)| id == pools[k]) {
                alloc.release_pool(pools[k]).unwrap();
                uses[k] -= 1;
            }
        } else if r < 93 {
            alloc.empty_cache().unwrap();
        } else if open.is_empty() {
            let t = 1 + (rnd() % 2) as usize;
            let name = tags[t].unwrap();
            if asleep[t] {
                alloc.wake(&[name]).unwrap();
                asleep[t] = false;
            } else if live.iter().any(|l| l.3 == t) {
                alloc.sleep(&[name], &[], None).unwrap();
                asleep[t] = true;
                seen.2 += 1;
            }
        }
        if step % 150 == 0 {
            u.sim.complete_all();
            let stats = alloc.stats();
            assert_eq!(
                stats.memory_allocated(),
                live.iter().map(|l| l.1).sum::<u64>(),
                "step {step}"
            );
            assert_eq!(stats.memory_reserved(), u.sim.used_bytes(), "step {step}");
            let snap = alloc.snapshot();
            assert_eq!(
                snap.total_reserved(),
                stats.memory_reserved(),
                "step {step}"
            );
            for &(p, _, pool, t) in live.iter().filter(|l| !asleep[l.3]) {
                let seg = snap
                    .segments
                    .iter()
                    .find(|s| s.address <= p.0 && p.0 < s.address + s.total_size)
                    .unwrap_or_else(|| panic!("step {step}: {p} of tag {t} in no segment"));
                assert_eq!(seg.segment_pool_id, pool, "step {step}");
            }
            let sleeping: u64 = live.iter().filter(|l| asleep[l.3]).map(|l| l.1).sum();
            assert_eq!(
                alloc.sleep_stats().sleeping_allocated_bytes,
                sleeping,
                "step {step}"
            );
        }
    }
    assert!(seen.0 > 300 && seen.1 > 30 && seen.2 > 30, "{seen:?}");
    for (i, t) in tags.iter().enumerate() {
        if asleep[i] {
            alloc.wake(&[t.unwrap()]).unwrap();
        }
    }
    for (id, _) in open {
        alloc.end_allocate_to_pool(id).unwrap();
    }
    for (p, ..) in live {
        alloc.raw_delete(p).unwrap();
    }
    for (k, &n) in uses.iter().enumerate() {
        for _ in 0..n {
            alloc.release_pool(pools[k]).unwrap();
        }
    }
    alloc.empty_cache().unwrap();
    assert_eq!(alloc.stats().memory_reserved(), 0);
    assert_eq!(u.sim.used_bytes(), 0);
    assert!(segment_pools(alloc).is_empty());
}
