//! `berth replay` end to end: golden `--json` output on a checked-in trace (the first 150 rows
//! of `shared/traces/two_stream_pipeline`, two streams), one-line errors with status 2, and a
//! quiet end in a closed pipe.

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

fn data(file: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(file)
}

fn berth(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(args)
        .output()
        .expect("berth runs")
}

/// Drops the fields that depend on the machine (`ns_per_op`, the warm figure, and
/// `cold_ns_per_op`) after checking they are positive numbers.
fn normalize(line: &str) -> serde_json::Value {
    let mut v: serde_json::Value =
        serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
    for field in ["ns_per_op", "cold_ns_per_op"] {
        let ns = v
            .as_object_mut()
            .unwrap()
            .remove(field)
            .unwrap_or_else(|| panic!("{field} present"));
        assert!(
            ns.as_f64().is_some_and(|n| n > 0.0),
            "{field} {ns} is a positive number"
        );
    }
    v
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
    let golden = std::fs::read_to_string(data("small_two_stream.replay.jsonl")).unwrap();
    let want: Vec<serde_json::Value> = golden
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(got.len(), want.len(), "one line per policy");
    for (g, w) in got.iter().zip(&want) {
        assert_eq!(g, w, "\n got: {g}\nwant: {w}");
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
    let dir = std::env::temp_dir().join(format!("berth-replay-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("truncated.trace.json");
    let full = std::fs::read_to_string(data("small_two_stream.trace.json")).unwrap();
    std::fs::write(&bad, &full[..full.len() / 2]).unwrap();
    let out = berth(&["replay", "--json", bad.to_str().unwrap()]);
    std::fs::remove_dir_all(&dir).unwrap();
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
    let mut child = Command::new(env!("CARGO_BIN_EXE_berth"))
        .args([
            "replay",
            "--json",
            "--policy",
            "all",
            trace.to_str().unwrap(),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("berth runs");
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
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
