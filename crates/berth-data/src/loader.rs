//! `DataLoader`: options, validation (PyTorch's messages) and construction.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::batch_sampler::{BatchSampler, BatchSampling};
use crate::collate::{Collatable, Collate, CollateFn, DefaultCollate};
use crate::dataset::Dataset;
use crate::error::{DataError, Result};
use crate::fetch::WorkerShared;
use crate::iter::{Core, LoaderIter};
use crate::options::{loader_option_setters, LoaderOptions};
use crate::pin::{PinFn, PinMemory, PinTarget};
use crate::rng::Generator;
use crate::sampler::{RandomSampler, Sampler, SequentialSampler};

/// Default `prefetch_factor` with workers: batches loaded in advance per worker.
pub const DEFAULT_PREFETCH_FACTOR: usize = 2;

/// Prints `message` on stderr the first time `key` is seen in this process.
pub(crate) fn warn_once(key: &'static str, message: &str) {
    use std::collections::HashSet;
    static SEEN: Mutex<Option<HashSet<&'static str>>> = Mutex::new(None);
    let mut seen = SEEN.lock().unwrap_or_else(PoisonError::into_inner);
    if seen.get_or_insert_with(HashSet::new).insert(key) {
        eprintln!("berth-data: warning: {message}");
    }
}

/// Loads batches from a map-style [`Dataset`] with PyTorch's `DataLoader` semantics: batches in
/// sampler order whatever `num_workers`, `prefetch_factor × num_workers` batches in flight, worker
/// errors delivered at their batch, clean shutdown on drop. Built with [`DataLoader::builder`].
///
/// See Note [Workers are threads] in [`crate::worker`] for how workers map to PyTorch's.
pub struct DataLoader<D: Dataset, C: Collate<D> = DefaultCollate> {
    pub(crate) core: Core<WorkerShared<D, C>>,
    pub(crate) batch_sampler: Mutex<Box<dyn BatchSampling>>,
}

impl<D: Dataset, C: Collate<D>> std::fmt::Debug for DataLoader<D, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DataLoader")
            .field("len", &self.len())
            .field("num_workers", &self.core.num_workers)
            .field("prefetch_factor", &self.core.prefetch_factor)
            .field("persistent_workers", &self.core.persistent_workers)
            .field("timeout", &self.core.timeout)
            .field("pin_memory", &self.pin_memory())
            .finish_non_exhaustive()
    }
}

impl<D: Dataset> DataLoader<D, DefaultCollate>
where
    D::Item: Collatable,
{
    /// A builder with PyTorch's defaults: `batch_size = 1`, no shuffle, `num_workers = 0`,
    /// `default_collate`.
    pub fn builder(dataset: impl Into<Arc<D>>) -> DataLoaderBuilder<D, DefaultCollate> {
        DataLoaderBuilder::with_collate(dataset, DefaultCollate)
    }
}

impl<D: Dataset, C: Collate<D>> DataLoader<D, C> {
    /// Number of batches per epoch (`len(loader)`).
    pub fn len(&self) -> usize {
        self.batch_sampler
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Whether an epoch yields no batch.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Worker threads (0: load on the calling thread).
    pub fn num_workers(&self) -> usize {
        self.core.num_workers
    }

    /// Batches loaded in advance per worker; `None` without workers.
    pub fn prefetch_factor(&self) -> Option<usize> {
        self.core.prefetch_factor
    }

    /// Whether the worker pool outlives an epoch.
    pub fn persistent_workers(&self) -> bool {
        self.core.persistent_workers
    }

    /// Whether batches are pinned (false when `pin_memory` was asked for without an accelerator).
    pub fn pin_memory(&self) -> bool {
        self.core.shared.pin.is_some()
    }

    /// The wait for one batch before [`DataError::Timeout`] (which ends the epoch); zero means
    /// no limit.
    pub fn timeout(&self) -> Duration {
        self.core.timeout
    }

    /// The loader's generator (shuffle order and worker base seeds).
    pub fn generator(&self) -> &Generator {
        &self.core.generator
    }

    /// The dataset.
    pub fn dataset(&self) -> &Arc<D> {
        &self.core.shared.dataset
    }

    /// Starts an epoch. Draws the workers' `base_seed` from the loader's generator (unless a
    /// persistent pool already exists), then the epoch's batches from the sampler.
    pub fn iter(&self) -> LoaderIter<'_, D, C> {
        LoaderIter::new(self)
    }
}

