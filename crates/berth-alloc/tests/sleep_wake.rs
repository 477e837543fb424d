//! Tags, sleep and wake of the paged policy over the simulated device (`Note [Sleep and wake]`):
//! each rule and each fault of issue 31 that the Rust core owns.

use std::sync::Arc;

use berth_alloc::backend::sim::SimBackend;
use berth_alloc::host::{BackupMemory, SimHostBackend};
use berth_alloc::tags::TagGuard;
use berth_alloc::{
    AllocError, Allocation, DeviceAllocator, MempoolId, PagedBestFit, SleepStats, StreamFilter,
    StreamId,
};

use crate::util::MIB;

const S0: StreamId = StreamId::DEFAULT;

struct Dev {
    sim: Arc<SimBackend>,
    paged: PagedBestFit<Arc<SimBackend>>,
    host: Arc<SimHostBackend>,
}

fn dev(device_bytes: u64, host_bytes: u64) -> Dev {
    let sim = Arc::new(SimBackend::new(device_bytes));
    let paged = PagedBestFit::new(Arc::clone(&sim)).unwrap();
    Dev {
        sim,
        paged,
        host: Arc::new(SimHostBackend::new(host_bytes)),
    }
}

impl Dev {
    fn host(&self) -> Option<Arc<dyn BackupMemory>> {
        Some(Arc::clone(&self.host) as Arc<dyn BackupMemory>)
    }

    /// `bytes` bytes in tag `tag` (untagged for `None`), filled with `fill`.
    fn alloc_in(&self, tag: Option<&str>, bytes: usize, fill: u8) -> Allocation {
        let _g = tag.map(|t| TagGuard::new(t).unwrap());
        let a = self.paged.allocate(bytes, S0).unwrap();
        self.sim.write_bytes(a.ptr(), &vec![fill; bytes]).unwrap();
        a
    }

    fn reserved(&self) -> u64 {
        self.paged.stats().memory_reserved()
    }

    /// Statistics, snapshot and device agree; sleeping blocks count as allocated but are in
    /// no segment.
    fn check_accounting(&self) {
        let stats = self.paged.stats();
        let snap = self.paged.snapshot();
        let reserved: u64 = snap.segments.iter().map(|s| s.total_size).sum();
        let allocated: u64 = snap.segments.iter().map(|s| s.allocated_size).sum();
        assert_eq!(stats.memory_reserved(), reserved);
        assert_eq!(self.sim.used_bytes(), reserved);
        let sleeping = self.paged.sleep_stats().sleeping_allocated_bytes;
        assert_eq!(stats.memory_allocated(), allocated + sleeping);
        assert_eq!(
            self.host.used_bytes(),
            self.paged.sleep_stats().offloaded_bytes
        );
    }
}

