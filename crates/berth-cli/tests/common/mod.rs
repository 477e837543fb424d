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
