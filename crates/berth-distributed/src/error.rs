//! `DistError`: the one error type of `berth-distributed`.

use std::time::Duration;

/// Errors of the rendezvous, the TCP store and bucketing. Each says what was wrong and what
/// would be right.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DistError {
    /// A rendezvous variable is missing from the environment (torchrun sets all five).
    #[error("environment variable {name} is not set: start each process with torchrun or `berth launch`, or set RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT yourself")]
    MissingEnv {
        /// The variable, e.g. `"MASTER_PORT"`.
        name: &'static str,
    },
    /// A rendezvous variable does not parse or is out of range.
    #[error("environment variable {name}={value:?} is invalid: {expected}")]
    InvalidEnv {
        /// The variable.
        name: &'static str,
        /// Its value.
        value: String,
        /// What would be right.
        expected: String,
    },
    /// The store at `addr` could not be reached within the timeout (rank 0, which hosts it,
    /// has not started, or `MASTER_ADDR`/`MASTER_PORT` point elsewhere).
    #[error("cannot reach the rendezvous store at {addr} within {timeout:?} (last error: {last_error}); check that rank 0 is running and MASTER_ADDR/MASTER_PORT point at it")]
    ConnectTimeout {
        /// `MASTER_ADDR:MASTER_PORT`.
        addr: String,
        /// How long connecting was retried.
        timeout: Duration,
        /// The last connection error.
        last_error: std::io::Error,
    },
    /// Rank 0 could not listen on `MASTER_PORT`.
    #[error("rank 0 cannot host the rendezvous store on {addr}: {source} (is MASTER_PORT already in use?)")]
    Listen {
        /// The address it tried.
        addr: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The connection to the store failed mid-request (the store's host exited).
    #[error(
        "rendezvous store at {addr}: {source} (the store's host, rank 0, has exited or failed)"
    )]
    Io {
        /// The store's address.
        addr: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The store answered something the protocol does not allow (not a berth store, or a
    /// different berth version).
    #[error("rendezvous store at {addr} sent a malformed reply: {what}")]
    Protocol {
        /// The store's address.
        addr: String,
        /// What was wrong.
        what: String,
    },
    /// A key did not appear within the timeout.
    #[error("timed out after {timeout:?} waiting for store key {key:?}")]
    KeyTimeout {
        /// The key.
        key: String,
        /// The timeout.
        timeout: Duration,
    },
    /// Not every rank arrived within the timeout.
    #[error("rendezvous timed out after {timeout:?}: {arrived} of {world_size} ranks arrived; missing rank(s) {missing:?} (did every process start, with the same MASTER_ADDR, MASTER_PORT and WORLD_SIZE?)")]
    RendezvousTimeout {
        /// The timeout.
        timeout: Duration,
        /// Ranks that arrived.
        arrived: usize,
        /// The expected world size.
        world_size: usize,
        /// Ranks that never arrived.
        missing: Vec<usize>,
    },
    /// This process's `WORLD_SIZE` differs from rank 0's.
    #[error("WORLD_SIZE mismatch: rank {rank} has WORLD_SIZE={mine} but rank 0 has WORLD_SIZE={rank0}; every process must be started with the same WORLD_SIZE")]
    WorldSizeMismatch {
        /// This process's rank.
        rank: usize,
        /// This process's world size.
        mine: usize,
        /// Rank 0's world size.
        rank0: usize,
    },
    /// Another process already joined with this rank.
    #[error("rank {rank} joined twice: another process was started with RANK={rank}; give each process its own RANK in 0..{world_size}")]
    DuplicateRank {
        /// The rank.
        rank: usize,
        /// The world size.
        world_size: usize,
    },
    /// Another rank failed the rendezvous and said why.
    #[error("rendezvous failed on another rank: {message}")]
    PeerFailed {
        /// The other rank's error.
        message: String,
    },
    /// A tensor a collective cannot take (wrong device, layout, type or size).
    #[error("{op}: {what}")]
    InvalidTensor {
        /// The collective.
        op: &'static str,
        /// What was wrong and what would be right.
        what: String,
    },
    /// A CUDA or NCCL failure (`CudaError::NcclUnavailable` when NCCL cannot be loaded).
    #[error(transparent)]
    Cuda(#[from] berth::cuda::CudaError),
    /// A tensor operation failed.
    #[error(transparent)]
    Tensor(#[from] berth::Error),
    /// DDP's reducer was used out of order: a gradient marked ready twice in one step, a step
    /// finished before every gradient was ready, or a gradient of the wrong shape.
    #[error("DDP reducer: {what}")]
    Reduction {
        /// What was wrong and what would be right.
        what: String,
    },
    /// A bucketing option is invalid.
    #[error("invalid bucket option {option}: {message}")]
    InvalidBucketOption {
        /// The option, e.g. `"bucket_cap_mb"`.
        option: &'static str,
        /// What was wrong and what would be right.
        message: String,
    },
}

/// `Result` with [`DistError`].
pub type Result<T, E = DistError> = std::result::Result<T, E>;
