//! `berth memviz`: one self-contained HTML page showing a memory snapshot, as PyTorch's
//! `memory_viz` does.
//!
//! The input is a `torch.cuda.memory._dump_snapshot` pickle, PyTorch's own or the one
//! `berth train --memory-snapshot` writes (both read by [`berth_alloc::pickle::load_snapshot`]).
//! The page has two views:
//!
//! - the **active-memory timeline** ([`timeline`]): allocated bytes over the trace, stacked
//!   per block, with the reserved bytes as a line and `oom` entries as markers; hover for a
//!   block's address, size, stream and times;
//! - the **segment view** ([`segments`]): every segment as a row of its blocks, allocated,
//!   pending free or free; hover for address, size and state.
//!
//! The data are computed here and embedded as JSON in a `<script type="application/json">`
//! element; the page's script and style are inline (`memviz.js`, `memviz.css`), and nothing
//! in the file refers to the network. What a screen could not show is merged before it is
//! written (Note [Timeline downsampling], Note [Segment downsampling]), so the page stays
//! responsive and its size bounded for snapshots of any length.

pub mod segments;
pub mod timeline;

use std::path::{Path, PathBuf};

use berth_alloc::pickle::{load_snapshot_with_history, starts_like_pickle, PickleError};
use berth_alloc::snapshot::MemorySnapshot;
use serde::Serialize;

/// Arguments of `berth memviz`.
#[derive(clap::Args, Debug, Clone)]
pub struct MemvizArgs {
    /// A memory snapshot: a `torch.cuda.memory._dump_snapshot` pickle, or the file
    /// `berth train --memory-snapshot` writes.
    #[arg(value_name = "SNAPSHOT")]
    pub snapshot: PathBuf,
    /// The HTML file to write (self-contained: open it in any browser, offline).
    #[arg(short, long, value_name = "OUT.html")]
    pub output: PathBuf,
    /// The device to show, as an index (`0`) or as `cuda:0` (default: the first device with
    /// segments or trace entries).
    #[arg(long, value_name = "INDEX", value_parser = parse_device_index, allow_negative_numbers = true)]
    pub device: Option<usize>,
}

/// `--device`: `N` or `cuda:N`, as the other subcommands spell a CUDA device.
fn parse_device_index(s: &str) -> Result<usize, String> {
    let digits = s.strip_prefix("cuda:").unwrap_or(s);
    digits
        .parse::<usize>()
        .map_err(|_| format!("expected a device index such as 0 (or cuda:0), found {s:?}"))
}

