//! Property tests: random sequences of allocate / free / `record_stream` / `empty_cache` / event
//! completion over several streams keep every invariant; fault injection exercises the retry
//! path without leaks.

use std::collections::HashMap;

use berth_alloc::adaptor::FaultInject;
use berth_alloc::backend::sim::SimBackend;
use berth_alloc::caching::CachingAllocator;
use berth_alloc::{AllocatorConfig, DeviceAllocator, DevicePtr, StreamId};
use proptest::prelude::*;

use crate::util::MIB;

#[derive(Debug, Clone)]
enum Op {
    Alloc { size: usize, stream: u64 },
    Free(usize),
    RecordStream(usize, u64),
    EmptyCache,
    Complete(u64),
    CompleteAll,
}

fn op() -> impl Strategy<Value = Op> {
    let size = prop_oneof![
        1usize..4096,
        4096usize..(1 << 20),
        (1usize << 20)..(12 << 20),
        (12usize << 20)..(40 << 20)
    ];
    prop_oneof![
        6 => (size, 0u64..3).prop_map(|(size, stream)| Op::Alloc { size, stream }),
        4 => any::<usize>().prop_map(Op::Free),
        2 => (any::<usize>(), 0u64..3).prop_map(|(i, s)| Op::RecordStream(i, s)),
        1 => Just(Op::EmptyCache),
        2 => (0u64..3).prop_map(Op::Complete),
        1 => Just(Op::CompleteAll),
    ]
}

const CONFIGS: [&str; 4] = [
    "",
    "expandable_segments:True",
    "max_split_size_mb:20",
    "roundup_power2_divisions:4",
];

fn run(ops: Vec<Op>, conf: &str) -> Result<(), TestCaseError> {
    let cfg = AllocatorConfig::parse(conf).unwrap();
    let alloc = CachingAllocator::with_config(SimBackend::new(64 << 30), cfg).unwrap();
    let sim = alloc.backend();
    // Live allocations: (ptr, size, stream, streams recorded).
    let mut live: Vec<(DevicePtr, usize, u64, Vec<u64>)> = Vec::new();
    // Freed ranges still waiting on events of these streams.
    let mut pending: Vec<(u64, u64, Vec<u64>)> = Vec::new();
    let mut syncs = 0;
    for op in ops {
        match op {
            Op::Alloc { size, stream } => {
                let p = alloc.raw_alloc(size, StreamId(stream)).unwrap();
                for (start, len, streams) in &pending {
                    prop_assert!(
                        streams.is_empty() || p.0 + size as u64 <= *start || p.0 >= start + len,
                        "{p} reused while events of {streams:?} are pending"
                    );
                }
                live.push((p, size, stream, Vec::new()));
            }
            Op::Free(i) if !live.is_empty() => {
                let (p, size, _, streams) = live.swap_remove(i % live.len());
                alloc.raw_delete(p).unwrap();
                if !streams.is_empty() {
                    // The block covers at least the request; track the request's range.
                    pending.push((p.0, size as u64, streams));
                }
            }
            Op::RecordStream(i, s) if !live.is_empty() => {
                let n = live.len();
                let entry = &mut live[i % n];
                alloc.raw_record_stream(entry.0, StreamId(s)).unwrap();
                if s != entry.2 && !entry.3.contains(&s) {
                    entry.3.push(s);
                }
            }
            Op::EmptyCache => alloc.empty_cache().unwrap(),
            Op::Complete(s) => {
                sim.complete_events_on(StreamId(s));
                pending.iter_mut().for_each(|p| p.2.retain(|&x| x != s));
            }
            Op::CompleteAll => {
                sim.complete_all();
                pending.clear();
            }
            _ => {}
        }
        let stats = alloc.stats();
        if stats.num_sync_all_streams != syncs {
            syncs = stats.num_sync_all_streams;
            pending.clear(); // a full flush waited for every event
        }
        pending.retain(|p| !p.2.is_empty());
        alloc.validate().map_err(TestCaseError::fail)?;
        prop_assert!(stats.memory_reserved() >= stats.memory_allocated());
        prop_assert_eq!(
            stats.memory_reserved(),
            sim.used_bytes(),
            "reserved equals device memory held"
        );
        let live_bytes: i64 = live.iter().map(|l| l.1 as i64).sum();
        prop_assert_eq!(stats.allocation.all().current, live.len() as i64);
        prop_assert!(stats.requested_bytes.all().current >= live_bytes);
    }
    for (p, ..) in live.drain(..) {
        alloc.raw_delete(p).unwrap();
    }
    sim.complete_all();
    alloc.empty_cache().unwrap();
    let s = alloc.stats();
    prop_assert_eq!(
        (s.memory_allocated(), s.memory_reserved(), sim.used_bytes()),
        (0, 0, 0)
    );
    prop_assert_eq!(s.active.all().current, 0);
    alloc.validate().map_err(TestCaseError::fail)?;
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn random_sequences_keep_invariants(ops in prop::collection::vec(op(), 1..80), conf in 0usize..CONFIGS.len()) {
        run(ops, CONFIGS[conf])?;
    }
}

