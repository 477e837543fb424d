//! `berth`: the command-line tool of berth.
//!
//! Subcommands: `info` (devices), `train` / `eval` (the Fashion-MNIST main job), `replay`
//! (PyTorch allocator traces through berth's allocators), `bench` (measurements) and `memviz`
//! (a memory snapshot as one self-contained HTML page).
//! Errors print one line and exit with status 2 (usage and input errors) or 1 (failures).
//! Output into a closed pipe (`berth ... | head -1`) ends the program quietly, as it ends `cat`:
//! see [`restore_sigpipe`].
//!
//! # Where this crate sits
//! The top of the workspace: it depends on `berth` (devices, tensors, `nn`, the CUDA layer as
//! `berth::cuda`), `berth-alloc` (with its `trace` feature, for `berth replay`), `berth-data`
//! (the `DataLoader` of `train` and `bench dataloader`) and `berth-distributed` (the NCCL
//! process group of `bench all-reduce`, and DDP's reducer of `train --devices`); nothing
//! depends on it.
//!
//! ```text
//! berth-alloc  <-  berth-cuda  <-  berth  <-  berth-data         <-  berth-cli (this binary)
//!                      ^                  <-  berth-distributed  <-
//!                      +-- berth-torch (PyTorch's pluggable CUDA allocator)
//! ```
//!
//! It defines four notes: two of `berth memviz`, `Note [Timeline downsampling]`
//! (`memviz/timeline.rs`) and `Note [Segment downsampling]` (`memviz/segments.rs`), and two of
//! `berth train`, `Note [Fused host SGD]` (`train/mlp.rs`) and `Note [Resident batches]`
//! (`train/resident.rs`); the notes it follows are listed in the library crates' docs. Its API docs are not built
//! (`doc = false`: the binary's name, `berth`, is the library's).

use clap::{Parser, Subcommand};

mod bench;
mod info;
mod launch;
mod memviz;
mod paths;
mod replay;
mod replay_cuda;
mod replay_torch;
mod train;

/// berth: where your tensors live, how fast they move, and where your GPU memory went.
#[derive(Parser, Debug)]
#[command(name = "berth", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Show berth's version, CPU cores and every CUDA device (or why CUDA is not available).
    Info(info::InfoArgs),
    /// Train an MLP on Fashion-MNIST on the best device present (the main job).
    Train(train::TrainArgs),
    /// Evaluate a saved state dict on the Fashion-MNIST test set.
    Eval(train::EvalArgs),
    /// Replay PyTorch allocator traces through berth's allocators and compare with PyTorch.
    Replay(replay::ReplayArgs),
    /// Run a benchmark.
    Bench(bench::BenchArgs),
    /// Start one process per GPU with torchrun's environment (`RANK`, `WORLD_SIZE`,
    /// `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`): `berth launch --nproc-per-node 2 -- PROGRAM`.
    Launch(launch::LaunchArgs),
    /// Write a memory snapshot (PyTorch's `_dump_snapshot` pickle or berth's) as one
    /// self-contained HTML page: the active-memory timeline and the segments.
    Memviz(memviz::MemvizArgs),
}

fn main() {
    restore_sigpipe();
    report_stdout_errors();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Info(a) => info::run(a),
        Command::Train(a) => train::run_train(a),
        Command::Eval(a) => train::run_eval(a),
        Command::Replay(a) => replay::run(a),
        Command::Bench(a) => bench::run(a),
        Command::Launch(a) => launch::run(a),
        Command::Memviz(a) => memviz::run(a),
    };
    if let Err(err) = result {
        eprintln!("berth: error: {}", error_line(&err));
        std::process::exit(exit_code(&err));
    }
}

