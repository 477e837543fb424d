//! Worker threads: [`WorkerInfo`], per-worker seeding and the worker pool.
//!
//! Note [Workers are threads]: PyTorch's workers are processes (fork/spawn/forkserver), chosen to
//! escape the GIL. berth's are OS threads of the calling process sharing the dataset through an
//! `Arc`, so there is no pickling, no copy-on-access memory growth (pytorch#13246) and no
//! shared-memory transport: a batch moves to the consumer by pointer. What maps across:
//! `num_workers` threads (named `berth-data-worker-N`), one task channel per worker and one
//! result channel, round-robin task assignment, in-order delivery through a reorder buffer,
//! `prefetch_factor × num_workers` tasks in flight, per-worker seeds `base_seed + worker_id`,
//! `worker_init_fn` called after seeding, `persistent_workers` reusing the pool across epochs.
//! For an [`IterableDataset`](crate::IterableDataset) each worker starts its own stream per
//! epoch and answers "exhausted" once it ends (PyTorch's `_IterableDatasetStopIteration`); the
//! consumer then deals no more tasks to it. What differs: a thread cannot be killed, so shutdown
//! waits for the item each worker is loading (except after a timeout, when the consumer leaves
//! the busy worker to finish on its own); a panic in user code is caught per batch (and in
//! `worker_init_fn`, reported at the worker's batches, as PyTorch stores the `worker_init_fn`
//! exception for the first task) instead of killing a process; the dataset is one shared
//! object, not a copy per worker (the per-worker state of an iterable dataset is its stream);
//! error messages say "worker thread" where PyTorch says "worker process"
//! ([`DataError::InWorker`]); device work in a worker runs in the same
//! process as the parent, so there is no "cannot re-initialize CUDA in forked subprocess" failure
//! (<https://github.com/pytorch/pytorch/issues/40403>): it either works or fails exactly as on
//! the main thread.

use std::any::Any;
use std::cell::RefCell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;

use crate::error::{DataError, Result};
use crate::fetch::Fetcher;
use crate::rng::Generator;

/// What a worker thread knows about itself (`torch.utils.data.get_worker_info()`,
/// <https://github.com/pytorch/pytorch/blob/main/torch/utils/data/_utils/worker.py>): its id, the
/// number of workers, its seed and the dataset. An [`IterableDataset`](crate::IterableDataset)
/// reads it in [`iter`](crate::IterableDataset::iter) to shard its stream.
#[derive(Clone)]
pub struct WorkerInfo {
    /// This worker's id, in `0..num_workers`.
    pub id: usize,
    /// The loader's `num_workers`.
    pub num_workers: usize,
    /// This worker's seed: `base_seed + id` (wrapping), where `base_seed` is drawn once per
    /// iterator (once per pool with `persistent_workers`) from the loader's generator.
    pub seed: u64,
    dataset: Arc<dyn Any + Send + Sync>,
}

impl WorkerInfo {
    /// The loader's dataset (PyTorch's `worker_info.dataset`), when it is a `D`. Workers are
    /// threads, so this is the one dataset every worker shares (an `Arc`), not a per-worker copy
    /// (Note [Workers are threads]); what is per worker is the iterable dataset's stream.
    pub fn dataset<D: Any + Send + Sync>(&self) -> Option<Arc<D>> {
        Arc::clone(&self.dataset).downcast::<D>().ok()
    }
}

impl std::fmt::Debug for WorkerInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerInfo")
            .field("id", &self.id)
            .field("num_workers", &self.num_workers)
            .field("seed", &self.seed)
            .finish_non_exhaustive()
    }
}

impl PartialEq for WorkerInfo {
    /// Same id, worker count and seed, and the same dataset object.
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
            && self.num_workers == other.num_workers
            && self.seed == other.seed
            && Arc::ptr_eq(&self.dataset, &other.dataset)
    }
}

impl Eq for WorkerInfo {}

struct WorkerState {
    info: WorkerInfo,
    rng: Generator,
}