impl<'a, D: Dataset, C: Collate<D>> IntoIterator for &'a DataLoader<D, C> {
    type Item = Result<C::Batch>;
    type IntoIter = LoaderIter<'a, D, C>;
    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

/// Builds a [`DataLoader`]; option names and defaults are PyTorch's, and
/// [`build`](DataLoaderBuilder::build) rejects the combinations PyTorch rejects, with its messages.
pub struct DataLoaderBuilder<D: Dataset, C: Collate<D>> {
    dataset: Arc<D>,
    collate: C,
    sampler: Option<Box<dyn Sampler>>,
    batch_sampler: Option<Box<dyn BatchSampling>>,
    opts: LoaderOptions<C::Batch>,
}

impl<D: Dataset, C: Collate<D>> DataLoaderBuilder<D, C> {
    /// A builder over `dataset` with the collate `collate`.
    pub fn with_collate(dataset: impl Into<Arc<D>>, collate: C) -> Self {
        DataLoaderBuilder {
            dataset: dataset.into(),
            collate,
            sampler: None,
            batch_sampler: None,
            opts: LoaderOptions::default(),
        }
    }

    loader_option_setters!();

    /// Samples per batch (default 1).
    pub fn batch_size(mut self, batch_size: usize) -> Self {
        self.opts.batch_size = batch_size;
        self
    }

    /// A new random order every epoch (default false).
    pub fn shuffle(mut self, shuffle: bool) -> Self {
        self.opts.shuffle = shuffle;
        self
    }

    /// A custom index sampler (excludes `shuffle`).
    pub fn sampler(mut self, sampler: impl Sampler + 'static) -> Self {
        self.sampler = Some(Box::new(sampler));
        self
    }

    /// A custom batch sampler (excludes `batch_size`, `shuffle`, `sampler`, `drop_last`).
    pub fn batch_sampler(mut self, batch_sampler: impl BatchSampling + 'static) -> Self {
        self.batch_sampler = Some(Box::new(batch_sampler));
        self
    }

    /// Drops the last partial batch (default false).
    pub fn drop_last(mut self, drop_last: bool) -> Self {
        self.opts.drop_last = drop_last;
        self
    }

    /// Keeps the worker pool alive across epochs (default false; needs workers).
    pub fn persistent_workers(mut self, persistent_workers: bool) -> Self {
        self.opts.persistent_workers = persistent_workers;
        self
    }

    /// Called in each worker with its id, after the worker is seeded.
    pub fn worker_init_fn(mut self, f: impl Fn(usize) + Send + Sync + 'static) -> Self {
        self.opts.worker_init_fn = Some(Arc::new(f));
        self
    }

    /// The generator for shuffling and worker base seeds (default: a private one seeded from
    /// entropy; see Note [No global RNG]).
    pub fn generator(mut self, generator: Generator) -> Self {
        self.opts.generator = Some(generator);
        self
    }

    /// Replaces the collate (`collate_fn`). A `pin_memory(true)` given before is dropped (it
    /// was for the old collate's batches): ask for it after the collate.
    pub fn collate<C2: Collate<D>>(self, collate: C2) -> DataLoaderBuilder<D, C2> {
        DataLoaderBuilder {
            dataset: self.dataset,
            collate,
            sampler: self.sampler,
            batch_sampler: self.batch_sampler,
            opts: self.opts.recollate(),
        }
    }

    /// A closure from a batch's items to the batch (`collate_fn`).
    pub fn collate_fn<F, B>(self, f: F) -> DataLoaderBuilder<D, CollateFn<F>>
    where
        F: Fn(Vec<D::Item>) -> Result<B> + Send + Sync + 'static,
        B: Send + 'static,
    {
        self.collate(CollateFn(f))
    }