/// Gives `SIGPIPE` back its default action (end the process), as C programs have it.
///
/// Rust's runtime ignores `SIGPIPE`, so a write into a closed pipe returns `EPIPE` and
/// `println!` panics ("failed printing to stdout: Broken pipe") with a backtrace and status 101.
/// With the default action restored, `berth replay --json ... | head -1` ends the moment `head`
/// stops reading, silently, as `cat` and `grep` do (the shell sees status 141).
#[cfg(unix)]
fn restore_sigpipe() {
    // SAFETY: `signal` with `SIGPIPE` and `SIG_DFL` only changes this process's disposition of
    // one signal; it is called first thing in `main`, before any thread exists, so no other
    // thread can be installing a handler at the same time, and no Rust code relies on SIGPIPE
    // being ignored (writes then end the process instead of returning EPIPE).
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// Elsewhere there is no `SIGPIPE`: nothing to restore.
#[cfg(not(unix))]
fn restore_sigpipe() {}

/// Turns a failed write to standard output (other than a closed pipe, see [`restore_sigpipe`])
/// into berth's one-line error with status 1.
///
/// `println!` panics when stdout cannot be written ("failed printing to stdout: No space left
/// on device", e.g. `berth info > /dev/full`), which would print a backtrace and exit with 101.
/// The output goes through `println!` in every subcommand, so the panic hook, not each call,
/// handles it; every other panic keeps the default hook (a bug report, status 101).
fn report_stdout_errors() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let msg = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("");
        if let Some(cause) = msg.strip_prefix("failed printing to stdout: ") {
            eprintln!("berth: error: cannot write to standard output: {cause}");
            std::process::exit(1);
        }
        default(info);
    }));
}

/// The one-line text of an error: each error of the chain joined by ": ", leaving out a source
/// whose text the line already holds.
///
/// Some error types both print their source in their own message and return it from
/// `source()` (`berth::Error`'s I/O and replay errors do); anyhow's `{:#}` would print that
/// text twice ("... Is a directory (os error 21): Is a directory (os error 21)").
fn error_line(err: &anyhow::Error) -> String {
    let mut line = String::new();
    for e in err.chain() {
        let text = e.to_string();
        if line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

/// The most DataLoader worker threads `--workers` may ask for: the loader's own bound
/// ([`berth_data::MAX_WORKERS`], which says why).
pub const MAX_WORKERS: usize = berth_data::MAX_WORKERS;

/// Checks a `--workers` value against [`MAX_WORKERS`].
///
/// # Errors
/// A [`UsageError`] naming the value, the limit and this machine's core count.
pub fn check_workers(workers: usize) -> Result<(), UsageError> {
    if workers <= MAX_WORKERS {
        return Ok(());
    }
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    Err(UsageError(format!(
        "--workers {workers}: at most {MAX_WORKERS} worker threads are allowed (this machine has {cores} cores; e.g. --workers {cores})"
    )))
}

/// Checks that a count option (`--epochs`, `--reps`) is at least 1; `what` names it in words.
///
/// # Errors
/// A [`UsageError`] such as "--epochs 0: the number of epochs must be at least 1 (e.g. --epochs 5)".
pub fn check_at_least_one(
    flag: &str,
    value: usize,
    what: &str,
    example: usize,
) -> Result<(), UsageError> {
    if value >= 1 {
        return Ok(());
    }
    Err(UsageError(format!(
        "{flag} {value}: the number of {what} must be at least 1 (e.g. {flag} {example})"
    )))
}

/// A clap value parser for a whole-number flag that also reads negative numbers, so that
/// `--epochs -1` is answered like `--epochs 0` ("--epochs -1: the number of epochs must be at
/// least 1 (e.g. --epochs 5)") instead of with clap's "unexpected argument '-1'". Use it with
/// `allow_negative_numbers = true` on the argument. Values from 0 up pass, so the command's own
/// check (the one `--epochs 0` meets) still words the lower bound; `what` names the quantity
/// ("the number of epochs"), `min` is its smallest accepted value, `example` a good one.
pub fn whole_number(
    flag: &'static str,
    what: &'static str,
    min: u64,
    example: u64,
) -> impl Fn(&str) -> Result<u64, String> + Clone + Send + Sync + 'static {
    move |s: &str| {
        let t = s.trim();
        let hint = format!("{what} must be at least {min} (e.g. {flag} {example})");
        match t.parse::<i128>() {
            Ok(v) if v < 0 => Err(format!("{flag} {t}: {hint}")),
            Ok(v) => u64::try_from(v).map_err(|_| {
                format!(
                    "{flag} {t}: too large; {what} must be at most {} (e.g. {flag} {example})",
                    u64::MAX
                )
            }),
            Err(_) => Err(format!(
                "{flag} {t}: not a whole number; give {what} as one, such as {flag} {example}"
            )),
        }
    }
}

/// [`whole_number`] for `usize` flags.
pub fn whole_usize(
    flag: &'static str,
    what: &'static str,
    min: u64,
    example: u64,
) -> impl Fn(&str) -> Result<usize, String> + Clone + Send + Sync + 'static {
    let parse = whole_number(flag, what, min, example);
    move |s: &str| {
        let v = parse(s)?;
        usize::try_from(v).map_err(|_| format!("{s} is too large for this machine's usize"))
    }
}

