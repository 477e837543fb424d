//! Map-style and iterable datasets, [`Subset`] and [`random_split`].

use std::sync::Arc;

use crate::collatable::{Collatable, CollateContext};
use crate::error::{DataError, Result};
use crate::rng::Generator;

/// A map-style dataset: a length and an item by index (`torch.utils.data.Dataset`).
///
/// Datasets are shared by worker threads through an `Arc`, so they are `Send + Sync`; there is no
/// per-worker copy (compare pytorch#13246, copy-on-access memory growth in forked workers).
pub trait Dataset: Send + Sync + 'static {
    /// One sample.
    type Item: Send + 'static;

    /// Number of items.
    fn len(&self) -> usize;

    /// Whether the dataset has no item.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The item at `index`.
    ///
    /// # Errors
    /// [`DataError::IndexOutOfRange`] past the end; the dataset's own errors as
    /// [`DataError::Item`] (see [`DataError::item`]).
    fn get(&self, index: usize) -> Result<Self::Item>;

    /// The items at `indices`, in order (PyTorch's `__getitems__`). The default calls
    /// [`get`](Dataset::get) for each.
    ///
    /// # Errors
    /// The first error of [`get`](Dataset::get).
    fn get_many(&self, indices: &[usize]) -> Result<Vec<Self::Item>> {
        indices.iter().map(|&i| self.get(i)).collect()
    }

    /// Fetches *and* collates a batch in one pass, when the dataset can do better than collating
    /// the items one by one (e.g. [`TensorDataset`](crate::TensorDataset) gathers rows straight
    /// into one, possibly pinned, buffer from [`collate_output`](crate::collate_output)). Only
    /// [`DefaultCollate`](crate::DefaultCollate)'s
    /// [`collate_indices`](crate::Collate::collate_indices) calls this, first, and falls back to
    /// `get_many` + [`Collatable::collate`] on `None`; so it must give what that fallback
    /// gives. The default is `None`.
    ///
    /// # Errors
    /// As [`get`](Dataset::get) and [`Collatable::collate`].
    fn collate_batch(
        &self,
        _indices: &[usize],
        _ctx: &CollateContext,
    ) -> Option<Result<<Self::Item as Collatable>::Batch>>
    where
        Self::Item: Collatable,
    {
        None
    }
}

pub(crate) fn check_index(index: usize, len: usize) -> Result<()> {
    if index < len {
        Ok(())
    } else {
        Err(DataError::IndexOutOfRange { index, len })
    }
}

/// A dataset over a `Vec` of items, cloned on access (a Python list as a dataset).
///
/// (A wrapper rather than `impl Dataset for Vec<T>`, so that `Vec::get` keeps meaning the slice
/// method wherever [`Dataset`] is in scope.)
#[derive(Debug, Clone, Default, PartialEq)]
pub struct VecDataset<T> {
    items: Vec<T>,
}

impl<T> VecDataset<T> {
    /// A dataset of `items`.
    pub fn new(items: Vec<T>) -> Self {
        VecDataset { items }
    }

    /// The items.
    pub fn items(&self) -> &[T] {
        &self.items
    }
}

impl<T> From<Vec<T>> for VecDataset<T> {
    fn from(items: Vec<T>) -> Self {
        VecDataset { items }
    }
}

impl<T: Clone + Send + Sync + 'static> Dataset for VecDataset<T> {
    type Item = T;
    fn len(&self) -> usize {
        self.items.len()
    }
    fn get(&self, index: usize) -> Result<T> {
        check_index(index, self.items.len())?;
        Ok(self.items[index].clone())
    }
}

impl<D: Dataset + ?Sized> Dataset for Arc<D> {
    type Item = D::Item;
    fn len(&self) -> usize {
        (**self).len()
    }
    fn get(&self, index: usize) -> Result<D::Item> {
        (**self).get(index)
    }
    fn get_many(&self, indices: &[usize]) -> Result<Vec<D::Item>> {
        (**self).get_many(indices)
    }
    fn collate_batch(
        &self,
        indices: &[usize],
        ctx: &CollateContext,
    ) -> Option<Result<<Self::Item as Collatable>::Batch>>
    where
        Self::Item: Collatable,
    {
        (**self).collate_batch(indices, ctx)
    }
}

