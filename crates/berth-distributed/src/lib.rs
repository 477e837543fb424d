//! berth-distributed: the host side of multi-process jobs, PyTorch-shaped — torchrun's
//! rendezvous environment ([`RendezvousEnv`]), a TCP key-value store like PyTorch's `TCPStore`
//! ([`TcpStore`], hosted by rank 0 as [`StoreServer`]), the rendezvous that checks the job and
//! exchanges a communicator's unique id ([`Rendezvous`]), and `DistributedDataParallel`'s
//! gradient bucketing ([`bucket`]).
//!
//! What is not here yet: the NCCL process group (collectives on a communication stream) and
//! the data-parallel training path; see `docs/distributed.md`. The sampler that shards a
//! dataset per rank is berth-data's `DistributedSampler`: it needs only a rank and a world
//! size, which this crate's [`Rendezvous`] provides.
//!
//! # Where this crate sits
//! ```text
//! berth-alloc  <-  berth-cuda  <-  berth  <-  berth-data  <-  berth-cli (the `berth` binary)
//!
//! berth-distributed (this crate: host code only, depends on no other berth crate)
//! ```
//!
//! Everything here is host code over TCP and runs (and is tested, with real processes) on a
//! machine without a GPU.
//!
//! # Design notes
//! - Note [Store protocol]: `src/store.rs` ([`store`]).
//! - Note [Rendezvous steps]: `src/rendezvous.rs` ([`rendezvous`]).
//! - Note [DDP buckets]: `src/bucket.rs` ([`bucket`]).

#![deny(missing_docs)]

pub mod bucket;
mod env;
mod error;
pub mod rendezvous;
pub mod store;

pub use env::RendezvousEnv;
pub use error::{DistError, Result};
pub use rendezvous::{Rendezvous, DEFAULT_TIMEOUT};
pub use store::{StoreServer, TcpStore};