#[test]
fn sleep_releases_a_tags_pages_and_wake_restores_them_at_the_same_addresses() {
    let d = dev(1 << 30, 1 << 30);
    let w1 = d.alloc_in(Some("weights"), 10 * MIB as usize, 0xA1);
    let w2 = d.alloc_in(Some("weights"), 3000, 0xA2);
    let kv = d.alloc_in(Some("kv_cache"), 40 * MIB as usize, 0xC3);
    let other = d.alloc_in(None, 5 * MIB as usize, 0x55);
    // Pages: weights 10 MiB + 3000 B -> 12 MiB, kv 40 MiB, untagged 6 MiB.
    assert_eq!(d.reserved(), 58 * MIB);
    d.check_accounting();

    let r = d
        .paged
        .sleep(&["weights", "kv_cache"], &["weights"], d.host())
        .unwrap();
    assert_eq!(
        (r.released_bytes, r.offloaded_bytes),
        (52 * MIB, 10 * MIB + 3072)
    );
    // The two weight blocks are adjacent: one backup buffer, one copy.
    assert_eq!(d.host.counts().alloc_pinned, 1, "one host buffer per tag");
    // The snapshot lists the sleeping tags apart from its (mapped) segments.
    let snap = d.paged.snapshot();
    assert_eq!(snap.total_reserved(), 6 * MIB);
    assert_eq!(snap.sleeping_bytes(), 52 * MIB);
    assert_eq!(
        snap.sleeping,
        vec![
            berth_alloc::SleepingTag {
                tag: "kv_cache".into(),
                released_bytes: 40 * MIB,
                allocated_bytes: 40 * MIB,
                offloaded_bytes: 0,
            },
            berth_alloc::SleepingTag {
                tag: "weights".into(),
                released_bytes: 12 * MIB,
                allocated_bytes: 10 * MIB + 3072,
                offloaded_bytes: 10 * MIB + 3072,
            },
        ]
    );
    let back = berth_alloc::pickle::load_snapshot(&berth_alloc::pickle::dump_snapshot(&snap));
    assert_eq!(
        back.unwrap().sleeping,
        snap.sleeping,
        "kept through a pickle"
    );
    assert_eq!(d.reserved(), 6 * MIB, "only the untagged pages stay");
    assert_eq!(d.sim.used_bytes(), 6 * MIB);
    assert_eq!(d.paged.sleep_stats().sleeping_bytes, 52 * MIB);
    assert_eq!(
        d.paged.sleep_stats(),
        SleepStats {
            sleeping_bytes: 52 * MIB,
            sleeping_allocated_bytes: 50 * MIB + 3072,
            offloaded_bytes: 10 * MIB + 3072,
            sleeping_tags: vec!["kv_cache".into(), "weights".into()],
        }
    );
    assert_eq!(d.host.used_bytes(), 10 * MIB + 3072);
    assert!(d.sim.read_bytes(w1.ptr(), 1).is_err(), "the pages are gone");
    assert_eq!(d.sim.read_bytes(other.ptr(), 4).unwrap(), [0x55; 4]);
    // Untagged allocation goes on; so does another tag.
    let more = d.alloc_in(Some("scratch"), MIB as usize, 1);
    d.check_accounting();

    let w = d.paged.wake(&["weights", "kv_cache"]).unwrap();
    assert_eq!(w.mapped_bytes, 52 * MIB);
    assert_eq!(w.restored_bytes, 10 * MIB + 3072);
    assert_eq!(d.reserved(), 60 * MIB);
    assert_eq!(d.paged.sleep_stats(), SleepStats::default());
    assert_eq!(d.host.used_bytes(), 0, "the backups are freed");
    // Same addresses; offloaded contents back, the rest lost (zero on the simulator).
    let w1_bytes = d.sim.read_bytes(w1.ptr(), 10 * MIB as usize).unwrap();
    assert!(w1_bytes.iter().all(|&b| b == 0xA1));
    assert_eq!(d.sim.read_bytes(w2.ptr(), 3000).unwrap(), vec![0xA2; 3000]);
    assert_eq!(d.sim.read_bytes(kv.ptr(), 8).unwrap(), [0; 8]);
    // The woken tags allocate again; everything frees and the cache empties.
    let again = d.alloc_in(Some("kv_cache"), MIB as usize, 2);
    d.check_accounting();
    drop((w1, w2, kv, other, more, again));
    d.paged.empty_cache().unwrap();
    assert_eq!(d.reserved(), 0);
    d.paged.check_err().unwrap();
}

#[test]
fn cached_memory_is_reused_only_within_its_tag() {
    let d = dev(1 << 30, 1 << 30);
    // A live peak of 64 MiB, so the headroom keeps the small caches below mapped.
    drop(d.alloc_in(None, 64 * MIB as usize, 0));
    let a = d.alloc_in(Some("a"), 4 * MIB as usize, 1);
    let a_addr = a.ptr();
    drop(a);
    // Tag b does not get a's cached block, nor any page of it.
    let b = d.alloc_in(Some("b"), 4 * MIB as usize, 2);
    assert!(b.ptr().0 >= a_addr.0 + 4 * MIB || b.ptr().0 + 4 * MIB <= a_addr.0);
    let untagged = d.alloc_in(None, 4 * MIB as usize, 3);
    assert_ne!(untagged.ptr(), a_addr);
    // Tag a gets its own block back, from its cache.
    let maps = d.sim.counts().map;
    let a2 = d.alloc_in(Some("a"), 4 * MIB as usize, 4);
    assert_eq!(a2.ptr(), a_addr);
    assert_eq!(d.sim.counts().map, maps, "no new mapping");
    // Sleeping b leaves a and the untagged block mapped.
    d.paged.sleep(&["b"], &[], None).unwrap();
    assert_eq!(d.sim.read_bytes(a2.ptr(), 2).unwrap(), [4, 4]);
    assert_eq!(d.sim.read_bytes(untagged.ptr(), 2).unwrap(), [3, 3]);
    assert_eq!(d.reserved(), 8 * MIB);
    d.check_accounting();
}

