//! Reading PyTorch allocator traces: the `*.trace.json.gz` files recorded from PyTorch's memory
//! history (`scripts/traces/record_traces.py` records them; the format is in
//! `crates/berth-alloc/tests/data/README.md`), gzip or plain JSON, flattened from
//! `torch.cuda.memory._snapshot()["device_traces"][0]`.
//!
//! Format: an object with `events` (rows `[action, addr, size, stream, time_us]` in the order
//! of `columns`), plus optional `workload`, `stats`, `alloc_conf`. A bare array of rows is also
//! accepted. Behind the `trace` feature (pulls `flate2` and `serde_json`).
//!
//! # Note [Streaming trace reader]
//! A trace of ten million events is about half a gigabyte of JSON. The reader never holds the
//! text, nor a JSON tree of it: it decompresses and parses as it goes (`serde_json`'s streaming
//! deserializer over a buffered reader, with a visitor over the `events` array), turns each row
//! into a 40-byte [`TraceEvent`] the moment it is complete, validates it, and hands it to an
//! [`EventSink`]. A bad row fails the read at once, however much follows it, and a sink can
//! refuse an event (a request larger than the device, a free of an address that is not live)
//! just as early. [`read_trace`] and [`parse_trace`] collect the events into a [`Trace`]
//! (40 bytes per event); callers that need less, such as `berth replay`, which compiles the
//! events as they arrive, pass their own sink to [`read_trace_into`] or [`parse_trace_into`].
//! The other keys of the object (`stats`, `workload`, ...) may come before or after `events`;
//! a `columns` list that comes after the events is checked once it is read.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::io::{BufReader, Read};
use std::path::Path;
use std::rc::Rc;

use crate::backend::StreamId;
use crate::snapshot::TraceAction;

mod excerpt;
mod json;

use json::parse_json;

/// One row of a trace: 40 bytes (five 8-byte fields, the action in the padding's place).
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

// `Note [Streaming trace reader]`: what a stored event costs.
const _: () = assert!(std::mem::size_of::<TraceEvent>() == 40);

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

/// Everything a trace file holds besides its rows, and how many rows it had: what
/// [`read_trace_into`] returns once its sink has taken every event.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TraceInfo {
    /// The `workload` name, if given.
    pub workload: Option<String>,
    /// The `alloc_conf` the trace was recorded with, if given.
    pub alloc_conf: Option<String>,
    /// The integer entries of `stats` (a subset of `memory_stats()` at the end of the run).
    pub stats: BTreeMap<String, i64>,
    /// Number of rows handed to the sink.
    pub events: usize,
}

/// Where a streaming read ([`read_trace_into`], [`parse_trace_into`]) puts each event, as soon
/// as its row is parsed and valid (`Note [Streaming trace reader]`).
///
/// Implemented for `Vec<TraceEvent>` (collects them) and for closures
/// `FnMut(usize, TraceEvent) -> Result<(), String>`.
pub trait EventSink {
    /// Takes event number `index` (0-based, the row's position in `events`).
    ///
    /// # Errors
    /// A message saying what is wrong with the event and what would be right; the read stops at
    /// once with [`TraceError::Rejected`] naming `index`.
    fn event(&mut self, index: usize, event: TraceEvent) -> Result<(), String>;
}

impl EventSink for Vec<TraceEvent> {
    fn event(&mut self, _index: usize, event: TraceEvent) -> Result<(), String> {
        self.push(event);
        Ok(())
    }
}

