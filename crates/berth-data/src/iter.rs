//! One epoch of a loader, on the calling thread or over worker threads: the consumer side,
//! written once for map-style ([`LoaderIter`](crate::LoaderIter)) and iterable
//! ([`IterableLoaderIter`](crate::IterableLoaderIter)) loaders.
//!
//! PyTorch's `_MultiProcessingDataLoaderIter`
//! (<https://github.com/pytorch/pytorch/blob/main/torch/utils/data/dataloader.py>): tasks get
//! increasing ids (`send_idx`) and are dealt round-robin over the *active* workers
//! (`_try_put_index`); `prefetch_factor × num_workers` are primed; every batch handed out, and
//! every "stream exhausted" answer, frees a slot for the next task; results are handed out in
//! task order (`rcvd_idx`) through a reorder buffer; a task whose worker has ended without a
//! result for it is skipped (`_next_data`). For a map-style dataset every worker stays active and
//! the epoch ends with the batch sampler's last batch; for an iterable dataset the epoch ends
//! when every worker's stream is exhausted.

use std::collections::BTreeMap;
use std::sync::mpsc::RecvTimeoutError;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use crate::error::{DataError, OriginalError, Result};
use crate::fetch::Fetcher;
use crate::options::{warn_workers_over_cpus, LoaderOptions, Workers};
use crate::rng::Generator;
use crate::worker::{Task, WorkerPool};

/// How often a consumer with `timeout = 0` checks that its workers are alive, while waiting
/// (PyTorch's `MP_STATUS_CHECK_INTERVAL` is 5 s; threads are cheap to check, so 100 ms).
pub const STATUS_CHECK_INTERVAL: Duration = Duration::from_millis(100);

/// The most batches a loader requests ahead per worker, whatever `prefetch_factor` says (64),
/// for both kinds of loader. Every batch requested ahead is a queued task and, once loaded, a
/// batch held in memory, so a huge `prefetch_factor` (PyTorch primes `prefetch_factor ×
/// num_workers` tasks at once and would hang on `2**40`) is capped here: a stream has no last
/// batch to stop at, and a map-style epoch draws its batches lazily (Note [Lazy epochs]), so
/// its length is no bound either (newcomer defect 22). PyTorch's default is 2.
pub const PREFETCH_LIMIT: usize = 64;

/// The options and the (persistent) pool both loader kinds share.
pub(crate) struct Core<F: Fetcher> {
    pub shared: F,
    pub num_workers: usize,
    pub prefetch_factor: Option<usize>,
    pub persistent_workers: bool,
    pub timeout: Duration,
    pub generator: Generator,
    pub pool: Mutex<Option<WorkerPool<F::Batch>>>,
}

impl<F: Fetcher> Core<F> {
    /// The core of a loader over `shared`, from its validated options; warns when there are
    /// more workers than CPUs.
    pub fn new<B>(
        shared: F,
        opts: &LoaderOptions<B>,
        workers: Workers,
        generator: Generator,
    ) -> Self {
        warn_workers_over_cpus(workers.num_workers);
        Core {
            shared,
            num_workers: workers.num_workers,
            prefetch_factor: workers.prefetch_factor,
            persistent_workers: opts.persistent_workers,
            timeout: workers.timeout,
            generator,
            pool: Mutex::new(None),
        }
    }
}

/// Where an epoch's tasks come from.
pub(crate) enum Plan {
    /// Map-style: the batch sampler's index lists, drawn one at a time as they are sent (Note
    /// [Lazy epochs]).
    Batches(Batches),
    /// Iterable: an endless run of "the next batch of your stream" (PyTorch's
    /// `_InfiniteConstantSampler`).
    Stream,
}

/// A map-style epoch's batches: the batch sampler's iterator and how many batches it has.
pub(crate) struct Batches {
    iter: Box<dyn Iterator<Item = Vec<usize>> + Send>,
    /// Batches in the epoch: the batch sampler's `len()`, lowered to the count actually yielded
    /// if its iterator ends early.
    len: usize,
}

impl Batches {
    /// The epoch of `iter`, announced as `len` batches.
    pub fn new(iter: Box<dyn Iterator<Item = Vec<usize>> + Send>, len: usize) -> Self {
        Batches { iter, len }
    }