#[test]
fn allocating_in_a_sleeping_tag_is_an_error_naming_it() {
    let d = dev(1 << 30, 1 << 30);
    let kv = d.alloc_in(Some("kv_cache"), MIB as usize, 1);
    d.paged.sleep(&["kv_cache"], &[], None).unwrap();
    let before = d.paged.stats();
    let e = {
        let _g = TagGuard::new("kv_cache").unwrap();
        d.paged.allocate(100, S0).unwrap_err()
    };
    assert_eq!(
        e,
        AllocError::TagAsleep {
            tag: "kv_cache".into()
        }
    );
    assert!(e.to_string().contains("\"kv_cache\""), "{e}");
    assert!(e.to_string().contains("wake"), "{e}");
    assert_eq!(d.paged.stats(), before, "a refused request counts nothing");
    // Frees of its blocks work while it sleeps; wake then has nothing to restore.
    drop(kv);
    let w = d.paged.wake(&["kv_cache"]).unwrap();
    assert_eq!((w.mapped_bytes, w.restored_bytes), (2 * MIB, 0));
    let _again = d.alloc_in(Some("kv_cache"), 100, 7);
    d.check_accounting();
}

#[test]
fn bad_sleep_and_wake_calls_are_typed_errors_that_change_nothing() {
    let d = dev(1 << 30, 1 << 30);
    let _w = d.alloc_in(Some("weights"), MIB as usize, 1);
    let _k = d.alloc_in(Some("kv"), MIB as usize, 1);
    let (calls, reserved) = (d.sim.counts(), d.reserved());
    let p = &d.paged;
    assert_eq!(
        p.sleep(&["nope"], &[], None).unwrap_err(),
        AllocError::UnknownTag {
            tag: "nope".into(),
            known: vec!["kv".into(), "weights".into()]
        }
    );
    assert_eq!(
        p.sleep(&[""], &[], None).unwrap_err(),
        AllocError::InvalidTag { given: "".into() }
    );
    assert_eq!(
        p.sleep(&["kv"], &["weights"], d.host()).unwrap_err(),
        AllocError::OffloadNotSlept {
            tag: "weights".into()
        }
    );
    assert_eq!(
        p.sleep(&["weights"], &["weights"], None).unwrap_err(),
        AllocError::NoBackupMemory {
            tags: vec!["weights".into()]
        }
    );
    assert_eq!(
        p.wake(&["kv"]).unwrap_err(),
        AllocError::NotAsleep { tag: "kv".into() }
    );
    assert_eq!(d.sim.counts(), calls, "no backend call");
    assert_eq!(d.reserved(), reserved);
    // Sleeping twice: the second call is refused, whole, even with an awake tag in it.
    p.sleep(&["kv"], &[], None).unwrap();
    let calls = d.sim.counts();
    assert_eq!(
        p.sleep(&["weights", "kv"], &[], None).unwrap_err(),
        AllocError::AlreadyAsleep { tag: "kv".into() }
    );
    assert_eq!(
        p.wake(&["kv", "weights"]).unwrap_err(),
        AllocError::NotAsleep {
            tag: "weights".into()
        }
    );
    assert_eq!(d.sim.counts(), calls);
    assert_eq!(d.reserved(), 2 * MIB, "weights still mapped");
    // Not during a capture: unmapping and copying are illegal then.
    let graph: MempoolId = (1, 0);
    let filter: StreamFilter = Arc::new(|s| s == StreamId(7));
    p.begin_allocate_to_pool(graph, filter).unwrap();
    assert_eq!(
        p.wake(&["kv"]).unwrap_err(),
        AllocError::SleepDuringCapture { op: "wake" }
    );
    assert_eq!(
        p.sleep(&["weights"], &[], None).unwrap_err(),
        AllocError::SleepDuringCapture { op: "sleep" }
    );
    p.end_allocate_to_pool(graph).unwrap();
    p.wake(&["kv"]).unwrap();
    d.check_accounting();
}

