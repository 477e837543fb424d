//! `HostCachingAllocator` on `SimHostBackend`: PyTorch's host policy
//! (<https://github.com/pytorch/pytorch/blob/main/aten/src/ATen/core/CachingHostAllocator.h>).

use std::sync::Arc;

use berth_alloc::host::{
    host_block_size, HostAllocError, HostAllocator, HostAllocatorConfig, HostBackend,
    HostCachingAllocator, SimHostBackend,
};
use berth_alloc::{BackendError, DeviceStream, StreamId};

const MIB: usize = 1 << 20;

fn alloc_with(
    capacity: u64,
) -> (
    Arc<SimHostBackend>,
    HostCachingAllocator<Arc<SimHostBackend>>,
) {
    let sim = Arc::new(SimHostBackend::new(capacity));
    (sim.clone(), HostCachingAllocator::new(sim))
}

#[test]
fn host_sizes_round_up_to_powers_of_two() {
    assert_eq!(host_block_size(1), Some(1));
    assert_eq!(host_block_size(3 * MIB), Some(4 * MIB));
    assert_eq!(host_block_size(64 * MIB + 1), Some(128 * MIB));
    assert_eq!(host_block_size(4096), Some(4096));
    assert_eq!(host_block_size(4097), Some(8192));
    assert_eq!(host_block_size(usize::MAX), None);

    let (sim, host) = alloc_with(1 << 30);
    let a = host.allocate(3 * MIB).unwrap();
    assert_eq!((a.len(), a.capacity()), (3 * MIB, 4 * MIB));
    assert_eq!(sim.used_bytes(), 4 << 20);
    drop(a);
    // A cached 4 MiB block never serves an 8 MiB request, nor a 1 MiB one (no splitting).
    let b = host.allocate(5 * MIB).unwrap();
    let c = host.allocate(MIB).unwrap();
    assert_eq!((b.capacity(), c.capacity()), (8 * MIB, MIB));
    assert_eq!(host.stats().num_host_alloc, 3);
    assert_eq!(sim.used_bytes(), (4 + 8 + 1) << 20);
    // ...but serves any request that rounds to 4 MiB, most recently freed first.
    let d = host.allocate(4 * MIB - 7).unwrap();
    assert_eq!(host.stats().num_host_alloc, 3);
    assert_eq!(d.capacity(), 4 * MIB);
}

#[test]
fn host_free_lists_are_lifo() {
    let (_sim, host) = alloc_with(1 << 30);
    let a = host.allocate(MIB).unwrap();
    let b = host.allocate(MIB).unwrap();
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    assert_ne!(pa, pb);
    drop(a);
    drop(b);
    assert_eq!(host.allocate(MIB).unwrap().as_ptr(), pb);
}

#[test]
fn host_block_reused_only_after_every_streams_event_completes() {
    let (sim, host) = alloc_with(1 << 30);
    let (s1, s2) = (StreamId(11), StreamId(22));
    let a = host.allocate(2 * MIB).unwrap();
    let first = a.as_ptr();
    a.record_stream(DeviceStream::new(0, s1)).unwrap();
    a.record_stream(DeviceStream::new(0, s2)).unwrap();
    a.record_stream(DeviceStream::new(0, s1)).unwrap(); // recorded twice: still one event on s1
    drop(a);
    assert_eq!(host.pending_events(), 2);
    assert_eq!(sim.event_source().pending_events(s1), 1);

    // Both events pending: a new block.
    let b = host.allocate(2 * MIB).unwrap();
    assert_ne!(b.as_ptr(), first);
    drop(b);
    // s1 done, s2 still pending: the cached second block is reused, the first is not.
    sim.complete_events_on(s1);
    let c = host.allocate(2 * MIB).unwrap();
    assert_ne!(c.as_ptr(), first);
    let d = host.allocate(2 * MIB).unwrap();
    assert_ne!(d.as_ptr(), first);
    assert_eq!(host.stats().num_host_alloc, 3);
    assert_eq!(host.pending_events(), 1);
    // s2 done: the first block comes back.
    sim.complete_events_on(s2);
    let e = host.allocate(2 * MIB).unwrap();
    assert_eq!(e.as_ptr(), first);
    assert_eq!(host.stats().num_host_alloc, 3);
    assert_eq!(host.pending_events(), 0);
}

