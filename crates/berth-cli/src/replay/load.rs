//! Loading one trace for `berth replay`: a JSON trace streamed row by row, or a snapshot
//! pickle (the device with a history, or `--snapshot-device`), compiled as it is read, with
//! the checks that refuse a damaged trace at the row where it breaks.

use std::io::Read;
use std::path::Path;

use berth_alloc::replay::{BadRow, CompiledTrace, TraceCompiler};
use berth_alloc::stats::format_size;
use berth_alloc::trace::{parse_trace_into, read_trace_into, TraceError, TraceEvent};
use berth_alloc::TraceAction;

use crate::replay_torch::Recorded;
use crate::UsageError;

/// A trace compiled as it was read: what a replay needs of it.
pub(crate) struct LoadedTrace {
    /// The `alloc` and `free_completed` rows as operations.
    pub(crate) compiled: CompiledTrace,
    /// Rows in the trace.
    pub(crate) events: usize,
    /// The addresses of the `segment_alloc` rows, in order (kept only for `--real-addrs`).
    pub(crate) segment_addresses: Vec<u64>,
    /// PyTorch's own figures, if the trace carries them.
    pub(crate) recorded: Option<Recorded>,
    /// The allocator configuration the trace was recorded with (`alloc_conf`), if it says.
    pub(crate) alloc_conf: Option<String>,
}

/// How [`load`] checks and keeps the events.
pub(crate) struct LoadOptions {
    /// Refuse an `alloc` of more bytes than this (the simulated device's capacity): no policy
    /// could grant it, so the read stops there instead of after the whole trace.
    pub(crate) capacity: Option<u64>,
    /// Keep the `segment_alloc` addresses (`--real-addrs`).
    pub(crate) keep_segments: bool,
    /// `--skip-unknown-frees`.
    pub(crate) skip_unknown_frees: bool,
    /// `--snapshot-device`.
    pub(crate) snapshot_device: Option<usize>,
}

/// Reads and compiles a JSON trace (streaming) or a snapshot pickle (recognized by its first
/// byte, [`berth_alloc::pickle::starts_like_pickle`]: any protocol, as memviz reads them; or
/// named `.pickle` / `.pkl`).
pub(crate) fn load(path: &Path, options: &LoadOptions) -> anyhow::Result<LoadedTrace> {
    let cannot_read =
        |e: std::io::Error| UsageError(format!("cannot read trace {}: {e}", path.display()));
    let read_whole = || {
        berth_alloc::input::read_capped(path, berth_alloc::input::max_input_bytes())
            .map_err(|e| UsageError(format!("trace {e}")))
    };
    // A pipe or other stream (`/dev/stdin`, `<(zcat …)`) can be read only once: its first
    // byte decides, then a pickle is read whole up to the input cap and JSON is streamed on
    // (Note [Bounded reads]: `/dev/zero` was read until killed; now its first byte is no
    // pickle and no JSON). A regular file is sniffed by its first byte, then streamed from
    // the start.
    let mut piped = match std::fs::metadata(path) {
        Ok(m) if !m.is_file() && !m.is_dir() => {
            Some(std::fs::File::open(path).map_err(cannot_read)?)
        }
        _ => None,
    };
    let mut first = [0u8; 1];
    let n = match &mut piped {
        Some(stream) => stream.read(&mut first).map_err(cannot_read)?,
        None => std::fs::File::open(path)
            .and_then(|mut f| f.read(&mut first))
            .map_err(cannot_read)?,
    };
    let named_pickle = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("pickle") || e.eq_ignore_ascii_case("pkl"));
    let mut compiler = TraceCompiler::new().skip_unknown_frees(options.skip_unknown_frees);
    let mut segment_addresses = Vec::new();
    let unknown_free = std::cell::Cell::new(false);
    let mut sink = |index: usize, e: TraceEvent| -> Result<(), String> {
        if let (TraceAction::Alloc, Some(capacity)) = (e.action, options.capacity) {
            if e.size > capacity {
                return Err(format!(
                    "alloc of {} ({} bytes) is more than the whole simulated device ({}), so no \
                     policy can replay it; pass a larger --capacity (at most 64 PiB), or check \
                     the trace",
                    format_size(e.size),
                    e.size,
                    format_size(capacity)
                ));
            }
        }
        if options.keep_segments && e.action == TraceAction::SegmentAlloc {
            segment_addresses.push(e.addr);
        }
        compiler.push(index, &e).map_err(|err| {
            unknown_free.set(matches!(err, BadRow::UnknownFree(_)));
            err.to_string()
        })
    };
    let is_pickle = n == 1 && berth_alloc::pickle::starts_like_pickle(first[0]);
    let (events, stats, alloc_conf) = if is_pickle || named_pickle {
        if !is_pickle {
            let found = if n == 0 {
                "the file is empty".to_string()
            } else {
                format!("it starts with byte {:#04x}", first[0])
            };
            return Err(UsageError(format!(
                "{}: not a valid PyTorch snapshot pickle: {found}, not the pickle protocol byte \
                 0x80 nor a protocol-0/1 pickle's first opcode; expected a snapshot written by \
                 torch.cuda.memory._dump_snapshot, or a JSON trace (.json or .json.gz) such as scripts/traces/record_traces.py records",
                path.display()
            ))
            .into());
        }
        let bytes = match piped.take() {
            Some(stream) => berth_alloc::input::read_rest_capped(
                stream,
                path,
                first[..n].to_vec(),
                berth_alloc::input::max_input_bytes(),
            )
            .map_err(|e| UsageError(format!("trace {e}")))?,
            None => read_whole()?,
        };
        let snapshot = berth_alloc::pickle::load_snapshot(&bytes).map_err(|e| {
            UsageError(format!(
                "{}: not a valid PyTorch snapshot pickle: {e}",
                path.display()
            ))
        })?;
        drop(bytes);
        let device = snapshot_device(path, &snapshot, options.snapshot_device)?;
        let trace = berth_alloc::pickle::snapshot_trace(&snapshot, device);
        drop(snapshot);
        for (index, e) in trace.events.iter().enumerate() {
            sink(index, *e).map_err(|message| {
                load_error(
                    path,
                    TraceError::Rejected { index, message },
                    unknown_free.get(),
                )
            })?;
        }
        (trace.events.len(), trace.stats, trace.alloc_conf)
    } else {
        if let Some(device) = options.snapshot_device {
            // Newcomer defect 18: the flag was silently ignored for JSON traces.
            return Err(UsageError(format!(
                "--snapshot-device {device}: {} is a JSON trace, which holds one device's \
                 events; --snapshot-device picks a device of a snapshot pickle. Drop it, or \
                 pass the snapshot pickle",
                path.display()
            ))
            .into());
        }
        let info = match piped.take() {
            Some(stream) => parse_trace_into((&first[..n]).chain(stream), &mut sink),
            None => read_trace_into(path, &mut sink),
        }
        .map_err(|e| load_error(path, e, unknown_free.get()))?;
        (info.events, info.stats, info.alloc_conf)
    };
    Ok(LoadedTrace {
        compiled: compiler.finish(),
        events,
        segment_addresses,
        recorded: Recorded::from_stats(&stats, alloc_conf.as_deref()),
        alloc_conf: alloc_conf.filter(|c| !c.trim().is_empty()),
    })
}

