//! `max_split_size_mb` with expandable segments on a real GPU (pytorch/pytorch#123548): a loop
//! that frees two large blocks and asks for a smaller one, while a small block made in each
//! cycle stays live, maps new pages every cycle under PyTorch's rule (5540 MiB after 40 cycles
//! on an H200 under PyTorch 2.11). berth does not apply the oversize rule inside expandable
//! segments, so reserved bytes grow only with the live small blocks, equal what expandable
//! segments alone give, and equal what the driver sees (`cuMemGetInfo`).
//! The simulator's twin is berth-alloc's `tests/inert_settings.rs`.

use berth_alloc::caching::CachingAllocator;
use berth_alloc::{AllocatorConfig, DeviceAllocator, StreamId};
use berth_cuda::{mem_get_info, CudaBackend};

const MIB: u64 = 1 << 20;

fn used() -> u64 {
    let (free, total) = mem_get_info(0).unwrap();
    (total - free) as u64
}

/// (reserved, driver used − baseline) after each of `cycles` cycles under `conf`.
fn cycles_on_gpu(conf: &str, cycles: usize) -> Vec<(u64, u64)> {
    let baseline = used();
    let alloc = CachingAllocator::with_config(
        CudaBackend::new(0).unwrap(),
        AllocatorConfig::parse(conf).unwrap(),
    )
    .unwrap();
    let s = StreamId::DEFAULT;
    let mut live = Vec::new();
    let out = (0..cycles)
        .map(|_| {
            let a = alloc.allocate(600 * MIB as usize, s).unwrap();
            let b = alloc.allocate(600 * MIB as usize, s).unwrap();
            live.push(alloc.allocate(30 * MIB as usize, s).unwrap());
            drop((a, b));
            drop(alloc.allocate(400 * MIB as usize, s).unwrap());
            (
                alloc.stats().memory_reserved(),
                used().saturating_sub(baseline),
            )
        })
        .collect();
    drop(live);
    alloc.empty_cache().unwrap();
    out
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (BERTH_REQUIRE_GPU=1 fails without one)"]
fn max_split_size_does_not_grow_expandable_segments_on_the_gpu() {
    if !berth_cuda::testing::require_gpu(
        "max_split_size_does_not_grow_expandable_segments_on_the_gpu",
    ) {
        return;
    }
    let both = cycles_on_gpu("expandable_segments:True,max_split_size_mb:200", 40);
    let alone = cycles_on_gpu("expandable_segments:True", 40);
    let reserved = |v: &[(u64, u64)]| v.iter().map(|p| p.0).collect::<Vec<_>>();
    println!(
        "reserved MiB after each cycle, both options: {:?}",
        reserved(&both).iter().map(|b| b / MIB).collect::<Vec<_>>()
    );
    assert_eq!(
        reserved(&both),
        reserved(&alone),
        "max_split_size_mb changes nothing inside expandable segments"
    );
    // 1200 MiB for the two large blocks plus the first 30 MiB block (in 20 MiB pages), then at
    // most two more pages per cycle for the next live 30 MiB block.
    assert_eq!(both[0].0, 1240 * MIB);
    assert!(
        both.windows(2).all(|w| w[1].0 - w[0].0 <= 40 * MIB),
        "{both:?}"
    );
    assert!(
        both[39].0 <= 2840 * MIB,
        "{} MiB after 40 cycles",
        both[39].0 / MIB
    );
    // What berth reserves is what the driver holds for it: other processes on the card may move
    // the driver's figure, so allow one page of slack.
    for (cycle, (reserved, driver)) in both.iter().enumerate() {
        assert!(
            reserved.abs_diff(*driver) <= 20 * MIB,
            "cycle {cycle}: reserved {reserved} but the driver's used bytes grew by {driver}"
        );
    }
}
