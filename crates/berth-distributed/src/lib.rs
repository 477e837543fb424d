//! berth-distributed: the host side of multi-process jobs, PyTorch-shaped — torchrun's
//! rendezvous environment ([`RendezvousEnv`]), a TCP key-value store like PyTorch's `TCPStore`
//! ([`TcpStore`], hosted by rank 0 as [`StoreServer`]), the rendezvous that checks the job and
//! exchanges a communicator's unique id ([`Rendezvous`]), the NCCL process group with its
//! collectives on berth tensors (`ProcessGroup`, feature `cuda`), and
//! `DistributedDataParallel`'s gradient bucketing ([`bucket`]).
//!
//! What is not here yet: the data-parallel training path (`berth train --devices`); see
//! `docs/distributed.md`. The sampler that shards a dataset per rank is berth-data's
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
//! - Note [Collective stream ordering]: `src/process_group.rs` (which stream each collective
//!   runs on, how buffers stay alive: references, not `record_stream`).

#![deny(missing_docs)]

pub mod bucket;
mod env;
mod error;
#[cfg(feature = "cuda")]
pub mod process_group;
pub mod rendezvous;
pub mod store;

#[cfg(feature = "cuda")]
pub use berth_cuda::nccl::{nccl_unavailable_reason, nccl_version, ReduceOp};
pub use env::RendezvousEnv;
pub use error::{DistError, Result};
#[cfg(feature = "cuda")]
pub use process_group::{ProcessGroup, Work};
pub use rendezvous::{Rendezvous, DEFAULT_TIMEOUT};
pub use store::{StoreServer, TcpStore};