thread_local! {
    static WORKER: RefCell<Option<WorkerState>> = const { RefCell::new(None) };
    static THREAD_RNG: Generator = Generator::from_entropy();
}

/// This thread's [`WorkerInfo`] inside a DataLoader worker, `None` elsewhere (including the main
/// thread with `num_workers = 0`, as in PyTorch).
pub fn worker_info() -> Option<WorkerInfo> {
    WORKER.with(|w| w.borrow().as_ref().map(|s| s.info.clone()))
}

/// The random generator datasets should draw augmentations from (so workers never share one
/// seed, <https://github.com/pytorch/pytorch/issues/5059>): inside a worker, a
/// generator seeded with the worker's seed, whose stream continues across epochs with
/// `persistent_workers` and is reseeded with each new pool otherwise; elsewhere, a per-thread
/// generator seeded from entropy.
pub fn worker_rng() -> Generator {
    WORKER
        .with(|w| w.borrow().as_ref().map(|s| s.rng.clone()))
        .unwrap_or_else(|| THREAD_RNG.with(Generator::clone))
}

pub use crate::options::WorkerInitFn;

pub(crate) struct Task {
    pub generation: u64,
    pub batch_index: usize,
    /// The batch's indices (map-style); empty for an iterable dataset, whose task is "the next
    /// batch of your stream" (PyTorch sends `[None] * batch_size` from `_InfiniteConstantSampler`).
    pub indices: Vec<usize>,
}

pub(crate) struct TaskResult<B> {
    pub generation: u64,
    pub batch_index: usize,
    pub worker_id: usize,
    /// `None`: the worker's stream is exhausted (PyTorch's `_IterableDatasetStopIteration`).
    pub result: Option<Result<B>>,
}

pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_string()
    }
}

/// One worker thread: seeds itself, runs `worker_init_fn`, then answers every task of the
/// current generation with exactly one result. A new generation (a new epoch of a persistent
/// pool) starts a fresh stream (PyTorch's `_ResumeIteration` rebuilds the fetcher); once a
/// stream is exhausted, every further task of that epoch is answered "exhausted".
///
/// A panic in `worker_init_fn` is caught (PyTorch's `_worker_loop` stores the exception as
/// `init_exception`) and the worker loads nothing: its first task of each epoch is answered
/// with [`DataError::WorkerInitPanicked`]; later tasks of the epoch get the same error
/// (map-style, whose every batch must be answered) or "exhausted" (iterable, whose stream
/// would otherwise never end).
fn worker_loop<F: Fetcher>(
    info: WorkerInfo,
    shared: F,
    tasks: Receiver<Task>,
    results: Sender<TaskResult<F::Batch>>,
    generation: Arc<AtomicU64>,
) {
    let id = info.id;
    let seed = info.seed;
    WORKER.with(|w| {
        *w.borrow_mut() = Some(WorkerState {
            info,
            rng: Generator::new(seed),
        })
    });
    let init_panic = shared
        .init()
        .and_then(|init| catch_unwind(AssertUnwindSafe(|| init(id))).err())
        .map(|payload| panic_message(payload.as_ref()));
    // The epoch whose stream `stream` is; `None` in `stream` once it is exhausted.
    let mut stream_generation = None;
    let mut stream: Option<F::Stream<'_>> = None;
    while let Ok(task) = tasks.recv() {
        if task.generation != generation.load(Ordering::Acquire) {
            continue; // an abandoned epoch's task
        }
        let panicked = |payload: Box<dyn Any + Send>| DataError::WorkerPanicked {
            worker_id: id,
            batch_index: task.batch_index,
            message: panic_message(payload.as_ref()),
        };
        let mut result = None;
        if let Some(message) = &init_panic {
            let first = stream_generation != Some(task.generation);
            stream_generation = Some(task.generation);
            if first || !F::PANIC_ENDS_STREAM {
                result = Some(Err(DataError::WorkerInitPanicked {
                    worker_id: id,
                    batch_index: task.batch_index,
                    message: message.clone(),
                }));
            }
        } else if stream_generation != Some(task.generation) {
            stream_generation = Some(task.generation);
            stream = None;
            match catch_unwind(AssertUnwindSafe(|| shared.start())) {
                Ok(s) => stream = Some(s),
                Err(payload) => result = Some(Err(panicked(payload))),
            }
        }
        if let Some(s) = stream.as_mut() {
            result = match catch_unwind(AssertUnwindSafe(|| {
                shared.fetch(s, &task.indices, Some(id))
            })) {
                Ok(None) => {
                    stream = None;
                    None
                }
                Ok(Some(r)) => Some(r),
                Err(payload) => {
                    if F::PANIC_ENDS_STREAM {
                        stream = None;
                    }
                    Some(Err(panicked(payload)))
                }
            };
        }
        let msg = TaskResult {
            generation: task.generation,
            batch_index: task.batch_index,
            worker_id: id,
            result,
        };
        if results.send(msg).is_err() {
            break;
        }
    }
}

