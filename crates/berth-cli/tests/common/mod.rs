//! Helpers shared by the CLI's end-to-end tests (`mod common;` in each test file).
#![allow(dead_code)] // each test file uses a part of these helpers

use std::process::{Command, Output, Stdio};

/// Runs `berth <args>` as `berth <args> | head -1` with `head` already gone: stdout is a pipe
/// whose read end is closed before berth starts, so berth's first write meets a closed pipe
/// whatever the timing (a pipe closed after spawning could take the output into its buffer).
/// `BERTH_DATA_DIR` is cleared, so `train` reads the repository's dataset.
pub fn berth_into_closed_pipe(args: &[&str]) -> Output {
    let (reader, writer) = std::io::pipe().expect("a pipe");
    drop(reader);
    Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(args)
        .env_remove("BERTH_DATA_DIR")
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .expect("berth runs")
}

/// A fresh temporary folder for one test, removed when this guard drops: at the end of the
/// test, and also when an assertion fails part-way (a failing run leaves nothing in the
/// temporary folder to fill the disk of the next one).
pub struct TempDir(std::path::PathBuf);

impl TempDir {
    /// Creates `$TMPDIR/berth-<name>-<pid>`, empty.
    ///
    /// # Panics
    /// If the folder cannot be created (a test helper: the test fails with the reason).
    pub fn new(name: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("berth-{name}-{}", std::process::id()));
        std::fs::remove_dir_all(&dir).ok();
        std::fs::create_dir_all(&dir).expect("a temporary folder");
        TempDir(dir)
    }
}

impl std::ops::Deref for TempDir {
    type Target = std::path::Path;
    fn deref(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        std::fs::remove_dir_all(&self.0).ok();
    }
}

/// Drops the fields that depend on the machine (`ns_per_op`, the warm figure, and
/// `cold_ns_per_op`) after checking they are positive numbers.
pub fn normalize(line: &str) -> serde_json::Value {
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

/// A trace file of `events` (JSON rows) in a fresh folder; returns (folder, path). Keep the
/// folder guard alive while the path is used: it removes the folder when it drops.
pub fn trace_file(test: &str, name: &str, json: &str) -> (TempDir, std::path::PathBuf) {
    let dir = TempDir::new(&format!("replay-{test}"));
    let path = dir.join(name);
    std::fs::write(&path, json).unwrap();
    (dir, path)
}