    /// Batch number `index` (the next one not yet taken), or `None` past the end.
    fn take(&mut self, index: usize) -> Option<Vec<usize>> {
        if index >= self.len {
            return None;
        }
        let next = self.iter.next();
        if next.is_none() {
            self.len = index;
        }
        next
    }
}

/// The owner worker of each task sent and not yet handed out: task ids `first..` in order.
/// Tasks already handed out are forgotten, so an endless stream (or a lazy epoch of 2^40
/// items) holds only the tasks in flight (Note [Lazy epochs]).
#[derive(Default)]
struct Owners {
    first: usize,
    workers: std::collections::VecDeque<usize>,
}

impl Owners {
    fn push(&mut self, worker: usize) {
        self.workers.push_back(worker);
    }

    fn get(&self, task: usize) -> Option<usize> {
        task.checked_sub(self.first)
            .and_then(|i| self.workers.get(i))
            .copied()
    }

    /// Forgets the owners of tasks before `task`.
    fn forget_before(&mut self, task: usize) {
        while self.first < task && self.workers.pop_front().is_some() {
            self.first += 1;
        }
    }
}

/// One epoch over a [`Core`].
pub(crate) struct Epoch<'a, F: Fetcher> {
    core: &'a Core<F>,
    plan: Plan,
    /// Next task to hand out.
    rcvd_idx: usize,
    state: State<'a, F>,
    base_seed: u64,
}

enum State<'a, F: Fetcher + 'a> {
    Single(F::Stream<'a>),
    Multi(Multi<F::Batch>),
    Failed(Option<DataError>),
    Done,
}

struct Multi<B> {
    pool: Option<WorkerPool<B>>,
    generation: u64,
    /// Next task to send to a worker.
    send_idx: usize,
    /// Owner worker of each task sent.
    owner: Owners,
    /// Workers whose stream is not known to be exhausted (`_workers_status`).
    active: Vec<bool>,
    /// The round-robin cursor (`_worker_queue_idx_cycle`), restarted at 0 every epoch.
    next_worker: usize,
    reorder: BTreeMap<usize, (usize, Result<B>)>,
}

impl<'a, F: Fetcher> Epoch<'a, F> {
    /// Starts an epoch: `base_seed` first (at iterator creation, with or without workers), then
    /// the plan's draws (PyTorch's order, so batches do not depend on `num_workers`).
    pub fn new(core: &'a Core<F>, draw: impl FnOnce() -> Plan) -> Self {
        if core.num_workers == 0 {
            let base_seed = core.generator.next_u64();
            let plan = draw();
            return Epoch {
                core,
                plan,
                rcvd_idx: 0,
                state: State::Single(core.shared.start()),
                base_seed,
            };
        }
        let reused = if core.persistent_workers {
            core.pool
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take()
        } else {
            None
        };
        let (pool, base_seed) = match reused {
            Some(p) => {
                let seed = p.base_seed;
                (Ok(p), seed)
            }
            None => {
                let base_seed = core.generator.next_u64();
                (
                    WorkerPool::spawn(core.num_workers, base_seed, &core.shared),
                    base_seed,
                )
            }
        };
        let mut plan = draw();
        let state = match pool {
            Ok(pool) => {
                let generation = pool.next_generation();
                let mut m = Multi {
                    active: vec![true; pool.len()],
                    pool: Some(pool),
                    generation,
                    send_idx: 0,
                    owner: Owners::default(),
                    next_worker: 0,
                    reorder: BTreeMap::new(),
                };
                for _ in 0..Self::prime_count(core, &plan) {
                    Self::try_put(&mut m, &mut plan);
                }
                State::Multi(m)
            }
            Err(e) => State::Failed(Some(e)),
        };
        Epoch {
            core,
            plan,
            rcvd_idx: 0,
            state,
            base_seed,
        }
    }

    /// How many tasks to send when the epoch starts: `prefetch_factor × num_workers`, with
    /// `prefetch_factor` at most [`PREFETCH_LIMIT`], and (map-style) no more than the epoch's
    /// batches. Each batch handed out (or stream
    /// answered "exhausted") then sends one more, so this is also the most tasks ever in flight.
    fn prime_count(core: &Core<F>, plan: &Plan) -> usize {
        let ahead = core
            .prefetch_factor
            .unwrap_or(1)
            .min(PREFETCH_LIMIT)
            .saturating_mul(core.num_workers);
        match plan {
            Plan::Batches(b) => ahead.min(b.len),
            Plan::Stream => ahead,
        }
    }

