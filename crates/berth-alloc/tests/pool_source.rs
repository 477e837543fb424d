//! Private pools with an allocator of their own (`torch.cuda.MemPool(allocator=...)`,
//! `Note [Pools with their own allocator]`): the caching policy takes such a pool's segments
//! from that allocator and gives them back to it; `expandable` and `paged` refuse the pool
//! and say what to do instead.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use berth_alloc::backend::sim::SimBackend;
use berth_alloc::caching::CachingAllocator;
use berth_alloc::{AllocError, DeviceAllocator, DevicePtr, SegmentSource};

use crate::private_pools::{cache_one_block, only, segment_pools, Under, MEMPOOL, S0};
use crate::util::MIB;

/// A pool's own allocator for the tests: bump allocation from an address range the simulated
/// device never uses, `capacity` bytes live at most; it remembers what it handed out.
struct OwnAllocator {
    capacity: u64,
    st: Mutex<OwnState>,
}

#[derive(Default)]
struct OwnState {
    next: u64,
    live: BTreeMap<u64, u64>,
    allocs: u32,
    frees: u32,
}

/// Below the simulator's first address (1 << 40), so the two never overlap.
const OWN_BASE: u64 = 1 << 36;

impl OwnAllocator {
    fn new(capacity: u64) -> Arc<OwnAllocator> {
        Arc::new(OwnAllocator {
            capacity,
            st: Mutex::new(OwnState {
                next: OWN_BASE,
                ..OwnState::default()
            }),
        })
    }

    fn live_bytes(&self) -> u64 {
        self.st.lock().unwrap().live.values().sum()
    }

    /// (allocations, frees) so far.
    fn calls(&self) -> (u32, u32) {
        let st = self.st.lock().unwrap();
        (st.allocs, st.frees)
    }
}

impl SegmentSource for OwnAllocator {
    fn alloc(&self, bytes: usize) -> Option<DevicePtr> {
        let mut st = self.st.lock().unwrap();
        let bytes = bytes as u64;
        assert!(
            bytes >= 512 && bytes.is_multiple_of(512),
            "asked for {bytes} bytes"
        );
        if st.live.values().sum::<u64>() + bytes > self.capacity {
            return None;
        }
        let ptr = st.next;
        st.next += bytes;
        st.live.insert(ptr, bytes);
        st.allocs += 1;
        Some(DevicePtr(ptr))
    }

    unsafe fn free(&self, ptr: DevicePtr) {
        let mut st = self.st.lock().unwrap();
        assert!(
            st.live.remove(&ptr.0).is_some(),
            "{ptr} freed twice or never allocated"
        );
        st.frees += 1;
    }
}

/// Reserved bytes are the simulated device's plus the pool allocator's, and the statistics
/// agree with the snapshot.
fn check_accounting(u: &Under, own: &OwnAllocator) {
    let stats = u.alloc.stats();
    let snap = u.alloc.snapshot();
    let reserved: u64 = snap.segments.iter().map(|s| s.total_size).sum();
    let allocated: u64 = snap.segments.iter().map(|s| s.allocated_size).sum();
    assert_eq!(stats.memory_reserved(), reserved);
    assert_eq!(stats.memory_allocated(), allocated);
    assert_eq!(u.sim.used_bytes() + own.live_bytes(), reserved);
}

