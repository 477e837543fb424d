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
//! What differs: a thread cannot be killed, so shutdown waits for the item each worker is
//! loading; a panic in user code is caught per batch instead of killing a process; device work in
//! a worker runs in the same process as the parent, so there is no "cannot re-initialize CUDA in
//! forked subprocess" failure (<https://github.com/pytorch/pytorch/issues/40403>): it either
//! works or fails exactly as on the main thread.

use std::cell::RefCell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;

use crate::collate::{Collate, CollateContext};
use crate::dataset::Dataset;
use crate::error::{DataError, Result};
use crate::pin::{PinFn, PinTarget};
use crate::rng::Generator;

/// What a worker thread knows about itself (`torch.utils.data.get_worker_info()`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkerInfo {
    /// This worker's id, in `0..num_workers`.
    pub id: usize,
    /// The loader's `num_workers`.
    pub num_workers: usize,
    /// This worker's seed: `base_seed + id` (wrapping), where `base_seed` is drawn once per
    /// iterator (once per pool with `persistent_workers`) from the loader's generator.
    pub seed: u64,
}

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
    WORKER.with(|w| w.borrow().as_ref().map(|s| s.info))
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

/// A user callback run in each worker after seeding (`worker_init_fn`), given the worker id.
pub type WorkerInitFn = Arc<dyn Fn(usize) + Send + Sync>;

pub(crate) struct Task {
    pub generation: u64,
    pub batch_index: usize,
    pub indices: Vec<usize>,
}

pub(crate) struct TaskResult<B> {
    pub generation: u64,
    pub batch_index: usize,
    pub worker_id: usize,
    pub result: Result<B>,
}

/// What every worker needs, shared.
pub(crate) struct WorkerShared<D: Dataset, C: Collate<D>> {
    pub dataset: Arc<D>,
    pub collate: Arc<C>,
    pub pin: Option<(PinTarget, PinFn<C::Batch>)>,
    pub init: Option<WorkerInitFn>,
}

impl<D: Dataset, C: Collate<D>> Clone for WorkerShared<D, C> {
    fn clone(&self) -> Self {
        WorkerShared {
            dataset: Arc::clone(&self.dataset),
            collate: Arc::clone(&self.collate),
            pin: self.pin.clone(),
            init: self.init.clone(),
        }
    }
}

/// Runs one batch: fetch, collate (into pinned buffers when pinning), then the batch's own
/// `pin_memory` step. Shared by the workers and the single-threaded path.
pub(crate) fn load_batch<D: Dataset, C: Collate<D>>(
    shared: &WorkerShared<D, C>,
    indices: &[usize],
    worker_id: Option<usize>,
) -> Result<C::Batch> {
    let ctx = CollateContext {
        worker_id,
        pin: shared.pin.as_ref().map(|(t, _)| t.clone()),
    };
    let batch = shared.collate.collate(&shared.dataset, indices, &ctx)?;
    match &shared.pin {
        Some((target, pin)) => pin(batch, target),
        None => Ok(batch),
    }
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

fn worker_loop<D: Dataset, C: Collate<D>>(
    info: WorkerInfo,
    shared: WorkerShared<D, C>,
    tasks: Receiver<Task>,
    results: Sender<TaskResult<C::Batch>>,
    generation: Arc<AtomicU64>,
) {
    WORKER.with(|w| {
        *w.borrow_mut() = Some(WorkerState {
            info,
            rng: Generator::new(info.seed),
        })
    });
    if let Some(init) = &shared.init {
        // A panic here ends the thread; the consumer reports it as "exited unexpectedly".
        init(info.id);
    }
    while let Ok(task) = tasks.recv() {
        if task.generation != generation.load(Ordering::Acquire) {
            continue; // an abandoned epoch's task
        }
        let result = catch_unwind(AssertUnwindSafe(|| {
            load_batch(&shared, &task.indices, Some(info.id))
        }))
        .unwrap_or_else(|payload| {
            Err(DataError::WorkerPanicked {
                worker_id: info.id,
                batch_index: task.batch_index,
                message: panic_message(payload.as_ref()),
            })
        });
        let msg = TaskResult {
            generation: task.generation,
            batch_index: task.batch_index,
            worker_id: info.id,
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
    pub fn spawn<D: Dataset, C: Collate<D, Batch = B>>(
        num_workers: usize,
        base_seed: u64,
        shared: &WorkerShared<D, C>,
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