/// What can go wrong in `berth memviz`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MemvizError {
    /// The snapshot file cannot be read (missing, a directory, no permission).
    #[error("cannot read snapshot {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is over the input size cap (a stream such as `/dev/zero` never ends; Note
    /// [Bounded reads] in `berth_alloc::input`).
    #[error("snapshot {}", .source)]
    TooLarge {
        /// The cap's error, naming the file, the cap and how to raise it.
        source: berth_alloc::input::InputError,
    },
    /// The file is gzip data or JSON: an allocator trace, for `berth replay`, not a snapshot.
    #[error(
        "{}: this is {what}, such as an allocator trace that `berth replay` reads, not a memory \
         snapshot; memviz draws snapshot pickles (torch.cuda.memory._dump_snapshot, or \
         `berth train --memory-snapshot`)",
        path.display()
    )]
    TraceNotSnapshot {
        /// The file.
        path: PathBuf,
        /// "gzip data" or "JSON".
        what: &'static str,
    },
    /// The file is not a snapshot pickle (neither PyTorch's nor berth's).
    #[error(
        "{}: not a memory snapshot (expected a torch.cuda.memory._dump_snapshot pickle or \
         the file `berth train --memory-snapshot` writes): {source}",
        path.display()
    )]
    NotASnapshot {
        /// The file.
        path: PathBuf,
        /// What the pickle reader found.
        source: PickleError,
    },
    /// The snapshot holds no segments and no trace entries: nothing to draw. What the empty
    /// trace means depends on whether history was recorded (Note [Snapshot history flag] in
    /// `berth_alloc::pickle`).
    #[error(
        "{}: the snapshot is empty (no segments and no trace entries on any device){}",
        path.display(),
        match history {
            Some(true) => "; history was being recorded, so nothing was allocated before it was taken",
            Some(false) => "; history was not being recorded, so the empty trace says nothing about allocations: record it (torch.cuda.memory._record_memory_history(), or berth train --memory-snapshot)",
            None => "; take it after allocating, with history recorded (torch.cuda.memory._record_memory_history(), or berth train --memory-snapshot)",
        }
    )]
    Empty {
        /// The file.
        path: PathBuf,
        /// Whether history was being recorded, where the file says (berth's own files).
        history: Option<bool>,
    },
    /// The snapshot holds what no allocator writes: a segment on a negative device (newcomer
    /// defect 16: such segments were dropped and the snapshot called empty), or a segment or
    /// block whose address plus size overflows 64 bits (defect 17: they passed silently).
    #[error("{}: the snapshot is damaged: {what}; expected device indices of 0 or more and address ranges inside 64 bits, as torch.cuda.memory._snapshot() writes", path.display())]
    Damaged {
        /// The file.
        path: PathBuf,
        /// What is wrong, naming the segment.
        what: String,
    },
    /// `--device` names a device the snapshot has nothing for.
    #[error(
        "--device {device}: the snapshot has no segments or trace entries for device {device} \
         (it has data for {available})"
    )]
    NoSuchDevice {
        /// The index asked for.
        device: usize,
        /// The devices with data, in words.
        available: String,
    },
    /// `-o` names the snapshot itself, which writing the page would destroy.
    #[error("-o {}: that is the snapshot itself; write the page to another file", path.display())]
    OutputIsInput {
        /// The file.
        path: PathBuf,
    },
    /// The HTML file cannot be written.
    #[error("cannot write {}: {source}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

impl MemvizError {
    /// Whether the error is the user's input (exit status 2) rather than a failure (1).
    pub fn is_input(&self) -> bool {
        !matches!(self, MemvizError::Write { .. })
    }
}

/// The page's HTML skeleton; `/*BERTH_MEMVIZ_CSS*/`, `/*BERTH_MEMVIZ_JS*/` and
/// `/*BERTH_MEMVIZ_DATA*/` are replaced.
const TEMPLATE: &str = include_str!("template.html");
/// The page's style.
const CSS: &str = include_str!("memviz.css");
/// The page's script (plain JavaScript, canvas drawing).
const JS: &str = include_str!("memviz.js");

/// Counts of what the snapshot holds for the device shown (COUNT each).
#[derive(Debug, Serialize)]
pub struct Counts {
    /// Segments.
    pub segments: usize,
    /// Blocks over all segments.
    pub blocks: usize,
    /// Entries of the device's trace.
    pub trace_entries: usize,
}

/// Everything embedded in the page.
#[derive(Debug, Serialize)]
pub struct PageData {
    /// The snapshot's file name.
    pub title: String,
    /// The device shown.
    pub device: usize,
    /// Devices with data.
    pub devices: Vec<usize>,
    /// What the snapshot holds for the device.
    pub counts: Counts,
    /// Bytes of all segments of the device.
    pub reserved_bytes: u64,
    /// Bytes of `active_allocated` blocks of the device.
    pub allocated_bytes: u64,
    /// The active-memory timeline.
    pub timeline: timeline::Timeline,
    /// The segment view's rows.
    pub segments: Vec<segments::SegmentRow>,
    /// Whether history was being recorded when the snapshot was taken, where the file says
    /// (berth's own files; `None` for PyTorch's): an empty timeline means "nothing
    /// allocated" only when `true` (Note [Snapshot history flag] in `berth_alloc::pickle`).
    pub history_recorded: Option<bool>,
}

