//! Known surprises of PyTorch's caching allocator statistics (reserved vs allocated,
//! `empty_cache`, peak resets, the memory fraction), on `SimBackend`, with the exact numbers
//! PyTorch 2.11 gives on an H200; each test names the behaviour, with the public report above it.

use berth_alloc::backend::sim::SimBackend;
use berth_alloc::caching::CachingAllocator;
use berth_alloc::{AllocError, DeviceAllocator, StreamId};

use crate::util::MIB;

const S0: StreamId = StreamId::DEFAULT;

fn fresh() -> CachingAllocator<SimBackend> {
    CachingAllocator::new(SimBackend::new(SimBackend::H200_BYTES))
}

/// `memory_reserved` above `memory_allocated` is the cache plus rounding, not a leak:
/// <https://github.com/pytorch/pytorch/pull/4879>
#[test]
fn reserved_vs_allocated_per_request_size() {
    // (request bytes, Δ memory_allocated, Δ memory_reserved) from the table.
    let rows: [(usize, u64, u64); 10] = [
        (4, 512, 2_097_152),
        (516, 1_024, 2_097_152),
        (1_048_576, 1_048_576, 2_097_152),
        (1_048_580, 1_049_088, 20_971_520),
        (1_572_864, 1_572_864, 20_971_520),
        (9_437_184, 9_437_184, 20_971_520),
        (10_485_760, 10_485_760, 10_485_760),
        (10_485_764, 10_486_272, 12_582_912),
        (64_000_000, 65_011_712, 65_011_712),
        (0, 0, 0),
    ];
    for (bytes, d_alloc, d_reserved) in rows {
        let alloc = fresh();
        let t = alloc.allocate(bytes, S0).unwrap();
        let s = alloc.stats();
        assert_eq!(
            (s.memory_allocated(), s.memory_reserved()),
            (d_alloc, d_reserved),
            "alive: {bytes} B"
        );
        assert_eq!(
            s.requested_bytes.all().current,
            bytes as i64,
            "requested: {bytes} B"
        );
        drop(t);
        let s = alloc.stats();
        assert_eq!(
            (s.memory_allocated(), s.memory_reserved()),
            (0, d_reserved),
            "dropped: {bytes} B"
        );
        alloc.empty_cache().unwrap();
        assert_eq!(
            alloc.stats().memory_reserved(),
            0,
            "after empty_cache: {bytes} B"
        );
    }
}

/// A freed block is reused for the same size, without growing `memory_reserved`:
/// <https://github.com/pytorch/pytorch/pull/4879>
#[test]
fn same_size_reuses_address_and_reserved() {
    let alloc = fresh();
    let a = alloc.allocate(256 * MIB as usize, S0).unwrap();
    let addr = a.ptr();
    drop(a);
    let b = alloc.allocate(256 * MIB as usize, S0).unwrap();
    assert_eq!(b.ptr(), addr);
    assert_eq!(alloc.stats().memory_reserved(), 268_435_456);
    let _c = alloc.allocate(128 * MIB as usize, S0).unwrap();
    assert_eq!(alloc.stats().memory_reserved(), 402_653_184);
}

/// `empty_cache` releases free segments only; the context stays:
/// <https://github.com/pytorch/pytorch/issues/60150>
#[test]
fn empty_cache_releases_segments_not_the_context() {
    let context = 526 * MIB;
    let alloc =
        CachingAllocator::new(SimBackend::new(SimBackend::H200_BYTES).with_context_bytes(context));
    // Before any device use: empty_cache and memory_allocated do not initialise the device.
    alloc.empty_cache().unwrap();
    assert_eq!(alloc.stats().memory_allocated(), 0);
    assert!(!alloc.backend().is_initialized());
    let used = |a: &CachingAllocator<SimBackend>| {
        let info = berth_alloc::MemoryBackend::mem_info(a.backend()).unwrap();
        info.total_bytes - info.free_bytes
    };
    let t = alloc.allocate(4000 * 4000 * 4, S0).unwrap();
    let with_tensor = used(&alloc);
    drop(t);
    alloc.empty_cache().unwrap();
    assert_eq!(alloc.stats().memory_allocated(), 0);
    assert_eq!(alloc.stats().memory_reserved(), 0);
    assert_eq!(
        with_tensor - used(&alloc),
        65_011_712,
        "exactly the segment came back"
    );
    assert_eq!(used(&alloc), context, "the context stays");
    // Two 512 B tensors in one 2 MiB segment: only a segment with no live block is released.
    let a = alloc.allocate(512, S0).unwrap();
    let b = alloc.allocate(512, S0).unwrap();
    drop(a);
    alloc.empty_cache().unwrap();
    assert_eq!(alloc.stats().memory_reserved(), 2_097_152);
    drop(b);
    alloc.empty_cache().unwrap();
    assert_eq!(alloc.stats().memory_reserved(), 0);
}

