//! berth-torch's C ABI with policy `expandable` over simulated devices: random alloc / free /
//! record_stream / reset / memory-fraction sequences and misuse (`berth_fuzz::abi`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    berth_fuzz::abi::run("expandable", data);
});