/// An iterable-style dataset: a stream, never indexed (`torch.utils.data.IterableDataset`,
/// <https://github.com/pytorch/pytorch/blob/main/torch/utils/data/dataset.py>), loaded by an
/// [`IterableDataLoader`](crate::IterableDataLoader).
///
/// # How it is loaded
/// The rules are PyTorch's (`torch/utils/data/dataloader.py`, `_utils/worker.py` and
/// `_utils/fetch.py` under <https://github.com/pytorch/pytorch/tree/main/torch/utils/data>):
/// - **Without workers** (`num_workers = 0`) the calling thread calls [`iter`](Self::iter) once
///   per epoch and batches the stream itself: `batch_size` items per batch, the last partial
///   batch kept unless `drop_last`. [`worker_info`](crate::worker_info) is `None` there.
/// - **With `N` workers** each worker calls [`iter`](Self::iter) for itself, once per epoch: every
///   worker runs its own copy of the stream. The dataset object is shared by the worker threads
///   (an `Arc`, Note [Workers are threads]); what is per worker is the stream. Unless `iter`
///   shards itself by [`worker_info`](crate::worker_info) (`id` of `num_workers`), every item
///   comes out `N` times, which PyTorch's docs call a user error, not a loader bug.
/// - **Batches are formed inside each worker**, from its own stream only: a batch never mixes
///   two workers' items. `drop_last` drops *each worker's* last incomplete batch (PyTorch's
///   `_IterableDatasetFetcher`), so an epoch can drop (or keep) up to `N` partial batches.
/// - **Order**: tasks are dealt round-robin over the workers, 0, 1, …, `N − 1`, 0, …, and
///   batches are handed out in task order, so the loader yields worker 0's first batch, worker
///   1's first batch, …, then each worker's second batch, and so on. A worker whose stream has
///   ended is skipped from then on; the epoch ends when every worker's stream has ended. The
///   sequence does not depend on timing.
/// - **Errors**: an `Err` item fails the batch it would have joined (the items already taken for
///   that batch are dropped, as in PyTorch) and reaches the caller at that batch's turn
///   ([`DataError::InWorker`] with workers, [`DataError::InBatch`] without); the stream goes on
///   with the next batch. A panic in `iter` or in the stream's `next`, in a worker, is caught and
///   reported at its batch ([`DataError::WorkerPanicked`]); that stream is not polled again this
///   epoch (an iterator that unwound is in an unknown state, and a Python generator that raised
///   is finished too), while the worker thread and the other workers carry on. Without workers
///   the same panic is not caught: it unwinds out of the loader iterator's `next` on the calling
///   thread, as PyTorch with `num_workers=0` raises the stream's exception straight out of
///   `__next__`. A panic in `worker_init_fn` is reported at that worker's first batch of each
///   epoch ([`DataError::WorkerInitPanicked`]), and its stream then counts as ended. A timeout
///   ([`DataError::Timeout`]) ends the epoch after that one error.
/// - **Options**: `shuffle`, `sampler` and `batch_sampler` make no sense for a stream and are
///   refused with PyTorch's messages. `persistent_workers`, `prefetch_factor`, `pin_memory`,
///   `timeout`, `worker_init_fn` and `generator` behave as for a map-style loader: a persistent
///   pool starts a fresh stream in each worker every epoch, and `prefetch_factor × num_workers`
///   batches are requested ahead (at most [`PREFETCH_LIMIT`](crate::PREFETCH_LIMIT)
///   per worker, since a stream has no last batch to stop at).
///
/// # Examples
/// Sharding by worker, so that the workers' streams together are the data once (the pattern of
/// PyTorch's `IterableDataset` docs):
/// ```
/// use berth_data::{worker_info, CollateFn, DataError, IterableDataLoaderBuilder, IterableDataset};
///
/// struct Range(usize);
/// impl IterableDataset for Range {
///     type Item = usize;
///     fn iter(&self) -> Box<dyn Iterator<Item = berth_data::Result<usize>> + Send + '_> {
///         let (id, n) = worker_info().map_or((0, 1), |w| (w.id, w.num_workers));
///         Box::new((0..self.0).skip(id).step_by(n).map(Ok))
///     }
/// }
///
/// // Two workers, batches of 2 formed in each worker, taken round-robin.
/// let collate = CollateFn(|v: Vec<usize>| Ok::<_, DataError>(v));
/// let loader = IterableDataLoaderBuilder::with_collate(Range(7), collate)
///     .batch_size(2)
///     .num_workers(2)
///     .build()?;
/// let batches: Vec<Vec<usize>> = loader.iter().collect::<Result<_, _>>()?;
/// assert_eq!(batches, [vec![0, 2], vec![1, 3], vec![4, 6], vec![5]]);
/// # Ok::<(), DataError>(())
/// ```
pub trait IterableDataset: Send + Sync + 'static {
    /// One sample.
    type Item: Send + 'static;

    /// A fresh stream of items (called once per epoch: on the calling thread without workers, in
    /// every worker with them).
    fn iter(&self) -> Box<dyn Iterator<Item = Result<Self::Item>> + Send + '_>;

    /// The number of items one full stream yields, if known (Python's optional `__len__`); the
    /// loader's [`len`](crate::IterableDataLoader::len) is derived from it. The default is `None`.
    fn len_hint(&self) -> Option<usize> {
        None
    }
}