/// Streams carry their device: both simulated devices' default streams are handle 0, and a
/// pinned block read by a copy on device 1's default stream must wait for device 1's event,
/// not device 0's (the event is recorded on the stream's device, whatever the freeing thread
/// has current).
#[test]
fn host_block_used_on_a_second_devices_stream_waits_for_that_devices_event() {
    use berth_alloc::backend::sim::SimBackend;
    let dev0 = Arc::new(SimBackend::new(1 << 30));
    let dev1 = Arc::new(SimBackend::new(1 << 30));
    let sim = Arc::new(SimHostBackend::with_devices(
        1 << 30,
        vec![dev0.clone(), dev1.clone()],
    ));
    let host = HostCachingAllocator::new(sim.clone());
    let on_dev1 = DeviceStream::new(1, StreamId::DEFAULT);
    let a = host.allocate(2 * MIB).unwrap();
    let first = a.as_ptr();
    a.record_stream(on_dev1).unwrap();
    drop(a);
    assert_eq!(dev1.pending_events(StreamId::DEFAULT), 1);
    assert_eq!(dev0.pending_events(StreamId::DEFAULT), 0);

    // Device 0's default stream finishing says nothing about device 1's.
    dev0.complete_events_on(StreamId::DEFAULT);
    let b = host.allocate(2 * MIB).unwrap();
    assert_ne!(b.as_ptr(), first);
    assert_eq!(host.stats().num_host_alloc, 2);
    drop(b);
    let c = host.allocate(2 * MIB).unwrap(); // the second block, cached
    assert_ne!(c.as_ptr(), first);
    assert_eq!(host.pending_events(), 1);

    // Device 1's copy done: the first block comes back.
    sim.complete_events_on_device(on_dev1);
    let d = host.allocate(2 * MIB).unwrap();
    assert_eq!(d.as_ptr(), first);
    assert_eq!(host.stats().num_host_alloc, 2);
    assert_eq!(host.pending_events(), 0);
}

/// A stream of a device the host backend does not serve is an error kept for `check_err`,
/// and the block is never handed out again (it cannot be proven idle).
#[test]
fn host_event_on_an_unknown_device_is_an_error_and_the_block_is_kept_out() {
    let (sim, host) = alloc_with(1 << 30);
    let a = host.allocate(4096).unwrap();
    let first = a.as_ptr();
    a.record_stream(DeviceStream::new(3, StreamId(5))).unwrap();
    drop(a);
    let err = host.check_err().unwrap_err().to_string();
    assert!(err.contains("invalid device ordinal 3"), "{err}");
    sim.complete_all();
    assert_ne!(host.allocate(4096).unwrap().as_ptr(), first);
}

#[test]
fn host_events_are_processed_oldest_first_and_stop_at_a_pending_one() {
    let (sim, host) = alloc_with(1 << 30);
    let (s1, s2) = (StreamId(1), StreamId(2));
    let a = host.allocate(4096).unwrap();
    let b = host.allocate(4096).unwrap();
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    a.record_stream(DeviceStream::new(0, s1)).unwrap();
    b.record_stream(DeviceStream::new(0, s2)).unwrap();
    drop(a); // oldest event: s1
    drop(b);
    // Only s2's (newer) event completed: processing stops at s1's, so b is not collected yet.
    sim.complete_events_on(s2);
    let c = host.allocate(4096).unwrap();
    assert!(c.as_ptr() != pa && c.as_ptr() != pb);
    sim.complete_events_on(s1);
    let d = host.allocate(4096).unwrap();
    let e = host.allocate(4096).unwrap();
    let mut got = [d.as_ptr(), e.as_ptr()];
    got.sort();
    let mut want = [pa, pb];
    want.sort();
    assert_eq!(got, want);
}