/// The device whose history a snapshot replay uses: `chosen` (`--snapshot-device`) if it has
/// one, else the only device with a history (device 0 when none has one, so an empty snapshot
/// replays as an empty trace). A device other than 0 is named on stderr.
///
/// # Errors
/// A [`UsageError`] when `chosen` has no history, or when several devices have one and none
/// was chosen.
fn snapshot_device(
    path: &Path,
    snapshot: &berth_alloc::MemorySnapshot,
    chosen: Option<usize>,
) -> Result<usize, UsageError> {
    let with_history: Vec<usize> = snapshot
        .device_traces
        .iter()
        .enumerate()
        .filter(|(_, t)| !t.is_empty())
        .map(|(i, _)| i)
        .collect();
    let listed = || {
        with_history
            .iter()
            .map(usize::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    };
    let device = match (chosen, &with_history[..]) {
        (Some(d), _) if with_history.contains(&d) => d,
        (Some(d), []) => {
            return Err(UsageError(format!(
                "{}: --snapshot-device {d}: the snapshot holds no allocator history on any \
                 device (record one with torch.cuda.memory._record_memory_history())",
                path.display()
            )))
        }
        (Some(d), _) => {
            return Err(UsageError(format!(
                "{}: --snapshot-device {d}: that device has no allocator history; the \
                 snapshot has one for device {}",
                path.display(),
                listed()
            )))
        }
        (None, []) => 0,
        (None, [d]) => *d,
        (None, _) => {
            return Err(UsageError(format!(
                "{}: the snapshot holds the allocator histories of devices {}; pass \
                 --snapshot-device N to replay one",
                path.display(),
                listed()
            )))
        }
    };
    if device != 0 {
        eprintln!(
            "berth: {}: replaying device {device}'s history",
            path.display()
        );
    }
    Ok(device)
}

/// The one-line error of a trace that could not be loaded; a free of an address that is not
/// live gets the flag that skips such frees.
fn load_error(path: &Path, e: TraceError, unknown_free: bool) -> anyhow::Error {
    let hint = if unknown_free {
        "; or pass --skip-unknown-frees to skip such frees, as PyTorch's replay script does"
    } else {
        ""
    };
    UsageError(format!("{}: {e}{hint}", path.display())).into()
}
