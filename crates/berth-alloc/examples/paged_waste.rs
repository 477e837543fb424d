//! Where `paged`'s waste comes from, per committed trace. One first pass; at the moment peak
//! reserved was last raised, the mapped bytes are split into live blocks and free memory of
//! three kinds: free bytes on 2 MiB pages that hold part of a live block (page-level
//! fragmentation), free pages inside mapping units that hold a live block (unit-level
//! fragmentation: no unmap can release them, `Note [Mapping units]`), and wholly free units (left
//! mapped by step 3's headroom, and by the call budget when one is set, `Note [Paged best
//! fit]`). The peak can come when
//! fewer bytes are live than at the live peak: that difference is shown too, so that
//! `over + live below peak = rounding + page + unit + free units`.
//!
//! ```text
//! cargo run --release -p berth-alloc --example paged_waste -- [NAME [HEADROOM_DIV CALLS UNIT_MIB CHURN_DIV RUN_UNITS]]
//! ```
//!
//! An empty NAME keeps every trace; the constants default to [`PagedTuning::default`]'s.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Mutex;

use berth_alloc::backend::sim::SimBackend;
use berth_alloc::backend::{DevicePtr, StreamId};
use berth_alloc::replay::CompiledTrace;
use berth_alloc::snapshot::{BlockState, MemorySnapshot, TraceAction};
use berth_alloc::stats::MemoryStats;
use berth_alloc::trace::read_trace;
use berth_alloc::{
    AllocError, Allocation, DeviceAllocator, OomObserver, PagedBestFit, PagedTuning,
};

const PAGE: u64 = 2 << 20;

/// The split of mapped memory at one moment, in bytes.
#[derive(Clone, Copy, Debug, Default)]
struct Split {
    reserved: u64,
    requested: u64,
    rounding: u64,
    /// Free bytes on pages that hold part of a live block.
    partial_free: u64,
    /// Free bytes in units that hold a live block (`partial_free` included).
    pinned_free: u64,
    /// Bytes of units with no live block.
    free_units: u64,
}

/// Splits the mapped memory of `s`, whose history must hold every map and unmap so far (the
/// mapping units are rebuilt from it: unmaps take whole units only).
fn split(s: &MemorySnapshot) -> Split {
    let mut out = Split::default();
    let mut blocks: Vec<(u64, u64)> = Vec::new();
    for seg in &s.segments {
        out.reserved += seg.total_size;
        for b in &seg.blocks {
            if b.state == BlockState::ActiveAllocated {
                out.requested += b.requested_size;
                out.rounding += b.size - b.requested_size;
                blocks.push((b.address, b.size));
            }
        }
    }
    blocks.sort_unstable();
    // Pages touched by a live block, coalesced.
    let mut touched: Vec<(u64, u64)> = Vec::new();
    for &(a, n) in &blocks {
        let (lo, hi) = (a / PAGE * PAGE, (a + n).div_ceil(PAGE) * PAGE);
        match touched.last_mut() {
            Some(l) if l.1 >= lo => l.1 = l.1.max(hi),
            _ => touched.push((lo, hi)),
        }
    }
    let live: u64 = blocks.iter().map(|b| b.1).sum();
    out.partial_free = touched.iter().map(|(a, b)| b - a).sum::<u64>() - live;
    let mut units: BTreeMap<u64, u64> = BTreeMap::new();
    for e in &s.device_traces[0] {
        match e.action {
            TraceAction::SegmentMap => {
                units.insert(e.addr, e.size);
            }
            TraceAction::SegmentUnmap => {
                let mut at = e.addr;
                while at < e.addr + e.size {
                    at += units.remove(&at).expect("unmaps take whole units");
                }
            }
            _ => {}
        }
    }
    // Blocks are disjoint and sorted, units too: one merge pass.
    let mut i = 0;
    for (&a, &n) in &units {
        while i < blocks.len() && blocks[i].0 + blocks[i].1 <= a {
            i += 1;
        }
        let mut inside = 0;
        let mut j = i;
        while j < blocks.len() && blocks[j].0 < a + n {
            let (b, m) = blocks[j];
            inside += (b + m).min(a + n) - b.max(a);
            j += 1;
        }
        if inside == 0 {
            out.free_units += n;
        } else {
            out.pinned_free += n - inside;
        }
    }
    out
}

/// Forwards to `paged`, splitting its mapped memory each time its peak reserved rises.
struct Probe {
    inner: PagedBestFit<SimBackend>,
    max_reserved: Mutex<u64>,
    at_peak: Mutex<Split>,
}