#[test]
fn host_empty_cache_frees_every_cached_block_and_keeps_the_rest() {
    let (sim, host) = alloc_with(1 << 30);
    let blocks: Vec<_> = [MIB, 2 * MIB, 3 * MIB, 4096]
        .iter()
        .map(|&n| host.allocate(n).unwrap())
        .collect();
    let kept = host.allocate(8 * MIB).unwrap();
    let pending = host.allocate(16 * MIB).unwrap();
    pending
        .record_stream(DeviceStream::new(0, StreamId(5)))
        .unwrap();
    drop(blocks);
    drop(pending);
    assert_eq!(host.cached_bytes(), (MIB + 2 * MIB + 4 * MIB + 4096) as u64);
    host.empty_cache().unwrap();
    assert_eq!(host.cached_bytes(), 0);
    // In use (8 MiB) and waiting on an event (16 MiB) stay.
    assert_eq!(sim.used_bytes(), 24 << 20);
    assert_eq!(sim.live_regions(), 2);
    let st = host.stats();
    assert_eq!(st.num_host_free, 4);
    assert_eq!(st.allocations.current, 2);
    assert_eq!(st.allocated_bytes.current, 24 << 20);
    assert_eq!(st.host_free_time.count, 4);
    // Once the event completes and the last block is dropped, everything goes.
    sim.complete_all();
    drop(kept);
    host.empty_cache().unwrap();
    assert_eq!(sim.used_bytes(), 0);
    assert_eq!(host.stats().allocated_bytes.current, 0);
    assert_eq!(sim.counts().free_pinned, 6);
}

#[test]
fn host_stats_have_pytorchs_28_keys_and_exact_values() {
    let (_sim, host) = alloc_with(1 << 30);
    let a = host.allocate(3 * MIB).unwrap();
    let b = host.allocate(100).unwrap();
    drop(a);
    let c = host.allocate(4 * MIB).unwrap(); // reuses a's block
    let m = host.host_memory_stats();
    let mut keys = Vec::new();
    for s in [
        "active_bytes",
        "active_requests",
        "allocated_bytes",
        "allocations",
    ] {
        for f in ["allocated", "current", "freed", "peak"] {
            keys.push(format!("{s}.{f}"));
        }
    }
    for s in ["host_alloc_time", "host_free_time"] {
        for f in ["avg", "count", "max", "min", "total"] {
            keys.push(format!("{s}.{f}"));
        }
    }
    keys.push("num_host_alloc".into());
    keys.push("num_host_free".into());
    keys.sort();
    assert_eq!(m.keys().cloned().collect::<Vec<_>>(), keys);
    assert_eq!(m.len(), 28);
    assert_eq!(m["allocations.current"], 2);
    assert_eq!(m["allocated_bytes.current"], (4 << 20) + 128);
    assert_eq!(m["active_requests.current"], 2);
    assert_eq!(m["active_requests.allocated"], 3);
    assert_eq!(m["active_requests.freed"], 1);
    assert_eq!(m["active_bytes.peak"], (4 << 20) + 128);
    assert_eq!(m["num_host_alloc"], 2);
    assert_eq!(m["host_alloc_time.count"], 2);
    assert_eq!(m["num_host_free"], 0);
    drop((b, c));
    let st = host.stats();
    assert_eq!(
        (st.active_requests.current, st.active_bytes.current),
        (0, 0)
    );
    assert_eq!(st.allocated_bytes.current, (4 << 20) + 128);
    host.reset_peak_stats();
    assert_eq!(host.stats().active_bytes.peak, 0);
    host.reset_accumulated_stats();
    let st = host.stats();
    assert_eq!(
        (
            st.active_requests.allocated,
            st.num_host_alloc,
            st.host_alloc_time.count
        ),
        (0, 0, 0)
    );
    assert_eq!(st.allocations.current, 2);
}

