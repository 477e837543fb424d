//! `berth bench` end to end, without a GPU: option errors (one line, status 2, before any
//! work) and a quiet end in a closed pipe.

use std::process::{Command, Output, Stdio};

fn berth(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(args)
        .output()
        .expect("berth runs")
}

fn assert_usage_error(args: &[&str], message: &str) {
    let out = berth(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    assert_eq!(err, format!("berth: error: {message}\n"), "{args:?}");
}

#[test]
fn zero_reps_are_refused_not_raised_to_one() {
    for bench in ["transfers", "alloc", "overlap", "sync"] {
        assert_usage_error(
            &["bench", bench, "--reps", "0"],
            "--reps 0: the number of repetitions must be at least 1 (e.g. --reps 10)",
        );
    }
}

#[test]
fn dataloader_workers_are_capped() {
    let out = berth(&[
        "bench",
        "dataloader",
        "--samples",
        "64",
        "--features",
        "4",
        "--workers",
        "1,5000",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.starts_with(
            "berth: error: --workers 5000: at most 1024 worker threads are allowed (this machine has "
        ),
        "{err}"
    );
    assert!(out.stdout.is_empty(), "checked before any figure");
}

#[test]
fn dataloader_bench_into_a_closed_pipe_ends_quietly() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_berth"))
        .args([
            "bench",
            "dataloader",
            "--samples",
            "256",
            "--features",
            "4",
            "--workers",
            "0",
            "--epochs",
            "1",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("berth runs");
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert_ne!(out.status.code(), Some(101), "{err}");
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(out.status.signal(), Some(13), "ended by SIGPIPE: {err}");
    }
}
