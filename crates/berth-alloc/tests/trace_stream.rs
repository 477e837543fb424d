//! The streaming trace reader (`Note [Streaming trace reader]` in `berth_alloc::trace`): a bad
//! event fails the read at once, however much follows it; the reader never runs far ahead of
//! the event it hands out; the replay refuses a free of an address that is not live, as
//! PyTorch's allocator does
//! (<https://github.com/pytorch/pytorch/blob/main/c10/cuda/CUDACachingAllocator.cpp>). Found
//! by probing: a 10-million-event trace held 4.3 GB before failing at event 0.

use std::cell::Cell;
use std::io::Read;
use std::rc::Rc;

use berth_alloc::replay::{BadRow, CompiledTrace, FreeMismatch, TraceCompiler, UnknownFree};
use berth_alloc::trace::{parse_trace, parse_trace_into, read_trace, TraceError, TraceEvent};
use berth_alloc::TraceAction;

use crate::util::{trace_path, TRACES};

/// A reader of `head` followed by `row(i)` for i = 0, 1, 2, ... (comma-separated), `rows` of
/// them (`None`: without end), then `tail`; counts the bytes handed out.
struct Generated {
    head: Vec<u8>,
    row: fn(u64) -> String,
    rows: Option<u64>,
    tail: Vec<u8>,
    next: u64,
    pending: Vec<u8>,
    pos: usize,
    read: Rc<Cell<u64>>,
    done: bool,
}

impl Generated {
    fn new(head: &str, row: fn(u64) -> String, rows: Option<u64>, tail: &str) -> Self {
        Generated {
            head: head.as_bytes().to_vec(),
            row,
            rows,
            tail: tail.as_bytes().to_vec(),
            next: 0,
            pending: Vec::new(),
            pos: 0,
            read: Rc::new(Cell::new(0)),
            done: false,
        }
    }

    /// Refills `pending` with the next piece; false at the end.
    fn refill(&mut self) -> bool {
        self.pos = 0;
        self.pending.clear();
        if !self.head.is_empty() {
            self.pending = std::mem::take(&mut self.head);
            return true;
        }
        if self.done {
            return false;
        }
        if self.rows.is_some_and(|n| self.next >= n) {
            self.pending = std::mem::take(&mut self.tail);
            self.done = true;
            return true;
        }
        // A few hundred rows at a time.
        for _ in 0..256 {
            if self.rows.is_some_and(|n| self.next >= n) {
                break;
            }
            if self.next > 0 {
                self.pending.push(b',');
            }
            self.pending
                .extend_from_slice((self.row)(self.next).as_bytes());
            self.next += 1;
        }
        true
    }
}

impl Read for Generated {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.pos == self.pending.len() {
            if !self.refill() {
                return Ok(0);
            }
        }
        let n = buf.len().min(self.pending.len() - self.pos);
        buf[..n].copy_from_slice(&self.pending[self.pos..self.pos + n]);
        self.pos += n;
        self.read.set(self.read.get() + n as u64);
        Ok(n)
    }
}

fn alloc_row(i: u64) -> String {
    format!("[\"alloc\",{},{},0,{i}]", 4096 + 512 * i, 512 + i)
}

/// How far ahead of the event being handed out the reader may have read: its buffers (64 KiB
/// each, one before the decoder and one after) and a row.
const LOOKAHEAD: u64 = 256 << 10;

#[test]
fn a_bad_event_0_fails_at_once_before_an_endless_stream() {
    // Row 0 has a negative address; then rows without end.
    let mut reader = Generated::new(
        "{\"events\": [[\"alloc\", -1, 2, 0, 0],",
        alloc_row,
        None,
        "",
    );
    let read = Rc::clone(&reader.read);
    let mut seen = 0usize;
    let e = parse_trace_into(&mut reader, &mut |_, _| {
        seen += 1;
        Ok(())
    })
    .unwrap_err();
    assert!(
        matches!(&e, TraceError::Row { index: 0, message } if message.contains("addr")),
        "{e:?}"
    );
    assert_eq!(seen, 0);
    assert!(read.get() <= LOOKAHEAD, "read {} bytes", read.get());
}

