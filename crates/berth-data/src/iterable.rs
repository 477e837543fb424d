//! `IterableDataLoader`: a `DataLoader` over an [`IterableDataset`], with PyTorch's semantics
//! (see [`IterableDataset`] for the rules: one stream per worker, batches formed in the worker,
//! round-robin order, per-worker `drop_last`).
//!
//! It runs on the same machinery as the map-style [`DataLoader`](crate::DataLoader): the worker
//! pool and its seeding ([`crate::worker`]), the consumer with its reorder buffer, prefetch and
//! timeout (`src/iter.rs`), pinned collation (`src/pinning.rs`) and the collates
//! ([`DefaultCollate`], [`CollateFn`]); only the fetch differs.

use std::sync::Arc;
use std::time::Duration;

use berth::Device;

use crate::batch::MapTensors;
use crate::batch_sampler::BatchSampling;
use crate::collatable::Collatable;
use crate::collate::{Collate, CollateFn, DefaultCollate};
use crate::dataset::IterableDataset;
use crate::error::{DataError, Result};
use crate::fetch::IterShared;
use crate::iter::{Core, Epoch, Plan};
use crate::options::{loader_option_setters, LoaderOptions};
use crate::pinning::pin_fn;
use crate::rng::Generator;
use crate::sampler::Sampler;

/// Loads batches from an [`IterableDataset`] with PyTorch's `DataLoader` semantics: every worker
/// iterates its own stream and batches it, the workers' batches are interleaved round-robin, a
/// worker whose stream ends is skipped, and the epoch ends when all have ended. Built with
/// [`IterableDataLoader::builder`]. See [`IterableDataset`] for the rules in full.
pub struct IterableDataLoader<D: IterableDataset, C: Collate<D::Item> = DefaultCollate> {
    core: Core<IterShared<D, C>>,
}

impl<D: IterableDataset, C: Collate<D::Item>> std::fmt::Debug for IterableDataLoader<D, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IterableDataLoader")
            .field("batch_size", &self.batch_size())
            .field("drop_last", &self.drop_last())
            .field("num_workers", &self.core.num_workers)
            .field("prefetch_factor", &self.core.prefetch_factor)
            .field("persistent_workers", &self.core.persistent_workers)
            .field("timeout", &self.core.timeout)
            .field("pin_memory", &self.pin_memory())
            .finish_non_exhaustive()
    }
}

impl<D: IterableDataset> IterableDataLoader<D, DefaultCollate>
where
    D::Item: Collatable,
{
    /// A builder with PyTorch's defaults: `batch_size = 1`, `drop_last = false`,
    /// `num_workers = 0`, `default_collate`.
    pub fn builder(dataset: impl Into<Arc<D>>) -> IterableDataLoaderBuilder<D, DefaultCollate> {
        IterableDataLoaderBuilder::with_collate(dataset, DefaultCollate)
    }
}

impl<D: IterableDataset, C: Collate<D::Item>> IterableDataLoader<D, C> {
    /// Batches per epoch when the dataset knows its length (`len(loader)`):
    /// `ceil(len / batch_size)`, or `floor` with `drop_last`, as PyTorch computes it. With workers
    /// the real count can differ (each worker keeps or drops its own partial batch, and an
    /// unsharded dataset is read once per worker); `None` without a length.
    pub fn len(&self) -> Option<usize> {
        let n = self.core.shared.dataset.len_hint()?;
        let bs = self.core.shared.batch_size;
        Some(if self.core.shared.drop_last {
            n / bs
        } else {
            n.div_ceil(bs)
        })
    }

    /// Whether [`len`](Self::len) is known to be zero.
    pub fn is_empty(&self) -> bool {
        self.len() == Some(0)
    }

    /// Items per batch.
    pub fn batch_size(&self) -> usize {
        self.core.shared.batch_size
    }

    /// Whether each worker drops its last partial batch.
    pub fn drop_last(&self) -> bool {
        self.core.shared.drop_last
    }

    /// Worker threads (0: load on the calling thread).
    pub fn num_workers(&self) -> usize {
        self.core.num_workers
    }

    /// Batches requested in advance per worker; `None` without workers.
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

    /// The loader's generator (worker base seeds).
    pub fn generator(&self) -> &Generator {
        &self.core.generator
    }

    /// The dataset.
    pub fn dataset(&self) -> &Arc<D> {
        &self.core.shared.dataset
    }