#[test]
fn an_offload_that_cannot_get_host_memory_releases_nothing() {
    // Host memory for one 8 MiB backup, not for two.
    let d = dev(1 << 30, 12 * MIB);
    let a = d.alloc_in(Some("weights"), 8 * MIB as usize, 0x11);
    let b = d.alloc_in(Some("weights"), 8 * MIB as usize, 0x22);
    let (calls, reserved) = (d.sim.counts(), d.reserved());
    let e = d
        .paged
        .sleep(&["weights"], &["weights"], d.host())
        .unwrap_err();
    match &e {
        AllocError::OffloadFailed { tag, bytes, source } => {
            assert_eq!((tag.as_str(), *bytes), ("weights", 16 * MIB));
            assert!(source.is_out_of_memory(), "{source:?}");
        }
        e => panic!("{e:?}"),
    }
    assert!(e.to_string().contains("nothing was released"), "{e}");
    assert_eq!(d.reserved(), reserved);
    assert_eq!(d.sim.counts().unmap, calls.unmap, "nothing unmapped");
    assert_eq!(d.host.used_bytes(), 0, "the backup made was freed");
    assert_eq!(d.paged.sleep_stats(), SleepStats::default(), "still awake");
    assert_eq!(d.sim.read_bytes(b.ptr(), 2).unwrap(), [0x22, 0x22]);
    let _more = d.alloc_in(Some("weights"), 100, 3);
    let reserved = d.reserved();
    // A fault on the first backup fails the same way.
    d.host.fail_alloc_at(d.host.counts().alloc_pinned + 1);
    assert!(matches!(
        d.paged.sleep(&["weights"], &["weights"], d.host()),
        Err(AllocError::OffloadFailed { .. })
    ));
    assert_eq!(d.reserved(), reserved);
    d.check_accounting();
    drop((a, b));
}

#[test]
fn a_wake_that_cannot_get_device_memory_keeps_the_tag_asleep_with_its_backups() {
    let d = dev(128 * MIB, 1 << 30);
    // Two 32 MiB units of "weights".
    let w1 = d.alloc_in(Some("weights"), 32 * MIB as usize, 0x31);
    let w2 = d.alloc_in(Some("weights"), 32 * MIB as usize, 0x32);
    let slept = d.paged.sleep(&["weights"], &["weights"], d.host()).unwrap();
    assert_eq!(slept.released_bytes, 64 * MIB);
    // The other phase takes 80 MiB and keeps it: 48 MiB free, 64 needed.
    let rollout = d.alloc_in(Some("rollout"), 80 * MIB as usize, 9);
    let unmaps = d.sim.counts().unmap;
    let e = d.paged.wake(&["weights"]).unwrap_err();
    match &e {
        AllocError::WakeFailed { tag, bytes, source } => {
            assert_eq!((tag.as_str(), *bytes), ("weights", 64 * MIB));
            assert!(source.is_out_of_memory(), "{source:?}");
        }
        e => panic!("{e:?}"),
    }
    assert!(e.to_string().contains("stays asleep"), "{e}");
    // One unit had been mapped: it went again.
    assert_eq!(d.sim.counts().unmap, unmaps + 1);
    assert_eq!(d.reserved(), 80 * MIB);
    let st = d.paged.sleep_stats();
    assert_eq!(st.sleeping_tags, vec!["weights".to_string()]);
    assert_eq!(
        (st.sleeping_bytes, st.offloaded_bytes),
        (64 * MIB, 64 * MIB)
    );
    assert_eq!(d.host.used_bytes(), 64 * MIB, "backups kept");
    {
        let _g = TagGuard::new("weights").unwrap();
        assert!(matches!(
            d.paged.allocate(1, S0),
            Err(AllocError::TagAsleep { .. })
        ));
    }
    d.check_accounting();
    // The other phase sleeps (its cache too); now the wake fits and restores the contents.
    d.paged.sleep(&["rollout"], &[], None).unwrap();
    let w = d.paged.wake(&["weights"]).unwrap();
    assert_eq!(w.restored_bytes, 64 * MIB);
    assert_eq!(d.sim.read_bytes(w1.ptr(), 3).unwrap(), [0x31; 3]);
    assert_eq!(d.sim.read_bytes(w2.ptr(), 3).unwrap(), [0x32; 3]);
    assert_eq!(d.host.used_bytes(), 0);
    d.check_accounting();
    drop(rollout);
}

