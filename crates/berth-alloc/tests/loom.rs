//! loom model checks of the allocators' concurrent paths (house style, "Concurrency").
//!
//! Built only with `RUSTFLAGS="--cfg loom"`, which swaps the locks and atomics of
//! `berth_alloc`'s `src/sync.rs` for loom's; run by `.ci/loom`:
//!
//! ```text
//! RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 cargo test -p berth-alloc --test tests loom::
//! ```
//!
//! loom runs each model once per interleaving of the threads' lock operations (up to
//! `LOOM_MAX_PREEMPTIONS` preemptions, 2 unless set) and every assertion below must hold in
//! each of them: no block is handed out twice, no block is reused while an event recorded on it
//! is pending (PyTorch's `insert_events` / `process_events`), the statistics agree with the
//! backend, and freeing everything then `empty_cache` leaves nothing reserved.
//!
//! Test bookkeeping uses `std::sync::Mutex` on purpose: its critical sections contain no loom
//! operation, so loom never switches threads inside one (they cannot be contended) and they add
//! no interleavings to explore.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex as StdMutex};

use ::loom::model::Builder;
use ::loom::thread;
use berth_alloc::backend::sim::SimBackend;
use berth_alloc::caching::CachingAllocator;
use berth_alloc::host::{HostAllocator, HostCachingAllocator, SimHostBackend};
use berth_alloc::{DeviceAllocator, DevicePtr, DeviceStream, PagedBestFit, StreamId};

const S0: StreamId = StreamId(0);
const S1: StreamId = StreamId(1);

/// Explores every interleaving of `f` (bounded by `LOOM_MAX_PREEMPTIONS`, 2 by default) and
/// prints how many loom ran.
fn model(name: &str, f: impl Fn() + Send + Sync + 'static) {
    static RUNS: AtomicUsize = AtomicUsize::new(0);
    let mut builder = Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(2);
    }
    let before = RUNS.load(Ordering::Relaxed);
    builder.check(move || {
        RUNS.fetch_add(1, Ordering::Relaxed);
        f();
    });
    // Tests run one at a time under `.ci/loom` (`--test-threads=1`), so the difference is ours.
    let runs = RUNS.load(Ordering::Relaxed) - before;
    eprintln!("loom: {name}: {runs} interleavings");
}

/// Address ranges the test threads currently hold: inserted after an allocation returns and
/// removed before the free starts, so it is always a subset of the blocks really live and an
/// overlap means one block was handed out twice.
#[derive(Default)]
struct Live(StdMutex<Vec<(u64, u64)>>);

impl Live {
    fn insert(&self, ptr: DevicePtr, bytes: usize) {
        let (start, end) = (ptr.0, ptr.0 + bytes as u64);
        let mut live = self.0.lock().unwrap();
        for &(s, e) in live.iter() {
            assert!(
                end <= s || start >= e,
                "{start:#x}..{end:#x} handed out while {s:#x}..{e:#x} is live"
            );
        }
        live.push((start, end));
    }

    fn remove(&self, ptr: DevicePtr) {
        let mut live = self.0.lock().unwrap();
        let i = live.iter().position(|&(s, _)| s == ptr.0).unwrap();
        live.swap_remove(i);
    }
}

/// One thread's work on a device allocator: an RAII allocation and a raw one, each freed.
fn alloc_free_raw<A: DeviceAllocator>(alloc: &A, live: &Live, bytes: usize) {
    let a = alloc.allocate(bytes, S0).unwrap();
    live.insert(a.ptr(), bytes);
    live.remove(a.ptr());
    drop(a);
    let p = alloc.raw_alloc(bytes, S0).unwrap();
    live.insert(p, bytes);
    live.remove(p);
    alloc.raw_delete(p).unwrap();
}

/// After every thread joined and freed everything: nothing allocated, the statistics agree
/// with the backend, and `empty_cache` returns every byte.
fn check_drained<A: DeviceAllocator>(alloc: &A, sim: &SimBackend) {
    alloc.check_err().unwrap();
    let s = alloc.stats();
    assert_eq!(s.memory_allocated(), 0);
    assert_eq!(s.allocation.all().current, 0);
    assert_eq!(s.active.all().current, 0);
    assert_eq!(
        s.memory_reserved(),
        sim.used_bytes(),
        "reserved = device memory held"
    );
    alloc.empty_cache().unwrap();
    let s = alloc.stats();
    assert_eq!((s.memory_reserved(), sim.used_bytes()), (0, 0));
    assert_eq!(s.segment.all().current, 0);
}