impl<D: IterableDataset + ?Sized> IterableDataset for Arc<D> {
    type Item = D::Item;
    fn iter(&self) -> Box<dyn Iterator<Item = Result<D::Item>> + Send + '_> {
        (**self).iter()
    }
    fn len_hint(&self) -> Option<usize> {
        (**self).len_hint()
    }
}

/// The items of a dataset at given indices (`Subset`).
#[derive(Debug, Clone)]
pub struct Subset<D> {
    dataset: Arc<D>,
    indices: Vec<usize>,
}

impl<D: Dataset> Subset<D> {
    /// The items of `dataset` at `indices`, in that order.
    ///
    /// # Errors
    /// [`DataError::IndexOutOfRange`] when an index is past the end of `dataset`.
    pub fn new(dataset: Arc<D>, indices: Vec<usize>) -> Result<Self> {
        if let Some(&bad) = indices.iter().find(|&&i| i >= dataset.len()) {
            return Err(DataError::IndexOutOfRange {
                index: bad,
                len: dataset.len(),
            });
        }
        Ok(Subset { dataset, indices })
    }

    /// Indices into the parent dataset.
    pub fn indices(&self) -> &[usize] {
        &self.indices
    }

    /// The parent dataset.
    pub fn dataset(&self) -> &Arc<D> {
        &self.dataset
    }
}

impl<D: Dataset> Dataset for Subset<D> {
    type Item = D::Item;
    fn len(&self) -> usize {
        self.indices.len()
    }
    fn get(&self, index: usize) -> Result<D::Item> {
        check_index(index, self.indices.len())?;
        self.dataset.get(self.indices[index])
    }
    fn get_many(&self, indices: &[usize]) -> Result<Vec<D::Item>> {
        let parent = self.map(indices)?;
        self.dataset.get_many(&parent)
    }
    fn collate_batch(
        &self,
        indices: &[usize],
        ctx: &CollateContext,
    ) -> Option<Result<<Self::Item as Collatable>::Batch>>
    where
        Self::Item: Collatable,
    {
        match self.map(indices) {
            Ok(parent) => self.dataset.collate_batch(&parent, ctx),
            Err(e) => Some(Err(e)),
        }
    }
}

impl<D: Dataset> Subset<D> {
    fn map(&self, indices: &[usize]) -> Result<Vec<usize>> {
        indices
            .iter()
            .map(|&i| {
                check_index(i, self.indices.len())?;
                Ok(self.indices[i])
            })
            .collect()
    }
}

