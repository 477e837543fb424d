//! `LoaderIter`: one epoch of a [`DataLoader`], on the calling thread or over worker threads.

use std::collections::BTreeMap;
use std::sync::mpsc::RecvTimeoutError;
use std::sync::PoisonError;
use std::time::Duration;

use crate::collate::Collate;
use crate::dataset::Dataset;
use crate::error::{DataError, Result};
use crate::loader::DataLoader;
use crate::worker::{load_batch, Task, WorkerPool};

/// How often a consumer with `timeout = 0` checks that its workers are alive, while waiting
/// (PyTorch's `MP_STATUS_CHECK_INTERVAL` is 5 s; threads are cheap to check, so 100 ms).
pub const STATUS_CHECK_INTERVAL: Duration = Duration::from_millis(100);

/// One epoch of batches, in sampler order. Yields `Err` for a batch whose loading failed and
/// goes on with the next batch; after a dead worker or a failed start it yields that error once,
/// then ends. Dropping it mid-epoch stops and joins the workers (or, with `persistent_workers`,
/// returns the pool to the loader).
pub struct LoaderIter<'a, D: Dataset, C: Collate<D>> {
    loader: &'a DataLoader<D, C>,
    batches: Vec<Option<Vec<usize>>>,
    /// Next batch to hand out.
    rcvd_idx: usize,
    state: State<C::Batch>,
    base_seed: u64,
}

enum State<B> {
    Single,
    Multi(Multi<B>),
    Failed(Option<DataError>),
    Done,
}

struct Multi<B> {
    pool: Option<WorkerPool<B>>,
    generation: u64,
    /// Next batch to send to a worker.
    send_idx: usize,
    /// Owner worker of each batch sent.
    owner: Vec<usize>,
    reorder: BTreeMap<usize, (usize, Result<B>)>,
}

impl<'a, D: Dataset, C: Collate<D>> LoaderIter<'a, D, C> {
    pub(crate) fn new(loader: &'a DataLoader<D, C>) -> Self {
        let mut it = LoaderIter {
            loader,
            batches: Vec::new(),
            rcvd_idx: 0,
            state: State::Done,
            base_seed: 0,
        };
        // PyTorch order: base_seed first (at iterator creation, with or without workers), then
        // the sampler's draws; so the batches do not depend on `num_workers`.
        if loader.num_workers == 0 {
            it.base_seed = loader.generator.next_u64();
            it.batches = it.draw_batches();
            it.state = State::Single;
            return it;
        }
        let reused = if loader.persistent_workers {
            loader
                .pool
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take()
        } else {
            None
        };
        let pool = match reused {
            Some(p) => {
                it.base_seed = p.base_seed;
                Ok(p)
            }
            None => {
                let base_seed = loader.generator.next_u64();
                it.base_seed = base_seed;
                WorkerPool::spawn(loader.num_workers, base_seed, &loader.shared)
            }
        };
        it.batches = it.draw_batches();
        it.state = match pool {
            Ok(pool) => {
                let generation = pool.next_generation();
                let mut m = Multi {
                    pool: Some(pool),
                    generation,
                    send_idx: 0,
                    owner: Vec::new(),
                    reorder: BTreeMap::new(),
                };
                let prime = loader.prefetch_factor.unwrap_or(1) * loader.num_workers;
                for _ in 0..prime {
                    Self::try_put(&mut m, &mut it.batches);
                }
                State::Multi(m)
            }
            Err(e) => State::Failed(Some(e)),
        };
        it
    }

    fn draw_batches(&self) -> Vec<Option<Vec<usize>>> {
        let mut bs = self
            .loader
            .batch_sampler
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        bs.epoch().into_iter().map(Some).collect()
    }

    /// Sends the next batch of indices, round-robin over the workers.
    fn try_put(m: &mut Multi<C::Batch>, batches: &mut [Option<Vec<usize>>]) {
        let Some(pool) = &m.pool else { return };
        if m.send_idx >= batches.len() {
            return;
        }
        let worker = m.send_idx % pool.len();
        let indices = batches[m.send_idx].take().unwrap_or_default();
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

    /// Number of batches left in this epoch.
    pub fn remaining(&self) -> usize {
        match self.state {
            State::Single | State::Multi(_) => self.batches.len() - self.rcvd_idx,
            _ => 0,
        }
    }

    /// The base seed drawn for this iterator from the loader's generator (its workers' seeds
    /// are `base_seed + worker_id`); with `persistent_workers`, the pool's base seed, drawn once.
    pub fn base_seed(&self) -> u64 {
        self.base_seed
    }

    fn finish(&mut self) {
        if let State::Multi(m) = &mut self.state {
            if let Some(pool) = m.pool.take() {
                if self.loader.persistent_workers {
                    pool.next_generation(); // invalidate anything still queued
                    *self
                        .loader
                        .pool
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner) = Some(pool);
                }
                // else: dropping the pool stops and joins its workers.
            }
        }
        self.state = State::Done;
    }

    fn next_multi(&mut self) -> Option<Result<C::Batch>> {
        let timeout = self.loader.timeout;
        let State::Multi(m) = &mut self.state else {
            return None;
        };
        loop {
            if let Some((worker_id, result)) = m.reorder.remove(&self.rcvd_idx) {
                let batch_index = self.rcvd_idx;
                self.rcvd_idx += 1;
                Self::try_put(m, &mut self.batches);
                return Some(result.map_err(|e| match e {
                    e @ DataError::WorkerPanicked { .. } => e,
                    e => DataError::InWorker {
                        worker_id,
                        batch_index,
                        source: Box::new(e),
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
                Ok(r) => {
                    if r.generation == m.generation {
                        m.reorder.insert(r.batch_index, (r.worker_id, r.result));
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    let owner = m.owner.get(self.rcvd_idx).copied().unwrap_or(0);
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

impl<D: Dataset, C: Collate<D>> Iterator for LoaderIter<'_, D, C> {
    type Item = Result<C::Batch>;

    fn next(&mut self) -> Option<Self::Item> {
        match &mut self.state {
            State::Done => None,
            State::Failed(e) => {
                let e = e.take();
                if e.is_none() {
                    self.state = State::Done;
                }
                e.map(Err)
            }
            State::Single => {
                let batch_index = self.rcvd_idx;
                let indices = self
                    .batches
                    .get_mut(batch_index)?
                    .take()
                    .unwrap_or_default();
                self.rcvd_idx += 1;
                Some(
                    load_batch(&self.loader.shared, &indices, None).map_err(|e| {
                        DataError::InBatch {
                            batch_index,
                            source: Box::new(e),
                        }
                    }),
                )
            }
            State::Multi(_) => {
                if self.rcvd_idx >= self.batches.len() {
                    self.finish();
                    return None;
                }
                let out = self.next_multi();
                if let Some(Err(DataError::WorkersExited { .. })) = &out {
                    // Batches owned by a dead worker never come: stop here (PyTorch shuts down).
                    if let State::Multi(m) = &mut self.state {
                        m.pool = None;
                    }
                    self.state = State::Done;
                }
                out
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (0, Some(self.remaining() + 1))
    }
}

impl<D: Dataset, C: Collate<D>> Drop for LoaderIter<'_, D, C> {
    fn drop(&mut self) {
        self.finish();
    }
}