/// `reset_peak_memory_stats` sets peaks to the current values and never changes those:
/// <https://github.com/pytorch/pytorch/issues/86449>,
/// <https://github.com/flagos-ai/Torch-FL/pull/364>
#[test]
fn reset_peak_keeps_current_counters() {
    let alloc = fresh();
    let first = alloc.allocate(256 * MIB as usize, S0).unwrap();
    let second = alloc.allocate(256 * MIB as usize, S0).unwrap();
    drop(first);
    let s = alloc.stats();
    assert_eq!(
        (s.memory_allocated(), s.max_memory_allocated()),
        (268_435_456, 536_870_912)
    );
    let accumulated = s.allocated_bytes.all().allocated;
    alloc.reset_peak_memory_stats();
    let s = alloc.stats();
    assert_eq!(
        (s.memory_allocated(), s.max_memory_allocated()),
        (268_435_456, 268_435_456)
    );
    assert_eq!(
        (s.memory_reserved(), s.max_memory_reserved()),
        (536_870_912, 536_870_912)
    );
    assert_eq!(
        s.allocated_bytes.all().allocated,
        accumulated,
        "a peak reset keeps accumulated counters"
    );
    drop(second);
    let s = alloc.stats();
    assert_eq!(
        (s.memory_allocated(), s.max_memory_allocated()),
        (0, 268_435_456)
    );
    alloc.empty_cache().unwrap();
    let s = alloc.stats();
    assert_eq!(
        (s.memory_reserved(), s.max_memory_reserved()),
        (0, 536_870_912)
    );
    alloc.reset_accumulated_memory_stats();
    let s = alloc.stats();
    assert_eq!(
        (s.allocated_bytes.all().allocated, s.num_sync_all_streams),
        (0, 0)
    );
    assert_eq!(
        s.max_memory_reserved(),
        536_870_912,
        "an accumulated reset keeps peaks"
    );
}

/// `set_per_process_memory_fraction`: argument checks, and the cap covers reserved bytes only:
/// <https://github.com/pytorch/pytorch/pull/48172>,
/// <https://github.com/pytorch/pytorch/issues/58466>
#[test]
fn memory_fraction_checks_and_cap() {
    let total = SimBackend::H200_BYTES;
    let alloc = CachingAllocator::new(SimBackend::new(total).with_context_bytes(518 * MIB));
    for bad in [-0.1, 2.0] {
        let e = alloc.set_memory_fraction(bad).unwrap_err();
        assert!(matches!(e, AllocError::InvalidFraction { .. }));
        assert!(e.to_string().contains("Invalid fraction value"), "{e}");
    }
    alloc.set_memory_fraction(0.5).unwrap();
    let ok = (0.499 * total as f64) as usize - alloc.stats().memory_reserved() as usize;
    drop(alloc.allocate(ok, S0).unwrap());
    alloc.empty_cache().unwrap();
    let e = alloc
        .allocate((0.5 * total as f64) as usize, S0)
        .unwrap_err();
    assert!(e.is_out_of_memory(), "{e:?}");
    let msg = e.to_string();
    assert!(msg.contains("Tried to allocate 69.90 GiB"), "{msg}");
    assert!(msg.contains("69.90 GiB allowed;"), "{msg}");
    assert_eq!(alloc.stats().num_ooms, 1);
    // The cap covers only bytes reserved by the allocator; the context lies outside it.
    let small = alloc.allocate(MIB as usize, S0).unwrap();
    assert_eq!(alloc.stats().memory_reserved(), 2 * MIB);
    drop(small);
}