#[test]
fn an_event_the_sink_refuses_fails_at_once_before_an_endless_stream() {
    let mut reader = Generated::new("{\"events\": [", alloc_row, None, "");
    let read = Rc::clone(&reader.read);
    let e = parse_trace_into(&mut reader, &mut |index, e: TraceEvent| {
        if index == 3 {
            Err(format!("alloc of {} bytes refused", e.size))
        } else {
            Ok(())
        }
    })
    .unwrap_err();
    assert!(
        matches!(&e, TraceError::Rejected { index: 3, message } if message == "alloc of 515 bytes refused"),
        "{e:?}"
    );
    assert_eq!(e.to_string(), "trace event #3: alloc of 515 bytes refused");
    assert!(read.get() <= LOOKAHEAD, "read {} bytes", read.get());
}

#[test]
fn columns_before_the_events_are_checked_before_any_row_is_read() {
    let mut reader = Generated::new(
        "{\"columns\": [\"addr\", \"action\", \"size\", \"stream\", \"time_us\"], \"events\": [",
        alloc_row,
        None,
        "",
    );
    let read = Rc::clone(&reader.read);
    let e = parse_trace_into(&mut reader, &mut |_, _| Ok(())).unwrap_err();
    assert!(matches!(e, TraceError::Columns { .. }), "{e:?}");
    assert!(read.get() <= LOOKAHEAD, "read {} bytes", read.get());
    // After the events (as `scripts/traces/record_traces.py` writes them), they are checked at the end.
    let e = parse_trace(br#"{"events": [["alloc", 1, 2, 0, 0]], "columns": ["a"]}"#).unwrap_err();
    assert!(matches!(e, TraceError::Columns { found } if found == ["a"]));
    // What was there, not an empty list: a string instead of a list, or entries that are not
    // strings.
    let e = parse_trace(br#"{"columns": "x", "events": []}"#).unwrap_err();
    assert!(
        matches!(&e, TraceError::Columns { found } if *found == ["\"x\" (not a list)"]),
        "{e:?}"
    );
    let e = parse_trace(br#"{"columns": ["action", 7], "events": []}"#).unwrap_err();
    assert!(
        matches!(&e, TraceError::Columns { found } if *found == ["action", "7"]),
        "{e:?}"
    );
    let ok = parse_trace(
        br#"{"events": [["alloc", 1, 2, 0, 0]], "columns": ["action", "addr", "size", "stream", "time_us"], "stats": {"num_ooms": 0}}"#,
    )
    .unwrap();
    assert_eq!((ok.events.len(), ok.stats["num_ooms"]), (1, 0));
}

#[test]
fn a_large_generated_trace_streams_with_bounded_lookahead() {
    // 300,000 rows (about 10 MB of JSON): at every event, the reader has handed out no more
    // than a few buffers beyond the end of that row, so the text is never held whole; the
    // events go to a sink that keeps only a count and a sum.
    const ROWS: u64 = 300_000;
    let mut reader = Generated::new(
        "{\"workload\": \"gen\", \"events\": [",
        alloc_row,
        Some(ROWS),
        "], \"stats\": {\"max_memory_reserved\": 7}}",
    );
    let read = Rc::clone(&reader.read);
    let mut end_of_row = "{\"workload\": \"gen\", \"events\": [".len() as u64;
    let (mut count, mut bytes, mut furthest_ahead) = (0u64, 0u64, 0u64);
    let info = parse_trace_into(&mut reader, &mut |index, e: TraceEvent| {
        end_of_row += alloc_row(index as u64).len() as u64 + u64::from(index > 0);
        furthest_ahead = furthest_ahead.max(read.get().saturating_sub(end_of_row));
        assert_eq!(e.action, TraceAction::Alloc);
        count += 1;
        bytes += e.size;
        Ok(())
    })
    .unwrap();
    assert_eq!((info.events as u64, count), (ROWS, ROWS));
    assert_eq!(bytes, (0..ROWS).map(|i| 512 + i).sum::<u64>());
    assert_eq!(info.workload.as_deref(), Some("gen"));
    assert_eq!(info.stats["max_memory_reserved"], 7);
    assert!(
        furthest_ahead <= LOOKAHEAD,
        "read {furthest_ahead} bytes ahead"
    );
    assert!(
        read.get() > 8_000_000,
        "the whole trace was read: {}",
        read.get()
    );
}

#[test]
fn gzip_input_streams_too() {
    use std::io::Write;
    // A gzip trace whose event 0 is bad: the read stops near the start of the compressed file.
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(b"{\"events\": [[\"alloc\", 1, 2, 0],")
        .unwrap();
    let mut reader = Generated::new("", alloc_row, Some(400_000), "]}");
    std::io::copy(&mut reader, &mut gz).unwrap();
    let compressed = gz.finish().unwrap();
    assert!(compressed.len() > 1_000_000, "{}", compressed.len());
    let consumed = Rc::new(Cell::new(0u64));
    struct Counting<'a>(&'a [u8], Rc<Cell<u64>>);
    impl Read for Counting<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = self.0.read(buf)?;
            self.1.set(self.1.get() + n as u64);
            Ok(n)
        }
    }
    let e = parse_trace_into(Counting(&compressed, Rc::clone(&consumed)), &mut |_, _| {
        Ok(())
    })
    .unwrap_err();
    assert!(
        matches!(&e, TraceError::Row { index: 0, message } if message.contains("found [\"alloc\",1,2,0]")),
        "{e:?}"
    );
    assert!(
        consumed.get() <= LOOKAHEAD,
        "read {} compressed bytes",
        consumed.get()
    );
}