#[test]
fn loom_caching_two_threads_allocate_free_and_raw_delete() {
    model("caching, 2 threads", || {
        let alloc = CachingAllocator::new(SimBackend::new(1 << 30));
        let live = Arc::new(Live::default());
        let (a2, l2) = (alloc.clone(), live.clone());
        let t = thread::spawn(move || alloc_free_raw(&a2, &l2, 600 << 10));
        alloc_free_raw(&alloc, &live, 4 << 10);
        t.join().unwrap();
        alloc.validate().unwrap();
        let s = alloc.stats();
        // Both requests fit one 2 MiB small segment; a second one exists only when both
        // threads missed the cache at once (malloc runs with the lock released).
        assert!(s.segment.all().allocated == 1 || s.segment.all().allocated == 2);
        assert_eq!(s.num_device_alloc as u64, alloc.backend().counts().malloc);
        assert_eq!(s.allocation.all().allocated, 4);
        check_drained(&alloc, alloc.backend());
        alloc.validate().unwrap();
    });
}

#[test]
fn loom_caching_three_threads_allocate_and_free() {
    model("caching, 3 threads", || {
        let alloc = CachingAllocator::new(SimBackend::new(1 << 30));
        let live = Arc::new(Live::default());
        let threads: Vec<_> = [1usize << 10, 700 << 10]
            .into_iter()
            .map(|bytes| {
                let (a, l) = (alloc.clone(), live.clone());
                thread::spawn(move || {
                    let p = a.raw_alloc(bytes, S0).unwrap();
                    l.insert(p, bytes);
                    l.remove(p);
                    a.raw_delete(p).unwrap();
                })
            })
            .collect();
        let p = alloc.raw_alloc(900 << 10, S0).unwrap();
        live.insert(p, 900 << 10);
        live.remove(p);
        alloc.raw_delete(p).unwrap();
        threads.into_iter().for_each(|t| t.join().unwrap());
        alloc.validate().unwrap();
        check_drained(&alloc, alloc.backend());
    });
}

#[test]
fn loom_paged_two_threads_allocate_free_and_raw_delete() {
    model("paged, 2 threads", || {
        let alloc = PagedBestFit::new(SimBackend::new(1 << 30)).unwrap();
        let live = Arc::new(Live::default());
        let (a2, l2) = (alloc.clone(), live.clone());
        let t = thread::spawn(move || alloc_free_raw(&a2, &l2, 3 << 20));
        alloc_free_raw(&alloc, &live, 4 << 10);
        t.join().unwrap();
        assert_eq!(alloc.stats().allocation.all().allocated, 4);
        check_drained(&alloc, alloc.backend());
    });
}

/// The deferred free path: thread A frees a block used on stream 1 (an event is recorded on
/// stream 1, `insert_events`) while thread B completes stream 1's events and allocates the same
/// size (`process_events` runs first). B may get A's block only if A's event had completed.
#[test]
fn loom_caching_deferred_free_races_event_completion_and_allocation() {
    model("caching, deferred free vs process_events", || {
        let alloc = CachingAllocator::new(SimBackend::new(1 << 30));
        let live = Arc::new(Live::default());
        let (a2, l2) = (alloc.clone(), live.clone());
        let t = thread::spawn(move || {
            let a = a2.allocate(4 << 10, S0).unwrap();
            let addr = a.ptr();
            l2.insert(addr, 4 << 10);
            a.record_stream(S1).unwrap();
            l2.remove(addr);
            drop(a);
            addr
        });
        alloc.backend().complete_events_on(S1);
        let b = alloc.raw_alloc(4 << 10, S0).unwrap();
        let pending_then = alloc.backend().pending_events(S1);
        live.insert(b, 4 << 10);
        live.remove(b);
        alloc.raw_delete(b).unwrap();
        let a = t.join().unwrap();
        if a == b {
            assert_eq!(
                pending_then, 0,
                "block reused while its stream-1 event was pending"
            );
        }
        alloc.validate().unwrap();
        // A's free may still wait for its event; only the (mocked) device can finish it.
        alloc.backend().complete_all();
        alloc.process_events().unwrap();
        check_drained(&alloc, alloc.backend());
    });
}

/// The same deferred free racing `empty_cache` (which syncs every pending event first,
/// `synchronize_and_free_events`) and an allocation on another stream.
#[test]
fn loom_caching_deferred_free_races_empty_cache() {
    model("caching, deferred free vs empty_cache", || {
        let alloc = CachingAllocator::new(SimBackend::new(1 << 30));
        let live = Arc::new(Live::default());
        let (a2, l2) = (alloc.clone(), live.clone());
        let t = thread::spawn(move || {
            let a = a2.allocate(4 << 10, S0).unwrap();
            l2.insert(a.ptr(), 4 << 10);
            a.record_stream(S1).unwrap();
            l2.remove(a.ptr());
            drop(a);
        });
        alloc.empty_cache().unwrap();
        let b = alloc.raw_alloc(4 << 10, S1).unwrap();
        live.insert(b, 4 << 10);
        live.remove(b);
        alloc.raw_delete(b).unwrap();
        t.join().unwrap();
        alloc.validate().unwrap();
        let s = alloc.stats();
        assert!(s.memory_reserved() >= s.memory_allocated());
        assert_eq!(s.memory_reserved(), alloc.backend().used_bytes());
        alloc.backend().complete_all();
        alloc.process_events().unwrap();
        check_drained(&alloc, alloc.backend());
    });
}

