//! `berth replay`: PyTorch allocator traces through berth's allocators.
//!
//! Each trace (`*.trace.json.gz`, plain JSON, or a `_dump_snapshot` pickle, whose
//! `device_traces[0]` is replayed) goes through each chosen policy on a fresh [`SimBackend`],
//! following `berth_alloc::replay`'s rules (streams honoured: a block is freed at its
//! `free_completed` row). Timing is PyTorch's C++ replay's (`Note [Compiled replay]` in
//! `berth_alloc::replay`): [`PASSES`] passes on one allocator, memory figures from the first
//! (cold) pass, `ns_per_op` the fastest of the others (warm). PyTorch's own figures for the
//! five real traces (`crates/berth-alloc/tests/data`) are printed beside berth's, when the
//! trace is that one: its file name and its replayed peak requested bytes both match (see
//! [`Reference`]).

use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use anyhow::Context;
use berth_alloc::backend::sim::SimBackend;
use berth_alloc::caching::CachingAllocator;
use berth_alloc::replay::{CompiledTrace, ReplayError, ReplayReport};
use berth_alloc::trace::{read_trace, Trace};
use berth_alloc::{AllocatorConfig, DeviceAllocator, MemoryBackend, PagedBestFit};

use crate::UsageError;

/// Arguments of `berth replay`.
#[derive(clap::Args, Debug)]
pub struct ReplayArgs {
    /// Trace files (`*.trace.json.gz`, JSON, or PyTorch snapshot pickles).
    #[arg(required = true)]
    pub traces: Vec<PathBuf>,
    /// Allocator policy: `pytorch` (PyTorch's default caching allocator), `expandable`
    /// (`expandable_segments:True`), `paged` (berth's own `PagedBestFit`) or `all`.
    #[arg(long, default_value = "paged")]
    pub policy: String,
    /// Simulated device memory in bytes (suffixes KiB, MiB, GiB, TiB allowed); default: an
    /// H200's 150109880320. Only with `--device sim`.
    #[arg(long, value_name = "BYTES")]
    pub capacity: Option<String>,
    /// Hand out the segment addresses the trace recorded (its `segment_alloc` rows) instead of
    /// increasing ones: PyTorch breaks ties between equal-size free blocks by address. Only
    /// with `--device sim`.
    #[arg(long)]
    pub real_addrs: bool,
    /// Print one JSON object per trace and policy instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Where to replay: `sim` (a simulated device, default) or `cuda:N` (the real GPU, through
    /// berth's CUDA backend; all streams collapsed to the default stream, as PyTorch's C++
    /// replay in BENCHMARKS.md does; `--capacity` and `--real-addrs` do not apply).
    #[arg(long, default_value = "sim")]
    pub device: String,
}

/// A replay policy of `--policy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Policy {
    Pytorch,
    Expandable,
    Paged,
}

impl Policy {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Policy::Pytorch => "pytorch",
            Policy::Expandable => "expandable",
            Policy::Paged => "paged",
        }
    }

    fn parse_list(s: &str) -> Result<Vec<Policy>, UsageError> {
        match s {
            "pytorch" => Ok(vec![Policy::Pytorch]),
            "expandable" => Ok(vec![Policy::Expandable]),
            "paged" => Ok(vec![Policy::Paged]),
            "all" => Ok(vec![Policy::Pytorch, Policy::Expandable, Policy::Paged]),
            other => Err(UsageError(format!(
                "unknown --policy '{other}': expected pytorch, expandable, paged or all"
            ))),
        }
    }

    pub(crate) fn allocator<B: MemoryBackend>(
        self,
        sim: B,
    ) -> anyhow::Result<Box<dyn DeviceAllocator>> {
        Ok(match self {
            Policy::Pytorch => Box::new(CachingAllocator::new(sim)),
            Policy::Expandable => {
                let config = AllocatorConfig::parse("expandable_segments:True")?;
                Box::new(CachingAllocator::with_config(sim, config)?)
            }
            Policy::Paged => Box::new(PagedBestFit::new(sim)?),
        })
    }
}