#[test]
fn record_stream_defers_reuse_until_events_complete() {
    let alloc = CachingAllocator::new(SimBackend::new(1 << 30));
    let (s0, s1) = (StreamId(0), StreamId(1));
    let a = alloc.allocate(300 * MIB as usize, s0).unwrap();
    a.record_stream(s1).unwrap();
    let addr = a.ptr();
    drop(a);
    let s = alloc.stats();
    assert_eq!(
        (s.memory_allocated(), s.active_bytes.all().current),
        (0, 300 * MIB as i64),
        "pending free stays active"
    );
    let snap = alloc.snapshot();
    assert_eq!(
        snap.segments[0].blocks[0].state,
        berth_alloc::BlockState::ActivePendingFree
    );
    let b = alloc.allocate(300 * MIB as usize, s0).unwrap();
    assert_ne!(
        b.ptr(),
        addr,
        "not reused while the side stream's event is pending"
    );
    drop(b);
    alloc.backend().complete_events_on(s1);
    let c = alloc.allocate(300 * MIB as usize, s0).unwrap();
    assert!(c.ptr() == addr || alloc.stats().active.all().current == 1);
    alloc.validate().unwrap();
}

#[test]
fn nth_backend_malloc_failure_runs_the_retry_path() {
    let backend = FaultInject::failing_at(SimBackend::new(1 << 30), 2);
    let alloc = CachingAllocator::new(backend);
    drop(alloc.allocate(5 * MIB as usize, StreamId(0)).unwrap()); // malloc #1: a cached 20 MiB segment
    let big = alloc.allocate(30 * MIB as usize, StreamId(0)).unwrap(); // #2 fails, flush, #3 succeeds
    let s = alloc.stats();
    assert_eq!(
        (
            s.num_alloc_retries,
            s.num_sync_all_streams,
            s.num_device_free,
            s.num_ooms
        ),
        (1, 1, 1, 0)
    );
    assert_eq!(s.memory_reserved(), 30 * MIB);
    drop(big);
    alloc.empty_cache().unwrap();
    assert_eq!(alloc.backend().inner().used_bytes(), 0);
}

#[test]
fn persistent_backend_failure_is_typed_and_leaks_nothing() {
    let backend = FaultInject::failing_at(SimBackend::new(1 << 30), 3).sticky();
    let alloc = CachingAllocator::new(backend);
    let mut live: HashMap<u64, DevicePtr> = HashMap::new();
    for k in 0..2 {
        live.insert(k, alloc.raw_alloc(12 * MIB as usize, StreamId(0)).unwrap());
    }
    let e = alloc.raw_alloc(40 * MIB as usize, StreamId(0)).unwrap_err();
    assert!(e.is_out_of_memory(), "{e:?}");
    assert_eq!(alloc.stats().num_ooms, 1);
    alloc.validate().unwrap();
    for (_, p) in live.drain() {
        alloc.raw_delete(p).unwrap();
    }
    alloc.empty_cache().unwrap();
    let s = alloc.stats();
    assert_eq!(
        (
            s.memory_reserved(),
            alloc.backend().inner().used_bytes(),
            alloc.backend().inner().live_segments()
        ),
        (0, 0, 0)
    );
}
