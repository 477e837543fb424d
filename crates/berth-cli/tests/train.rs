//! `berth train` / `berth eval` end to end: the CI version of the main job (one epoch, seeded,
//! test accuracy ≥ 75%), save → eval reproducing the accuracy, the meta prediction, and the
//! new-user errors (one line, exit status 2, no panic).

use std::process::{Command, Output};

mod common;
use common::TempDir;

fn berth(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(args)
        .env_remove("BERTH_DATA_DIR")
        .output()
        .expect("berth runs")
}

/// As [`berth`], for arguments that need not be UTF-8.
fn berth_os(args: &[&std::ffi::OsStr]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(args)
        .env_remove("BERTH_DATA_DIR")
        .output()
        .expect("berth runs")
}

fn json_of(out: &Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "berth failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout.lines().last().expect("one JSON line");
    serde_json::from_str(last).unwrap_or_else(|e| panic!("not JSON ({e}): {last}"))
}

#[test]
fn one_epoch_on_cpu_reaches_75_percent_and_eval_reproduces_it() {
    use std::os::unix::ffi::OsStrExt;
    let dir = TempDir::new("train");
    // A file name that is not UTF-8 (byte 0xff): the JSON reports spell it lossily instead of
    // failing after the run.
    let save = dir.join(std::ffi::OsStr::from_bytes(b"mlp-\xff.safetensors"));
    let save_s = save.as_os_str();
    let out = berth_os(&[
        "train".as_ref(),
        "--device".as_ref(),
        "cpu".as_ref(),
        "--epochs".as_ref(),
        "1".as_ref(),
        "--seed".as_ref(),
        "0".as_ref(),
        "--json".as_ref(),
        "--save".as_ref(),
        save_s,
    ]);
    let v = json_of(&out);
    assert_eq!(v["saved"], save.to_string_lossy().as_ref());
    assert_eq!(v["device"], "cpu");
    assert_eq!(v["epochs"], 1);
    let acc = v["test_accuracy"].as_f64().unwrap();
    assert!(acc >= 0.75, "one epoch gave {acc}");
    let loss = v["train_loss"].as_f64().unwrap();
    assert!(loss > 0.0 && loss < 1.0, "train loss {loss}");
    assert_eq!(v["epoch_seconds"].as_array().unwrap().len(), 1);
    // On the CPU the peaks are the host bytes held by tensors: at least the parameters and
    // their momentum buffers (2 × 814,120 B).
    let peak = v["peak_allocated"].as_u64().unwrap();
    assert!(peak >= 2 * 814_120, "peak {peak}");
    assert_eq!(v["peak_reserved"].as_u64().unwrap(), peak);

    let ev = json_of(&berth_os(&[
        "eval".as_ref(),
        "--load".as_ref(),
        save_s,
        "--device".as_ref(),
        "cpu".as_ref(),
        "--json".as_ref(),
    ]));
    assert_eq!(ev["load"], save.to_string_lossy().as_ref());
    assert_eq!(
        ev["test_accuracy"].as_f64().unwrap(),
        acc,
        "eval of the saved state dict"
    );
    // eval needs only the two test files: a folder holding just those is enough.
    let only_test = dir.join("t10k-only");
    std::fs::create_dir_all(&only_test).unwrap();
    let data = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/fashion-mnist");
    for f in ["t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"] {
        std::fs::copy(data.join(f), only_test.join(f)).unwrap();
    }
    let ev2 = json_of(&berth_os(&[
        "eval".as_ref(),
        "--load".as_ref(),
        save_s,
        "--device".as_ref(),
        "cpu".as_ref(),
        "--data-dir".as_ref(),
        only_test.as_os_str(),
        "--json".as_ref(),
    ]));
    assert_eq!(ev2["test_accuracy"].as_f64().unwrap(), acc);
    // train needs the training files too, and says which.
    let out = berth_os(&[
        "train".as_ref(),
        "--data-dir".as_ref(),
        only_test.as_os_str(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("train-images-idx3-ubyte.gz"), "{err}");
}

#[test]
fn meta_predicts_without_data_or_memory() {
    let v = json_of(&berth(&["train", "--device", "meta", "--json"]));
    assert_eq!(v["device"], "meta");
    assert_eq!(v["prediction"], true);
    assert_eq!(v["policy"], "paged", "the default policy");
    assert!(
        v.get("predicted_peak_allocated").is_none(),
        "one key per figure: {v}"
    );
    let alloc = v["peak_allocated"].as_u64().unwrap();
    let reserved = v["peak_reserved"].as_u64().unwrap();
    assert!(alloc >= 2 * 814_120 && alloc.is_multiple_of(512), "{alloc}");
    assert!(
        reserved >= alloc && reserved.is_multiple_of(2 << 20),
        "{reserved}"
    );
}

/// `--resident` keeps the training split on the device: the prediction holds it (60,000 ×
/// 784 f32 normalised pixels and 60,000 i64 labels, 188,640,000 B) and the epoch's i64 order
/// (480,000 B), where the loader's path holds two batches instead.
#[test]
fn meta_prediction_holds_the_resident_split() {
    let plain = json_of(&berth(&["train", "--device", "meta", "--json"]));
    let resident = json_of(&berth(&[
        "train",
        "--device",
        "meta",
        "--resident",
        "--json",
    ]));
    assert_eq!(resident["resident"], true);
    assert_eq!(plain["resident"], false);
    let (p, r) = (
        plain["peak_allocated"].as_u64().unwrap(),
        resident["peak_allocated"].as_u64().unwrap(),
    );
    let split = 60_000 * 784 * 4 + 60_000 * 8 + 60_000 * 8;
    assert!(r >= split, "resident peak {r} below the split's {split} B");
    assert!(r > p + split - 2 * (64 * 784 * 4 + 64 * 8), "{r} vs {p}");
    assert!(
        r < p + split + (4 << 20),
        "{r} vs {p}: more than the split and the order"
    );
}

fn assert_usage_error(args: &[&str], needle: &str) {
    let out = berth(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(2),
        "{args:?}: status {:?}, stderr {err}",
        out.status
    );
    assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
    assert_eq!(
        err.trim_end().lines().count(),
        1,
        "{args:?}: not one line: {err}"
    );
    assert!(err.contains(needle), "{args:?}: {err:?} lacks {needle:?}");
}

#[test]
fn new_user_errors_are_one_line_with_status_2() {
    let missing = std::env::temp_dir().join("berth-no-such-dir");
    assert_usage_error(
        &["train", "--data-dir", missing.to_str().unwrap()],
        "no Fashion-MNIST files there",
    );
    assert_usage_error(&["train", "--device", "cuda:7"], "--device cuda:7");
    assert_usage_error(&["train", "--device", "tpu"], "expected one of cpu, cuda");
    assert_usage_error(&["train", "--batch-size", "0"], "--batch-size 0");
    assert_usage_error(
        &[
            "train",
            "--device",
            "meta",
            "--hidden",
            "18446744073709551615",
        ],
        "--hidden 18446744073709551615: fc1.weight would be [18446744073709551615, 784] f32",
    );
    assert_usage_error(
        &["train", "--device", "meta", "--batch-size", "4611686018427387904"],
        "--batch-size 4611686018427387904: one batch's activations would be [4611686018427387904, 784] f32",
    );
    assert_usage_error(
        &["train", "--epochs", "0"],
        "berth: error: --epochs 0: the number of epochs must be at least 1 (e.g. --epochs 5)",
    );
    // A billion epochs reserved a report slot per epoch up front and aborted; 10^18 overflowed
    // the step count.
    for epochs in ["1000000001", "1000000000000000000", "18446744073709551615"] {
        assert_usage_error(
            &["train", "--epochs", epochs],
            &format!("berth: error: --epochs {epochs}: at most 1000000 epochs"),
        );
    }
    // 100,000 worker threads aborted the process (no stack guard page for a new thread).
    assert_usage_error(
        &["train", "--device", "cpu", "--epochs", "1", "--workers", "100000"],
        "berth: error: --workers 100000: at most 1024 worker threads are allowed (this machine has ",
    );
    let not_st = std::env::temp_dir().join(format!("berth-not-safetensors-{}", std::process::id()));
    std::fs::write(&not_st, b"this is not a safetensors file").unwrap();
    assert_usage_error(
        &[
            "eval",
            "--load",
            not_st.to_str().unwrap(),
            "--device",
            "cpu",
        ],
        "expected a safetensors file",
    );
    std::fs::remove_file(&not_st).ok();
}

#[test]
fn meta_reports_a_step_that_does_not_fit() {
    // hidden 1,000,000 × batch 100,000 f32 activations alone are 400 GB: more than an H200.
    let out = berth(&[
        "train",
        "--device",
        "meta",
        "--hidden",
        "1000000",
        "--batch-size",
        "100000",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("does not fit a device of"), "{err}");
}

#[test]
fn save_problems_are_caught_before_training() {
    assert_usage_error(
        &["train", "--device", "meta", "--save", "/tmp/m.safetensors"],
        "--save with --device meta",
    );
    let started = std::time::Instant::now();
    assert_usage_error(
        &[
            "train",
            "--device",
            "cpu",
            "--save",
            "/nonexistent-berth-dir/x.safetensors",
        ],
        "does not exist",
    );
    let dir = TempDir::new("save-dir");
    assert_usage_error(
        &["train", "--device", "cpu", "--save", dir.to_str().unwrap()],
        &format!(
            "berth: error: --save {}: that is a folder; give a file path such as {}",
            dir.display(),
            dir.join("mlp.safetensors").display()
        ),
    );
    // A folder that exists but cannot hold the file: found by opening it before training.
    assert_usage_error(
        &[
            "train",
            "--device",
            "cpu",
            "--save",
            "/proc/berth-x.safetensors",
        ],
        "berth: error: --save /proc/berth-x.safetensors: cannot write there (",
    );
    assert!(
        !std::path::Path::new("/proc/berth-x.safetensors").exists(),
        "the check leaves no file"
    );
    // Two outputs naming one file, spelt two ways.
    let p = dir.join("out.json");
    let p_dot = dir.join(".").join("out.json");
    assert_usage_error(
        &[
            "train",
            "--device",
            "cpu",
            "--save",
            p.to_str().unwrap(),
            "--profile",
            p_dot.to_str().unwrap(),
        ],
        &format!(
            "berth: error: --save and --profile both name {}: one file would overwrite the other",
            p.display()
        ),
    );
    assert!(!p.exists(), "nothing was written");
    // Rejected before any epoch runs (an epoch takes seconds).
    assert!(started.elapsed() < std::time::Duration::from_secs(30));
}

/// An IDX split that declares no images is refused before training, not reported as a run
/// with 0% accuracy.
#[test]
fn an_empty_split_is_a_usage_error() {
    let dir = TempDir::new("empty-split");
    let images = |n: u32| -> Vec<u8> {
        [0x0803u32, n, 28, 28]
            .iter()
            .flat_map(|v| v.to_be_bytes())
            .chain(std::iter::repeat_n(0u8, n as usize * 784))
            .collect()
    };
    let labels = |n: u32| -> Vec<u8> {
        [0x0801u32, n]
            .iter()
            .flat_map(|v| v.to_be_bytes())
            .chain(std::iter::repeat_n(0u8, n as usize))
            .collect()
    };
    for (train, test, needle) in [
        (0, 4, "the training split holds 0 images"),
        (4, 0, "the test split holds 0 images"),
    ] {
        std::fs::write(dir.join("train-images-idx3-ubyte"), images(train)).unwrap();
        std::fs::write(dir.join("train-labels-idx1-ubyte"), labels(train)).unwrap();
        std::fs::write(dir.join("t10k-images-idx3-ubyte"), images(test)).unwrap();
        std::fs::write(dir.join("t10k-labels-idx1-ubyte"), labels(test)).unwrap();
        assert_usage_error(
            &[
                "train",
                "--device",
                "cpu",
                "--epochs",
                "1",
                "--data-dir",
                dir.to_str().unwrap(),
            ],
            needle,
        );
    }
}

#[test]
fn a_diverging_run_is_an_error_naming_the_learning_rate() {
    let out = berth(&[
        "train", "--device", "cpu", "--epochs", "1", "--lr", "1e300", "--json",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("training diverged")
            && err.contains("lower --lr (now 1e300) or --momentum (now 0.9)"),
        "{err}"
    );
}

#[test]
fn a_bad_berth_data_dir_names_the_variable() {
    let out = Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(["train", "--device", "cpu"])
        .env("BERTH_DATA_DIR", "/nonexistent-berth-data")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("BERTH_DATA_DIR=/nonexistent-berth-data"),
        "{err}"
    );
}

#[test]
fn training_into_a_closed_pipe_ends_quietly() {
    // `berth train --epochs 1 | head -1`: the reader is gone before berth writes.
    let out = common::berth_into_closed_pipe(&["train", "--device", "cpu", "--epochs", "1"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert_ne!(out.status.code(), Some(101), "{err}");
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(out.status.signal(), Some(13), "ended by SIGPIPE: {err}");
    }
}

/// `--lr -1` and `--epochs -1` get the messages `--lr 0` and `--epochs 0` get, not clap's
/// "unexpected argument '-1'" (found trying the CLI as a new user).
#[test]
fn negative_values_get_the_zero_values_messages() {
    for (args, needle) in [
        (
            &["train", "--device", "meta", "--epochs", "-1"][..],
            "--epochs -1: the number of epochs must be at least 1 (e.g. --epochs 5)",
        ),
        (
            &["train", "--device", "meta", "--lr", "-1"][..],
            "--lr -1: the learning rate must be a positive number (e.g. --lr 0.05)",
        ),
        (
            &["train", "--device", "meta", "--momentum", "-0.5"][..],
            "--momentum -0.5: momentum must be in [0, 1) (e.g. --momentum 0.9)",
        ),
        (
            &["train", "--device", "meta", "--batch-size", "-64"][..],
            "--batch-size -64: the batch size must be at least 1 (e.g. --batch-size 64)",
        ),
        (
            &["train", "--device", "meta", "--workers", "-2"][..],
            "--workers -2: the number of worker threads must be at least 0 (e.g. --workers 2)",
        ),
        (
            &["eval", "--load", "x.safetensors", "--batch-size", "-1"][..],
            "--batch-size -1: the batch size must be at least 1 (e.g. --batch-size 1000)",
        ),
    ] {
        let out = berth(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err:?} lacks {needle:?}");
        assert!(!err.contains("unexpected argument"), "{args:?}: {err}");
    }
}

/// The meta prediction says first that it is one, for which policy and device size.
#[test]
fn meta_summary_opens_with_what_it_predicts() {
    let out = berth(&["train", "--device", "meta"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let first = text.lines().next().unwrap_or_default();
    assert!(
        first.starts_with("Prediction (nothing was allocated)")
            && first.contains("`paged` allocator policy"),
        "{first}"
    );
}

/// `--profile` writes a Chrome trace of the profiled steps (after the warm-up) and prints the
/// `key_averages()` table (to stderr under `--json`, so stdout stays one JSON object).
#[test]
fn profile_writes_a_trace_of_the_steps_after_warm_up_and_prints_the_table() {
    let path = std::env::temp_dir().join(format!("berth-profile-{}.json", std::process::id()));
    let out = berth(&[
        "train",
        "--device",
        "cpu",
        "--epochs",
        "1",
        "--batch-size",
        "1000",
        "--json",
        "--profile",
        path.to_str().unwrap(),
        "--profile-warmup",
        "2",
        "--profile-steps",
        "3",
    ]);
    let v = json_of(&out);
    assert_eq!(v["device"], "cpu");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("profile of 3 steps after 2 warm-up steps"),
        "{stderr}"
    );
    for col in ["Name", "CPU total", "# of Calls", "matmul"] {
        assert!(stderr.contains(col), "{stderr}");
    }
    let trace: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let events = trace["traceEvents"].as_array().unwrap();
    let steps: Vec<&str> = events
        .iter()
        .filter(|e| e["cat"] == "user_annotation")
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(steps, ["step 2", "step 3", "step 4"]);
    // Three steps of the same model: every op name appears a multiple of three times.
    let matmuls = events
        .iter()
        .filter(|e| e["cat"] == "cpu_op" && e["name"] == "matmul")
        .count();
    assert!(matmuls > 0 && matmuls % 3 == 0, "{matmuls} matmuls");
    assert!(events
        .iter()
        .any(|e| e["ph"] == "C" && e["name"] == "allocated_bytes"));
    // The GPU check's overlap script reads a CPU trace too (and says there is nothing to
    // overlap); skipped where there is no python3.
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../scripts/profile-overlap.py"
    );
    if let Ok(o) = Command::new("python3").arg(script).arg(&path).output() {
        let text = String::from_utf8_lossy(&o.stdout);
        assert!(
            o.status.success(),
            "{text} {}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(
            text.contains("no stream tracks") && text.contains("a CPU trace"),
            "{text}"
        );
    }
    std::fs::remove_file(&path).ok();
}

#[test]
fn profile_on_meta_is_a_usage_error() {
    assert_usage_error(
        &["train", "--device", "meta", "--profile", "/tmp/p.json"],
        "--profile with --device meta",
    );
}

/// Profile options that could only fail at the end, or would do nothing, are refused before
/// any epoch runs.
#[test]
fn profile_problems_are_caught_before_training() {
    let started = std::time::Instant::now();
    assert_usage_error(
        &[
            "train",
            "--device",
            "cpu",
            "--profile",
            "/nonexistent-berth-dir/p.json",
        ],
        "--profile /nonexistent-berth-dir/p.json: the folder /nonexistent-berth-dir does not exist",
    );
    // 60,000 samples in batches of 64: 938 steps an epoch.
    assert_usage_error(
        &[
            "train", "--device", "cpu", "--epochs", "1", "--profile", "/tmp/p.json",
            "--profile-warmup", "938",
        ],
        "--profile-warmup 938: training runs 938 steps (1 epoch of 938), so the profile would never start",
    );
    assert_usage_error(
        &[
            "train", "--device", "cpu", "--profile", "/tmp/p.json", "--profile-activities",
            "cpu,cuda",
        ],
        "--profile-activities cuda with --device cpu: device time is recorded for CUDA devices only",
    );
    assert_usage_error(
        &[
            "train",
            "--device",
            "cpu",
            "--profile",
            "/tmp/p.json",
            "--profile-device-timer",
            "cupti",
        ],
        "--profile-device-timer cupti with --device cpu: it times CUDA work",
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(30));
    // `--resident` uses no workers: giving both is refused by the parser.
    let out = berth(&["train", "--device", "cpu", "--resident", "--workers", "8"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("'--resident' cannot be used with '--workers <WORKERS>'"),
        "{err}"
    );
    // Without --profile, its options are refused by the parser (status 2, several lines).
    let out = berth(&["train", "--device", "cpu", "--profile-steps", "3"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--profile <PATH>"), "{err}");
}

/// `--resident` (the split in memory, batches gathered by shuffled index) sees the loader's
/// batches in the loader's order (`Note [Resident batches]`), so one epoch ends with the same
/// figures on `device`.
fn resident_matches_the_loader_on(device: &str) {
    let run = |extra: &[&str]| {
        let mut args = vec![
            "train", "--device", device, "--epochs", "1", "--seed", "3", "--json",
        ];
        args.extend_from_slice(extra);
        json_of(&berth(&args))
    };
    let (loader, resident) = (run(&["--workers", "1"]), run(&["--resident"]));
    for key in ["train_loss", "test_accuracy"] {
        assert_eq!(loader[key], resident[key], "{key} on {device}");
    }
}

#[test]
fn resident_batches_match_the_loader_on_cpu() {
    resident_matches_the_loader_on("cpu");
}

/// On CUDA the resident batches are gathered on the device (`index_select`).
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (BERTH_REQUIRE_GPU=1 fails without one)"]
fn resident_batches_match_the_loader_on_cuda() {
    if !berth::cuda::testing::require_gpu("resident_batches_match_the_loader_on_cuda") {
        return;
    }
    resident_matches_the_loader_on("cuda:0");
}

/// A malformed `BERTH_ALLOC_CONF` is bad input: one line, status 2, as the flags' errors.
#[test]
fn a_bad_berth_alloc_conf_is_a_usage_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(["train", "--device", "meta"])
        .env("BERTH_ALLOC_CONF", "bogus")
        .output()
        .expect("berth runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(
        err.starts_with(
            "berth: error: BERTH_ALLOC_CONF: unrecognized allocator config key 'bogus'"
        ),
        "{err}"
    );
}

/// `--device auto` says which device it chose and, on the CPU, why CUDA was not used, on
/// standard error, so a JSON report on standard output stays parseable (newcomer defect 23).
#[test]
fn auto_says_which_device_it_chose_and_why() {
    let out = berth(&["train", "--epochs", "1", "--hidden", "8", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    let line = err
        .lines()
        .find(|l| l.starts_with("device: "))
        .unwrap_or_else(|| panic!("{err}"));
    if berth::cuda::is_available() {
        assert!(line.starts_with("device: cuda:0 (--device auto)"), "{line}");
    } else {
        assert!(
            line.starts_with("device: cpu (--device auto; CUDA is not used: "),
            "{line}"
        );
    }
    serde_json::from_slice::<serde_json::Value>(&out.stdout).expect("stdout is the JSON report");
    // An explicit device says nothing.
    let out = berth(&["train", "--epochs", "1", "--hidden", "8", "--device", "cpu"]);
    assert!(!String::from_utf8_lossy(&out.stderr).contains("device: "));
}