/// Passes over each trace on one allocator, as PyTorch's C++ replay makes: the first is cold,
/// the fastest of the others gives the warm `ns_per_op`.
pub(crate) const PASSES: usize = 3;

/// Runs [`PASSES`] passes of `trace` on `alloc`: returns the cold pass's report (memory and
/// device calls of a fresh allocator) and the warm passes'.
pub(crate) fn passes(
    trace: &CompiledTrace,
    alloc: &dyn DeviceAllocator,
) -> Result<(ReplayReport, Vec<ReplayReport>), ReplayError> {
    let cold = trace.replay(alloc)?;
    let warm = (1..PASSES)
        .map(|_| trace.replay(alloc))
        .collect::<Result<Vec<_>, _>>()?;
    Ok((cold, warm))
}

/// The warm figure: the fastest warm pass's ns per operation.
pub(crate) fn warm_ns(warm: &[ReplayReport]) -> f64 {
    warm.iter()
        .map(|r| r.ns_per_op)
        .fold(f64::INFINITY, f64::min)
}

/// PyTorch's figures for one of the five real traces of `crates/berth-alloc/tests/data`
/// (PyTorch 2.11's own allocator on the H200 that recorded them).
struct TorchFigures {
    name: &'static str,
    peak_requested: u64,
    /// Peak reserved bytes: default, `expandable_segments`, `cudaMallocAsync`.
    reserved: [u64; 3],
    /// `num_device_alloc` of the live run (default mode).
    segments: u64,
    /// C++ `raw_alloc`/`raw_delete` ns per operation: default, expandable, cudaMallocAsync.
    ns_per_op: [u64; 3],
}

const TORCH: [TorchFigures; 5] = [
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

const TORCH_MODES: [&str; 3] = ["torch default", "torch expandable", "torch cudaMallocAsync"];

/// How a replayed trace relates to PyTorch's reference figures ([`TORCH`]).
#[derive(Clone, Copy)]
enum Reference {
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
    fn of(stem: &str, peak_requested: u64) -> Reference {
        match TORCH.iter().find(|t| t.name == stem) {
            None => Reference::None,
            Some(t) if t.peak_requested == peak_requested => Reference::Matches(t),
            Some(t) => Reference::NameOnly(t),
        }
    }

    /// The note for [`Reference::NameOnly`]: one line, no trailing newline.
    fn mismatch_note(t: &TorchFigures, peak_requested: u64) -> String {
        format!(
            "(the file name matches PyTorch's reference trace {}, but its content does not: peak \
             requested {peak_requested} bytes, the reference's {}; no PyTorch comparison shown)",
            t.name, t.peak_requested
        )
    }
}

/// The trace name: the file name up to its first dot (`gpt2_train.trace.json.gz` → `gpt2_train`).
fn trace_name(path: &Path) -> String {
    let file = path
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default();
    file.split('.').next().unwrap_or_default().to_string()
}

/// The table heading (and JSON `trace`) of each path: its [`trace_name`], or, where two paths
/// share that name, the path as given (and where the same path is given twice, its position
/// among the traces too), so different traces never share a heading.
fn headings(paths: &[PathBuf]) -> Vec<String> {
    let stems: Vec<String> = paths.iter().map(|p| trace_name(p)).collect();
    let labels: Vec<String> = paths
        .iter()
        .zip(&stems)
        .map(|(p, stem)| {
            if stems.iter().filter(|s| *s == stem).count() > 1 {
                p.display().to_string()
            } else {
                stem.clone()
            }
        })
        .collect();
    labels
        .iter()
        .enumerate()
        .map(|(i, label)| {
            if labels.iter().filter(|l| *l == label).count() > 1 {
                format!("{label} (trace {})", i + 1)
            } else {
                label.clone()
            }
        })
        .collect()
}

/// Parses `--capacity`: an integer number of bytes, optionally followed by KiB/MiB/GiB/TiB.
fn parse_capacity(s: &str) -> Result<u64, UsageError> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(split);
    let shift = match unit.trim() {
        "" | "B" => 0,
        "KiB" => 10,
        "MiB" => 20,
        "GiB" => 30,
        "TiB" => 40,
        _ => u32::MAX,
    };
    let value = digits
        .parse::<u64>()
        .ok()
        .filter(|&v| v > 0 && shift != u32::MAX);
    let max = berth_alloc::backend::sim::MAX_SIM_CAPACITY;
    value
        .and_then(|v| v.checked_mul(1u64 << shift.min(63)))
        .filter(|&v| v <= max)
        .ok_or_else(|| UsageError(format!("invalid --capacity '{s}': expected a positive number of bytes up to {max} (64 PiB), such as 80000000000 or 80GiB")))
}