    /// Starts an epoch: draws the workers' `base_seed` from the loader's generator (unless a
    /// persistent pool already exists); without workers, calls the dataset's
    /// [`iter`](IterableDataset::iter) on this thread.
    pub fn iter(&self) -> IterableLoaderIter<'_, D, C> {
        IterableLoaderIter {
            epoch: Epoch::new(&self.core, || Plan::Stream),
        }
    }
}

impl<'a, D: IterableDataset, C: Collate<D::Item>> IntoIterator for &'a IterableDataLoader<D, C> {
    type Item = Result<C::Batch>;
    type IntoIter = IterableLoaderIter<'a, D, C>;
    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

/// One epoch of an [`IterableDataLoader`]: the workers' batches, round-robin, until every stream
/// has ended. Yields `Err` for a batch whose loading failed and goes on; after a timeout, a dead
/// worker or a failed start it yields that error once, then ends (see
/// [`LoaderIter`](crate::LoaderIter) for the details, and [`IterableDataset`] for the rules).
/// Without workers a panic in the stream is not caught and unwinds out of `next`, as PyTorch
/// with `num_workers=0` raises the stream's exception; with workers it is reported as
/// [`DataError::WorkerPanicked`]. Dropping it mid-epoch stops and joins the workers (or, with
/// `persistent_workers`, returns the pool to the loader).
pub struct IterableLoaderIter<'a, D: IterableDataset, C: Collate<D::Item>> {
    epoch: Epoch<'a, IterShared<D, C>>,
}

impl<D: IterableDataset, C: Collate<D::Item>> IterableLoaderIter<'_, D, C> {
    /// The base seed drawn for this iterator from the loader's generator (its workers' seeds
    /// are `base_seed + worker_id`); with `persistent_workers`, the pool's base seed, drawn once.
    pub fn base_seed(&self) -> u64 {
        self.epoch.base_seed()
    }
}

impl<D: IterableDataset, C: Collate<D::Item>> Iterator for IterableLoaderIter<'_, D, C> {
    type Item = Result<C::Batch>;
    fn next(&mut self) -> Option<Self::Item> {
        self.epoch.next()
    }
}

/// Builds an [`IterableDataLoader`]; option names and defaults are PyTorch's, and
/// [`build`](Self::build) refuses what PyTorch refuses for an iterable dataset, with its messages.
pub struct IterableDataLoaderBuilder<D: IterableDataset, C: Collate<D::Item>> {
    dataset: Arc<D>,
    collate: C,
    /// The type names of a `sampler` / `batch_sampler` given (to be refused).
    sampler: Option<&'static str>,
    batch_sampler: Option<&'static str>,
    opts: LoaderOptions<C::Batch>,
}

impl<D: IterableDataset, C: Collate<D::Item>> IterableDataLoaderBuilder<D, C> {
    /// A builder over `dataset` with the collate `collate`.
    pub fn with_collate(dataset: impl Into<Arc<D>>, collate: C) -> Self {
        IterableDataLoaderBuilder {
            dataset: dataset.into(),
            collate,
            sampler: None,
            batch_sampler: None,
            opts: LoaderOptions::default(),
        }
    }

    loader_option_setters!();

    /// Items per batch, taken from one worker's stream (default 1).
    pub fn batch_size(mut self, batch_size: usize) -> Self {
        self.opts.batch_size = batch_size;
        self
    }

    /// Drops each worker's last partial batch (default false).
    pub fn drop_last(mut self, drop_last: bool) -> Self {
        self.opts.drop_last = drop_last;
        self
    }

    /// Accepted for parity with PyTorch: `shuffle(true)` makes [`build`](Self::build) fail (a
    /// stream has no order to shuffle); `shuffle(false)` is the default.
    pub fn shuffle(mut self, shuffle: bool) -> Self {
        self.opts.shuffle = shuffle;
        self
    }

