//! Reading PyTorch allocator traces: `*.trace.json.gz` files such as those in
//! `crates/berth-alloc/tests/data` (gzip or plain JSON), recorded with PyTorch's memory history
//! (<https://pytorch.org/docs/stable/torch_cuda_memory.html>) and flattened from
//! `torch.cuda.memory._snapshot()["device_traces"][0]`.
//!
//! Format: an object with `events` (rows `[action, addr, size, stream, time_us]` in the order
//! of `columns`), plus optional `workload`, `stats`, `alloc_conf`. A bare array of rows is also
//! accepted. Behind the `trace` feature (pulls `flate2` and `serde_json`).

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;

use crate::backend::StreamId;
use crate::snapshot::TraceAction;

/// One row of a trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceEvent {
    /// What happened.
    pub action: TraceAction,
    /// Device address (for `oom`: the device's free bytes).
    pub addr: u64,
    /// Bytes: requested size for alloc/free rows, segment size for segment rows.
    pub size: u64,
    /// The stream handle.
    pub stream: StreamId,
    /// Microseconds (wall clock of the recording).
    pub time_us: i64,
}

/// A parsed trace file.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Trace {
    /// The `workload` name, if given.
    pub workload: Option<String>,
    /// The `alloc_conf` the trace was recorded with, if given.
    pub alloc_conf: Option<String>,
    /// The integer entries of `stats` (a subset of `memory_stats()` at the end of the run).
    pub stats: BTreeMap<String, i64>,
    /// The rows, in order.
    pub events: Vec<TraceEvent>,
}

impl Trace {
    /// The addresses of the `segment_alloc` rows, in order (for
    /// [`crate::backend::sim::SimBackend::with_addresses`]).
    pub fn segment_addresses(&self) -> Vec<u64> {
        self.events
            .iter()
            .filter(|e| e.action == TraceAction::SegmentAlloc)
            .map(|e| e.addr)
            .collect()
    }

    /// Number of `alloc` rows.
    pub fn allocations(&self) -> usize {
        self.events
            .iter()
            .filter(|e| e.action == TraceAction::Alloc)
            .count()
    }
}

/// Why a trace could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TraceError {
    /// The file could not be opened or read.
    #[error("cannot read trace {path}: {source}")]
    Io {
        /// The path.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The file's name ends in `.gz` but its content does not start with the gzip magic bytes
    /// `1f 8b`: it is not gzip data at all (plain JSON renamed, or another format).
    #[error("the file name ends in .gz but the content is not gzip data (it does not start with the gzip magic bytes 1f 8b); expected a gzip-compressed JSON trace, or rename a plain JSON trace to .json")]
    NotGzip,
    /// The gzip stream is corrupt or truncated.
    #[error("corrupt or truncated gzip data after {decompressed} decompressed bytes: {message}; expected a complete .json.gz file")]
    Gzip {
        /// Bytes decompressed before the failure.
        decompressed: usize,
        /// The decoder's message.
        message: String,
    },
    /// The JSON is malformed (or truncated) at a line and column.
    #[error("malformed trace JSON at line {line}, column {column}: {message}")]
    Json {
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// What was wrong.
        message: String,
    },
    /// The top-level object has no `events` array (the rows).
    #[error("the trace object has no \"events\" array; expected {{\"events\": [[action, addr, size, stream, time_us], ...]}}")]
    NoEvents,
    /// A row does not have the expected shape or values.
    #[error("trace event #{index}: {message}")]
    Row {
        /// 0-based index of the row in `events`.
        index: usize,
        /// What was wrong and what was expected.
        message: String,
    },
    /// The `columns` list is not the one this reader understands.
    #[error("unsupported trace columns {found:?}; expected [\"action\", \"addr\", \"size\", \"stream\", \"time_us\"]")]
    Columns {
        /// The columns found.
        found: Vec<String>,
    },
}

/// The first two bytes of every gzip stream (RFC 1952).
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// Reads a trace file (gzip-compressed or plain JSON).
///
/// # Errors
/// [`TraceError::Io`] if the file cannot be read; [`TraceError::NotGzip`] if its name ends in
/// `.gz` but its content is not gzip data; otherwise as [`parse_trace`].
pub fn read_trace(path: impl AsRef<Path>) -> Result<Trace, TraceError> {
    let path = path.as_ref();
    let bytes = std::fs::read(path).map_err(|source| TraceError::Io {
        path: path.display().to_string(),
        source,
    })?;
    let named_gz = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gz"));
    if named_gz && !bytes.starts_with(&GZIP_MAGIC) {
        return Err(TraceError::NotGzip);
    }
    parse_trace(&bytes)
}

