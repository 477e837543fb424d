//! `berth memviz` end to end: the page for PyTorch's real `_dump_snapshot` pickle is
//! self-contained (no URL anywhere) and embeds exactly the snapshot's segments, blocks and
//! trace; berth's own snapshot files (`dump_snapshot`, as `berth train --memory-snapshot` writes
//! them) load too; a large synthetic snapshot is downsampled to a bounded page; bad input gives
//! one-line errors with status 2.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use berth_alloc::backend::StreamId;
use berth_alloc::pickle::{dump_snapshot, load_snapshot, to_vec, PickleValue};
use berth_alloc::snapshot::{
    BlockInfo, BlockState, MemorySnapshot, SegmentInfo, SegmentType, TraceAction, TraceEntry,
};
use serde_json::Value;

mod common;
use common::TempDir;

/// PyTorch's own snapshot of a two-stream pipeline (`torch.cuda.memory._dump_snapshot`).
fn real_pickle() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../berth-alloc/tests/data/two_stream_pipeline.snapshot.pickle")
}

fn berth(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(args)
        .output()
        .expect("berth runs")
}

/// A fresh temporary folder for one test, removed when it drops.
fn temp_dir(test: &str) -> TempDir {
    TempDir::new(&format!("memviz-{test}"))
}

/// Runs `berth memviz SNAPSHOT -o OUT` and returns the page.
fn memviz(snapshot: &Path, out: &Path) -> String {
    let o = berth(&[
        "memviz",
        snapshot.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(
        o.status.success(),
        "berth memviz failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    std::fs::read_to_string(out).unwrap()
}

/// The JSON embedded in the page's `#memviz-data` element.
fn embedded(html: &str) -> Value {
    let open = r#"<script type="application/json" id="memviz-data">"#;
    let start = html.find(open).expect("the data element") + open.len();
    let len = html[start..]
        .find("</script>")
        .expect("the data element ends");
    serde_json::from_str(&html[start..start + len]).expect("the embedded data is JSON")
}

/// Checks what a browser needs to load the page: one document, the placeholders filled, every
/// script element closed, and nothing fetched from anywhere.
fn assert_self_contained(html: &str) {
    assert!(html.starts_with("<!DOCTYPE html>"), "no doctype");
    assert!(html.trim_end().ends_with("</html>"), "the page is cut off");
    assert!(
        !html.contains("http://") && !html.contains("https://"),
        "a URL in the page"
    );
    assert!(
        !html.contains("/*BERTH_MEMVIZ_"),
        "a placeholder was not filled"
    );
    assert_eq!(
        html.matches("<script").count(),
        2,
        "one data and one code script"
    );
    assert_eq!(html.matches("</script>").count(), 2);
    for external in ["<script src", "<link", "@import", "url(", "<iframe", "<img"] {
        assert!(
            !html.contains(external),
            "the page loads something: {external}"
        );
    }
    assert_eq!(
        html.matches("<canvas").count(),
        3,
        "timeline, its overlay, segments"
    );
}

fn u64_at(v: &Value, key: &str) -> u64 {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{key} is not a u64"))
}

#[test]
fn real_pickle_page_embeds_the_whole_snapshot() {
    let dir = temp_dir("real");
    let out = dir.join("out.html");
    let html = memviz(&real_pickle(), &out);
    assert_self_contained(&html);
    let data = embedded(&html);
    let snap = load_snapshot(&std::fs::read(real_pickle()).unwrap()).unwrap();

    let segs: Vec<&SegmentInfo> = snap.segments.iter().filter(|s| s.device == 0).collect();
    let blocks: usize = segs.iter().map(|s| s.blocks.len()).sum();
    let trace = &snap.device_traces[0];
    assert_eq!((segs.len(), blocks, trace.len()), (12, 16, 3350));
    let counts = &data["counts"];
    assert_eq!(u64_at(counts, "segments"), segs.len() as u64);
    assert_eq!(u64_at(counts, "blocks"), blocks as u64);
    assert_eq!(u64_at(counts, "trace_entries"), trace.len() as u64);
    assert_eq!(u64_at(&data, "reserved_bytes"), snap.total_reserved());

    // The segment view: every segment, with every block (none is under a pixel here).
    let rows = data["segments"].as_array().unwrap();
    assert_eq!(rows.len(), segs.len());
    let mut by_addr = segs.clone();
    by_addr.sort_by_key(|s| s.address);
    for (row, seg) in rows.iter().zip(&by_addr) {
        assert_eq!(row["addr"], format!("0x{:x}", seg.address));
        assert_eq!(u64_at(row, "size"), seg.total_size);
        let entries = row["blocks"].as_array().unwrap();
        assert_eq!(entries.len(), seg.blocks.len());
        for (e, b) in entries.iter().zip(&seg.blocks) {
            let e: Vec<u64> = e
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap())
                .collect();
            let state = match b.state {
                BlockState::ActiveAllocated => 0,
                BlockState::ActivePendingFree => 1,
                BlockState::Inactive => 2,
            };
            assert_eq!(
                e,
                vec![b.address - seg.address, b.size, b.requested_size, state, 1]
            );
        }
    }

    // The timeline: one step per alloc and free_completed, one block per alloc (every block
    // live at the snapshot was allocated in the trace).
    let count = |a: TraceAction| trace.iter().filter(|e| e.action == a).count() as u64;
    let tl = &data["timeline"];
    let allocs = count(TraceAction::Alloc);
    assert_eq!(
        u64_at(tl, "steps"),
        allocs + count(TraceAction::FreeCompleted)
    );
    assert_eq!(u64_at(tl, "blocks"), allocs);
    // The peak and the final allocated bytes, replayed here independently.
    let (mut live, mut peak) = (0i64, 0i64);
    for e in trace {
        match e.action {
            TraceAction::Alloc => live += e.size as i64,
            TraceAction::FreeCompleted => live -= e.size as i64,
            _ => {}
        }
        peak = peak.max(live);
    }
    assert_eq!(u64_at(tl, "peak_bytes"), peak as u64);
    let cols = &tl["columns"];
    let alloc_max: Vec<u64> = serde_json::from_value(cols["alloc_max"].clone()).unwrap();
    let alloc_end: Vec<u64> = serde_json::from_value(cols["alloc_end"].clone()).unwrap();
    assert_eq!(alloc_max.len(), 2048, "2226 steps fall into 2048 columns");
    assert_eq!(alloc_max.iter().max(), Some(&(peak as u64)));
    assert_eq!(alloc_end.last(), Some(&(live as u64)));
    let reserved_max: Vec<u64> = serde_json::from_value(cols["reserved_max"].clone()).unwrap();
    assert_eq!(reserved_max.last(), Some(&snap.total_reserved()));
    // Every drawn block lies inside the allocated area of each of its columns.
    let bands = tl["bands"].as_array().unwrap();
    assert!(!bands.is_empty());
    for b in bands {
        let (x0, x1, size) = (u64_at(b, "x0"), u64_at(b, "x1"), u64_at(b, "size"));
        assert!(x0 < x1 && x1 <= 2048, "{b}");
        let p: Vec<u64> = serde_json::from_value(b["points"].clone()).unwrap();
        assert_eq!(p[0], x0);
        for k in 0..p.len() / 2 {
            let (col, off) = (p[2 * k], p[2 * k + 1]);
            assert!(col < x1 && (k == 0 || col > p[2 * k - 2]), "{b}");
            assert!(
                off + size <= alloc_max[col as usize],
                "{b} above the allocated bytes"
            );
        }
    }
}

fn seg(device: i32, address: u64, blocks: &[(u64, BlockState)]) -> SegmentInfo {
    let mut at = address;
    let blocks: Vec<BlockInfo> = blocks
        .iter()
        .map(|&(size, state)| {
            let b = BlockInfo {
                address: at,
                size,
                requested_size: size,
                state,
            };
            at += size;
            b
        })
        .collect();
    let allocated = blocks
        .iter()
        .filter(|b| b.state == BlockState::ActiveAllocated)
        .map(|b| b.size)
        .sum();
    SegmentInfo {
        device,
        address,
        total_size: at - address,
        allocated_size: allocated,
        active_size: allocated,
        requested_size: allocated,
        stream: StreamId(0),
        segment_type: SegmentType::Large,
        segment_pool_id: (0, 0),
        is_expandable: false,
        blocks,
    }
}

fn entry(action: TraceAction, addr: u64, size: u64, time_us: i64) -> TraceEntry {
    TraceEntry {
        action,
        addr,
        size,
        stream: StreamId(0),
        time_us,
    }
}

#[test]
fn berth_snapshot_without_history_shows_its_live_blocks() {
    // As `berth train --memory-snapshot` writes it, here for device 1 only and without trace
    // entries: the live blocks are the timeline's one step.
    let mib = 1 << 20;
    let snap = MemorySnapshot {
        segments: vec![seg(
            1,
            0x7f00_0000_0000,
            &[
                (4 * mib, BlockState::ActiveAllocated),
                (2 * mib, BlockState::Inactive),
                (2 * mib, BlockState::ActiveAllocated),
            ],
        )],
        device_traces: vec![vec![], vec![]],
        ..MemorySnapshot::default()
    };
    let dir = temp_dir("berth");
    let (input, out) = (dir.join("berth.pickle"), dir.join("out.html"));
    std::fs::write(&input, dump_snapshot(&snap)).unwrap();
    let html = memviz(&input, &out);
    assert_self_contained(&html);
    let data = embedded(&html);
    assert_eq!(u64_at(&data, "device"), 1);
    assert_eq!(u64_at(&data["counts"], "trace_entries"), 0);
    let tl = &data["timeline"];
    assert_eq!(u64_at(tl, "steps"), 1);
    assert_eq!(u64_at(tl, "blocks"), 2);
    assert_eq!(u64_at(tl, "peak_bytes"), 6 * mib);
    assert_eq!(tl["bands"].as_array().unwrap().len(), 2);
    assert!(html.contains("The snapshot holds no trace entries"));
}

/// A deterministic pseudo-random stream (an LCG), so the test needs no crate.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 33
    }
}

