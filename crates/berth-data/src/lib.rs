//! berth-data: PyTorch's `torch.utils.data` — datasets, samplers, a `DataLoader` over worker
//! threads, pinned collation and device prefetch — for berth tensors.
//!
//! # Pieces
//! 1. [`Dataset`] (map-style) and [`IterableDataset`]; [`Subset`], [`random_split`];
//!    [`idx`] (the IDX reader) and the Fashion-MNIST dataset.
//! 2. Samplers: [`SequentialSampler`], [`RandomSampler`], [`SubsetRandomSampler`],
//!    [`WeightedRandomSampler`], and [`BatchSampler`] with `drop_last`; [`DistributedSampler`]
//!    (one shard per rank, PyTorch's exact index lists, [`torch_randperm`]).
//! 3. [`DataLoader`] (map-style) and [`IterableDataLoader`] (iterable-style: one stream per
//!    worker, see [`IterableDataset`]) with PyTorch's option names, defaults and validation
//!    messages; workers are threads ([`worker`], Note [Workers are threads]); [`worker_info`] and
//!    [`worker_rng`]; worker errors in PyTorch's words ([`DataError::InWorker`]).
//! 4. Collation: [`Collatable`] (`default_collate`'s rule per sample type) and [`Collate`]
//!    (`collate_fn`, for both loader kinds), with [`DefaultCollate`], [`CollateFn`] and
//!    [`impl_collate!`]; `src/collate.rs` says why these two traits remain.
//! 5. The batch after collation: [`MapTensors`], the one traversal of a batch's tensors
//!    ([`impl_map_tensors!`]), used by pinning and by [`prefetch::DevicePrefetcher`].
//! 6. Pinning: [`PinnedHost`], [`PinTarget`], [`pin_memory`]; decided in one place (Note [Where
//!    pinning is decided]).
//!
//! # Where this crate sits
//! ```text
//! berth-alloc  <-  berth-cuda  <-  berth  <-  berth-data  <-  berth-cli (the `berth` binary)
//!                                             (this crate)
//! ```
//!
//! It depends on [`berth`] only (tensors, devices, the pinned host allocator through
//! `berth::cuda`), and the `berth` binary (`berth-cli`) is its user: `berth train` and
//! `berth bench dataloader`. `berth` does not re-export it.
//!
//! # Design notes
//! - Note [Lazy epochs]: `src/permutation.rs` ([`LazyPermutation`]): samplers yield an epoch
//!   one index at a time.
//! - Note [No global RNG]: `src/rng.rs` ([`rng`]): every loader owns its [`Generator`].
//! - Note [Workers are threads]: `src/worker.rs` ([`worker`]).
//! - Note [Prefetch stream ordering]: `src/prefetch.rs` ([`prefetch`]).
//! - Note [One batch traversal]: `src/batch.rs` ([`MapTensors`]).
//! - Note [Where pinning is decided]: `src/pinning.rs`.
//! - Note [Collate into pinned memory]: `src/pinning.rs`.
//! - Note [Forgotten epoch]: `src/distributed_sampler.rs` ([`DistributedSampler`]).
//! - Note [Torch's CPU permutation]: `src/torch_randperm.rs` ([`torch_randperm`]).
//! - Note [Recycled collate buffers]: `src/host_pool.rs` (unpinned batches reuse buffers).

#![deny(missing_docs)]

mod batch;
mod batch_sampler;
mod collatable;
mod collate;
mod dataset;
mod distributed_sampler;
mod error;
pub mod fashion_mnist;
mod fetch;
mod host_pool;
pub mod idx;
mod iter;
mod iterable;
mod loader;
mod options;
mod permutation;
pub mod pin;
mod pinned_default;
mod pinning;
pub mod prefetch;
pub mod rng;
mod sampler;
mod tensor_collate;
mod tensor_dataset;
mod torch_randperm;
pub mod worker;

pub use batch::MapTensors;
pub use batch_sampler::{BatchSampler, BatchSampling};
/// `berth`, for the macros ([`impl_map_tensors!`]), so that a crate using them needs no `berth`
/// dependency of its own.
#[doc(hidden)]
pub use berth as __berth;
pub use collatable::{Collatable, CollateContext};
pub use collate::{Collate, CollateFn, DefaultCollate};
pub use dataset::{random_split, Dataset, IterableDataset, SplitLengths, Subset, VecDataset};
pub use distributed_sampler::{DistributedSampler, SET_EPOCH_WARNING};
pub use error::{DataError, OriginalError, Result};
pub use fashion_mnist::{FashionMnist, Split};
pub use iter::{PREFETCH_LIMIT, STATUS_CHECK_INTERVAL};
pub use iterable::{IterableDataLoader, IterableDataLoaderBuilder, IterableLoaderIter};
pub use loader::{DataLoader, DataLoaderBuilder, LoaderIter};
pub use options::{DEFAULT_PREFETCH_FACTOR, MAX_WORKERS};
pub use permutation::{LazyPermutation, EAGER_EPOCH_LIMIT};
pub use pin::{PinTarget, PinnedHost};
pub use pinned_default::AllocatorPinnedHost;
pub use pinning::{collate_output, pin_memory, pin_tensor};
pub use rng::Generator;
pub use sampler::{
    RandomSampler, Sampler, SequentialSampler, SubsetRandomSampler, WeightedRandomSampler,
};
pub use tensor_dataset::TensorDataset;
pub use torch_randperm::{torch_randperm, TORCH_RANDPERM_EXACT_BELOW};
pub use worker::{worker_info, worker_rng, WorkerInfo};