    /// Sends the next task to the next active worker, round-robin (`_try_put_index`).
    fn try_put(m: &mut Multi<F::Batch>, plan: &mut Plan) {
        let Some(pool) = &m.pool else { return };
        let indices = match plan {
            Plan::Batches(b) => match b.take(m.send_idx) {
                Some(indices) => indices,
                None => return,
            },
            Plan::Stream => Vec::new(),
        };
        let n = pool.len();
        let mut worker = None;
        for _ in 0..n {
            let w = m.next_worker;
            m.next_worker = (w + 1) % n;
            if m.active[w] {
                worker = Some(w);
                break;
            }
        }
        let Some(worker) = worker else { return };
        pool.send(
            worker,
            Task {
                generation: m.generation,
                batch_index: m.send_idx,
                indices,
            },
        );
        m.owner.push(worker);
        m.send_idx += 1;
    }

    /// Batches left in this epoch, when the plan knows (map-style).
    pub fn remaining(&self) -> Option<usize> {
        match (&self.state, &self.plan) {
            (State::Single(_) | State::Multi(_), Plan::Batches(b)) => {
                Some(b.len - self.rcvd_idx.min(b.len))
            }
            (_, Plan::Batches(_)) => Some(0),
            (_, Plan::Stream) => None,
        }
    }

    /// The most items [`next`](Iterator::next) can still yield, when the plan knows
    /// (map-style): one per batch left (an error that ends the epoch, a timeout or a dead
    /// worker, takes the place of a batch), or the one error of a failed start.
    pub fn max_items(&self) -> Option<usize> {
        match (&self.state, &self.plan) {
            (State::Failed(e), _) => Some(usize::from(e.is_some())),
            (_, Plan::Batches(_)) => self.remaining(),
            (_, Plan::Stream) => None,
        }
    }

    /// The base seed drawn for this iterator (see [`LoaderIter::base_seed`]).
    pub fn base_seed(&self) -> u64 {
        self.base_seed
    }

    fn finish(&mut self) {
        if let State::Multi(m) = &mut self.state {
            if let Some(pool) = m.pool.take() {
                if self.core.persistent_workers {
                    pool.next_generation(); // invalidate anything still queued
                    *self
                        .core
                        .pool
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner) = Some(pool);
                }
                // else: dropping the pool stops and joins its workers.
            }
        }
        self.state = State::Done;
    }

    /// Ends the epoch after a timeout, without waiting for the late batch: the tasks still
    /// queued are invalidated and no more are sent. A persistent pool goes back to the loader
    /// (its workers finish the item in hand, then serve the next epoch); otherwise the workers
    /// are told to stop but not joined, so a worker stuck in an item cannot hang the consumer:
    /// its thread ends by itself when the item returns. (A thread cannot be killed; PyTorch
    /// terminates a worker that does not exit within its join timeout.)
    fn end_after_timeout(&mut self) {
        if self.core.persistent_workers {
            self.finish();
            return;
        }
        if let State::Multi(m) = &mut self.state {
            if let Some(pool) = m.pool.take() {
                pool.detach();
            }
        }
        self.state = State::Done;
    }

