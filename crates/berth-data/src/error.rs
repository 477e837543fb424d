//! `DataError`: the one error type of `berth-data`.

use std::path::PathBuf;

/// Errors of `berth-data`: bad loader options, bad dataset files, failing items and workers.
///
/// Option errors carry PyTorch's `ValueError` messages verbatim (`torch/utils/data/dataloader.py`),
/// so a config that fails in PyTorch fails here with the same words.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DataError {
    /// A `DataLoader` or sampler option is invalid (PyTorch raises `ValueError` at construction).
    #[error("{message}")]
    InvalidOption {
        /// The option at fault, e.g. `"prefetch_factor"`.
        option: &'static str,
        /// PyTorch's message, verbatim.
        message: String,
    },
    /// An IDX file could not be read (see [`IdxError`](crate::idx::IdxError)).
    #[error(transparent)]
    Idx(#[from] crate::idx::IdxError),
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// An index past the end of a dataset.
    #[error("index {index} is out of range for a dataset of {len} items")]
    IndexOutOfRange {
        /// The index asked for.
        index: usize,
        /// The dataset's length, in items.
        len: usize,
    },
    /// A dataset's `get(index)` failed with the user's own error.
    #[error("item {index}: {source}")]
    Item {
        /// The index of the failing item.
        index: usize,
        /// The dataset's error.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// Collation failed (mismatched shapes, lengths or keys).
    #[error("collate: {message}")]
    Collate {
        /// What did not match, and what would.
        message: String,
    },
    /// A tensor operation failed.
    #[error(transparent)]
    Tensor(#[from] berth::Error),
    /// An item or its collation failed inside a worker: the error is delivered at its batch's turn,
    /// and the loader keeps going (PyTorch's `ExceptionWrapper`).
    #[error("Caught error in DataLoader worker {worker_id} (batch {batch_index}): {source}")]
    InWorker {
        /// The worker thread that ran the batch (0-based).
        worker_id: usize,
        /// The batch's position in the epoch (0-based).
        batch_index: usize,
        /// The original error.
        source: Box<DataError>,
    },
    /// A batch failed on the main thread (`num_workers = 0`).
    #[error("batch {batch_index}: {source}")]
    InBatch {
        /// The batch's position in the epoch (0-based).
        batch_index: usize,
        /// The original error.
        source: Box<DataError>,
    },
    /// User code panicked while a worker fetched or collated a batch. The panic is caught; the
    /// worker thread survives and serves the next batch.
    #[error(
        "DataLoader worker {worker_id} exited unexpectedly: a panic while loading batch {batch_index}: {message}"
    )]
    WorkerPanicked {
        /// The worker thread (0-based), or 0 on the main thread with `num_workers = 0`.
        worker_id: usize,
        /// The batch's position in the epoch (0-based).
        batch_index: usize,
        /// The panic payload, when it was a string.
        message: String,
    },
    /// Worker threads ended while batches were still owed (a panic outside item loading, e.g. in
    /// `worker_init_fn`). PyTorch: "DataLoader worker (pid(s) …) exited unexpectedly".
    #[error("DataLoader worker (thread(s) {}) exited unexpectedly", join_ids(.worker_ids))]
    WorkersExited {
        /// The ids of the dead workers.
        worker_ids: Vec<usize>,
    },
    /// No batch arrived within `timeout` (PyTorch: "DataLoader timed out after N seconds").
    #[error(
        "DataLoader timed out after {} seconds (waiting for batch {batch_index} from worker {worker_id})",
        fmt_secs(.timeout)
    )]
    Timeout {
        /// The configured timeout.
        timeout: std::time::Duration,
        /// The batch waited for (0-based).
        batch_index: usize,
        /// The worker that owns that batch.
        worker_id: usize,
    },
    /// Page-locked memory could not be allocated for a batch.
    #[error("pin_memory: the pinned host allocator {host} failed: {source}")]
    Pin {
        /// The pinned memory source's name.
        host: String,
        /// The allocator's error (`HostAllocError::OutOfMemory` is a full pinned pool, retryable
        /// after freeing pinned tensors).
        #[source]
        source: berth::alloc::host::HostAllocError,
    },
    /// The device prefetcher failed outside a copy.
    #[error("device prefetch: {message}")]
    Prefetch {
        /// What failed.
        message: String,
    },
    /// A worker thread could not be started.
    #[error("cannot start DataLoader worker thread {worker_id}: {source}")]
    Spawn {
        /// The worker that failed to start.
        worker_id: usize,
        /// The OS error.
        source: std::io::Error,
    },
    /// `random_split` lengths do not add up (PyTorch's message).
    #[error("Sum of input lengths does not equal the length of the input dataset! (lengths sum to {sum}, dataset has {len} items)")]
    SplitLengths {
        /// Sum of the requested lengths (items).
        sum: usize,
        /// The dataset's length (items).
        len: usize,
    },
}

impl DataError {
    /// Wraps a dataset's own error for item `index` (for `Dataset::get` implementations).
    pub fn item(index: usize, source: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        DataError::Item {
            index,
            source: source.into(),
        }
    }

    /// Builds an [`DataError::InvalidOption`].
    pub(crate) fn option(option: &'static str, message: impl Into<String>) -> Self {
        DataError::InvalidOption {
            option,
            message: message.into(),
        }
    }

    /// Builds a [`DataError::Collate`].
    pub(crate) fn collate(message: impl Into<String>) -> Self {
        DataError::Collate {
            message: message.into(),
        }
    }

    /// The innermost error: unwraps [`DataError::InWorker`] and [`DataError::InBatch`].
    pub fn original(&self) -> &DataError {
        match self {
            DataError::InWorker { source, .. } | DataError::InBatch { source, .. } => {
                source.original()
            }
            other => other,
        }
    }
}

fn join_ids(ids: &[usize]) -> String {
    ids.iter()
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

fn fmt_secs(d: &std::time::Duration) -> String {
    let s = d.as_secs_f64();
    if s.fract() == 0.0 {
        format!("{}", s as u64)
    } else {
        format!("{s}")
    }
}

/// `Result` with [`DataError`].
pub type Result<T, E = DataError> = std::result::Result<T, E>;
