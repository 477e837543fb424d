//! `LoaderOptions`: the options both loader builders share ([`DataLoaderBuilder`] and
//! [`IterableDataLoaderBuilder`]), their PyTorch defaults and their validation (PyTorch's
//! messages), and the setters written once for both ([`loader_option_setters!`]).
//!
//! Each builder keeps only what is its own (the collate, the dataset, its sampler options) and
//! one field of this type. This file is configuration only: it imports no loader machinery
//! (the loader's core is built from these options in `src/iter.rs`), and the pinning options
//! are turned into a decision in one place, `src/pinning.rs` (Note [Where pinning is decided]).
//!
//! [`DataLoaderBuilder`]: crate::DataLoaderBuilder
//! [`IterableDataLoaderBuilder`]: crate::IterableDataLoaderBuilder

use std::sync::Arc;
use std::time::Duration;

use berth::Device;

use crate::error::{DataError, Result};
use crate::pin::PinTarget;
use crate::pinning::{decide, PinFn, Pinning};
use crate::rng::Generator;
use berth::alloc::warnings::warn_once;

/// Default `prefetch_factor` with workers: batches loaded in advance per worker.
pub const DEFAULT_PREFETCH_FACTOR: usize = 2;

/// A user callback run in each worker after seeding (`worker_init_fn`), given the worker id.
pub type WorkerInitFn = Arc<dyn Fn(usize) + Send + Sync>;

/// The options of a loader builder that do not depend on the dataset kind, for batches of type
/// `B`. Defaults are PyTorch's (`batch_size = 1`, everything else off or zero).
pub(crate) struct LoaderOptions<B> {
    /// Samples per batch.
    pub(crate) batch_size: usize,
    /// Drop the last partial batch (per worker for an iterable dataset).
    pub(crate) drop_last: bool,
    /// A new order every epoch (refused for an iterable dataset).
    pub(crate) shuffle: bool,
    /// Worker threads, signed so that a negative value gets PyTorch's error.
    pub(crate) num_workers: isize,
    /// Batches in advance per worker, as given (validated by `build`).
    pub(crate) prefetch_factor: Option<isize>,
    /// Keep the worker pool across epochs.
    pub(crate) persistent_workers: bool,
    /// The batch's pin step: `Some` exactly when `pin_memory(true)` was asked for.
    pub(crate) pin_fn: Option<PinFn<B>>,
    /// `pin_memory_device`: the device the pinned batches are for.
    pub(crate) pin_memory_device: Option<Device>,
    /// Where pinned batches are collated (default: the pinned host caching allocator).
    pub(crate) pin_target: Option<PinTarget>,
    /// Seconds to wait for one batch; 0: no limit.
    pub(crate) timeout_secs: f64,
    /// Called in each worker with its id.
    pub(crate) worker_init_fn: Option<WorkerInitFn>,
    /// The loader's generator (default: from entropy).
    pub(crate) generator: Option<Generator>,
}

impl<B> Default for LoaderOptions<B> {
    fn default() -> Self {
        LoaderOptions {
            batch_size: 1,
            drop_last: false,
            shuffle: false,
            num_workers: 0,
            prefetch_factor: None,
            persistent_workers: false,
            pin_fn: None,
            pin_memory_device: None,
            pin_target: None,
            timeout_secs: 0.0,
            worker_init_fn: None,
            generator: None,
        }
    }
}

impl<B> LoaderOptions<B> {
    /// The same options for a new collate whose batches are `B2`. The pin request is dropped
    /// (the pin step is the old batch type's): `pin_memory(true)` is asked again after the
    /// collate.
    pub(crate) fn recollate<B2>(self) -> LoaderOptions<B2> {
        LoaderOptions {
            batch_size: self.batch_size,
            drop_last: self.drop_last,
            shuffle: self.shuffle,
            num_workers: self.num_workers,
            prefetch_factor: self.prefetch_factor,
            persistent_workers: self.persistent_workers,
            pin_fn: None,
            pin_memory_device: self.pin_memory_device,
            pin_target: self.pin_target,
            timeout_secs: self.timeout_secs,
            worker_init_fn: self.worker_init_fn,
            generator: self.generator,
        }
    }

