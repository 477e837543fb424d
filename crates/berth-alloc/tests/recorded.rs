//! The ten traces recorded on the H200 on 2026-12-01 with `scripts/traces/record-traces.sh`
//! (programs in `scripts/traces/record_traces.py`; figures in
//! `tests/data/pytorch_figures_2026-12-01.jsonl`, table in `tests/data/README.md`): PyTorch's
//! two native modes reproduced exactly; and `paged`'s peak and device calls on every committed
//! trace, warm passes included.

use berth_alloc::backend::sim::SimBackend;
use berth_alloc::caching::CachingAllocator;
use berth_alloc::paged::CHURN_DIV;
use berth_alloc::replay::{replay, CompiledTrace};
use berth_alloc::trace::read_trace;
use berth_alloc::{AllocatorConfig, PagedBestFit, PagedTuning};

use crate::util::trace_path;

/// Per trace, PyTorch 2.11's live figures: peak requested; default peak reserved and segments
/// (`num_device_alloc`); `expandable_segments:True` peak reserved and segments;
/// `backend:cudaMallocAsync` peak reserved.
pub const RECORDED: [(&str, u64, u64, u64, u64, u64, u64); 10] = [
    (
        "detection_varsize_train",
        6_943_695_600,
        11_167_334_400,
        177,
        7_027_556_352,
        207,
        7_012_876_288,
    ),
    (
        "embedding_recsys_train",
        2_823_803_844,
        2_988_441_600,
        39,
        2_877_292_544,
        34,
        2_885_681_152,
    ),
    (
        "finetune_reload_weights",
        4_355_466_580,
        4_689_231_872,
        199,
        4_475_322_368,
        158,
        4_529_848_320,
    ),
    (
        "llm_ckpt_varlen_train",
        4_860_305_964,
        7_103_053_824,
        167,
        5_985_271_808,
        141,
        6_207_569_920,
    ),
    (
        "llm_kvcache_varbatch_generate",
        645_358_966,
        748_683_264,
        44,
        702_545_920,
        39,
        704_643_072,
    ),
    (
        "lstm_varlen_train",
        6_262_160_392,
        20_088_619_008,
        28,
        6_847_201_280,
        17,
        8_220_835_840,
    ),
    (
        "segmentation_varsize_train",
        6_408_919_367,
        8_501_854_208,
        154,
        6_662_651_904,
        153,
        7_583_301_632,
    ),
    (
        "three_stream_overlap",
        393_256_960,
        467_664_896,
        14,
        425_721_856,
        14,
        603_979_776,
    ),
    (
        "unet_diffusion_train",
        1_758_468_899,
        2_011_168_768,
        59,
        2_023_751_680,
        61,
        3_053_453_312,
    ),
    (
        "vit_bf16_amp_train",
        3_827_229_508,
        4_255_121_408,
        148,
        3_997_171_712,
        140,
        5_268_045_824,
    ),
];

/// PyTorch's default policy, handed the segment addresses the trace recorded (equal-size free
/// blocks are chosen by address), gives PyTorch's live peak reserved and segment count exactly.
#[test]
fn pytorch_policy_is_exact_on_every_recorded_trace() {
    for (name, requested, reserved, segments, ..) in RECORDED {
        let Some(path) = trace_path(name) else {
            continue;
        };
        let trace = read_trace(&path).unwrap();
        assert_eq!(
            trace.stats.get("max_memory_reserved").copied(),
            Some(reserved as i64),
            "{name}: table vs file"
        );
        let sim = SimBackend::new(SimBackend::H200_BYTES).with_addresses(trace.segment_addresses());
        let alloc = CachingAllocator::new(sim);
        let r = replay(&trace.events, &alloc).unwrap();
        assert_eq!(
            (r.peak_requested, r.peak_reserved, r.device_allocs),
            (requested, reserved, segments),
            "{name}"
        );
        alloc.validate().unwrap();
    }
}

