//! Test hooks: the one GPU gate for GPU tests, and a fake device count for simulated cases.
//!
//! # The GPU gate
//! Every GPU test is written
//!
//! ```text
//! #[test]
//! #[ignore = "needs a CUDA GPU: run with --include-ignored (BERTH_REQUIRE_GPU=1 fails without one)"]
//! fn name() {
//!     if !berth_cuda::testing::require_gpu("name") {
//!         return;
//!     }
//!     ...
//! }
//! ```
//!
//! so a plain `cargo test` counts it as *ignored*, not passed, on any machine. Run with
//! `--include-ignored` (as `scripts/gpu-check.sh` does on the GPU machine), it reaches the
//! gate: on a machine without a device the gate prints why it skips, unless
//! `BERTH_REQUIRE_GPU=1` is set, in which case it fails (so a GPU job that lost its GPU cannot
//! pass silently; tokio's `_require_full.rs` idea). Tests of the no-GPU error paths need no
//! device and stay ordinary tests.
//!
//! # Faking the device count
//! [`fake_device_count`] makes [`device_count`](super::device_count),
//! [`is_available`](super::is_available), [`check_device`](super::check_device) and
//! [`set_device`](super::set_device) behave, **on the calling thread only**, as if `n` devices
//! were visible, until the returned guard drops. Nothing else is faked: a driver call on a
//! "visible" fake device still answers [`CudaError::Unavailable`](super::CudaError) on a
//! machine without a GPU. Code that validates `cuda:i` through
//! [`check_device`](super::check_device) gets "device index 5 is out of range [0, 1)" under
//! `fake_device_count(1)` (the out-of-range index of
//! <https://github.com/pytorch/pytorch/issues/136849>, tested without a GPU).

use std::cell::Cell;

thread_local! {
    static FAKE: Cell<Option<usize>> = const { Cell::new(None) };
}

/// The fake count set on this thread, if any.
pub(crate) fn faked_count() -> Option<usize> {
    FAKE.with(Cell::get)
}

/// Pretends `n` CUDA devices are visible on the calling thread until the guard drops.
///
/// # Examples
/// ```
/// let _g = berth_cuda::testing::fake_device_count(1);
/// assert_eq!(berth_cuda::device_count(), 1);
/// let err = berth_cuda::check_device(5).unwrap_err();
/// assert!(err.to_string().starts_with("device index 5 is out of range [0, 1)"));
/// ```
pub fn fake_device_count(n: usize) -> FakeDeviceCount {
    let previous = FAKE.with(|f| f.replace(Some(n)));
    FakeDeviceCount { previous }
}

/// Restores the previous (real or fake) device count on drop; made by [`fake_device_count`].
#[derive(Debug)]
#[must_use = "the fake count ends when the guard is dropped"]
pub struct FakeDeviceCount {
    previous: Option<usize>,
}

impl Drop for FakeDeviceCount {
    fn drop(&mut self) {
        FAKE.with(|f| f.set(self.previous));
    }
}

/// Whether `BERTH_REQUIRE_GPU=1` is set.
pub fn gpu_required() -> bool {
    std::env::var("BERTH_REQUIRE_GPU").is_ok_and(|v| v == "1")
}

/// The GPU gate for tests: `true` when a real CUDA device is present (fakes are ignored).
/// Otherwise prints `skipping <test>: <reason>` and returns `false`.
///
/// # Panics
/// When no device is present and `BERTH_REQUIRE_GPU=1` is set: the test must fail then.
pub fn require_gpu(test: &str) -> bool {
    require_gpus(test, 1)
}

/// As [`require_gpu`], for tests that need at least `n` devices (a context created on the
/// wrong device, <https://github.com/pytorch/pytorch/issues/25752>, needs two). With
/// `BERTH_REQUIRE_GPU=1` a machine with at least one device but fewer than `n` skips (printing
/// the reason) rather than failing: the test cannot run there, the GPU is not lost.
///
/// # Panics
/// When no device at all is present and `BERTH_REQUIRE_GPU=1` is set.
pub fn require_gpus(test: &str, n: usize) -> bool {
    let count = crate::driver::driver();
    match count {
        Ok(c) if c >= n => true,
        Ok(c) => {
            println!("skipping {test}: needs {n} CUDA devices, {c} visible");
            false
        }
        Err(e) => {
            if gpu_required() {
                panic!("{test}: BERTH_REQUIRE_GPU=1 but no GPU: {e}");
            }
            println!("skipping {test}: {e}");
            false
        }
    }
}

/// Keeps `stream` busy for `ms` milliseconds without a kernel: queues a host function that
/// sleeps (`cuLaunchHostFunc`). Work queued after it waits; the host does not. For tests of
/// asynchronous copies and events (such as <https://github.com/pytorch/pytorch/issues/86264>
/// and <https://github.com/pytorch/pytorch/issues/85796>).
///
/// # Errors
/// [`CudaError::Driver`](super::CudaError) / [`CudaError::Unavailable`](super::CudaError).
pub fn busy_stream(stream: &super::Stream, ms: u64) -> Result<(), super::CudaError> {
    // SAFETY: `stream` (borrowed) keeps its handle alive.
    unsafe { crate::ffi::stream_sleep(stream.device(), stream.as_raw(), ms) }
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    /// Every `.rs` file under `dir`, recursively.
    fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                rust_files(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }

    /// Honest counts: in every crate of the workspace, a `#[test]` whose body opens at the GPU
    /// gate is `#[ignore]`d (so a machine without a GPU counts it as ignored, not passed), and
    /// an `#[ignore]`d test that needs a GPU opens at the gate (so `--include-ignored` without
    /// a GPU skips it with a message instead of failing).
    #[test]
    fn every_gpu_test_is_ignored_and_opens_at_the_gate() {
        let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut files = Vec::new();
        for krate in std::fs::read_dir(&crates).unwrap().flatten() {
            rust_files(&krate.path().join("src"), &mut files);
            rust_files(&krate.path().join("tests"), &mut files);
        }
        let (mut gated, mut bad) = (0, Vec::new());
        for file in &files {
            let text = std::fs::read_to_string(file).unwrap();
            let lines: Vec<&str> = text.lines().collect();
            for (i, line) in lines.iter().enumerate() {
                if line.trim() != "#[test]" {
                    continue;
                }
                let mut j = i + 1;
                while j < lines.len() && !lines[j].trim_start().starts_with("fn ") {
                    j += 1;
                }
                let attrs = &lines[i..j];
                let body = lines[j..lines.len().min(j + 8)].join("\n");
                let opens_at_gate = [
                    "require_gpu(",
                    "require_gpus(",
                    "require_nccl(",
                    "gpu(\"",
                    "driver_library_present(",
                ]
                .iter()
                .any(|g| body.contains(g));
                let ignored_for_gpu = attrs
                    .iter()
                    .any(|a| a.contains("#[ignore") && (a.contains("GPU") || a.contains("NVIDIA")));
                gated += usize::from(opens_at_gate);
                if opens_at_gate != ignored_for_gpu {
                    bad.push(format!("{}:{}", file.display(), j + 1));
                }
            }
        }
        assert!(gated > 0, "no GPU test found under {}", crates.display());
        assert!(
            bad.is_empty(),
            "GPU tests must be #[ignore = \"needs a CUDA GPU: ...\"] and open with \
             `if !berth_cuda::testing::require_gpu(..) {{ return; }}`; these do one without \
             the other: {bad:#?}"
        );
    }
}
