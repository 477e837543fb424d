//! Fetchers: what a worker (or the main thread, with `num_workers = 0`) runs for one task, for
//! either kind of dataset (PyTorch's `_MapDatasetFetcher` and `_IterableDatasetFetcher`,
//! <https://github.com/pytorch/pytorch/blob/main/torch/utils/data/_utils/fetch.py>).
//!
//! The worker threads, the task and result channels, the reorder buffer, prefetching, pinning and
//! timeouts are written once ([`crate::worker`], [`crate::iter`]) over the [`Fetcher`] trait; only
//! the fetch differs: a map-style task is a list of indices, an iterable task is "the next batch
//! of this worker's stream".

use std::any::Any;
use std::sync::Arc;

use crate::collate::Collate;
use crate::dataset::{Dataset, IterableDataset};
use crate::error::Result;
use crate::options::WorkerInitFn;
use crate::pinning::{context, Pinning};

/// The per-kind part of loading: a stream of state per worker and epoch, and one fetch per task.
pub(crate) trait Fetcher: Clone + Send + Sync + 'static {
    /// The batch a task yields.
    type Batch: Send + 'static;
    /// A worker's state for one epoch (an iterable dataset's stream; nothing for map-style).
    type Stream<'a>: Send
    where
        Self: 'a;
    /// Whether a panic while fetching ends the stream. An iterator that unwound in `next` is in
    /// an unknown state and is not polled again; a map-style fetch has no state to lose.
    const PANIC_ENDS_STREAM: bool;

    /// The dataset, for [`WorkerInfo::dataset`](crate::WorkerInfo::dataset).
    fn dataset_any(&self) -> Arc<dyn Any + Send + Sync>;

    /// `worker_init_fn`.
    fn init(&self) -> Option<&WorkerInitFn>;

    /// A fresh stream for one epoch of one worker (or of the main thread).
    fn start(&self) -> Self::Stream<'_>;

    /// Runs one task: `Some(batch or error)`, or `None` when the stream is exhausted (PyTorch's
    /// `StopIteration`, sent to the main side as `_IterableDatasetStopIteration`).
    fn fetch<'a>(
        &'a self,
        stream: &mut Self::Stream<'a>,
        indices: &[usize],
        worker_id: Option<usize>,
    ) -> Option<Result<Self::Batch>>;
}

/// The pin step after a collate, when the loader pins (Note [Where pinning is decided]).
fn finish<B>(pin: Option<&Pinning<B>>, batch: Result<B>) -> Result<B> {
    match pin {
        Some(p) => batch.and_then(|b| p.finish(b)),
        None => batch,
    }
}

/// What every worker of a map-style loader needs, shared.
pub(crate) struct WorkerShared<D: Dataset, C: Collate<D::Item>> {
    pub dataset: Arc<D>,
    pub collate: Arc<C>,
    pub pin: Option<Pinning<C::Batch>>,
    pub init: Option<WorkerInitFn>,
}

impl<D: Dataset, C: Collate<D::Item>> Clone for WorkerShared<D, C> {
    fn clone(&self) -> Self {
        WorkerShared {
            dataset: Arc::clone(&self.dataset),
            collate: Arc::clone(&self.collate),
            pin: self.pin.clone(),
            init: self.init.clone(),
        }
    }
}

/// Runs one map-style batch: fetch, collate (into pinned buffers when pinning), then the batch's
/// own `pin_memory` step.
pub(crate) fn load_batch<D: Dataset, C: Collate<D::Item>>(
    shared: &WorkerShared<D, C>,
    indices: &[usize],
    worker_id: Option<usize>,
) -> Result<C::Batch> {
    let pin = shared.pin.as_ref();
    let ctx = context(pin, worker_id);
    finish(
        pin,
        shared
            .collate
            .collate_indices(&*shared.dataset, indices, &ctx),
    )
}

impl<D: Dataset, C: Collate<D::Item>> Fetcher for WorkerShared<D, C> {
    type Batch = C::Batch;
    type Stream<'a> = ();
    const PANIC_ENDS_STREAM: bool = false;

    fn dataset_any(&self) -> Arc<dyn Any + Send + Sync> {
        Arc::clone(&self.dataset) as Arc<dyn Any + Send + Sync>
    }
    fn init(&self) -> Option<&WorkerInitFn> {
        self.init.as_ref()
    }
    fn start(&self) {}
    fn fetch(
        &self,
        _stream: &mut (),
        indices: &[usize],
        worker_id: Option<usize>,
    ) -> Option<Result<C::Batch>> {
        Some(load_batch(self, indices, worker_id))
    }
}

/// What every worker of an iterable loader needs, shared.
pub(crate) struct IterShared<D: IterableDataset, C: Collate<D::Item>> {
    pub dataset: Arc<D>,
    pub collate: Arc<C>,
    pub pin: Option<Pinning<C::Batch>>,
    pub init: Option<WorkerInitFn>,
    /// Items per batch.
    pub batch_size: usize,
    pub drop_last: bool,
}

impl<D: IterableDataset, C: Collate<D::Item>> Clone for IterShared<D, C> {
    fn clone(&self) -> Self {
        IterShared {
            dataset: Arc::clone(&self.dataset),
            collate: Arc::clone(&self.collate),
            pin: self.pin.clone(),
            init: self.init.clone(),
            batch_size: self.batch_size,
            drop_last: self.drop_last,
        }
    }
}

/// One worker's stream of an iterable dataset for one epoch.
pub(crate) struct ItemStream<'a, T> {
    items: Box<dyn Iterator<Item = Result<T>> + Send + 'a>,
    /// The iterator returned `None` (PyTorch's `_IterableDatasetFetcher.ended`).
    ended: bool,
}

impl<D: IterableDataset, C: Collate<D::Item>> Fetcher for IterShared<D, C> {
    type Batch = C::Batch;
    type Stream<'a> = ItemStream<'a, D::Item>;
    const PANIC_ENDS_STREAM: bool = true;

    fn dataset_any(&self) -> Arc<dyn Any + Send + Sync> {
        Arc::clone(&self.dataset) as Arc<dyn Any + Send + Sync>
    }
    fn init(&self) -> Option<&WorkerInitFn> {
        self.init.as_ref()
    }
    fn start(&self) -> ItemStream<'_, D::Item> {
        ItemStream {
            items: self.dataset.iter(),
            ended: false,
        }
    }

    /// PyTorch's `_IterableDatasetFetcher.fetch` with auto-collation: up to `batch_size` items;
    /// none, or fewer than `batch_size` with `drop_last`, ends the stream. An item error fails
    /// this batch (the items already taken for it are dropped, as in PyTorch) and the stream
    /// goes on with the next batch.
    fn fetch<'a>(
        &'a self,
        stream: &mut ItemStream<'a, D::Item>,
        _indices: &[usize],
        worker_id: Option<usize>,
    ) -> Option<Result<C::Batch>> {
        if stream.ended {
            return None;
        }
        let mut items = Vec::with_capacity(self.batch_size);
        while items.len() < self.batch_size {
            match stream.items.next() {
                Some(Ok(item)) => items.push(item),
                Some(Err(e)) => return Some(Err(e)),
                None => {
                    stream.ended = true;
                    break;
                }
            }
        }
        if items.is_empty() || (self.drop_last && items.len() < self.batch_size) {
            stream.ended = true;
            return None;
        }
        let pin = self.pin.as_ref();
        let ctx = context(pin, worker_id);
        Some(finish(pin, self.collate.collate(items, &ctx)))
    }
}