/// Reads a snapshot file.
///
/// # Errors
/// [`MemvizError::Read`] when the file cannot be read, [`MemvizError::TraceNotSnapshot`] for
/// gzip or JSON data (a trace), [`MemvizError::NotASnapshot`] when it is not a snapshot pickle.
pub fn load(path: &Path) -> Result<(MemorySnapshot, Option<bool>), MemvizError> {
    use berth_alloc::input::{max_input_bytes, read_capped, read_rest_capped, InputError};
    use std::io::Read;
    let input_err = |e| match e {
        InputError::Io { path, source } => MemvizError::Read { path, source },
        source => MemvizError::TooLarge { source },
    };
    let read_err = |source| MemvizError::Read {
        path: path.to_owned(),
        source,
    };
    let is_file = std::fs::metadata(path).map_err(read_err)?.is_file();
    let bytes = if is_file {
        read_capped(path, max_input_bytes()).map_err(input_err)?
    } else {
        // A stream (a pipe, `/dev/zero`) is judged by its first bytes before the rest is
        // read (Note [Bounded reads]): what is no pickle fails at once.
        let mut stream = std::fs::File::open(path).map_err(read_err)?;
        let mut head = [0u8; 2];
        let mut n = 0;
        while n < head.len() {
            match stream.read(&mut head[n..]) {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(read_err(e)),
            }
        }
        let head = head[..n].to_vec();
        if head.first().is_some_and(|&b| starts_like_pickle(b)) {
            read_rest_capped(stream, path, head, max_input_bytes()).map_err(input_err)?
        } else {
            head
        }
    };
    let what = match bytes.first() {
        Some(0x1f) if bytes.get(1) == Some(&0x8b) => Some("gzip data"),
        Some(b'{' | b'[') => Some("JSON"),
        _ => None,
    };
    if let Some(what) = what {
        return Err(MemvizError::TraceNotSnapshot {
            path: path.to_owned(),
            what,
        });
    }
    load_snapshot_with_history(&bytes).map_err(|source| MemvizError::NotASnapshot {
        path: path.to_owned(),
        source,
    })
}

/// The devices with segments or trace entries, in order.
pub fn devices(snapshot: &MemorySnapshot) -> Vec<usize> {
    let mut d: Vec<usize> = snapshot
        .segments
        .iter()
        .filter_map(|s| usize::try_from(s.device).ok())
        .chain(
            snapshot
                .device_traces
                .iter()
                .enumerate()
                .filter(|(_, t)| !t.is_empty())
                .map(|(i, _)| i),
        )
        .collect();
    d.sort_unstable();
    d.dedup();
    d
}

/// Refuses a snapshot no allocator writes ([`MemvizError::Damaged`]): a segment on a negative
/// device, or a segment or block whose address range overflows 64 bits.
fn check_damage(snapshot: &MemorySnapshot, path: &Path) -> Result<(), MemvizError> {
    let damaged = |what: String| MemvizError::Damaged {
        path: path.to_owned(),
        what,
    };
    for s in &snapshot.segments {
        if s.device < 0 {
            return Err(damaged(format!(
                "segment 0x{:x} is on device {}",
                s.address, s.device
            )));
        }
        if s.address.checked_add(s.total_size).is_none() {
            return Err(damaged(format!(
                "segment 0x{:x} of {} bytes ends past 2^64",
                s.address, s.total_size
            )));
        }
        if let Some(b) = s
            .blocks
            .iter()
            .find(|b| b.address.checked_add(b.size).is_none())
        {
            return Err(damaged(format!(
                "block 0x{:x} of {} bytes (segment 0x{:x}) ends past 2^64",
                b.address, b.size, s.address
            )));
        }
    }
    Ok(())
}