#[test]
fn twenty_sleep_wake_cycles_keep_device_and_host_memory_flat() {
    let d = dev(1 << 30, 1 << 30);
    let w = d.alloc_in(Some("weights"), 20 * MIB as usize, 0x77);
    let mut reserved = None;
    for cycle in 0..20 {
        // Rollout phase: a KV cache, slept without offload.
        let kv = d.alloc_in(Some("kv_cache"), 40 * MIB as usize, cycle as u8);
        d.paged.sleep(&["kv_cache"], &[], None).unwrap();
        drop(kv);
        d.paged.sleep(&["weights"], &["weights"], d.host()).unwrap();
        assert_eq!(d.sim.used_bytes(), 0, "cycle {cycle}");
        d.paged.wake(&["weights", "kv_cache"]).unwrap();
        assert_eq!(d.sim.read_bytes(w.ptr(), 2).unwrap(), [0x77; 2]);
        assert_eq!(d.host.used_bytes(), 0);
        let r = d.reserved();
        assert_eq!(*reserved.get_or_insert(r), r, "cycle {cycle}");
    }
    assert_eq!(reserved, Some(60 * MIB));
    d.check_accounting();
}

#[test]
fn a_run_over_many_units_is_copied_a_unit_at_a_time() {
    // GPT-2's 148 weight tensors, in the order `model.cuda()` makes them: one run of adjacent
    // blocks over many units (`Note [Copies cut at unit ends]`).
    let d = dev(2 << 30, 1 << 30);
    let mut sizes = vec![154_389_504usize, 3_145_728];
    for _ in 0..12 {
        sizes.extend([
            3072, 3072, 7_077_888, 9216, 2_359_296, 3072, 3072, 3072, 9_437_184, 12288, 9_437_184,
            3072,
        ]);
    }
    sizes.extend([3072, 3072]);
    let blocks: Vec<Allocation> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| d.alloc_in(Some("weights"), n, i as u8))
        .collect();
    let before = d.sim.counts();
    let r = d.paged.sleep(&["weights"], &["weights"], d.host()).unwrap();
    let slept = d.sim.counts();
    let units = slept.unmap - before.unmap;
    assert!(units > 40, "{units} units");
    assert_eq!(r.released_bytes, 499_122_176);
    assert_eq!(r.offloaded_bytes, sizes.iter().sum::<usize>() as u64);
    assert_eq!(slept.copies - before.copies, units, "one copy per unit");
    d.paged.wake(&["weights"]).unwrap();
    let woke = d.sim.counts();
    // A copy into a unit not mapped yet would fail: each piece waits for its unit.
    assert_eq!(woke.map - slept.map, units);
    assert_eq!(woke.copies - slept.copies, units, "one copy per unit");
    for (i, b) in blocks.iter().enumerate() {
        let n = sizes[i];
        let back = d.sim.read_bytes(b.ptr(), n).unwrap();
        assert!(back.iter().all(|&x| x == i as u8), "block {i} restored");
    }
    d.check_accounting();
}

#[test]
fn each_allocation_carries_the_tag_of_its_own_thread() {
    let d = Arc::new(dev(1 << 30, 1 << 30));
    let _main = TagGuard::new("main").unwrap();
    let mine = d.alloc_in(Some("main"), MIB as usize, 1);
    let worker = {
        let d = Arc::clone(&d);
        // The worker's tag is its own; the main thread's guard does not reach it.
        std::thread::spawn(move || {
            let _g = TagGuard::new("worker").unwrap();
            d.paged
                .allocate(MIB as usize, StreamId(3))
                .unwrap()
                .into_raw()
        })
        .join()
        .unwrap()
    };
    d.paged.sleep(&["worker"], &[], None).unwrap();
    assert!(
        d.sim.read_bytes(worker, 1).is_err(),
        "the worker's block sleeps"
    );
    assert_eq!(d.sim.read_bytes(mine.ptr(), 1).unwrap(), [1]);
    assert_eq!(d.paged.sleep_stats().sleeping_allocated_bytes, MIB);
    d.paged.wake(&["worker"]).unwrap();
    d.paged.raw_delete(worker).unwrap();
    d.check_accounting();
}

#[test]
fn pytorchs_policies_say_they_cannot_sleep() {
    let sim = Arc::new(SimBackend::new(1 << 30));
    let caching = berth_alloc::caching::CachingAllocator::new(Arc::clone(&sim));
    let e = caching.sleep(&["weights"], &[], None).unwrap_err();
    assert_eq!(
        e.to_string(),
        "the pytorch policy does not support sleep and wake of tagged memory; use policy \
         \"paged\", which maps memory in units it can release and map again"
    );
    assert!(matches!(
        caching.wake(&["weights"]),
        Err(AllocError::PolicyLacks { .. })
    ));
    assert_eq!(caching.sleep_stats(), SleepStats::default());
}