    /// Accepted for parity with PyTorch: any sampler makes [`build`](Self::build) fail (a stream
    /// is never indexed).
    pub fn sampler<S: Sampler + 'static>(mut self, _sampler: S) -> Self {
        self.sampler = Some(std::any::type_name::<S>());
        self
    }

    /// Accepted for parity with PyTorch: any batch sampler makes [`build`](Self::build) fail.
    pub fn batch_sampler<S: BatchSampling + 'static>(mut self, _batch_sampler: S) -> Self {
        self.batch_sampler = Some(std::any::type_name::<S>());
        self
    }

    /// Keeps the worker pool alive across epochs (default false; needs workers). Each epoch
    /// still starts a fresh stream in every worker.
    pub fn persistent_workers(mut self, persistent_workers: bool) -> Self {
        self.opts.persistent_workers = persistent_workers;
        self
    }

    /// Called in each worker with its id, after the worker is seeded and before its stream is
    /// started.
    pub fn worker_init_fn(mut self, f: impl Fn(usize) + Send + Sync + 'static) -> Self {
        self.opts.worker_init_fn = Some(Arc::new(f));
        self
    }

    /// The generator for the workers' base seeds (default: a private one seeded from entropy;
    /// see Note [No global RNG]).
    pub fn generator(mut self, generator: Generator) -> Self {
        self.opts.generator = Some(generator);
        self
    }

    /// Replaces the collate (`collate_fn`). A `pin_memory(true)` given before is dropped (it
    /// was for the old collate's batches): ask for it after the collate.
    pub fn collate<C2: Collate<D::Item>>(self, collate: C2) -> IterableDataLoaderBuilder<D, C2> {
        IterableDataLoaderBuilder {
            dataset: self.dataset,
            collate,
            sampler: self.sampler,
            batch_sampler: self.batch_sampler,
            opts: self.opts.recollate(),
        }
    }

    /// A closure from a batch's items to the batch (`collate_fn`).
    pub fn collate_fn<F, B>(self, f: F) -> IterableDataLoaderBuilder<D, CollateFn<F>>
    where
        F: Fn(Vec<D::Item>) -> Result<B> + Send + Sync + 'static,
        B: Send + 'static,
    {
        self.collate(CollateFn(f))
    }

    /// Validates the options and builds the loader.
    ///
    /// # Errors
    /// [`DataError::InvalidOption`], in PyTorch's order and with its messages: the worker
    /// options as for [`DataLoaderBuilder::build`](crate::DataLoaderBuilder::build), then
    /// "DataLoader with `IterableDataset`: expected unspecified shuffle option, but got
    /// shuffle=True", the same for `sampler=` and `batch_sampler=` (naming the type given, where
    /// PyTorch prints the object), then `batch_size = 0` and a positive `timeout` without
    /// workers.
    pub fn build(self) -> Result<IterableDataLoader<D, C>> {
        let mut opts = self.opts;
        let workers = opts.validated_workers()?;
        // torch/utils/data/dataloader.py, DataLoader.__init__ (the IterableDataset branch).
        if opts.shuffle {
            return Err(DataError::option(
                "shuffle",
                "DataLoader with IterableDataset: expected unspecified shuffle option, but got shuffle=True",
            ));
        }
        if let Some(name) = self.sampler {
            return Err(DataError::option(
                "sampler",
                format!("DataLoader with IterableDataset: expected unspecified sampler option, but got sampler={name}"),
            ));
        }
        if let Some(name) = self.batch_sampler {
            return Err(DataError::option(
                "batch_sampler",
                format!("DataLoader with IterableDataset: expected unspecified batch_sampler option, but got batch_sampler={name}"),
            ));
        }
        if opts.batch_size == 0 {
            return Err(DataError::option(
                "batch_size",
                "batch_size should be a positive integer value, but got batch_size=0",
            ));
        }
        opts.check_timeout(&workers)?;
        let generator = opts
            .generator
            .take()
            .unwrap_or_else(Generator::from_entropy);
        let shared = IterShared {
            dataset: self.dataset,
            collate: Arc::new(self.collate),
            pin: opts.pinning(),
            init: opts.worker_init_fn.take(),
            batch_size: opts.batch_size,
            drop_last: opts.drop_last,
        };
        let core = Core::new(shared, &opts, workers, generator);
        Ok(IterableDataLoader { core })
    }
}

impl<D: IterableDataset, C: Collate<D::Item>> IterableDataLoaderBuilder<D, C>
where
    C::Batch: MapTensors,
{
    /// Puts batches in page-locked host memory (default false), as for a map-style loader: the
    /// collate writes into pinned buffers and [`pin_memory`](crate::pin_memory) walks the batch
    /// in the worker (through its [`MapTensors`]). Without an accelerator (and without
    /// [`pin_memory_target`](Self::pin_memory_target)) this warns once and loads normally
    /// (Note [Where pinning is decided]).
    pub fn pin_memory(mut self, pin_memory: bool) -> Self {
        self.opts.pin_fn = pin_memory.then(pin_fn::<C::Batch>);
        self
    }
}
