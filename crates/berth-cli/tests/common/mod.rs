//! Helpers shared by the CLI's end-to-end tests (`mod common;` in each test file).

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