#[test]
fn host_zero_bytes_gives_an_empty_unpinned_allocation() {
    let (sim, host) = alloc_with(1 << 20);
    let z = host.allocate(0).unwrap();
    assert!(z.as_ptr().is_null() && z.is_empty() && !z.is_pinned());
    z.record_stream(DeviceStream::new(0, StreamId(3))).unwrap();
    assert_eq!(host.stats(), Default::default());
    assert_eq!(sim.counts().alloc_pinned, 0);
}

#[test]
fn host_rejects_foreign_pointers_and_huge_requests() {
    let (_sim, host) = alloc_with(1 << 20);
    let v = [0u8; 16];
    assert_eq!(
        host.record_stream(v.as_ptr(), DeviceStream::new(0, StreamId(1))),
        Err(HostAllocError::InvalidPointer {
            addr: v.as_ptr() as usize
        })
    );
    assert!(!host.is_pinned(v.as_ptr()));
    assert_eq!(
        host.allocate(usize::MAX).unwrap_err(),
        HostAllocError::TooLarge {
            requested: usize::MAX as u64
        }
    );
    let a = host.allocate(4096).unwrap();
    // Views (interior pointers) are pinned and can record streams, as PyTorch looks them up.
    // SAFETY: 100 < 4096, inside the block.
    let inner = unsafe { a.as_ptr().add(100) };
    assert!(host.is_pinned(inner));
    host.record_stream(inner, DeviceStream::new(0, StreamId(9)))
        .unwrap();
    drop(a);
    assert_eq!(host.pending_events(), 1);
    // A freed block is no longer a valid target.
    assert!(host
        .record_stream(inner, DeviceStream::new(0, StreamId(9)))
        .is_err());
    host.check_err().unwrap();
}

/// The first pinned allocation initialises what it needs, so the memory is pinned:
/// <https://github.com/pytorch/pytorch/issues/149032>
#[test]
fn first_pinned_allocation_initialises_the_backend() {
    let (sim, host) = alloc_with(1 << 20);
    assert!(!sim.is_initialized());
    let p = host.allocate(8).unwrap();
    assert!(sim.is_initialized());
    assert!(p.is_pinned());
    assert!(host.is_pinned(p.as_ptr()));
    assert!(sim.is_pinned(p.as_ptr()));
    assert_eq!(sim.counts().alloc_pinned, 1);
}

#[test]
fn host_memory_is_real_and_writable() {
    let (_sim, host) = alloc_with(1 << 20);
    let mut a = host.allocate(1000).unwrap();
    // SAFETY: SimHostBackend zeroes its memory, and no stream uses the block.
    let s = unsafe { a.as_mut_slice() };
    assert!(s.iter().all(|&b| b == 0));
    s.iter_mut().enumerate().for_each(|(i, b)| *b = i as u8);
    // SAFETY: as above; initialised just now.
    assert_eq!(unsafe { a.as_slice() }[999], (999 % 256) as u8);
}

