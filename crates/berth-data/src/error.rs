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
    /// An item, its stream or its collation failed inside a worker: the error is delivered at
    /// its batch's turn, and the loader keeps going (PyTorch's `ExceptionWrapper`).
    ///
    /// The message follows `ExceptionWrapper.reraise` in `torch/_utils.py`
    /// (<https://github.com/pytorch/pytorch/blob/main/torch/_utils.py>), which says "Caught
    /// {type} in DataLoader worker process {id}.\nOriginal Traceback …". berth's reads
    /// "Caught {type} in DataLoader worker thread {id} (batch {`batch_index`}).\nOriginal
    /// error: {message}": the same first words, so habits and log searches carry over, with "thread"
    /// for "process" because berth's workers are threads and have no pid (Note [Workers are
    /// threads]), the batch index added (PyTorch's traceback locates the failure instead; a
    /// Rust error has no traceback), and "Original error" for "Original Traceback". The type
    /// is the original error's [`DataError::type_name`]; the original error itself is this
    /// error's [`source`](std::error::Error::source).
    #[error(
        "Caught {} in DataLoader worker thread {worker_id} (batch {batch_index}).\nOriginal error: {source}",
        .source.type_name()
    )]
    InWorker {
        /// The worker thread that ran the batch (0-based).
        worker_id: usize,
        /// The batch's position in the epoch (0-based).
        batch_index: usize,
        /// The original error.
        source: OriginalError,
    },
    /// A batch failed on the main thread (`num_workers = 0`).
    #[error("batch {batch_index}: {source}")]
    InBatch {
        /// The batch's position in the epoch (0-based).
        batch_index: usize,
        /// The original error.
        source: OriginalError,
    },
    /// User code panicked while a worker fetched or collated a batch (or, for an iterable
    /// dataset, started or advanced its stream). The panic is caught; the worker thread survives
    /// and serves the next batch (an iterable dataset's stream that panicked is not polled
    /// again this epoch). The message has [`DataError::InWorker`]'s form, with "panic" as the
    /// type; a panic payload is not an error, so there is no source.
    ///
    /// Only with workers: with `num_workers = 0` the same panic unwinds out of the loader
    /// iterator's `next` on the calling thread, as PyTorch with `num_workers=0` raises the
    /// dataset's exception directly rather than wrapping it.
    #[error(
        "Caught panic in DataLoader worker thread {worker_id} (batch {batch_index}).\nOriginal panic message: {message}"
    )]
    WorkerPanicked {
        /// The worker thread (0-based).
        worker_id: usize,
        /// The batch's position in the epoch (0-based).
        batch_index: usize,
        /// The panic payload, when it was a string.
        message: String,
    },
    /// `worker_init_fn` panicked in a worker, so that worker loads nothing (its setup did not
    /// happen). The panic is caught and reported as the error of the batches that worker owed,
    /// in order: for a map-style loader every batch dealt to it (the other workers' batches still
    /// arrive); for an iterable loader its first batch of each epoch, after which its stream
    /// counts as ended. PyTorch's `_worker_loop`
    /// (<https://github.com/pytorch/pytorch/blob/main/torch/utils/data/_utils/worker.py>) also
    /// stores the `worker_init_fn` exception and sends it as the result of the worker's first
    /// task, as "Caught {type} in DataLoader worker process {id}"; its later tasks fail on the
    /// fetcher that was never created. berth's message starts with the same words as
    /// [`DataError::WorkerPanicked`] and names `worker_init_fn`, since a Rust panic has no
    /// traceback to show where it happened.
    #[error(
        "Caught panic in DataLoader worker thread {worker_id} in worker_init_fn (batch {batch_index} not loaded: a worker whose worker_init_fn panicked loads nothing).\nOriginal panic message: {message}"
    )]
    WorkerInitPanicked {
        /// The worker thread whose `worker_init_fn` panicked (0-based).
        worker_id: usize,
        /// The batch this error stands for (0-based position in the epoch).
        batch_index: usize,
        /// The panic payload, when it was a string.
        message: String,
    },
    /// Worker threads ended while batches were still owed (a panic outside any user call the
    /// worker guards, e.g. in the `Drop` of an iterable dataset's stream). PyTorch: "DataLoader
    /// worker (pid(s) …) exited unexpectedly". The epoch ends after this error.
    #[error("DataLoader worker (thread(s) {}) exited unexpectedly", join_ids(.worker_ids))]
    WorkersExited {
        /// The ids of the dead workers.
        worker_ids: Vec<usize>,
    },
    /// No batch arrived within `timeout` (PyTorch: "DataLoader timed out after N seconds"). The
    /// epoch ends after this error: the iterator then returns `None`.
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
    /// `random_split` lengths do not add up (PyTorch's `ValueError` message,
    /// <https://github.com/pytorch/pytorch/blob/main/torch/utils/data/dataset.py>).
    #[error("Sum of input lengths does not equal the length of the input dataset! (lengths sum to {sum}, dataset has {len} items)")]
    SplitLengths {
        /// Sum of the requested lengths (items), exact: a `u128`, so that counts whose sum
        /// overflows `usize` are reported as they are. For fractions, the sum of
        /// `floor(len × fraction)`.
        sum: u128,
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

    /// A [`DataError::Collate`] with `message`: for a custom collate (`collate_fn`, a
    /// [`Collatable`](crate::Collatable) or [`Collate`](crate::Collate) impl) whose items do
    /// not fit together. Say what did not match and what would, as `default_collate` does
    /// ("each element in list of batch should be of equal size"). Displays as
    /// "collate: {message}".
    ///
    /// # Examples
    /// ```
    /// use berth_data::{DataError, DataLoader, VecDataset};
    ///
    /// let loader = DataLoader::builder(VecDataset::new(vec![vec![1u8, 2], vec![3]]))
    ///     .batch_size(2)
    ///     .collate_fn(|rows: Vec<Vec<u8>>| {
    ///         let width = rows[0].len();
    ///         match rows.iter().position(|r| r.len() != width) {
    ///             Some(bad) => Err(DataError::collate(format!(
    ///                 "row {bad} has {} values; expected {width}, as row 0",
    ///                 rows[bad].len()
    ///             ))),
    ///             None => Ok(rows),
    ///         }
    ///     })
    ///     .build()?;
    /// let err = loader.iter().next().unwrap().unwrap_err();
    /// assert!(matches!(err.original(), DataError::Collate { .. }));
    /// assert_eq!(err.to_string(), "batch 0: collate: row 1 has 1 values; expected 2, as row 0");
    /// # Ok::<(), DataError>(())
    /// ```
    pub fn collate(message: impl Into<String>) -> Self {
        DataError::Collate {
            message: message.into(),
        }
    }

    /// The error's type as a worker error names it ("Caught `DataError::Item` in DataLoader
    /// worker thread 1 …"): `DataError::` and the variant, as Python names the exception class.
    pub fn type_name(&self) -> &'static str {
        match self {
            DataError::InvalidOption { .. } => "DataError::InvalidOption",
            DataError::Idx(_) => "DataError::Idx",
            DataError::Io { .. } => "DataError::Io",
            DataError::IndexOutOfRange { .. } => "DataError::IndexOutOfRange",
            DataError::Item { .. } => "DataError::Item",
            DataError::Collate { .. } => "DataError::Collate",
            DataError::Tensor(_) => "DataError::Tensor",
            DataError::InWorker { .. } => "DataError::InWorker",
            DataError::InBatch { .. } => "DataError::InBatch",
            DataError::WorkerPanicked { .. } => "DataError::WorkerPanicked",
            DataError::WorkerInitPanicked { .. } => "DataError::WorkerInitPanicked",
            DataError::WorkersExited { .. } => "DataError::WorkersExited",
            DataError::Timeout { .. } => "DataError::Timeout",
            DataError::Pin { .. } => "DataError::Pin",
            DataError::Prefetch { .. } => "DataError::Prefetch",
            DataError::Spawn { .. } => "DataError::Spawn",
            DataError::SplitLengths { .. } => "DataError::SplitLengths",
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

/// The original error inside [`DataError::InWorker`] and [`DataError::InBatch`]: a box that
/// dereferences to the [`DataError`] and displays as it. It is not itself an
/// [`Error`](std::error::Error), so the wrapper's [`source`](std::error::Error::source) is the
/// original `DataError` (`downcast_ref::<DataError>()` finds it), where a `Box<DataError>`
/// field would be its own source type.
#[derive(Debug)]
pub struct OriginalError(Box<DataError>);

impl OriginalError {
    /// Wraps `error`.
    pub fn new(error: DataError) -> Self {
        OriginalError(Box::new(error))
    }

    /// The original error, unwrapped.
    pub fn into_inner(self) -> DataError {
        *self.0
    }
}

impl From<DataError> for OriginalError {
    fn from(error: DataError) -> Self {
        OriginalError::new(error)
    }
}

impl std::ops::Deref for OriginalError {
    type Target = DataError;
    fn deref(&self) -> &DataError {
        &self.0
    }
}

impl std::fmt::Display for OriginalError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&*self.0, f)
    }
}

/// `Result` with [`DataError`].
pub type Result<T, E = DataError> = std::result::Result<T, E>;