/// Reads a JSON trace or a snapshot pickle (recognized by its leading protocol byte 0x80).
fn load(path: &Path) -> anyhow::Result<Trace> {
    let bytes = std::fs::read(path)
        .map_err(|e| UsageError(format!("cannot read trace {}: {e}", path.display())))?;
    if bytes.first() == Some(&0x80) {
        return berth_alloc::pickle::load_trace_pickle(&bytes).map_err(|e| {
            UsageError(format!(
                "{}: not a valid PyTorch snapshot pickle: {e}",
                path.display()
            ))
            .into()
        });
    }
    read_trace(path).map_err(|e| UsageError(format!("{}: {e}", path.display())).into())
}

/// One replay's result.
struct Row {
    /// Which trace (position among the arguments): rows of one trace share it.
    group: usize,
    /// The trace's heading ([`headings`]).
    trace: String,
    /// PyTorch's figures for this trace, if any.
    reference: Reference,
    policy: Policy,
    /// The cold pass, with `ns_per_op` replaced by the warm figure.
    report: ReplayReport,
    /// The cold pass's ns per operation.
    cold_ns_per_op: f64,
}

/// Checks `--device`: `None` for `sim`, the CUDA device index for `cuda:N`. The flags of the
/// simulated device (`--capacity`, `--real-addrs`) are refused with a CUDA device.
fn cuda_index(args: &ReplayArgs) -> anyhow::Result<Option<usize>> {
    if args.device == "sim" {
        return Ok(None);
    }
    if args.device.starts_with("sim") {
        return Err(UsageError(format!(
            "--device {}: the simulated device takes no index; use --device sim, or cuda:N for a GPU",
            args.device
        ))
        .into());
    }
    let device: berth::Device = args.device.parse().map_err(|e| {
        UsageError(format!(
            "--device {}: {e}; or sim for the simulated device",
            args.device
        ))
    })?;
    let sim_only: Vec<&str> = [
        ("--capacity", args.capacity.is_some()),
        ("--real-addrs", args.real_addrs),
    ]
    .into_iter()
    .filter_map(|(flag, given)| given.then_some(flag))
    .collect();
    if device.is_cuda() && !sim_only.is_empty() {
        let (flags, verb) = if sim_only.len() == 1 {
            (sim_only[0].to_string(), "applies")
        } else {
            (sim_only.join(" and "), "apply")
        };
        return Err(UsageError(format!(
            "{flags} {verb} to the simulated device only (--device sim), not --device {}, which \
             replays in the GPU's own memory at the driver's addresses",
            args.device
        ))
        .into());
    }
    match device.canonical() {
        Ok(d) if d.is_cuda() => Ok(Some(usize::from(d.index().unwrap_or(0)))),
        Ok(d) => Err(UsageError(format!("--device {d}: replay runs on sim or cuda:N")).into()),
        Err(e) => {
            Err(UsageError(format!("--device {}: {e}; use --device sim", args.device)).into())
        }
    }
}