impl Probe {
    fn check(&self) {
        let reserved = self.inner.stats().reserved_bytes.all().current.max(0) as u64;
        let mut max = self.max_reserved.lock().expect("not poisoned");
        if reserved > *max {
            *max = reserved;
            *self.at_peak.lock().expect("not poisoned") = split(&self.inner.snapshot());
        }
    }
}

impl DeviceAllocator for Probe {
    fn policy_name(&self) -> &str {
        "probe"
    }
    fn allocate(&self, bytes: usize, stream: StreamId) -> Result<Allocation, AllocError> {
        self.inner.allocate(bytes, stream)
    }
    fn raw_alloc(&self, bytes: usize, stream: StreamId) -> Result<DevicePtr, AllocError> {
        let p = self.inner.raw_alloc(bytes, stream);
        self.check();
        p
    }
    fn raw_delete(&self, ptr: DevicePtr) -> Result<(), AllocError> {
        self.inner.raw_delete(ptr)
    }
    fn raw_record_stream(&self, ptr: DevicePtr, stream: StreamId) -> Result<(), AllocError> {
        self.inner.raw_record_stream(ptr, stream)
    }
    fn empty_cache(&self) -> Result<(), AllocError> {
        self.inner.empty_cache()
    }
    fn stats(&self) -> MemoryStats {
        self.inner.stats()
    }
    fn memory_stats(&self) -> BTreeMap<String, i64> {
        self.inner.memory_stats()
    }
    fn reset_peak_memory_stats(&self) {}
    fn reset_accumulated_memory_stats(&self) {}
    fn snapshot(&self) -> MemorySnapshot {
        self.inner.snapshot()
    }
    fn record_memory_history(&self, _: Option<usize>) {}
    fn set_memory_fraction(&self, _: f64) -> Result<(), AllocError> {
        Ok(())
    }
    fn attach_oom_observer(&self, _: OomObserver) {}
    fn set_device_index(&self, _: i32) {}
    fn check_err(&self) -> Result<(), AllocError> {
        Ok(())
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let only = args.first().cloned().unwrap_or_default();
    let num = |i: usize| args.get(i).and_then(|s| s.parse::<f64>().ok());
    let d = PagedTuning::default();
    let tuning = PagedTuning {
        headroom_div: num(1).map_or(d.headroom_div, |v| v as u64),
        calls_per_20mib: num(2).unwrap_or(d.calls_per_20mib),
        max_unit_bytes: num(3).map_or(d.max_unit_bytes, |v| (v as u64) << 20),
        churn_div: num(4).map_or(d.churn_div, |v| v as u64),
        max_run_units: num(5).map_or(d.max_run_units, |v| v as u64),
    };
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("tests/data")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.to_string_lossy().ends_with(".trace.json.gz"))
        .filter(|p| p.to_string_lossy().contains(only.as_str()))
        .collect();
    files.sort();
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    println!("| trace | waste | over MiB | live below peak | 512 B rounding | free in live pages | free pages in pinned units | wholly free units |");
    println!("|---|---|---|---|---|---|---|---|");
    for path in files {
        let trace = read_trace(&path).expect("a checked-in trace parses");
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("?");
        let name = name.strip_suffix(".trace.json.gz").unwrap_or(name);
        let probe = Probe {
            inner: PagedBestFit::with_tuning(SimBackend::new(SimBackend::H200_BYTES), tuning)
                .expect("the simulator has virtual memory"),
            max_reserved: Mutex::new(0),
            at_peak: Mutex::new(Split::default()),
        };
        probe.inner.record_memory_history(Some(usize::MAX >> 8));
        let r = CompiledTrace::new(&trace.events)
            .replay(&probe)
            .expect("replay");
        let s = *probe.at_peak.lock().expect("not poisoned");
        assert_eq!(s.reserved, r.peak_reserved, "{name}");
        println!(
            "| {name} | {:.2}% | {:.0} | {:.0} | {:.1} | {:.0} | {:.0} | {:.0} |",
            100.0 * (r.peak_reserved as f64 / r.peak_requested as f64 - 1.0),
            mib(r.peak_reserved - r.peak_requested),
            mib(r.peak_requested.saturating_sub(s.requested)),
            mib(s.rounding),
            mib(s.partial_free),
            mib(s.pinned_free - s.partial_free),
            mib(s.free_units),
        );
    }
}