#[test]
fn large_snapshot_is_downsampled_to_a_bounded_page() {
    // 600,000 trace entries: 800 blocks of 0.5-1.5 MiB live at once, each step freeing a random
    // one (which moves every block above it) and allocating another; plus a segment of
    // 200,000 blocks. Drawn as is, that would be hundreds of millions of vertices.
    let mib = 1u64 << 20;
    let mut rng = Lcg(7);
    let mut trace = Vec::new();
    let mut live: Vec<(u64, u64)> = Vec::new();
    let mut next_addr = 0x7000_0000_0000u64;
    let mut t = 1_000_000i64;
    while trace.len() < 600_000 {
        t += 1 + (rng.next() % 50) as i64;
        if live.len() < 800 {
            let size = mib / 2 + rng.next() % mib;
            trace.push(entry(TraceAction::Alloc, next_addr, size, t));
            live.push((next_addr, size));
            next_addr += 2 * mib;
        } else {
            let (addr, size) = live.swap_remove((rng.next() as usize) % live.len());
            trace.push(entry(TraceAction::FreeRequested, addr, size, t));
            trace.push(entry(TraceAction::FreeCompleted, addr, size, t + 1));
        }
    }
    let n_trace = trace.len();
    let small: Vec<(u64, BlockState)> = (0..200_000)
        .map(|i| {
            let state = if i % 3 == 0 {
                BlockState::ActiveAllocated
            } else {
                BlockState::Inactive
            };
            (512, state)
        })
        .collect();
    let snap = MemorySnapshot {
        segments: vec![seg(0, 0x1000_0000_0000, &small)],
        device_traces: vec![trace],
        ..MemorySnapshot::default()
    };
    let dir = temp_dir("large");
    let (input, out) = (dir.join("large.pickle"), dir.join("out.html"));
    std::fs::write(&input, dump_snapshot(&snap)).unwrap();
    let html = memviz(&input, &out);
    assert_self_contained(&html);
    eprintln!(
        "the page for {n_trace} trace entries is {} bytes",
        html.len()
    );
    assert!(
        html.len() < 8 << 20,
        "the page is {} bytes; the bound is 8 MiB",
        html.len()
    );
    let data = embedded(&html);
    assert_eq!(u64_at(&data["counts"], "trace_entries"), n_trace as u64);
    assert_eq!(u64_at(&data["counts"], "blocks"), 200_000);
    let tl = &data["timeline"];
    assert_eq!(tl["columns"]["alloc_max"].as_array().unwrap().len(), 2048);
    let bands = tl["bands"].as_array().unwrap();
    let vertices: usize = bands
        .iter()
        .map(|b| b["points"].as_array().unwrap().len() / 2 + 1)
        .sum();
    assert!(bands.len() <= 10_000, "{} bands", bands.len());
    assert!(vertices <= 200_000, "{vertices} vertices");
    assert!(
        u64_at(tl, "visible_blocks") > bands.len() as u64,
        "the vertex budget should have dropped some blocks"
    );
    // The segment's 200,000 blocks of 512 bytes are merged into pixel-wide runs.
    let row = &data["segments"][0];
    assert_eq!(u64_at(row, "block_count"), 200_000);
    let entries = row["blocks"].as_array().unwrap();
    assert!(entries.len() <= 2 * 1024 + 1, "{} entries", entries.len());
    let merged: u64 = entries.iter().map(|e| e[4].as_u64().unwrap()).sum();
    assert_eq!(merged, 200_000, "every block is in one entry");
}