    /// The worker checks of `build`, in PyTorch's order (see [`validate_workers`]).
    pub(crate) fn validated_workers(&self) -> Result<Workers> {
        let (num_workers, prefetch_factor, timeout) = validate_workers(
            self.num_workers,
            self.prefetch_factor,
            self.persistent_workers,
            self.timeout_secs,
        )?;
        Ok(Workers {
            num_workers,
            prefetch_factor,
            timeout,
        })
    }

    /// The checks both builders make after their own: a positive `timeout` needs workers.
    pub(crate) fn check_timeout(&self, workers: &Workers) -> Result<()> {
        check_timeout_needs_workers(self.timeout_secs, workers.num_workers)
    }

    /// The loader's pinning, decided once (`pinning::decide`, Note [Where pinning is decided]).
    pub(crate) fn pinning(&mut self) -> Option<Pinning<B>> {
        decide(
            self.pin_fn.take(),
            self.pin_memory_device,
            self.pin_target.take(),
        )
    }
}

/// The validated worker options: count, effective `prefetch_factor`, timeout.
pub(crate) struct Workers {
    pub(crate) num_workers: usize,
    pub(crate) prefetch_factor: Option<usize>,
    pub(crate) timeout: Duration,
}

/// The most worker threads a loader may start (`num_workers`).
///
/// Each worker is an OS thread of this process. Far past the number of cores they only add
/// switching, and at some tens of thousands the OS refuses the memory for a new thread's stack
/// guard page, which aborts the whole process from inside the new thread (no error to catch).
/// 1024 is far above any useful count (PyTorch suggests at most the number of cores) and far
/// below that abort. PyTorch has no such bound: its workers are processes.
pub const MAX_WORKERS: usize = 1024;

/// The worker options both loader kinds validate first, in PyTorch's order
/// (`DataLoader.__init__`,
/// <https://github.com/pytorch/pytorch/blob/main/torch/utils/data/dataloader.py>): `num_workers`,
/// `timeout`, `prefetch_factor`, `persistent_workers`. Returns the worker count, the effective
/// `prefetch_factor` and the timeout.
pub(crate) fn validate_workers(
    num_workers: isize,
    prefetch_factor: Option<isize>,
    persistent_workers: bool,
    timeout_secs: f64,
) -> Result<(usize, Option<usize>, Duration)> {
    if num_workers < 0 {
        return Err(DataError::option(
            "num_workers",
            "num_workers option should be non-negative; use num_workers=0 to disable multiprocessing.",
        ));
    }
    if timeout_secs.is_nan() || timeout_secs < 0.0 {
        return Err(DataError::option(
            "timeout",
            "timeout option should be non-negative",
        ));
    }
    let Ok(timeout) = Duration::try_from_secs_f64(timeout_secs) else {
        return Err(DataError::option(
            "timeout",
            "timeout option is too large: at most u64::MAX seconds; use 0 for no limit",
        ));
    };
    let num_workers = num_workers as usize;
    if num_workers > MAX_WORKERS {
        let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
        return Err(DataError::option(
            "num_workers",
            format!(
                "num_workers={num_workers}: at most {MAX_WORKERS} worker threads (each is a thread of this process; this machine has {cores} cores, e.g. num_workers={cores})"
            ),
        ));
    }
    let prefetch_factor = match (num_workers, prefetch_factor) {
        (0, Some(_)) => {
            return Err(DataError::option(
                "prefetch_factor",
                "prefetch_factor option could only be specified in multiprocessing.let num_workers > 0 to enable multiprocessing, otherwise set prefetch_factor to None.",
            ))
        }
        (0, None) => None,
        (_, Some(p)) if p < 0 => {
            return Err(DataError::option(
                "prefetch_factor",
                "prefetch_factor option should be non-negative",
            ))
        }
        // PyTorch accepts 0 here and fails an assertion when the iterator starts.
        (_, Some(0)) => {
            return Err(DataError::option(
                "prefetch_factor",
                "prefetch_factor option should be positive with num_workers > 0 (PyTorch: assert prefetch_factor > 0)",
            ))
        }
        (_, Some(p)) => Some(p as usize),
        (_, None) => Some(DEFAULT_PREFETCH_FACTOR),
    };
    if persistent_workers && num_workers == 0 {
        return Err(DataError::option(
            "persistent_workers",
            "persistent_workers option needs num_workers > 0",
        ));
    }
    Ok((num_workers, prefetch_factor, timeout))
}

