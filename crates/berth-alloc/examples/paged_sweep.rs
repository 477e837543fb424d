//! Replays every trace under `tests/data` with `paged` for a grid of its constants
//! ([`PagedTuning`]) and prints one JSON line per (trace, constants): peak requested, peak
//! reserved and device calls of a first pass, and the device calls of two more passes on the
//! same allocator (`warm_calls`), and the peak reserved after all three (`final_peak`).
//! `scripts/traces/paged_loo.py` turns the lines into the leave-one-out table.
//!
//! Usage, with comma-separated grids of the constants (defaults `0,8,16,32,64`, `2,inf`,
//! `16,32,64`, `0,4` and `0,2`: today's constants among them; `inf` is no call budget) and,
//! optionally, a part of the trace names to keep:
//!
//! ```text
//! cargo run --release -p berth-alloc --example paged_sweep -- [HEADROOM_DIVS] [CALLS] [UNIT_MIB] [CHURN_DIVS] [RUN_UNITS] [NAME]
//! ```

use std::path::Path;

use berth_alloc::backend::sim::SimBackend;
use berth_alloc::replay::CompiledTrace;
use berth_alloc::trace::read_trace;
use berth_alloc::{DeviceAllocator, PagedBestFit, PagedTuning};

fn grid<T: std::str::FromStr>(arg: Option<String>, default: &str) -> Vec<T> {
    arg.as_deref()
        .unwrap_or(default)
        .split(',')
        .map(|s| {
            s.parse()
                .unwrap_or_else(|_| panic!("not a number in the grid: {s}"))
        })
        .collect()
}

fn main() {
    let mut args = std::env::args().skip(1);
    let divs: Vec<u64> = grid(args.next(), "0,8,16,32,64");
    let calls: Vec<f64> = grid(args.next(), "2,inf");
    let units: Vec<u64> = grid(args.next(), "16,32,64");
    let churns: Vec<u64> = grid(args.next(), "0,4");
    let run_units: Vec<u64> = grid(args.next(), "0,2");
    let only = args.next().unwrap_or_default();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("tests/data")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.to_string_lossy().ends_with(".trace.json.gz"))
        .filter(|p| p.to_string_lossy().contains(only.as_str()))
        .collect();
    files.sort();
    for path in files {
        let trace = read_trace(&path).expect("a checked-in trace parses");
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".trace.json.gz"))
            .unwrap_or("?")
            .to_owned();
        for (&headroom_div, &calls_per_20mib, &unit_mib, &churn_div, &max_run_units) in divs
            .iter()
            .flat_map(|d| calls.iter().map(move |c| (d, c)))
            .flat_map(|(d, c)| units.iter().map(move |u| (d, c, u)))
            .flat_map(|(d, c, u)| churns.iter().map(move |k| (d, c, u, k)))
            .flat_map(|(d, c, u, k)| run_units.iter().map(move |n| (d, c, u, k, n)))
        {
            {
                let tuning = PagedTuning {
                    headroom_div,
                    calls_per_20mib,
                    max_unit_bytes: unit_mib << 20,
                    churn_div,
                    max_run_units,
                };
                let alloc =
                    PagedBestFit::with_tuning(SimBackend::new(SimBackend::H200_BYTES), tuning)
                        .expect("the simulator has virtual memory");
                // Three passes on one allocator, as a training loop repeats its step: the
                // first pass's peak and calls, and the calls the two warm passes still make.
                let compiled = CompiledTrace::new(&trace.events);
                let r = compiled.replay(&alloc).expect("replay");
                let warm: u64 = (0..2)
                    .map(|_| compiled.replay(&alloc).expect("replay").device_calls)
                    .sum();
                println!(
                    "{{\"trace\":\"{name}\",\"headroom_div\":{headroom_div},\"calls_per_20mib\":{},\"unit_mib\":{unit_mib},\"churn_div\":{churn_div},\"run_units\":{max_run_units},\"peak_requested\":{},\"peak_reserved\":{},\"device_calls\":{},\"warm_calls\":{warm},\"ops\":{},\"final_peak\":{}}}",
                    // No budget (`inf`) as Python's JSON reader spells it.
                    if calls_per_20mib.is_finite() { calls_per_20mib.to_string() } else { "Infinity".to_owned() },
                    r.peak_requested, r.peak_reserved, r.device_calls, r.ops, alloc.stats().max_memory_reserved()
                );
            }
        }
    }
}
