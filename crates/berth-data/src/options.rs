//! `LoaderOptions`: the options both loader builders share ([`DataLoaderBuilder`] and
//! [`IterableDataLoaderBuilder`]), their PyTorch defaults, and the steps of `build` they share
//! (worker validation, pin resolution, the pieces of the loader's core).
//!
//! Each builder keeps only what is its own (the collate, the dataset, its sampler options) and
//! one field of this type; the setters that read the same for both are written once, in
//! [`loader_option_setters!`].
//!
//! [`DataLoaderBuilder`]: crate::DataLoaderBuilder
//! [`IterableDataLoaderBuilder`]: crate::IterableDataLoaderBuilder

use std::sync::{Arc, Mutex};

use crate::error::Result;
use crate::fetch::Fetcher;
use crate::iter::Core;
use crate::loader::{
    check_timeout_needs_workers, resolve_pin, validate_workers, warn_workers_over_cpus,
};
use crate::pin::{PinFn, PinMemory, PinTarget};
use crate::rng::Generator;
use crate::worker::WorkerInitFn;

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
    /// Whether `pin_memory(true)` was asked for.
    pub(crate) pin_memory: bool,
    /// The batch's pin step, set with `pin_memory(true)`.
    pub(crate) pin_fn: Option<PinFn<B>>,
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
            pin_memory: false,
            pin_fn: None,
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
    /// collate, as before this type existed.
    pub(crate) fn recollate<B2>(self) -> LoaderOptions<B2> {
        LoaderOptions {
            batch_size: self.batch_size,
            drop_last: self.drop_last,
            shuffle: self.shuffle,
            num_workers: self.num_workers,
            prefetch_factor: self.prefetch_factor,
            persistent_workers: self.persistent_workers,
            pin_memory: false,
            pin_fn: None,
            pin_target: self.pin_target,
            timeout_secs: self.timeout_secs,
            worker_init_fn: self.worker_init_fn,
            generator: self.generator,
        }
    }

    /// `pin_memory(pin)`: records the request and the batch's own pin step.
    pub(crate) fn set_pin_memory(&mut self, pin: bool)
    where
        B: PinMemory,
    {
        self.pin_memory = pin;
        self.pin_fn = if pin {
            let f: PinFn<B> = Arc::new(|b: B, t: &PinTarget| b.pin_memory(t));
            Some(f)
        } else {
            None
        };
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

    /// The loader's core around `shared` (built by `make_shared` from the resolved pin step,
    /// the worker init and the generator's clone when the caller needs it first); warns when
    /// there are more workers than CPUs.
    pub(crate) fn into_core<S: Fetcher>(
        self,
        workers: Workers,
        generator: Generator,
        make_shared: impl FnOnce(Option<(PinTarget, PinFn<B>)>, Option<WorkerInitFn>) -> S,
    ) -> Core<S> {
        warn_workers_over_cpus(workers.num_workers);
        let pin = resolve_pin(self.pin_memory, self.pin_fn, self.pin_target);
        Core {
            shared: make_shared(pin, self.worker_init_fn),
            num_workers: workers.num_workers,
            prefetch_factor: workers.prefetch_factor,
            persistent_workers: self.persistent_workers,
            timeout: workers.timeout,
            generator,
            pool: Mutex::new(None),
        }
    }
}

/// The validated worker options: count, effective `prefetch_factor`, timeout.
pub(crate) struct Workers {
    pub(crate) num_workers: usize,
    pub(crate) prefetch_factor: Option<usize>,
    pub(crate) timeout: std::time::Duration,
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
        /// workers). Any positive value is accepted: a map-style loader never requests more
        /// batches than the epoch has left, and an iterable one at most
        /// [`STREAM_PREFETCH_LIMIT`](crate::STREAM_PREFETCH_LIMIT) per worker.
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
    };
}
pub(crate) use loader_option_setters;
