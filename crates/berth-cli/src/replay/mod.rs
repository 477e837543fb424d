//! `berth replay`: PyTorch allocator traces through berth's allocators.
//!
//! Each trace (`*.trace.json.gz`, plain JSON, or a `_dump_snapshot` pickle, whose
//! `device_traces[0]` is replayed) goes through each chosen policy on a fresh [`SimBackend`],
//! following `berth_alloc::replay`'s rules (streams honoured: a block is freed at its
//! `free_completed` row; a free of an address that is not live is refused unless
//! `--skip-unknown-frees`). JSON traces are compiled as they are read (`Note [Streaming trace
//! reader]` in `berth_alloc::trace`): no event is kept beyond its compiled operation, and a
//! request larger than the whole simulated device fails the read at that event. Timing is
//! PyTorch's C++ replay's (`Note [Compiled replay]` in `berth_alloc::replay`): [`passes::PASSES`] passes
//! on one allocator, memory figures from the first (cold) pass, `ns_per_op` the fastest of the
//! others (warm). PyTorch's own figures are printed beside berth's wherever the trace carries
//! them (the `stats` a recording keeps: PyTorch's `memory_stats()` at its end, [`Recorded`]), and PyTorch's replay figures
//! for the five published traces when the trace is one of them: its file name and its peak
//! requested bytes both match (see [`Reference`]). Bytes print as PyTorch's `format_size` does
//! (`5.48 GiB`); `--json` keeps exact byte counts.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use berth_alloc::backend::sim::SimBackend;
use berth_alloc::replay::ReplayReport;
use berth_alloc::stats::format_size;
use berth_alloc::{AllocatorConfig, Policy};

use crate::replay_torch::{Recorded, Reference, TORCH_MODES};
use crate::UsageError;

pub(crate) mod load;
pub(crate) mod passes;

pub(crate) use load::LoadedTrace;
use load::{load, LoadOptions};
use passes::{passes, replay_allocator, warm_ns};

/// Arguments of `berth replay`.
#[derive(clap::Args, Debug)]
pub struct ReplayArgs {
    /// Trace files (`*.trace.json.gz`, JSON, or PyTorch snapshot pickles).
    #[arg(required = true)]
    pub traces: Vec<PathBuf>,
    /// Allocator policy: `pytorch` (PyTorch's default caching allocator, tuned by the settings of
    /// `BERTH_ALLOC_CONF` such as `max_split_size_mb`, as `expandable` is), `expandable`
    /// (`expandable_segments:True`), `paged` (berth's own `PagedBestFit`) or `all`.
    #[arg(long, default_value = "paged")]
    pub policy: String,
    /// Simulated device memory in bytes (suffixes KiB, MiB, GiB, TiB, PiB allowed); default: an
    /// H200's 150109880320. Only with `--device sim`.
    #[arg(long, value_name = "BYTES", allow_negative_numbers = true)]
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
    /// Skip a `free_completed` of an address that is not live (never allocated, or already
    /// freed), as PyTorch's replay script does, instead of refusing the trace: for a trace
    /// whose start was cut off (a wrapped `_record_memory_history` ring buffer).
    #[arg(long)]
    pub skip_unknown_frees: bool,
    /// Which device's history to replay from a snapshot pickle (its `device_traces[N]`).
    /// Default: the only device with a history; a snapshot with several needs this.
    #[arg(long, value_name = "N", allow_negative_numbers = true,
          value_parser = crate::whole_usize("--snapshot-device", "the device index", 0, 0))]
    pub snapshot_device: Option<usize>,
}

/// The policies `--policy` names: one of berth's three ([`Policy::parse`]), or `all`.
///
/// # Errors
/// A [`UsageError`] naming the valid values.
fn parse_policies(s: &str) -> Result<Vec<Policy>, UsageError> {
    if s == "all" {
        return Ok(Policy::ALL.to_vec());
    }
    Policy::parse(s).map(|p| vec![p]).map_err(|_| {
        UsageError(format!(
            "unknown --policy '{s}': expected pytorch, expandable, paged or all"
        ))
    })
}

