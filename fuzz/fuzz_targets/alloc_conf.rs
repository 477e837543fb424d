//! Allocator configuration strings (`BERTH_ALLOC_CONF`, `PYTORCH_CUDA_ALLOC_CONF` grammar):
//! parsing never panics, and a configuration that parses builds its allocator on a simulated
//! device, whose rounding and statistics stay sound on a few allocations.
//!
//! Input: the configuration string, then optionally a NUL byte and up to 16 four-byte
//! little-endian sizes to allocate (a fixed list when none follow).
#![no_main]

use berth_alloc::backend::sim::SimBackend;
use berth_alloc::backend::StreamId;
use berth_alloc::{device_allocator, AllocatorConfig};
use libfuzzer_sys::fuzz_target;

const SIZES: [u64; 9] = [
    1,
    511,
    512,
    1 << 20,
    (1 << 20) + 1,
    10 << 20,
    (100 << 20) + 7,
    1 << 30,
    5 << 30,
];

fuzz_target!(|data: &[u8]| {
    if data.len() > 4096 {
        return;
    }
    let (text, rest) = match data.iter().position(|&b| b == 0) {
        Some(i) => (&data[..i], Some(&data[i + 1..])),
        None => (data, None),
    };
    let Ok(s) = std::str::from_utf8(text) else {
        return;
    };
    let Ok(cfg) = AllocatorConfig::parse(s) else {
        return;
    };
    assert_eq!(s.parse::<AllocatorConfig>().as_ref(), Ok(&cfg));
    let _ = (cfg.policy(), cfg.policy_name());
    for bytes in SIZES.into_iter().chain((0..64).map(|k| 1u64 << k)) {
        let _ = cfg.divisions_for(bytes);
    }
    let sizes: Vec<u64> = match rest {
        Some(r) => r
            .chunks_exact(4)
            .take(16)
            .map(|c| u64::from(u32::from_le_bytes([c[0], c[1], c[2], c[3]])) << (c[3] % 8))
            .collect(),
        None => SIZES.to_vec(),
    };
    let Ok(alloc) = device_allocator(SimBackend::new(4 << 30), cfg, 0) else {
        return;
    };
    let mut live = Vec::new();
    for &n in &sizes {
        if let Ok(a) = alloc.allocate(n as usize, StreamId::DEFAULT) {
            live.push(a);
        }
        let s = alloc.stats();
        let requested: u64 = live.iter().map(|a| a.size() as u64).sum();
        assert_eq!(s.requested_bytes.all().current as u64, requested);
        assert!(
            s.memory_allocated() >= requested,
            "rounding below the request"
        );
        assert!(s.memory_reserved() >= s.memory_allocated());
    }
    let in_blocks = berth_fuzz::snapshot::check_layout(&alloc.snapshot());
    assert_eq!(in_blocks, alloc.stats().memory_allocated());
    drop(live);
    alloc
        .empty_cache()
        .expect("empty_cache on a simulated device");
    assert_eq!(alloc.stats().memory_reserved(), 0);
    alloc.check_err().expect("no error while freeing");
});