#[test]
fn host_multithreaded_allocations_never_overlap() {
    let (sim, host) = alloc_with(1 << 30);
    let host = Arc::new(host);
    std::thread::scope(|s| {
        for t in 0..4u8 {
            let host = host.clone();
            s.spawn(move || {
                let mut live = Vec::new();
                for i in 0..400usize {
                    let n = 1 + (i * 7919 + t as usize * 104729) % 20_000;
                    let mut a = host.allocate(n).unwrap();
                    // SAFETY: this thread owns the block; no stream uses it.
                    unsafe { a.as_mut_slice() }.fill(t + 1);
                    if i % 5 == 0 {
                        a.record_stream(DeviceStream::new(0, StreamId(u64::from(t) + 1)))
                            .unwrap();
                    }
                    live.push(a);
                    if live.len() > 8 {
                        let old = live.remove(i % 8);
                        // SAFETY: as above; filled by this thread.
                        assert!(unsafe { old.as_slice() }.iter().all(|&b| b == t + 1));
                    }
                    if i % 50 == 0 {
                        host.backend().complete_all();
                    }
                }
            });
        }
    });
    let st = host.stats();
    assert_eq!(
        (st.active_requests.current, st.active_bytes.current),
        (0, 0)
    );
    assert_eq!(st.active_requests.allocated, 1600);
    sim.complete_all();
    host.empty_cache().unwrap();
    assert_eq!(sim.used_bytes(), 0);
    assert_eq!(host.stats().allocations.current, 0);
    assert_eq!(sim.counts().alloc_pinned, sim.counts().free_pinned);
    host.check_err().unwrap();
}

#[test]
fn host_out_of_memory_empties_the_cache_and_retries_once() {
    let (sim, host) = alloc_with(5 << 20);
    drop(host.allocate(4 * MIB).unwrap()); // cached 4 MiB
                                           // 2 MiB does not fit next to the cached 4 MiB: freeing the cache makes room.
    let a = host.allocate(2 * MIB).unwrap();
    assert_eq!(host.cached_bytes(), 0);
    assert_eq!(sim.used_bytes(), 2 << 20);
    let st = host.stats();
    assert_eq!((st.num_host_alloc, st.num_host_free), (2, 1));
    // 8 MiB never fits: a typed error, nothing leaked, the allocator still works.
    let err = host.allocate(5 * MIB).unwrap_err();
    assert_eq!(
        err,
        HostAllocError::OutOfMemory {
            requested: 5 << 20,
            rounded: 8 << 20,
            allocated: 2 << 20,
            in_use: 2 << 20
        }
    );
    assert!(err.to_string().contains("8388608 bytes"));
    assert_eq!(host.stats().allocations.current, 1);
    assert_eq!(sim.live_regions(), 1);
    drop(a);
    assert_eq!(host.allocate(2 * MIB).unwrap().capacity(), 2 * MIB);
}

#[test]
fn host_no_leak_on_a_failing_backend() {
    let (sim, host) = alloc_with(1 << 30);
    let a = host.allocate(MIB).unwrap();
    // The 2nd backend allocation fails once: the retry (after emptying the cache) succeeds.
    sim.fail_alloc_at(2);
    let b = host.allocate(MIB + 1).unwrap();
    assert_eq!(sim.counts().alloc_failed, 1);
    assert_eq!(host.stats().num_host_alloc, 2);
    // Failing frees: empty_cache reports the error and keeps the blocks cached and counted.
    drop((a, b));
    sim.set_fail_free(true);
    let err = host.empty_cache().unwrap_err();
    assert!(matches!(
        err,
        HostAllocError::Backend {
            op: "free_pinned",
            source: BackendError::Other { .. }
        }
    ));
    assert_eq!(host.cached_bytes(), (3 * MIB) as u64);
    assert_eq!(host.stats().allocated_bytes.current, 3 << 20);
    assert_eq!(sim.live_regions(), 2);
    sim.set_fail_free(false);
    host.empty_cache().unwrap();
    assert_eq!((sim.used_bytes(), sim.live_regions()), (0, 0));
    assert_eq!(host.stats().allocations.current, 0);
}

#[test]
fn host_drop_waits_for_pending_events_and_frees_everything() {
    let sim = Arc::new(SimHostBackend::new(1 << 30));
    {
        let host = HostCachingAllocator::new(sim.clone());
        let a = host.allocate(MIB).unwrap();
        a.record_stream(DeviceStream::new(0, StreamId(4))).unwrap();
        drop(a);
        drop(host.allocate(2 * MIB).unwrap());
        assert_eq!(sim.live_regions(), 2);
    }
    assert_eq!((sim.used_bytes(), sim.live_regions()), (0, 0));
    assert_eq!(sim.event_source().counts().sync_fence, 1);
}