    /// The next result with workers; `None` when the epoch is over.
    fn next_multi(&mut self) -> Option<Result<F::Batch>> {
        let timeout = self.core.timeout;
        let State::Multi(m) = &mut self.state else {
            return None;
        };
        loop {
            // Skip tasks owned by a worker whose stream ended and that left no result for them.
            while self.rcvd_idx < m.send_idx
                && !m.reorder.contains_key(&self.rcvd_idx)
                && !m.owner.get(self.rcvd_idx).is_some_and(|w| m.active[w])
            {
                self.rcvd_idx += 1;
            }
            m.owner.forget_before(self.rcvd_idx);
            if self.rcvd_idx >= m.send_idx {
                return None;
            }
            if let Some((worker_id, result)) = m.reorder.remove(&self.rcvd_idx) {
                let batch_index = self.rcvd_idx;
                self.rcvd_idx += 1;
                Self::try_put(m, &mut self.plan);
                return Some(result.map_err(|e| match e {
                    e @ (DataError::WorkerPanicked { .. }
                    | DataError::WorkerInitPanicked { .. }) => e,
                    e => DataError::InWorker {
                        worker_id,
                        batch_index,
                        source: OriginalError::new(e),
                    },
                }));
            }
            let pool = m.pool.as_ref()?;
            let wait = if timeout.is_zero() {
                STATUS_CHECK_INTERVAL
            } else {
                timeout
            };
            match pool.results.recv_timeout(wait) {
                Ok(r) if r.generation == m.generation => match r.result {
                    Some(result) => {
                        m.reorder.insert(r.batch_index, (r.worker_id, result));
                    }
                    None => {
                        // The worker's stream is exhausted: no more tasks for it; the slot
                        // goes to the next active worker.
                        m.active[r.worker_id] = false;
                        Self::try_put(m, &mut self.plan);
                    }
                },
                Ok(_) => {} // an older epoch's result
                Err(RecvTimeoutError::Timeout) => {
                    let owner = m.owner.get(self.rcvd_idx).unwrap_or(0);
                    let dead = pool.dead_workers();
                    if !dead.is_empty() {
                        return Some(Err(DataError::WorkersExited { worker_ids: dead }));
                    }
                    if !timeout.is_zero() {
                        return Some(Err(DataError::Timeout {
                            timeout,
                            batch_index: self.rcvd_idx,
                            worker_id: owner,
                        }));
                    }
                }
                Err(RecvTimeoutError::Disconnected) => {
                    return Some(Err(DataError::WorkersExited {
                        worker_ids: (0..pool.len()).collect(),
                    }));
                }
            }
        }
    }
}

impl<'a, F: Fetcher> Iterator for Epoch<'a, F> {
    type Item = Result<F::Batch>;

    fn next(&mut self) -> Option<Self::Item> {
        let core: &'a Core<F> = self.core;
        match &mut self.state {
            State::Done => None,
            State::Failed(e) => {
                let e = e.take();
                if e.is_none() {
                    self.state = State::Done;
                }
                e.map(Err)
            }
            State::Single(stream) => {
                let batch_index = self.rcvd_idx;
                let indices = match &mut self.plan {
                    Plan::Batches(b) => match b.take(batch_index) {
                        Some(i) => i,
                        None => {
                            self.state = State::Done;
                            return None;
                        }
                    },
                    Plan::Stream => Vec::new(),
                };
                let Some(result) = core.shared.fetch(stream, &indices, None) else {
                    self.state = State::Done;
                    return None;
                };
                self.rcvd_idx += 1;
                Some(result.map_err(|e| DataError::InBatch {
                    batch_index,
                    source: OriginalError::new(e),
                }))
            }
            State::Multi(_) => {
                let out = self.next_multi();
                match &out {
                    None => self.finish(),
                    Some(Err(DataError::WorkersExited { .. })) => {
                        // Tasks owned by a dead worker never come: stop here (PyTorch shuts
                        // down).
                        if let State::Multi(m) = &mut self.state {
                            m.pool = None;
                        }
                        self.state = State::Done;
                    }
                    // PyTorch raises "DataLoader timed out" out of `__next__`, which ends the
                    // `for` loop: one error, then the epoch is over.
                    Some(Err(DataError::Timeout { .. })) => self.end_after_timeout(),
                    Some(_) => {}
                }
                out
            }
        }
    }
}

impl<F: Fetcher> Drop for Epoch<'_, F> {
    fn drop(&mut self) {
        self.finish();
    }
}

#[cfg(test)]
mod tests {
    use super::Owners;

    #[test]
    fn owners_of_handed_out_tasks_are_forgotten() {
        let mut o = Owners::default();
        for task in 0..1000 {
            o.push(task % 3);
            // The consumer hands out every task but the last two.
            o.forget_before(task.saturating_sub(1));
        }
        assert_eq!(o.workers.len(), 2, "only the tasks in flight are held");
        assert_eq!(o.get(998), Some(998 % 3));
        assert_eq!(o.get(999), Some(0));
        assert_eq!(o.get(997), None);
        assert_eq!(o.get(1000), None);
    }
}
