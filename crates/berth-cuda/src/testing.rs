//! Test hooks: the one GPU gate for GPU tests, and a fake device count for simulated cases.
//!
//! # The GPU gate
//! Every GPU test starts with `if !berth_cuda::testing::require_gpu("name") { return; }`: on a
//! machine without a device it prints why it skips, unless `BERTH_REQUIRE_GPU=1` is set, in
//! which case it fails (so a GPU job that lost its GPU cannot pass silently; tokio's
//! `_require_full.rs` idea).
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
