//! Pickles (`berth replay` of a `_dump_snapshot` file): the plain-data reader, the snapshot
//! loader and the trace loader never panic; what the reader decodes writes back and reads back
//! to the same bytes; a loaded snapshot dumps and loads back to itself; a loaded trace replays
//! on every policy (`berth_fuzz::replay`).
#![no_main]

use berth_alloc::pickle::{dump_snapshot, from_slice, load_snapshot, load_trace_pickle, to_vec};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() > 64 << 10 {
        return;
    }
    if let Ok(v) = from_slice(data) {
        let _ = v.type_name();
        let written = to_vec(&v);
        let again = from_slice(&written).expect("berth's own pickle reads back");
        assert_eq!(to_vec(&again), written, "write, read, write differs");
    }
    if let Ok(snapshot) = load_snapshot(data) {
        let dumped = dump_snapshot(&snapshot);
        let back = load_snapshot(&dumped).expect("a dumped snapshot loads");
        assert_eq!(back, snapshot, "dump then load changed the snapshot");
    }
    if let Ok(trace) = load_trace_pickle(data) {
        berth_fuzz::replay::replay_everywhere(&trace);
    }
});
