//! `DistributedSampler`: each of `num_replicas` ranks reads its own shard of a dataset, after
//! `torch/utils/data/distributed.py`
//! (<https://github.com/pytorch/pytorch/blob/main/torch/utils/data/distributed.py>).
//!
//! Note [Forgotten epoch]: PyTorch's best-known sampler trap is a loop that never calls
//! `set_epoch`: with `shuffle=True` every epoch then repeats epoch 0's order, silently. berth
//! keeps PyTorch's semantics (the order is a pure function of `seed + epoch`, so a resumed or
//! mixed berth/PyTorch job deals the same shards) and *warns once per process* through berth's
//! warning channel (`berth::alloc::warnings::warn_once`, key [`SET_EPOCH_WARNING`]) when a
//! shuffled sampler starts a second pass without `set_epoch` having been called since the
//! previous one. Advancing the epoch per iterator instead would break that purity (two
//! iterators, or a restarted loader, would see different orders than PyTorch's) and would
//! differ from what a PyTorch user reads in the docs.
//!
//! Clones share the epoch (like [`Generator`](crate::Generator) clones share a stream): the
//! [`DataLoader`](crate::DataLoader) owns the sampler it is given, so keep a clone and call
//! [`set_epoch`](DistributedSampler::set_epoch) on it, as PyTorch's `loader.sampler.set_epoch`.

use std::sync::{Arc, Mutex, PoisonError};

use crate::error::{DataError, Result};
use crate::sampler::Sampler;
use crate::torch_randperm::torch_randperm;

/// The key under which a forgotten `set_epoch` is warned (Note [Forgotten epoch]).
pub const SET_EPOCH_WARNING: &str = "distributed-sampler-set-epoch";

/// The epoch, shared by clones.
#[derive(Debug, Default)]
struct EpochState {
    epoch: u64,
    /// Passes drawn so far.
    passes: u64,
    /// Whether `set_epoch` was called since the last pass.
    set_since_pass: bool,
}

/// Deals rank `rank` of `num_replicas` its shard of a dataset of `len` items, with PyTorch's
/// options, defaults and exact index lists (`torch.utils.data.distributed.DistributedSampler`).
///
/// Each pass: the indices `0..len` (shuffled by `torch.randperm` with a generator seeded
/// `seed + epoch`, when `shuffle`); then, without `drop_last`, padded to `total_size` by
/// repeating from the start, or with `drop_last` cut to `total_size`; then every
/// `num_replicas`-th index starting at `rank` (ranks interleaved). `num_samples` is
/// `ceil(len / num_replicas)`, or with `drop_last` and an uneven split
/// `ceil((len − num_replicas) / num_replicas)` (so 0 when `len < num_replicas`).
///
/// The shuffled order is PyTorch's exactly (Note [Torch's CPU permutation]) for
/// `len < TORCH_RANDPERM_EXACT_BELOW`; above it berth shuffles with its own
/// [`Generator`](crate::Generator) seeded `seed + epoch`, reproducible but not PyTorch's.
/// `seed + epoch` wraps at 2⁶⁴ (PyTorch raises there; only the low 32 bits seed its generator).
///
/// # Examples
/// ```
/// use berth_data::{DistributedSampler, Sampler};
///
/// // 10 items over 3 ranks, in order: rank 1 gets 1, 4, 7 and the padding item 0.
/// let mut sampler = DistributedSampler::new(10, 3, 1)?.shuffle(false);
/// assert_eq!(sampler.epoch(), [1, 4, 7, 0]);
/// # Ok::<(), berth_data::DataError>(())
/// ```
#[derive(Debug, Clone)]
pub struct DistributedSampler {
    len: usize,
    num_replicas: usize,
    rank: usize,
    shuffle: bool,
    seed: u64,
    drop_last: bool,
    state: Arc<Mutex<EpochState>>,
}