#[test]
fn rows_of_the_wrong_shape_say_what_they_found() {
    for (json, index, want) in [
        (
            &br#"{"events": [["alloc", 1, 2, 0, 0], 7]}"#[..],
            1,
            "expected [action, addr, size, stream, time_us], found 7",
        ),
        (
            br#"[["alloc", 1, 2, 0, 0, 9]]"#,
            0,
            "found [\"alloc\",1,2,0,0,9]",
        ),
        (
            br#"[[5, 1, 2, 0, 0]]"#,
            0,
            "action must be a string, found 5",
        ),
        (
            br#"[["alloc", 1, 2.5, 0, 0]]"#,
            0,
            "size must be a non-negative integer, found 2.5",
        ),
        (
            br#"[["alloc", 1, 2, {"s": 1}, 0]]"#,
            0,
            "stream must be a non-negative integer, found {\"s\":1}",
        ),
        (
            br#"[["alloc", 1, 2, 0, "now"]]"#,
            0,
            "time_us must be a number, found \"now\"",
        ),
    ] {
        match parse_trace(json) {
            Err(e @ TraceError::Row { .. }) => {
                assert!(
                    matches!(e, TraceError::Row { index: i, .. } if i == index),
                    "{e:?}"
                );
                assert!(e.to_string().contains(want), "{e}");
            }
            other => panic!(
                "{}: expected a row error, got {other:?}",
                String::from_utf8_lossy(json)
            ),
        }
    }
    // Times: integers, large unsigned ones saturating, and floats truncated, as before.
    let t = parse_trace(br#"[["alloc", 1, 2, 0, -5], ["alloc", 3, 2, 0, 18446744073709551615], ["alloc", 5, 2, 0, 7.9]]"#).unwrap();
    let times: Vec<i64> = t.events.iter().map(|e| e.time_us).collect();
    assert_eq!(times, [-5, i64::MAX, 7]);
    // An empty trace parses; "events" that is not an array is no events.
    assert_eq!(parse_trace(br#"{"events": []}"#).unwrap().events.len(), 0);
    assert!(matches!(
        parse_trace(br#"{"events": {"a": 1}}"#),
        Err(TraceError::NoEvents)
    ));
    assert!(matches!(
        parse_trace(br#"{"events": null}"#),
        Err(TraceError::NoEvents)
    ));
}

#[test]
fn the_recorded_traces_never_free_an_address_that_is_not_live() {
    for name in TRACES {
        let Some(path) = trace_path(name) else {
            continue;
        };
        let trace = read_trace(&path).unwrap();
        let strict = CompiledTrace::try_new(&trace.events).unwrap();
        assert_eq!(
            strict.ops(),
            CompiledTrace::new(&trace.events).ops(),
            "{name}"
        );
    }
}

#[test]
fn a_free_of_an_address_that_is_not_live_is_refused_with_its_row_and_address() {
    let row = |action, addr| TraceEvent {
        action,
        addr,
        size: 4096,
        stream: berth_alloc::StreamId::DEFAULT,
        time_us: 0,
    };
    let events = [
        row(TraceAction::Alloc, 0x1000),
        row(TraceAction::FreeRequested, 0x1000),
        row(TraceAction::FreeCompleted, 0x1000),
        row(TraceAction::FreeCompleted, 0x1000), // already freed
    ];
    let e = CompiledTrace::try_new(&events).unwrap_err();
    assert_eq!(
        e,
        BadRow::UnknownFree(UnknownFree {
            index: 3,
            addr: 0x1000
        })
    );
    assert!(
        e.to_string()
            .starts_with("free_completed of address 0x1000, which is not live"),
        "{e}"
    );
    // Skipping, as PyTorch's replay script does: the same operations as `new`.
    let mut c = TraceCompiler::new().skip_unknown_frees(true);
    for (i, e) in events.iter().enumerate() {
        c.push(i, e).unwrap();
    }
    assert_eq!(c.finish().ops(), 2);
    assert_eq!(CompiledTrace::new(&events).ops(), 2);
}

/// An empty file says so, whatever its name, instead of "not gzip data" or a JSON parse error.
#[test]
fn an_empty_trace_file_is_called_empty() {
    let dir = std::env::temp_dir().join(format!("berth-empty-trace-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for name in ["t.json", "t.trace.json.gz"] {
        let path = dir.join(name);
        std::fs::write(&path, b"").unwrap();
        let e = read_trace(&path).unwrap_err();
        assert!(matches!(e, TraceError::EmptyFile), "{name}: {e:?}");
        assert!(
            e.to_string().starts_with("the file is empty (0 bytes)"),
            "{e}"
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_free_whose_size_or_stream_contradicts_its_alloc_is_refused_with_its_row() {
    // trace-free-size-mismatch.json and trace-free-other-stream.json (newcomer defect 11).
    let row = |action, size, stream| TraceEvent {
        action,
        addr: 4096,
        size,
        stream: berth_alloc::StreamId(stream),
        time_us: 0,
    };
    let size = [
        row(TraceAction::Alloc, 512, 0),
        row(TraceAction::FreeCompleted, 1024, 0),
    ];
    let e = CompiledTrace::try_new(&size).unwrap_err();
    assert_eq!(
        e,
        BadRow::FreeMismatch(FreeMismatch {
            index: 1,
            addr: 4096,
            alloc_index: 0,
            alloc_size: 512,
            free_size: 1024,
            alloc_stream: 0,
            free_stream: 0,
        })
    );
    assert_eq!(e.index(), 1);
    assert!(
        e.to_string().starts_with(
            "free_completed of address 0x1000 says 1024 bytes on stream 0, but its alloc (row #0) was 512 bytes on stream 0"
        ),
        "{e}"
    );
    let stream = [
        row(TraceAction::Alloc, 512, 0),
        row(TraceAction::FreeCompleted, 512, 7),
    ];
    let e = CompiledTrace::try_new(&stream).unwrap_err();
    assert!(
        matches!(
            e,
            BadRow::FreeMismatch(FreeMismatch {
                index: 1,
                alloc_stream: 0,
                free_stream: 7,
                ..
            })
        ),
        "{e:?}"
    );
    // Matching rows compile; skipping, the free is taken by its address.
    let ok = [
        row(TraceAction::Alloc, 512, 0),
        row(TraceAction::FreeCompleted, 512, 0),
    ];
    assert_eq!(CompiledTrace::try_new(&ok).unwrap().ops(), 2);
    assert_eq!(CompiledTrace::new(&size).ops(), 2);
}

#[test]
fn a_wide_row_or_columns_list_is_quoted_in_a_short_excerpt() {
    // trace-wide-row-*.json.gz and trace-huge-columns.json.gz (newcomer defect 3): one row of
    // 5·10⁷ cells was held whole (3.1 GB) and printed whole (a 100 MB error line). Scaled down.
    let mut json = br#"{"events": [["alloc", 1, 512, 0, 0, "#.to_vec();
    json.extend("0,".repeat(200_000).as_bytes());
    json.extend(b"0]]}");
    let e = parse_trace(&json).unwrap_err();
    let TraceError::Row { index: 0, message } = &e else {
        panic!("{e:?}")
    };
    assert!(
        message.starts_with(
            "expected [action, addr, size, stream, time_us], found [\"alloc\",1,512,0,0,0,0,"
        ),
        "{message}"
    );
    assert!(message.ends_with("… (200006 cells)"), "{message}");
    assert!(message.len() < 300, "{} bytes", message.len());

    let mut json = br#"{"columns": ["action","addr","size","stream","time_us""#.to_vec();
    json.extend(r#","x""#.repeat(100_000).as_bytes());
    json.extend(br#"], "events": []}"#);
    let e = parse_trace(&json).unwrap_err();
    let TraceError::Columns { found } = &e else {
        panic!("{e:?}")
    };
    assert_eq!(
        found,
        &[
            "action",
            "addr",
            "size",
            "stream",
            "time_us",
            "x",
            "… (100005 columns in all)"
        ]
    );
    assert!(e.to_string().len() < 300, "{e}");
}
