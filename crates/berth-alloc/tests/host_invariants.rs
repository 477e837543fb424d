//! Property test of `HostCachingAllocator`: random allocate / drop / `record_stream` /
//! event-completion / `empty_cache` sequences over three streams.

use std::collections::HashMap;
use std::sync::Arc;

use berth_alloc::host::{HostAllocation, HostCachingAllocator, SimHostBackend};
use berth_alloc::{DeviceStream, StreamId};
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Op {
    /// Allocate `1 + bytes % 2^class` bytes.
    Alloc {
        class: u32,
        bytes: usize,
    },
    /// Drop the live allocation at this index (modulo the count).
    Free(usize),
    /// Record stream `s` on the live allocation at this index.
    Record(usize, u64),
    /// Complete every event on stream `s`.
    Complete(u64),
    EmptyCache,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u32..16, any::<usize>()).prop_map(|(class, bytes)| Op::Alloc { class, bytes }),
        3 => any::<usize>().prop_map(Op::Free),
        2 => (any::<usize>(), 1u64..4).prop_map(|(i, s)| Op::Record(i, s)),
        2 => (1u64..4).prop_map(Op::Complete),
        1 => Just(Op::EmptyCache),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn host_invariants_hold_for_random_sequences(ops in proptest::collection::vec(op(), 1..120)) {
        let sim = Arc::new(SimHostBackend::new(1 << 40));
        let host = HostCachingAllocator::new(sim.clone());
        let mut live: Vec<(HostAllocation, Vec<u64>)> = Vec::new();
        // Completions seen per stream, and for each block freed with streams, the completion
        // count each stream had at free time (it must grow before the block is reused).
        let mut completed: HashMap<u64, u64> = HashMap::new();
        let mut waiting: HashMap<usize, Vec<(u64, u64)>> = HashMap::new();
        for op in ops {
            match op {
                Op::Alloc { class, bytes } => {
                    let n = 1 + bytes % (1usize << class);
                    let a = host.allocate(n).unwrap();
                    prop_assert_eq!(a.capacity(), n.next_power_of_two());
                    let addr = a.as_ptr() as usize;
                    if let Some(w) = waiting.remove(&addr) {
                        for (s, at_free) in w {
                            prop_assert!(completed.get(&s).copied().unwrap_or(0) > at_free,
                                "block {:#x} reused before stream {}'s event completed", addr, s);
                        }
                    }
                    live.push((a, Vec::new()));
                }
                Op::Free(i) if !live.is_empty() => {
                    let (a, streams) = live.swap_remove(i % live.len());
                    if !streams.is_empty() {
                        let w = streams.iter().map(|s| (*s, completed.get(s).copied().unwrap_or(0))).collect();
                        waiting.insert(a.as_ptr() as usize, w);
                    }
                    drop(a);
                }
                Op::Record(i, s) if !live.is_empty() => {
                    let n = live.len();
                    let (a, streams) = &mut live[i % n];
                    a.record_stream(DeviceStream::new(0, StreamId(s))).unwrap();
                    if !streams.contains(&s) {
                        streams.push(s);
                    }
                }
                Op::Complete(s) => {
                    sim.complete_events_on(StreamId(s));
                    *completed.entry(s).or_default() += 1;
                }
                Op::EmptyCache => host.empty_cache().unwrap(),
                _ => {}
            }
            // Live blocks never overlap.
            let mut spans: Vec<(usize, usize)> = live.iter().map(|(a, _)| (a.as_ptr() as usize, a.capacity())).collect();
            spans.sort();
            for w in spans.windows(2) {
                prop_assert!(w[0].0 + w[0].1 <= w[1].0, "overlap {:?}", w);
            }
            // Every statistic equals its recomputation.
            let st = host.stats();
            prop_assert_eq!(st.active_requests.current, live.len() as i64);
            prop_assert_eq!(st.active_bytes.current, spans.iter().map(|s| s.1 as i64).sum::<i64>());
            prop_assert_eq!(st.allocated_bytes.current as u64, sim.used_bytes());
            prop_assert_eq!(st.allocations.current as usize, sim.live_regions());
            prop_assert!(host.cached_bytes() <= sim.used_bytes());
        }
        // Everything dropped, every event completed, cache emptied: nothing stays pinned.
        live.clear();
        sim.complete_all();
        host.empty_cache().unwrap();
        prop_assert_eq!(sim.used_bytes(), 0);
        prop_assert_eq!(host.stats().allocations.current, 0);
        prop_assert_eq!(host.pending_events(), 0);
    }
}
