//! `berth replay` end to end: golden `--json` output on a checked-in trace (the first 150 rows
//! of the real trace `two_stream_pipeline`, two streams), one-line errors with status 2, PyTorch's
//! reference figures only for the reference traces themselves, PyTorch's recorded figures for
//! any trace that carries them, bytes with units, and a quiet end in a closed pipe.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

mod common;
use common::{normalize, trace_file, TempDir};

fn data(file: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(file)
}

fn berth(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(args)
        // The golden figures are PyTorch's default policy's: a BERTH_ALLOC_CONF in the
        // environment would tune it.
        .env_remove("BERTH_ALLOC_CONF")
        .output()
        .expect("berth runs")
}

/// A fresh temporary folder for one test, removed when it drops.
fn temp_dir(test: &str) -> TempDir {
    TempDir::new(&format!("replay-{test}"))
}

/// The table's trace headings: the lines followed by the column header.
fn headings(table: &str) -> Vec<&str> {
    let lines: Vec<&str> = table.lines().collect();
    lines
        .windows(2)
        .filter(|w| w[1].starts_with("policy "))
        .map(|w| w[0])
        .collect()
}

/// The golden `--json` lines of `small_two_stream.trace.json`, one per policy.
fn golden() -> Vec<serde_json::Value> {
    std::fs::read_to_string(data("small_two_stream.replay.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn replay_json_matches_golden() {
    let trace = data("small_two_stream.trace.json");
    let out = berth(&[
        "replay",
        "--policy",
        "all",
        "--json",
        trace.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.stderr.is_empty(),
        "no progress bar with --json: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got: Vec<serde_json::Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(normalize)
        .collect();
    let want = golden();
    assert_eq!(got.len(), want.len(), "one line per policy");
    for (g, w) in got.iter().zip(&want) {
        assert_eq!(g, w, "\n got: {g}\nwant: {w}");
    }
}

/// A trace read from a pipe (`/dev/stdin`), plain and gzip-compressed, gives the golden
/// figures: a stream is read once, not sniffed and reopened.
#[test]
fn replay_reads_a_trace_from_a_pipe() {
    use std::io::Write;
    let plain = std::fs::read(data("small_two_stream.trace.json")).unwrap();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&plain).unwrap();
    let want = golden();
    for input in [plain, gz.finish().unwrap()] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_berth"))
            .args(["replay", "--policy", "all", "--json", "/dev/stdin"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("berth runs");
        let mut stdin = child.stdin.take().unwrap();
        let writer = std::thread::spawn(move || stdin.write_all(&input));
        let out = child.wait_with_output().unwrap();
        writer.join().unwrap().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "stderr: {err}");
        let got: Vec<serde_json::Value> = String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(normalize)
            .collect();
        assert_eq!(got.len(), want.len(), "one line per policy");
        for (mut g, mut w) in got.into_iter().zip(want.iter().cloned()) {
            // The trace is named after the path it was read from.
            assert_eq!(g["trace"], "stdin");
            g["trace"] = serde_json::Value::Null;
            w["trace"] = serde_json::Value::Null;
            assert_eq!(g, w);
        }
    }
}

#[test]
fn replay_missing_file_is_one_line_status_2() {
    let out = berth(&["replay", "/nonexistent/trace.json.gz"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8(out.stderr).unwrap();
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("cannot read trace /nonexistent/trace.json.gz"),
        "{err}"
    );
}

#[test]
fn replay_malformed_trace_names_the_position() {
    let dir = temp_dir("truncated");
    let bad = dir.join("truncated.trace.json");
    let full = std::fs::read_to_string(data("small_two_stream.trace.json")).unwrap();
    std::fs::write(&bad, &full[..full.len() / 2]).unwrap();
    let out = berth(&["replay", "--json", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8(out.stderr).unwrap();
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("line 1, column"), "{err}");
}

#[test]
fn replay_bad_flags_are_status_2() {
    let trace = data("small_two_stream.trace.json");
    for args in [["--policy", "fastest"], ["--capacity", "80GB"]] {
        let out = berth(&["replay", args[0], args[1], trace.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(
            String::from_utf8(out.stderr).unwrap().contains(args[1]),
            "{args:?} named"
        );
    }
}

#[test]
fn replay_device_messages_do_not_contradict_themselves() {
    let trace = data("small_two_stream.trace.json");
    let out = berth(&["replay", "--device", "sim:0", trace.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        String::from_utf8(out.stderr).unwrap(),
        "berth: error: --device sim:0: the simulated device takes no index; use --device sim, or cuda:N for a GPU\n"
    );
    // A name replay cannot run on gets the two it can, not the whole device grammar.
    for device in ["tpu", "gpu"] {
        let out = berth(&["replay", "--device", device, trace.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(2));
        assert_eq!(
            String::from_utf8(out.stderr).unwrap(),
            format!("berth: error: --device {device}: replay runs on sim (the simulated device, the default) or cuda:N (a GPU, e.g. cuda:0)\n")
        );
    }
}

#[test]
fn replay_table_shows_pytorch_figures_for_known_traces() {
    let trace = data("small_two_stream.trace.json");
    let out = berth(&["replay", "--policy", "paged", trace.to_str().unwrap()]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.starts_with("small_two_stream\npolicy"), "{text}");
    assert!(text.contains("paged"), "{text}");
    assert!(
        !text.contains("torch default"),
        "no PyTorch figures for an unknown trace: {text}"
    );
}

#[test]
fn replay_into_a_closed_pipe_ends_quietly() {
    // `berth replay --json ... | head -1`: the reader is gone before berth writes.
    let trace = data("small_two_stream.trace.json");
    let out = common::berth_into_closed_pipe(&[
        "replay",
        "--json",
        "--policy",
        "all",
        trace.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert!(err.is_empty(), "no message at all: {err}");
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            out.status.signal(),
            Some(13),
            "ended by SIGPIPE: {:?}",
            out.status
        );
    }
}

#[test]
fn replay_sim_only_flags_are_refused_with_cuda() {
    let trace = data("small_two_stream.trace.json");
    for (flags, text) in [
        (
            &["--capacity", "1GiB"][..],
            "--capacity applies to the simulated device only (--device sim), not --device cuda:0",
        ),
        (
            &["--real-addrs"][..],
            "--real-addrs applies to the simulated device only (--device sim), not --device cuda:0",
        ),
        (
            &["--capacity", "1GiB", "--real-addrs"][..],
            "--capacity and --real-addrs apply to the simulated device only (--device sim), not --device cuda:0, which replays in the GPU's own memory at the driver's addresses",
        ),
    ] {
        let mut args = vec!["replay", "--device", "cuda:0"];
        args.extend_from_slice(flags);
        args.push(trace.to_str().unwrap());
        let out = berth(&args);
        let err = String::from_utf8(out.stderr).unwrap();
        assert_eq!(out.status.code(), Some(2), "{flags:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains(text), "{flags:?}: {err}");
    }
    let help = String::from_utf8(berth(&["replay", "--help"]).stdout).unwrap();
    assert_eq!(
        help.matches("Only with `--device sim`").count(),
        2,
        "{help}"
    );
}

#[test]
fn replay_out_of_memory_message_is_printed_once() {
    let trace = data("small_two_stream.trace.json");
    let out = berth(&[
        "replay",
        "--capacity",
        "128MiB",
        "--policy",
        "pytorch",
        trace.to_str().unwrap(),
    ]);
    let err = String::from_utf8(out.stderr).unwrap();
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with(
            "berth: error: replaying small_two_stream with policy pytorch: replay stopped at trace event #12"
        ),
        "{err}"
    );
    assert_eq!(err.matches("CUDA out of memory").count(), 1, "{err}");
    assert_eq!(err.matches("Tried to allocate").count(), 1, "{err}");
}

#[test]
fn pytorch_figures_need_the_reference_content_not_just_its_name() {
    let dir = temp_dir("renamed");
    let renamed = dir.join("gpt2_train.trace.json");
    std::fs::copy(data("small_two_stream.trace.json"), &renamed).unwrap();
    let table = berth(&["replay", "--policy", "paged", renamed.to_str().unwrap()]);
    let json = berth(&[
        "replay",
        "--json",
        "--policy",
        "paged",
        renamed.to_str().unwrap(),
    ]);
    let note_start = "(the file name matches PyTorch's reference trace gpt2_train, but its content does not: peak requested ";
    let note_end =
        " bytes), the reference's 8.07 GiB (8668539912 bytes); its replay figures are not shown)";

    assert!(table.status.success());
    let text = String::from_utf8(table.stdout).unwrap();
    assert!(!text.contains("torch default"), "{text}");
    let note = text.lines().last().unwrap();
    assert!(
        note.starts_with(note_start) && note.ends_with(note_end),
        "{text}"
    );

    assert!(json.status.success());
    let line = String::from_utf8(json.stdout).unwrap();
    let v = normalize(line.trim_end());
    assert_eq!(v["trace"], "gpt2_train");
    assert!(v.get("torch_peak_reserved").is_none(), "{v}");
    assert!(v.get("torch_segments").is_none(), "{v}");
    let err = String::from_utf8(json.stderr).unwrap();
    assert!(
        err.starts_with("berth: note: gpt2_train: ") && err.contains(note_end),
        "{err}"
    );
}

#[test]
fn pytorch_figures_are_shown_for_the_reference_traces() {
    let shared = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/traces");
    let trace = shared.join("two_stream_pipeline.trace.json.gz");
    if !trace.exists() {
        eprintln!("skipping: {} not found", trace.display());
        return;
    }
    let out = berth(&["replay", "--policy", "paged", trace.to_str().unwrap()]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("\ntorch default   "), "{text}");
    assert!(!text.contains("content does not"), "{text}");
}

#[test]
fn traces_sharing_a_name_get_distinct_headings() {
    let dir = temp_dir("same-stem");
    let (a, b) = (dir.join("a"), dir.join("b"));
    std::fs::create_dir_all(&a).unwrap();
    std::fs::create_dir_all(&b).unwrap();
    let full = std::fs::read_to_string(data("small_two_stream.trace.json")).unwrap();
    let a = a.join("run.trace.json");
    let b = b.join("run.trace.json");
    std::fs::write(&a, &full).unwrap();
    // A different trace under the same file name: the first 3 rows only.
    let mut v: serde_json::Value = serde_json::from_str(&full).unwrap();
    v["events"].as_array_mut().unwrap().truncate(3);
    std::fs::write(&b, v.to_string()).unwrap();
    let other = data("small_two_stream.trace.json");
    let out = berth(&[
        "replay",
        "--policy",
        "paged",
        a.to_str().unwrap(),
        b.to_str().unwrap(),
        other.to_str().unwrap(),
    ]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(
        headings(&text),
        [a.to_str().unwrap(), b.to_str().unwrap(), "small_two_stream"],
        "{text}"
    );
}

/// The `shared/traces` copy checked in under berth-alloc's test data: a published trace with
/// PyTorch's `stats`.
fn two_stream_pipeline() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../berth-alloc/tests/data/two_stream_pipeline.trace.json.gz")
}

#[test]
fn replay_table_prints_bytes_with_units_and_json_keeps_exact_bytes() {
    let trace = data("small_two_stream.trace.json");
    let out = berth(&["replay", "--policy", "pytorch", trace.to_str().unwrap()]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let row = text.lines().find(|l| l.starts_with("pytorch ")).unwrap();
    // 260349764 and 352321536 bytes, as PyTorch's format_size prints them.
    assert!(
        row.contains(" 248.29 MiB ") && row.contains(" 336.00 MiB "),
        "{text}"
    );
    assert!(
        !text.contains("260349764") && !text.contains("352321536"),
        "{text}"
    );
    // The golden test checks the exact counts of --json.
}

#[test]
fn the_long_note_about_pytorchs_rows_is_printed_once() {
    let trace = two_stream_pipeline();
    let t = trace.to_str().unwrap();
    let out = berth(&["replay", "--policy", "paged", t, t]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(text.matches("\ntorch default ").count(), 2, "{text}");
    assert_eq!(
        text.matches("PyTorch's torch-default row is its live run")
            .count(),
        1,
        "{text}"
    );
    assert!(
        text.trim_end()
            .ends_with("which also replays on one stream)"),
        "the note comes last: {text}"
    );
}

#[test]
fn pytorchs_recorded_figures_are_shown_for_any_trace_that_carries_them() {
    // The published trace under another name: no reference figures, but its own `stats`.
    let dir = temp_dir("recorded");
    let mine = dir.join("my_run.trace.json.gz");
    std::fs::copy(two_stream_pipeline(), &mine).unwrap();
    let table = berth(&["replay", "--policy", "pytorch", mine.to_str().unwrap()]);
    let json = berth(&[
        "replay",
        "--json",
        "--policy",
        "pytorch",
        mine.to_str().unwrap(),
    ]);
    assert!(table.status.success());
    let text = String::from_utf8(table.stdout).unwrap();
    assert!(!text.contains("torch default"), "{text}");
    // stats: requested_bytes.all.peak 268738372, reserved_bytes.all.peak 354418688,
    // num_device_alloc 12.
    let row = text
        .lines()
        .find(|l| l.starts_with("torch (recorded) "))
        .unwrap_or_else(|| panic!("a recorded row: {text}"));
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(
        cells,
        [
            "torch",
            "(recorded)",
            "-",
            "256.29",
            "MiB",
            "338.00",
            "MiB",
            "1.3188x",
            "12",
            "-",
            "-"
        ],
        "{text}"
    );
    assert_eq!(
        text.matches("torch (recorded): PyTorch's own figures")
            .count(),
        1
    );
    let v = normalize(String::from_utf8(json.stdout).unwrap().trim_end());
    assert_eq!(
        v["torch_recorded"],
        serde_json::json!({"peak_requested": 268738372u64, "peak_reserved": 354418688u64, "segments": 12, "alloc_conf": ""})
    );
    // The pytorch policy reproduces the live run.
    assert_eq!(v["peak_reserved"], 354418688u64);
}

#[test]
fn a_free_of_an_address_that_is_not_live_is_refused_naming_event_and_address() {
    let (_dir, path) = trace_file(
        "unknown-free",
        "t.json",
        r#"{"events": [["alloc", 4096, 512, 0, 0], ["free_completed", 8192, 512, 0, 1], ["free_completed", 4096, 512, 0, 2]]}"#,
    );
    let p = path.to_str().unwrap();
    let refused = berth(&["replay", p]);
    let skipped = berth(&["replay", "--json", "--skip-unknown-frees", p]);
    let err = String::from_utf8(refused.stderr).unwrap();
    assert_eq!(refused.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains(": trace event #1: free_completed of address 0x2000, which is not live"),
        "{err}"
    );
    assert!(
        err.trim_end().ends_with(
            "or pass --skip-unknown-frees to skip such frees, as PyTorch's replay script does"
        ),
        "{err}"
    );
    assert!(skipped.status.success());
    let v = normalize(String::from_utf8(skipped.stdout).unwrap().trim_end());
    assert_eq!(v["ops"], 2, "the alloc and its free: {v}");
}

#[test]
fn an_empty_trace_has_no_ratio_instead_of_one() {
    let (_dir, path) = trace_file("empty", "empty.json", r#"{"events": []}"#);
    let p = path.to_str().unwrap();
    let table = berth(&["replay", "--policy", "all", p]);
    let json = berth(&["replay", "--json", "--policy", "paged", p]);
    assert!(table.status.success());
    let text = String::from_utf8(table.stdout).unwrap();
    assert!(!text.contains("1.0000x"), "{text}");
    let row = text.lines().find(|l| l.starts_with("paged ")).unwrap();
    assert_eq!(
        row.split_whitespace().collect::<Vec<_>>(),
        ["paged", "0", "0", "bytes", "0", "bytes", "n/a", "0", "0", "n/a"],
        "{text}"
    );
    assert_eq!(
        text.matches("(n/a: a trace that requests no bytes").count(),
        1,
        "{text}"
    );
    assert!(json.status.success());
    let v: serde_json::Value =
        serde_json::from_str(String::from_utf8(json.stdout).unwrap().trim_end()).unwrap();
    assert_eq!(
        (v["ratio"].is_null(), v["ns_per_op"].is_null()),
        (true, true),
        "{v}"
    );
    assert_eq!(v["peak_requested"], 0);
}

#[test]
fn random_bytes_named_pickle_are_not_called_malformed_json() {
    let dir = temp_dir("random-pickle");
    let path = dir.join("snapshot.pickle");
    std::fs::write(&path, [0x5a, 0x13, 0xc7, 0x00, 0xff, 0x42, 0x99]).unwrap();
    let out = berth(&["replay", path.to_str().unwrap()]);
    // Random bytes that do start with the protocol byte: the pickle reader's own error.
    std::fs::write(&path, [0x80, 0x04, 0xc7, 0x00, 0xff, 0x42, 0x99]).unwrap();
    let proto = berth(&["replay", path.to_str().unwrap()]);
    for out in [out, proto] {
        let err = String::from_utf8(out.stderr).unwrap();
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(!err.contains("JSON at line"), "{err}");
        assert!(
            err.contains("snapshot.pickle: not a valid PyTorch snapshot pickle: "),
            "{err}"
        );
    }
}

#[test]
fn random_bytes_named_pickle_say_what_would_be_right() {
    let (_dir, path) = trace_file("random-pickle-hint", "x.pickle", "Zz");
    let out = berth(&["replay", path.to_str().unwrap()]);
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.contains("it starts with byte 0x5a, not the pickle protocol byte 0x80 nor a protocol-0/1 pickle's first opcode; expected a snapshot written by torch.cuda.memory._dump_snapshot"),
        "{err}"
    );
}

#[test]
fn a_request_larger_than_the_device_fails_at_that_event_before_the_rest_is_read() {
    // Event 0 asks for 2^59 bytes (as in the 10-million-event reproducer), then the file is
    // cut off: the read stops at event 0, so the truncation is never reached.
    let (_dir, path) = trace_file(
        "huge",
        "huge.json",
        r#"{"events": [["alloc", 4096, 576460752303423488, 0, 0], ["alloc", 8192, 51"#,
    );
    let out = berth(&["replay", "--policy", "all", path.to_str().unwrap()]);
    let err = String::from_utf8(out.stderr).unwrap();
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("huge.json: trace event #0: alloc of 536870912.00 GiB (576460752303423488 bytes) is more than the whole simulated device (139.80 GiB), so no policy can replay it; pass a larger --capacity"),
        "{err}"
    );
}

/// With a `--capacity` that only some policies fit in, each policy that runs out of memory gets
/// a row saying where, the others still run, and the status is 1 with the error (one policy)
/// or a line naming the ones that did not fit (several).
#[test]
fn replay_reports_each_policy_that_runs_out_of_memory_and_runs_the_rest() {
    let trace = data("small_two_stream.trace.json");
    let out = berth(&[
        "replay",
        "--policy",
        "all",
        "--capacity",
        "300MiB",
        trace.to_str().unwrap(),
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.starts_with(
            "berth: error: replaying small_two_stream with policy pytorch: replay stopped at \
             trace event #108 (alloc of 67108864 bytes): CUDA out of memory."
        ),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    let row = |p: &str| {
        text.lines()
            .find(|l| l.starts_with(&format!("{p:<22} ")))
            .unwrap_or_else(|| panic!("no {p} row: {text}"))
            .to_owned()
    };
    assert!(
        row("pytorch").ends_with("out of memory at trace event #108 (alloc of 64.00 MiB)"),
        "{text}"
    );
    assert!(row("expandable").contains("284.00 MiB"), "{text}");
    assert!(row("paged").contains("264.00 MiB"), "{text}");

    let out = berth(&[
        "replay",
        "--policy",
        "all",
        "--capacity",
        "300MiB",
        "--json",
        trace.to_str().unwrap(),
    ]);
    let lines: Vec<serde_json::Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3);
    assert!(lines[0]["out_of_memory"].as_str().unwrap().starts_with(
        "replay stopped at trace event #108 (alloc of 67108864 bytes): CUDA out of memory."
    ));
    assert_eq!(lines[1]["peak_reserved"], 297_795_584);
    assert_eq!(lines[2]["peak_reserved"], 276_824_064);

    let out = berth(&[
        "replay",
        "--policy",
        "all",
        "--capacity",
        "270MiB",
        trace.to_str().unwrap(),
    ]);
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "berth: error: out of memory: pytorch on small_two_stream, expandable on \
         small_two_stream (the rows above say where; pass a larger --capacity: the default is an \
         H200's 139.8 GiB, the most 64 PiB)\n"
    );
}
