//! PyTorch's figures beside berth's in `berth replay`: those a trace carries itself
//! ([`Recorded`], the `stats` a recording keeps: `scripts/traces/record_traces.py`) and those
//! measured for the five first traces of `crates/berth-alloc/tests/data` ([`TORCH`], shown only
//! when a trace is one of them: [`Reference`]).

use std::collections::BTreeMap;

use berth_alloc::stats::format_size;

/// PyTorch's figures for one of the five first traces of `crates/berth-alloc/tests/data` (PyTorch
/// 2.11's own allocator on the H200 that recorded them).
pub(crate) struct TorchFigures {
    pub(crate) name: &'static str,
    pub(crate) peak_requested: u64,
    /// Peak reserved bytes: default, `expandable_segments`, `cudaMallocAsync`.
    pub(crate) reserved: [u64; 3],
    /// `num_device_alloc` of the live run (default mode).
    pub(crate) segments: u64,
    /// C++ `raw_alloc`/`raw_delete` ns per operation: default, expandable, cudaMallocAsync.
    pub(crate) ns_per_op: [u64; 3],
}

pub(crate) const TORCH: [TorchFigures; 5] = [
    TorchFigures {
        name: "bert_varlen_train",
        peak_requested: 16_209_102_960,
        reserved: [18_184_404_992, 16_227_762_176, 16_240_345_088],
        segments: 181,
        ns_per_op: [562, 333, 1666],
    },
    TorchFigures {
        name: "gpt2_generate",
        peak_requested: 692_946_998,
        reserved: [759_169_024, 738_197_504, 838_860_800],
        segments: 31,
        ns_per_op: [395, 226, 1401],
    },
    TorchFigures {
        name: "gpt2_train",
        peak_requested: 8_668_539_912,
        reserved: [10_204_741_632, 9_235_857_408, 12_180_258_816],
        segments: 191,
        ns_per_op: [491, 321, 1941],
    },
    TorchFigures {
        name: "resnet50_train",
        peak_requested: 5_879_357_852,
        reserved: [7_031_750_656, 5_991_563_264, 6_140_461_056],
        segments: 111,
        ns_per_op: [535, 291, 1563],
    },
    TorchFigures {
        name: "two_stream_pipeline",
        peak_requested: 268_738_372,
        reserved: [354_418_688, 341_835_776, 369_098_752],
        segments: 12,
        ns_per_op: [332, 227, 1293],
    },
];

pub(crate) const TORCH_MODES: [&str; 3] =
    ["torch default", "torch expandable", "torch cudaMallocAsync"];

/// How a replayed trace relates to PyTorch's reference figures ([`TORCH`]).
#[derive(Clone, Copy)]
pub(crate) enum Reference {
    /// No reference trace has this file name.
    None,
    /// The file name and the replay's peak requested bytes match: the figures are this trace's.
    Matches(&'static TorchFigures),
    /// The file name matches but the peak requested bytes do not: another trace under a reference
    /// trace's name, so its figures would mislead.
    NameOnly(&'static TorchFigures),
}

impl Reference {
    /// The reference for a trace named `stem` whose replay peaked at `peak_requested` bytes.
    /// Traces are deterministic: the same trace replays to the same peak under every policy.
    pub(crate) fn of(stem: &str, peak_requested: u64) -> Reference {
        match TORCH.iter().find(|t| t.name == stem) {
            None => Reference::None,
            Some(t) if t.peak_requested == peak_requested => Reference::Matches(t),
            Some(t) => Reference::NameOnly(t),
        }
    }

    /// The note for [`Reference::NameOnly`]: one line, no trailing newline.
    pub(crate) fn mismatch_note(t: &TorchFigures, peak_requested: u64) -> String {
        format!(
            "(the file name matches PyTorch's reference trace {}, but its content does not: peak \
             requested {} ({peak_requested} bytes), the reference's {} ({} bytes); its replay \
             figures are not shown)",
            t.name,
            format_size(peak_requested),
            format_size(t.peak_requested),
            t.peak_requested
        )
    }
}

/// PyTorch's own figures carried by a trace: the `stats` (`memory_stats()` at the end of the
/// live run) that a recording keeps beside the events (`scripts/traces/record_traces.py`).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Recorded {
    /// `requested_bytes.all.peak`, if recorded.
    pub(crate) peak_requested: Option<u64>,
    /// `reserved_bytes.all.peak` (or `max_memory_reserved`).
    pub(crate) peak_reserved: u64,
    /// `num_device_alloc` (cudaMalloc calls), if recorded.
    pub(crate) segments: Option<u64>,
    /// The `alloc_conf` of the recording (`PYTORCH_CUDA_ALLOC_CONF`), empty for the default.
    pub(crate) alloc_conf: String,
}

impl Recorded {
    /// The figures in `stats`, if it has at least the peak reserved bytes.
    pub(crate) fn from_stats(
        stats: &BTreeMap<String, i64>,
        alloc_conf: Option<&str>,
    ) -> Option<Recorded> {
        let get = |k: &str| stats.get(k).and_then(|&v| u64::try_from(v).ok());
        Some(Recorded {
            peak_reserved: get("reserved_bytes.all.peak").or_else(|| get("max_memory_reserved"))?,
            peak_requested: get("requested_bytes.all.peak"),
            segments: get("num_device_alloc"),
            alloc_conf: alloc_conf.unwrap_or_default().to_owned(),
        })
    }

    /// `peak_reserved / peak_requested`, when both are known and the request is not 0.
    pub(crate) fn ratio(&self) -> Option<f64> {
        self.peak_requested
            .filter(|&r| r > 0)
            .map(|r| self.peak_reserved as f64 / r as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_figures_need_the_name_and_the_peak() {
        assert!(matches!(
            Reference::of("gpt2_train", 8_668_539_912),
            Reference::Matches(t) if t.name == "gpt2_train"
        ));
        assert!(matches!(
            Reference::of("gpt2_train", 5_879_357_852),
            Reference::NameOnly(t) if t.name == "gpt2_train"
        ));
        assert!(matches!(Reference::of("mine", 5), Reference::None));
    }

    #[test]
    fn recorded_figures_need_the_peak_reserved() {
        let stats = |kv: &[(&str, i64)]| kv.iter().map(|(k, v)| (k.to_string(), *v)).collect();
        let r = Recorded::from_stats(
            &stats(&[
                ("max_memory_reserved", 4096),
                ("requested_bytes.all.peak", 1024),
            ]),
            None,
        )
        .unwrap();
        assert_eq!(
            (r.peak_reserved, r.peak_requested, r.segments),
            (4096, Some(1024), None)
        );
        assert_eq!(r.ratio(), Some(4.0));
        assert_eq!(
            Recorded::from_stats(&stats(&[("num_device_alloc", 3)]), None),
            None
        );
        let none_requested = Recorded::from_stats(&stats(&[("reserved_bytes.all.peak", 9)]), None);
        assert_eq!(none_requested.unwrap().ratio(), None);
    }
}