/// Parses trace bytes; gzip is detected by its magic number.
///
/// # Errors
/// [`TraceError::Gzip`] for a corrupt or truncated gzip stream, [`TraceError::Json`] with line
/// and column for malformed JSON, [`TraceError::Row`] with the row index for a bad row,
/// [`TraceError::Columns`] for an unknown column layout, [`TraceError::NoEvents`] for an
/// object without an `events` array.
pub fn parse_trace(bytes: &[u8]) -> Result<Trace, TraceError> {
    let text;
    let json: &[u8] = if bytes.starts_with(&GZIP_MAGIC) {
        let mut out = Vec::with_capacity(bytes.len() * 8);
        if let Err(e) = flate2::read::MultiGzDecoder::new(bytes).read_to_end(&mut out) {
            return Err(TraceError::Gzip {
                decompressed: out.len(),
                message: e.to_string(),
            });
        }
        text = out;
        &text
    } else {
        bytes
    };
    let value: serde_json::Value = serde_json::from_slice(json).map_err(|e| TraceError::Json {
        line: e.line(),
        column: e.column(),
        message: json_message(&e),
    })?;
    let mut trace = Trace::default();
    let rows = match &value {
        serde_json::Value::Array(rows) => rows,
        serde_json::Value::Object(obj) => {
            if let Some(cols) = obj.get("columns") {
                let found: Vec<String> = cols
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .map(|c| c.as_str().unwrap_or("?").to_owned())
                            .collect()
                    })
                    .unwrap_or_default();
                if found != ["action", "addr", "size", "stream", "time_us"] {
                    return Err(TraceError::Columns { found });
                }
            }
            trace.workload = obj
                .get("workload")
                .and_then(|w| w.as_str())
                .map(str::to_owned);
            trace.alloc_conf = obj
                .get("alloc_conf")
                .and_then(|w| w.as_str())
                .map(str::to_owned);
            if let Some(stats) = obj.get("stats").and_then(|s| s.as_object()) {
                for (k, v) in stats {
                    if let Some(n) = v.as_i64() {
                        trace.stats.insert(k.clone(), n);
                    }
                }
            }
            match obj.get("events").and_then(|e| e.as_array()) {
                Some(rows) => rows,
                None => return Err(TraceError::NoEvents),
            }
        }
        _ => {
            return Err(TraceError::Json {
                line: 1,
                column: 1,
                message: "expected a JSON object or array".into(),
            })
        }
    };
    trace.events.reserve(rows.len());
    for (index, row) in rows.iter().enumerate() {
        trace.events.push(parse_row(index, row)?);
    }
    Ok(trace)
}

/// `serde_json`'s message without its trailing " at line L column C", which
/// [`TraceError::Json`] already says.
fn json_message(e: &serde_json::Error) -> String {
    let text = e.to_string();
    let position = format!(" at line {} column {}", e.line(), e.column());
    text.strip_suffix(&position).unwrap_or(&text).to_owned()
}

fn parse_row(index: usize, row: &serde_json::Value) -> Result<TraceEvent, TraceError> {
    let bad = |message: String| TraceError::Row { index, message };
    let cells = row.as_array().filter(|r| r.len() == 5).ok_or_else(|| {
        bad(format!(
            "expected [action, addr, size, stream, time_us], found {row}"
        ))
    })?;
    let action = cells[0]
        .as_str()
        .ok_or_else(|| bad(format!("action must be a string, found {}", cells[0])))?
        .parse::<TraceAction>()
        .map_err(|e| bad(e.to_string()))?;
    let uint = |k: usize, name: &str| {
        cells[k].as_u64().ok_or_else(|| {
            bad(format!(
                "{name} must be a non-negative integer, found {}",
                cells[k]
            ))
        })
    };
    let time_us = cells[4]
        .as_i64()
        .or_else(|| cells[4].as_f64().map(|f| f as i64))
        .ok_or_else(|| bad(format!("time_us must be a number, found {}", cells[4])))?;
    Ok(TraceEvent {
        action,
        addr: uint(1, "addr")?,
        size: uint(2, "size")?,
        stream: StreamId(uint(3, "stream")?),
        time_us,
    })
}
