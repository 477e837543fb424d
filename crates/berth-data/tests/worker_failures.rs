//! Workers that fail outside a batch: a timeout ends the epoch after one error, a panicking
//! `worker_init_fn` is reported with its message at the worker's batches, a worker thread that
//! dies is reported (never a hang), and a panic without workers unwinds, as in PyTorch.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use berth_data::{
    worker_info, CollateFn, DataError, DataLoaderBuilder, Dataset, IterableDataLoaderBuilder,
    IterableDataset, Result,
};

use crate::util::{collect_batches, gettid, range, thread_gone, Flaky};

type Ident = fn(Vec<usize>) -> Result<Vec<usize>>;

fn ident(v: Vec<usize>) -> Result<Vec<usize>> {
    Ok(v)
}

fn builder<D: Dataset<Item = usize>>(ds: D) -> DataLoaderBuilder<D, CollateFn<Ident>> {
    DataLoaderBuilder::with_collate(ds, CollateFn(ident as Ident))
}

fn iterable<D: IterableDataset<Item = usize>>(
    ds: D,
) -> IterableDataLoaderBuilder<D, CollateFn<Ident>> {
    IterableDataLoaderBuilder::with_collate(ds, CollateFn(ident as Ident))
}

#[test]
fn timeout_ends_the_epoch_after_one_error_and_the_stuck_worker_is_not_waited_for() {
    let tids = Arc::new(Mutex::new(Vec::new()));
    let t2 = Arc::clone(&tids);
    let dl = builder(Flaky {
        len: 4,
        fail: vec![],
        panic: vec![],
        sleep_ms: 1500,
    })
    .num_workers(1)
    .timeout(0.1)
    .worker_init_fn(move |_| t2.lock().unwrap().push(gettid()))
    .build()
    .unwrap();
    let t0 = Instant::now();
    let mut it = dl.iter();
    assert_eq!(it.size_hint(), (0, Some(4)));
    let err = it.next().unwrap().unwrap_err();
    assert!(
        matches!(
            err,
            DataError::Timeout {
                batch_index: 0,
                worker_id: 0,
                ..
            }
        ),
        "{err:?}"
    );
    // The epoch is over (it used to yield the same error again and again, 20 items for 4
    // batches), and `size_hint` says so.
    assert_eq!(it.size_hint(), (0, Some(0)));
    assert!(it.next().is_none());
    assert!(it.next().is_none());
    drop(it);
    // Neither the error nor the end waited for the 1.5 s item.
    assert!(
        t0.elapsed() < Duration::from_millis(1200),
        "{:?}",
        t0.elapsed()
    );
    // The worker thread ends by itself once its item returns.
    let tid = tids.lock().unwrap()[0];
    assert!(
        thread_gone(tid),
        "the timed-out worker thread is still running"
    );
    // `collect` sees one item, not 20.
    let out: Vec<_> = dl.iter().collect();
    assert_eq!(out.len(), 1);
    assert!(matches!(out[0], Err(DataError::Timeout { .. })));
}

/// Items of `0..len`, the first `get` of the process sleeping `slow_ms`.
struct SlowOnce {
    len: usize,
    slow_ms: u64,
    slept: AtomicBool,
}

impl Dataset for SlowOnce {
    type Item = usize;
    fn len(&self) -> usize {
        self.len
    }
    fn get(&self, index: usize) -> Result<usize> {
        if !self.slept.swap(true, Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(self.slow_ms));
        }
        Ok(index)
    }
}

#[test]
fn timeout_with_persistent_workers_keeps_the_pool_for_the_next_epoch() {
    let tids = Arc::new(Mutex::new(Vec::new()));
    let t2 = Arc::clone(&tids);
    let dl = builder(SlowOnce {
        len: 3,
        slow_ms: 500,
        slept: AtomicBool::new(false),
    })
    .num_workers(1)
    .persistent_workers(true)
    .timeout(0.2)
    .worker_init_fn(move |_| t2.lock().unwrap().push(gettid()))
    .build()
    .unwrap();
    let out: Vec<_> = dl.iter().collect();
    assert_eq!(out.len(), 1);
    assert!(
        matches!(out[0], Err(DataError::Timeout { batch_index: 0, .. })),
        "{out:?}"
    );
    // Once the slow item is done, the same worker serves a full epoch; the late result of the
    // abandoned epoch does not leak into it.
    std::thread::sleep(Duration::from_millis(1000));
    assert_eq!(collect_batches(&dl), vec![vec![0], vec![1], vec![2]]);
    assert_eq!(tids.lock().unwrap().len(), 1, "the pool was started once");
}

fn init_boom(id: usize) {
    if id == 1 {
        panic!("init boom");
    }
}

