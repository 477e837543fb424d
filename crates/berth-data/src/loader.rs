//! `DataLoader`: the map-style loader, its builder and its epoch iterator [`LoaderIter`].
//!
//! The options and their validation are in `src/options.rs`, the machinery both loader kinds
//! share (workers, consumer, fetch) in `src/worker.rs`, `src/iter.rs` and `src/fetch.rs`.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use berth::Device;

use crate::batch::MapTensors;
use crate::batch_sampler::{BatchSampler, BatchSampling};
use crate::collatable::Collatable;
use crate::collate::{Collate, CollateFn, DefaultCollate};
use crate::dataset::Dataset;
use crate::error::{DataError, Result};
use crate::fetch::WorkerShared;
use crate::iter::{Batches, Core, Epoch, Plan};
use crate::options::{loader_option_setters, LoaderOptions};
use crate::pinning::pin_fn;
use crate::rng::Generator;
use crate::sampler::{RandomSampler, Sampler, SequentialSampler};

/// Loads batches from a map-style [`Dataset`] with PyTorch's `DataLoader` semantics: batches in
/// sampler order whatever `num_workers`, `prefetch_factor × num_workers` batches in flight, worker
/// errors delivered at their batch, clean shutdown on drop. Built with [`DataLoader::builder`].
///
/// See Note [Workers are threads] in [`crate::worker`] for how workers map to PyTorch's.
pub struct DataLoader<D: Dataset, C: Collate<D::Item> = DefaultCollate> {
    pub(crate) core: Core<WorkerShared<D, C>>,
    pub(crate) batch_sampler: Mutex<Box<dyn BatchSampling>>,
}

impl<D: Dataset, C: Collate<D::Item>> std::fmt::Debug for DataLoader<D, C> {
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

impl<D: Dataset, C: Collate<D::Item>> DataLoader<D, C> {
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

    /// The `pin_memory_device` of a loader that pins; `None` when it does not pin or none was
    /// given.
    pub fn pin_memory_device(&self) -> Option<Device> {
        self.core.shared.pin.as_ref().and_then(|p| p.device())
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

impl<'a, D: Dataset, C: Collate<D::Item>> IntoIterator for &'a DataLoader<D, C> {
    type Item = Result<C::Batch>;
    type IntoIter = LoaderIter<'a, D, C>;
    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

/// Builds a [`DataLoader`]; option names and defaults are PyTorch's, and
/// [`build`](DataLoaderBuilder::build) rejects the combinations PyTorch rejects, with its messages.
pub struct DataLoaderBuilder<D: Dataset, C: Collate<D::Item>> {
    dataset: Arc<D>,
    collate: C,
    sampler: Option<Box<dyn Sampler>>,
    batch_sampler: Option<Box<dyn BatchSampling>>,
    opts: LoaderOptions<C::Batch>,
}

impl<D: Dataset, C: Collate<D::Item>> DataLoaderBuilder<D, C> {
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
    pub fn collate<C2: Collate<D::Item>>(self, collate: C2) -> DataLoaderBuilder<D, C2> {
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
    /// (or NaN) `timeout`, and with berth's for more than [`MAX_WORKERS`](crate::MAX_WORKERS) workers; a `timeout` too large for a [`Duration`] (infinity included: 0 is
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
        let shared = WorkerShared {
            dataset: self.dataset,
            collate: Arc::new(self.collate),
            pin: opts.pinning(),
            init: opts.worker_init_fn.take(),
        };
        let core = Core::new(shared, &opts, workers, generator);
        Ok(DataLoader {
            core,
            batch_sampler: Mutex::new(batch_sampler),
        })
    }
}

impl<D: Dataset, C: Collate<D::Item>> DataLoaderBuilder<D, C>
where
    C::Batch: MapTensors,
{
    /// Puts batches in page-locked host memory (default false): collates write straight into
    /// buffers of the pinned host caching allocator, then [`pin_memory`](crate::pin_memory)
    /// walks the batch in the worker (through the batch's [`MapTensors`]). Without an
    /// accelerator (and without [`pin_memory_target`](Self::pin_memory_target)) this warns once
    /// and loads normally (Note [Where pinning is decided]).
    pub fn pin_memory(mut self, pin_memory: bool) -> Self {
        self.opts.pin_fn = pin_memory.then(pin_fn::<C::Batch>);
        self
    }
}

/// One epoch of a map-style [`DataLoader`]: batches in sampler order.
///
/// # Errors
/// - A batch whose loading failed in a worker yields `Err` ([`DataError::InWorker`]; a panic in
///   the dataset or the collate, caught in the worker, [`DataError::WorkerPanicked`]; a panic
///   in `worker_init_fn`, [`DataError::WorkerInitPanicked`]) at its turn, and the epoch goes on
///   with the next batch (PyTorch's `ExceptionWrapper`).
/// - Without workers (`num_workers = 0`) a failed batch yields [`DataError::InBatch`], but a
///   *panic* in [`Dataset::get`], the collate or the pin step is not caught: it unwinds out of
///   [`next`](Iterator::next) on the calling thread, as PyTorch with `num_workers=0` raises the
///   dataset's exception straight out of `__next__`. With workers the same panic is caught in
///   the worker and reported as [`DataError::WorkerPanicked`] at its batch.
/// - A timeout ([`DataError::Timeout`], PyTorch's "DataLoader timed out after N seconds"), a
///   dead worker ([`DataError::WorkersExited`]) or a failed start ([`DataError::Spawn`]) is
///   yielded once, then the epoch is over and `next` returns `None`. After a timeout the
///   consumer does not wait for the late batch: the workers are told to stop (a persistent
///   pool goes back to the loader for the next epoch) and a worker busy with an item ends once
///   that item returns.
///
/// [`size_hint`](Iterator::size_hint)'s upper bound is the number of batches left (one item
/// for a failed start). Dropping the iterator mid-epoch stops and joins the workers (or, with
/// `persistent_workers`, returns the pool to the loader).
pub struct LoaderIter<'a, D: Dataset, C: Collate<D::Item>> {
    epoch: Epoch<'a, WorkerShared<D, C>>,
}

impl<'a, D: Dataset, C: Collate<D::Item>> LoaderIter<'a, D, C> {
    fn new(loader: &'a DataLoader<D, C>) -> Self {
        let epoch = Epoch::new(&loader.core, || {
            let mut bs = loader
                .batch_sampler
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            Plan::Batches(Batches::new(bs.epoch_iter(), bs.len()))
        });
        LoaderIter { epoch }
    }

    /// Number of batches left in this epoch.
    pub fn remaining(&self) -> usize {
        self.epoch.remaining().unwrap_or(0)
    }

    /// The base seed drawn for this iterator from the loader's generator (its workers' seeds
    /// are `base_seed + worker_id`); with `persistent_workers`, the pool's base seed, drawn once.
    pub fn base_seed(&self) -> u64 {
        self.epoch.base_seed()
    }
}

impl<D: Dataset, C: Collate<D::Item>> Iterator for LoaderIter<'_, D, C> {
    type Item = Result<C::Batch>;

    fn next(&mut self) -> Option<Self::Item> {
        self.epoch.next()
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (0, self.epoch.max_items())
    }
}