impl DistributedSampler {
    /// Rank `rank` of `num_replicas` over a dataset of `len` items, with PyTorch's defaults:
    /// `shuffle = true`, `seed = 0`, `drop_last = false`, epoch 0.
    ///
    /// # Errors
    /// [`DataError::InvalidOption`] when `rank >= num_replicas`, with PyTorch's message
    /// ("Invalid rank 2, rank should be in the interval [0, 1]"), and when
    /// `num_replicas` is 0 (PyTorch says "Invalid rank 0, rank should be in the interval
    /// [0, -1]" there; berth names the replica count instead).
    pub fn new(len: usize, num_replicas: usize, rank: usize) -> Result<Self> {
        if num_replicas == 0 {
            return Err(DataError::option(
                "num_replicas",
                "num_replicas should be a positive integer (the world size), but got num_replicas=0",
            ));
        }
        if rank >= num_replicas {
            return Err(DataError::option(
                "rank",
                format!(
                    "Invalid rank {rank}, rank should be in the interval [0, {}]",
                    num_replicas - 1
                ),
            ));
        }
        Ok(DistributedSampler {
            len,
            num_replicas,
            rank,
            shuffle: true,
            seed: 0,
            drop_last: false,
            state: Arc::new(Mutex::new(EpochState::default())),
        })
    }

    /// Whether each pass is shuffled (`shuffle`, default `true`).
    pub fn shuffle(mut self, shuffle: bool) -> Self {
        self.shuffle = shuffle;
        self
    }

    /// The shuffle seed, the same on every rank (`seed`, default 0).
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Drops the tail so the ranks split evenly, rather than padding (`drop_last`, default
    /// `false`).
    pub fn drop_last(mut self, drop_last: bool) -> Self {
        self.drop_last = drop_last;
        self
    }

    /// Sets the epoch for the next pass (`set_epoch`): call it at the start of every epoch,
    /// on every rank, with the same value, or a shuffled sampler repeats its order (Note
    /// [Forgotten epoch]). Clones share the epoch.
    pub fn set_epoch(&self, epoch: u64) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.epoch = epoch;
        state.set_since_pass = true;
    }

    /// The epoch the next pass uses.
    pub fn current_epoch(&self) -> u64 {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .epoch
    }

    /// This rank's count of indices per pass (`num_samples`).
    pub fn num_samples(&self) -> usize {
        if self.drop_last && !self.len.is_multiple_of(self.num_replicas) {
            // ceil((len - R) / R) in Python: 0 when len < R (ceil of a value in (-1, 0)).
            self.len
                .saturating_sub(self.num_replicas)
                .div_ceil(self.num_replicas)
        } else {
            self.len.div_ceil(self.num_replicas)
        }
    }

    /// The count of indices over all ranks per pass (`total_size = num_samples × num_replicas`).
    pub fn total_size(&self) -> usize {
        self.num_samples() * self.num_replicas
    }

    /// This rank's indices for `epoch`: a pure function of the options and `epoch`, the same
    /// list PyTorch's `list(sampler)` gives after `set_epoch(epoch)`. Does not touch the
    /// shared epoch or the forgotten-`set_epoch` check.
    pub fn indices_for_epoch(&self, epoch: u64) -> Vec<usize> {
        let total = self.total_size();
        if total == 0 {
            return Vec::new();
        }
        let order: Vec<usize> = if self.shuffle {
            let seed = self.seed.wrapping_add(epoch);
            torch_randperm(self.len, seed)
                .unwrap_or_else(|| crate::rng::Generator::new(seed).randperm(self.len))
        } else {
            (0..self.len).collect()
        };
        // Padding repeats the order from its start (both of PyTorch's padding branches amount
        // to this cyclic extension); drop_last cuts to total_size, which is then <= len.
        (self.rank..total)
            .step_by(self.num_replicas)
            .map(|i| order[i % self.len])
            .collect()
    }
}

impl Sampler for DistributedSampler {
    fn len(&self) -> usize {
        self.num_samples()
    }

    /// The current epoch's indices; warns once per process when a shuffled sampler repeats an
    /// order because `set_epoch` was not called (Note [Forgotten epoch]).
    fn epoch(&mut self) -> Vec<usize> {
        let epoch = {
            let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            let forgotten = self.shuffle && state.passes > 0 && !state.set_since_pass;
            state.passes += 1;
            state.set_since_pass = false;
            if forgotten {
                let epoch = state.epoch;
                drop(state);
                berth::alloc::warnings::warn_once(SET_EPOCH_WARNING, || {
                    format!(
                        "DistributedSampler: a shuffled pass started again at epoch {epoch} without set_epoch, so it repeats the previous order; call sampler.set_epoch(epoch) at the start of every epoch on every rank (keep a clone of the sampler given to the DataLoader: clones share the epoch)"
                    )
                });
                epoch
            } else {
                state.epoch
            }
        };
        self.indices_for_epoch(epoch)
    }
}