/// Exit status for an error: 2 for bad user input (the error chain holds a [`UsageError`], a
/// malformed `BERTH_ALLOC_CONF` or an input [`memviz::MemvizError`]), 1 otherwise.
fn exit_code(err: &anyhow::Error) -> i32 {
    let input = |e: &(dyn std::error::Error + 'static)| {
        e.is::<UsageError>()
            // A bad `berth train --devices` list.
            || e.is::<train::devices::DevicesError>()
            // A malformed BERTH_ALLOC_CONF is bad input too.
            || e.is::<berth_alloc::ConfigError>()
            || e.downcast_ref::<memviz::MemvizError>()
                .is_some_and(memviz::MemvizError::is_input)
    };
    if err.chain().any(input) {
        2
    } else {
        1
    }
}

/// A user-input error (bad flag value, missing file): the CLI exits with status 2.
#[derive(Debug)]
pub struct UsageError(pub String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

#[cfg(test)]
mod tests {
    use super::*;

    /// An error that prints its source in its own message and also returns it from `source()`.
    #[derive(Debug)]
    struct Wraps(std::io::Error);

    impl std::fmt::Display for Wraps {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "save_state_dict /some/dir: {}", self.0)
        }
    }

    impl std::error::Error for Wraps {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn error_line_prints_a_source_once() {
        let io = std::io::Error::other("Is a directory");
        let err = anyhow::Error::new(Wraps(io)).context("saving the state dict to /some/dir");
        assert_eq!(
            error_line(&err),
            "saving the state dict to /some/dir: save_state_dict /some/dir: Is a directory"
        );
    }

    #[test]
    fn error_line_keeps_sources_not_yet_printed() {
        let err = anyhow::Error::new(std::io::Error::other("disk full")).context("writing x");
        assert_eq!(error_line(&err), "writing x: disk full");
    }

    #[test]
    fn whole_numbers_name_the_bound_that_was_broken() {
        let parse = whole_number("--samples", "the number of samples", 1, 1000);
        assert_eq!(parse(" 12 "), Ok(12));
        assert_eq!(
            parse("-3").unwrap_err(),
            "--samples -3: the number of samples must be at least 1 (e.g. --samples 1000)"
        );
        assert_eq!(
            parse("18446744073709551616").unwrap_err(),
            "--samples 18446744073709551616: too large; the number of samples must be at most \
             18446744073709551615 (e.g. --samples 1000)"
        );
        assert_eq!(
            parse("abc").unwrap_err(),
            "--samples abc: not a whole number; give the number of samples as one, such as \
             --samples 1000"
        );
    }

    #[test]
    fn workers_are_capped_with_a_usage_error() {
        assert!(check_workers(MAX_WORKERS).is_ok());
        let err = check_workers(100_000).unwrap_err();
        assert!(
            err.0
                .starts_with("--workers 100000: at most 1024 worker threads are allowed"),
            "{err}"
        );
    }
}