/// `num_workers` threads, their task channels and the shared result channel.
pub(crate) struct WorkerPool<B> {
    tasks: Vec<Sender<Task>>,
    pub results: Receiver<TaskResult<B>>,
    handles: Vec<JoinHandle<()>>,
    generation: Arc<AtomicU64>,
    /// The base seed the workers were seeded from.
    pub base_seed: u64,
}

impl<B: Send + 'static> WorkerPool<B> {
    /// Starts `num_workers` threads seeded `base_seed + id`.
    pub fn spawn<F: Fetcher<Batch = B>>(
        num_workers: usize,
        base_seed: u64,
        shared: &F,
    ) -> Result<Self> {
        let (result_tx, results) = mpsc::channel();
        let generation = Arc::new(AtomicU64::new(0));
        let mut pool = WorkerPool {
            tasks: Vec::new(),
            results,
            handles: Vec::new(),
            generation: Arc::clone(&generation),
            base_seed,
        };
        for id in 0..num_workers {
            let (task_tx, task_rx) = mpsc::channel();
            let info = WorkerInfo {
                id,
                num_workers,
                seed: base_seed.wrapping_add(id as u64),
                dataset: shared.dataset_any(),
            };
            let (shared, result_tx, generation) =
                (shared.clone(), result_tx.clone(), Arc::clone(&generation));
            let handle = std::thread::Builder::new()
                .name(format!("berth-data-worker-{id}"))
                .spawn(move || worker_loop(info, shared, task_rx, result_tx, generation))
                .map_err(|source| DataError::Spawn {
                    worker_id: id,
                    source,
                })?;
            pool.tasks.push(task_tx);
            pool.handles.push(handle);
        }
        Ok(pool)
    }

    /// Number of workers.
    pub fn len(&self) -> usize {
        self.handles.len()
    }

    /// Starts a new epoch: tasks of older epochs still queued are skipped by the workers.
    pub fn next_generation(&self) -> u64 {
        self.generation.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// Sends a task to worker `worker_id`; `false` if that worker is gone.
    pub fn send(&self, worker_id: usize, task: Task) -> bool {
        self.tasks[worker_id].send(task).is_ok()
    }

    /// Stops the workers without joining them: queued tasks are invalidated and the task
    /// channels closed, so each thread ends once the item it is loading returns (its result
    /// then has no receiver). For a worker that may be stuck (after a timeout).
    pub fn detach(mut self) {
        // Dropping a `JoinHandle` detaches its thread; `drop` then joins nothing.
        self.handles.clear();
    }

    /// The ids of workers whose thread has ended.
    pub fn dead_workers(&self) -> Vec<usize> {
        self.handles
            .iter()
            .enumerate()
            .filter(|(_, h)| h.is_finished())
            .map(|(i, _)| i)
            .collect()
    }
}

impl<B> Drop for WorkerPool<B> {
    /// Stops and joins every worker: queued tasks are invalidated, the task channels closed, and
    /// each thread joined (a thread busy with an item finishes that item first).
    fn drop(&mut self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
        self.tasks.clear();
        for handle in self.handles.drain(..) {
            // A worker that panicked outside item loading was already reported; nothing to do.
            let _ = handle.join();
        }
    }
}