/// Runs `berth replay`.
pub fn run(args: ReplayArgs) -> anyhow::Result<()> {
    let policies = Policy::parse_list(&args.policy)?;
    let cuda = cuda_index(&args)?;
    let capacity = match &args.capacity {
        Some(c) => parse_capacity(c)?,
        None => SimBackend::H200_BYTES,
    };
    let traces: Vec<(String, Trace)> = headings(&args.traces)
        .into_iter()
        .zip(&args.traces)
        .map(|(label, p)| Ok((label, load(p)?)))
        .collect::<anyhow::Result<_>>()?;
    if let Some(index) = cuda {
        return crate::replay_cuda::run(index, &traces, &policies, args.json);
    }
    let total: u64 = traces
        .iter()
        .map(|(_, t)| t.events.len() as u64)
        .sum::<u64>()
        * policies.len() as u64;
    let bar = progress_bar(total, args.json);
    let mut rows = Vec::new();
    for (group, ((name, trace), path)) in traces.iter().zip(&args.traces).enumerate() {
        let compiled = CompiledTrace::new(&trace.events);
        for &policy in &policies {
            bar.set_message(format!("{name} / {}", policy.name()));
            let mut sim = SimBackend::new(capacity);
            if args.real_addrs {
                sim = sim.with_addresses(trace.segment_addresses());
            }
            let alloc = policy.allocator(sim)?;
            let (cold, warm) = passes(&compiled, alloc.as_ref())
                .with_context(|| format!("replaying {name} with policy {}", policy.name()))?;
            bar.inc(trace.events.len() as u64);
            rows.push(Row {
                group,
                trace: name.clone(),
                reference: Reference::of(&trace_name(path), cold.peak_requested),
                policy,
                report: ReplayReport {
                    ns_per_op: warm_ns(&warm),
                    ..cold
                },
                cold_ns_per_op: cold.ns_per_op,
            });
        }
    }
    bar.finish_and_clear();
    if args.json {
        for row in &rows {
            println!("{}", json_line(row));
        }
        // The note goes to stderr, so stdout stays one JSON object per line.
        let mut noted = None;
        for row in &rows {
            if let (Reference::NameOnly(t), false) = (row.reference, noted == Some(row.group)) {
                eprintln!(
                    "berth: note: {}: {}",
                    row.trace,
                    Reference::mismatch_note(t, row.report.peak_requested)
                );
                noted = Some(row.group);
            }
        }
    } else {
        print!("{}", table(&rows));
    }
    Ok(())
}

/// A progress bar on stderr for runs of more than 200k events, hidden for `--json` and when
/// stderr is not a terminal.
fn progress_bar(total: u64, json: bool) -> indicatif::ProgressBar {
    if json || total < 200_000 || !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(total);
    if let Ok(style) = indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} events  {msg}")
    {
        bar.set_style(style);
    }
    bar
}

fn json_line(row: &Row) -> String {
    let r = &row.report;
    let mut obj = serde_json::json!({
        "trace": row.trace,
        "policy": row.policy.name(),
        "ops": r.ops,
        "peak_requested": r.peak_requested,
        "peak_reserved": r.peak_reserved,
        "ratio": (r.ratio() * 1e6).round() / 1e6,
        "device_allocs": r.device_allocs,
        "device_calls": r.device_calls,
        "cold_ns_per_op": (row.cold_ns_per_op * 10.0).round() / 10.0,
        "ns_per_op": (r.ns_per_op * 10.0).round() / 10.0,
    });
    if let Reference::Matches(t) = row.reference {
        obj["torch_peak_reserved"] = serde_json::json!({
            "default": t.reserved[0], "expandable": t.reserved[1], "cuda_malloc_async": t.reserved[2],
        });
        obj["torch_segments"] = serde_json::json!(t.segments);
    }
    obj.to_string()
}