#[test]
fn a_pool_with_its_own_allocator_takes_its_segments_from_it_and_gives_them_back() {
    let u = Under::new("pytorch", 256 * MIB);
    let a = &*u.alloc;
    let own = OwnAllocator::new(u64::MAX);
    a.create_pool_with_source(MEMPOOL, own.clone()).unwrap();
    assert_eq!(a.pool_use_count(MEMPOOL), 1);
    // with torch.cuda.use_mem_pool(pool): a large and a small request.
    a.begin_allocate_to_pool(MEMPOOL, only(S0)).unwrap();
    let large = a.raw_alloc(3 * MIB as usize, S0).unwrap();
    let small = a.raw_alloc(1000, S0).unwrap();
    // PyTorch's segment sizes: 20 MiB for a large request under 10 MiB, 2 MiB for a small one.
    assert_eq!(own.calls(), (2, 0));
    assert_eq!(own.live_bytes(), 22 * MIB);
    assert_eq!(u.sim.used_bytes(), 0, "the device backend gave nothing");
    assert!(large.0 >= OWN_BASE && large.0 < 1 << 40, "{large}");
    assert_eq!(segment_pools(a), vec![MEMPOOL, MEMPOOL]);
    let stats = a.stats();
    assert_eq!(stats.num_device_alloc, 2);
    assert_eq!(stats.memory_reserved(), 22 * MIB);
    check_accounting(&u, &own);
    // Freed and asked again, the pool's cache serves it: no new segment.
    a.raw_delete(large).unwrap();
    let again = a.raw_alloc(3 * MIB as usize, S0).unwrap();
    assert_eq!(again, large);
    assert_eq!(own.calls(), (2, 0));
    // Leaving use_mem_pool ends the allocation window and gives back the use it took.
    a.end_allocate_to_pool(MEMPOOL).unwrap();
    a.release_pool(MEMPOOL).unwrap();
    // Outside the pool, memory comes from the device as before.
    let general = a.raw_alloc(3 * MIB as usize, S0).unwrap();
    assert_eq!(u.sim.used_bytes(), 20 * MIB);
    assert_eq!(own.calls(), (2, 0));
    check_accounting(&u, &own);
    // The MemPool goes away (release, empty_cache): its segments go back to its allocator,
    // and berth lets go of the allocator once the pool is forgotten.
    a.raw_delete(again).unwrap();
    a.raw_delete(small).unwrap();
    a.raw_delete(general).unwrap();
    a.release_pool(MEMPOOL).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(own.calls(), (2, 2));
    assert_eq!(own.live_bytes(), 0);
    assert_eq!(u.sim.used_bytes(), 0);
    assert_eq!(a.stats().memory_reserved(), 0);
    assert_eq!(a.stats().num_device_free, 3);
    assert_eq!(
        Arc::strong_count(&own),
        1,
        "the allocator is dropped with the pool"
    );
}

#[test]
fn a_pool_allocator_out_of_memory_is_out_of_memory_after_the_cache_is_tried() {
    let u = Under::new("pytorch", 256 * MIB);
    let a = &*u.alloc;
    let own = OwnAllocator::new(24 * MIB);
    a.create_pool_with_source(MEMPOOL, own.clone()).unwrap();
    a.begin_allocate_to_pool(MEMPOOL, only(S0)).unwrap();
    let first = a.raw_alloc(20 * MIB as usize, S0).unwrap();
    // 20 MiB more does not fit the pool's allocator, though the device has room.
    let e = a.raw_alloc(20 * MIB as usize, S0).unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
    assert_eq!(a.stats().num_ooms, 1);
    assert_eq!(own.calls(), (1, 0));
    check_accounting(&u, &own);
    // Once the first is freed, the same request is served from the pool's cache.
    a.raw_delete(first).unwrap();
    let second = a.raw_alloc(20 * MIB as usize, S0).unwrap();
    assert_eq!(second, first);
    a.raw_delete(second).unwrap();
    a.end_allocate_to_pool(MEMPOOL).unwrap();
    a.release_pool(MEMPOOL).unwrap();
    a.release_pool(MEMPOOL).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(own.live_bytes(), 0);
}