/// The host allocator's reuse-after-event path: thread A writes its block, marks it used on
/// stream 7 and frees it (an event is recorded outside the lock); thread B completes stream 7
/// and allocates the same size. B gets A's block only after A's event completed, and neither
/// ever sees the other's bytes.
#[test]
fn loom_host_reuse_after_event() {
    model("host, reuse after event", || {
        let s7 = StreamId(7);
        let sim = Arc::new(SimHostBackend::new(1 << 20));
        let host = Arc::new(HostCachingAllocator::new(sim.clone()));
        let h2 = host.clone();
        let t = thread::spawn(move || {
            let mut a = h2.allocate(4 << 10).unwrap();
            // SAFETY: this thread owns the block and no stream uses it yet.
            unsafe { a.as_mut_slice() }.fill(1);
            a.record_stream(DeviceStream::new(0, s7)).unwrap();
            // SAFETY: as above; the simulated stream never touches host memory.
            assert!(unsafe { a.as_slice() }.iter().all(|&b| b == 1));
            let addr = a.as_ptr() as usize;
            drop(a);
            addr
        });
        sim.complete_events_on(s7);
        let mut b = host.allocate(4 << 10).unwrap();
        let pending_then = sim.event_source().pending_events(s7);
        // SAFETY: this thread owns the block; no stream uses it.
        unsafe { b.as_mut_slice() }.fill(2);
        // SAFETY: as above.
        assert!(unsafe { b.as_slice() }.iter().all(|&x| x == 2));
        let b_addr = b.as_ptr() as usize;
        drop(b);
        let a_addr = t.join().unwrap();
        if a_addr == b_addr {
            assert_eq!(
                pending_then, 0,
                "host block reused while its event was pending"
            );
        }
        host.check_err().unwrap();
        let st = host.stats();
        assert_eq!(
            (st.active_requests.current, st.active_bytes.current),
            (0, 0)
        );
        assert_eq!(st.active_requests.allocated, 2);
        assert!(st.num_host_alloc == 1 || st.num_host_alloc == 2);
        sim.complete_all();
        host.empty_cache().unwrap();
        assert_eq!((sim.used_bytes(), sim.live_regions()), (0, 0));
        assert_eq!(host.stats().allocations.current, 0);
        assert_eq!(host.pending_events(), 0);
    });
}

/// Two threads race for the one cached host block (and a fresh one from the backend): each
/// writes its own byte pattern and reads it back before freeing, so a block handed to both
/// would show the other's bytes; the block addresses never overlap.
#[test]
fn loom_host_two_threads_share_one_cached_block() {
    model("host, 2 threads race for a cached block", || {
        let sim = Arc::new(SimHostBackend::new(1 << 20));
        let host = Arc::new(HostCachingAllocator::new(sim.clone()));
        drop(host.allocate(4 << 10).unwrap()); // one cached 4 KiB block
        let live = Arc::new(Live::default());
        let work = |host: &HostCachingAllocator<Arc<SimHostBackend>>, live: &Live, byte: u8| {
            let mut a = host.allocate(4 << 10).unwrap();
            let p = DevicePtr(a.as_ptr() as u64);
            live.insert(p, 4 << 10);
            // SAFETY: this thread owns the block; no stream uses it.
            unsafe { a.as_mut_slice() }.fill(byte);
            // SAFETY: as above.
            assert!(unsafe { a.as_slice() }.iter().all(|&b| b == byte));
            live.remove(p);
        };
        let (h2, l2) = (host.clone(), live.clone());
        let t = thread::spawn(move || work(&h2, &l2, 1));
        work(&host, &live, 2);
        t.join().unwrap();
        host.check_err().unwrap();
        let st = host.stats();
        assert_eq!(st.active_requests.current, 0);
        assert_eq!(st.active_requests.allocated, 3);
        // The cached block served the first thread; the second got it back after the first
        // freed it, or a new block from the backend if both held one at once.
        assert!(st.num_host_alloc == 1 || st.num_host_alloc == 2);
        assert_eq!(st.allocations.current, st.num_host_alloc);
        host.empty_cache().unwrap();
        assert_eq!((sim.used_bytes(), host.stats().allocations.current), (0, 0));
    });
}
