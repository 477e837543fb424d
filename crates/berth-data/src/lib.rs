//! berth-data: PyTorch's `torch.utils.data` — datasets, samplers, a `DataLoader` over worker
//! threads, pinned collation and device prefetch — for berth tensors.
//!
//! # Pieces
//! 1. [`Dataset`] (map-style) and [`IterableDataset`]; [`Subset`], [`random_split`];
//!    [`idx`] (the IDX reader) and the Fashion-MNIST dataset.
//! 2. Samplers: [`SequentialSampler`], [`RandomSampler`], [`SubsetRandomSampler`],
//!    [`WeightedRandomSampler`], and [`BatchSampler`] with `drop_last`.
//! 3. [`DataLoader`] (map-style) and [`IterableDataLoader`] (iterable-style: one stream per
//!    worker, see [`IterableDataset`]) with PyTorch's option names, defaults and validation
//!    messages; workers are threads ([`worker`], Note [Workers are threads]); [`worker_info`] and
//!    [`worker_rng`]; worker errors in PyTorch's words ([`DataError::InWorker`]).
//! 4. Collation: [`Collatable`] (`default_collate`'s rules), [`Collate`] and [`CollateItems`]
//!    (for each loader kind), [`DefaultCollate`], [`CollateFn`], [`impl_collate!`].
//! 5. Pinning: [`PinMemory`], [`PinTarget`] (Note [Collate into pinned memory]).
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
//! - Note [No global RNG]: `src/rng.rs` ([`rng`]): every loader owns its [`Generator`].
//! - Note [Workers are threads]: `src/worker.rs` ([`worker`]).
//! - Note [Prefetch stream ordering]: `src/prefetch.rs` ([`prefetch`]).
//! - Note [Collate into pinned memory]: `src/pin.rs` ([`pin`]).
//! - Note [Recycled collate buffers]: `src/host_pool.rs` (unpinned batches reuse buffers).

#![deny(missing_docs)]

mod batch_sampler;
mod collate;
mod dataset;
mod error;
pub mod fashion_mnist;
mod fetch;
mod host_pool;
pub mod idx;
mod iter;
mod iterable;
mod loader;
mod options;
pub mod pin;
mod pinned_default;
pub mod prefetch;
pub mod rng;
mod sampler;
mod tensor_collate;
mod tensor_dataset;
pub mod worker;

pub use batch_sampler::{BatchSampler, BatchSampling};
pub use collate::{Collatable, Collate, CollateContext, CollateFn, CollateItems, DefaultCollate};
pub use dataset::{random_split, Dataset, IterableDataset, SplitLengths, Subset, VecDataset};
pub use error::{DataError, OriginalError, Result};
pub use fashion_mnist::{FashionMnist, Split};
pub use iter::{LoaderIter, STATUS_CHECK_INTERVAL, STREAM_PREFETCH_LIMIT};
pub use iterable::{IterableDataLoader, IterableDataLoaderBuilder, IterableLoaderIter};
pub use loader::{DataLoader, DataLoaderBuilder, DEFAULT_PREFETCH_FACTOR, MAX_WORKERS};
pub use pin::{PinMemory, PinTarget, PinnedHost};
pub use pinned_default::AllocatorPinnedHost;
pub use rng::Generator;
pub use sampler::{
    RandomSampler, Sampler, SequentialSampler, SubsetRandomSampler, WeightedRandomSampler,
};
pub use tensor_collate::collate_output;
pub use tensor_dataset::TensorDataset;
pub use worker::{worker_info, worker_rng, WorkerInfo};