#[test]
fn the_memory_fraction_counts_a_pool_allocators_segments() {
    let u = Under::new("pytorch", 100 * MIB);
    let a = &*u.alloc;
    let own = OwnAllocator::new(u64::MAX);
    a.set_memory_fraction(0.5).unwrap();
    a.create_pool_with_source(MEMPOOL, own.clone()).unwrap();
    a.begin_allocate_to_pool(MEMPOOL, only(S0)).unwrap();
    let p = a.raw_alloc(30 * MIB as usize, S0).unwrap();
    a.end_allocate_to_pool(MEMPOOL).unwrap();
    // 30 MiB reserved through the pool's allocator leaves 20 MiB of the 50 MiB cap.
    let e = a.raw_alloc(30 * MIB as usize, S0).unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
    assert_eq!(u.sim.used_bytes(), 0);
    a.raw_delete(p).unwrap();
}

#[test]
fn expandable_and_paged_refuse_a_pool_with_its_own_allocator_saying_what_to_do() {
    for policy in ["expandable", "paged"] {
        let u = Under::new(policy, 64 * MIB);
        let own = OwnAllocator::new(u64::MAX);
        let e = u
            .alloc
            .create_pool_with_source(MEMPOOL, own.clone())
            .unwrap_err();
        let AllocError::PolicyLacks {
            feature, instead, ..
        } = &e
        else {
            panic!("{policy}: {e:?}");
        };
        assert!(feature.contains("MemPool(allocator=...)"), "{policy}: {e}");
        assert!(instead.contains("\"pytorch\" policy"), "{policy}: {e}");
        assert_eq!(u.alloc.pool_use_count(MEMPOOL), 0, "{policy}: no pool made");
        assert_eq!(
            Arc::strong_count(&own),
            1,
            "{policy}: the allocator is not kept"
        );
    }
    // expandable names PyTorch's own refusal; paged names its own sleep mode.
    let e = Under::new("expandable", 64 * MIB)
        .alloc
        .create_pool_with_source(MEMPOOL, OwnAllocator::new(1))
        .unwrap_err();
    assert!(e.to_string().contains("expandable_segments"), "{e}");
    let e = Under::new("paged", 64 * MIB)
        .alloc
        .create_pool_with_source(MEMPOOL, OwnAllocator::new(1))
        .unwrap_err();
    assert!(e.to_string().contains("berth_torch.region"), "{e}");
}

#[test]
fn an_allocator_is_given_to_a_new_pool_only() {
    let u = Under::new("pytorch", 64 * MIB);
    let a = &*u.alloc;
    let own = OwnAllocator::new(u64::MAX);
    let e = a.create_pool_with_source((0, 0), own.clone()).unwrap_err();
    assert!(matches!(e, AllocError::NoSuchPool { .. }), "{e:?}");
    a.create_or_incref_pool(MEMPOOL).unwrap();
    let e = a.create_pool_with_source(MEMPOOL, own.clone()).unwrap_err();
    assert!(matches!(e, AllocError::NoSuchPool { .. }), "{e:?}");
    assert!(e.to_string().contains("exists already"), "{e}");
    assert_eq!(a.pool_use_count(MEMPOOL), 1, "the use count is unchanged");
    assert_eq!(Arc::strong_count(&own), 1);
    // Once created with one, more uses are counted as for any pool.
    let other = (0, 9);
    a.create_pool_with_source(other, own.clone()).unwrap();
    a.create_or_incref_pool(other).unwrap();
    assert_eq!(a.pool_use_count(other), 2);
}

/// A pool allocator that calls back into the allocator it serves on every free, as one that
/// runs Python (vLLM's) may: a free made with the allocator's lock held would never return.
struct ReentrantAllocator {
    inner: Arc<OwnAllocator>,
    alloc: Mutex<Option<CachingAllocator<Arc<SimBackend>>>>,
    reentered: AtomicUsize,
}

impl SegmentSource for ReentrantAllocator {
    fn alloc(&self, bytes: usize) -> Option<DevicePtr> {
        self.inner.alloc(bytes)
    }