/// PyTorch's expandable segments, streams as recorded: PyTorch's live figures exactly.
#[test]
fn expandable_segments_are_exact_on_every_recorded_trace() {
    for (name, _, _, _, reserved, segments, _) in RECORDED {
        let Some(path) = trace_path(name) else {
            continue;
        };
        let trace = read_trace(&path).unwrap();
        let cfg = AllocatorConfig::parse("expandable_segments:True").unwrap();
        let alloc =
            CachingAllocator::with_config(SimBackend::new(SimBackend::H200_BYTES), cfg).unwrap();
        let r = replay(&trace.events, &alloc).unwrap();
        assert_eq!(
            (r.peak_reserved, r.device_allocs),
            (reserved, segments),
            "{name}"
        );
        alloc.validate().unwrap();
    }
}

/// `paged` per committed trace (the five first traces and the ten recorded): first-pass peak
/// reserved, device calls (map + unmap), and the device calls of two more passes on the same
/// allocator. These pin today's policy so that every change to it shows here; see
/// `tests/data/README.md` for how they compare with PyTorch's modes.
const PAGED: [(&str, u64, u64, u64); 15] = [
    ("bert_varlen_train", 16_210_984_960, 638, 0),
    ("detection_varsize_train", 7_000_293_376, 375, 0),
    ("embedding_recsys_train", 2_854_223_872, 109, 0),
    ("finetune_reload_weights", 4_456_448_000, 347, 0),
    ("gpt2_generate", 731_906_048, 117, 0),
    ("gpt2_train", 9_103_736_832, 472, 34),
    ("llm_ckpt_varlen_train", 5_129_633_792, 329, 70),
    ("llm_kvcache_varbatch_generate", 660_602_880, 101, 0),
    ("lstm_varlen_train", 6_599_737_344, 354, 306),
    ("resnet50_train", 5_966_397_440, 258, 0),
    ("segmentation_varsize_train", 6_641_680_384, 306, 0),
    ("three_stream_overlap", 400_556_032, 34, 0),
    ("two_stream_pipeline", 287_309_824, 126, 17),
    ("unet_diffusion_train", 1_923_088_384, 136, 76),
    ("vit_bf16_amp_train", 3_969_908_736, 223, 0),
];

/// What one device call of a warm pass (a `map`: `cuMemCreate` + `cuMemMap` +
/// `cuMemSetAccess`, or an `unmap`: a wait for the stream, `cuMemUnmap` + `cuMemRelease`)
/// costs, in microseconds: about 100 µs in `berth replay --device cuda:0` on the H200
/// (`BENCHMARKS.md`).
const DEVICE_CALL_US: u64 = 100;

/// Two warm passes (the same allocator replaying the trace again, as a training loop repeats
/// its step): the device calls they make would cost under 1% of the time the recorded program
/// took for one pass (its first to last event), at [`DEVICE_CALL_US`] each. This is an
/// estimate from counted calls, not a timing: the live step times in `BENCHMARKS.md` are the
/// measurement.
#[test]
fn paged_warm_passes_cost_under_one_percent_of_the_programs_time() {
    for (name, _, _, warm) in PAGED {
        let Some(path) = trace_path(name) else {
            continue;
        };
        let trace = read_trace(&path).unwrap();
        let span_us = trace.events.last().unwrap().time_us - trace.events[0].time_us;
        let alloc = PagedBestFit::new(SimBackend::new(SimBackend::H200_BYTES)).unwrap();
        let compiled = CompiledTrace::new(&trace.events);
        compiled.replay(&alloc).unwrap();
        let calls: u64 = (0..2)
            .map(|_| compiled.replay(&alloc).unwrap().device_calls)
            .sum();
        assert_eq!(calls, warm, "{name}");
        let per_pass_us = calls * DEVICE_CALL_US / 2;
        assert!(
            per_pass_us * 100 <= span_us as u64,
            "{name}: {calls} calls in two warm passes, {per_pass_us} us a pass of {span_us} us"
        );
    }
}