    /// Validates the options and builds the loader.
    ///
    /// # Errors
    /// [`DataError::InvalidOption`] with PyTorch's message for: negative `num_workers`, negative
    /// (or NaN) `timeout`, and with berth's for more than [`MAX_WORKERS`] workers; a `timeout` too large for a [`Duration`] (infinity included: 0 is
    /// "no limit"), `prefetch_factor` without workers, negative (or zero) `prefetch_factor`,
    /// `persistent_workers` without workers, `sampler` with `shuffle`, `batch_sampler` with
    /// `batch_size`/`shuffle`/`sampler`/`drop_last`, `batch_size = 0`; and a positive `timeout`
    /// without workers. [`DataError::Spawn`] is not possible here (workers start lazily).
    pub fn build(self) -> Result<DataLoader<D, C>> {
        let mut opts = self.opts;
        let workers = opts.validated_workers()?;
        opts.check_timeout(&workers)?;
        if self.sampler.is_some() && opts.shuffle {
            return Err(DataError::option(
                "sampler",
                "sampler option is mutually exclusive with shuffle",
            ));
        }
        let generator = opts
            .generator
            .take()
            .unwrap_or_else(Generator::from_entropy);
        let batch_sampler: Box<dyn BatchSampling> = match self.batch_sampler {
            Some(bs) => {
                if opts.batch_size != 1 || opts.shuffle || self.sampler.is_some() || opts.drop_last
                {
                    return Err(DataError::option(
                        "batch_sampler",
                        "batch_sampler option is mutually exclusive with batch_size, shuffle, sampler, and drop_last",
                    ));
                }
                bs
            }
            None => {
                let n = self.dataset.len();
                let sampler: Box<dyn Sampler> = match self.sampler {
                    Some(s) => s,
                    None if opts.shuffle => {
                        Box::new(RandomSampler::new(n, Some(generator.clone())))
                    }
                    None => Box::new(SequentialSampler::new(n)),
                };
                Box::new(BatchSampler::new(sampler, opts.batch_size, opts.drop_last)?)
            }
        };
        let (dataset, collate) = (self.dataset, self.collate);
        let core = opts.into_core(workers, generator, |pin, init| WorkerShared {
            dataset,
            collate: Arc::new(collate),
            pin,
            init,
        });
        Ok(DataLoader {
            core,
            batch_sampler: Mutex::new(batch_sampler),
        })
    }
}

impl<D: Dataset, C: Collate<D>> DataLoaderBuilder<D, C>
where
    C::Batch: PinMemory,
{
    /// Puts batches in page-locked host memory (default false): collates write straight into
    /// buffers of the pinned host caching allocator, then the batch's own
    /// [`PinMemory::pin_memory`] runs in the worker. Without an accelerator (and without
    /// [`pin_memory_target`](Self::pin_memory_target)) this warns once and loads normally.
    pub fn pin_memory(mut self, pin_memory: bool) -> Self {
        self.opts.set_pin_memory(pin_memory);
        self
    }
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
        warn_once(
            "workers>cpus",
            &format!(
                "This DataLoader will create {num_workers} worker threads in total. Our suggested max number of worker in current system is {cpus}, which is smaller than what this DataLoader is going to create. Please be aware that excessive worker creation might get DataLoader running slow, lower the worker number to avoid potential slowness if necessary."
            ),
        );
    }
}

/// The pin step a loader runs, if `pin_memory` was asked for and a pinned host exists (else a
/// warning once, and no pinning).
pub(crate) fn resolve_pin<B>(
    pin_memory: bool,
    pin_fn: Option<PinFn<B>>,
    pin_target: Option<PinTarget>,
) -> Option<(PinTarget, PinFn<B>)> {
    match pin_fn {
        Some(f) if pin_memory => match pin_target.or_else(PinTarget::default_for_host) {
            Some(t) => Some((t, f)),
            None => {
                warn_once(
                    "pin_memory-no-accelerator",
                    "'pin_memory' argument is set as true but no accelerator is found, then device pinned memory won't be used.",
                );
                None
            }
        },
        _ => None,
    }
}