    unsafe fn free(&self, ptr: DevicePtr) {
        if let Some(a) = self.alloc.lock().unwrap().as_ref() {
            // Takes the allocator's lock, and allocates and frees a small block.
            let _ = a.stats();
            let p = a.raw_alloc(512, S0).unwrap();
            a.raw_delete(p).unwrap();
            self.reentered.fetch_add(1, Ordering::SeqCst);
        }
        // SAFETY: the caller's contract, passed on.
        unsafe { self.inner.free(ptr) }
    }
}

#[test]
fn a_pool_allocator_is_never_called_with_the_allocators_lock_held() {
    let (done, finished) = mpsc::channel();
    std::thread::spawn(move || {
        let sim = Arc::new(SimBackend::new(256 * MIB));
        let a = CachingAllocator::new(Arc::clone(&sim));
        let own = Arc::new(ReentrantAllocator {
            inner: OwnAllocator::new(u64::MAX),
            alloc: Mutex::new(Some(a.clone())),
            reentered: AtomicUsize::new(0),
        });
        a.create_pool_with_source(MEMPOOL, own.clone()).unwrap();
        cache_one_block(&a, MEMPOOL, MIB);
        a.release_pool(MEMPOOL).unwrap();
        a.release_pool(MEMPOOL).unwrap();
        // empty_cache gives the segment back: the allocator's free runs after the lock is
        // dropped, and lets go of the pool's allocator there too.
        a.empty_cache().unwrap();
        let reentered = own.reentered.load(Ordering::SeqCst);
        let live = own.inner.live_bytes();
        own.alloc.lock().unwrap().take();
        done.send((reentered, live)).unwrap();
    });
    let (reentered, live) = finished
        .recv_timeout(Duration::from_secs(60))
        .expect("the pool allocator's free deadlocked on the allocator's lock");
    assert_eq!((reentered, live), (1, 0));
}

#[test]
fn out_of_memory_gives_a_freeable_pools_segments_back_to_its_allocator_and_retries() {
    // The device has room for one 20 MiB segment besides the pool's own memory: the pool's
    // cached segment is released (to its allocator) when a general request cannot be served,
    // and borrowed first when the pool lends on out-of-memory.
    for lend in [false, true] {
        let u = Under::new("pytorch", 48 * MIB);
        let a = &*u.alloc;
        let own = OwnAllocator::new(u64::MAX);
        a.create_pool_with_source(MEMPOOL, own.clone()).unwrap();
        a.set_use_on_oom(MEMPOOL, lend).unwrap();
        let p = cache_one_block(a, MEMPOOL, 20 * MIB);
        a.release_pool(MEMPOOL).unwrap();
        let big = a.raw_alloc(40 * MIB as usize, S0).unwrap();
        let next = a.raw_alloc(20 * MIB as usize, S0);
        if lend {
            // The pool is still alive (one use): its cached block is lent, from its allocator.
            let next = next.unwrap();
            assert_eq!(next, p, "lent the pool's block");
            assert_eq!(own.live_bytes(), 20 * MIB);
            a.raw_delete(next).unwrap();
        } else {
            // Alive pools are not flushed: out-of-memory, and the pool's segment stays.
            assert!(next.unwrap_err().is_out_of_memory());
            assert_eq!(own.live_bytes(), 20 * MIB);
            // Once freeable, the retry after the flush gives it back to its allocator.
            a.release_pool(MEMPOOL).unwrap();
            assert_eq!(Arc::strong_count(&own), 2, "held by the pool");
            let _ = a.raw_alloc(20 * MIB as usize, S0).unwrap_err();
            assert_eq!(
                own.live_bytes(),
                0,
                "the flush gave it back to the pool's allocator"
            );
            assert_eq!(own.calls(), (1, 1));
            assert_eq!(
                Arc::strong_count(&own),
                1,
                "let go of with the forgotten pool"
            );
        }
        a.raw_delete(big).unwrap();
        check_accounting(&u, &own);
    }
}