impl<F: FnMut(usize, TraceEvent) -> Result<(), String>> EventSink for F {
    fn event(&mut self, index: usize, event: TraceEvent) -> Result<(), String> {
        self(index, event)
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
    /// The file has no bytes at all.
    #[error("the file is empty (0 bytes); expected a JSON trace such as torch_trace.py records, gzip-compressed if named .gz")]
    EmptyFile,
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
    /// A well-formed row that the [`EventSink`] refused (its message says why).
    #[error("trace event #{index}: {message}")]
    Rejected {
        /// 0-based index of the row in `events`.
        index: usize,
        /// The sink's message.
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

/// Reads a trace file (gzip-compressed or plain JSON) into a [`Trace`], streaming
/// (`Note [Streaming trace reader]`).
///
/// # Errors
/// [`TraceError::Io`] if the file cannot be read; [`TraceError::NotGzip`] if its name ends in
/// `.gz` but its content is not gzip data; otherwise as [`parse_trace`].
pub fn read_trace(path: impl AsRef<Path>) -> Result<Trace, TraceError> {
    let mut events = Vec::new();
    let info = read_trace_into(path, &mut events)?;
    Ok(Trace::from_parts(info, events))
}

/// Reads a trace file (gzip-compressed or plain JSON), handing each event to `sink` as soon as
/// its row is parsed (`Note [Streaming trace reader]`); returns the rest of the file.
///
/// # Errors
/// [`TraceError::Io`] if the file cannot be opened or read; [`TraceError::EmptyFile`] if it has
/// no bytes; [`TraceError::NotGzip`] if its name ends in `.gz` but its content is not gzip data;
/// otherwise as [`parse_trace_into`].
pub fn read_trace_into<S: EventSink + ?Sized>(
    path: impl AsRef<Path>,
    sink: &mut S,
) -> Result<TraceInfo, TraceError> {
    let path = path.as_ref();
    let io = |source| TraceError::Io {
        path: path.display().to_string(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    let named_gz = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gz"));
    let file_errors = Rc::new(RefCell::new(Tally::default()));
    let (is_gz, input) = sniff_gzip(Tracked {
        inner: file,
        tally: Rc::clone(&file_errors),
    })
    .map_err(io)?;
    if !is_gz && std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.len() == 0) {
        return Err(TraceError::EmptyFile);
    }
    if named_gz && !is_gz {
        return Err(TraceError::NotGzip);
    }
    match parse_stream(input, is_gz, sink) {
        Err(e) => match file_errors.borrow_mut().error.take() {
            // The file itself failed to read (not the decoder, not the JSON).
            Some(source) => Err(io(source)),
            None => Err(e),
        },
        ok => ok,
    }
}

/// Parses trace bytes into a [`Trace`]; gzip is detected by its magic number.
///
/// # Errors
/// [`TraceError::Gzip`] for a corrupt or truncated gzip stream, [`TraceError::Json`] with line
/// and column for malformed JSON, [`TraceError::Row`] with the row index for a bad row,
/// [`TraceError::Columns`] for an unknown column layout, [`TraceError::NoEvents`] for an
/// object without an `events` array.
pub fn parse_trace(bytes: &[u8]) -> Result<Trace, TraceError> {
    let mut events = Vec::new();
    let info = parse_trace_into(bytes, &mut events)?;
    Ok(Trace::from_parts(info, events))
}

/// Parses a trace from `reader` (gzip detected by its magic number), handing each event to
/// `sink` as soon as its row is parsed and valid; returns the rest of the trace. Reads no
/// further than the first error (`Note [Streaming trace reader]`).
///
/// ```
/// use berth_alloc::trace::{parse_trace_into, TraceError, TraceEvent};
/// let json = br#"{"events": [["alloc", 4096, 512, 0, 7], ["free_completed", 4096, 512, 0, 9]]}"#;
/// let mut sizes = Vec::new();
/// let info = parse_trace_into(&json[..], &mut |_, e: TraceEvent| {
///     sizes.push(e.size);
///     Ok(())
/// })
/// .unwrap();
/// assert_eq!((info.events, sizes), (2, vec![512, 512]));
/// let refuse = parse_trace_into(&json[..], &mut |_, _| Err("no".to_string()));
/// assert!(matches!(refuse, Err(TraceError::Rejected { index: 0, .. })));
/// ```
///
/// # Errors
/// As [`parse_trace`], plus [`TraceError::Rejected`] when `sink` refuses an event and
/// [`TraceError::Io`] (path `"<reader>"`) when `reader` fails.
pub fn parse_trace_into<R: Read, S: EventSink + ?Sized>(
    reader: R,
    sink: &mut S,
) -> Result<TraceInfo, TraceError> {
    let reader_errors = Rc::new(RefCell::new(Tally::default()));
    let io = |source| TraceError::Io {
        path: "<reader>".into(),
        source,
    };
    let (is_gz, input) = sniff_gzip(Tracked {
        inner: reader,
        tally: Rc::clone(&reader_errors),
    })
    .map_err(io)?;
    match parse_stream(input, is_gz, sink) {
        Err(e) => match reader_errors.borrow_mut().error.take() {
            Some(source) => Err(io(source)),
            None => Err(e),
        },
        ok => ok,
    }
}

impl Trace {
    fn from_parts(info: TraceInfo, events: Vec<TraceEvent>) -> Trace {
        Trace {
            workload: info.workload,
            alloc_conf: info.alloc_conf,
            stats: info.stats,
            events,
        }
    }
}

/// Reads up to two bytes of `reader` to see whether it starts with the gzip magic bytes, and
/// gives back a reader of the whole stream, those bytes included.
fn sniff_gzip<R: Read>(mut reader: R) -> std::io::Result<(bool, impl Read)> {
    let mut head = [0u8; 2];
    let mut n = 0;
    while n < head.len() {
        match reader.read(&mut head[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let is_gz = head[..n] == GZIP_MAGIC;
    Ok((
        is_gz,
        std::io::Cursor::new(head).take(n as u64).chain(reader),
    ))
}

/// What a [`Tracked`] reader saw: bytes passed through and the first error.
#[derive(Default)]
struct Tally {
    bytes: usize,
    error: Option<std::io::Error>,
}

/// A reader that counts its bytes and keeps its error (with a copy for the caller), so that
/// an I/O error surfacing inside `serde_json` can be told apart from a JSON error and named.
struct Tracked<R> {
    inner: R,
    tally: Rc<RefCell<Tally>>,
}

impl<R: Read> Read for Tracked<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self.inner.read(buf) {
            Ok(n) => {
                self.tally.borrow_mut().bytes += n;
                Ok(n)
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => Err(e),
            Err(e) => {
                let copy = std::io::Error::new(e.kind(), e.to_string());
                self.tally.borrow_mut().error.get_or_insert(e);
                Err(copy)
            }
        }
    }
}

/// Bytes of read-ahead between the decoder (or file) and the JSON parser.
const BUFFER: usize = 1 << 16;

/// Decompresses (if `is_gz`) and parses `input`, feeding `sink`.
fn parse_stream<R: Read, S: EventSink + ?Sized>(
    input: R,
    is_gz: bool,
    sink: &mut S,
) -> Result<TraceInfo, TraceError> {
    if !is_gz {
        return parse_json(BufReader::with_capacity(BUFFER, input), sink);
    }
    let decoded = Rc::new(RefCell::new(Tally::default()));
    let decoder = Tracked {
        inner: flate2::read::MultiGzDecoder::new(BufReader::with_capacity(BUFFER, input)),
        tally: Rc::clone(&decoded),
    };
    match parse_json(BufReader::with_capacity(BUFFER, decoder), sink) {
        Err(e) => {
            let mut tally = decoded.borrow_mut();
            match tally.error.take() {
                Some(error) => Err(TraceError::Gzip {
                    decompressed: tally.bytes,
                    message: error.to_string(),
                }),
                None => Err(e),
            }
        }
        ok => ok,
    }
}
