//! Settings PyTorch accepts and ignores, or applies where they misbehave: berth says so once,
//! and `max_split_size_mb` does not grow expandable segments without bound.

use berth_alloc::backend::sim::SimBackend;
use berth_alloc::caching::CachingAllocator;
use berth_alloc::warnings::said_for;
use berth_alloc::{AllocatorConfig, DeviceAllocator, StreamId};

use crate::util::MIB;

fn with(conf: &str) -> CachingAllocator<SimBackend> {
    CachingAllocator::with_config(
        SimBackend::new(1 << 40),
        AllocatorConfig::parse(conf).unwrap(),
    )
    .unwrap()
}

/// pytorch/pytorch#123548: two large blocks freed, then a smaller request, every cycle, while a
/// small block made in each cycle stays live (so the freed blocks are not next to the segment's
/// unmapped end). Reserved bytes after each cycle.
fn reserved_after_cycles(conf: &str, cycles: usize) -> Vec<u64> {
    let alloc = with(conf);
    let s = StreamId::DEFAULT;
    let mut live = Vec::new();
    (0..cycles)
        .map(|_| {
            let a = alloc.allocate(600 * MIB as usize, s).unwrap();
            let b = alloc.allocate(600 * MIB as usize, s).unwrap();
            live.push(alloc.allocate(30 * MIB as usize, s).unwrap());
            drop((a, b));
            drop(alloc.allocate(400 * MIB as usize, s).unwrap());
            alloc.stats().memory_reserved()
        })
        .collect()
}

#[test]
fn max_split_size_does_not_grow_expandable_segments() {
    // Under PyTorch's rule the oversize 1200 MiB free block refuses the 400 MiB request and new
    // pages are mapped every cycle: 1640, 2860, 4100, ... MiB for 30 MiB more live per cycle.
    let both = reserved_after_cycles("expandable_segments:True,max_split_size_mb:200", 20);
    let expandable = reserved_after_cycles("expandable_segments:True", 20);
    assert_eq!(
        both, expandable,
        "max_split_size_mb changes nothing inside expandable segments"
    );
    // Reserved grows only with the live 30 MiB blocks (in 20 MiB pages): 1240 MiB after the
    // first cycle, at most 40 MiB more per cycle after it.
    assert_eq!(both[0], 1240 * MIB);
    assert!(both.windows(2).all(|w| w[1] - w[0] <= 40 * MIB), "{both:?}");
    assert!(said_for("alloc-conf-max-split-with-expandable")
        .is_some_and(|m| m.contains("no effect") && m.contains("123548")));
}

#[test]
fn inert_settings_are_said_once_with_what_to_do() {
    drop(with("garbage_collection_threshold:0.6"));
    let m = said_for("alloc-conf-gc-threshold-without-fraction").unwrap();
    assert!(
        m.contains("0.6") && m.contains("set_per_process_memory_fraction"),
        "{m}"
    );
    drop(with("roundup_power2_divisions:1"));
    let m = said_for("alloc-conf-roundup-divisions-of-one").unwrap();
    assert!(m.contains("2 or more"), "{m}");
    // Said once per process: a second allocator with the same settings says nothing new.
    assert_eq!(
        berth_alloc::inert_settings::warn_inert_settings(
            &AllocatorConfig::parse("garbage_collection_threshold:0.6").unwrap()
        ),
        0
    );
    // Settings that work say nothing.
    assert_eq!(
        berth_alloc::inert_settings::warn_inert_settings(
            &AllocatorConfig::parse("max_split_size_mb:200").unwrap()
        ),
        0
    );
}