/// The data of the page for `device` of `snapshot` (`title` names the file).
///
/// # Errors
/// [`MemvizError::Damaged`] for a snapshot no allocator writes (see [`check_damage`]),
/// [`MemvizError::Empty`] when the snapshot has nothing on any device,
/// [`MemvizError::NoSuchDevice`] when `device` is given and has nothing.
pub fn page_data(
    snapshot: &MemorySnapshot,
    path: &Path,
    device: Option<usize>,
) -> Result<PageData, MemvizError> {
    check_damage(snapshot, path)?;
    let devices = devices(snapshot);
    let Some(&first) = devices.first() else {
        return Err(MemvizError::Empty {
            path: path.to_owned(),
            history: None,
        });
    };
    let device = match device {
        None => first,
        Some(d) if devices.contains(&d) => d,
        Some(d) => {
            let list: Vec<String> = devices.iter().map(ToString::to_string).collect();
            return Err(MemvizError::NoSuchDevice {
                device: d,
                available: format!("device {}", list.join(", ")),
            });
        }
    };
    let segs = snapshot
        .segments
        .iter()
        .filter(|s| usize::try_from(s.device).ok() == Some(device));
    let counts = Counts {
        segments: segs.clone().count(),
        blocks: segs.clone().map(|s| s.blocks.len()).sum(),
        trace_entries: snapshot.device_traces.get(device).map_or(0, Vec::len),
    };
    let reserved_bytes = segs
        .clone()
        .map(|s| s.total_size)
        .fold(0, u64::saturating_add);
    let allocated_bytes = segs.map(|s| s.allocated_size).fold(0, u64::saturating_add);
    let title = path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    Ok(PageData {
        title,
        device,
        devices,
        counts,
        reserved_bytes,
        allocated_bytes,
        timeline: timeline::build(snapshot, device),
        segments: segments::build(snapshot, device),
        history_recorded: None,
    })
}

/// The JSON of `data`, safe inside a `<script>` element: every `<` is written `\u003c`, so
/// no string can close the element (`</script>`) or open a comment.
fn embedded_json(data: &PageData) -> String {
    // Serializing plain structs of numbers and strings cannot fail.
    let json = serde_json::to_string(data).unwrap_or_else(|_| "null".to_owned());
    json.replace('<', "\\u003c")
}

/// The whole HTML page for `data`.
pub fn render(data: &PageData) -> String {
    TEMPLATE
        .replacen(
            "<!--BERTH_MEMVIZ_HISTORY-->",
            &history_statement(data.history_recorded),
            1,
        )
        .replacen("/*BERTH_MEMVIZ_CSS*/", CSS, 1)
        .replacen("/*BERTH_MEMVIZ_JS*/", JS, 1)
        .replacen("/*BERTH_MEMVIZ_DATA*/", &embedded_json(data), 1)
}

