//! Faithful: PyTorch's policy reproduces PyTorch's numbers on the real traces of `tests/data`
//! (PyTorch 2.11's own figures, measured on the H200 that recorded them).

use berth_alloc::backend::sim::SimBackend;
use berth_alloc::caching::CachingAllocator;
use berth_alloc::replay::replay;
use berth_alloc::trace::read_trace;
use berth_alloc::{AllocatorConfig, StreamId};

use crate::util::{trace_path, TRACES};

/// (trace, peak requested, default peak reserved, default segments, expandable peak reserved)
/// from the README table (H200, torch 2.11.0+cu130).
const PYTORCH: [(&str, u64, u64, u64, u64); 5] = [
    (
        "bert_varlen_train",
        16_209_102_960,
        18_184_404_992,
        181,
        16_227_762_176,
    ),
    ("gpt2_generate", 692_946_998, 759_169_024, 31, 738_197_504),
    (
        "gpt2_train",
        8_668_539_912,
        10_204_741_632,
        191,
        9_235_857_408,
    ),
    (
        "resnet50_train",
        5_879_357_852,
        7_031_750_656,
        111,
        5_991_563_264,
    ),
    (
        "two_stream_pipeline",
        268_738_372,
        354_418_688,
        12,
        341_835_776,
    ),
];

#[test]
fn default_policy_matches_pytorch_on_every_trace() {
    assert_eq!(TRACES.len(), PYTORCH.len());
    for (name, peak_requested, peak_reserved, segments, _) in PYTORCH {
        let Some(path) = trace_path(name) else {
            continue;
        };
        let trace = read_trace(&path).unwrap();
        assert_eq!(
            trace.stats.get("max_memory_reserved").copied(),
            Some(peak_reserved as i64),
            "{name}: README vs file"
        );
        let alloc = CachingAllocator::new(SimBackend::new(SimBackend::H200_BYTES));
        let report = replay(&trace.events, &alloc).unwrap();
        eprintln!("{name}: {report:?}");
        assert_eq!(
            report.peak_requested, peak_requested,
            "{name}: peak requested"
        );
        assert_eq!(report.peak_reserved, peak_reserved, "{name}: peak reserved");
        assert_eq!(report.device_allocs, segments, "{name}: segments");
        alloc.validate().unwrap();
    }
}

#[test]
fn default_policy_matches_with_the_traces_own_addresses() {
    for (name, _, peak_reserved, segments, _) in PYTORCH {
        let Some(path) = trace_path(name) else {
            continue;
        };
        let trace = read_trace(&path).unwrap();
        let sim = SimBackend::new(SimBackend::H200_BYTES).with_addresses(trace.segment_addresses());
        let alloc = CachingAllocator::new(sim);
        let report = replay(&trace.events, &alloc).unwrap();
        assert_eq!(
            (report.peak_reserved, report.device_allocs),
            (peak_reserved, segments),
            "{name}"
        );
    }
}

#[test]
fn expandable_segments_within_one_percent_of_pytorch() {
    for (name, _, _, _, expandable) in PYTORCH {
        let Some(path) = trace_path(name) else {
            continue;
        };
        let mut trace = read_trace(&path).unwrap();
        // PyTorch's expandable column comes from its C++ replay on one stream (README).
        for e in &mut trace.events {
            e.stream = StreamId::DEFAULT;
        }
        let cfg = AllocatorConfig::parse("expandable_segments:True").unwrap();
        let alloc =
            CachingAllocator::with_config(SimBackend::new(SimBackend::H200_BYTES), cfg).unwrap();
        let report = replay(&trace.events, &alloc).unwrap();
        let rel = (report.peak_reserved as f64 - expandable as f64).abs() / expandable as f64;
        eprintln!(
            "{name}: expandable peak {} vs PyTorch {expandable} ({:.3}%)",
            report.peak_reserved,
            rel * 100.0
        );
        assert!(
            rel <= 0.01,
            "{name}: {} vs {expandable}",
            report.peak_reserved
        );
        alloc.validate().unwrap();
    }
}
