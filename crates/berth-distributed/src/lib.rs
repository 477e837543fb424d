//! berth-distributed: the host side of multi-process jobs, PyTorch-shaped — torchrun's
//! rendezvous environment ([`RendezvousEnv`]), a TCP key-value store like PyTorch's `TCPStore`
//! ([`TcpStore`], hosted by rank 0 as [`StoreServer`]), the rendezvous that checks the job and
//! exchanges a communicator's unique id ([`Rendezvous`]), the NCCL process group with its
//! collectives on berth tensors (`ProcessGroup`, one process per GPU, feature `cuda`), the
//! group of one process driving several local GPUs (`LocalGroup`, feature `cuda`), and
//! `DistributedDataParallel`'s gradient bucketing ([`bucket`]) and bucketed reduction
//! ([`Reducer`]) over any [`Communicator`]: the NCCL `ProcessGroup`, or the
//! [`StoreCommunicator`] for CPU tensors (gloo's role), which lets CI run the data-parallel
//! path without a GPU. `berth train --devices` is built on these; see `docs/distributed.md`.
//! The sampler that shards a dataset per rank is berth-data's
//! `DistributedSampler`: it needs only a rank and a world size, which [`Rendezvous`] gives.
//!
//! # Where this crate sits
//! ```text
//! berth-alloc  <-  berth-cuda  <-  berth  <-  berth-data         <-  berth-cli (the `berth` binary)
//!                                         <-  berth-distributed  <-
//!                                             (this crate)
//! ```
//!
//! It depends on `berth` (tensors, streams, events) and on `berth-cuda` (its NCCL layer,
//! `berth_cuda::nccl`). The store, the rendezvous and bucketing are host code and run (and
//! are tested, with real processes) on a machine without a GPU.
//!
//! # Design notes
//! - Note [Store protocol]: `src/store.rs` ([`store`]).
//! - Note [Rendezvous steps]: `src/rendezvous.rs` ([`rendezvous`]).
//! - Note [DDP buckets]: `src/bucket.rs` ([`bucket`]).
//! - Note [Collective stream ordering]: `src/collective.rs` (which stream each collective
//!   runs on, how buffers stay alive: references, not `record_stream`; shared by
//!   `ProcessGroup` and `LocalGroup`). Note [One thread, several devices], in
//!   `berth_cuda::nccl`, is why `LocalGroup` issues its calls inside one NCCL group.
//! - Note [Store all-reduce]: `src/store_communicator.rs` ([`store_communicator`]).
//! - Note [Gradient averaging], Note [Bucket launch order], Note [Bucket buffer lifetime]:
//!   `src/reducer.rs` ([`reducer`]).

#![deny(missing_docs)]

pub mod bucket;
#[cfg(feature = "cuda")]
mod collective;
pub mod communicator;
mod env;
mod error;
#[cfg(feature = "cuda")]
pub mod local_group;
#[cfg(feature = "cuda")]
pub mod process_group;
pub mod reducer;
pub mod rendezvous;
pub mod store;
pub mod store_communicator;
pub mod testing;

#[cfg(feature = "cuda")]
pub use berth_cuda::nccl::{nccl_unavailable_reason, nccl_version, ReduceOp};
#[cfg(feature = "cuda")]
pub use collective::Work;
pub use communicator::{Communicator, PendingWork};
pub use env::RendezvousEnv;
pub use error::{DistError, Result};
#[cfg(feature = "cuda")]
pub use local_group::LocalGroup;
#[cfg(feature = "cuda")]
pub use process_group::ProcessGroup;
pub use reducer::{broadcast_parameters, Reducer};
pub use rendezvous::{Rendezvous, DEFAULT_TIMEOUT};
pub use store::{StoreServer, TcpStore};
pub use store_communicator::{StoreCommunicator, StoreWork};
