//! A trace replayed on every policy of `berth replay` (and on the policy its own `alloc_conf`
//! selects), with the flags `berth replay` offers for the simulated device (`--real-addrs`,
//! a small and a large `--capacity`), bounded so one input stays fast.

use berth_alloc::backend::sim::SimBackend;
use berth_alloc::caching::CachingAllocator;
use berth_alloc::replay::CompiledTrace;
use berth_alloc::trace::Trace;
use berth_alloc::{device_allocator, AllocatorConfig, DeviceAllocator, PagedBestFit};

/// Traces with more rows than this are parsed but not replayed.
pub const MAX_EVENTS: usize = 512;

/// The simulated capacities replayed on, in bytes: 64 MiB (out-of-memory paths) and 4 GiB
/// (large enough for most requests, small enough that mapping a whole device page by page
/// stays fast).
pub const CAPACITIES: [u64; 2] = [64 << 20, 4 << 30];

/// Replays `trace` on the `pytorch`, `expandable` and `paged` policies, and on the policy of the
/// trace's `alloc_conf` when it parses, each on fresh simulated devices of every capacity in
/// [`CAPACITIES`], with increasing and with the trace's own segment addresses; checks the
/// invariants of [`check_replay`] after each.
pub fn replay_everywhere(trace: &Trace) {
    if trace.events.len() > MAX_EVENTS {
        return;
    }
    let compiled = CompiledTrace::new(&trace.events);
    let own = trace
        .alloc_conf
        .as_deref()
        .and_then(|c| AllocatorConfig::parse(c).ok());
    let expandable = AllocatorConfig::parse("expandable_segments:True").expect("a valid config");
    for capacity in CAPACITIES {
        for real_addrs in [false, true] {
            let sim = || {
                let s = SimBackend::new(capacity);
                if real_addrs {
                    s.with_addresses(trace.segment_addresses())
                } else {
                    s
                }
            };
            check_replay(&compiled, &CachingAllocator::new(sim()));
            let a = CachingAllocator::with_config(sim(), expandable.clone())
                .expect("the simulated device has virtual memory");
            check_replay(&compiled, &a);
            let a = PagedBestFit::new(sim()).expect("the simulated device has virtual memory");
            check_replay(&compiled, &a);
            if let Some(conf) = &own {
                if let Ok(a) = device_allocator(sim(), conf.clone(), 0) {
                    check_replay(&compiled, &*a);
                }
            }
        }
    }
}

/// One replay pass of `trace` on the fresh allocator `alloc`, then: nothing is left allocated
/// (the replay frees what the trace left live), a finished replay reserved at least the peak
/// it requested, the cached segments are laid out soundly, and `empty_cache` gives every byte
/// back.
///
/// # Panics
/// When an invariant does not hold (a finding).
pub fn check_replay(trace: &CompiledTrace, alloc: &dyn DeviceAllocator) {
    let result = trace.replay(alloc);
    let stats = alloc.stats();
    let policy = alloc.policy_name();
    assert_eq!(
        stats.memory_allocated(),
        0,
        "{policy}: blocks left allocated"
    );
    assert_eq!(
        stats.requested_bytes.all().current,
        0,
        "{policy}: requested bytes left"
    );
    if let Ok(report) = &result {
        assert!(
            report.peak_reserved >= report.peak_requested,
            "{policy}: peak reserved {} below peak requested {}",
            report.peak_reserved,
            report.peak_requested
        );
    }
    let in_blocks = crate::snapshot::check_layout(&alloc.snapshot());
    assert_eq!(in_blocks, 0, "{policy}: snapshot shows allocated blocks");
    alloc
        .empty_cache()
        .expect("empty_cache on a simulated device");
    assert_eq!(
        alloc.stats().memory_reserved(),
        0,
        "{policy}: reserved bytes after everything was freed and the cache emptied"
    );
    alloc.check_err().expect("no error recorded while freeing");
}