#[test]
fn worker_init_fn_panic_is_reported_with_its_message_at_the_workers_batches() {
    let dl = builder(range(8))
        .batch_size(2)
        .num_workers(2)
        .worker_init_fn(init_boom)
        .build()
        .unwrap();
    let t0 = Instant::now();
    let out: Vec<_> = dl.iter().collect();
    assert!(t0.elapsed() < Duration::from_secs(3));
    assert_eq!(out.len(), 4);
    assert_eq!(out[0].as_ref().unwrap(), &vec![0, 1]);
    assert_eq!(out[2].as_ref().unwrap(), &vec![4, 5], "worker 0 carries on");
    for (k, batch_index) in [(1, 1), (3, 3)] {
        let err = out[k].as_ref().unwrap_err();
        assert!(
            matches!(
                err,
                DataError::WorkerInitPanicked { worker_id: 1, batch_index: b, message }
                    if *b == batch_index && message == "init boom"
            ),
            "{err:?}"
        );
    }
    assert_eq!(
        out[1].as_ref().unwrap_err().to_string(),
        "Caught panic in DataLoader worker thread 1 in worker_init_fn (batch 1 not loaded: a worker whose worker_init_fn panicked loads nothing).\nOriginal panic message: init boom"
    );
}

/// `0..n`, sharded by striding over the workers.
struct Strided(usize);

impl IterableDataset for Strided {
    type Item = usize;
    fn iter(&self) -> Box<dyn Iterator<Item = Result<usize>> + Send + '_> {
        let (id, n) = worker_info().map_or((0, 1), |w| (w.id, w.num_workers));
        Box::new((0..self.0).skip(id).step_by(n).map(Ok))
    }
}

#[test]
fn worker_init_fn_panic_in_an_iterable_loader_is_one_error_per_epoch() {
    for persistent in [false, true] {
        let dl = iterable(Strided(6))
            .batch_size(2)
            .num_workers(2)
            .persistent_workers(persistent)
            .worker_init_fn(init_boom)
            .build()
            .unwrap();
        for epoch in 0..2 {
            let out: Vec<_> = dl.iter().collect();
            // Worker 0's stream is 0, 2, 4; worker 1 reports its init panic at its first batch
            // and its stream counts as ended, so the epoch ends.
            assert_eq!(
                out.len(),
                3,
                "persistent {persistent}, epoch {epoch}: {out:?}"
            );
            assert_eq!(out[0].as_ref().unwrap(), &vec![0, 2]);
            assert!(
                matches!(
                    out[1].as_ref().unwrap_err(),
                    DataError::WorkerInitPanicked {
                        worker_id: 1,
                        batch_index: 1,
                        ..
                    }
                ),
                "{out:?}"
            );
            assert_eq!(out[2].as_ref().unwrap(), &vec![4]);
        }
    }
}

/// One item, then the end; dropping the stream panics (a bug in user code outside any batch,
/// which kills the worker thread).
struct DropBomb {
    left: usize,
}

impl Iterator for DropBomb {
    type Item = Result<usize>;
    fn next(&mut self) -> Option<Result<usize>> {
        self.left = self.left.checked_sub(1)?;
        Some(Ok(7))
    }
}

impl Drop for DropBomb {
    fn drop(&mut self) {
        panic!("stream drop boom");
    }
}

struct BombStream;

impl IterableDataset for BombStream {
    type Item = usize;
    fn iter(&self) -> Box<dyn Iterator<Item = Result<usize>> + Send + '_> {
        Box::new(DropBomb { left: 1 })
    }
}

#[test]
fn worker_thread_that_dies_is_reported_not_hung() {
    let dl = iterable(BombStream).num_workers(1).build().unwrap();
    let t0 = Instant::now();
    let out: Vec<_> = dl.iter().collect();
    assert!(t0.elapsed() < Duration::from_secs(3));
    assert_eq!(out.len(), 2, "{out:?}");
    assert_eq!(out[0].as_ref().unwrap(), &vec![7]);
    let err = out[1].as_ref().unwrap_err();
    assert!(
        matches!(err, DataError::WorkersExited { worker_ids } if worker_ids == &vec![0]),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "DataLoader worker (thread(s) 0) exited unexpectedly"
    );
}

#[test]
fn a_panic_without_workers_unwinds_and_with_workers_is_an_error() {
    let flaky = || Flaky {
        len: 2,
        fail: vec![],
        panic: vec![1],
        sleep_ms: 0,
    };
    // num_workers = 0: PyTorch raises the dataset's exception straight out of `__next__`.
    let dl = builder(flaky()).build().unwrap();
    let mut it = dl.iter();
    assert_eq!(it.next().unwrap().unwrap(), vec![0]);
    let unwound = catch_unwind(AssertUnwindSafe(|| it.next())).unwrap_err();
    assert_eq!(unwound.downcast_ref::<String>().unwrap(), "item 1 exploded");
    // With workers the panic is caught in the worker and delivered at its batch.
    let dl = builder(flaky()).num_workers(1).build().unwrap();
    let out: Vec<_> = dl.iter().collect();
    assert!(
        matches!(
            out[1],
            Err(DataError::WorkerPanicked { batch_index: 1, .. })
        ),
        "{out:?}"
    );
}