/// The human table: one block per trace, one row per policy, PyTorch's rows beneath.
fn table(rows: &[Row]) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let header = format!(
        "{:<22} {:>10} {:>16} {:>16} {:>8} {:>9} {:>12} {:>8}",
        "policy",
        "ops",
        "peak requested",
        "peak reserved",
        "ratio",
        "segments",
        "device calls",
        "ns/op"
    );
    let mut last = None;
    for row in rows {
        if last != Some(row.group) {
            if last.is_some() {
                out.push('\n');
            }
            let _ = writeln!(out, "{}\n{header}", row.trace);
            last = Some(row.group);
        }
        let r = &row.report;
        let _ = writeln!(
            out,
            "{:<22} {:>10} {:>16} {:>16} {:>7.4}x {:>9} {:>12} {:>8.0}",
            row.policy.name(),
            r.ops,
            r.peak_requested,
            r.peak_reserved,
            r.ratio(),
            r.device_allocs,
            r.device_calls,
            r.ns_per_op
        );
        let is_last_of_trace = rows
            .iter()
            .rposition(|x| x.group == row.group)
            .is_some_and(|i| std::ptr::eq(&rows[i], row));
        if !is_last_of_trace {
            continue;
        }
        if let Reference::NameOnly(t) = row.reference {
            let _ = writeln!(out, "{}", Reference::mismatch_note(t, r.peak_requested));
        }
        if let Reference::Matches(t) = row.reference {
            for (i, mode) in TORCH_MODES.iter().enumerate() {
                let segments = if i == 0 {
                    t.segments.to_string()
                } else {
                    "-".to_string()
                };
                let _ = writeln!(
                    out,
                    "{:<22} {:>10} {:>16} {:>16} {:>7.4}x {:>9} {:>12} {:>8}",
                    mode,
                    "-",
                    t.peak_requested,
                    t.reserved[i],
                    t.reserved[i] as f64 / t.peak_requested as f64,
                    segments,
                    "-",
                    t.ns_per_op[i]
                );
            }
            let _ = writeln!(
                out,
                "(PyTorch's torch-default row is its live run; its expandable and cudaMallocAsync rows \
                 come from a replay with every stream collapsed to one, so on a multi-stream trace \
                 compare them with `berth replay --device cuda:N`, which also replays on one stream)"
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacity_accepts_bytes_and_iec_units() {
        assert_eq!(parse_capacity("1024").unwrap(), 1024);
        assert_eq!(parse_capacity("80GiB").unwrap(), 80 << 30);
        assert_eq!(parse_capacity("3 MiB").unwrap(), 3 << 20);
        assert!(parse_capacity("80GB").unwrap_err().0.contains("80GiB"));
        assert!(parse_capacity("0").is_err());
        assert!(parse_capacity("lots").is_err());
        // Found by fuzzing: huge capacities overflowed the simulator's address sums.
        assert!(parse_capacity("131072TiB")
            .unwrap_err()
            .0
            .contains("64 PiB"));
        assert_eq!(parse_capacity("65536TiB").unwrap(), 1 << 56);
    }

    #[test]
    fn trace_name_is_the_stem_before_the_first_dot() {
        assert_eq!(
            trace_name(Path::new("/x/gpt2_train.trace.json.gz")),
            "gpt2_train"
        );
        assert_eq!(
            trace_name(Path::new("two_stream_pipeline.snapshot.pickle")),
            "two_stream_pipeline"
        );
    }

    #[test]
    fn headings_are_stems_unless_stems_collide() {
        let paths = |v: &[&str]| v.iter().map(PathBuf::from).collect::<Vec<_>>();
        assert_eq!(
            headings(&paths(&[
                "a/gpt2_train.trace.json.gz",
                "b/resnet50_train.trace.json.gz"
            ])),
            ["gpt2_train", "resnet50_train"]
        );
        assert_eq!(
            headings(&paths(&[
                "a/gpt2_train.trace.json.gz",
                "b/gpt2_train.trace.json.gz",
                "c/x.json"
            ])),
            [
                "a/gpt2_train.trace.json.gz",
                "b/gpt2_train.trace.json.gz",
                "x"
            ]
        );
        assert_eq!(
            headings(&paths(&["t.json", "t.json"])),
            ["t.json (trace 1)", "t.json (trace 2)"]
        );
    }

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
    fn unknown_policy_names_the_choices() {
        let err = Policy::parse_list("fast").unwrap_err();
        assert!(err.0.contains("pytorch, expandable, paged or all"), "{err}");
        assert_eq!(Policy::parse_list("all").unwrap().len(), 3);
    }
}
