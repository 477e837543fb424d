//! Collation for a loader: [`Collate`] (PyTorch's `collate_fn`), [`DefaultCollate`]
//! (`default_collate`) and [`CollateFn`] (a closure).
//!
//! # The collate traits, and why two remain
//! PyTorch's batch step has three pieces: `default_collate` (per-type rules over the samples),
//! `default_convert` (the same walk without stacking, for `batch_size=None`) and the
//! `collate_fn` the loader calls. berth-data has two traits:
//! 1. [`Collatable`](crate::Collatable): `default_collate`'s rule for one sample type (a tensor
//!    stacks, a number becomes a 1-D tensor, containers recurse). It is a trait because the rule
//!    is chosen by the sample's type, as PyTorch dispatches on the first element's type.
//! 2. [`Collate`]: what a loader calls, the `collate_fn`: from the items of one batch to the
//!    batch. The same trait serves both loader kinds: a map-style
//!    [`DataLoader`](crate::DataLoader) calls [`Collate::collate_indices`] (the items fetched
//!    by index, PyTorch's `_MapDatasetFetcher`), an
//!    [`IterableDataLoader`](crate::IterableDataLoader) calls [`Collate::collate`] on the items
//!    taken from a worker's stream. [`DefaultCollate`] applies [`Collatable`]; [`CollateFn`]
//!    wraps a closure.
//!
//! `default_convert` has no trait: without auto-collation a Rust sample already is its own
//! batch (there are no numpy arrays to convert). What happens to a batch *after* collation
//! (pinning, the copy to a device) is not collation: it is one per-tensor map over the batch,
//! [`MapTensors`](crate::MapTensors) (Note [One batch traversal]). The map-style fast path
//! [`Dataset::collate_batch`] (a dataset that gathers a batch's rows straight into one
//! buffer, e.g. [`TensorDataset`](crate::TensorDataset)) is called from one place,
//! [`DefaultCollate`]'s [`collate_indices`](Collate::collate_indices).

use crate::collatable::{Collatable, CollateContext};
use crate::dataset::Dataset;
use crate::error::Result;

/// How a loader turns the items of one batch into a batch (`collate_fn`), for items of type `T`.
///
/// Implement [`collate`](Collate::collate); a map-style loader calls
/// [`collate_indices`](Collate::collate_indices), whose default fetches the items with
/// [`Dataset::get_many`] first.
pub trait Collate<T>: Send + Sync + 'static {
    /// The batch type the loader yields.
    type Batch: Send + 'static;

    /// Collates `items` (at least one) into a batch.
    ///
    /// # Errors
    /// The collate's own errors ([`DataError::Collate`](crate::DataError::Collate), tensor
    /// errors).
    fn collate(&self, items: Vec<T>, ctx: &CollateContext) -> Result<Self::Batch>;

    /// Fetches the items at `indices` from `dataset` and collates them (what a map-style loader
    /// runs per batch). The default is [`Dataset::get_many`], then [`collate`](Collate::collate).
    ///
    /// # Errors
    /// The dataset's errors and the collate's own.
    fn collate_indices<D: Dataset<Item = T>>(
        &self,
        dataset: &D,
        indices: &[usize],
        ctx: &CollateContext,
    ) -> Result<Self::Batch> {
        self.collate(dataset.get_many(indices)?, ctx)
    }
}

/// `default_collate`: [`Collatable::collate`] over the items; for a map-style dataset,
/// [`Dataset::collate_batch`] first when the dataset offers it.
#[derive(Debug, Clone, Copy, Default)]
pub struct DefaultCollate;

impl<T: Collatable> Collate<T> for DefaultCollate {
    type Batch = T::Batch;

    fn collate(&self, items: Vec<T>, ctx: &CollateContext) -> Result<T::Batch> {
        T::collate(items, ctx)
    }

    fn collate_indices<D: Dataset<Item = T>>(
        &self,
        dataset: &D,
        indices: &[usize],
        ctx: &CollateContext,
    ) -> Result<T::Batch> {
        if let Some(batch) = dataset.collate_batch(indices, ctx) {
            return batch;
        }
        T::collate(dataset.get_many(indices)?, ctx)
    }
}

/// A custom `collate_fn`: a closure from the batch's items to the batch.
pub struct CollateFn<F>(pub F);

impl<F> std::fmt::Debug for CollateFn<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CollateFn(..)")
    }
}

impl<T, F, B> Collate<T> for CollateFn<F>
where
    F: Fn(Vec<T>) -> Result<B> + Send + Sync + 'static,
    B: Send + 'static,
{
    type Batch = B;
    fn collate(&self, items: Vec<T>, _ctx: &CollateContext) -> Result<B> {
        (self.0)(items)
    }
}
