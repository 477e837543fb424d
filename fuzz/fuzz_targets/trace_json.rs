//! Trace files (`berth replay`, `berth_alloc::trace::parse_trace`; JSON or gzip): parsing
//! never panics, and a trace that parses (up to `replay::MAX_EVENTS` rows) replays on every
//! policy with sound statistics (`berth_fuzz::replay`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() > 64 << 10 {
        return;
    }
    if let Ok(trace) = berth_alloc::trace::parse_trace(data) {
        let _ = (trace.allocations(), trace.segment_addresses());
        berth_fuzz::replay::replay_everywhere(&trace);
    }
});