/// `BERTH_ALLOC_CONF` for a replay: its PyTorch-policy settings apply to the `pytorch` and
/// `expandable` rows; a `backend` or `expandable_segments` in it is overridden by `--policy`,
/// which stderr says.
///
/// # Errors
/// A [`UsageError`] for a malformed `BERTH_ALLOC_CONF`.
fn replay_conf() -> Result<AllocatorConfig, UsageError> {
    let conf = AllocatorConfig::from_env().map_err(|e| UsageError(e.to_string()))?;
    if conf.backend.is_some() || conf.expandable_segments {
        eprintln!(
            "berth: note: BERTH_ALLOC_CONF={}: replay runs the policies --policy names; its \
             `backend` and `expandable_segments` are not used, its other settings tune the \
             pytorch and expandable rows",
            conf.conf_string
        );
    }
    Ok(conf)
}

/// The configuration `trace` replays with: the user's (`BERTH_ALLOC_CONF` or PyTorch's
/// variables) when one is set; else the `alloc_conf` the trace was recorded with, if any,
/// said on standard error (newcomer defect 18: it was unused); else the default.
///
/// # Errors
/// A [`UsageError`] when the recorded `alloc_conf` does not parse, saying how to override it.
fn trace_conf(
    name: &str,
    trace: &LoadedTrace,
    user: &AllocatorConfig,
) -> Result<AllocatorConfig, UsageError> {
    let recorded = match &trace.alloc_conf {
        Some(c) if AllocatorConfig::env_variable().is_none() => c,
        _ => return Ok(user.clone()),
    };
    let (conf, skipped) = AllocatorConfig::parse_pytorch(recorded).map_err(|e| {
        UsageError(format!(
            "{name}: the trace's recorded alloc_conf '{recorded}' does not parse ({e}); set \
             BERTH_ALLOC_CONF to replay it with other settings"
        ))
    })?;
    let skipped = if skipped.is_empty() {
        String::new()
    } else {
        format!(
            " ({} not implemented by berth, skipped)",
            skipped.join(", ")
        )
    };
    eprintln!(
        "berth: note: {name}: replaying with the trace's recorded alloc_conf '{recorded}'{skipped}, \
         as no BERTH_ALLOC_CONF is set; set it to override"
    );
    Ok(conf)
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

/// Parses `--capacity`: an integer number of bytes, optionally followed by KiB/MiB/GiB/TiB/PiB.
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
        "PiB" => 50,
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

/// A note for standard error when a `--capacity` is too large for expandable segments'
/// address reservations under the traces' streams: expandable segments reserve 9/8 of the
/// capacity for each stream and pool (two pools), so with many streams the simulator's address
/// space runs out. The replay still runs: that policy gets its own failure row (the backend's
/// `reserve` error) and the others their figures (newcomer defect 10 lost the whole table, and
/// then refused every policy up front). `paged` is not concerned: it reserves less for a stream
/// when the address space is short (`berth_alloc::paged`).
fn address_space_note(
    capacity: u64,
    policies: &[Policy],
    traces: &[(String, LoadedTrace)],
) -> Option<String> {
    if !policies.contains(&Policy::Expandable) {
        return None;
    }
    let (name, trace) = traces.iter().max_by_key(|(_, t)| t.compiled.streams())?;
    let max = max_capacity_for_streams(trace.compiled.streams());
    (capacity > max).then(|| {
        format!(
            "--capacity {capacity} ({}): {name} allocates on {} streams, and expandable \
             segments reserve 9/8 of the capacity per stream and pool; the simulator's {} bytes \
             of address space hold them for a capacity of at most {max} bytes ({}), so the \
             expandable row may fail; pass --capacity {max} or less for it",
            format_size(capacity),
            trace.compiled.streams(),
            berth_alloc::backend::sim::ADDRESS_SPACE_BYTES,
            format_size(max),
        )
    })
}

/// The largest simulated capacity, in bytes (whole MiB), whose per-stream reservations fit in
/// the simulator's address space for `streams` streams under expandable segments: each stream
/// takes at most 9/4 of the capacity (two pools of 9/8) plus 64 MiB of rounding and gaps.
fn max_capacity_for_streams(streams: usize) -> u64 {
    let space = berth_alloc::backend::sim::ADDRESS_SPACE_BYTES;
    let per_stream = space / (streams.max(1) as u64);
    let cap = per_stream.saturating_sub(64 << 20) / 9 * 4;
    (cap >> 20 << 20).min(berth_alloc::backend::sim::MAX_SIM_CAPACITY)
}

/// One replay's result.
struct Row {
    /// Which trace (position among the arguments): rows of one trace share it.
    group: usize,
    /// The trace's heading ([`headings`]).
    trace: String,
    /// PyTorch's figures for this trace, if any.
    reference: Reference,
    /// PyTorch's figures carried by the trace itself, if any.
    recorded: Option<Recorded>,
    policy: Policy,
    /// The cold pass, with `ns_per_op` replaced by the warm figure.
    report: ReplayReport,
    /// The cold pass's ns per operation.
    cold_ns_per_op: f64,
    /// The replay error when this policy ran out of memory or failed otherwise (then `report`
    /// holds only the trace's peak requested bytes).
    out_of_memory: Option<OutOfMemory>,
}

/// A policy's replay that ran out of memory: the table's line and the whole error (`--json`).
struct OutOfMemory {
    short: String,
    full: String,
    /// Whether the failure was an out-of-memory (else another allocator error).
    oom: bool,
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
    let device: berth::Device = args.device.parse().map_err(|_| {
        UsageError(format!(
            "--device {}: replay runs on sim (the simulated device, the default) or cuda:N (a \
             GPU, e.g. cuda:0)",
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
    let policies = parse_policies(&args.policy)?;
    let cuda = cuda_index(&args)?;
    let capacity = match &args.capacity {
        Some(c) => parse_capacity(c)?,
        None => SimBackend::H200_BYTES,
    };
    let options = LoadOptions {
        capacity: cuda.is_none().then_some(capacity),
        keep_segments: args.real_addrs,
        skip_unknown_frees: args.skip_unknown_frees,
        snapshot_device: args.snapshot_device,
    };
    let traces: Vec<(String, LoadedTrace)> = headings(&args.traces)
        .into_iter()
        .zip(&args.traces)
        .map(|(label, p)| Ok((label, load(p, &options)?)))
        .collect::<anyhow::Result<_>>()?;
    if cuda.is_none() {
        if let Some(note) = address_space_note(capacity, &policies, &traces) {
            eprintln!("berth: note: {note}");
        }
    }
    let conf = replay_conf()?;
    if let Some(index) = cuda {
        return crate::replay_cuda::run(index, &traces, &policies, &conf, args.json);
    }
    let trace_confs: Vec<AllocatorConfig> = traces
        .iter()
        .map(|(name, t)| trace_conf(name, t, &conf))
        .collect::<Result<_, _>>()?;
    let total: u64 =
        traces.iter().map(|(_, t)| t.events as u64).sum::<u64>() * policies.len() as u64;
    let bar = progress_bar(total, args.json);
    let mut rows = Vec::new();
    for (group, ((name, trace), path)) in traces.iter().zip(&args.traces).enumerate() {
        for &policy in &policies {
            bar.set_message(format!("{name} / {}", policy.name()));
            let mut sim = SimBackend::new(capacity);
            if args.real_addrs {
                sim = sim.with_addresses(trace.segment_addresses.clone());
            }
            let alloc = replay_allocator(policy, sim, &trace_confs[group])?;
            // A policy that runs out of memory gets a row saying so, and the others still run
            // ("which policies fit in --capacity?"); any other error stops the replay.
            let (report, cold_ns_per_op, out_of_memory) =
                match passes(&trace.compiled, alloc.as_ref()) {
                    Ok((cold, warm)) => (
                        ReplayReport {
                            ns_per_op: warm_ns(&warm),
                            ..cold
                        },
                        cold.ns_per_op,
                        None,
                    ),
                    Err(e) if e.source.is_out_of_memory() => (
                        ReplayReport {
                            peak_requested: trace.compiled.peak_requested(),
                            ..ReplayReport::default()
                        },
                        0.0,
                        Some(OutOfMemory {
                            short: format!(
                                "out of memory at trace event #{} ({} of {})",
                                e.index,
                                e.action,
                                format_size(e.size)
                            ),
                            full: e.to_string(),
                            oom: true,
                        }),
                    ),
                    // Any other error gets its row too: the other policies' rows are kept, and
                    // the run fails at the end (newcomer defect 10 lost the whole table).
                    Err(e) => (
                        ReplayReport {
                            peak_requested: trace.compiled.peak_requested(),
                            ..ReplayReport::default()
                        },
                        0.0,
                        Some(OutOfMemory {
                            short: format!(
                                "failed at trace event #{} ({} of {}): {}",
                                e.index,
                                e.action,
                                format_size(e.size),
                                e.source
                            ),
                            full: e.to_string(),
                            oom: false,
                        }),
                    ),
                };
            bar.inc(trace.events as u64);
            rows.push(Row {
                group,
                trace: name.clone(),
                reference: Reference::of(&trace_name(path), report.peak_requested),
                recorded: trace.recorded.clone(),
                policy,
                report,
                cold_ns_per_op,
                out_of_memory,
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
        print!("{}", table(&rows, args.real_addrs));
    }
    let oom: Vec<(&Row, &OutOfMemory)> = rows
        .iter()
        .filter_map(|r| r.out_of_memory.as_ref().map(|e| (r, e)))
        .collect();
    match oom[..] {
        [] => {}
        // One failure: its whole message (what to try next is in it).
        [(row, e)] => anyhow::bail!(
            "replaying {} with policy {}: {}",
            row.trace,
            row.policy.name(),
            e.full
        ),
        _ if oom.iter().any(|(_, e)| !e.oom) => anyhow::bail!(
            "replay failed: {} (the rows above say where and why)",
            oom.iter()
                .map(|(r, _)| format!("{} on {}", r.policy.name(), r.trace))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        _ => anyhow::bail!(
            "out of memory: {} (the rows above say where; pass a larger --capacity: the default is \
             an H200's 139.8 GiB, the most 64 PiB)",
            oom.iter()
                .map(|(r, _)| format!("{} on {}", r.policy.name(), r.trace))
                .collect::<Vec<_>>()
                .join(", ")
        ),
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
    if let Some(e) = &row.out_of_memory {
        return serde_json::json!({
            "trace": row.trace,
            "policy": row.policy.name(),
            "out_of_memory": e.full,
        })
        .to_string();
    }
    let r = &row.report;
    let mut obj = serde_json::json!({
        "trace": row.trace,
        "policy": row.policy.name(),
        "ops": r.ops,
        "peak_requested": r.peak_requested,
        "peak_reserved": r.peak_reserved,
        "ratio": r.ratio().map(|x| (x * 1e6).round() / 1e6),
        "device_allocs": r.device_allocs,
        "device_calls": r.device_calls,
        "cold_ns_per_op": (r.ops > 0).then(|| (row.cold_ns_per_op * 10.0).round() / 10.0),
        "ns_per_op": (r.ops > 0).then(|| (r.ns_per_op * 10.0).round() / 10.0),
    });
    if let Some(rec) = &row.recorded {
        obj["torch_recorded"] = serde_json::json!({
            "peak_requested": rec.peak_requested,
            "peak_reserved": rec.peak_reserved,
            "segments": rec.segments,
            "alloc_conf": rec.alloc_conf,
        });
    }
    if let Reference::Matches(t) = row.reference {
        obj["torch_peak_reserved"] = serde_json::json!({
            "default": t.reserved[0], "expandable": t.reserved[1], "cuda_malloc_async": t.reserved[2],
        });
        obj["torch_segments"] = serde_json::json!(t.segments);
    }
    obj.to_string()
}

/// A table cell for a ratio: `1.2345x`, or `n/a` for none (0/0).
fn ratio_cell(ratio: Option<f64>) -> String {
    ratio.map_or_else(|| "n/a".to_string(), |x| format!("{x:.4}x"))
}

/// Explains `n/a` in the ratio and ns/op columns, once.
const NA_NOTE: &str = "(n/a: a trace that requests no bytes has no peak to divide by, and one with no operations has nothing to time)";

/// Explains the PyTorch rows of the published traces, once.
const REFERENCE_NOTE: &str =
    "(PyTorch's torch-default row is its live run; its expandable and cudaMallocAsync rows \
     come from a replay with every stream collapsed to one, so on a multi-stream trace \
     compare them with `berth replay --device cuda:N`, which also replays on one stream)";

/// Explains the `torch (recorded)` row, once.
const RECORDED_NOTE: &str = "(torch (recorded): PyTorch's own figures from the trace's `stats`, memory_stats() at \
     the end of the recorded run: requested_bytes.all.peak, reserved_bytes.all.peak, num_device_alloc)";

/// Explains a `pytorch` row that differs from the `torch (recorded)` row of a trace recorded in
/// PyTorch's default mode, once, when the replay did not use the recorded addresses.
const TIES_NOTE: &str = "(pytorch differs from torch (recorded) above: PyTorch breaks ties \
     between equal-size free blocks by address, and this replay handed out increasing addresses; \
     pass --real-addrs to use the segment addresses the trace recorded)";

/// The human table: one block per trace, one row per policy, PyTorch's rows beneath; the notes
/// that explain a kind of row come once, at the end. `real_addrs`: the replay used the
/// recorded segment addresses (`--real-addrs`).
fn table(rows: &[Row], real_addrs: bool) -> String {
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
    let (mut any_na, mut any_reference, mut any_recorded) = (false, false, false);
    let mut any_ties = false;
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
        if let Some(e) = &row.out_of_memory {
            let _ = writeln!(out, "{:<22} {}", row.policy.name(), e.short);
        } else {
            let ns = if r.ops == 0 {
                "n/a".to_string()
            } else {
                format!("{:.0}", r.ns_per_op)
            };
            any_na |= r.ratio().is_none() || r.ops == 0;
            let _ = writeln!(
                out,
                "{:<22} {:>10} {:>16} {:>16} {:>8} {:>9} {:>12} {:>8}",
                row.policy.name(),
                r.ops,
                format_size(r.peak_requested),
                format_size(r.peak_reserved),
                ratio_cell(r.ratio()),
                r.device_allocs,
                r.device_calls,
                ns
            );
        }
        let is_last_of_trace = rows
            .iter()
            .rposition(|x| x.group == row.group)
            .is_some_and(|i| std::ptr::eq(&rows[i], row));
        if !is_last_of_trace {
            continue;
        }
        if let Reference::Matches(t) = row.reference {
            any_reference = true;
            for (i, mode) in TORCH_MODES.iter().enumerate() {
                let segments = if i == 0 {
                    t.segments.to_string()
                } else {
                    "-".to_string()
                };
                let _ = writeln!(
                    out,
                    "{:<22} {:>10} {:>16} {:>16} {:>8} {:>9} {:>12} {:>8}",
                    mode,
                    "-",
                    format_size(t.peak_requested),
                    format_size(t.reserved[i]),
                    ratio_cell(Some(t.reserved[i] as f64 / t.peak_requested as f64)),
                    segments,
                    "-",
                    t.ns_per_op[i]
                );
            }
        } else if let Some(rec) = &row.recorded {
            // The published traces' live run is their torch-default row already.
            any_recorded = true;
            let _ = writeln!(
                out,
                "{:<22} {:>10} {:>16} {:>16} {:>8} {:>9} {:>12} {:>8}",
                "torch (recorded)",
                "-",
                rec.peak_requested
                    .map_or_else(|| "-".to_string(), format_size),
                format_size(rec.peak_reserved),
                rec.ratio()
                    .map_or_else(|| "-".to_string(), |x| format!("{x:.4}x")),
                rec.segments
                    .map_or_else(|| "-".to_string(), |s| s.to_string()),
                "-",
                "-"
            );
            if !rec.alloc_conf.is_empty() {
                let _ = writeln!(
                    out,
                    "(recorded with PYTORCH_CUDA_ALLOC_CONF={})",
                    rec.alloc_conf
                );
            }
            let pytorch_differs = rows.iter().any(|x| {
                x.group == row.group
                    && x.policy == Policy::Pytorch
                    && x.out_of_memory.is_none()
                    && (x.report.peak_reserved != rec.peak_reserved
                        || rec.segments.is_some_and(|s| s != x.report.device_allocs))
            });
            any_ties |= pytorch_differs && !real_addrs && rec.alloc_conf.is_empty();
            if let Some(recorded) = rec.peak_requested.filter(|&p| p != r.peak_requested) {
                let _ = writeln!(
                    out,
                    "(the recorded run peaked at {} requested, the replay at {}: the trace does not cover the whole run)",
                    format_size(recorded),
                    format_size(r.peak_requested)
                );
            }
        }
        if let Reference::NameOnly(t) = row.reference {
            let _ = writeln!(out, "{}", Reference::mismatch_note(t, r.peak_requested));
        }
    }
    let notes = [
        (any_na, NA_NOTE),
        (any_reference, REFERENCE_NOTE),
        (any_recorded, RECORDED_NOTE),
        (any_ties, TIES_NOTE),
    ];
    if notes.iter().any(|(shown, _)| *shown) {
        out.push('\n');
    }
    for (shown, note) in notes {
        if shown {
            let _ = writeln!(out, "{note}");
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
        // The limit as its own message spells it is accepted.
        assert_eq!(parse_capacity("64PiB").unwrap(), 1 << 56);
        assert!(parse_capacity("65PiB").is_err());
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
    fn unknown_policy_names_the_choices() {
        let err = parse_policies("fast").unwrap_err();
        assert!(err.0.contains("pytorch, expandable, paged or all"), "{err}");
        assert_eq!(parse_policies("all").unwrap().len(), 3);
    }
}