#[test]
fn host_register_mode_prefaults_and_registers() {
    let sim = Arc::new(SimHostBackend::new(1 << 30));
    let config = HostAllocatorConfig {
        use_host_register: true,
        num_register_threads: 4,
    };
    let host = HostCachingAllocator::with_config(sim.clone(), config);
    let mut a = host.allocate(3 * MIB).unwrap();
    assert_eq!((sim.counts().register, sim.counts().alloc_pinned), (1, 0));
    assert!(host.is_pinned(a.as_ptr()) && sim.is_pinned(a.as_ptr()));
    // The whole block is usable. SAFETY: `len` bytes are written before they are read (a
    // pinned block's contents are unspecified, as `cudaHostAlloc`'s are); no stream uses it.
    unsafe { std::ptr::write_bytes(a.as_ptr(), 0xa5, a.len()) };
    // SAFETY: initialised just above; no stream uses the block.
    assert!(unsafe { a.as_mut_slice() }.iter().all(|&b| b == 0xa5));
    drop(a);
    host.empty_cache().unwrap();
    assert_eq!((sim.counts().unregister, sim.used_bytes()), (1, 0));
    // From the allocator config string.
    let cfg: berth_alloc::AllocatorConfig =
        "pinned_use_cuda_host_register:True,pinned_num_register_threads:8"
            .parse()
            .unwrap();
    assert_eq!(
        HostAllocatorConfig::from(&cfg),
        HostAllocatorConfig {
            use_host_register: true,
            num_register_threads: 8
        }
    );
}

#[test]
fn host_register_mode_unsupported_backend_is_a_typed_error() {
    /// A backend with only the required methods: `register` keeps its default.
    struct Plain(SimHostBackend);
    impl HostBackend for Plain {
        type Fence = <SimHostBackend as HostBackend>::Fence;
        fn alloc_pinned(&self, bytes: usize) -> Result<std::ptr::NonNull<u8>, BackendError> {
            self.0.alloc_pinned(bytes)
        }
        unsafe fn free_pinned(
            &self,
            ptr: std::ptr::NonNull<u8>,
            bytes: usize,
        ) -> Result<(), BackendError> {
            // SAFETY: forwarded contract.
            unsafe { self.0.free_pinned(ptr, bytes) }
        }
        fn record_fence(&self, stream: DeviceStream) -> Result<Self::Fence, BackendError> {
            self.0.record_fence(stream)
        }
        fn query_fence(&self, event: &Self::Fence) -> Result<bool, BackendError> {
            self.0.query_fence(event)
        }
        fn sync_fence(&self, event: &Self::Fence) -> Result<(), BackendError> {
            self.0.sync_fence(event)
        }
    }
    let config = HostAllocatorConfig {
        use_host_register: true,
        num_register_threads: 1,
    };
    let host = HostCachingAllocator::with_config(Plain(SimHostBackend::new(1 << 20)), config);
    let err = host.allocate(64).unwrap_err();
    assert!(matches!(
        err,
        HostAllocError::Backend {
            source: BackendError::Other { op: "register", .. },
            ..
        }
    ));
    assert!(err
        .to_string()
        .contains("pinned_use_cuda_host_register:False"));
    assert_eq!(host.stats().allocations.current, 0);
}

#[test]
fn host_allocator_is_object_safe() {
    let (_sim, host) = alloc_with(1 << 20);
    let dynamic: Arc<dyn HostAllocator> = Arc::new(host);
    let a = dynamic.allocate(10).unwrap();
    assert!(dynamic.is_pinned(a.as_ptr()));
    fn assert_send_sync<T: Send + Sync>(_: &T) {}
    assert_send_sync(&a);
    let moved = std::thread::spawn(move || a.capacity()).join().unwrap();
    assert_eq!(moved, 16);
}