/// The page's statement, under its title and written into the HTML itself (visible without
/// JavaScript), of whether allocation history was being recorded when the snapshot was taken:
/// `Some(true)` / `Some(false)` from berth's `berth_history_recorded` key, `None` (unknown)
/// for PyTorch's snapshots, which do not carry it (Note [Snapshot history flag] in
/// `berth_alloc::pickle`). So an empty timeline is not read as "no allocations".
pub fn history_statement(history_recorded: Option<bool>) -> String {
    let (class, text) = match history_recorded {
        Some(true) => (
            "yes",
            "Allocation history: <strong>recorded</strong>. History was being recorded when \
             this snapshot was taken, so the timeline holds every allocation and free since \
             recording began.",
        ),
        Some(false) => (
            "no",
            "Allocation history: <strong>not recorded</strong>. History was not being \
             recorded when this snapshot was taken, so an empty timeline does not mean that \
             nothing was allocated; record it with \
             <code>torch.cuda.memory._record_memory_history()</code> or \
             <code>berth train --memory-snapshot</code>.",
        ),
        None => (
            "unknown",
            "Allocation history: <strong>unknown</strong>. This snapshot does not say whether \
             history was being recorded when it was taken (PyTorch's snapshots do not; \
             berth's carry <code>berth_history_recorded</code>), so an empty timeline may mean \
             that history was off, not that nothing was allocated.",
        ),
    };
    format!(r#"<p id="history" class="history {class}">{text}</p>"#)
}

/// Runs `berth memviz`.
///
/// # Errors
/// Every [`MemvizError`].
pub fn run(args: MemvizArgs) -> anyhow::Result<()> {
    let (snapshot, history) = load(&args.snapshot)?;
    if crate::paths::same_file(&args.snapshot, &args.output) {
        return Err(MemvizError::OutputIsInput { path: args.output }.into());
    }
    let mut data = page_data(&snapshot, &args.snapshot, args.device).map_err(|e| match e {
        MemvizError::Empty { path, .. } => MemvizError::Empty { path, history },
        e => e,
    })?;
    data.history_recorded = history;
    let html = render(&data);
    std::fs::write(&args.output, &html).map_err(|source| MemvizError::Write {
        path: args.output.clone(),
        source,
    })?;
    let t = &data.timeline;
    let count =
        |n: usize, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
    let history = match history {
        Some(true) => "; history was recorded",
        Some(false) => "; history was not recorded (an empty timeline says nothing)",
        None => "",
    };
    println!(
        "wrote {} ({} KiB): device {}, {}, {}, {}; timeline of {} in {}, {} of {} drawn one by one{history}",
        args.output.display(),
        html.len().div_ceil(1024),
        data.device,
        count(data.counts.segments, "segment", "segments"),
        count(data.counts.blocks, "block", "blocks"),
        count(data.counts.trace_entries, "trace entry", "trace entries"),
        count(t.steps, "step", "steps"),
        count(t.columns.step.len(), "column", "columns"),
        t.bands.len(),
        count(t.blocks, "block", "blocks"),
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_is_an_index_or_cuda_index() {
        assert_eq!(parse_device_index("2"), Ok(2));
        assert_eq!(parse_device_index("cuda:1"), Ok(1));
        assert_eq!(
            parse_device_index("gpu0"),
            Err("expected a device index such as 0 (or cuda:0), found \"gpu0\"".to_owned())
        );
        assert!(parse_device_index("cuda:-1").is_err());
    }
    use berth_alloc::snapshot::{TraceAction, TraceEntry};

    #[test]
    fn embedded_data_cannot_close_its_script_element() {
        let snap = MemorySnapshot {
            device_traces: vec![vec![TraceEntry {
                action: TraceAction::Alloc,
                addr: 16,
                size: 8,
                stream: berth_alloc::backend::StreamId(0),
                time_us: 0,
            }]],
            ..MemorySnapshot::default()
        };
        // The page's title is the file's name (a path cannot hold `</`, but it can hold `<`).
        let path = Path::new("/tmp/x<!--<script>.pickle");
        let html = render(&page_data(&snap, path, None).unwrap());
        assert_eq!(html.matches("<script").count(), 2);
        assert!(html.contains(r#""title":"x\u003c!--\u003cscript>.pickle""#));
    }

    #[test]
    fn devices_with_data_are_listed_once() {
        let mut snap = MemorySnapshot {
            device_traces: vec![vec![], vec![], vec![]],
            ..MemorySnapshot::default()
        };
        assert!(devices(&snap).is_empty());
        assert!(matches!(
            page_data(&snap, Path::new("s"), None),
            Err(MemvizError::Empty { .. })
        ));
        snap.device_traces[2].push(TraceEntry {
            action: TraceAction::Alloc,
            addr: 1,
            size: 1,
            stream: berth_alloc::backend::StreamId(0),
            time_us: 0,
        });
        assert_eq!(devices(&snap), vec![2]);
        let err = page_data(&snap, Path::new("s"), Some(0)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "--device 0: the snapshot has no segments or trace entries for device 0 (it has data for device 2)"
        );
    }
}