#[test]
fn paged_peaks_and_calls_on_every_recorded_trace() {
    // Every trace's first-pass peak at or under each of PyTorch's three modes; a change that
    // loses one shows here.
    let mut misses = Vec::new();
    for (name, reserved, calls, _) in PAGED {
        let Some(path) = trace_path(name) else {
            continue;
        };
        let trace = read_trace(&path).unwrap();
        let alloc = PagedBestFit::new(SimBackend::new(SimBackend::H200_BYTES)).unwrap();
        let r = replay(&trace.events, &alloc).unwrap();
        assert_eq!(
            (r.peak_reserved, r.device_calls),
            (reserved, calls),
            "{name}"
        );
        // PyTorch's live figures of the ten recorded traces (the first five's are in
        // `tests/paged.rs`).
        let Some(&(_, requested, default, _, expandable, _, asynch)) =
            RECORDED.iter().find(|t| t.0 == name)
        else {
            continue;
        };
        assert_eq!(r.peak_requested, requested, "{name}");
        assert!(
            r.peak_reserved <= default && r.peak_reserved <= asynch,
            "{name}"
        );
        if r.peak_reserved > expandable {
            misses.push((name, "peak reserved over expandable segments'"));
        }
    }
    assert_eq!(misses, []);
}

/// Step 5 of `Note [Paged best fit]` (off by default): `unet_diffusion_train` unmaps free
/// units in every pass once its live peak stops growing; learning headroom from those repeats
/// (a churn divisor of 4) cuts the churn from 76 device calls in two warm passes to 9 (about
/// 3.8 ms to 0.5 ms a pass at [`DEVICE_CALL_US`], against a 5.7 s pass) and raises the
/// first-pass peak by 2.7%. Judged by time, the calls are cheap and the memory is not: step 5 is off.
#[test]
fn paged_learns_headroom_from_unmaps_that_repeat() {
    let Some(path) = trace_path("unet_diffusion_train") else {
        return;
    };
    let trace = read_trace(&path).unwrap();
    let compiled = CompiledTrace::new(&trace.events);
    let run = |churn_div| {
        let tuning = PagedTuning {
            churn_div,
            ..PagedTuning::default()
        };
        let alloc =
            PagedBestFit::with_tuning(SimBackend::new(SimBackend::H200_BYTES), tuning).unwrap();
        let first = compiled.replay(&alloc).unwrap();
        let warm: u64 = (0..2)
            .map(|_| compiled.replay(&alloc).unwrap().device_calls)
            .sum();
        (first.peak_reserved, warm)
    };
    assert_eq!(CHURN_DIV, 0, "step 5 is off by default");
    assert_eq!(run(0), (1_923_088_384, 76));
    assert_eq!(run(4), (1_975_517_184, 9));
}

/// The five traces recorded on 2026-12-03, after `paged`'s constants were chosen (so never
/// shaped on): peak requested, PyTorch's default and expandable segments' peak reserved from
/// the live runs, and `paged`'s first-pass peak reserved in a replay. `paged` stays at or under
/// expandable segments on four; on `growing_batch_train` it is 8 MiB over (`tests/data/README.md`).
const UNSEEN: [(&str, u64, u64, u64, u64); 5] = [
    (
        "diffusion_varres_train",
        4_834_855_140,
        7_505_707_008,
        5_624_561_664,
        5_104_467_968,
    ),
    (
        "growing_batch_train",
        3_069_545_104,
        10_164_895_744,
        3_118_465_024,
        3_126_853_632,
    ),
    (
        "longctx_sdpa_train",
        10_011_665_544,
        11_981_029_376,
        11_400_118_272,
        10_552_868_864,
    ),
    (
        "moe_uneven_train",
        19_763_446_400,
        24_320_671_744,
        21_149_777_920,
        20_969_422_848,
    ),
    (
        "speculative_decode_generate",
        2_036_740_096,
        2_044_723_200,
        2_059_403_264,
        2_038_431_744,
    ),
];

#[test]
fn paged_on_the_traces_it_was_not_shaped_on() {
    let mut over = Vec::new();
    for (name, requested, default, expandable, paged) in UNSEEN {
        let Some(path) = trace_path(name) else {
            continue;
        };
        let trace = read_trace(&path).unwrap();
        assert_eq!(
            trace.stats.get("max_memory_reserved").copied(),
            Some(default as i64),
            "{name}: the recorded default's peak"
        );
        let alloc = PagedBestFit::new(SimBackend::new(SimBackend::H200_BYTES)).unwrap();
        let r = replay(&trace.events, &alloc).unwrap();
        assert_eq!(
            (r.peak_requested, r.peak_reserved),
            (requested, paged),
            "{name}"
        );
        if paged > expandable {
            over.push((name, paged - expandable));
        }
    }
    assert_eq!(over, [("growing_batch_train", 8 << 20)]);
}