/// How [`random_split`] sizes its parts.
#[derive(Debug, Clone, PartialEq)]
pub enum SplitLengths {
    /// Item counts; they must sum to the dataset's length.
    Counts(Vec<usize>),
    /// Fractions, each in `[0, 1]`, summing to 1 (±1e-6): each part gets `floor(len × f)` items,
    /// then the remainder is dealt one item at a time, round-robin from the first part
    /// (PyTorch's rule). Fractions that sum to a little more than 1 can give floors that
    /// already add up to more than `len`; that is [`DataError::SplitLengths`] (PyTorch refuses
    /// any fraction sum above 1 with the same error).
    Fractions(Vec<f64>),
}

/// Splits `dataset` into non-overlapping [`Subset`]s of a random permutation drawn from
/// `generator` (`random_split`,
/// <https://github.com/pytorch/pytorch/blob/main/torch/utils/data/dataset.py>): the same seed
/// gives the same split.
///
/// # Errors
/// [`DataError::SplitLengths`] when the counts (or, for fractions, the counts they give) do not
/// sum to the length, with the exact sum (also when it overflows `usize`);
/// [`DataError::InvalidOption`] when a fraction is outside `[0, 1]` (or NaN) or the fractions
/// do not sum to 1.
pub fn random_split<D: Dataset>(
    dataset: Arc<D>,
    lengths: SplitLengths,
    generator: &Generator,
) -> Result<Vec<Subset<D>>> {
    let n = dataset.len();
    let counts = match lengths {
        SplitLengths::Counts(c) => c,
        SplitLengths::Fractions(f) => fraction_counts(&f, n)?,
    };
    // Exact: a `u128` holds the sum of any `Vec<usize>` that fits in memory.
    let sum: u128 = counts.iter().map(|&c| c as u128).sum();
    if sum != n as u128 {
        return Err(DataError::SplitLengths { sum, len: n });
    }
    let perm = generator.randperm(n);
    let mut out = Vec::with_capacity(counts.len());
    let mut start = 0;
    for c in counts {
        // In range: the counts sum to `n == perm.len()`.
        out.push(Subset {
            dataset: Arc::clone(&dataset),
            indices: perm[start..start + c].to_vec(),
        });
        start += c;
    }
    Ok(out)
}

/// The part sizes `fractions` give for `n` items, by PyTorch's rule (`random_split`): the
/// floor of `n × f` for each, then the remainder `n − Σ floors` dealt one item at a time,
/// round-robin from the first part. The parts never sum to more than `n`: floors that already
/// exceed it (fractions summing to a little over 1) are [`DataError::SplitLengths`].
fn fraction_counts(fractions: &[f64], n: usize) -> Result<Vec<usize>> {
    let total: f64 = fractions.iter().sum();
    if fractions.iter().any(|x| !(0.0..=1.0).contains(x)) || (total - 1.0).abs() > 1e-6 {
        return Err(DataError::option(
            "lengths",
            format!("Fractions must be in [0, 1] and sum up to 1, got {fractions:?} (sum {total})"),
        ));
    }
    // Each fraction is at most 1; `min(n)` covers lengths past 2^53, where `n as f64` can round
    // up (and `as usize` saturates).
    let mut counts: Vec<usize> = fractions
        .iter()
        .map(|x| ((n as f64 * x).floor() as usize).min(n))
        .collect();
    let floors: u128 = counts.iter().map(|&c| c as u128).sum();
    let Some(rest) = (n as u128).checked_sub(floors) else {
        return Err(DataError::SplitLengths {
            sum: floors,
            len: n,
        });
    };
    // Round-robin, in closed form: every part gets `rest / parts` more, the first
    // `rest % parts` one more again (`rest <= n`, so no sum exceeds `n`; there is at least one
    // part, since an empty list sums to 0 and is refused above).
    let rest = rest as usize;
    let parts = counts.len();
    for (i, c) in counts.iter_mut().enumerate() {
        *c += rest / parts + usize::from(i < rest % parts);
    }
    Ok(counts)
}
