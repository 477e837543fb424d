//! Batches of indices: the [`BatchSampling`] trait and [`BatchSampler`] (`drop_last`).

use crate::error::{DataError, Result};
use crate::sampler::Sampler;

/// A source of index batches, one epoch at a time (`Sampler[List[int]]`, a custom
/// `batch_sampler`).
pub trait BatchSampling: Send {
    /// Number of batches one epoch yields.
    fn len(&self) -> usize;

    /// Whether an epoch yields no batch.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The batches of the next epoch, collected (the whole epoch's indices held at once).
    fn epoch(&mut self) -> Vec<Vec<usize>>;

    /// The batches of the next epoch, one at a time; loaders call this (Note [Lazy epochs]).
    /// Every random draw of the epoch is made by this call. The provided version collects
    /// [`epoch`](Self::epoch); [`BatchSampler`] holds one batch at a time plus what its
    /// sampler's [`epoch_iter`](Sampler::epoch_iter) holds.
    fn epoch_iter(&mut self) -> Box<dyn Iterator<Item = Vec<usize>> + Send> {
        Box::new(self.epoch().into_iter())
    }
}

impl<S: BatchSampling + ?Sized> BatchSampling for Box<S> {
    fn len(&self) -> usize {
        (**self).len()
    }
    fn epoch(&mut self) -> Vec<Vec<usize>> {
        (**self).epoch()
    }
    fn epoch_iter(&mut self) -> Box<dyn Iterator<Item = Vec<usize>> + Send> {
        (**self).epoch_iter()
    }
}

/// Groups a sampler's indices into lists of `batch_size` (`BatchSampler`): the trailing partial
/// list is kept unless `drop_last`. Length: `floor(len / batch_size)` with `drop_last`,
/// `ceil(len / batch_size)` without.
#[derive(Debug, Clone)]
pub struct BatchSampler<S> {
    sampler: S,
    batch_size: usize,
    drop_last: bool,
}

impl<S: Sampler> BatchSampler<S> {
    /// Batches of `batch_size` indices from `sampler`.
    ///
    /// # Errors
    /// [`DataError::InvalidOption`] when `batch_size` is 0 (PyTorch's message).
    pub fn new(sampler: S, batch_size: usize, drop_last: bool) -> Result<Self> {
        if batch_size == 0 {
            return Err(DataError::option(
                "batch_size",
                "batch_size should be a positive integer value, but got batch_size=0",
            ));
        }
        Ok(BatchSampler {
            sampler,
            batch_size,
            drop_last,
        })
    }

    /// The wrapped index sampler.
    pub fn sampler(&self) -> &S {
        &self.sampler
    }
}

impl<S: Sampler> BatchSampling for BatchSampler<S> {
    fn len(&self) -> usize {
        let n = self.sampler.len();
        if self.drop_last {
            n / self.batch_size
        } else {
            n.div_ceil(self.batch_size)
        }
    }

    fn epoch(&mut self) -> Vec<Vec<usize>> {
        let idx = self.sampler.epoch();
        let mut out: Vec<Vec<usize>> = idx.chunks(self.batch_size).map(<[usize]>::to_vec).collect();
        if self.drop_last && out.last().is_some_and(|b| b.len() < self.batch_size) {
            out.pop();
        }
        out
    }

    fn epoch_iter(&mut self) -> Box<dyn Iterator<Item = Vec<usize>> + Send> {
        let mut idx = self.sampler.epoch_iter();
        let (batch_size, drop_last) = (self.batch_size, self.drop_last);
        Box::new(std::iter::from_fn(move || {
            // At most `batch_size` reserved up front: a huge batch size fills as it goes.
            let mut batch = Vec::with_capacity(batch_size.min(4096));
            batch.extend(idx.by_ref().take(batch_size));
            let keep = if drop_last {
                batch.len() == batch_size
            } else {
                !batch.is_empty()
            };
            keep.then_some(batch)
        }))
    }
}