/// Runs `berth memviz` expecting failure; returns (status, stderr).
fn fails(args: &[&str]) -> (i32, String) {
    let o = berth(args);
    assert!(!o.status.success(), "berth {args:?} succeeded");
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    (o.status.code().unwrap_or(-1), err)
}

#[test]
fn bad_input_is_a_one_line_error() {
    let dir = temp_dir("bad");
    let out = dir.join("out.html");
    let out_s = out.to_str().unwrap();
    let path = |name: &str| dir.join(name).to_str().unwrap().to_owned();

    let (code, err) = fails(&["memviz", &path("missing.pickle"), "-o", out_s]);
    assert_eq!(code, 2);
    assert!(
        err.contains("cannot read snapshot") && err.contains("missing.pickle"),
        "{err}"
    );

    std::fs::write(path("notes.txt"), "not a pickle\n").unwrap();
    let (code, err) = fails(&["memviz", &path("notes.txt"), "-o", out_s]);
    assert_eq!(code, 2);
    assert!(err.contains("not a memory snapshot"), "{err}");

    // An allocator trace, gzip or plain JSON: pointed at `berth replay`.
    let trace = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../berth-alloc/tests/data/gpt2_generate.trace.json.gz");
    let (code, err) = fails(&["memviz", trace.to_str().unwrap(), "-o", out_s]);
    assert_eq!(code, 2);
    assert!(
        err.contains("this is gzip data, such as an allocator trace that `berth replay` reads"),
        "{err}"
    );
    std::fs::write(path("t.json"), "{\"events\": []}").unwrap();
    let (code, err) = fails(&["memviz", &path("t.json"), "-o", out_s]);
    assert_eq!(code, 2);
    assert!(
        err.contains("this is JSON, such as an allocator trace"),
        "{err}"
    );

    // A valid pickle of something else.
    let list = to_vec(&PickleValue::List(vec![PickleValue::Int(1)]));
    std::fs::write(path("list.pickle"), list).unwrap();
    let (code, err) = fails(&["memviz", &path("list.pickle"), "-o", out_s]);
    assert_eq!(code, 2);
    assert!(err.contains("not a memory snapshot"), "{err}");

    // A truncated snapshot.
    let bytes = std::fs::read(real_pickle()).unwrap();
    std::fs::write(path("cut.pickle"), &bytes[..bytes.len() / 2]).unwrap();
    let (code, err) = fails(&["memviz", &path("cut.pickle"), "-o", out_s]);
    assert_eq!(code, 2);
    assert!(err.contains("truncated"), "{err}");

    let empty = MemorySnapshot {
        device_traces: vec![vec![]],
        ..MemorySnapshot::default()
    };
    std::fs::write(path("empty.pickle"), dump_snapshot(&empty)).unwrap();
    let (code, err) = fails(&["memviz", &path("empty.pickle"), "-o", out_s]);
    assert_eq!(code, 2);
    assert!(err.contains("the snapshot is empty"), "{err}");

    let real = real_pickle();
    let real_s = real.to_str().unwrap();
    let (code, err) = fails(&["memviz", real_s, "-o", out_s, "--device", "3"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("--device 3") && err.contains("device 0"),
        "{err}"
    );
    assert!(!out.exists(), "no page is written on error");
    // `cuda:N`, as the other subcommands spell a device, names the same device.
    let (code, err) = fails(&["memviz", real_s, "-o", out_s, "--device", "cuda:3"]);
    assert_eq!(code, 2);
    assert!(err.contains("--device 3"), "{err}");

    // `-o` is the snapshot: refused, and the snapshot is kept.
    std::fs::write(path("keep.pickle"), &bytes).unwrap();
    let (code, err) = fails(&["memviz", &path("keep.pickle"), "-o", &path("keep.pickle")]);
    assert_eq!(code, 2);
    assert!(err.contains("that is the snapshot itself"), "{err}");
    assert_eq!(std::fs::read(path("keep.pickle")).unwrap(), bytes);
    // So is a hard link to it (another path, the same file).
    std::fs::hard_link(path("keep.pickle"), path("link.html")).unwrap();
    let (code, err) = fails(&["memviz", &path("keep.pickle"), "-o", &path("link.html")]);
    assert_eq!(code, 2);
    assert!(err.contains("that is the snapshot itself"), "{err}");
    assert_eq!(std::fs::read(path("keep.pickle")).unwrap(), bytes);

    // The output cannot be written: a failure (1), not bad input.
    let (code, err) = fails(&["memviz", real_s, "-o", dir.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(err.contains("cannot write"), "{err}");
}

/// Newcomer defects 16 and 17: a segment on a negative device was dropped (and the snapshot
/// called "empty"), and a segment or block reaching past 2^64 passed silently. Both are now a
/// one-line error saying the snapshot is damaged and naming the segment.
#[test]
fn damaged_snapshots_are_named_damaged_not_empty() {
    let dir = temp_dir("damaged");
    let out = dir.join("out.html");
    let write = |name: &str, segments: Vec<SegmentInfo>| {
        let snap = MemorySnapshot {
            segments,
            ..MemorySnapshot::default()
        };
        let p = dir.join(name);
        std::fs::write(&p, dump_snapshot(&snap)).unwrap();
        p
    };
    let neg = write(
        "neg.pickle",
        vec![seg(-1, 4096, &[(512, BlockState::ActiveAllocated)])],
    );
    let (code, err) = fails(&["memviz", neg.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(
        err.contains("the snapshot is damaged: segment 0x1000 is on device -1")
            && !err.contains("empty"),
        "{err}"
    );
    let mut huge = seg(0, u64::MAX - 4095, &[(512, BlockState::ActiveAllocated)]);
    huge.total_size = u64::MAX;
    let huge = write("huge.pickle", vec![huge]);
    let (code, err) = fails(&[
        "memviz",
        huge.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, 2);
    assert!(
        err.contains(&format!(
            "segment 0x{:x} of {} bytes ends past 2^64",
            u64::MAX - 4095,
            u64::MAX
        )),
        "{err}"
    );
}

/// Issue 32, item 4 (second half): berth's snapshot files say whether history was being
/// recorded, so memviz tells "nothing was allocated" from "history was not recorded".
#[test]
fn memviz_says_whether_history_was_recorded() {
    use berth_alloc::pickle::dump_snapshot_with_history;
    let dir = temp_dir("history");
    let out = dir.join("out.html");
    let empty = MemorySnapshot::default();
    for (recorded, want) in [
        (true, "history was being recorded, so nothing was allocated"),
        (
            false,
            "history was not being recorded, so the empty trace says nothing",
        ),
    ] {
        let p = dir.join(format!("empty-{recorded}.pickle"));
        std::fs::write(&p, dump_snapshot_with_history(&empty, recorded)).unwrap();
        let (code, err) = fails(&["memviz", p.to_str().unwrap(), "-o", out.to_str().unwrap()]);
        assert_eq!(code, 2);
        assert!(err.contains(want), "{err}");
    }
    let live = MemorySnapshot {
        segments: vec![seg(0, 1 << 20, &[(512, BlockState::ActiveAllocated)])],
        ..MemorySnapshot::default()
    };
    let p = dir.join("live.pickle");
    std::fs::write(&p, dump_snapshot_with_history(&live, false)).unwrap();
    let o = berth(&["memviz", p.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("; history was not recorded"), "{stdout}");
    let html = std::fs::read_to_string(&out).unwrap();
    assert_eq!(embedded(&html)["history_recorded"], Value::Bool(false));
}

/// Issue 32, item 4: the page itself says, under its title and without JavaScript, whether
/// allocation history was being recorded when the snapshot was taken (yes, no, or unknown for
/// a snapshot without berth's `berth_history_recorded` key, as PyTorch's are), so an empty
/// timeline is not read as "no allocations".
#[test]
fn the_page_states_whether_history_was_recorded() {
    use berth_alloc::pickle::dump_snapshot_with_history;
    let dir = temp_dir("history-page");
    let live = MemorySnapshot {
        segments: vec![seg(0, 1 << 20, &[(512, BlockState::ActiveAllocated)])],
        ..MemorySnapshot::default()
    };
    let cases = [
        (
            Some(true),
            r#"<p id="history" class="history yes">Allocation history: <strong>recorded</strong>."#,
        ),
        (
            Some(false),
            r#"<p id="history" class="history no">Allocation history: <strong>not recorded</strong>."#,
        ),
        (
            None,
            r#"<p id="history" class="history unknown">Allocation history: <strong>unknown</strong>."#,
        ),
    ];
    for (recorded, want) in cases {
        let p = dir.join(format!("live-{recorded:?}.pickle"));
        let bytes = match recorded {
            Some(r) => dump_snapshot_with_history(&live, r),
            None => dump_snapshot(&live),
        };
        std::fs::write(&p, bytes).unwrap();
        let out = dir.join(format!("live-{recorded:?}.html"));
        let html = memviz(&p, &out);
        assert_self_contained(&html);
        let at = html
            .find(want)
            .unwrap_or_else(|| panic!("{recorded:?}: {want}"));
        assert_eq!(html.matches(r#"id="history""#).count(), 1);
        // Near the top: in the header, before the first view.
        let first_view = html.find(r#"<section id="timeline-section">"#).unwrap();
        assert!(at < first_view && html[..at].contains("<header>"));
        assert_eq!(
            embedded(&html)["history_recorded"],
            recorded.map_or(Value::Null, Value::Bool)
        );
    }
    // PyTorch's own snapshot file is the unknown case.
    let out = dir.join("real.html");
    let html = memviz(&real_pickle(), &out);
    assert!(html.contains(r#"class="history unknown""#));
    assert!(html.contains("may mean that history was off, not that nothing was allocated"));
}