/// A positive `timeout` needs workers (PyTorch asserts `timeout == 0` in the single-process
/// iterator; berth refuses it when the loader is built).
pub(crate) fn check_timeout_needs_workers(timeout_secs: f64, num_workers: usize) -> Result<()> {
    if timeout_secs > 0.0 && num_workers == 0 {
        return Err(DataError::option(
            "timeout",
            "timeout option needs num_workers > 0 (PyTorch: assert timeout == 0 without workers)",
        ));
    }
    Ok(())
}

/// PyTorch's warning for more workers than CPUs (`_get_shared_warning`), once per process.
pub(crate) fn warn_workers_over_cpus(num_workers: usize) {
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    if num_workers > cpus {
        warn_once("workers>cpus", || {
            format!(
                "This DataLoader will create {num_workers} worker threads in total. Our suggested max number of worker in current system is {cpus}, which is smaller than what this DataLoader is going to create. Please be aware that excessive worker creation might get DataLoader running slow, lower the worker number to avoid potential slowness if necessary."
            )
        });
    }
}

/// The setters whose meaning and PyTorch defaults are the same for both builders, written once.
/// Each builder has a field `opts: LoaderOptions<C::Batch>`.
macro_rules! loader_option_setters {
    () => {
        /// Worker threads (default 0: load on the calling thread). Signed, so that a negative
        /// value gets PyTorch's error rather than a wrapped integer.
        pub fn num_workers(mut self, num_workers: isize) -> Self {
            self.opts.num_workers = num_workers;
            self
        }

        /// Batches loaded in advance per worker (default 2 with workers; only valid with
        /// workers). Any positive value is accepted, but no loader requests more than
        /// [`PREFETCH_LIMIT`](crate::PREFETCH_LIMIT) batches ahead per worker (nor, map-style,
        /// more than the epoch has left).
        pub fn prefetch_factor(mut self, prefetch_factor: isize) -> Self {
            self.opts.prefetch_factor = Some(prefetch_factor);
            self
        }

        /// Seconds to wait for one batch before [`DataError::Timeout`](crate::DataError::Timeout)
        /// (default 0: no limit; needs workers when positive). A timeout ends the epoch after
        /// that one error, as PyTorch's `RuntimeError` ends a `for` loop; the late batch is not
        /// waited for (see [`LoaderIter`](crate::LoaderIter)).
        pub fn timeout(mut self, seconds: f64) -> Self {
            self.opts.timeout_secs = seconds;
            self
        }

        /// The page-locked host memory `pin_memory` collates into. Default: berth's pinned host
        /// caching allocator when CUDA is available. Tests pass a simulated one.
        pub fn pin_memory_target(mut self, target: $crate::PinTarget) -> Self {
            self.opts.pin_target = Some(target);
            self
        }

        /// The device the pinned batches are for (PyTorch's `pin_memory_device`, default: none,
        /// the CUDA pinned host memory). It only matters with `pin_memory(true)`: alone it warns
        /// once and pins nothing, as in PyTorch; a device that is not CUDA warns once and pins
        /// nothing. Batches still come out on the host: moving them to the device is the
        /// caller's `to` or a [`DevicePrefetcher`](crate::prefetch::DevicePrefetcher)
        /// (Note [Where pinning is decided]).
        pub fn pin_memory_device(mut self, device: ::berth::Device) -> Self {
            self.opts.pin_memory_device = Some(device);
            self
        }
    };
}
pub(crate) use loader_option_setters;
