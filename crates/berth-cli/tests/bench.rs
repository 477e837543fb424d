//! `berth bench` end to end, without a GPU: a quiet end in a closed pipe.

use std::process::{Command, Stdio};

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
